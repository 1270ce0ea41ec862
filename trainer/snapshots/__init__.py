"""The snapshot tiers: every step's state in host memory and on the node, replicated to a peer node, and the agreement on which step to restore."""
