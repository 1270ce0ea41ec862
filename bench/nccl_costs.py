"""What NCCL's process group costs a restart on one GPU: its start in a new process (alone, and
beside the pinning of snapshot slots, as a relaunched worker has it) and the in-process abort.

Each measure runs in a fresh process, as a restarted worker does:
- `init`: CUDA context, a one-rank NCCL process group and its first all-reduce, alone;
- `init_pinning`: the same while a thread registers (`cudaHostRegister`) `--slots` files of
  `--slot_gb` on `--dir`, as `HostBuffer.warm` does in a relaunched worker;
- `abort`: what NVRx's `AbortTorchDistributed` does to a group that has run collectives: each
  backend's `abort()`, then `destroy_process_group()`, each timed; once as the image sets NCCL
  up and once per variant of `--abort_env` (`NAME=VALUE`, comma-separated within a variant).

    python -m bench.nccl_costs --dir /mnt/hugeshm --slot_gb 14.8 --out bench/results

Prints one line per measure and writes `<out>/nccl-costs.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

_PROCESS = r'''
import json, os, sys, threading, time
t_start = time.perf_counter()
import torch, torch.distributed as dist
action, root, nbytes, slots = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
out = {"import_s": time.perf_counter() - t_start}
pin_thread = None
if action == "init_pinning":
    paths = [os.path.join(root, f"nccl-costs.{i}.buf") for i in range(slots)]
    bufs = [torch.from_file(p, shared=True, size=nbytes, dtype=torch.uint8) for p in paths]
    def pin():
        torch.cuda.set_device(0)
        t0 = time.perf_counter()
        for t in bufs:
            assert int(torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel(), 0)) == 0
        out["pin_s"] = time.perf_counter() - t0
    torch.cuda.set_device(0)
    pin_thread = threading.Thread(target=pin); pin_thread.start()
t0 = time.perf_counter()
torch.cuda.set_device(0); torch.cuda.init()
torch.empty(1, device="cuda")
out["context_s"] = time.perf_counter() - t0
store = dist.HashStore()
t1 = time.perf_counter()
dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda", 0))
x = torch.ones(1 << 20, device="cuda")
dist.all_reduce(x); torch.cuda.synchronize()
out["pg_s"] = time.perf_counter() - t1
if pin_thread is not None:
    pin_thread.join()
    out["pin_then_pg_s"] = time.perf_counter() - t0
if action == "abort":
    for _ in range(20):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for group in list(dist.distributed_c10d._world.pg_names):
        group._get_backend(torch.device("cuda")).abort()
    out["backend_abort_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    dist.destroy_process_group()
    out["destroy_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    dist.all_reduce(x); torch.cuda.synchronize()
    out["pg_again_s"] = time.perf_counter() - t0
print(json.dumps(out), flush=True)
os._exit(0)
'''


def _process(action: str, root: Path, nbytes: int, slots: int, env: dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", _PROCESS, action, str(root), str(nbytes),
                           str(slots)], stdout=subprocess.PIPE, text=True,
                          env={**os.environ, **env}, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        raise RuntimeError(f"the {action} process ended with {proc.returncode} and no result")
    return json.loads(lines[-1])


def _variants(spec: str) -> list[dict[str, str]]:
    """`A=1,B=2;C=3` → [{}, {A: 1, B: 2}, {C: 3}]: the defaults first."""
    out: list[dict[str, str]] = [{}]
    for variant in filter(None, spec.split(";")):
        out.append(dict(kv.split("=", 1) for kv in variant.split(",")))
    return out


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.nccl_costs", description=__doc__.split("\n")[0])
    p.add_argument("--dir", type=Path, default=Path("/dev/shm"))
    p.add_argument("--slot_gb", type=float, default=14.8)
    p.add_argument("--slots", type=int, default=3)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--abort_env", default="TORCH_NCCL_ENABLE_MONITORING=0;"
                   "TORCH_NCCL_COORD_CHECK_MILSEC=50;TORCH_NCCL_ASYNC_ERROR_HANDLING=0")
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    args = p.parse_args(argv)
    if args.slot_gb <= 0 or args.slots < 1 or args.repeat < 1:
        print(f"{p.prog}: error: --slot_gb, --slots and --repeat must be positive", file=sys.stderr)
        return 2
    nbytes = int(args.slot_gb * 1e9)
    res: dict = {"dir": str(args.dir), "slots": args.slots, "slot_bytes": nbytes, "runs": []}
    paths = [args.dir / f"nccl-costs.{i}.buf" for i in range(args.slots)]
    try:
        for path in paths:  # touched once, as a previous worker leaves them
            with open(path, "wb") as f:
                f.truncate(nbytes)
            subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=64M", "conv=notrunc",
                            f"count={nbytes // (64 << 20) + 1}", "status=none"], check=True)
        for _ in range(args.repeat):
            for action, env in [("init", {}), ("init_pinning", {})] + \
                    [("abort", v) for v in _variants(args.abort_env)]:
                rec = {"action": action, "env": env,
                       **_process(action, args.dir, nbytes, args.slots, env)}
                print(json.dumps(rec), flush=True)
                res["runs"].append(rec)
    finally:
        for path in paths:
            path.unlink(missing_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "nccl-costs.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
