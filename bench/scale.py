"""Per-rank cost of checkpointing and recovery at any world size, measured on one CPU.

One process plays one rank of a world of N: torch's fake process group gives it its rank and
world (FSDP2 shards the model as it would among N ranks), and this harness stands in for the
other N - 1 ranks. Collectives are mirrored: every rank of a symmetric world contributes what
this one does, so an all-gather returns N copies of this rank's part (its real cost), and where
a rank needs what rank 0 alone knows (a broadcast), the harness supplies it. The other ranks'
files exist as they would: their shards as sparse files of the right size and their markers,
the checkpoint's manifest, a node directory's replicas.

Counted per operation, for the playing rank only: collective calls and the bytes they move to
it, store operations, file-system calls (stats, opens, directory listings) and the bytes read
(the kernel's count of read calls, `rchar`). A step whose counts grow with N does not scale.

    python -m bench.scale --worlds 8,64,1024,16384 --out bench/results/cpu-scale/scale.json
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import importlib
import io
import json
import os
import pickle
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import traceback
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

ROOT = Path(__file__).resolve().parents[1]
LOCAL_WORLD = 8  # ranks per simulated node, as on a p5
WIDE_ROWS = 32768  # every rank holds rows of the wide matrix up to N = 16384
SHARD_CACHE_ENV = "NVRX_EKS_SCALE_SHARDS"  # saved shards shared by measurements (`save_shard`)
OPERATIONS = ("save", "commit", "commit_watch", "resume", "resume_half", "agreement",
              "peer_exchange", "reentry")
# What may grow with N, and why: rank 0's work once per checkpoint (it checks every rank's marker
# and writes the manifest) and once per restore (it checks the manifests' shards).
RANK0_PER_CHECKPOINT = {"commit", "resume", "resume_half"}
RANK0_ONLY = {"commit_watch"}  # rank 0's look, every step, at a checkpoint still being written
# What a measurement imports before its counting starts, imported once by the server that forks
# every measurement (`serve`): what stays lazy stays so, and is counted as before.
PRELOAD = ("torch", "torch.distributed.fsdp", "torch.testing._internal.distributed.fake_pg",
           "trainer.accounting.events", "trainer.durable.manager", "trainer.durable.state",
           "trainer.snapshots")


# --- counting -----------------------------------------------------------------------------------
class Tally:
    """What one operation cost the playing rank."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self.peers: set[int] = set()

    def add(self, key: str, n: int = 1) -> None:
        self.counts[key] += n

    def to_json(self) -> dict:
        return {**dict(sorted(self.counts.items())), "p2p_peers": len(self.peers)}


def nbytes(obj: Any) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    return len(pickle.dumps(obj))


class _Done:
    """A completed request: what the mirrored point-to-point operations return."""

    def wait(self, *args: Any) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class MirrorStore:
    """An in-process store that counts what a rank asks of the process group's store."""

    def __init__(self, tally: Tally):
        self.tally, self.data = tally, {}

    def set(self, key: str, value) -> None:
        self.tally.add("store_ops")
        self.data[key] = value.encode() if isinstance(value, str) else bytes(value)

    def get(self, key: str) -> bytes:
        self.tally.add("store_ops")
        return self.data[key]

    def check(self, keys: list[str]) -> bool:
        self.tally.add("store_ops")
        return all(k in self.data for k in keys)

    def add(self, key: str, n: int) -> int:
        self.tally.add("store_ops")
        value = int(self.data.get(key, b"0")) + n
        self.data[key] = str(value).encode()
        return value


def _rchar() -> int:
    with builtins.open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar"))


@contextlib.contextmanager
def counting(tally: Tally, world: int, rank: int, oracle: dict) -> Iterator[None]:
    """Patch the collectives, the store and the file-system calls the trainer makes."""
    import torch
    import torch.distributed as dist

    from trainer.durable import landing
    from trainer.snapshots import snapshotter

    sent: dict[tuple[int, int], torch.Tensor] = {}

    def collective(name: str, moved: Callable[..., int]):
        def call(*args: Any, **kwargs: Any):
            tally.add(f"{name}_calls")
            tally.add("collective_bytes", moved(*args, **kwargs))
            return behaviour[name](*args, **kwargs)
        return call

    def broadcast(tensor, src=0, **_):
        if rank != src and "broadcast" in oracle:
            tensor.copy_(oracle["broadcast"](tensor))

    def broadcast_object_list(objs, src=0, **_):
        if rank != src and "broadcast_object_list" in oracle:
            objs[:] = oracle["broadcast_object_list"]()

    def all_gather_object(out, obj, **_):
        out[:] = [obj] * len(out)

    def isend(tensor, dst, **_):
        tally.peers.add(dst)
        sent[(tensor.numel(), tensor.element_size())] = tensor
        return _Done()

    def irecv(tensor, src, **_):
        tally.peers.add(src)
        mirror = sent.get((tensor.numel(), tensor.element_size()))
        if mirror is not None:  # a symmetric peer sends what this rank sends
            tensor.copy_(mirror)
        return _Done()

    behaviour = {"all_reduce": lambda *a, **k: None, "barrier": lambda *a, **k: None,
                 "broadcast": broadcast, "broadcast_object_list": broadcast_object_list,
                 "all_gather_object": all_gather_object, "isend": isend, "irecv": irecv,
                 "new_group": lambda *a, **k: object()}
    moved = {"all_reduce": lambda t, *a, **k: nbytes(t), "barrier": lambda *a, **k: 0,
             "broadcast": lambda t, *a, **k: nbytes(t),
             "broadcast_object_list": lambda objs, *a, **k: nbytes(oracle.get(
                 "broadcast_object_list", lambda: objs)()),
             "all_gather_object": lambda out, obj, *a, **k: nbytes(obj) * world,
             "isend": lambda t, *a, **k: 0, "irecv": lambda t, *a, **k: nbytes(t),
             "new_group": lambda *a, **k: 0}
    store = MirrorStore(tally)
    store.data.update(oracle.get("store", {}))

    def fs(name: str, real: Callable) -> Callable:
        def call(*args: Any, **kwargs: Any):
            if threading.current_thread() is main or name != "pread":
                tally.add(name)
            return real(*args, **kwargs)
        return call

    main = threading.current_thread()
    patches = [(dist, name, collective(name, moved[name])) for name in behaviour]
    patches += [(snapshotter, "default_group_store", lambda: store),
                (landing, "default_group_store", lambda: store)]
    patches += [(os, n, fs(key, getattr(os, n))) for n, key in
                (("stat", "fs_stats"), ("lstat", "fs_stats"), ("open", "fs_opens"),
                 ("listdir", "fs_listings"), ("scandir", "fs_listings"))]
    patches += [(builtins, "open", fs("fs_opens", builtins.open)),
                (io, "open", fs("fs_opens", io.open))]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    for obj, name, value in patches:
        setattr(obj, name, value)
    before = _rchar()
    try:
        yield
    finally:
        tally.add("bytes_read", _rchar() - before)
        for obj, name, value in saved:
            setattr(obj, name, value)


# --- a rank of a world of N -----------------------------------------------------------------------
def join(world: int, rank: int) -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)


def model_and_optimizer():
    """A model whose parameters shard like an LLM's at any world up to 16,384 ranks: a wide
    matrix every rank holds rows of, a norm-sized one some hold, a small one few do."""
    import torch
    from torch.distributed.fsdp import fully_shard

    from trainer.durable.state import ensure_optimizer_state

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, WIDE_ROWS, bias=False),
                                torch.nn.Linear(16, 4096, bias=False),
                                torch.nn.Linear(16, 8, bias=False))
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ensure_optimizer_state(model, optimizer)
    return model, optimizer


def manager(ckpt: Path, world: int, rank: int):
    import torch

    from trainer.accounting.events import EventLog
    from trainer.durable.manager import CheckpointManager

    return CheckpointManager(str(ckpt), rank=rank, world_size=world, device=torch.device("cpu"),
                             use_async=False, retain=2, timeout_s=60, events=EventLog(None, rank),
                             node_root=ckpt.parent / "node", keepalive=lambda: None,
                             log=lambda _: None)


def save_shard(ckpt: Path, world: int, rank: int, step: int) -> None:
    """Rank `rank`'s real shard of `step`, as a rank of a world of `world` writes it, in a
    process of its own: a process plays one rank only (FSDP2's device mesh keeps the first).

    Where SHARD_CACHE_ENV names a directory, a shard is saved once there and copied for every
    later measurement that needs it (its files are the same, and no measurement counts the
    save): most of a measurement's time is the saving processes' start-up."""
    cache = os.environ.get(SHARD_CACHE_ENV)
    if not cache:
        _save_shard_process(ckpt, world, rank, step)
        return
    kept = Path(cache) / f"N{world}-rank{rank}-step{step}"
    if not kept.is_dir():
        fresh = Path(tempfile.mkdtemp(prefix="saving-", dir=cache))
        _save_shard_process(fresh / ckpt.name, world, rank, step)
        with contextlib.suppress(OSError):  # another process kept the same shard first
            fresh.rename(kept)
        shutil.rmtree(fresh, ignore_errors=True)
    shutil.copytree(kept, ckpt.parent, dirs_exist_ok=True)


def _save_shard_process(ckpt: Path, world: int, rank: int, step: int) -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.scale", "--save_shard", str(ckpt),
                           str(world), str(rank), str(step)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode != 0:
        raise RuntimeError(f"saving rank {rank}'s shard at N={world} failed:\n{proc.stderr[-3000:]}")


def _save_shard_here(ckpt: Path, world: int, rank: int, step: int) -> None:
    join(world, rank)
    model, optimizer = model_and_optimizer()
    mgr = manager(ckpt, world, rank)
    with counting(Tally(), world, rank, {}):  # its collectives are no-ops, uncounted
        mgr.save(step, model, optimizer, {"step": step})
    mgr.close()


def mirror_markers(ckpt: Path, world: int, step: int) -> list[dict]:
    """Every rank's marker of `step`: the real ones, and for the ranks that wrote nothing here a
    copy of a real one beside a sparse shard file of its size."""
    from trainer.durable.store import marker_name, shard_name, step_dir_name

    path = ckpt / step_dir_name(step)
    real = {int(m.name[5:10]): json.loads(m.read_text()) for m in path.glob("rank_*.json")}
    template = next(iter(real.values()))
    markers = []
    for r in range(world):
        if r not in real:
            marker = {**template, "rank": r, "file": shard_name(r)}
            with builtins.open(path / shard_name(r), "wb") as f:
                f.truncate(marker["bytes"])
            (path / marker_name(r)).write_text(json.dumps(marker))
            real[r] = marker
        markers.append(real[r])
    return markers


def op_save(work: Path, world: int, rank: int) -> dict:
    """One durable checkpoint: stage, write and mark this rank's shard."""
    join(world, rank)
    model, optimizer = model_and_optimizer()
    mgr = manager(work / "ckpt", world, rank)
    tally = Tally()
    with counting(tally, world, rank, {}):
        mgr.save(10, model, optimizer, {"step": 10})
    return tally.to_json()


def _landed_elsewhere(world: int, rank: int, step: int, landed: int, committed: bool) -> dict:
    """The store as the other ranks leave it: rank 0's attempt counter bumped (`Landings.join`),
    `landed` writes counted (each adds 1 once its shard and marker are durable) and, where
    `committed`, rank 0's commit key set."""
    from trainer.durable.landing import ATTEMPTS_KEY

    prefix = "nvrx-eks/durable/1"  # the first attempt's keys
    data = {f"{prefix}/{step}/landed": str(landed).encode()}
    if rank != 0:
        data[ATTEMPTS_KEY] = b"1"
    if committed:
        data[f"{prefix}/{step}/committed"] = b"1"
    return data


def op_commit(work: Path, world: int, rank: int) -> dict:
    """A checkpoint every rank has written, from the moment the playing rank's write returned:
    it says so in the store, then rank 0 (told by the counter) reads every marker once and
    publishes, and any other rank waits for rank 0's key. Only rank 0's work grows with N,
    once per checkpoint."""
    from trainer.durable.landing import Landings
    from trainer.durable.commit import Pending

    ckpt = work / "ckpt"
    save_shard(ckpt, world, 0, 10)
    if rank != 0:
        save_shard(ckpt, world, rank, 10)
    markers = mirror_markers(ckpt, world, 10)
    mgr = manager(ckpt, world, rank)
    tally = Tally()
    oracle = {"store": _landed_elsewhere(world, rank, 10, world - 1, committed=rank != 0)}
    with counting(tally, world, rank, oracle):
        landings = Landings.join(rank)
        landings.add_landed(10)  # what its writer process does once its marker is durable
        if rank == 0:
            mgr._rank0_committer()._uncommitted.append(Pending(10, world, landings))  # as `save`
            mgr.poll()  # the counter is complete: the markers are read, the commit published
            mgr.finish()  # waits for that publish
        else:
            mgr._await_committed(10, landings)  # as its next save does
    assert len(markers) == world and (ckpt / "latest").is_file() == (rank == 0)
    return tally.to_json()


def op_commit_watch(work: Path, world: int, rank: int) -> dict:
    """Rank 0's look, once per training step, at a checkpoint not every rank has written yet:
    one counter in the store, none of the markers."""
    from trainer.durable.landing import Landings
    from trainer.durable.commit import Pending

    ckpt = work / "ckpt"
    save_shard(ckpt, world, 0, 10)
    mgr = manager(ckpt, world, rank)
    store = _landed_elsewhere(world, rank, 10, world - 2, committed=False)  # one still writes
    tally = Tally()
    with counting(tally, world, rank, {"store": store}):
        landings = Landings.join(rank)
        landings.add_landed(10)
        mgr._rank0_committer()._uncommitted.append(Pending(10, world, landings))
        mgr.poll()
    assert mgr._rank0_committer()._uncommitted and not (ckpt / "latest").exists()
    return tally.to_json()


def _committed(ckpt: Path, world: int, ranks: list[int], step: int = 10) -> None:
    from trainer.durable.store import CheckpointStore

    for r in ranks:
        save_shard(ckpt, world, r, step)
    CheckpointStore(ckpt).commit(step, mirror_markers(ckpt, world, step), {})


def _restore(ckpt: Path, world: int, rank: int, saved_world: int) -> dict:
    join(world, rank)
    model, optimizer = model_and_optimizer()
    mgr = manager(ckpt, world, rank)
    tally = Tally()
    # rank 0's survey: the committed checkpoints that pass the cheap checks, and those that fail
    oracle = {"broadcast_object_list": lambda: [([(10, saved_world)], [])]}
    with counting(tally, world, rank, oracle):
        meta = mgr.restore(model, optimizer, required=True)
    assert meta["step"] == 10
    return tally.to_json()


def op_resume(work: Path, world: int, rank: int) -> dict:
    """A durable resume at the same world size."""
    ckpt = work / "ckpt"
    _committed(ckpt, world, sorted({0, rank}))
    return _restore(ckpt, world, rank, world)


def op_resume_half(work: Path, world: int, rank: int) -> dict:
    """A durable resume at half the world size: only the overlapping shards' rows are read."""
    from trainer.durable.state import overlapping_ranks

    half = max(1, world // 2)
    join(half, rank)
    needed = overlapping_ranks(model_and_optimizer()[0], world)
    ckpt = work / "ckpt"
    _committed(ckpt, world, sorted({0, *needed}))
    return {**_restore(ckpt, half, rank, world), "shards_needed": len(needed)}


def _snapshotter(work: Path, world: int, rank: int):
    import torch

    from trainer.accounting.events import EventLog
    from trainer.snapshots import Snapshotter

    return Snapshotter(work / "node", rank=rank, world_size=world,
                       local_world_size=min(LOCAL_WORLD, world), device=torch.device("cpu"),
                       tiers=("memory", "node", "peer"), budget_gib=0.0, durable=False,
                       events=EventLog(None, rank), log=lambda _: None)


def _node_with_snapshot(work: Path, world: int, rank: int, step: int):
    """This rank's snapshot of `step`, and the replica its node holds of its predecessor's."""
    from trainer.durable.state import local_tensors
    from trainer.snapshots.peer import predecessor
    from trainer.snapshots.slot import own_files, replica_files

    join(world, rank)
    model, optimizer = model_and_optimizer()
    snap = _snapshotter(work, world, rank)
    snap.own.take(step, local_tensors(model, optimizer), {"step": step})
    src = predecessor(rank, min(LOCAL_WORLD, world), world)
    if src != rank:
        buf, header = own_files(snap.root, rank, 0)
        rbuf, rheader = replica_files(snap.root, src, 0)
        shutil.copyfile(buf, rbuf)
        rheader.write_text(json.dumps({**json.loads(header.read_text()), "rank": src}))
    return model, optimizer, snap


def op_agreement(work: Path, world: int, rank: int) -> dict:
    """A snapshot restore: which step every rank can get, and this rank's shard of it."""
    import torch

    from trainer.snapshots.agreement import candidate_vector

    _, _, snap = _node_with_snapshot(work, world, rank, 7)
    tally = Tally()
    oracle = {"broadcast": lambda t: torch.tensor(candidate_vector([7]), dtype=t.dtype)}
    with counting(tally, world, rank, oracle):
        got = snap.restore(newer_than=None, fresh=False)
    assert got is not None and got.step == 7 and got.tier == "memory"
    return tally.to_json()


def op_peer_exchange(work: Path, world: int, rank: int) -> dict:
    """A snapshot replicated to the next node: its successor gets it, its predecessor's comes."""
    from trainer.durable.state import local_tensors

    join(world, rank)
    model, optimizer = model_and_optimizer()
    snap = _snapshotter(work, world, rank)
    tally = Tally()
    with counting(tally, world, rank, {}):
        snap.begin_attempt(60)
        snap.snapshot(3, local_tensors(model, optimizer), {"step": 3})
        snap.peer.finish_exchange()
    assert snap.peer.stats["peer_sends"] == (1 if world > LOCAL_WORLD else 0)
    return tally.to_json()


def op_reentry(work: Path, world: int, rank: int) -> dict:
    """An in-process restart: the tiers of a new attempt, and their restore from memory."""
    import torch

    from trainer.accounting.events import EventLog
    from trainer.config import from_values
    from trainer.distributed import DistEnv
    from trainer.hooks import ProcessState
    from trainer.snapshots.agreement import candidate_vector
    from trainer.tiers import Tiers

    model, optimizer, snap = _node_with_snapshot(work, world, rank, 7)
    cfg = from_values(checkpoint_dir=str(work / "ckpt"), tiers=("memory", "node", "peer"),
                      snapshot_interval=1, node_dir=str(work), mode="inprocess")
    env = DistEnv(rank, world, rank % LOCAL_WORLD, min(LOCAL_WORLD, world), torch.device("cpu"))
    process = ProcessState(snapshots=snap, leased=True)
    (work / "ckpt").mkdir(exist_ok=True)
    tally = Tally()
    oracle = {"broadcast": lambda t: torch.tensor(candidate_vector([7]), dtype=t.dtype),
              "broadcast_object_list": lambda: [[]]}
    with counting(tally, world, rank, oracle):
        tiers = Tiers(cfg, env, EventLog(None, rank), process, lambda: None, lambda _: None)
        meta = tiers.restore(model, optimizer)
    assert meta is not None and meta["step"] == 7
    return tally.to_json()


# --- the table --------------------------------------------------------------------------------
def run_one(op: str, world: int, rank: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="scale-") as tmp:
        return globals()[f"op_{op}"](Path(tmp), world, rank)


class _Server:
    """`python -m bench.scale --serve`: a process that imports `PRELOAD` once, then forks one
    process per measurement (`serve`), which measures and ends. So each measurement is a process
    of its own with nothing of another measurement cached, without each importing torch again
    (most of a measurement's time otherwise). A server of its own, not multiprocessing's fork
    server: that one is shared by everything in the process, with the preload of whoever
    started it first."""

    def __init__(self) -> None:
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.scale", "--serve"], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)})

    def ask(self, request: list, timeout_s: float) -> dict:
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            self.close()
            raise RuntimeError(f"the measuring server gave no answer within {timeout_s:g} s "
                               f"(exit {self.proc.returncode}):\n{self.stderr()}")
        return json.loads(line)

    def stderr(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-3000:]

    def close(self) -> None:
        self.proc.kill()  # its measurement dies with it (`serve`)
        self.proc.wait()
        self.log.close()


_server: Optional[_Server] = None


def measure(op: str, world: int, rank: int, timeout_s: float = 600) -> dict:
    """One operation in a fresh process: nothing of another measurement is imported or cached."""
    global _server
    if _server is None or _server.proc.poll() is not None:
        _server = _Server()
    answer = _server.ask([op, world, rank, os.environ.get(SHARD_CACHE_ENV)], timeout_s)
    if "failed" in answer:
        raise RuntimeError(f"{op} at N={world} rank {rank} failed:\n{answer['failed'][-3000:]}")
    return answer["counts"]


def serve() -> None:
    """Answer each request line on stdin, [op, N, rank, shard cache], with one line: the counts
    of `run_one`, measured in a process forked for it, or its failure. Forks from this thread
    alone; a measurement dies with the server."""
    from trainer.lifetime import die_with_parent

    for name in PRELOAD:
        importlib.import_module(name)
    server = os.getpid()
    for line in sys.stdin:
        op, world, rank, shards = json.loads(line)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            os.dup2(2, 1)  # what a measurement prints stays out of the answers
            die_with_parent(server)
            if shards:
                os.environ[SHARD_CACHE_ENV] = shards
            try:
                answer = {"counts": run_one(op, world, rank)}
            except BaseException:  # noqa: BLE001 - the caller raises it, with its traceback
                answer = {"failed": traceback.format_exc()}
            with os.fdopen(write_end, "w") as out:
                out.write(json.dumps(answer))
            os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end) as result:
            text = result.read()
        _, status = os.waitpid(pid, 0)
        if not text:
            text = json.dumps({"failed": f"the measuring process ended without a result "
                                         f"(wait status {status})"})
        print(text, flush=True)


def playing_rank(op: str, world: int) -> int:
    """A rank that is neither rank 0 nor on its node where the world allows (rank 9), in the
    world the operation runs in (half of N for a resume at half the world)."""
    runs_in = world // 2 if op == "resume_half" else world
    return 9 if runs_in >= 16 else 1


def subjects(op: str) -> list[str]:
    """Whose counts an operation reports: a rank other than 0, and rank 0 where its work once per
    checkpoint or restore is the point (only rank 0 publishes) or where only rank 0 does it."""
    if op in RANK0_ONLY:
        return ["rank0"]
    return ["rank", "rank0"] if op in RANK0_PER_CHECKPOINT else ["rank"]


def table(worlds: list[int], ops: tuple[str, ...] = OPERATIONS) -> dict:
    """{op: {"rank" | "rank0": {N: counts}}}; the measurements share their saved shards."""
    with tempfile.TemporaryDirectory(prefix="scale-shards-") as shards:
        os.environ.setdefault(SHARD_CACHE_ENV, shards)
        try:
            return _table(worlds, ops)
        finally:
            if os.environ[SHARD_CACHE_ENV] == shards:
                del os.environ[SHARD_CACHE_ENV]


def _table(worlds: list[int], ops: tuple[str, ...]) -> dict:
    out: dict = {}
    for op in ops:
        for who in subjects(op):
            for world in worlds:
                r = 0 if who == "rank0" else playing_rank(op, world)
                counts = {"rank": r, **measure(op, world, r)}
                out.setdefault(op, {}).setdefault(who, {})[world] = counts
                print(f"{op:13s} {who:5s} N={world:6d}: {counts}", file=sys.stderr, flush=True)
    return out


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.splitlines()[0])
    p.add_argument("--worlds", default="8,64,1024,16384")
    p.add_argument("--ops", default=",".join(OPERATIONS))
    p.add_argument("--out", type=Path)
    p.add_argument("--save_shard", nargs=4, metavar=("DIR", "N", "RANK", "STEP"),
                   help=argparse.SUPPRESS)
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.serve:
        serve()
        return 0
    if a.save_shard:
        ckpt, world, rank, step = a.save_shard
        _save_shard_here(Path(ckpt), int(world), int(rank), int(step))
        return 0
    worlds = [int(w) for w in a.worlds.split(",")]
    ops = tuple(o for o in a.ops.split(",") if o)
    unknown = sorted(set(ops) - set(OPERATIONS))
    if unknown or any(w < 2 for w in worlds):
        p.error(f"--ops {','.join(unknown)} unknown (allowed: {', '.join(OPERATIONS)})" if unknown
                else f"--worlds {a.worlds}: every world needs at least 2 ranks")
    result = {"worlds": worlds, "counts": table(worlds, ops)}
    text = json.dumps(result, indent=1)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
