"""Helpers for tests that run real multi-process jobs on CPU ranks (gloo); their fixtures are in
`tests/conftest.py`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from devtools.demo import FAST_RECOVERY  # noqa: F401 (re-exported: the CPU recovery timeouts)

ROOT = Path(__file__).resolve().parents[1]
STEPS = 16
INTERVAL = 4
# A small, fast job: tiny LLaMA, short sequences; tight but safe recovery timeouts for CPU ranks.
TINY = ["--model", "tiny", "--seq_len", "64", "--batch_size", "2", "--log_interval", "6",
        "--warmup_steps", "4"]
JOB_TIMEOUT = 240



def env_for(cache: Path) -> dict:
    env = dict(os.environ)
    env["NVRX_EKS_CACHE"] = str(cache)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def local_cmd(mode: str, run_dir: Path, *trainer_args: str, nproc: int = 2,
              local_args: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, "-m", "devtools.local", "--mode", mode, "--nproc_per_node", str(nproc),
            "--run_dir", str(run_dir), *local_args, "--", *TINY, *trainer_args]


def run_local(cache: Path, mode: str, run_dir: Path, *trainer_args: str, nproc: int = 2,
              local_args: tuple[str, ...] = (), timeout: float = JOB_TIMEOUT,
              extra_env: Optional[dict] = None) -> subprocess.CompletedProcess:
    cmd = local_cmd(mode, run_dir, *trainer_args, nproc=nproc, local_args=local_args)
    proc = subprocess.run(cmd, cwd=ROOT, env={**env_for(cache), **(extra_env or {})},
                          capture_output=True, text=True, timeout=timeout)
    (run_dir / "test-output.log").parent.mkdir(parents=True, exist_ok=True)
    (run_dir / "test-output.log").write_text(proc.stdout + proc.stderr)
    return proc


def start_local(cache: Path, mode: str, run_dir: Path, *trainer_args: str,
                local_args: tuple[str, ...] = (), nproc: int = 2) -> subprocess.Popen:
    run_dir.mkdir(parents=True, exist_ok=True)
    log = open(run_dir / "test-output.log", "w")
    return subprocess.Popen(local_cmd(mode, run_dir, *trainer_args, nproc=nproc,
                                      local_args=local_args),
                            cwd=ROOT, env=env_for(cache), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the whole job at once: runner, launchers, ranks and their writer processes."""
    import psutil

    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for p in tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait(timeout=30)
    psutil.wait_procs(tree, timeout=30)


def wait_for(predicate: Callable[[], bool], timeout: float = 120.0, what: str = "condition") -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def events(run_dir: Path) -> list[dict]:
    """The run's event log, every node's file merged in time order."""
    from trainer.accounting.events import events_dir, read_events

    return list(read_events(events_dir(run_dir)))


def results(run_dir: Path, signalled: bool = False) -> dict:
    """results.json; checks the suite's invariant that a fault-free run (no fault injected, no
    process stopped or killed by the test: `signalled`) has neither a failure nor a restart."""
    res = json.loads((run_dir / "results.json").read_text())
    cfg = res["config"]
    ev = events(run_dir)
    started = [e for e in ev if e["event"] == "launch" and e["rank"] == 0
               and e.get("launcher_restart", 0) == 0]
    point_faults = [e for e in ev if e["event"] == "fault"]
    if cfg["fault_count"] == 0 and not cfg["fault_probability"] and len(started) == 1 \
            and not point_faults and not signalled:
        assert res["restarts"] == 0, f"a fault-free run restarted {res['restarts']} times"
        assert res["faults"] == [], f"a fault-free run failed: {res['faults']}"
    return res


def ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"



def faults(*kinds: str, steps: int = STEPS, after: int = 2, world: int = 2) -> list[str]:
    """Flags for a seeded schedule whose faults come in exactly this order of types, at least
    two steps apart (the published algorithm; the seed is searched, not the algorithm bent)."""
    from trainer.faults.schedule import schedule

    types = sorted(set(kinds))
    for seed in range(100_000):
        s = schedule(seed, len(kinds), after, steps, world, types)
        gaps = [b.step - a.step for a, b in zip(s, s[1:])]
        if [f.type for f in s] == list(kinds) and all(g >= 2 for g in gaps):
            return ["--fault_count", str(len(kinds)), "--fault_seed", str(seed),
                    "--fault_after_step", str(after), "--fault_types", ",".join(types)]
    raise AssertionError(f"no seed gives faults {kinds}")


def samples_by_step(run_dir: Path) -> dict[int, dict[int, list[int]]]:
    """step -> rank -> sample indices, keeping each step's last occurrence (the surviving one)."""
    out: dict[int, dict[int, list[int]]] = {}
    for e in events(run_dir):
        if e["event"] == "samples":
            out.setdefault(e["step"], {})[e["rank"]] = e["indices"]
    return out


def faults_fired(run_dir: Path) -> list[dict]:
    return [e for e in events(run_dir) if e["event"] == "fault"]


def first(es: list[dict], name: str, after: float = 0.0, rank: Optional[int] = None) -> Optional[dict]:
    return next((e for e in es if e["event"] == name and e["t"] >= after
                 and (rank is None or e["rank"] == rank)), None)
