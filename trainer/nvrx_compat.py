"""Every difference between NVRx 0.4.1 (CPU machines, the published benchmark) and 0.7.x (the GPU
image) lives here, so the rest of the trainer is written against one API.

Differences absorbed:
- `TorchAsyncCheckpoint.async_save` always calls `torch.cuda.synchronize()` and stages with
  `preload_tensors`; our shards are already staged in shared host buffers, so requests go to
  NVRx's queue and persistent worker directly, which also works on CPU-only builds.
- `TorchAsyncCheckpoint.close()` exists only from 0.5; 0.4.1 closes through `finalize_async_save`.
- A dead persistent worker makes NVRx's blocking finalize wait forever: the worker process is
  watched here (`worker_exitcode`). NVRx spawns that worker from whichever thread makes the
  first request and never ties it to the rank; here it is started by `AsyncWriter` itself,
  running NVRx's loop behind `lifetime.follow_parent`, so it ends with its rank from its
  first instant, and forked from the rank before its process group exists, so it imports
  nothing. From 0.6 that loop binds a CUDA device and opens a context on it (failing
  on CPU-only ranks) unless told that its requests hold host memory only (`cpu_shm_mode`);
  ours always do, so it is told, and no writer holds a CUDA context.
- ft_launcher's rank monitors (forked in 0.4.1, spawned in some later versions) serve until
  told to stop: a killed launcher left them running. They run behind `lifetime.follow_parent`
  too (`use_rank_monitors_following_launcher`).
- ft_launcher: heartbeat timeouts default to None (no hang detection) from 0.6, so they are
  always passed; `--ft-restart-policy` is a deprecated no-op from 0.6 and only passed before.
  Before 0.5 its vendored copy of torchelastic reads `.pid` off a failed function worker's
  exception, which torch names `error_pid` (`ft_launcher_main`). 0.7 ends every stop of the
  workers with SIGTERM to their process groups, a fixed 1 s sleep and SIGKILL, even when the
  groups are already empty; `stop_worker_groups` does the same but returns once they are.
  0.7's barrier rendezvous finds the round its own launcher has just opened only after a 1 s
  sleep (`use_prompt_rendezvous`). 0.7 waits for the stopped workers' GPU memory to be freed,
  sampling it every 2 s; the interval is passed (`GPU_MEMORY_POLL_S`).
- inprocess.Wrapper: `rank_filter` exists only before 0.5; from 0.5 the wrapper adds NVML GPU,
  NVLink and NIC checks to every restart whenever LOCAL_RANK is set, which fail on CPU ranks
  (`restart_health_check`). Its monitor process ends a rank that made no progress for the hard
  timeout with SIGTERM (SIGKILL a grace later) and says so only in its own log, which is off:
  `record_watchdog_kills` has it say so in the run's event log first.
- Spare nodes and a shrinking world (`nnodes_flag`): before 0.6 ft_launcher's c10d rendezvous
  admits `--nnodes MIN:MAX` nodes, MAX the world, and parks any node beyond MAX in its
  redundancy list; the world may shrink to MIN. From 0.6 the barrier rendezvous reads MIN as
  the fixed active world and MAX as its limit with standbys, and never shrinks it
  (`shrinks_world`). Before 0.6 a dead node is found only once its rendezvous keep-alive (a
  fixed 5 s, 3 attempts) expires: the interval is taken from the rendezvous settings here
  (`use_rendezvous_keep_alive`), and a participant found dead restarts the survivors' workers
  as a joining node does (`use_lost_participant_restart`); without that the survivors wait for
  a collective timeout. The nodes that trained in the previous round take the seats of the
  next one before the spares do (`use_seated_nodes_first`): the rendezvous fills its seats in
  the order nodes ask, and a spare that asked first would leave a survivor, and the state on
  its node, out. Each worker learns which rendezvous round it joined, for the keys it writes
  in stores that outlive the round (`use_round_in_worker_env`).
- A store outside the training nodes (`--external_store`): before 0.6 any participant closes
  a rendezvous round; from 0.6 only the store's host does, so the run's store process then
  runs NVRx's `nvrx-control` on the rendezvous port (`rendezvous_closer`). That rendezvous
  has no keep-alive either, so a node that stops answering is found by the ranks' own watch
  (`rendezvous_finds_silent_nodes`).
- What NVRx detects, for the event log: the Wrapper's interruption records live in its store
  (`interruption_records`); ft_launcher's failed workers and its rank monitors' heartbeat
  timeouts are seen only inside the launcher, through its agent's `_monitor_workers` and the
  monitor's `_handle_timeout` (`watch_worker_failures`, `watch_heartbeat_timeouts`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import multiprocessing
import os
import signal
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any, Callable, Optional

from config.versions import NVRX_BARRIER_RENDEZVOUS_FROM, nvrx_shrinks_world
from trainer.lifetime import follow_parent

NVRX_VERSION = tuple(int(x) for x in version("nvidia-resiliency-ext").split(".")[:2])

log = logging.getLogger(__name__)
# ft_launcher's wait for a stopped worker's GPU memory (0.7): NVRx samples every 2 s, so a first
# sample taken while the driver is still freeing the memory cost a whole 2 s of the restart. One
# NVML query per GPU takes about a millisecond.
GPU_MEMORY_POLL_S = 0.1


def _async_checkpoint_class():
    from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncRequest
    from nvidia_resiliency_ext.checkpointing.async_ckpt.torch_ckpt import TorchAsyncCheckpoint

    return TorchAsyncCheckpoint, AsyncRequest


class AsyncWriter:
    """NVRx's TorchAsyncCheckpoint (persistent worker process) running our shard writer.

    The worker process starts now. `fork=True` forks it from this process, which has imported
    torch already: the worker is ready in milliseconds instead of importing torch afresh (about
    2.5 CPU-s a rank on a CPU machine, `spawn`). Fork only before this process has a process
    group, a CUDA context or a socket (`trainer.cli` forks it first thing): the worker would hold
    copies of them. A spawned worker (`fork=False`) may be started at any time; it replaces a
    forked one that died."""

    def __init__(self, rank: int, fork: bool = False) -> None:
        cls, self._request_cls = _async_checkpoint_class()
        self._ckpt = cls(persistent_queue=True)
        self.forked = fork
        self._start_worker(rank, fork)

    def _start_worker(self, rank: int, fork: bool) -> None:
        """Start NVRx's persistent worker as its first request would, with the same queues and
        loop, behind a watch of this process (`_persistent_worker`)."""
        from nvidia_resiliency_ext.checkpointing.async_ckpt import core

        caller = self._ckpt._async_calls_queue._get_async_caller()
        caller.rank = rank
        host_only = {"cpu_shm_mode": True} if "cpu_shm_mode" in inspect.signature(
            core.PersistentAsyncCaller.async_loop).parameters else {}
        caller.process = multiprocessing.get_context("fork" if fork else "spawn").Process(
            target=_forked_worker if fork else _persistent_worker, name=f"checkpoint-writer-{rank}",
            args=(os.getpid(), rank, caller.queue, caller.preload_q, caller.comp_q,
                  logging.getLogger(core.__name__).getEffectiveLevel()), kwargs=host_only)
        caller.process.start()

    def submit(self, fn: Callable[[Any], Any], arg: Any) -> None:
        """Queue `fn(arg)` for the background worker; returns at once."""
        request = self._request_cls(fn, (arg,), [], {})
        self._ckpt._async_calls_queue.schedule_async_request(request)

    def pending(self) -> int:
        return self._ckpt._async_calls_queue.get_num_unfinalized_calls()

    def poll(self) -> bool:
        """Finalize what the worker has finished, without waiting; True when nothing is pending."""
        if self.pending():
            self._ckpt.finalize_async_save(blocking=False, no_dist=True)
        return self.pending() == 0

    def worker_exitcode(self) -> Optional[int]:
        """None while the worker lives (or was never started); its exit code once it died."""
        caller = self._ckpt._async_calls_queue.persistent_caller
        proc = getattr(caller, "process", None)
        if proc is None or proc.is_alive():
            return None
        return proc.exitcode

    def close(self, abort: bool = False) -> None:
        """Stop the worker: after its queue drains, or at once (abort) if it is dead or stuck."""
        queue = self._ckpt._async_calls_queue
        caller = queue.persistent_caller
        proc = getattr(caller, "process", None)
        if proc is None:
            return
        if abort or not proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
            caller.process = None
            queue.async_calls.clear()
            return
        if NVRX_VERSION >= (0, 5):
            self._ckpt.close()
        else:
            self._ckpt.finalize_async_save(blocking=True, no_dist=True, terminate=True)


def _forked_worker(parent: int, *loop_args, **loop_kwargs) -> None:
    """The writer forked from its rank: first the signal dispositions a spawned writer starts
    with (the rank's own handlers, such as the stop signal's, are not the writer's), then the
    same loop."""
    for signum in signal.valid_signals():
        handler = signal.getsignal(signum)
        if callable(handler) and handler is not signal.default_int_handler:
            signal.signal(signum, signal.SIG_DFL)
    _persistent_worker(parent, *loop_args, **loop_kwargs)


def _persistent_worker(parent: int, *loop_args, **loop_kwargs) -> None:
    """The checkpoint writer process: NVRx's persistent loop, ending with the rank that started
    it. A replacement for a dead writer is started from whichever thread saves next, which may
    end long before the rank: a parent-death signal would fire then, so the parent is polled."""
    follow_parent(parent)
    from nvidia_resiliency_ext.checkpointing.async_ckpt.core import PersistentAsyncCaller

    PersistentAsyncCaller.async_loop(*loop_args, **loop_kwargs)


def ft_launcher_flags(max_restarts: int, heartbeat_timeout: float, initial_heartbeat_timeout: float,
                      monitor_interval: float) -> list[str]:
    """ft_launcher's own flags, spelled for the installed NVRx."""
    flags = [
        f"--max-restarts={max_restarts}",
        f"--monitor-interval={monitor_interval:g}",
        f"--ft-initial-rank-heartbeat-timeout={initial_heartbeat_timeout:g}",
        f"--ft-rank-heartbeat-timeout={heartbeat_timeout:g}",
        # how often a rank monitor looks for a missed heartbeat (NVRx: every 5 s, which added
        # up to 5 s to the detection of a hang)
        f"--ft-workload-check-interval={monitor_interval:g}",
    ]
    if NVRX_VERSION < (0, 6):
        flags.append("--ft-restart-policy=any-failed")
    if _reclaims_gpu_memory():
        flags.append(f"--ft-gpu-memory-poll-interval={GPU_MEMORY_POLL_S:g}")
    return flags


def _reclaims_gpu_memory() -> bool:
    """Whether the installed ft_launcher waits for the stopped workers' GPU memory to be freed
    before it starts new ones, sampling NVML every `gpu_memory_poll_interval` (0.7). Decided by
    the version, not by importing NVRx's config, which imports torch: the launchers that build
    ft_launcher's command never need torch (1.3 s of every job start on a CPU machine)."""
    return NVRX_VERSION >= (0, 7)


def nnodes_flag(min_nodes: int, nnodes: int, spare_nodes: int) -> str:
    """ft_launcher's `--nnodes` for a world of `nnodes` nodes that may shrink to `min_nodes`, with
    `spare_nodes` more waiting to replace a lost one (see the module's docstring)."""
    if shrinks_world():
        return f"{min_nodes}:{nnodes}"
    return f"{nnodes}:{nnodes + spare_nodes}"


def _barrier_rendezvous() -> bool:
    """Whether the installed ft_launcher meets in the barrier rendezvous (0.6+)."""
    return NVRX_VERSION >= NVRX_BARRIER_RENDEZVOUS_FROM


def rendezvous_closer(rendezvous_flags: list[str]) -> Optional[list[str]]:
    """argv of the process that closes each rendezvous round of ft_launchers that host no
    store (`--external_store`), given their rendezvous flags; None where none is needed.

    Before 0.6 every participant of the c10d rendezvous can close a round, so a plain TCPStore
    serves it. From 0.6 only the store's host assigns the ranks and closes the round, and a
    launcher that hosts no store never does: without a closer every launcher waits in the
    first round until its join timeout. NVRx's own closer for a store outside the training
    nodes is `nvrx-control`, which then hosts the rendezvous store itself."""
    if not _barrier_rendezvous():
        return None
    return [sys.executable, "-m", "nvidia_resiliency_ext.fault_tolerance.control_plane",
            *rendezvous_flags, "--ft-enable-log-server=false"]


def keeps_survivors_seats() -> bool:
    """Whether a node that trained in the last round keeps its ranks in the next one, so its
    ranks restore from their own node tier: before 0.6 the c10d rendezvous seats the survivors
    first (`use_seated_nodes_first`); from 0.6 the barrier rendezvous assigns the ranks itself,
    and a survivor may take another rank, which it then restores from its peer replica."""
    return not _barrier_rendezvous()


def rendezvous_finds_silent_nodes() -> bool:
    """Whether the installed ft_launcher's rendezvous drops a node that stops answering: before
    0.6 its keep-alive expires (`use_lost_participant_restart`); from 0.6 it keeps none, and the
    trainer's ranks watch each other's nodes instead (`trainer.recovery.nodewatch`)."""
    return not _barrier_rendezvous()


def shrinks_world() -> bool:
    """Whether the installed ft_launcher can continue on fewer nodes than it started with
    (the rule synthesis applies to the image's release, `config.versions`)."""
    return nvrx_shrinks_world(NVRX_VERSION)


def rendezvous_keep_alive(node_timeout_s: float) -> tuple[int, int]:
    """(interval, attempts) of the rendezvous keep-alive that declares a node dead after about
    `node_timeout_s` without one: about three per timeout, whole seconds (torch's settings are
    integers), at least one."""
    interval = max(1, round(node_timeout_s / 3))
    return interval, max(1, round(node_timeout_s / interval))


def ft_launcher_main() -> int:
    """Run ft_launcher in this process, on this process's command line."""
    if NVRX_VERSION < (0, 5):
        import torch.multiprocessing as mp

        for cls in (mp.ProcessRaisedException, mp.ProcessExitedException):
            if not hasattr(cls, "pid"):
                cls.pid = property(lambda exc: exc.error_pid)
    from nvidia_resiliency_ext.fault_tolerance import launcher

    use_stop_worker_groups(launcher)
    use_rank_monitors_following_launcher()
    use_round_in_worker_env(launcher)
    try:
        from nvidia_resiliency_ext.fault_tolerance import _ft_rendezvous
    except ImportError:  # a release without the c10d rendezvous of 0.4
        pass
    else:
        use_rendezvous_keep_alive(_ft_rendezvous)
        use_lost_participant_restart(_ft_rendezvous.FtRendezvousHandler)
        use_seated_nodes_first(_ft_rendezvous)
    try:
        from nvidia_resiliency_ext.fault_tolerance.ft_rendezvous_barrier import \
            _RendezvousBarrierState
    except ImportError:  # before 0.7: another rendezvous
        pass
    else:
        use_prompt_rendezvous(_RendezvousBarrierState)
    return launcher.main()


def use_rendezvous_keep_alive(rendezvous) -> None:
    """The c10d rendezvous of NVRx before 0.6 fixes its keep-alive at 5 s and 3 attempts, so a
    dead node leaves the rendezvous 15 s after its last keep-alive; torch's own rendezvous takes
    `keep_alive_interval` and `keep_alive_max_attempt` from `--rdzv-conf`. Here NVRx's does too."""
    create = rendezvous.create_handler
    if getattr(create, "takes_keep_alive", False):
        return

    @functools.wraps(create)
    def create_with_keep_alive(store, backend, params):
        handler = create(store, backend, params)
        interval = params.get_as_int("keep_alive_interval", None)
        attempts = params.get_as_int("keep_alive_max_attempt", None)
        if interval is None and attempts is None:
            return handler
        import dataclasses
        from datetime import timedelta

        old = handler._settings
        settings = dataclasses.replace(
            old, keep_alive_interval=timedelta(seconds=interval) if interval is not None
            else old.keep_alive_interval,
            keep_alive_max_attempt=attempts if attempts is not None
            else old.keep_alive_max_attempt)
        # the handler, its state holder and its op executor each keep the settings
        for holder in (handler, handler._state_holder, handler._op_executor):
            holder._settings = settings
        return handler

    create_with_keep_alive.takes_keep_alive = True
    rendezvous.create_handler = create_with_keep_alive


_lost_reporters: list[Callable[[int, int], None]] = []


def watch_lost_nodes(report: Callable[[int, int], None]) -> None:
    """Call `report(lost, round)` when this agent finds participants of its round lost through
    the rendezvous keep-alive (`use_lost_participant_restart`), before it restarts its workers."""
    _lost_reporters.append(report)


def use_lost_participant_restart(handler_cls: type) -> None:
    """A participant of this node's round that the rendezvous found dead (its keep-alive
    expired) counts as a node waiting: the agent, which asks for waiting nodes at every monitor
    interval while its workers are healthy, restarts them and joins the next round, in which a
    spare takes the lost node's place or the world shrinks. NVRx before 0.6 drops a dead
    participant from the rendezvous but leaves the survivors' workers in a collective that
    waits for it until a timeout."""
    waiting = handler_cls.num_nodes_waiting
    if getattr(waiting, "counts_lost", False):
        return
    join = handler_cls.next_rendezvous

    @functools.wraps(join)
    def join_and_remember(self, *args, **kwargs):
        result = join(self, *args, **kwargs)
        state = self._state_holder.state
        self._nvrx_eks_joined = (state.round, len(state.participants))
        _seated[0] = True
        return result

    @functools.wraps(waiting)
    def waiting_or_lost(self) -> int:
        count = waiting(self)  # syncs: a participant whose keep-alive expired is dropped
        joined = getattr(self, "_nvrx_eks_joined", None)
        state = self._state_holder.state
        if joined is not None and state.complete and state.round == joined[0] \
                and not state.closed:
            lost = joined[1] - len(state.participants)
            if lost > 0:
                log.warning("%d node(s) of rendezvous round %d lost (no keep-alive): restarting "
                            "the workers for the next round", lost, state.round)
                for report in _lost_reporters:
                    with contextlib.suppress(Exception):  # a record must never stop a restart
                        report(lost, state.round)
                return count + lost
        return count

    waiting_or_lost.counts_lost = True
    handler_cls.next_rendezvous = join_and_remember
    handler_cls.num_nodes_waiting = waiting_or_lost


_joined_round: list[Optional[int]] = [None]  # the round of the agent's newest rendezvous
_seated = [False]  # this agent has trained in a round (it is no spare)
SPARE_DEFER_S = 3.0  # how long a spare leaves a new round's seats to the nodes that trained


def use_seated_nodes_first(rendezvous) -> None:
    """In a new round, a node that has not trained yet (a spare, or a node that came back)
    takes a seat once every live node of the previous round (the rendezvous keeps their worker
    states until the round completes) has taken its own, or `SPARE_DEFER_S` after it first
    saw the round open, or half the round's last call if that is shorter (or the round would
    start without it): the survivors keep their ranks (`_assign_ranks`) on the nodes that hold
    their state. Where a survivor is later still, the spare takes the seat all the same:
    recovery then reads that rank's state from its peer."""
    op = rendezvous._RendezvousJoinOp
    call = op.__call__
    if getattr(call, "seated_first", False):
        return
    action_add, action_sync = rendezvous._Action.ADD_TO_PARTICIPANTS, rendezvous._Action.SYNC
    keep_alive, should_keep_alive = rendezvous._Action.KEEP_ALIVE, rendezvous._should_keep_alive
    opened: dict[int, float] = {}

    @functools.wraps(call)
    def seated_first(self, ctx, deadline):
        action = call(self, ctx, deadline)
        if action is not action_add or _seated[0] or ctx.state.round == 0:
            return action
        state = ctx.state  # the previous round's workers are keyed by node until the next one
        survivors = [n for n in getattr(state, "worker_states", {})
                     if n in state.last_heartbeats and n not in state.participants]
        if not survivors:  # every survivor has its seat, or none is left
            return action
        defer = min(SPARE_DEFER_S, ctx.settings.timeout.last_call.total_seconds() / 2)
        first = opened.setdefault(ctx.state.round, time.monotonic())
        if time.monotonic() - first >= defer:
            return action
        return keep_alive if should_keep_alive(ctx) else action_sync

    seated_first.seated_first = True
    op.__call__ = seated_first


def joined_round(handler) -> Optional[int]:
    """The rendezvous round `handler` has just completed, the same number on every node: the
    c10d rendezvous (before 0.6) keeps it in its state, the barrier rendezvous (0.6+) returns
    it from `round()`; None where neither says."""
    state = getattr(getattr(handler, "_state_holder", None), "state", None)
    if getattr(state, "round", None) is not None:
        return state.round
    try:
        return int(handler.round())
    except Exception:  # noqa: BLE001 - a handler that keeps no round: the restart count is used
        return None


def use_round_in_worker_env(launcher) -> None:
    """Each worker's environment names the rendezvous round its group joined
    (`config.contract.RDZV_ROUND_ENV`, read by `recovery.stores`): the agent reads it from its rendezvous handler as it starts the
    workers, and adds it to the environments it hands to `start_processes`."""
    from config.contract import RDZV_ROUND_ENV

    agent = getattr(launcher, "LocalElasticAgent", None)
    start = getattr(agent, "_start_workers", None)
    spawn = getattr(launcher, "start_processes", None)
    if start is None or spawn is None or getattr(start, "names_round", False):
        return

    @functools.wraps(start)
    def start_in_round(self, worker_group):
        _joined_round[0] = joined_round(self._rdzv_handler)
        return start(self, worker_group)

    @functools.wraps(spawn)
    def spawn_in_round(*args, **kwargs):
        envs = kwargs.get("envs")
        if _joined_round[0] is not None and envs:
            for env in envs.values():
                env[RDZV_ROUND_ENV] = str(_joined_round[0])
        return spawn(*args, **kwargs)

    start_in_round.names_round = True
    agent._start_workers = start_in_round
    launcher.start_processes = spawn_in_round


def use_stop_worker_groups(launcher) -> None:
    """Put `stop_worker_groups` in the place of the launcher module's group cleanup: 0.7's,
    which takes the workers' process groups (0.4.1 has another function of that name)."""
    cleanup = getattr(launcher, "terminate_mp_processes", None)
    if cleanup is not None and list(inspect.signature(cleanup).parameters) == ["allowed_pgids"]:
        launcher.terminate_mp_processes = stop_worker_groups


_rank_monitor_run: Optional[Callable[..., None]] = None  # NVRx's, once replaced in this process


def use_rank_monitors_following_launcher() -> None:
    """Every rank monitor this launcher starts runs `_rank_monitor_following_launcher`. A forked
    one calls it directly; a spawned one unpickles it by name from this module, in a process
    where NVRx's class is untouched."""
    global _rank_monitor_run
    from nvidia_resiliency_ext.fault_tolerance.rank_monitor_server import RankMonitorServer

    if _rank_monitor_run is None:
        _rank_monitor_run = RankMonitorServer.run
        RankMonitorServer.run = staticmethod(_rank_monitor_following_launcher)


def _rank_monitor_following_launcher(*args, **kwargs) -> None:
    """A rank monitor: NVRx's server, ending with the launcher that started it."""
    follow_parent(multiprocessing.parent_process().pid)
    run = _rank_monitor_run
    if run is None:  # a spawned monitor: NVRx's own, by its name
        from nvidia_resiliency_ext.fault_tolerance.rank_monitor_server import RankMonitorServer

        run = RankMonitorServer.run
    run(*args, **kwargs)


def use_prompt_rendezvous(state: type) -> None:
    """0.7's wait for an open round (`_RendezvousBarrierState`) first sees the finished round
    closed, syncs to the round the launcher has just opened, then sleeps 1 s before it looks
    again: 1 s of every restart. Syncing once on entry finds the new round open at the first
    look; the wait is otherwise unchanged (the sync is the one its loop runs)."""
    wait = state._wait_for_rendezvous_open
    if getattr(wait, "synced_first", False):
        return

    @functools.wraps(wait)
    def sync_then_wait(self, *args, **kwargs):
        self._sync_from_per_round_state()
        return wait(self, *args, **kwargs)

    sync_then_wait.synced_first = True
    state._wait_for_rendezvous_open = sync_then_wait


def stop_worker_groups(allowed_pgids, grace_s: float = 1.0, poll_s: float = 0.02) -> None:
    """What NVRx 0.7's `terminate_mp_processes` does to leftovers in the workers' process groups
    (SIGTERM, up to `grace_s`, SIGKILL), without waiting out the grace once the groups are
    empty: after a worker stop they usually are, and a fixed wait would add `grace_s` to every
    restart."""
    if 1 in allowed_pgids:  # NVRx's own exception: rank monitors in group 1 in its tests
        return
    groups = set(allowed_pgids)
    for pgid in groups:
        _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while groups and time.monotonic() < deadline:
        groups = live_groups(groups)
        if groups:
            time.sleep(poll_s)
    for pgid in groups:
        _signal_group(pgid, signal.SIGKILL)


def live_groups(pgids: set[int]) -> set[int]:
    """Those of the groups in which a process can still run, from one pass over /proc. A zombie
    cannot, yet it keeps its group signallable: a worker's child orphaned under a PID 1 that
    reaps nothing (a container's launcher) would make every stop wait out its grace."""
    proc = Path("/proc")
    if not proc.is_dir():
        return {pgid for pgid in pgids if _signal_group(pgid, 0)}
    live = set()
    for stat in proc.glob("[0-9]*/stat"):
        try:
            state, _ppid, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        if state not in ("Z", "X") and int(pgrp) in pgids:
            live.add(int(pgrp))
    return live


def _signal_group(pgid: int, sig: int) -> bool:
    """Signal a process group; False once no process is left in it. Best effort, as in NVRx."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except OSError:
        log.warning("could not signal process group %s", pgid, exc_info=True)
    return True


def record_watchdog_kills(events, soft_timeout_s: float, hard_timeout_s: float) -> None:
    """Before the in-process Wrapper first runs: the monitor process it forks from this rank
    records, before it kills the rank, which rank it kills, with which signals, and after which
    timeouts (an `error` event of type WatchdogTimeout). NVRx calls the module's
    `terminate_process` for that kill alone."""
    from nvidia_resiliency_ext.inprocess import monitor_process

    kill = monitor_process.terminate_process
    if getattr(kill, "records_watchdog_kills", False):
        return

    @functools.wraps(kill)
    def record_then_kill(process, termination_grace_time, *args, **kwargs):
        grace = termination_grace_time.total_seconds()
        try:
            events.emit("error", type="WatchdogTimeout", target_pid=process.pid, message=(
                f"no progress within the hard timeout (--hard_timeout {hard_timeout_s:g} s; the "
                f"soft timeout, --soft_timeout {soft_timeout_s:g} s, fired first and did not bring "
                f"it back): NVRx's in-process watchdog ends pid {process.pid} with SIGTERM, and "
                f"SIGKILL {grace:g} s later"))
        except OSError:  # no event log to write: the kill goes ahead all the same
            pass
        return kill(process, termination_grace_time, *args, **kwargs)

    record_then_kill.records_watchdog_kills = True
    monitor_process.terminate_process = record_then_kill


def restart_health_check(wrapper) -> Optional[Any]:
    """From 0.5, the check a restart runs: the wrapper's `health_check`, then NVML GPU, NVLink and
    NIC checks. None before 0.5, where the wrapper's `health_check` runs at restarts too."""
    return getattr(wrapper, "restart_health_check", None) if NVRX_VERSION >= (0, 5) else None


def interruption_records(call_wrapper, iteration: int) -> list[tuple[int, str]]:
    """What interrupted iteration `iteration` of the Wrapper, as (rank, NVRx's interruption name
    in lower case: "exception", "soft_timeout", ...), in the order recorded; [] where this
    NVRx keeps no such records or the store cannot be read. The records live in the Wrapper's
    store under the iteration's prefix (0.4.1 through 0.7)."""
    store = getattr(call_wrapper, "base_store", None)
    if store is None:
        return []
    try:
        from nvidia_resiliency_ext.inprocess.store import PrefixStore

        records = PrefixStore(iteration, store).get_interruption_records()
    except Exception:  # a store gone with the failure: the abort is stamped without a cause
        log.debug("no interruption records for iteration %s", iteration, exc_info=True)
        return []
    return [(r.rank, r.interruption.name.lower()) for r in records]


def watch_worker_failures(launcher, report: Callable[[list[dict]], None]) -> None:
    """Call `report` with the failed workers ({rank, local_rank, pid, exit_code, signal}) each
    time ft_launcher's agent finds one (before it restarts the group), once per worker. The
    agent names only the first failure it finds: every other worker already dead by then is
    added, from the agent's process context, so that a rank killed at the same moment as a
    peer that then raised is not missed. `launcher` is NVRx's launcher module; its agent class
    and `_monitor_workers` are the same from 0.4.1 to 0.7."""
    agent = getattr(launcher, "LocalElasticAgent", None)
    monitor = getattr(agent, "_monitor_workers", None)
    if monitor is None or getattr(monitor, "reports_failures", False):
        log.warning("ft_launcher's agent has no _monitor_workers: worker failures go unrecorded")
        return
    reported: set[int] = set()

    @functools.wraps(monitor)
    def monitor_and_report(self, worker_group):
        result = monitor(self, worker_group)
        failures = getattr(result, "failures", None) or {}
        if failures:
            dead = {rank: (f.local_rank, f.pid, f.exitcode) for rank, f in failures.items()}
            with contextlib.suppress(Exception):  # the agent's internals: best effort
                dead = {**_dead_workers(self, worker_group), **dead}
            new = sorted((rank, w) for rank, w in dead.items() if w[1] not in reported)
            reported.update(w[1] for _, w in new)
            if new:
                report([{"rank": rank, "local_rank": local_rank, "pid": pid, "exit_code": code,
                         "signal": signal.Signals(-code).name if code is not None and code < 0
                         else None} for rank, (local_rank, pid, code) in new])
        return result

    monitor_and_report.reports_failures = True
    agent._monitor_workers = monitor_and_report


def _dead_workers(agent, worker_group) -> dict[int, tuple[int, int, int]]:
    """global rank -> (local rank, pid, exit code) of the group's workers that have exited with
    a failure, from the agent's process context: forked workers (multiprocessing processes)
    or command-line ones (subprocess handlers)."""
    context = agent._pcontext
    procs = getattr(getattr(context, "_pc", None), "processes", None)
    if procs is None:
        handlers = getattr(context, "subprocess_handlers", {})
        procs = [handlers[i].proc for i in sorted(handlers)]
    out = {}
    for local_rank, proc in enumerate(procs):
        code = proc.exitcode if hasattr(proc, "exitcode") else proc.poll()
        if code not in (None, 0):
            worker = worker_group.workers[local_rank]
            out[worker.global_rank] = (local_rank, proc.pid, code)
    return out


def watch_heartbeat_timeouts(report: Callable[[int, int], None]) -> None:
    """Call `report(rank, pid)` when one of ft_launcher's rank monitors finds a rank's heartbeat
    timed out, before it kills the rank. The monitors are forked from the launcher (0.4.1
    through 0.7), so a patch made here reaches them."""
    from nvidia_resiliency_ext.fault_tolerance.rank_monitor_server import RankMonitorServer

    handle = getattr(RankMonitorServer, "_handle_timeout", None)
    if handle is None or getattr(handle, "reports_timeouts", False):
        return
    reported: set[int] = set()  # the monitor checks again until the kill has taken effect

    @functools.wraps(handle)
    async def report_then_handle(self):
        info = self.rank_info
        if info is not None and info.pid not in reported:
            reported.add(info.pid)
            with contextlib.suppress(Exception):  # the record must never stop the kill
                report(int(info.global_rank), info.pid)  # NVRx keeps the rank as a string
        await handle(self)

    report_then_handle.reports_timeouts = True
    RankMonitorServer._handle_timeout = report_then_handle
