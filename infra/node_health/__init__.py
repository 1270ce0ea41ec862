"""The node-health agent: the program the GPU stack runs on a system node (`agent.py`)."""
