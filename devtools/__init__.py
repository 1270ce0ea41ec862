"""Tools for a developer's machine, not the pod: the local multi-node runner, the demo and the
report."""
