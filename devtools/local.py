"""`python -m devtools.local`: a multi-rank job on this machine, in any recovery mode.

Starts one launcher per (simulated) node exactly as the training pods do, and plays the
Kubernetes Job where the mode relies on it: when a launcher fails, every launcher is stopped and
the whole job restarts after a backoff, up to --job_restarts times (the Job's backoffLimit).

With more than one node in an ft_launcher mode, the run's stores are served by a store process
of their own (`trainer.recovery.store_server`, `--external_store`), as on the cluster: no node
is special. A launcher killed outright is a lost node (a `node` fault): the others carry on,
a spare (--spare_nodes) takes its place or the world shrinks to --min_nodes, and the lost
node comes back after --node_return_s (the Job recreating its pod), as a spare or to grow the
world back.

    python -m devtools.local --mode inprocess --nproc_per_node 2 -- --max_steps 200 ...
    python -m devtools.local --mode ft_launcher --nnodes 2 --spare_nodes 1 -- ...
    (trainer flags may also follow without the `--`)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Optional, Sequence

from config.contract import FIGURES_FILE_ENV, FINAL_ERROR_ENV, PORTS_PER_JOB, RecoveryMode
from trainer.accounting.events import events_dir, job_log
from trainer.config import MODE_NAMES
from trainer.durable.lease import RUN_ID_ENV
from trainer.lifetime import child_dies_with_me
from trainer.recovery.store_server import listening
from trainer.termination import SIGTERM_EXIT_CODE
from trainer.recovery.launch import (LaunchSpec, build_command, check, default_heartbeat_timeout,
                                     launch_env, run_end, spec_rendezvous, stop_on_sigterm,
                                     topology_problem)

# Whole-job restarts by default where the Job is the only layer that recovers (baseline).
JOB_RESTARTS = 10
EVERY_STEP_TIERS = ("--tiers", "memory,node", "--snapshot_interval", "1")


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out on its own (to listeners on port 0 and to every
    outgoing connection's source)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port_block(count: int = PORTS_PER_JOB) -> int:
    """A port P with P..P+count-1 free (the launcher's ports, `config.contract`), drawn below
    the kernel's ephemeral range: a port in it may be taken, between this check and the
    launcher's bind, as the source port of any connection on the machine (other jobs' gloo
    and store clients), which fails the launcher's listen."""
    rng = random.Random()
    high = _ephemeral_low() - count
    for _ in range(200):
        base = rng.randrange(10_000, high) if high > 10_000 else rng.randrange(1024, 65535 - count)
        ok = True
        for p in range(base, base + count):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free block of ports on 127.0.0.1")


def _flag(args: Sequence[str], name: str) -> Optional[str]:
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(prog="python -m devtools.local", description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=MODE_NAMES, default=RecoveryMode.BASELINE.value)
    p.add_argument("--nproc_per_node", type=int, default=2)
    p.add_argument("--nnodes", type=int, default=1, help="simulated nodes, each its own launcher")
    p.add_argument("--spare_nodes", type=int, default=0,
                   help="simulated nodes more, waiting in the rendezvous to replace a lost one")
    p.add_argument("--min_nodes", type=int, default=None,
                   help="with no spare left, train on as few as this many nodes (default: "
                        "--nnodes)")
    p.add_argument("--external_store", choices=("auto", "on", "off"), default="auto",
                   help="serve the run's stores from a process of their own (auto: with more "
                        "than one node in an ft_launcher mode)")
    p.add_argument("--node_return_s", type=float, default=0.0,
                   help="a lost node's launcher starts again this many seconds later, as the "
                        "Job recreates a lost pod (negative: never)")
    p.add_argument("--node_return_steps", type=int, default=None,
                   help="instead: a lost node's launcher starts again once the others trained "
                        "this many steps since its loss (a return at a known point of training, "
                        "whatever the machine's speed)")
    p.add_argument("--node_timeout", type=float, default=LaunchSpec.node_timeout,
                   help="seconds without a sign of life after which a node is lost (its "
                        "rendezvous keep-alive; from NVRx 0.6 its beat in the store)")
    p.add_argument("--rdzv_last_call_timeout", type=float, default=3.0,
                   help="with --min_nodes below --nnodes: once enough nodes joined, seconds to "
                        "wait for more before a round starts with fewer")
    p.add_argument("--run_dir", help="default: runs/<mode>-<time>")
    p.add_argument("--job_restarts", type=int, default=None,
                   help=f"whole-job restarts after a failure (default {JOB_RESTARTS} where "
                        "nothing inside the job recovers, as in baseline; else 0)")
    p.add_argument("--backoff_seconds", type=float, default=1.0,
                   help="first restart delay; doubles each time like a Job's, capped at 30 s")
    p.add_argument("--max_restarts", type=int, default=10, help="ft_launcher worker restarts")
    p.add_argument("--heartbeat_timeout", type=float, default=None,
                   help="ft_launcher rank heartbeat timeout (default: 30 s, and with "
                        "in-process restart 30 s beyond the trainer's --hard_timeout)")
    p.add_argument("--initial_heartbeat_timeout", type=float, default=120.0)
    p.add_argument("--monitor_interval", type=float, default=LaunchSpec.monitor_interval)
    p.add_argument("--timeout", type=float, default=0, help="give up after this many seconds (0: never)")
    p.add_argument("--metrics_port", type=int, default=0,
                   help="serve node N's Prometheus /metrics on 127.0.0.1, port this + N (0: off)")
    args, rest = p.parse_known_args(argv)
    if rest and rest[0] == "--":
        rest = rest[1:]
    for name in ("nproc_per_node", "nnodes"):
        if getattr(args, name) < 1:
            p.error(f"--{name} {getattr(args, name)} must be at least 1")
    if args.external_store == "auto":
        args.external_store = "on" if RecoveryMode(args.mode).uses_ft_launcher and \
            args.nnodes + max(args.spare_nodes, 0) > 1 else "off"
    args.external_store = args.external_store == "on"
    problem = topology_problem(args.mode, args.nnodes, args.min_nodes, args.spare_nodes,
                               args.external_store)
    if problem:
        p.error(problem)
    if args.node_return_steps is not None and args.node_return_steps < 1:
        p.error(f"--node_return_steps {args.node_return_steps} must be at least 1")
    if args.node_timeout < 1:
        p.error(f"--node_timeout {args.node_timeout:g} must be at least 1 (seconds)")
    args.total_nodes = args.nnodes + args.spare_nodes
    if args.metrics_port and not 0 < args.metrics_port + args.total_nodes <= 65536:
        p.error(f"--metrics_port {args.metrics_port} leaves no port for each of "
                f"{args.total_nodes} node(s): use 1 to 65535 (0: off)")
    if args.job_restarts is None:
        args.job_restarts = 0 if RecoveryMode(args.mode).recovers_within_job else JOB_RESTARTS
    return args, rest


def mode_flags(mode: str, hard_timeout: float, *, backoff_seconds: float, heartbeat_floor: float,
               heartbeat_margin: float, initial_heartbeat: Optional[float] = None) -> list[str]:
    """This runner's flags for a scripted run in `mode` (the demo, the benchmarks): the whole-job
    restart backoff where the Job restarts on every fault, and ft_launcher's heartbeat timeout
    where ranks heartbeat (`default_heartbeat_timeout`: the floor, or with in-process restart the
    margin beyond the trainer's `hard_timeout`), and its initial one if given."""
    m = RecoveryMode(mode)
    out = [] if m.recovers_within_job else ["--backoff_seconds", f"{backoff_seconds:g}"]
    if m.heartbeats:
        timeout = default_heartbeat_timeout(m, hard_timeout, heartbeat_floor, heartbeat_margin)
        out += ["--heartbeat_timeout", f"{timeout:g}"]
        if initial_heartbeat is not None:
            out += ["--initial_heartbeat_timeout", f"{initial_heartbeat:g}"]
    return out


def tier_flags(mode: str) -> list[str]:
    """The tiers of a scripted run in `mode` (the demo, the benchmarks): a snapshot of every step
    in host memory and on the node; a mode that only the Job recovers is the published baseline,
    with durable checkpoints alone."""
    return list(EVERY_STEP_TIERS) if RecoveryMode(mode).recovers_within_job else []


def _trainer_args(args: argparse.Namespace, rest: list[str], run_dir: Path) -> list[str]:
    out = list(rest)
    if _flag(out, "--checkpoint_dir") is None:
        out += ["--checkpoint_dir", str(run_dir / "checkpoints")]
    if _flag(out, "--results_path") is None:
        out += ["--results_path", str(run_dir / "results.json")]
    return out


def _launcher_env(spec: LaunchSpec, final: Path, cfg, figures: Optional[Path] = None) -> dict:
    """The launcher's environment: the pods' (`launch_env`), where to record a final error and
    where the node's workers publish their figures."""
    env = {**launch_env(spec, cfg), FINAL_ERROR_ENV: str(final)}
    if figures is not None:
        env[FIGURES_FILE_ENV] = str(figures)
    return env


def serve_metrics(args, run_dir: Path) -> list[Optional[Path]]:
    """Each node's /metrics, served by this process as a pod's launcher serves it: it outlives
    every restart, the whole job's too. Returns each node's figures file (None: no metrics)."""
    if not args.metrics_port:
        return [None] * args.total_nodes
    from trainer.telemetry.exporter import serve

    files = []
    for node in range(args.total_nodes):
        files.append(run_dir / f".figures.node{node}.json")
        serve(args.metrics_port + node, files[-1], addr="127.0.0.1")
    return files


def node_spec(args, node: int, port: int, attempt: int) -> LaunchSpec:
    """Simulated node `node`'s launcher, as the pod of that index runs it."""
    return LaunchSpec(args.mode, args.nnodes, args.nproc_per_node, node, "127.0.0.1", port,
                      args.max_restarts, args.heartbeat_timeout, args.initial_heartbeat_timeout,
                      args.monitor_interval, rdzv_id=f"local-{port}-{attempt}",
                      min_nodes=args.min_nodes, spare_nodes=args.spare_nodes,
                      external_store=args.external_store, node_timeout=args.node_timeout,
                      rdzv_last_call_timeout=args.rdzv_last_call_timeout)


def node_processes(root_pid: int, node: int) -> list:
    """Every live process of simulated node `node` under the runner `root_pid` (its launcher,
    fork server, rank monitors and ranks), found by the node rank each launcher's environment
    carries: what a test or a benchmark stops or kills to lose that node."""
    import psutil

    from config.contract import NODE_RANK_ENV

    found = []
    for p in psutil.Process(root_pid).children(recursive=True):
        try:
            if p.environ().get(NODE_RANK_ENV) == str(node):
                found.append(p)
        except psutil.Error:  # gone meanwhile
            pass
    return found


def _start_node(args, cfg, trainer_args: list[str], run_dir: Path, port: int, attempt: int,
                final: Path, figure: Optional[Path], node: int) -> subprocess.Popen:
    """One simulated node: its launcher, leading a process group of its own (what a `node`
    fault kills), with a node directory of its own where there are several."""
    node_args = list(trainer_args)
    if args.total_nodes > 1 and _flag(node_args, "--node_dir") is None:
        node_args += ["--node_dir", str(run_dir / "nodes" / f"node{node}")]
    spec = node_spec(args, node, port, attempt)
    log = open(run_dir / f"node{node}.log", "ab")
    env = _launcher_env(spec, final, cfg, figure)
    return subprocess.Popen(build_command(spec, node_args), env=env,
                            stdout=None if node == 0 else log, stderr=subprocess.STDOUT
                            if node else None, start_new_session=True,
                            preexec_fn=child_dies_with_me())


def _start(args, cfg, trainer_args: list[str], run_dir: Path, port: int, attempt: int,
           final: Path, figures: list[Optional[Path]], nodes: range) -> list[subprocess.Popen]:
    return [_start_node(args, cfg, trainer_args, run_dir, port, attempt, final, figures[node],
                        node) for node in nodes]


def _log_sizes(log_dir: Path, nodes: range) -> list[int]:
    """The size of each node's event log: a node whose log grew has started its workers."""
    from trainer.accounting.events import node_log_name

    sizes = []
    for node in nodes:
        try:
            sizes.append((log_dir / node_log_name(node)).stat().st_size)
        except OSError:
            sizes.append(0)
    return sizes


def start_store(spec: LaunchSpec, run_dir: Path, timeout_s: float = 60.0) -> subprocess.Popen:
    """The run's store process on the port of `spec` (any node's launch) and the ports after
    it, with the launchers' rendezvous, as the store pod serves them; returns once it accepts
    connections."""
    port = spec.master_port
    log = open(run_dir / "store.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "trainer.recovery.store_server",
                             "--master_port", str(port), "--host", "127.0.0.1",
                             *spec_rendezvous(spec)],
                            # NVRx 0.6+ closes a round with two launchers of one host only in
                            # a simulation that says so: here every node is this host
                            env={**os.environ, "NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE": "1"},
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=child_dies_with_me())
    if listening("127.0.0.1", port, timeout_s, proc):
        return proc
    if proc.poll() is not None:
        raise RuntimeError(f"the store process exited with {proc.returncode}: see "
                           f"{run_dir / 'store.log'}")
    proc.kill()
    raise RuntimeError(f"the store process did not listen on port {port} within {timeout_s:g} s")


def lost(args, proc: subprocess.Popen) -> bool:
    """A launcher killed outright (a lost node) that the others survive: with the run's store
    process, in a mode whose launchers meet again in a new rendezvous round."""
    return args.external_store and proc.returncode is not None and proc.returncode < 0


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.time() + 10
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


class Returns:
    """When each lost node's launcher starts again, as the Job recreates its pod: after
    --node_return_s seconds (negative: never), or once the others trained --node_return_steps
    steps since the loss (rank 0's step events, followed as the log grows)."""

    def __init__(self, args, log_dir: Path):
        self.seconds, self.steps, self.log_dir = args.node_return_s, args.node_return_steps, log_dir
        self._lost: dict[int, tuple[float, float]] = {}  # node -> (monotonic, wall) at its loss
        self._trained: dict[int, int] = {}  # node -> steps trained since its loss
        self._follower = None

    def __contains__(self, node: int) -> bool:
        return node in self._lost

    def lose(self, node: int) -> None:
        self._lost[node] = (time.monotonic(), time.time())
        self._trained[node] = 0

    def by_time(self) -> bool:
        """Whether some lost node comes back whatever the others do: without one, a run whose
        every node is lost is over."""
        return bool(self._lost) and self.steps is None and self.seconds >= 0

    def due(self) -> list[int]:
        """The lost nodes whose launchers start now (and are no longer lost)."""
        if self.steps is not None:
            self._count_steps()
            due = [n for n, k in self._trained.items() if k >= self.steps]
        elif self.seconds >= 0:
            due = [n for n, (t, _) in self._lost.items() if time.monotonic() >= t + self.seconds]
        else:
            due = []
        for node in due:
            del self._lost[node], self._trained[node]
        return due

    def _count_steps(self) -> None:
        from trainer.accounting.events import Follower

        if not self._lost:
            return
        if self._follower is None:
            self._follower = Follower(self.log_dir, window=0.0)
        for e in self._follower.poll():
            if e["event"] == "step":
                for node, (_, wall) in self._lost.items():
                    self._trained[node] += e["t"] > wall


def _came_late(cfg, node: int) -> bool:
    """Node `node`'s launcher failed because it came after the run had ended (it found the
    rendezvous closed): its exit counts as 0, as the pods' launcher makes it (`run_end`)."""
    end = run_end(cfg)
    if end is not None:
        print(f"devtools.local: node {node} came after the run ended ({end})", flush=True)
    return end is not None


def supervise(args, cfg, trainer_args: list[str], run_dir: Path,
              figures: Sequence[Optional[Path]] = ()) -> int:
    """Run the job; restart all of it after a failure, as a Kubernetes Job would."""
    output_dir = Path(_flag(trainer_args, "--results_path")).resolve().parent
    events, log_dir = job_log(output_dir), events_dir(output_dir)
    os.environ.setdefault(RUN_ID_ENV, f"local-{uuid.uuid4().hex[:12]}")  # one run, all restarts
    started = time.time()
    backoff = args.backoff_seconds
    for attempt in range(args.job_restarts + 1):
        port = free_port_block()
        final = run_dir / f".final-error.{attempt}"
        final.unlink(missing_ok=True)
        store = start_store(node_spec(args, 0, port, attempt), run_dir) \
            if args.external_store else None
        procs: list[subprocess.Popen] = []
        try:  # the store process outlives every launcher of the attempt
            figs = list(figures) or [None] * args.total_nodes
            # The training nodes first; the spares once every training node has started its
            # workers, so that node ranks 0 to --nnodes - 1 train and the others wait (on the
            # cluster, which pods wait is whichever came last).
            training = range(args.nnodes)
            sizes = _log_sizes(log_dir, training)
            procs = _start(args, cfg, trainer_args, run_dir, port, attempt, final, figs, training)
            returns = Returns(args, log_dir)
            ended = set()  # nodes whose launcher started after the run's end (`_came_late`)
            failed = None
            try:
                while True:
                    if _TERMINATING:
                        return stop_on_sigterm("devtools.local", procs,
                                               lambda: any(p.poll() is None for p in procs),
                                               cfg.termination_grace)
                    if final.exists():
                        break
                    if len(procs) < args.total_nodes and all(
                            a > b for a, b in zip(_log_sizes(log_dir, training), sizes)):
                        procs += _start(args, cfg, trainer_args, run_dir, port, attempt, final,
                                        figs, range(args.nnodes, args.total_nodes))
                    codes = [0 if n in ended else p.poll() for n, p in enumerate(procs)]
                    for node, p in enumerate(procs):
                        if lost(args, p) and node not in returns:
                            events.emit("node_lost", node=node, attempt=attempt,
                                        exit_code=p.returncode)
                            print(f"devtools.local: node {node} lost (its launcher exited with "
                                  f"{p.returncode}); the others carry on", flush=True)
                            returns.lose(node)
                    failed = next((p for p, c in zip(procs, codes) if c not in (None, 0)
                                   and not lost(args, p)), None)
                    if failed is not None and _came_late(cfg, index := procs.index(failed)):
                        ended.add(index)
                        continue
                    live = [c for p, c in zip(procs, codes) if not lost(args, p)]
                    if failed is not None or (live and all(c == 0 for c in live)):
                        break
                    if not live and not returns.by_time():
                        failed = procs[0]  # every node lost, none to come back
                        break
                    for node in returns.due():
                        procs[node] = _start_node(args, cfg, trainer_args, run_dir, port,
                                                  attempt, final, figs[node], node)
                        events.emit("node_returned", node=node, attempt=attempt)
                        print(f"devtools.local: node {node} is back", flush=True)
                    if args.timeout and time.time() - started > args.timeout:
                        _stop(procs)
                        print(f"devtools.local: error: job did not finish within "
                              f"{args.timeout:g} s: {_progress(log_dir, cfg.max_steps)}",
                              file=sys.stderr)
                        return 1
                    time.sleep(0.1)
            except KeyboardInterrupt:
                _stop(procs)
                print("devtools.local: interrupted; the launchers were stopped", file=sys.stderr)
                return 130
            if final.exists():  # a rank met an error no restart can fix (trainer.recovery.launch)
                _stop(procs)
                print(f"devtools.local: error: mode {args.mode} stopped: "
                      f"{final.read_text().strip()}", file=sys.stderr)
                return 2
            if failed is None:
                return 0
            events.emit("worker_failed", attempt=attempt, exit_code=failed.returncode)
            _stop(procs)
            if failed.returncode == 2:  # a setting no restart can fix
                print(f"devtools.local: error: mode {args.mode} stopped: {_cause(log_dir)}",
                      file=sys.stderr)
                return 2
            if attempt == args.job_restarts:
                break
            print(f"devtools.local: a launcher exited with {failed.returncode}; restarting the "
                  f"whole job in {backoff:g} s (restart {attempt + 1} of {args.job_restarts})",
                  flush=True)
            deadline = time.monotonic() + backoff
            while time.monotonic() < deadline and not _TERMINATING:
                time.sleep(0.05)
            if _TERMINATING:
                print("devtools.local: stopped by SIGTERM between two restarts", file=sys.stderr)
                return SIGTERM_EXIT_CODE
        finally:
            _stop(procs)
            if store is not None:
                _stop([store])
        backoff = min(30.0, backoff * 2)
    print(f"devtools.local: error: mode {args.mode} could not recover (a launcher exited with "
          f"{failed.returncode}; {args.job_restarts} whole-job restarts allowed): "
          f"{_cause(log_dir)}", file=sys.stderr)
    return 1


def progress(log_dir: Path) -> tuple[int, Optional[float]]:
    """The step a job has reached and its step time (goodput's: the median of steps that are
    neither an attempt's first nor a checkpoint's; None before any step), from its event log."""
    from trainer.accounting.events import read_events
    from trainer.accounting.goodput import summarize

    events = list(read_events(log_dir))
    if not any(e["event"] == "step" for e in events):
        return 0, None
    summary = summarize(events, max_steps=0, checkpoint_interval=0)
    return summary["steps_completed"], summary["step_time_seconds"]


def _progress(log_dir: Path, max_steps: int) -> str:
    """How far a job got and how fast: what a job out of time reports."""
    step, step_s = progress(log_dir)
    if step_s is None:
        return f"it had completed no step of {max_steps}"
    return f"it reached step {step} of {max_steps} at {step_s:.2f} s a step"


def _cause(log_dir: Path) -> str:
    """The error that ended the job, from the event log: the fatal ones first, else the
    watchdog's kills (what a killed rank raises as it dies comes from the kill), else the last."""
    from trainer.accounting.events import read_events

    errors = [e for e in read_events(log_dir) if e["event"] == "error"]
    chosen = ([e for e in errors if e.get("fatal")] or
              [e for e in errors if e["type"] == "WatchdogTimeout"] or errors[-1:])
    seen: list[str] = []
    for e in chosen:
        line = f"rank {e['rank']}: {e['type']}: {e['message']}"
        if e["message"].startswith(e["type"]):
            line = f"rank {e['rank']}: {e['message']}"
        if line not in seen:
            seen.append(line)
    return "; ".join(seen) or "no error was recorded; see the log above"


_TERMINATING: list[int] = []  # SIGTERM received: `supervise` stops the job as a pod would


def _terminate_on_sigterm() -> None:
    """A SIGTERM stops the job the way a pod's does (`trainer.recovery.launch.stop_on_sigterm`):
    the ranks commit their newest state and end within --termination_grace, then this exits
    143. Ctrl-C (KeyboardInterrupt) stops the launchers at once."""
    signal.signal(signal.SIGTERM, lambda signum, frame: _TERMINATING.append(signum))


def main(argv: Optional[Sequence[str]] = None) -> int:
    args, rest = parse(sys.argv[1:] if argv is None else argv)
    _terminate_on_sigterm()
    from trainer.preflight import parse_and_check

    run_dir = Path(args.run_dir or f"runs/{args.mode.replace('+', '-')}-{time.strftime('%Y%m%d-%H%M%S')}")
    trainer_args = _trainer_args(args, rest, run_dir)
    cfg = parse_and_check([*trainer_args, "--mode", args.mode], prog="python -m devtools.local",
                          sample_data=True)
    if args.heartbeat_timeout is None:
        args.heartbeat_timeout = default_heartbeat_timeout(args.mode, cfg.hard_timeout)
    check(node_spec(args, 0, 0, 0), cfg, "python -m devtools.local")
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        figures = serve_metrics(args, run_dir)
    except OSError as exc:
        print(f"devtools.local: error: --metrics_port {args.metrics_port}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    rc = supervise(args, cfg, trainer_args, run_dir, figures)
    results = Path(_flag(trainer_args, "--results_path"))
    if rc == 0 and results.is_file():
        r = json.loads(results.read_text())
        print(f"{args.mode}: training goodput {r['training_goodput_pct']:.1f}%, infra goodput "
              f"{r['infra_goodput_pct']:.1f}%, {len(r['faults'])} faults, results in {results}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
