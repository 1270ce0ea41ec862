"""Helpers for tests that run real multi-process jobs on CPU ranks (gloo); their fixtures are in
`tests/conftest.py`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

from devtools.pace import Pace, measure
from trainer.phases import SLOW_PHASE_ENV

ROOT = Path(__file__).resolve().parents[1]
STEPS = 16
INTERVAL = 4
# The CPU ranks' compute dtype: `auto` (the trainer's choice for this CPU), unless
# NVRX_EKS_TEST_COMPUTE_DTYPE names one (fp32 where a torch build crashes in bf16 on this CPU).
COMPUTE_DTYPE = ["--compute_dtype", os.environ.get("NVRX_EKS_TEST_COMPUTE_DTYPE", "auto")]
# The model of the tests' jobs: the smallest preset. Its ranks spend their seconds on what the
# jobs are there to prove (start-up, checkpoints, restarts), not on their steps.
MODEL = "micro"
# A small, fast job: short sequences; without TensorBoard's event files, which only its own
# test reads (0.1-0.2 s of every rank 0).
JOB_FLAGS = ["--model", MODEL, "--seq_len", "64", "--batch_size", "2", "--log_interval", "6",
             "--warmup_steps", "4", "--tensorboard", "false", *COMPUTE_DTYPE]
# Seconds every step of a test job waits beyond its compute (`trainer.phases`), as a GPU step
# leaves its host waiting: a test's signals and faults land mid-run as they did when the jobs
# trained the 25 times larger tiny model, at a quarter less CPU a job.
STEP_DELAY_S = 0.1
# Bounds on a fast machine, in seconds; on a slower one they stretch with its pace (`stretched`).
JOB_TIMEOUT_S = 240.0
WAIT_S = 120.0

_pace: Optional[Pace] = None


def pace(cache: Path) -> Pace:
    """This machine's pace (`devtools.pace`), measured once per pytest run by a short job
    (with the corpus in `cache`) before the first job of a test: the recovery timeouts of the
    tests' jobs and every bound on them follow it, so no test depends on the machine's speed."""
    global _pace
    if _pace is None:
        _pace = measure(Path(tempfile.mkdtemp(prefix="pace-", dir=cache.parent)), COMPUTE_DTYPE,
                        env={**env_for(cache), SLOW_PHASE_ENV: ""})  # the steps' compute alone
    return _pace


def recovery_flags(cache: Path) -> list[str]:
    """The trainer's CPU recovery timeouts at this machine's pace."""
    return pace(cache).recovery_flags()


def runner_flags(cache: Path, mode: str) -> tuple[str, ...]:
    """The local runner's flags for `mode` at this machine's pace."""
    return tuple(pace(cache).runner_flags(mode))


def stretched(seconds: float) -> float:
    """A bound of `seconds` on a fast machine, on this one: every job measures the pace first."""
    return _pace.seconds(seconds) if _pace is not None else seconds


def env_for(cache: Path, extra_env: Optional[dict] = None) -> dict:
    """A test job's environment: `extra_env` over this process's, every step `STEP_DELAY_S`
    longer unless `extra_env` slows steps itself (its `SLOW_PHASE_ENV` comes first)."""
    env = dict(os.environ)
    env["NVRX_EKS_CACHE"] = str(cache)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    extra = dict(extra_env or {})
    env[SLOW_PHASE_ENV] = ",".join(filter(None, [extra.pop(SLOW_PHASE_ENV, ""),
                                                 f"step={STEP_DELAY_S:g}"]))
    return {**env, **extra}


def local_cmd(mode: str, run_dir: Path, *trainer_args: str, nproc: int = 2,
              local_args: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, "-m", "devtools.local", "--mode", mode, "--nproc_per_node", str(nproc),
            "--run_dir", str(run_dir), *local_args, "--", *JOB_FLAGS, *trainer_args]


def run_local(cache: Path, mode: str, run_dir: Path, *trainer_args: str, nproc: int = 2,
              local_args: tuple[str, ...] = (), extra_env: Optional[dict] = None
              ) -> subprocess.CompletedProcess:
    cmd = local_cmd(mode, run_dir, *trainer_args, nproc=nproc, local_args=local_args)
    limit = pace(cache).seconds(JOB_TIMEOUT_S)
    proc = subprocess.run(cmd, cwd=ROOT, env=env_for(cache, extra_env),
                          capture_output=True, text=True, timeout=limit)
    (run_dir / "test-output.log").parent.mkdir(parents=True, exist_ok=True)
    (run_dir / "test-output.log").write_text(proc.stdout + proc.stderr)
    return proc


def start_local(cache: Path, mode: str, run_dir: Path, *trainer_args: str,
                local_args: tuple[str, ...] = (), nproc: int = 2,
                extra_env: Optional[dict] = None) -> subprocess.Popen:
    pace(cache)
    run_dir.mkdir(parents=True, exist_ok=True)
    log = open(run_dir / "test-output.log", "w")
    return subprocess.Popen(local_cmd(mode, run_dir, *trainer_args, nproc=nproc,
                                      local_args=local_args),
                            cwd=ROOT, env=env_for(cache, extra_env), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def launcher_flags(mode: str) -> tuple[str, ...]:
    """The local runner's flags for `mode` that the pods' launcher takes too (the heartbeat
    timeout), at this machine's pace (measured by the first job of the run)."""
    if _pace is None:
        raise RuntimeError("launcher_flags needs the pace: call pace(cache) first")
    flags = _pace.runner_flags(mode)
    if "--heartbeat_timeout" not in flags:
        return ()
    i = flags.index("--heartbeat_timeout")
    return tuple(flags[i:i + 2])


def launcher_cmd(mode: str, run_dir: Path, port: int, *trainer_args: str, nproc: int = 2
                 ) -> list[str]:
    """The node's launcher as a pod runs it (`trainer.recovery.launch`), one node, with the
    local runner's flags that it takes too; no /metrics server, whose fixed port would collide
    with another test's launcher."""
    return [sys.executable, "-m", "trainer.recovery.launch", "--mode", mode, "--nnodes", "1",
            "--nproc_per_node", str(nproc), "--node_rank", "0", "--master_addr", "127.0.0.1",
            "--master_port", str(port), "--metrics_port", "0", *launcher_flags(mode), "--",
            *JOB_FLAGS, "--checkpoint_dir", str(run_dir / "checkpoints"),
            "--results_path", str(run_dir / "results.json"), *trainer_args]


def start(cmd: list[str], cache: Path, run_dir: Path, extra_env: Optional[dict] = None
          ) -> subprocess.Popen:
    """`cmd` in a session of its own (its process group is its pid), output to the run's log."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log = open(run_dir / "test-output.log", "a")
    return subprocess.Popen(cmd, cwd=ROOT, env=env_for(cache, extra_env),
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def marked(name: str, value: str) -> list:
    """The live processes (not zombies) whose environment has `name=value`: every process of a
    job started with it, whatever started them and whoever adopted them."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(name) == value and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:  # gone meanwhile, or not ours to read
            pass
    return found


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


def wait_for(predicate: Callable[[], bool], timeout: float = WAIT_S, what: str = "condition") -> None:
    deadline = time.time() + stretched(timeout)
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


def runner_error(output: str) -> str:
    """The local runner's error line. A rank that its launcher killed leaves its named
    semaphores to multiprocessing's resource tracker, whose warning may come after it."""
    return next((line for line in reversed(output.strip().splitlines())
                 if line.startswith("devtools.local: error")), "")


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


@contextlib.contextmanager
def small_fs(path: Path, size: str, read_only: bool = False) -> Iterator[Path]:
    """A real tmpfs of `size` at `path` (a full or a read-only disk); skips the test where
    mounting is not permitted."""
    import pytest

    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size}" + (",ro" if read_only else "")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)],
                      capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs is not permitted here")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


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
