"""GPU benchmarks, run side by side in one invocation: physical floors, checkpoint cost at the
published system's two checkpoint regimes (sync vs async vs snapshot tiers), fault-free and
recovery runs under its fault schedule, throughput and MFU, and profiles.

    python -m bench.run floors      --out bench/results
    python -m bench.run checkpoint  --out bench/results [--model llama-1b]
    python -m bench.run faultfree   --out bench/results [--modes ...] [--deterministic]
    python -m bench.run recovery    --out bench/results [--modes ...] [--deterministic]
    python -m bench.run throughput  --out bench/results [--throughput_runs ...]
    python -m bench.run profile     --out bench/results [--model llama-1b]
    python -m bench.run all         --out bench/results   # floors, checkpoint, recovery, bundle

Every experiment writes `<out>/<name>.json`; `python -m bench.tables <out>/<name>.json` prints
its rows as BENCHMARKS.md's tables show them. Training runs go through the local runner exactly
as a user would start them.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Optional

from config.contract import RecoveryMode
from devtools.local import EVERY_STEP_TIERS, mode_flags, tier_flags
from config.training import choices
from bench.scrub import scrub
from trainer.accounting.events import events_dir, log_files, read_events, write_jsonl

ACTIVATION_CHECKPOINTING = choices("activation_checkpointing")
SNAPSHOT_STAGING = choices("snapshot_staging")

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "runs" / "bench" / "logs"  # runner logs and event logs; packed by `bundle`
GIB = 2**30


# --- floors -----------------------------------------------------------------------------------
def _bandwidth_d2h(nbytes: int) -> dict:
    """Device-to-host copy bandwidth: into pinned memory (what staging uses) and pageable."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    for _ in range(2):
        pinned.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        pinned.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    pinned_gbs = 3 * nbytes / (time.perf_counter() - t0) / 1e9
    small = src[: nbytes // 4]
    small.cpu()
    t0 = time.perf_counter()
    small.cpu()
    pageable_gbs = small.numel() / (time.perf_counter() - t0) / 1e9
    return {"d2h_pinned_GBps": pinned_gbs, "d2h_pageable_GBps": pageable_gbs, "bytes": nbytes}


def _bandwidth_write(path: Path, nbytes: int) -> float:
    """GB/s of a sequential write plus fsync (what a checkpoint shard write costs)."""
    block = os.urandom(64 << 20)
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        for _ in range(nbytes // len(block)):
            f.write(block)
        os.fsync(f.fileno())
    dt = time.perf_counter() - t0
    path.unlink()
    return nbytes / dt / 1e9


_PG_PROBE = r'''
import os, time, torch, torch.distributed as dist
from datetime import timedelta
rank = int(os.environ["RANK"]); torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
out = {}
for name in ("first", "recreate"):
    t0 = time.perf_counter()
    dist.init_process_group("nccl", device_id=torch.device("cuda", int(os.environ["LOCAL_RANK"])),
                            timeout=timedelta(seconds=60))
    x = torch.ones(1, device="cuda"); dist.all_reduce(x); torch.cuda.synchronize()
    out[name] = time.perf_counter() - t0
    dist.destroy_process_group()
if rank == 0:
    print("PG", out["first"], out["recreate"], flush=True)
'''


def _pg_times(nproc: int) -> dict:
    probe = ROOT / "runs" / "bench" / "pg_probe.py"
    probe.parent.mkdir(parents=True, exist_ok=True)
    probe.write_text(_PG_PROBE)
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
                          str(probe)], capture_output=True, text=True, timeout=120)
    for line in out.stdout.splitlines():
        if line.startswith("PG "):
            _, first, again = line.split()
            return {"pg_first_init_s": float(first), "pg_recreate_s": float(again)}
    return {"pg_error": out.stderr[-500:]}


def floors(out: Path, nproc: int) -> dict:
    disk = ROOT / "runs" / "bench" / "disk.probe"
    res = {"disk_write_GBps": _bandwidth_write(disk, 4 * GIB),
           "shm_write_GBps": _bandwidth_write(Path("/dev/shm/nvrx-eks-bench.probe"), 4 * GIB),
           **_bandwidth_d2h(4 * GIB), **_pg_times(nproc)}
    _save(out, "floors", res)
    return res


# --- training runs ------------------------------------------------------------------------------
def _train(name: str, out: Path, mode: str, nproc: int, args: list[str],
           local: tuple[str, ...] = (), timeout: float = 600) -> dict:
    """One run through the local runner; returns its results.json plus wall clock and exit code."""
    run_dir = ROOT / "runs" / "bench" / name
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "devtools.local", "--mode", mode, "--nproc_per_node", str(nproc),
           "--run_dir", str(run_dir), *local, "--", *args]
    t0 = time.time()
    LOGS.mkdir(parents=True, exist_ok=True)
    with open(LOGS / f"{name}.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = "timeout"
            _stop(proc)
    res = json.loads((run_dir / "results.json").read_text()) if (run_dir / "results.json").exists() else {}
    res.update({"name": name, "exit_code": code, "runner_seconds": time.time() - t0,
                "command": " ".join(cmd[1:])})
    if log_files(events_dir(run_dir)):
        merged = LOGS / f"{name}.events.jsonl"
        write_jsonl(read_events(events_dir(run_dir)), merged)
        res["steady_step_seconds"] = steady_step_seconds(merged)
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    print(f"{name}: exit {code}, {res.get('training_efficiency_pct')} % efficiency, "
          f"{res.get('training_goodput_pct')} % goodput, {time.time() - t0:.0f} s", flush=True)
    return res


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM, which the runner passes on to its launchers, then SIGKILL. A SIGKILL alone
    (subprocess.run's timeout) leaves the trainers running: they would write into the
    checkpoints removed next and hold the GPUs of the next run."""
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


DEVICE = "cuda"
NODE_DIR: Optional[str] = None  # --node_dir of every run; None: the trainer's default
NO_CHECKPOINT = ["--checkpoint_interval", "0", "--final_checkpoint", "false"]


def _model_args(model: str, batch: int, seq: int, data: Optional[str]) -> list[str]:
    a = ["--model", model, "--seq_len", str(seq), "--batch_size", str(batch), "--device", DEVICE,
         "--log_interval", "50"]
    return a + (["--data_path", data] if data else []) + (["--node_dir", NODE_DIR] if NODE_DIR else [])


def _no_checkpoint(out: Path, model: str, nproc: int, batch: int, seq: int, steps: int,
                   data: Optional[str]) -> dict:
    """The reference for honest efficiency: the same run with no checkpoint and no snapshot."""
    name = f"ckpt-none-{steps}steps"
    return _train(name, out, "baseline", nproc, [*_model_args(model, batch, seq, data),
                  "--max_steps", str(steps), *NO_CHECKPOINT], timeout=240)


WARMUP_STEPS = 2  # compilation and lazy set-up: the first two steps of a run take seconds


def steady_step_seconds(events: Path) -> Optional[float]:
    """Wall clock per step from the completion of step WARMUP_STEPS to the last, by rank 0's
    device-anchored `done` stamps: everything that delays a step counts (stalls, slower steps
    beside a background copy, a host that falls behind), and the warm-up, whose length varies
    from run to run by more than a checkpoint costs, does not. None for a run that restarted."""
    done = {}
    for e in read_events(events):
        if e["event"] == "step" and e["rank"] == 0 and e.get("done"):
            if e["step"] in done:
                return None
            done[e["step"]] = e["done"]
    last = max(done, default=0)
    if last <= WARMUP_STEPS + 1 or WARMUP_STEPS not in done:
        return None
    return (done[last] - done[WARMUP_STEPS]) / (last - WARMUP_STEPS)


def _versus(run: dict, reference: dict) -> dict:
    """Throughput relative to the run without checkpoints, at steady state: slower steps
    overlapping a background copy or write count here, which blocking-based efficiency leaves
    out."""
    key = "steady_step_seconds"
    if not (run.get(key) and reference.get(key)):
        key = "loop_step_seconds"
    if run.get(key) and reference.get(key):
        run["throughput_vs_no_checkpoint_pct"] = 100.0 * reference[key] / run[key]
    return run


def checkpoint(out: Path, model: str, nproc: int, batch: int, seq: int, intervals: list[int],
               data: Optional[str]) -> dict:
    """Sync vs async at each interval (about 1x and 10x the write time), each beside a run
    without checkpoints. The 1x regime runs two intervals; the 10x one a single interval and a
    short tail, enough to see one checkpoint's cost at steady state."""
    base = _model_args(model, batch, seq, data)
    res: dict = {}
    for interval, steps in ((intervals[0], 2 * intervals[0]), (intervals[1], intervals[1] + 30)):
        ref = res[f"ckpt-none-{steps}steps"] = _no_checkpoint(out, model, nproc, batch, seq,
                                                             steps, data)
        for kind in ("async", "sync"):
            name = f"ckpt-{kind}-every{interval}"
            res[name] = _versus(_train(name, out, "baseline", nproc, [
                *base, "--max_steps", str(steps), "--checkpoint_interval", str(interval),
                "--use_async_checkpoint", "true" if kind == "async" else "false"], timeout=240),
                ref)
            _save(out, "checkpoint", res)
    return res


def tiers(out: Path, model: str, nproc: int, batch: int, seq: int, interval: int,
          data: Optional[str]) -> dict:
    """Snapshots of every step (memory and node tiers) with durable checkpoints at `interval`,
    staged each way (`--snapshot_staging`), beside a run without checkpoints."""
    base = _model_args(model, batch, seq, data)
    steps = int(1.5 * interval)
    ref = _no_checkpoint(out, model, nproc, batch, seq, steps, data)
    res = {ref["name"]: ref}
    for staging in SNAPSHOT_STAGING:
        name = f"ckpt-tiers-every{interval}-{staging}"
        res[name] = _versus(_train(name, out, "baseline", nproc, [
            *base, "--max_steps", str(steps), "--checkpoint_interval", str(interval),
            *EVERY_STEP_TIERS, "--snapshot_staging", staging], timeout=200), ref)
        _save(out, "tiers", res)
    return res


PROFILE_VARIANTS = {"clean": NO_CHECKPOINT,
                    "snapshots": [*EVERY_STEP_TIERS, *NO_CHECKPOINT],
                    "snapshots-write": [*EVERY_STEP_TIERS, "--checkpoint_interval", "20"]}


def profile_steps(out: Path, model: str, nproc: int, batch: int, seq: int,
                  data: Optional[str], variants: list[str], extra: list[str]) -> dict:
    """A torch.profiler window over steps 21-25: where a step's device time goes (compute,
    collectives, copies by direction, so peer-to-peer or through the host). Up to three
    windows side by side: no checkpoints; snapshots of every step; and snapshots while the
    durable write of step 20 runs, to show what a background write slows down. Every rank's
    timeline comes back gzipped beside the results (`<out>/<run>.rankNNNNN.trace.json.gz`), for
    what the per-operator totals cannot show: which wait holds a step, and on which rank."""
    res: dict = {}
    for variant in variants:
        name = f"profile-{model}-{variant}"
        run = _train(name, out, "baseline", nproc, [*_model_args(model, batch, seq, data),
                     "--max_steps", "30", *PROFILE_VARIANTS[variant], *extra,
                     "--profile_from", "21", "--profile_steps", "5"], timeout=300)
        profile = ROOT / "runs" / "bench" / name / "profile"
        if (profile / "summary.json").is_file():
            run["profile"] = json.loads((profile / "summary.json").read_text())
            shutil.copy(profile / "summary.txt", LOGS / f"{name}.summary.txt")
        for trace in sorted(profile.glob("rank*.trace.json")):
            with open(trace, "rb") as src, \
                    gzip.open(out / f"{name}.{trace.name}.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
        res[name] = run
        _save(out, f"profile-{model}", res)
    return res


THROUGHPUT_RUNS = ("eager", "eager-snapshots", "compiled", "compiled-snapshots", "compiled-ft")


def throughput(out: Path, model: str, nproc: int, batch: int, seq: int, steps: int,
               tiers: str, snapshot_interval: str, stagings: list[str], extra: list[str],
               data: Optional[str], runs: list[str]) -> dict:
    """Step time and MFU side by side: eager, compiled, compiled with snapshots alone, and
    compiled with the fault-tolerance machinery on (one async checkpoint half-way, snapshots in
    `tiers` staged each way in `stagings`), so one table shows how fast the loop runs and what
    protecting it costs at that speed. `tiers` "none" leaves the snapshots out: an 8B shard's
    slots do not fit the host memory of two H200s."""
    base = [*_model_args(model, batch, seq, data), "--max_steps", str(steps), *extra]
    compiled = ["--compile", "true"]
    one_write = ["--checkpoint_interval", str(steps // 2), "--final_checkpoint", "false"]

    def protected(label: str, durable: list[str], how: list[str] = compiled) -> dict:
        if tiers == "none":  # the durable tier alone, if there is one
            return {label: [*how, *durable]} if durable is one_write else {}
        return {f"{label}-{staging}": [
            *how, *durable, "--tiers", tiers, "--snapshot_interval", str(snapshot_interval),
            "--snapshot_staging", staging] for staging in stagings}

    groups = {"eager": {"eager": NO_CHECKPOINT},
              "eager-snapshots": protected("eager-snapshots", NO_CHECKPOINT, []),
              "compiled": {"compiled": [*compiled, *NO_CHECKPOINT]},
              "compiled-snapshots": protected("compiled-snapshots", NO_CHECKPOINT),
              "compiled-ft": protected("compiled-ft", one_write)}
    label = f"throughput-{model}-seq{seq}-b{batch}"
    res: dict = {}
    for kind, flags in ((k, f) for group in runs for k, f in groups[group].items()):
        run = _train(f"{label}-{kind}", out, "baseline", nproc, [*base, *flags], timeout=400)
        res[run["name"]] = _loop_mfu(run)
        reference = f"{label}-{kind.split('-')[0]}"  # the same run without protection
        if "-" in kind and reference in res:
            _versus(run, res[reference])
        _save(out, label, res)
    return res


def _loop_mfu(run: dict) -> dict:
    """MFU over the loop's mean step time with stalls (`mfu_pct` uses the median step alone)."""
    if run.get("mfu_pct") and run.get("loop_step_seconds") and run.get("tokens_per_second"):
        median_step = run["tokens_per_step"] / run["tokens_per_second"]
        run["loop_mfu_pct"] = run["mfu_pct"] * median_step / run["loop_step_seconds"]
    return run


# The published schedule's shape: 5 faults, exception/hang 0.6/0.4, seed 42; a checkpoint every
# quarter of the run.
FAULTS = ["--fault_count", "5", "--fault_seed", "42", "--fault_types", "exception,hang",
          "--fault_type_weights", "0.6,0.4", "--fault_after_step", "10"]
HARD_TIMEOUT_S = 30
RECOVERY_TIMEOUTS = ["--soft_timeout", "5", "--hard_timeout", str(HARD_TIMEOUT_S),
                     "--barrier_timeout", "120", "--completion_timeout", "120",
                     "--nccl_timeout", "20"]


# Per-run limits for llama-1b on 2x H200, sized with margin from the measured runs (BENCHMARKS.md,
# recovery on two H200s): fault-free about 100-165 s in every mode; under the 5 faults inprocess
# 196 s, ft_launcher+inprocess 150 s, ft_launcher about 280 s, and the baseline over 400 s. A mode
# not measured yet gets the largest limit of its kind.
RUN_LIMITS = {"faultfree": {RecoveryMode.BASELINE: 200, RecoveryMode.INPROCESS: 220,
                            RecoveryMode.FT_LAUNCHER: 240, RecoveryMode.FT_LAUNCHER_INPROCESS: 240},
              "recovery": {RecoveryMode.BASELINE: 540, RecoveryMode.INPROCESS: 300,
                           RecoveryMode.FT_LAUNCHER: 380, RecoveryMode.FT_LAUNCHER_INPROCESS: 260}}


def run_limit(kind: str, mode: str) -> float:
    limits = RUN_LIMITS[kind]
    return limits.get(RecoveryMode(mode), max(limits.values()))


def recovery_local(mode: str) -> tuple[str, ...]:
    """The local runner's flags: the Job's restart backoff 1 s where the Job restarts on every
    fault; ft_launcher's heartbeat timeout 10 s, or with in-process restart 30 s beyond the
    trainer's hard timeout."""
    return tuple(mode_flags(mode, HARD_TIMEOUT_S, backoff_seconds=1.0, heartbeat_floor=10.0,
                            heartbeat_margin=30.0))


def _recovery_args(model: str, batch: int, seq: int, steps: int, data: Optional[str],
                   deterministic: bool, mode: str, staging: str = "host") -> list[str]:
    tiers = tier_flags(mode)
    extra = [*tiers, "--snapshot_staging", staging] if tiers else []
    return [*_model_args(model, batch, seq, data), "--max_steps", str(steps),
            "--checkpoint_interval", str(steps // 4), *RECOVERY_TIMEOUTS, *extra,
            "--deterministic", "true" if deterministic else "false"]


def faultfree(out: Path, model: str, nproc: int, batch: int, seq: int, steps: int,
              modes: list[str], data: Optional[str], deterministic: bool,
              timeout: Optional[float], determinism_cost: bool = False,
              staging: str = "host") -> dict:
    """The recovery runs' settings without faults: every mode must finish with 0 restarts, and
    in deterministic mode with one param_sha256 (the one the faulted runs must match). With
    `determinism_cost`, a baseline run with deterministic mode flipped gives its step-time
    cost side by side."""
    res = {}
    runs = [(mode, deterministic) for mode in modes]
    if RecoveryMode.BASELINE in modes and determinism_cost:
        runs.append((RecoveryMode.BASELINE.value, not deterministic))
    for mode, det in runs:
        name = f"faultfree-{mode.replace('+', '-')}" + ("-det" if det else "")
        res[name] = _train(name, out, mode, nproc,
                           _recovery_args(model, batch, seq, steps, data, det, mode, staging),
                           recovery_local(mode),
                           timeout=timeout or run_limit("faultfree", mode))
        _save(out, f"faultfree-{'-'.join(m.replace('+', '-') for m in modes)}", res)
    return res


def recovery(out: Path, model: str, nproc: int, batch: int, seq: int, steps: int,
             modes: list[str], data: Optional[str], deterministic: bool,
             timeout: Optional[float], staging: str = "host") -> dict:
    """The 5-fault schedule in each mode; with a `staging` other than host, restores also
    check that staging's snapshots bit for bit (the hash must match the fault-free one)."""
    res = {}
    for mode in modes:
        name = f"recovery-{mode.replace('+', '-')}" + ("" if staging == "host" else f"-{staging}")
        res[name] = _train(name, out, mode, nproc,
                           [*_recovery_args(model, batch, seq, steps, data, deterministic, mode,
                                            staging), *FAULTS], recovery_local(mode),
                           timeout=timeout or run_limit("recovery", mode))
        _save(out, f"recovery-{'-'.join(m.replace('+', '-') for m in modes)}", res)
    return res


_MACHINE: dict = {}


def _machine() -> dict:
    """Read once, before the first run: importing torch and querying CUDA takes seconds, which a
    save at the end of a time-limited invocation may not have."""
    if not _MACHINE:
        import torch

        _MACHINE.update({
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None,
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            "nvrx": _version("nvidia-resiliency-ext"), "transformers": _version("transformers"),
            "cpus": os.cpu_count(), **_node_dir_pages()})
    return _MACHINE


def _node_dir_pages() -> dict:
    """Where the runs' node tier lives and on which pages: a restart's pinning depends on it."""
    from trainer.node_dir import default_node_dir, mount_of, page_bytes

    node_dir = Path(NODE_DIR) if NODE_DIR else default_node_dir().parent
    mount = mount_of(node_dir)
    return {"node_dir": str(node_dir), "node_dir_page_kib": page_bytes(node_dir) // 1024,
            "node_dir_mount": f"{mount[1]} {mount[2]}" if mount else None}


def _save(out: Path, name: str, data: dict) -> None:
    meta = {**_machine(), "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    text = json.dumps(scrub({"machine": meta, "results": data}), indent=1)
    (out / f"{name}.json").write_text(text)


def _version(pkg: str) -> Optional[str]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(pkg)
    except PackageNotFoundError:
        return None


SINCE_ENV = "BENCH_SINCE"  # bench/gpu.sh: when its first part began (epoch seconds)


def bundle(out: Path) -> None:
    """Pack the run logs and event logs into one archive (one file to copy off the GPU machine):
    those written since $BENCH_SINCE, so runs of earlier invocations on the same machine add
    nothing stale."""
    if not LOGS.is_dir():
        return
    since = float(os.environ.get(SINCE_ENV, 0))
    with tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
        for f in sorted(LOGS.iterdir()):
            if f.stat().st_mtime >= since:
                tar.add(f, arcname=f.name)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("floors", "checkpoint", "faultfree", "recovery", "tiers",
                                    "throughput", "profile", "bundle", "all"))
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    p.add_argument("--model", default="llama-1b")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--batch_size", type=int, default=1)
    p.add_argument("--seq_len", type=int, default=2048)
    p.add_argument("--intervals", default="100,1000",
                   help="checkpoint intervals for the 1x and 10x regimes (steps)")
    p.add_argument("--recovery_steps", type=int, default=160)
    p.add_argument("--throughput_steps", type=int, default=40)
    p.add_argument("--tiers", default="memory,node",
                   help="throughput: the fault-tolerant run's snapshot tiers, or none")
    p.add_argument("--snapshot_interval", default="1",
                   help="throughput: steps between snapshots in the fault-tolerant run, or auto")
    p.add_argument("--snapshot_staging", default="host",
                   help="throughput: the fault-tolerant runs' --snapshot_staging, one run each "
                        f"(comma-separated from {', '.join(SNAPSHOT_STAGING)}); recovery, "
                        "faultfree: the first one")
    p.add_argument("--throughput_runs", default=",".join(THROUGHPUT_RUNS),
                   help=f"throughput: which of {', '.join(THROUGHPUT_RUNS)} to run")
    p.add_argument("--activation_checkpointing", default="none",
                   choices=ACTIVATION_CHECKPOINTING,
                   help="throughput: the trainer's --activation_checkpointing in every run")
    p.add_argument("--profile_variants", default=",".join(PROFILE_VARIANTS),
                   help="profile: which windows to record")
    p.add_argument("--compile", action="store_true",
                   help="profile: the trainer's --compile true in every window")
    p.add_argument("--modes", default=",".join(RecoveryMode))
    p.add_argument("--data_path")
    p.add_argument("--node_dir", help="every run's --node_dir (default: the trainer's, /dev/shm)")
    p.add_argument("--device", default="cuda", help="cpu: a dry run of the harness itself")
    p.add_argument("--deterministic", action="store_true",
                   help="recovery and fault-free runs in deterministic mode: hashes comparable")
    p.add_argument("--determinism_cost", action="store_true",
                   help="faultfree: also a baseline run with --deterministic flipped")
    p.add_argument("--run_timeout", type=float,
                   help="seconds one recovery or fault-free run may take (default: RUN_LIMITS, "
                        "per mode, sized for llama-1b on 2x H200)")
    a = p.parse_args(argv)
    for value, allowed, flag in ((a.snapshot_staging, SNAPSHOT_STAGING, "--snapshot_staging"),
                                 (a.throughput_runs, THROUGHPUT_RUNS, "--throughput_runs"),
                                 (a.profile_variants, tuple(PROFILE_VARIANTS), "--profile_variants")):
        bad = [v for v in value.split(",") if v not in allowed]
        if bad:
            p.error(f"{flag} {bad[0]!r}: choose from {', '.join(allowed)}")
    global DEVICE, NODE_DIR
    DEVICE, NODE_DIR = a.device, a.node_dir
    a.out.mkdir(parents=True, exist_ok=True)
    _machine()
    if a.what in ("floors", "all"):
        print("floors:", floors(a.out, a.nproc), flush=True)
    if a.what in ("checkpoint", "all"):
        checkpoint(a.out, a.model, a.nproc, a.batch_size, a.seq_len,
                   [int(x) for x in a.intervals.split(",")], a.data_path)
    if a.what == "faultfree":
        faultfree(a.out, a.model, a.nproc, a.batch_size, a.seq_len, a.recovery_steps,
                  a.modes.split(","), a.data_path, a.deterministic, a.run_timeout,
                  a.determinism_cost, a.snapshot_staging.split(",")[0])
    if a.what in ("recovery", "all"):
        recovery(a.out, a.model, a.nproc, a.batch_size, a.seq_len, a.recovery_steps,
                 a.modes.split(","), a.data_path, a.deterministic, a.run_timeout,
                 a.snapshot_staging.split(",")[0])
    if a.what == "tiers":
        tiers(a.out, a.model, a.nproc, a.batch_size, a.seq_len, int(a.intervals.split(",")[0]),
              a.data_path)
    if a.what == "throughput":
        throughput(a.out, a.model, a.nproc, a.batch_size, a.seq_len, a.throughput_steps,
                   a.tiers, a.snapshot_interval, a.snapshot_staging.split(","),
                   ["--activation_checkpointing", a.activation_checkpointing], a.data_path,
                   a.throughput_runs.split(","))
    if a.what == "profile":
        profile_steps(a.out, a.model, a.nproc, a.batch_size, a.seq_len, a.data_path,
                      a.profile_variants.split(","), ["--compile", "true"] if a.compile else [])
    if a.what in ("bundle", "all"):
        bundle(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
