"""Which snapshot to restore, and where each rank's shard comes from.

Recovery takes the newest step whose every shard some node still holds, agreed through one
all-gather of the nodes' inventories (the caller's). Ranks may land on other nodes after a
restart, so a rank offers whatever its node holds, own slots and replicas alike, and a rank
whose node lost its shard receives it from a holder over the peer link.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from trainer.atomic import read_json
from trainer.buffers import map_file
from trainer.snapshots.own import OwnSlots
from trainer.snapshots.peer import PeerLink, predecessor
from trainer.snapshots.slot import buffer_of, headers, is_replica, own_prefix, replica_prefix, stamp


def inventory(root: Path, world_size: int) -> dict[int, dict[int, dict]]:
    """Every snapshot in the node directory `root`, own or replica, by the rank it belongs to
    and its step."""
    out: dict[int, dict[int, dict]] = {}
    for header in headers(root):
        h = read_json(header)
        if not h or h.get("world_size") != world_size or "rank" not in h:
            continue
        buf = buffer_of(header)
        if buf.is_file() and buf.stat().st_size >= h["layout"]["total_bytes"]:
            out.setdefault(int(h["rank"]), {})[int(h["step"])] = {
                "path": str(buf), "meta": h["meta"], "layout": h["layout"],
                "replica": is_replica(header)}
    return out


def choose(inventories: list[dict], world_size: int) -> Optional[int]:
    """The newest step for which every rank's shard exists on some node."""
    have: dict[int, set[int]] = {}
    for inv in inventories:
        for rank, steps in inv.items():
            for step in steps:
                have.setdefault(step, set()).add(rank)
    full = [step for step, ranks in have.items() if len(ranks) == world_size]
    return max(full) if full else None


def holders(step: int, inventories: list[dict]) -> dict[int, int]:
    """Who provides each rank's shard: the rank itself when its node has it, else the lowest
    rank whose node does."""
    out = {}
    for rank in range(len(inventories)):
        if step in inventories[rank].get(rank, {}):
            out[rank] = rank
        else:
            out[rank] = min(h for h, inv in enumerate(inventories) if step in inv.get(rank, {}))
    return out


def restore_shard(step: int, inventories: list[dict], fresh: bool, *, rank: int,
                  world_size: int, own: OwnSlots, link: PeerLink) -> tuple[torch.Tensor, dict, str]:
    """This rank's snapshot of `step` as a flat host tensor, its meta, and the tier it came
    from; a rank whose node lost it receives it from a holder. Every rank calls this."""
    source = holders(step, inventories)
    ops, held = [], []
    for other, holder in source.items():
        if holder == rank and other != rank:  # serve a rank that lost its node
            entry = inventories[rank][other][step]
            flat = _map(entry)
            held.append(flat)
            ops.append(("send", other, flat))
    mine = source[rank]
    if mine == rank:
        entry = inventories[rank][rank][step]
        held = own.holding(step)
        if held is not None:  # the mapped, pinned slot: read at host-to-device speed
            flat, tier = held.buffer.flat, ("node" if fresh else "memory")
        else:
            flat, tier = _map(entry), ("peer" if entry["replica"] else "node")
        meta = entry["meta"]
    else:
        entry = inventories[mine][rank][step]
        slot = own.receiving()
        flat, tier, meta = slot.buffer.flat, "peer", entry["meta"]
        ops.append(("recv", mine, flat))
        held.append(slot)
    link.transfer(ops)
    if mine != rank:
        slot.commit(step, meta, stamp(rank, world_size))
    return flat, meta, tier


def _map(entry: dict) -> torch.Tensor:
    return map_file(Path(entry["path"]), entry["layout"]["total_bytes"], writable=False)


def forget_others(root: Path, local_ranks: range, *, local_world_size: int, world_size: int) -> None:
    """After a restore: drop node files of ranks that now live elsewhere (call on one local
    rank, after a barrier)."""
    local = {own_prefix(r) for r in local_ranks}
    local |= {replica_prefix(predecessor(r, local_world_size, world_size)) for r in local_ranks}
    for f in Path(root).iterdir():
        if f.is_file() and not any(f.name.startswith(k) for k in local):
            f.unlink(missing_ok=True)
