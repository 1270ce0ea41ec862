"""The command each node runs: torchrun or ft_launcher, spelled for the installed NVRx.

Used inside the training pods (`python -m trainer.recovery.launch ... -- <trainer flags>`) and by the
local runner, so the cluster and a laptop start workers the same way.

Ports from --master_port P follow `config.contract` (P the launcher's rendezvous store, P+1 the
in-process wrapper's store, P+2 the in-process application store); so does the environment of
the workers (`contract.process_env`), which a pod's manifest sets and this launcher completes.
This process also serves the node's Prometheus `/metrics` (--metrics_port,
`trainer.telemetry.exporter`): it outlives every restart of the workers.

Rendezvous: without `--external_store` (below) node rank 0 hosts the store (`is_host`), never
decided from a DNS answer that may be stale after a pod replacement. `--rdzv_join_timeout` must
outlast a node replacement; the node rank is the pod's completion index (`--node-rank`, and
GROUP_RANK for NVRx versions that take the infrastructure's rank), so ranks keep their order at
any node count.

No special node (`--external_store`): the run's stores live in a process of their own
(`trainer.recovery.store_server`, on --master_addr); no launcher hosts one and no rank does
(`trainer.recovery.stores`), so the loss of any training node is survived like any other.

Spares and shrinking (ft_launcher modes): the run has --nnodes N training nodes and
--spare_nodes K more, node ranks 0 to N+K-1; the K wait in ft_launcher's rendezvous with their
fork server's imports done, and the first to see a participant gone takes its place in the next
round (survivors keep their ranks, so the lost node's ranks come back from the peer tier).
Without a spare left the world shrinks to as few as --min_nodes, and grows again when a node
joins. A lost node is found through the rendezvous keep-alive within --node_timeout
(`nvrx_compat.use_lost_participant_restart`). Spelled per NVRx version by `nvrx_compat`.

Lifetimes (`trainer.lifetime`): the elastic agent this process starts dies with it, and
every process under the agent dies with the agent, whatever killed it: nothing of a run outlives
its launcher and trains on into the checkpoint directory.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from config.contract import (DEFAULT_MASTER_PORT, EVENTS_DIR_ENV, FIGURES_FILE_ENV,
                             FINAL_ERROR_ENV, INPROCESS_PORT_ENV, LAUNCHER_ID_ENV, METRICS_PORT,
                             NODE_RANK_ENV, TERMINATION_GRACE_FLOOR_S, RecoveryMode, process_env,
                             rendezvous_argv, wrapper_store_port)
from trainer.config import MODE_NAMES
from trainer.durable.lease import RUN_ID_ENV
from trainer.faults.node_loss import NODE_LEADER_ENV
from trainer.lifetime import ProcessId, child_dies_with_me
from trainer.recovery.nodewatch import NODE_TIMEOUT_ENV
from trainer.recovery.stores import EXTERNAL_STORE_ENV
from trainer.termination import SIGTERM_EXIT_CODE, STOP_SIGNAL


@dataclass(frozen=True)
class LaunchSpec:
    mode: str
    nnodes: int
    nproc_per_node: int
    node_rank: int
    master_addr: str
    master_port: int = DEFAULT_MASTER_PORT
    max_restarts: int = 20
    heartbeat_timeout: float = 300.0
    initial_heartbeat_timeout: float = 1200.0
    monitor_interval: float = 0.3
    rdzv_id: str = "nvrx-eks"
    rdzv_join_timeout: float = 600.0
    metrics_port: int = METRICS_PORT  # 0: no /metrics
    min_nodes: Optional[int] = None  # None: nnodes (the world never shrinks)
    spare_nodes: int = 0
    external_store: bool = False  # the stores live in `store_server`; no launcher hosts one
    node_timeout: float = 6.0  # a node without a rendezvous keep-alive this long is lost
    rdzv_last_call_timeout: float = 30.0  # with min_nodes joined, how long to wait for more

    @property
    def world_min_nodes(self) -> int:
        return self.nnodes if self.min_nodes is None else self.min_nodes

    @property
    def elastic(self) -> bool:
        """Spares wait, or the world may shrink."""
        return self.spare_nodes > 0 or self.world_min_nodes < self.nnodes


def rdzv_conf(spec: LaunchSpec) -> str:
    """Rendezvous settings: who hosts the store (node 0, or nobody with the run's store
    process); how long a node waits for the others; how soon a silent node is lost."""
    if RecoveryMode(spec.mode).uses_ft_launcher:
        from trainer.nvrx_compat import rendezvous_keep_alive

        is_host = "true" if spec.node_rank == 0 and not spec.external_store else "false"
        # whole seconds: the rendezvous reads its timeouts as integers
        conf = f"join_timeout={math.ceil(spec.rdzv_join_timeout)},is_host={is_host}"
        if not (spec.elastic or spec.external_store):  # as before both existed
            return conf
        interval, attempts = rendezvous_keep_alive(spec.node_timeout)
        return (f"{conf},last_call_timeout={math.ceil(spec.rdzv_last_call_timeout)},"
                f"keep_alive_interval={interval},keep_alive_max_attempt={attempts}")
    return f"timeout={spec.rdzv_join_timeout:g}"  # static rendezvous: rank 0 hosts by design


def rendezvous_flags(spec: LaunchSpec) -> list[str]:
    """ft_launcher's rendezvous flags for this run, spelled for the installed NVRx: the node
    range, the store's endpoint, the round's id and settings. The store process's round closer
    (`store_server`, NVRx 0.6+) takes the same."""
    from trainer.nvrx_compat import nnodes_flag

    nnodes = nnodes_flag(spec.world_min_nodes, spec.nnodes, spec.spare_nodes) \
        if spec.elastic else str(spec.nnodes)
    return [f"--nnodes={nnodes}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={spec.master_addr}:{spec.master_port}",
            f"--rdzv-id={spec.rdzv_id}", f"--rdzv-conf={rdzv_conf(spec)}"]


def spec_rendezvous(spec: LaunchSpec) -> list[str]:
    """This spec's rendezvous as the flags of `add_rendezvous_args`: what the store process
    is started with, so that it closes the same rounds the launchers join."""
    return rendezvous_argv(spec.nnodes, spec.rdzv_join_timeout, min_nodes=spec.min_nodes,
                           spare_nodes=spec.spare_nodes, rdzv_id=spec.rdzv_id,
                           node_timeout_s=spec.node_timeout,
                           last_call_timeout_s=spec.rdzv_last_call_timeout)


def add_rendezvous_args(p: argparse.ArgumentParser) -> None:
    """The rendezvous flags the launchers and the store process share."""
    p.add_argument("--nnodes", type=int, required=True)
    p.add_argument("--rdzv_id", default=LaunchSpec.rdzv_id)
    p.add_argument("--rdzv_join_timeout", type=float, default=LaunchSpec.rdzv_join_timeout,
                   help="seconds a node waits for the others at rendezvous; must outlast a node "
                        "replacement (detection, eviction, boot, image pull)")
    p.add_argument("--min_nodes", type=int, default=None,
                   help="train on as few as this many nodes when no spare is left (default: "
                        "--nnodes, never fewer); ft_launcher modes")
    p.add_argument("--spare_nodes", type=int, default=0,
                   help="nodes beyond --nnodes that wait in the rendezvous to replace a lost "
                        "one (node ranks --nnodes and up); ft_launcher modes")
    p.add_argument("--node_timeout", type=float, default=LaunchSpec.node_timeout,
                   help="seconds without a sign of life after which a node is lost (its "
                        "rendezvous keep-alive; from NVRx 0.6 its beat in the store)")
    p.add_argument("--rdzv_last_call_timeout", type=float,
                   default=LaunchSpec.rdzv_last_call_timeout,
                   help="with --min_nodes below --nnodes: once enough nodes joined, seconds to "
                        "wait for more before a round starts with fewer")


def rendezvous_problem(a: argparse.Namespace) -> Optional[str]:
    """What is wrong with the shared rendezvous flags, in one line; None if nothing."""
    if a.nnodes < 1:
        return f"--nnodes {a.nnodes} must be at least 1"
    if a.rdzv_join_timeout <= 0:
        return f"--rdzv_join_timeout {a.rdzv_join_timeout:g} must be positive"
    if a.node_timeout < 1:
        return f"--node_timeout {a.node_timeout:g} must be at least 1 (seconds)"
    if a.rdzv_last_call_timeout < 0:
        return f"--rdzv_last_call_timeout {a.rdzv_last_call_timeout:g} must be 0 or more"
    return None


def build_command(spec: LaunchSpec, trainer_args: Sequence[str]) -> list[str]:
    """argv for this node's launcher; the trainer gets `--mode` from the spec."""
    py = sys.executable
    if RecoveryMode(spec.mode).uses_ft_launcher:
        from trainer.recovery.forkserver import launcher_args
        from trainer.nvrx_compat import ft_launcher_flags

        # ft_launcher, with workers forked from a process that has imported the trainer
        launcher = [py, "-m", "trainer.recovery.forkserver", *rendezvous_flags(spec),
                    f"--nproc-per-node={spec.nproc_per_node}", f"--node-rank={spec.node_rank}",
                    *ft_launcher_flags(spec.max_restarts, spec.heartbeat_timeout,
                                       spec.initial_heartbeat_timeout, spec.monitor_interval)]
        return [*launcher, *launcher_args(), "--mode", spec.mode, *trainer_args]
    # baseline and in-process alone: a process death ends the job; the Job (or the local
    # supervisor) restarts everything, like the published Kubernetes baseline.
    launcher = [py, "-m", "trainer.recovery.torchrun", f"--nnodes={spec.nnodes}",
                f"--nproc-per-node={spec.nproc_per_node}", f"--node-rank={spec.node_rank}",
                f"--master-addr={spec.master_addr}", f"--master-port={spec.master_port}",
                f"--rdzv-conf={rdzv_conf(spec)}",
                "--max-restarts=0", f"--monitor-interval={min(spec.monitor_interval, 1.0):g}"]
    return [*launcher, "-m", "trainer", "--mode", spec.mode, *trainer_args]


def launch_env(spec: LaunchSpec, cfg, base: Optional[dict] = None) -> dict:
    """The launcher's environment, which its workers inherit: `base` (default: this process's),
    completed with the mode's `contract.process_env` for the trainer config `cfg`. What `base`
    already sets wins: a pod's manifest sets the same values."""
    env = dict(os.environ if base is None else base)
    # One launch is one run, also where the rendezvous id is the same every time; a pod's
    # manifest and the local runner name the run themselves (restarts included).
    env.setdefault(RUN_ID_ENV, f"launch-{socket.gethostname()}-{os.getpid()}-"
                               f"{ProcessId.current().start}")
    env[INPROCESS_PORT_ENV] = str(wrapper_store_port(spec.master_port))
    if spec.external_store:  # the ranks' stores are clients of the store process
        env[EXTERNAL_STORE_ENV] = f"{spec.master_addr}:{spec.master_port}"
        from trainer.nvrx_compat import rendezvous_finds_silent_nodes

        if not rendezvous_finds_silent_nodes():  # the ranks watch each other's nodes
            env[NODE_TIMEOUT_ENV] = f"{spec.node_timeout:g}"
    env["GROUP_RANK"] = str(spec.node_rank)  # NVRx's infrastructure group rank
    # The event log: this node's file (torchelastic renumbers GROUP_RANK at each rendezvous),
    # and which start of the launcher the workers belong to (a new one means a job restart).
    env[NODE_RANK_ENV] = str(spec.node_rank)
    env[LAUNCHER_ID_ENV] = uuid.uuid4().hex[:12]
    if cfg.output_dir is not None:
        from trainer.accounting.events import events_dir

        env[EVENTS_DIR_ENV] = str(events_dir(cfg.output_dir))
    # The NCCL watchdog's bound follows the NCCL collective timeout, whatever this run's device.
    for name, value in process_env(spec.mode, cfg.collective_timeout("cuda"),
                                   cfg.hard_timeout).items():
        env.setdefault(name, value)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONWARNINGS", "ignore:The pynvml package is deprecated:FutureWarning")
    return env


def parse(argv: Sequence[str]) -> tuple[LaunchSpec, list[str]]:
    argv = list(argv)
    trainer_args = []
    if "--" in argv:
        i = argv.index("--")
        argv, trainer_args = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="python -m trainer.recovery.launch",
                                description="Start this node's workers under the chosen recovery mode.")
    p.add_argument("--mode", choices=MODE_NAMES, required=True)
    add_rendezvous_args(p)
    p.add_argument("--nproc_per_node", type=int, required=True)
    p.add_argument("--node_rank", type=int, required=True)
    p.add_argument("--master_addr", required=True)
    p.add_argument("--master_port", type=int, default=LaunchSpec.master_port)
    p.add_argument("--max_restarts", type=int, default=LaunchSpec.max_restarts)
    p.add_argument("--heartbeat_timeout", type=float, default=LaunchSpec.heartbeat_timeout)
    p.add_argument("--initial_heartbeat_timeout", type=float,
                   default=LaunchSpec.initial_heartbeat_timeout)
    p.add_argument("--monitor_interval", type=float, default=LaunchSpec.monitor_interval)
    p.add_argument("--metrics_port", type=int, default=LaunchSpec.metrics_port,
                   help="serve this node's Prometheus /metrics on this port (0: off)")
    p.add_argument("--external_store", action="store_true",
                   help="the run's stores are served by `python -m trainer.recovery.store_server`"
                        " on --master_addr:--master_port; no launcher hosts any (ft_launcher modes)")
    a = p.parse_args(argv)
    problem = rendezvous_problem(a)
    if problem:
        p.error(problem)
    if a.nproc_per_node < 1:
        p.error(f"--nproc_per_node {a.nproc_per_node} must be at least 1")
    if not 0 <= a.metrics_port < 65536:
        p.error(f"--metrics_port {a.metrics_port} must be a port number, 0 to 65535 (0: off)")
    problem = topology_problem(a.mode, a.nnodes, a.min_nodes, a.spare_nodes, a.external_store)
    if problem:
        p.error(problem)
    if not 0 <= a.node_rank < a.nnodes + a.spare_nodes:
        p.error(f"--node_rank {a.node_rank} must be in [0, {a.nnodes + a.spare_nodes}) "
                f"(--nnodes {a.nnodes} plus --spare_nodes {a.spare_nodes})")
    if "--mode" in trainer_args:
        p.error("pass --mode to the launcher only; it forwards it to the trainer")
    return LaunchSpec(**vars(a)), trainer_args


def topology_problem(mode: str, nnodes: int, min_nodes: Optional[int], spare_nodes: int,
                     external_store: bool) -> Optional[str]:
    """What is wrong with this shape of a run, in one line; None if nothing. Spares and a
    shrinking world need a launcher that restarts its workers in a new rendezvous round
    (ft_launcher); the other modes restart the whole Job on any fault, where rank 0 hosting the
    stores costs nothing more."""
    lo = nnodes if min_nodes is None else min_nodes
    if spare_nodes < 0:
        return f"--spare_nodes {spare_nodes} must be 0 or more"
    if not 1 <= lo <= nnodes:
        return f"--min_nodes {lo} must be in [1, {nnodes}] (--nnodes {nnodes})"
    m = RecoveryMode(mode)
    elastic = spare_nodes > 0 or lo < nnodes
    if (elastic or external_store) and not m.launcher_restarts_workers:
        what = "--external_store" if not elastic else \
            ("--spare_nodes" if spare_nodes > 0 else "--min_nodes below --nnodes")
        ft_modes = ", ".join(x.value for x in RecoveryMode if x.launcher_restarts_workers)
        return (f"{what} needs a launcher that restarts its workers in a new rendezvous round: "
                f"mode {mode} restarts the whole Job on any fault; use one of {ft_modes}")
    if lo < nnodes:
        from trainer.nvrx_compat import shrinks_world

        if not shrinks_world():
            return (f"--min_nodes {lo} below --nnodes {nnodes}: the installed NVRx keeps a "
                    f"fixed world (spares only); use --min_nodes {nnodes}")
    return None


def default_heartbeat_timeout(mode: str, hard_timeout: float, floor: float = 30.0,
                              margin: float = 30.0) -> float:
    """ft_launcher's rank heartbeat timeout: `floor`; with in-process restart below it, `margin`
    beyond the trainer's hard timeout, or the launcher kills ranks the wrapper is still
    recovering (`check`)."""
    if RecoveryMode(mode).heartbeat_outlasts_hard_timeout:
        return max(floor, hard_timeout + margin)
    return floor


def check(spec: LaunchSpec, cfg, prog: str = "python -m trainer.recovery.launch") -> None:
    """Launcher and trainer settings that only fail together, and an NVRx the trainer was not
    tested on (`nvrx_contract`)."""
    from trainer.nvrx_contract import problems as nvrx_problems

    for problem in nvrx_problems():
        sys.stderr.write(f"{prog}: error: {problem}\n")
        sys.exit(2)
    if RecoveryMode(spec.mode).heartbeat_outlasts_hard_timeout and \
            spec.heartbeat_timeout <= cfg.hard_timeout:
        sys.stderr.write(
            f"{prog}: error: --heartbeat_timeout {spec.heartbeat_timeout:g} must "
            f"exceed the trainer's --hard_timeout {cfg.hard_timeout:g}: ft_launcher would kill "
            "ranks that the in-process restart is still recovering\n")
        sys.exit(2)
    problem = shrink_batch_problem(spec, cfg)
    if problem:
        sys.stderr.write(f"{prog}: error: {problem}\n")
        sys.exit(2)


def shrink_batch_problem(spec: LaunchSpec, cfg) -> Optional[str]:
    """The global batch is kept exact at every world size the run may train at (--min_nodes to
    --nnodes nodes): a size that cannot divide it is refused here, before anything starts."""
    from config.training import batch_problem_down_to

    global_batch = cfg.global_batch_size or cfg.batch_size * spec.nnodes * spec.nproc_per_node
    return batch_problem_down_to(global_batch, cfg.batch_size, spec.nproc_per_node, spec.nnodes,
                                 spec.world_min_nodes)


def serve_metrics(port: int, workdir: Path, env: dict, addr: str = "0.0.0.0") -> None:
    """Serve this node's `/metrics` from this process, which outlives every worker restart;
    the workers publish their figures to a file in `workdir`, named in their `env`."""
    from trainer.telemetry.exporter import serve

    figures = workdir / "figures.json"
    env[FIGURES_FILE_ENV] = str(figures)
    serve(port, figures, addr)


def supervise(cmd: list[str], env: dict, workdir: Optional[Path] = None,
              grace_s: float = float(TERMINATION_GRACE_FLOOR_S),
              finished: Callable[[], Optional[str]] = lambda: None) -> int:
    """Run the launcher; end it as soon as a rank records an error that no restart can fix.

    torchrun and ft_launcher turn any worker failure into their own exit code 1 (ft_launcher
    first restarts the workers, which would fail the same way). A rank that meets such an error
    writes it to FINAL_ERROR_ENV's file; this process then stops the launcher and exits 2,
    which the local runner and the Job's pod failure policy never retry. Any other failed exit
    is recorded in the node's event log: the Job restarts the pod for it.

    SIGTERM (the pod's, to PID 1) reaches the workers as the stop signal: they commit their
    newest state and stop (`trainer.termination`); this process waits for them up to
    `grace_s` and exits 143 (`stop_on_sigterm`). SIGINT goes to the launcher, which tears them
    down at once.

    A node that comes after the run has ended (a lost node's replacement pod, scheduled once its
    instance is up) finds the rendezvous closed and its launcher exits 1 (NVRx before 0.6), or
    waits in it as a standby for good (0.6+). Where `finished` names the run's end, that exit
    is 0 and no failure is recorded, and a standby launcher is stopped and exits 0 (`finished`
    is asked every END_POLL_S while it has no workers, and had none for AGENT_EXIT_S: one whose
    workers have just finished closes the rendezvous and exits on its own): otherwise the Job
    would count a failed pod, retry it, and end Failed after training had completed, or never
    complete.
    """
    if workdir is None:  # a folder of its own, gone with the run
        with tempfile.TemporaryDirectory(prefix="nvrx-eks-launch-") as own:
            return supervise(cmd, env, Path(own), grace_s, finished)
    final = workdir / "final-error"
    become_subreaper()
    # a `node` fault takes this process, the pod's PID 1, and all it started
    proc = subprocess.Popen(cmd, env={NODE_LEADER_ENV: str(os.getpid()), **env,
                                      FINAL_ERROR_ENV: str(final)},
                            preexec_fn=child_dies_with_me())
    terminating: list[int] = []

    def forward(signum, frame) -> None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, lambda signum, frame: terminating.append(signum))
    standby = StandbyWatch(proc.pid)
    while not reap_orphans(proc) and not final.exists() and not terminating:
        time.sleep(0.2)
        if standby.due():  # a standby of a run that has ended: nothing to wait for
            end = finished() if standby.is_standby() else None
            if end is not None:
                print(f"python -m trainer.recovery.launch: the run has ended ({end}): this "
                      "node has nothing to train", file=sys.stderr, flush=True)
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=grace_s)
                proc.kill()
                return 0
    if terminating:
        return stop_on_sigterm("python -m trainer.recovery.launch", [proc],
                               lambda: not reap_orphans(proc), grace_s)
    if proc.returncode not in (0, 2, None) and not final.exists():
        end = finished()
        if end is not None:
            print(f"python -m trainer.recovery.launch: the run has ended ({end}): this node has "
                  f"nothing to train", file=sys.stderr, flush=True)
            return 0
        from trainer.recovery.launcher_events import record_launcher_exit

        record_launcher_exit(env, proc.returncode)
    if final.exists():
        if proc.poll() is None:
            forward(signal.SIGTERM, None)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                forward(signal.SIGKILL, None)
                proc.wait()
        print(f"python -m trainer.recovery.launch: error: {final.read_text().strip()}", file=sys.stderr,
              flush=True)
        return 2
    return proc.returncode


def worker_pids(agent: int) -> set[int]:
    """The workers under an elastic agent: its descendants that lead a process group of their
    own (torch elastic starts command-line workers in sessions of their own, the fork server
    gives forked ones a group each). The agent's helpers (the fork server, rank monitors) and
    the workers' own (the checkpoint writer) stay in their parent's group."""
    import psutil

    try:
        descendants = psutil.Process(agent).children(recursive=True)
    except psutil.NoSuchProcess:
        return set()
    found = set()
    for proc in descendants:
        with contextlib.suppress(ProcessLookupError):
            if os.getpgid(proc.pid) == proc.pid:
                found.add(proc.pid)
    return found


def stop_workers(agents: Sequence[int], running: Callable[[], bool], grace_s: float,
                 poll_s: float = 0.2) -> bool:
    """Send the stop signal to the workers of these agents, and of any the agents start
    meanwhile, until the agents have ended (`running` turns False) or `grace_s` has passed;
    True if they ended.

    The workers, not the agents: torchrun and ft_launcher take a SIGTERM for the end of the
    job, send it on to their workers (which die of it) and exit with a failure. The workers
    commit their newest state and exit 0, so the agents end as after a completed run."""
    deadline = time.monotonic() + grace_s
    signalled: set[int] = set()
    while running():
        if time.monotonic() > deadline:
            return False
        for agent in agents:
            for pid in worker_pids(agent) - signalled:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, STOP_SIGNAL)
                signalled.add(pid)
        time.sleep(poll_s)
    return True


def stop_on_sigterm(prog: str, agents: Sequence[subprocess.Popen], running: Callable[[], bool],
                    grace_s: float) -> int:
    """A launcher's SIGTERM: the workers stop as `stop_workers` has them, within `grace_s`, or
    the agents are killed (and everything under them with them). Returns the exit code, 143."""
    t0 = time.monotonic()
    print(f"{prog}: SIGTERM: the ranks commit their newest state and stop (grace {grace_s:g} s)",
          file=sys.stderr, flush=True)
    ended = stop_workers([a.pid for a in agents], running, grace_s)
    if not ended:
        for agent in agents:
            with contextlib.suppress(ProcessLookupError):
                agent.kill()
        while running():
            time.sleep(0.05)
    how = "the ranks ended" if ended else f"the ranks had not ended after {grace_s:g} s: killed"
    print(f"{prog}: stopped by SIGTERM, {how} ({time.monotonic() - t0:.1f} s)", file=sys.stderr,
          flush=True)
    return SIGTERM_EXIT_CODE


def become_subreaper() -> None:
    """Orphans of the launcher's processes (the children of a killed worker) come to this
    process instead of the system's init, as they do to a pod's PID 1, which this process is
    in the pods; `reap_orphans` collects them. Left as zombies, they would pile up over
    restarts and keep a killed worker's process group signallable."""
    if os.path.exists("/proc/self"):
        PR_SET_CHILD_SUBREAPER = 36
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)


def reap_orphans(proc: subprocess.Popen) -> bool:
    """Collect every child that has exited, the launcher included; True once it has."""
    while proc.returncode is None:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:  # no children at all: the launcher was collected elsewhere
            return proc.poll() is not None
        if pid == 0:
            break
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode is not None


END_POLL_S = 5.0  # how often a launcher with no workers asks whether the run has ended
WORKER_POLL_S = 1.0  # how often it looks for its agent's workers
# An agent whose workers have finished waits for the other nodes' agents (torch elastic's exit
# barrier, 300 s at most) and then closes the rendezvous (30 s at most). Stopped in between, it
# leaves the rendezvous open (a signalled agent never closes it), and a node that comes later
# trains again instead of finding the run closed.
AGENT_EXIT_S = 330.0


class StandbyWatch:
    """Tells a standby agent (one waiting for a seat, with no workers) from one whose workers
    have just finished and which is ending on its own: the latter had workers in the last
    AGENT_EXIT_S. Looks for workers every WORKER_POLL_S, so that short-lived ones are seen."""

    def __init__(self, agent: int) -> None:
        self.agent = agent
        self.workers_seen: Optional[float] = None  # monotonic time they were last seen
        now = time.monotonic()
        self.next_worker_look = now
        self.next_end_look = now + END_POLL_S

    def due(self) -> bool:
        """Whether it is time to ask whether the run has ended (after a look for workers)."""
        now = time.monotonic()
        if now >= self.next_worker_look:
            self.next_worker_look = now + WORKER_POLL_S
            if worker_pids(self.agent):
                self.workers_seen = now
        if now < self.next_end_look:
            return False
        self.next_end_look = now + END_POLL_S
        return True

    def is_standby(self) -> bool:
        return self.workers_seen is None or time.monotonic() - self.workers_seen >= AGENT_EXIT_S


def run_end(cfg) -> Optional[str]:
    """Whether the run has trained to its end: its checkpoint of step max_steps is committed
    (rank 0 commits it after the last step, before results.json). One directory listing.
    Only the ft_launcher modes take in a node during the run; under torchrun a failed pod is
    a gang restart, which an ended run never has."""
    if not cfg.checkpoint_dir or not RecoveryMode(cfg.mode).launcher_restarts_workers:
        return None
    from trainer.durable.store import CheckpointStore

    step = CheckpointStore(cfg.checkpoint_dir).latest_step()
    if step is None or step < cfg.max_steps:
        return None
    return f"step {step} of {cfg.max_steps} is committed in {cfg.checkpoint_dir}"


def record_final_error(message: str) -> bool:
    """Called by a rank: hand an error no restart can fix to `supervise` (first one wins).
    Whether a supervisor takes it (and says it): False for a rank started without one."""
    path = os.environ.get(FINAL_ERROR_ENV)
    if path and not os.path.exists(path):
        with contextlib.suppress(OSError):
            Path(path).write_text(message)
    return bool(path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    spec, trainer_args = parse(sys.argv[1:] if argv is None else argv)
    from trainer.preflight import parse_and_check

    cfg = parse_and_check([*trainer_args, "--mode", spec.mode],
                          prog="python -m trainer.recovery.launch", sample_data=True)
    check(spec, cfg)  # bad flags: exit 2 here
    cmd = build_command(spec, trainer_args)
    env, workdir = launch_env(spec, cfg), Path(tempfile.mkdtemp(prefix="nvrx-eks-launch-"))
    try:
        if spec.metrics_port:
            try:
                serve_metrics(spec.metrics_port, workdir, env)
            except OSError as exc:
                print(f"python -m trainer.recovery.launch: error: --metrics_port "
                      f"{spec.metrics_port}: {exc.strerror or exc}", file=sys.stderr)
                return 2
        print("launch:", " ".join(cmd), flush=True)
        return supervise(cmd, env, workdir, cfg.termination_grace, finished=lambda: run_end(cfg))
    finally:  # the workers' final-error file and the metrics files: nothing outlives the run
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
