"""How long a trainer process takes to die: the part of an ft_launcher restart between the
launcher's SIGTERM and the moment it can start the next workers.

On 2x H200 that took 1.9-2.7 s per rank. This starts a process holding what a llama-1b rank
holds (a CUDA context, device memory, host slots registered with CUDA), sends it SIGTERM and
times its exit, once per ingredient, so the one that costs the time shows.

    python -m bench.teardown --out bench/results [--device_gib 30] [--pinned_gib 8]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

GIB = 2**30

_HOLDER = r'''
import os, sys, torch
device_gib, pinned_gib = float(sys.argv[1]), float(sys.argv[2])
torch.cuda.set_device(0)
torch.zeros(1, device="cuda")
hold = []
if device_gib:
    hold.append(torch.empty(int(device_gib * 2**30), dtype=torch.uint8, device="cuda"))
if pinned_gib:
    path = f"/dev/shm/teardown.{os.getpid()}.buf"
    flat = torch.from_file(path, shared=True, size=int(pinned_gib * 2**30), dtype=torch.uint8)
    flat.fill_(0)
    os.unlink(path)
    assert int(torch.cuda.cudart().cudaHostRegister(flat.data_ptr(), flat.numel(), 0)) == 0
    hold.append(flat)
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.read()
'''


def _exit_seconds(device_gib: float, pinned_gib: float) -> float:
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(device_gib), str(pinned_gib)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    t0 = time.perf_counter()
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait()
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.teardown", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    p.add_argument("--device_gib", type=float, default=30.0)
    p.add_argument("--pinned_gib", type=float, default=8.0)
    a = p.parse_args()
    cases = {"cuda_context": (0.0, 0.0), "device_memory": (a.device_gib, 0.0),
             "registered_host": (0.0, a.pinned_gib), "both": (a.device_gib, a.pinned_gib)}
    res = {name: _exit_seconds(*sizes) for name, sizes in cases.items()}
    res.update(device_gib=a.device_gib, pinned_gib=a.pinned_gib)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "teardown.json").write_text(json.dumps(res, indent=1))
    for k, v in res.items():
        print(f"{k}: {v:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
