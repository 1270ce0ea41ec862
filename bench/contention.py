"""What a snapshot's device-to-host copy slows down, measured in isolation on every local GPU.

A snapshot of every step copies the whole shard to host memory while the next step runs. On
2x H200 that made some steps 0.14 s longer and FSDP's collectives 3-6x slower in the profile.
This separates the candidates, each alone and then beside a running copy to host memory:
- an all-gather the size of one llama-1b layer's (NCCL over NVLink or through the host?);
- a bf16 matrix product (does the copy take compute or memory bandwidth?);
- the copy itself, on one GPU alone and on all at once (a shared PCIe or host-memory limit?),
  into memory from cudaHostAlloc and into a registered /dev/shm mapping (what the slots are);
- a device-to-device copy of the same size (the device stage);
- a step's small input and loss copies, queued on the compute stream while the big copy runs.

    python -m bench.contention --out bench/results [--gib 4]

Prints one line per measure and writes `<out>/contention.json`; NCCL's transport lines go to
`<out>/contention-nccl.log` (P2P or SHM between the GPUs).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

GIB = 2**30


def _timed(fn, reps: int) -> float:
    """Seconds per call on the current stream."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


class Background:
    """Copies `src` into `dst` over and over on a side stream until stopped."""

    def __init__(self, src: torch.Tensor, dst: torch.Tensor):
        self.src, self.dst, self.stream = src, dst, torch.cuda.Stream()

    def start(self, n: int) -> None:
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            for _ in range(n):
                self.dst.copy_(self.src, non_blocking=True)


def _shm_pinned(nbytes: int, rank: int) -> torch.Tensor:
    path = f"/dev/shm/contention.{rank}.buf"
    flat = torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)
    flat.fill_(0)
    rc = torch.cuda.cudart().cudaHostRegister(flat.data_ptr(), nbytes, 0)
    assert int(rc) == 0, f"cudaHostRegister failed: {int(rc)}"
    os.unlink(path)
    return flat


def _worker(rank: int, world: int, nbytes: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29555")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    res: dict = {}
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    shm = _shm_pinned(nbytes, rank)
    dev = torch.empty_like(src)

    def gbps(seconds: float) -> float:
        return nbytes / seconds / 1e9

    # the copy: alone on this GPU, then on every GPU at once
    for name, dst in (("d2h_pinned", pinned), ("d2h_shm_registered", shm), ("d2d", dev)):
        dist.barrier()
        if rank == 0:
            res[f"{name}_one_gpu_GBps"] = gbps(_timed(lambda: dst.copy_(src, non_blocking=True), 3))
        dist.barrier()
        res[f"{name}_all_gpus_GBps"] = gbps(_timed(lambda: dst.copy_(src, non_blocking=True), 3))

    # one llama-1b layer's all-gather (~61 M parameters, bf16) and a matrix product
    shard = torch.randn(61_000_000 // world, dtype=torch.bfloat16, device="cuda")
    gathered = torch.empty(shard.numel() * world, dtype=torch.bfloat16, device="cuda")
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    work = {"all_gather_ms": lambda: dist.all_gather_into_tensor(gathered, shard),
            "matmul_8k_ms": lambda: a @ a}
    # (copy, how many back to back: enough to outlast the measured loop)
    copies = {"alone": (None, 0), "beside_d2h_shm": (Background(src, shm), 4),
              "beside_d2d": (Background(src, dev), 40)}
    for wname, fn in work.items():
        for cname, (bg, n) in copies.items():
            dist.barrier()
            torch.cuda.synchronize()
            if bg is not None:
                bg.start(n)
            ms = 1e3 * _timed(fn, 20)
            res[f"{wname}_{cname}"] = ms
            torch.cuda.synchronize()
    # a step's input (128 KB host to device) and its loss (device to host) queued on the
    # compute stream just after the snapshot's copy started on its own stream: do they wait
    # for all of it (one copy engine, one transfer at a time)?
    small_host = torch.ones(16384, dtype=torch.int64, pin_memory=True)
    small_dev = torch.ones(16384, dtype=torch.int64, device="cuda")
    smalls = {"small_h2d_ms": lambda: small_dev.copy_(small_host, non_blocking=True),
              "small_d2h_ms": lambda: small_host.copy_(small_dev, non_blocking=True)}
    for sname, fn in smalls.items():
        for cname, (bg, n) in copies.items():
            dist.barrier()
            torch.cuda.synchronize()
            if bg is not None:
                bg.start(1)
            t0 = time.perf_counter()
            fn()
            torch.cuda.current_stream().synchronize()
            res[f"{sname}_{cname}"] = 1e3 * (time.perf_counter() - t0)
            torch.cuda.synchronize()
    res["all_gather_bytes"] = gathered.numel() * 2
    res["all_gather_GBps_alone"] = gathered.numel() * 2 * (world - 1) / world / (
        res["all_gather_ms_alone"] / 1e3) / 1e9
    gathered_all = [None] * world
    dist.all_gather_object(gathered_all, res)
    if rank == 0:
        Path(out).write_text(json.dumps({"bytes": nbytes, "ranks": gathered_all}, indent=1))
        for k, v in res.items():
            print(f"{k}: {v:.3f}", flush=True)
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.contention", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    p.add_argument("--gib", type=float, default=4.0, help="bytes of each copy, in GiB")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    world = torch.cuda.device_count()
    os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,P2P,SHM",
                      NCCL_DEBUG_FILE=str(a.out / "contention-nccl.%p.log"))
    mp.spawn(_worker, args=(world, int(a.gib * GIB), str(a.out / "contention.json")),
             nprocs=world)
    logs = sorted(a.out.glob("contention-nccl.*.log"))
    (a.out / "contention-nccl.log").write_text("".join(f.read_text() for f in logs))
    for f in logs:
        f.unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
