"""The snapshot tiers: every step's state in host memory and on the node, replicated to a peer
node, and the agreement on which step to restore."""

from trainer.snapshots.slot import warm_slots
from trainer.snapshots.snapshotter import Snapshotter

__all__ = ["Snapshotter", "warm_slots"]
