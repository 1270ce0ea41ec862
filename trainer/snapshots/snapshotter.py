"""The one object the trainer holds for the snapshot tiers: a rank's own slots, its peer link and
the restore agreement, put together where they meet (a peer sends an own slot; a restore reads
or fills one)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import torch

from trainer.accounting.events import EventLog
from trainer.durable.staging import Layout
from trainer.snapshots import agreement
from trainer.snapshots.own import OwnSlots
from trainer.snapshots.peer import PeerLink
from trainer.snapshots.slot import Slot


class Snapshotter:
    def __init__(self, root: Path, *, rank: int, world_size: int, local_world_size: int,
                 device: torch.device, tiers: tuple[str, ...], budget_gib: float,
                 durable: bool, events: EventLog, log: Callable[[str], None] = print,
                 device_share: float = 0.0):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.rank, self.world_size = rank, world_size
        self.local_world_size = local_world_size
        self.peer_enabled = "peer" in tiers and world_size > local_world_size
        self.keep_files = "node" in tiers or self.peer_enabled
        self.events = events
        self.log = log
        self.own = OwnSlots(self.root, rank=rank, world_size=world_size,
                            local_world_size=local_world_size, device=device,
                            peer=self.peer_enabled, durable=durable, budget_gib=budget_gib,
                            log=log, device_share=device_share)
        # Also without the peer tier: a restore may move shards between nodes.
        self.peer = PeerLink(self.root, rank=rank, world_size=world_size,
                             local_world_size=local_world_size, device=self.own.device,
                             pin=self.own.pin, unpin=self.own.unpin)
        if "peer" in tiers and not self.peer_enabled:
            log("peer tier off: every rank is on one node, so there is no other node to hold a replica")

    @property
    def slots(self) -> list[Slot]:
        return self.own.slots

    @property
    def stats(self) -> dict:
        return {**self.own.stats, **self.peer.stats}

    # -- own slots ---------------------------------------------------------------------------
    def allocate(self, layout: Layout) -> None:
        self.own.allocate(layout)

    def take(self, step: int, tensors: dict[str, torch.Tensor], meta: dict) -> Optional[Slot]:
        return self.own.take(step, tensors, meta)

    def fence(self) -> None:
        self.own.fence()

    def poll(self, wait: bool = False) -> None:
        self.own.poll(wait)

    def pin(self, slot: Slot) -> None:
        self.own.pin(slot)

    def unpin(self, slot: Slot) -> None:
        self.own.unpin(slot)

    def newest(self) -> Optional[Slot]:
        return self.own.newest()

    def commit_landed(self, wait_s: float) -> None:
        self.own.commit_landed(wait_s)

    def discard_from(self, step: int) -> None:
        self.own.discard_from(step)

    def recover_pending(self) -> None:
        self.own.recover_pending()

    # -- peer --------------------------------------------------------------------------------
    def attach(self, timeout_s: float) -> None:
        self.peer.attach(timeout_s)

    def maybe_replicate(self, slot: Optional[Slot]) -> None:
        """At a snapshot step: if every rank finished its last exchange (and took this step's
        snapshot), send it to the successor. One all-reduce decides, so every pair exchanges
        the same step, and each rank keeps its copy of that step until the next exchange.
        """
        if not self.peer_enabled or not self.peer.due(slot is not None):
            return
        self.own.poll(wait=True)  # the step's copy must be complete before it is sent
        self.peer.send(slot)

    def settle(self) -> None:
        self.peer.settle()

    # -- recovery ----------------------------------------------------------------------------
    def inventory(self) -> dict[int, dict[int, dict]]:
        return agreement.inventory(self.root, self.world_size)

    def choose(self, inventories: list[dict]) -> Optional[int]:
        return agreement.choose(inventories, self.world_size)

    holders = staticmethod(agreement.holders)

    def restore_shard(self, step: int, inventories: list[dict], fresh: bool) -> tuple[torch.Tensor, dict, str]:
        return agreement.restore_shard(step, inventories, fresh, rank=self.rank,
                                       world_size=self.world_size, own=self.own, link=self.peer)

    def forget_others(self, local_ranks: range) -> None:
        agreement.forget_others(self.root, local_ranks, local_world_size=self.local_world_size,
                                world_size=self.world_size)

    def close(self, remove: bool = False) -> None:
        """Unmap the buffers; their files stay for the node tier unless `remove`."""
        gone = remove or not self.keep_files
        self.peer.close(gone)
        self.own.close(gone)
