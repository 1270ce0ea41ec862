"""Which snapshot to restore, and where each rank's shard comes from, at a per-rank cost that
does not grow with the number of ranks.

A node directory holds the own slots of the ranks that ran there and the replicas of the
previous node's ranks. Each file is *served* by one process of the node: the one with the local
rank of the shard it holds (`shard rank % local world size`), so every shard is published once
per node that holds it. A restore then runs in four steps, none of them gathering the world:

1. every rank publishes, in the process group's store, one small key per shard it serves
   (`<prefix>/<shard rank>/own|replica`: its steps, the holder, the size);
2. every rank reads the two keys of its own shard: the steps it can get, and from whom;
3. rank 0's steps are the candidates (broadcast, a fixed-size vector); every rank marks the
   ones it can get, and one MIN all-reduce of that fixed-size mask decides: the newest step
   that every rank can get;
4. a rank whose node lost its shard asks its holder for it (a key), and the holder sends the
   header and the bytes over the peer link.

O(1) store operations and O(1) bytes per rank, two fixed-size collectives; ranks may land on
other nodes after a restart and still find their shard.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from trainer.atomic import read_json
from trainer.buffers import map_file
from trainer.snapshots.own import OwnSlots
from trainer.snapshots.peer import PeerLink, predecessor
from trainer.snapshots.slot import (buffer_of, headers, is_replica, own_prefix, replica_prefix,
                                    stamp)

CANDIDATES = 8  # steps one shard can have on one node: own slots and replica slots, with room
KINDS = ("own", "replica")


@dataclass(frozen=True)
class Held:
    """A snapshot of one shard that one rank serves."""

    step: int
    holder: int       # the rank whose process serves the file
    replica: bool     # a peer's copy, not the shard's own slot
    total_bytes: int


def served(root: Path, rank: int, local_world_size: int, world_size: int) -> dict[int, list[tuple[Held, Path]]]:
    """The complete snapshots of this world in the node directory that this rank serves, by the
    shard rank they hold: those whose shard rank has this rank's local rank."""
    out: dict[int, list[tuple[Held, Path]]] = {}
    for header in headers(root):
        h = read_json(header)
        if not h or h.get("world_size") != world_size or "rank" not in h:
            continue
        shard = int(h["rank"])
        if shard % local_world_size != rank % local_world_size:
            continue
        buf = buffer_of(header)
        size = int(h["layout"]["total_bytes"])
        if buf.is_file() and buf.stat().st_size >= size:
            out.setdefault(shard, []).append(
                (Held(int(h["step"]), rank, is_replica(header), size), header))
    return out


def publish(store: dist.Store, prefix: str, mine: dict[int, list[tuple[Held, Path]]]) -> None:
    """One key per (shard, kind) this rank serves: the steps it can give."""
    for shard, entries in mine.items():
        for kind in KINDS:
            held = [h for h, _ in entries if h.replica == (kind == "replica")]
            if held:
                store.set(f"{prefix}/{shard}/{kind}", json.dumps(
                    [[h.step, h.holder, h.total_bytes] for h in held]))


def lookup(store: dist.Store, prefix: str, rank: int) -> dict[int, Held]:
    """The steps of `rank`'s shard that some node serves, and who serves each: its own slot
    before a replica, and among own slots its own process."""
    out: dict[int, Held] = {}
    for kind in reversed(KINDS):  # own last: it overrides a replica of the same step
        key = f"{prefix}/{rank}/{kind}"
        if not store.check([key]):
            continue
        for step, holder, size in json.loads(store.get(key)):
            held = Held(step, holder, kind == "replica", size)
            best = out.get(step)
            if best is None or kind == "own" and (best.replica or holder == rank):
                out[step] = held
    return out


def candidate_vector(steps: list[int]) -> list[int]:
    """The newest CANDIDATES steps, newest first, padded with -1: a fixed-size message."""
    newest = sorted(set(steps), reverse=True)[:CANDIDATES]
    return newest + [-1] * (CANDIDATES - len(newest))


def mask(candidates: list[int], available: set[int]) -> list[int]:
    """1 where this rank can get the candidate step, else 0 (padding counts as 0)."""
    return [1 if c >= 0 and c in available else 0 for c in candidates]


def pick(candidates: list[int], agreed: list[int]) -> Optional[int]:
    """The newest candidate every rank marked."""
    held = [c for c, ok in zip(candidates, agreed) if ok]
    return max(held) if held else None


def agree(available: dict[int, Held], rank: int, device: torch.device) -> Optional[int]:
    """The newest step every rank can get: rank 0 proposes, one MIN all-reduce disposes."""
    proposal = torch.tensor(candidate_vector(list(available)) if rank == 0 else [-1] * CANDIDATES,
                            dtype=torch.int64, device=device)
    dist.broadcast(proposal, src=0)
    candidates = proposal.tolist()
    marks = torch.tensor(mask(candidates, set(available)), dtype=torch.int64, device=device)
    dist.all_reduce(marks, op=dist.ReduceOp.MIN)
    return pick(candidates, marks.tolist())


def restore_shard(step: int, available: dict[int, Held], mine: dict[int, list[tuple[Held, Path]]],
                  store: dist.Store, prefix: str, fresh: bool, *, rank: int, world_size: int,
                  own: OwnSlots, link: PeerLink) -> tuple[torch.Tensor, dict, str]:
    """This rank's snapshot of `step` as a flat host tensor, its meta, and the tier it came
    from; a rank whose node lost it receives it from its holder. Every rank calls this.

    A holder learns who needs a shard from a key, and leaves that shard's header in the store;
    the bytes go over the peer link, every send and receive of a rank posted together (sizes
    are known from the lookup), so two ranks that serve each other never wait on each other."""
    held = available[step]
    if held.holder != rank:
        store.set(f"{prefix}/{rank}/need", str(held.holder))
    dist.barrier()
    ops, pinned = [], []
    for shard, entries in mine.items():
        key = f"{prefix}/{shard}/need"
        if shard == rank or not store.check([key]) or int(store.get(key)) != rank:
            continue
        header = next(hd for h, hd in entries if h.step == step)  # serve a rank that lost it
        store.set(f"{prefix}/{shard}/header", header.read_bytes())
        flat = _map(header)
        pinned.append(flat)
        ops.append(("send", shard, flat))
    if held.holder == rank:
        header = next(hd for h, hd in mine[rank] if h.step == step)
        slot = own.holding(step)
        if slot is not None:  # the mapped, pinned slot: read at host-to-device speed
            flat, tier = slot.buffer.flat, ("node" if fresh else "memory")
        else:
            flat, tier = _map(header), ("peer" if held.replica else "node")
        link.transfer(ops)
        return flat, read_json(header)["meta"], tier
    slot = own.receiving()
    link.transfer(ops + [("recv", held.holder, slot.buffer.flat[:held.total_bytes])])
    meta = json.loads(store.get(f"{prefix}/{rank}/header"))["meta"]
    slot.commit(step, meta, stamp(rank, world_size))
    return slot.buffer.flat, meta, "peer"


def _map(header: Path) -> torch.Tensor:
    h = read_json(header)
    return map_file(buffer_of(header), int(h["layout"]["total_bytes"]), writable=False)


def forget_others(root: Path, local_ranks: range, *, local_world_size: int, world_size: int) -> None:
    """After a restore: drop node files of ranks that now live elsewhere (call on one local
    rank, after a barrier)."""
    local = {own_prefix(r) for r in local_ranks}
    local |= {replica_prefix(predecessor(r, local_world_size, world_size)) for r in local_ranks}
    for f in Path(root).iterdir():
        if f.is_file() and not any(f.name.startswith(k) for k in local):
            f.unlink(missing_ok=True)
