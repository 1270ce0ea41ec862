"""In-process restart: NVRx's Wrapper re-enters the training function after a fault.

The process, its CUDA context, the checkpoint writer and the host snapshot buffers survive; only
the process group is rebuilt. Two details make it work for real:
- the loop pings the wrapper every step, so a rank stuck in Python (a hang) goes stale and is
  aborted after the soft timeout; NVRx's automatic progress stamp alone keeps ticking in Python;
- progress stamps reach NVRx's monitor less often than it checks (see build_wrapper), or it never
  checks; and the loop waits for the GPU without holding the GIL (train.wait_for_device);
- the world may only shrink down to --min_world_size (default: not at all), so a lost process
  ends the job with a clear error instead of training on with a different batch;
- set-up and tear-down run as phases (trainer.phases), outside the progress timeouts;
- an error that no restart can fix ends the job at once (`Attempts`).
"""

# No `from __future__ import annotations`: NVRx finds the CallWrapper parameter by its real annotation.

import gc
import os
import time
from datetime import timedelta
from typing import Optional

import torch
from nvidia_resiliency_ext.inprocess.store import StoreMixin

from config.contract import inprocess_ports
from trainer.accounting.events import Detection, EventLog
from trainer.config import TrainConfig
from trainer.errors import ConfigError, FinalError
from trainer.distributed import DistEnv, dist_env
from trainer.hooks import Hooks
from trainer.lifetime import process_start
from trainer.loop.train import run
from trainer.nvrx_compat import (interruption_records, record_watchdog_kills,
                                          restart_health_check)
from trainer.phases import PhaseTimeout
from trainer.recovery.stores import external, round_key
from trainer.termination import PeerTerminating


# NVRx's names of what interrupted a rank, in the event log's words (accounting.events.Detection).
INTERRUPTIONS = {"exception": Detection.EXCEPTION, "base_exception": Detection.EXCEPTION,
                 "soft_timeout": Detection.SOFT_TIMEOUT, "hard_timeout": Detection.HARD_TIMEOUT,
                 "terminated": Detection.PROCESS_DEATH, "unresponsive": Detection.HEARTBEAT_TIMEOUT,
                 "monitor_process_exception": Detection.MONITOR_ERROR}


class RecordAbort:
    """Stamps the moment the Wrapper decided to restart (detection), with what it saw: the
    ranks interrupted and how (a rank's exception, its soft or hard timeout, a dead or silent
    rank), as NVRx recorded them for this iteration. The Wrapper's store is known once the
    first attempt runs (`watch`)."""

    def __init__(self, events: EventLog) -> None:
        self.events = events
        self.call_wrapper = None

    def watch(self, call_wrapper) -> None:
        self.call_wrapper = call_wrapper

    def abort(self):
        from nvidia_resiliency_ext.inprocess.abort import Abort

        recorder = self

        class Record(Abort):
            def __call__(self, state):
                records = interruption_records(recorder.call_wrapper, state.iteration)
                recorder.events.emit("abort", iteration=state.iteration, interruptions=[
                    [rank, INTERRUPTIONS.get(name, Detection.UNKNOWN)] for rank, name in records])
                return state

        return Record()


def abort_and_handover(events: EventLog):
    """The Wrapper's abort of the process groups (`recovery.abort`: the registry emptied at once,
    the groups aborted and shut down on a thread of their own), stamped twice: `pg_aborted` when
    the restart may go on, `pg_abort_done` with what the aborts took in the background; and a
    finalize that stamps when the main thread takes up the restart (after the monitor thread
    hands over). Between the Wrapper's decision (`abort`) and its restart health check, these
    split what an in-process restart spends inside NVRx."""
    from nvidia_resiliency_ext.inprocess.abort import Abort
    from nvidia_resiliency_ext.inprocess.finalize import Finalize

    from trainer.recovery.abort import abort_process_groups

    class BackgroundAbort(Abort):
        def __call__(self, state):
            iteration = state.iteration
            abort_process_groups(done=lambda s: events.emit(
                "pg_abort_done", iteration=iteration, seconds=round(s, 4)))
            events.emit("pg_aborted", iteration=iteration)
            return state

    class Handover(Finalize):
        def __call__(self, state):
            events.emit("handover", iteration=state.iteration)
            return state

    return BackgroundAbort(), Handover()


def _connect_while_rank_lives(host: str, port: int, rank_pid: int, timeout: timedelta) -> None:
    """In NVRx's monitor process: wait until the store's host answers, and give up once the
    monitored rank is gone. The monitor connects only after its rank has joined the store, but
    a job killed in that instant takes the host with it; a plain client would then retry for
    the store's whole timeout (60 s and more), a process left behind by a killed job."""
    deadline = time.monotonic() + timeout.total_seconds()
    while True:
        try:
            torch.distributed.TCPStore(host, port, is_master=False, wait_for_workers=False,
                                       timeout=timedelta(seconds=1))
            return
        except (RuntimeError, OSError):  # torch raises DistStoreError, a RuntimeError
            if process_start(rank_pid) is None or time.monotonic() > deadline:
                raise RuntimeError(f"the in-process store at {host}:{port} does not answer and "
                                   f"its rank (pid {rank_pid}) is gone") from None
            time.sleep(0.1)


class RankHostedWrapperStore(torch.distributed.TCPStore, StoreMixin):
    """The Wrapper's store, hosted by rank 0 on MASTER_ADDR, as NVRx's own TCPStore is; built
    by name from `store_kwargs` in the rank and in NVRx's monitor process.

    In the monitor it is a client, and connects only while its rank lives
    (`_connect_while_rank_lives`). NVRx's TCPStore chooses the host by the RANK variable, which
    the monitor inherits: rank 0's monitor, finding the port free because rank 0 had just died,
    hosted the store itself and waited the whole timeout for ranks that were gone."""

    HOST_RANK = 0

    def __init__(self, port: int, timeout: timedelta, rank_pid: int) -> None:
        host, world_size = os.environ["MASTER_ADDR"], int(os.environ["WORLD_SIZE"])
        if os.getpid() != rank_pid:  # NVRx's monitor process
            _connect_while_rank_lives(host, port, rank_pid, timeout)
            super().__init__(host, port, world_size, is_master=False, timeout=timeout,
                             wait_for_workers=False)
            return
        # As NVRx's: every rank counts itself in, and the host waits until all have.
        common = dict(host_name=host, port=port, world_size=world_size, timeout=timeout,
                      wait_for_workers=True)
        if int(os.environ["RANK"]) == self.HOST_RANK:
            try:
                super().__init__(is_master=True, **common)
                return
            except RuntimeError:  # the port is taken: a client of its holder, as NVRx's
                pass
        super().__init__(is_master=False, **common)

    @property
    def critical_ranks(self):
        return (self.HOST_RANK,)  # its loss is every rank's


class ExternalWrapperStore(torch.distributed.PrefixStore, StoreMixin):
    """The Wrapper's store in the run's store process (`--external_store`): a client, so no rank
    hosts it and none is critical to it (NVRx's TCPStore makes rank 0 host it, and its loss
    every rank's), under this rendezvous round's prefix, since the store outlives the workers.
    Built by name from `store_kwargs` in the rank and in NVRx's monitor process (which connects
    only while its rank lives, `_connect_while_rank_lives`)."""

    def __init__(self, host_name: str, port: int, prefix: str, timeout: timedelta,
                 rank_pid: int) -> None:
        if os.getpid() != rank_pid:
            _connect_while_rank_lives(host_name, port, rank_pid, timeout)
        super().__init__(prefix, torch.distributed.TCPStore(
            host_name, port, is_master=False, wait_for_workers=False, timeout=timeout))


def wrapper_store(port: int, timeout_s: float) -> tuple[type, dict]:
    """The Wrapper's store_factory and store_kwargs, built in the rank: a store hosted by rank
    0; with the run's store process, a client of it."""
    kwargs = {"port": port, "timeout": timedelta(seconds=timeout_s), "rank_pid": os.getpid()}
    where = external()
    if where is None:
        return RankHostedWrapperStore, kwargs
    return ExternalWrapperStore, {**kwargs, "host_name": where[0],
                                  "prefix": f"nvrx-eks/wrapper/{round_key()}/"}


def app_store(port: int, env: DistEnv, timeout_s: float) -> torch.distributed.Store:
    """The trainer's own store across in-process attempts: hosted by rank 0 on MASTER_ADDR, or
    a client of the run's store process under this round's prefix."""
    where = external()
    if where is None:
        return torch.distributed.TCPStore(
            os.environ["MASTER_ADDR"], port, env.world_size, env.rank == 0,
            timeout=timedelta(seconds=timeout_s), wait_for_workers=False, multi_tenant=True)
    client = torch.distributed.TCPStore(where[0], port, is_master=False, wait_for_workers=False,
                                        timeout=timedelta(seconds=timeout_s))
    return torch.distributed.PrefixStore(f"nvrx-eks/app/{round_key()}", client)


def _timed_checks(events: EventLog, which: str, check):
    """`check` (a health check or NVRx Compose of them) run in NVRx's order, stamping what each
    part cost: on GPUs every restart runs NVML checks, and their cost is part of the restart's."""
    from nvidia_resiliency_ext.inprocess.health_check import HealthCheck

    def parts(c) -> list:  # Compose(a, b) runs b, then a
        if not hasattr(c, "instances"):
            return [c]
        return [p for i in reversed(c.instances) for p in parts(i)]

    class TimedChecks(HealthCheck):
        def __init__(self, checks: list) -> None:
            self.checks = checks
            # as a Compose's: the wrapper's restart chain takes the parts, not this
            self.instances = tuple(reversed(checks))

        def __call__(self, state):
            seconds = {}
            for c in self.checks:
                t0 = time.perf_counter()
                state = c(state)
                seconds[type(c).__name__] = round(time.perf_counter() - t0, 4)
            events.emit("health_check", which=which, seconds=seconds)
            return state

    return TimedChecks(parts(check))


def _hold_nvml() -> None:
    """NVML's init is reference-counted and its first init is the costly one: holding one open
    for the process's life makes the init and shutdown of each restart's NVML checks cheap."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no NVML here: NVRx's checks then skip themselves the same way
        pass


def build_wrapper(cfg: TrainConfig, env: DistEnv, events: EventLog, recorder: RecordAbort):
    import nvidia_resiliency_ext.inprocess as inprocess
    checks = [inprocess.health_check.FaultCounter(max_rank_faults=cfg.inprocess_max_restarts)]
    if env.device.type == "cuda":
        checks.insert(0, inprocess.health_check.CudaHealthCheck(timeout=timedelta(seconds=30)))
        _hold_nvml()
    health = _timed_checks(events, "health_check", inprocess.Compose(*checks))
    wrapper_port, app_port = inprocess_ports(os.environ)
    min_world = cfg.min_world_size or env.world_size
    record_watchdog_kills(events, cfg.soft_timeout, cfg.hard_timeout)
    store_factory, store_kwargs = wrapper_store(wrapper_port, cfg.barrier_timeout)
    abort, handover = abort_and_handover(events)
    wrapper = inprocess.Wrapper(
        store_factory=store_factory, store_kwargs=store_kwargs,
        initialize=inprocess.initialize.RetryController(
            max_iterations=cfg.inprocess_max_restarts + 1, min_world_size=min_world),
        abort=inprocess.Compose(abort, recorder.abort()),  # the recorder first
        finalize=handover,
        health_check=health,
        rank_assignment=inprocess.Compose(inprocess.rank_assignment.ActivateAllRanks(),
                                          inprocess.rank_assignment.ShiftRanks()),
        # NVRx's monitor process checks the timeouts only when its message queue stays empty
        # for one monitor interval; progress stamps arriving at least that often (its default:
        # both 1 s) starve the check and a hang is never detected. Stamps every 2 s against a
        # 0.5 s check interval (and throttled pings, see hooks.Hooks) leave it room.
        monitor_process_interval=timedelta(seconds=0.5),
        progress_watchdog_interval=timedelta(seconds=2.0),
        # A peer's exception reaches every rank's monitor thread at once (a store wait, in
        # chunks of monitor_thread_interval); the thread then waits last_call_wait for other
        # ranks' failures before it aborts. That wait is all of the detection time: 0.05 s
        # stamped on GPUs (NVRx's default, 1 s). Failures further apart restart twice.
        monitor_thread_interval=timedelta(seconds=0.25),
        last_call_wait=timedelta(seconds=0.05),
        soft_timeout=timedelta(seconds=cfg.soft_timeout),
        hard_timeout=timedelta(seconds=cfg.hard_timeout),
        heartbeat_timeout=timedelta(seconds=min(30.0, cfg.barrier_timeout / 2)),
        barrier_timeout=timedelta(seconds=cfg.barrier_timeout),
        completion_timeout=timedelta(seconds=cfg.completion_timeout),
    )
    restart_check = restart_health_check(wrapper)
    if restart_check is not None:  # NVRx 0.5+; its NVML checks fail on CPU ranks
        wrapper.restart_health_check = _timed_checks(
            events, "restart_health_check", restart_check if env.device.type == "cuda" else health)
    return wrapper, app_port


class Attempts:
    """Ends the job when restarting cannot help: an error no restart fixes (a bad setting, a
    phase past its bound), a stop with ranks that got SIGTERM (they are leaving the job: the
    launcher or the Job restarts this one), or the same error again from an attempt that
    trained no step after one that also trained none. One clear error then, instead of a
    restart storm up to the iteration limit."""

    FATAL = (ConfigError, FinalError, PhaseTimeout, PeerTerminating)

    def __init__(self) -> None:
        self.last: Optional[str] = None  # cause of the previous failed attempt, if it trained nothing

    def failed(self, exc: BaseException, steps_done: int, events: EventLog) -> None:
        from nvidia_resiliency_ext.inprocess.exception import RestartAbort

        cause = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        final = isinstance(exc, self.FATAL) or (steps_done == 0 and cause == self.last)
        self.last = cause if steps_done == 0 else None
        if final:
            why = "not retried" if isinstance(exc, self.FATAL) else \
                "failed again before training a step; not retried"
            events.emit("error", type=type(exc).__name__, message=f"{cause} ({why})",
                        fatal=True)
            raise RestartAbort(f"{cause} ({why})") from exc


def run_inprocess(cfg: TrainConfig, env0: DistEnv, events: EventLog,
                  hooks: Optional[Hooks] = None) -> dict:
    """Train under the in-process Wrapper; returns the successful attempt's summary."""
    import nvidia_resiliency_ext.inprocess as inprocess

    recorder = RecordAbort(events)
    wrapper, app_port = build_wrapper(cfg, env0, events, recorder)
    base = hooks or Hooks()

    def attempt(call_wrapper: Optional[inprocess.CallWrapper] = None) -> dict:
        env = dist_env(cfg.device)  # ranks may have been reassigned
        events.rank = env.rank
        iteration = call_wrapper.iteration if call_wrapper else 0
        recorder.watch(call_wrapper)
        events.emit("attempt_start", iteration=iteration)
        if base.process.app_store is None:
            base.process.app_store = app_store(app_port, env, cfg.barrier_timeout)
        store = torch.distributed.PrefixStore(f"attempt{iteration}", base.process.app_store)
        hooks = base.for_attempt(iteration, store, call_wrapper.ping)
        try:
            return run(cfg, env, events, hooks)
        except Exception as exc:  # this rank's failure, where it is detected
            events.emit("error", type=type(exc).__name__, message=str(exc)[:500])
            attempts.failed(exc, hooks.steps_done, events)
            raise

    attempts = Attempts()
    # Every restart, NVRx runs full garbage collections until one finds nothing: passes over all
    # of torch's objects (0.17 s each on a CPU). Frozen, what exists by now
    # (imports, the store) is skipped; what an attempt leaves behind is still collected.
    gc.freeze()
    return wrapper(attempt)()
