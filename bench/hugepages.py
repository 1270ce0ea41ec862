"""What a snapshot slot's pages cost a restart: 4 KiB pages against 2 MiB (huge) pages.

A restarted worker maps the slots its predecessor left and registers them with CUDA
(`cudaHostRegister`) before its first restore, and a failed worker's exit unregisters them.
Both scale with the number of pages, which is why the GPU nodes put `/dev/shm` on huge pages
(profile `tiers.huge_tmpfs`). For each directory, with three slots of `--slot_gb` (one
llama-1b rank's two alternating slots and the durable writer's):
- a fresh start: the first touch of the slots, then their registration by the same process;
- the device-to-host copy into a registered slot;
- a restart: one process touches the slots and exits, a second maps and registers them;
- that second process's exit (`os._exit`, as a failed rank leaves) until it is reaped, with its
  slots registered, without registering them, and after unregistering them on a thread each;
  all hold `--device_gib` of device memory, as a rank does.

    mount -t tmpfs -o huge=always,size=40g tmpfs /mnt/hugeshm
    python -m bench.hugepages --dirs /dev/shm,/mnt/hugeshm --out bench/results

Prints one line per directory and writes `<out>/hugepages.json`, with each directory's mount
options and the host's `shmem_enabled` setting beside the seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from trainer.node_dir import mount_of

SLOTS = 3
SHMEM_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/shmem_enabled")

# One process's part, run as `python -c` so that every measure starts from a fresh process, as a
# restarted worker does. argv: action, directory, slot bytes, device GiB. Prints one JSON line.
_PROCESS = r'''
import json, os, sys, time
import torch
action, root, nbytes, device_gib = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
paths = [os.path.join(root, f"hugepages-probe.{i}.buf") for i in range(3)]
def mapped():
    return [torch.from_file(p, shared=True, size=nbytes, dtype=torch.uint8) for p in paths]
def register(bufs):
    for t in bufs:
        assert int(torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel(), 0)) == 0
out = {}
if action == "touch":
    for t in mapped():
        t.fill_(1)
    sys.exit(0)
torch.cuda.set_device(0)
held = torch.empty(int(device_gib * 2**30), dtype=torch.uint8, device="cuda")
t0 = time.perf_counter()
bufs = mapped()
if action == "fresh":
    for t in bufs:
        t.fill_(1)
    out["touch_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    register(bufs)
    out["register_s"] = time.perf_counter() - t0
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    for _ in range(2):
        torch.cuda.synchronize(); t0 = time.perf_counter()
        bufs[0].copy_(src, non_blocking=True); torch.cuda.synchronize()
    out["d2h_GBps"] = nbytes / (time.perf_counter() - t0) / 1e9
    for t in bufs:
        torch.cuda.cudart().cudaHostUnregister(t.data_ptr())
    print(json.dumps(out), flush=True)
    sys.exit(0)
out["map_s"] = time.perf_counter() - t0
if action in ("restart", "unregister"):
    t0 = time.perf_counter()
    register(bufs)
    out["register_s"] = time.perf_counter() - t0
if action == "unregister":  # the slots unregistered on a thread each before the exit
    import threading
    t0 = time.perf_counter()
    threads = [threading.Thread(target=torch.cuda.cudart().cudaHostUnregister,
                                args=(t.data_ptr(),)) for t in bufs]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    out["unregister_s"] = time.perf_counter() - t0
torch.cuda.synchronize()
out["exit_t"] = time.time()
print(json.dumps(out), flush=True)
os._exit(1)
'''


def _process(action: str, root: Path, nbytes: int, device_gib: float) -> dict:
    """Runs one part in a fresh process; for the parts that end in os._exit, adds the seconds
    from its last stamp until it is reaped: the teardown a launcher waits for."""
    proc = subprocess.Popen([sys.executable, "-c", _PROCESS, action, str(root), str(nbytes),
                             str(device_gib)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    proc.wait()
    reaped = time.time()
    if action == "touch":
        return {}
    if not line:
        raise RuntimeError(f"the {action} process in {root} ended with {proc.returncode} and no result")
    rec = json.loads(line)
    if "exit_t" in rec:
        rec["exit_to_reaped_s"] = reaped - rec.pop("exit_t")
    return rec


def _mount_options(path: Path) -> Optional[str]:
    """The type and options of the mount that holds `path` (tmpfs huge=always, say)."""
    mount = mount_of(path)
    return f"{mount[1]} {mount[2]}" if mount else None


def measure(root: Path, nbytes: int, device_gib: float) -> dict:
    """Every measure for one directory; the slot files are removed afterwards."""
    res: dict = {"dir": str(root), "mount": _mount_options(root), "slots": SLOTS,
                 "slot_bytes": nbytes}
    try:
        res["fresh"] = _process("fresh", root, nbytes, device_gib)
        _process("touch", root, nbytes, device_gib)
        res["restart"] = _process("restart", root, nbytes, device_gib)
        res["exit_unregistered"] = _process("exit", root, nbytes, device_gib)
        res["unregister_then_exit"] = _process("unregister", root, nbytes, device_gib)
    finally:
        for i in range(SLOTS):
            (root / f"hugepages-probe.{i}.buf").unlink(missing_ok=True)
    return res


def check_dirs(dirs: list[Path], nbytes: int) -> Optional[str]:
    """The first directory that cannot hold the slots, as one line; None when all can."""
    for d in dirs:
        if not d.is_dir() or not os.access(d, os.W_OK):
            return f"--dirs {d}: not a writable directory"
        free = shutil.disk_usage(d).free
        if free < SLOTS * nbytes:
            return (f"--dirs {d}: {free / 1e9:.1f} GB free, the {SLOTS} slots need "
                    f"{SLOTS * nbytes / 1e9:.1f} GB (lower --slot_gb)")
    return None


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.hugepages", description=__doc__.split("\n\n")[0])
    p.add_argument("--dirs", default="/dev/shm",
                   help="comma-separated directories to hold the slots, e.g. /dev/shm,/mnt/hugeshm")
    p.add_argument("--slot_gb", type=float, default=7.4, help="one slot (7.4: a llama-1b rank's shard)")
    p.add_argument("--device_gib", type=float, default=30.0, help="device memory each process holds")
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    a = p.parse_args(argv)
    dirs, nbytes = [Path(d) for d in a.dirs.split(",") if d], int(a.slot_gb * 1e9)
    if a.slot_gb <= 0 or a.device_gib < 0:
        print(f"bench.hugepages: --slot_gb {a.slot_gb} must be positive and --device_gib "
              f"{a.device_gib} not negative", file=sys.stderr)
        return 2
    problem = check_dirs(dirs, nbytes)
    if problem:
        print(f"bench.hugepages: {problem}", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("bench.hugepages: needs a CUDA device (it measures cudaHostRegister)", file=sys.stderr)
        return 2
    setting = SHMEM_ENABLED.read_text().strip() if SHMEM_ENABLED.exists() else None
    results = {"shmem_enabled": setting, "dirs": []}
    for d in dirs:
        rec = measure(d, nbytes, a.device_gib)
        results["dirs"].append(rec)
        print(f"{d} ({rec['mount']}): touch {rec['fresh']['touch_s']:.2f} s, register "
              f"{rec['fresh']['register_s']:.2f} s fresh / {rec['restart']['register_s']:.2f} s "
              f"after a restart, copy {rec['fresh']['d2h_GBps']:.1f} GB/s, exit "
              f"{rec['restart']['exit_to_reaped_s']:.2f} s registered / "
              f"{rec['exit_unregistered']['exit_to_reaped_s']:.2f} s not; unregistered on "
              f"{SLOTS} threads {rec['unregister_then_exit']['unregister_s']:.2f} s, then exit "
              f"{rec['unregister_then_exit']['exit_to_reaped_s']:.2f} s", flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "hugepages.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
