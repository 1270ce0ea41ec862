"""`python -m bench.node_loss`: a lost node, end to end, on simulated CPU nodes, with where the
seconds go: detection, rendezvous and takeover, restore, first step.

Two ways to lose a node:
- `kill`: a `node` fault SIGKILLs every process of a node, its launcher included. The peers'
  connections to it close, so its loss is seen at once through the closed sockets.
- `freeze`: every process of a node is stopped (SIGSTOP): a machine that stops answering,
  whose connections stay open. Only the rendezvous keep-alive finds it (--node_timeout); the
  survivors' collective would wait out its timeout.

and two ways to go on: `spare` (2 training nodes and 1 spare) and `shrink` (2 nodes, no spare,
--min_nodes 1). Each run is `python -m devtools.local` as a user starts it; its command, the
runner's exit code, the breakdown and the run's results.json go to OUT/<case>.json.

    python -m bench.node_loss --out bench/results/cpu-node-loss [--cases spare-kill,...]
        [--compute_dtype auto|bf16|fp32]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from bench.scrub import scrub
from devtools.local import node_processes

ROOT = Path(__file__).resolve().parents[1]
TRAINER = ["--model", "tiny", "--seq_len", "64", "--batch_size", "2", "--log_interval", "6",
           "--warmup_steps", "4", "--max_steps", "24", "--checkpoint_interval", "4",
           "--tiers", "memory,node,peer", "--snapshot_interval", "1"]
LOSS_STEP = 12  # late enough for the spare's fork server to have its imports done
CASES = ("spare-kill", "spare-freeze", "shrink-kill", "shrink-freeze")


def node_fault_flags(steps: int, step: int) -> list[str]:
    """One scheduled `node` fault at `step` (world 2: on rank 1, node 1)."""
    from trainer.faults.schedule import schedule

    for seed in range(100_000):
        if schedule(seed, 1, 2, steps, 2, ["node"])[0].step == step:
            return ["--fault_count", "1", "--fault_seed", str(seed), "--fault_after_step", "2",
                    "--fault_types", "node"]
    raise SystemExit(f"no seed puts the node fault at step {step}")


def command(case: str, run_dir: Path, compute_dtype: str = "auto") -> list[str]:
    shape, how = case.split("-")
    local = ["--nnodes", "2", "--nproc_per_node", "1", "--node_return_s", "-1",
             "--heartbeat_timeout", "60"]
    local += ["--spare_nodes", "1"] if shape == "spare" else ["--min_nodes", "1"]
    trainer = [*TRAINER, "--compute_dtype", compute_dtype]
    if how == "kill":
        trainer += node_fault_flags(24, LOSS_STEP)
    return [sys.executable, "-m", "devtools.local", "--mode", "ft_launcher", "--run_dir",
            str(run_dir), *local, "--", *trainer]


def events(run_dir: Path) -> list[dict]:
    from trainer.accounting.events import events_dir, read_events

    return list(read_events(events_dir(run_dir)))


def run_case(case: str, out: Path, limit_s: float, compute_dtype: str = "auto") -> dict:
    run_dir = out / "runs" / case
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    run_dir.mkdir(parents=True)
    cmd = command(case, run_dir, compute_dtype)
    log = open(run_dir / "runner.log", "w")
    job = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                           start_new_session=True)
    frozen: list = []
    released = False
    lost_at: Optional[float] = None
    deadline = time.monotonic() + limit_s
    while job.poll() is None and time.monotonic() < deadline:
        if case.endswith("freeze") and not frozen:
            steps = [e["step"] for e in events(run_dir) if e["event"] == "step"]
            if steps and max(steps) >= LOSS_STEP - 1:
                frozen = node_processes(job.pid, 1)
                lost_at = time.time()
                for p in frozen:
                    p.send_signal(signal.SIGSTOP)
        if frozen and not released and any(e["event"] == "train_end" for e in events(run_dir)):
            for p in frozen:  # the training is over: the frozen node may go now
                p.kill()
            released = True
        time.sleep(0.05)
    if job.poll() is None:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    ev = events(run_dir)
    results = json.loads((run_dir / "results.json").read_text()) \
        if (run_dir / "results.json").exists() else None
    return {"case": case, "command": cmd, "exit_code": job.returncode,
            "breakdown": breakdown(ev, lost_at), "results": results}


def breakdown(ev: list[dict], frozen_at: Optional[float]) -> dict:
    """Seconds from the loss of the node to: the first survivor's notice (a rank's error, its
    launcher's record of failed workers or of a participant lost from the rendezvous, a rank's
    record of a silent neighbour node), the new round's first worker start, its training start
    (process group, model, restore), its first step."""
    fault = next((e["t"] for e in ev if e["event"] == "fault"), frozen_at)
    if fault is None:
        return {}
    seen = next((e["t"] for e in ev if e["t"] > fault and (
        e["event"] in ("workers_failed", "nodes_lost", "node_silent") or e["event"] == "error")),
        None)
    launch = next((e["t"] for e in ev if e["t"] > fault and e["event"] == "launch"), None)
    starts = [e for e in ev if e["t"] > fault and e["event"] == "train_start"]
    start = max((e["t"] for e in starts), default=None)
    first = next((e["t"] for e in ev if start and e["t"] > start and e["event"] == "step"), None)
    loads = {e["rank"]: e["tier"] for e in ev if e["t"] > fault
             and e["event"] in ("snapshot_load", "ckpt_load")}
    worlds = sorted({e["world_size"] for e in ev if e["t"] > fault and e["event"] == "launch"})

    def gap(a, b):
        return round(b - a, 2) if a is not None and b is not None else None

    return {"detection_s": gap(fault, seen), "rendezvous_takeover_s": gap(seen, launch),
            "restore_s": gap(launch, start), "first_step_s": gap(start, first),
            "total_s": gap(fault, first), "restored_from": loads, "world_after": worlds,
            "resumed_step": starts[0]["step"] if starts else None}


def machine() -> dict:
    import torch

    return {"cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__,
            "nvrx": __import__("importlib.metadata").metadata.version("nvidia-resiliency-ext")}


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.node_loss", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cpu-node-loss")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--limit_s", type=float, default=600.0, help="per case")
    p.add_argument("--compute_dtype", default="auto", choices=("auto", "bf16", "fp32"),
                   help="the trainer's --compute_dtype (fp32 where a torch build fails in bf16 "
                        "on this CPU)")
    a = p.parse_args(argv)
    cases = a.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        p.error(f"--cases {','.join(unknown)}: not one of {', '.join(CASES)}")
    a.out.mkdir(parents=True, exist_ok=True)
    for case in cases:
        row = {"machine": machine(), **run_case(case, a.out, a.limit_s, a.compute_dtype)}
        (a.out / f"{case}.json").write_text(json.dumps(scrub(row), indent=1) + "\n")
        print(case, row["exit_code"], json.dumps(row["breakdown"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
