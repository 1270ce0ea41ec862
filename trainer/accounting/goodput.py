"""Goodput from the event log alone, in one pass over it: what the run achieved, where the time
went, and every failure.

Definitions (also in the README):
- wall_seconds: first process start (`launch`) to the end of training (`train_end`).
- step_time: median duration of steps that are neither checkpoint steps nor the first step
  of an attempt - the fault-free step time (durations taken to 4 significant digits, so that
  the median needs memory for distinct values, not for every step).
- useful steps: the steps that survive into the final model (each step number counted once,
  from where this run started); replayed steps are not useful.
- training_goodput_pct = 100 * useful_steps * step_time / wall_seconds.
- a failure (one faults[] entry) is everything from the moment something failed until training
  is productive again: its evidence (an injected fault, a rank's exception, a layer's
  detection: the Wrapper's abort, the launcher's dead worker or heartbeat timeout, the job
  runner's failed launcher) and the restarts it took (in-process re-entries, worker-group
  restarts, whole-job restarts), up to the first step completed after training resumed. A
  restart with no evidence before it (a node lost, the pods restarted) is a failure too.
- per failure: recovery_seconds = failure -> first step completed after it (the step event's
  `done`: on GPUs the event itself is written one step later); the breakdown stamps detection,
  restart, process group ready, state loaded, first step; steps_lost = last step completed
  before training resumed - step resumed from.
- infra_goodput_pct = 100 * (wall - sum of failure -> training resumed) / wall.
- training_efficiency_pct = 100 * (1 - B / (S + B)), the share of the training loop's time not
  blocked by checkpointing: B = seconds the loop spent after its steps taking snapshots and
  checkpoints, S = the sum of step times.
- loop_step_seconds: mean step time plus stall over the steps (each attempt's first left out).
  It counts what blocking leaves out, steps slowed by a background write; the benchmark
  divides a run without checkpoints' figure by it (throughput_vs_no_checkpoint_pct).
  The save at the end of training and the final wait for the last background write are reported
  apart (checkpoint.final_seconds): they end a run, they do not slow its steady state.

The pass (`Goodput`) can be asked for its figures at any moment: results.json asks once at the
end (`summarize`), a live view while the run trains.

Memory: the pass keeps running sums, the distinct step durations, a window of the last steps
(a checkpoint's event may come a step after its step's), the last event time per rank, and the
evidence of the failure in progress; never the log.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from trainer.accounting.events import Detection

# Events after a failure, in the order a recovery passes through them.
# A failed worker's own way out (ft_launcher); NVRx's abort of the process group, the main
# thread taking up the restart and the restart health check (in-process); then both.
_PHASES = (("left", ("leaving",)), ("aborted", ("pg_aborted",)), ("handed_over", ("handover",)),
           ("health_checked", ("health_check",)),
           ("restarted", ("launch", "attempt_start")),
           ("imported", ("imported",)),
           ("pg_ready", ("pg_ready",)),
           ("model_ready", ("model_ready",)),
           ("buffers_ready", ("buffers_ready",)),
           ("loaded", ("ckpt_load", "snapshot_load", "train_start")))
_PHASE_OF = {name: phase for phase, names in _PHASES for name in names}
# Detection events, by the layer that detected: the Wrapper, the launcher, the job runner.
_DETECTORS = {"abort": "inprocess", "workers_failed": "launcher", "heartbeat_timeout": "launcher",
              "nodes_lost": "launcher", "node_silent": "launcher", "worker_failed": "job"}
# A restore's tiers, fastest first: a failure was restored from the slowest one any rank used.
_TIERS = ("memory", "node", "peer", "durable")
# How a restart that no evidence preceded was detected: by the restart itself.
_SILENT_RESTART = {"job": Detection.JOB_RESTART, "launcher": Detection.PROCESS_DEATH}
STEP_WINDOW = 16  # step events a checkpoint's event may trail its step's by
SIGNIFICANT_DIGITS = 4


def _done(step: dict) -> float:
    """When a step's work completed: on GPUs its event is written one step later, when the
    figures are read back (older event logs have only that time)."""
    return step.get("done") or step["t"]


class Median:
    """The median of a stream of durations, each taken to SIGNIFICANT_DIGITS digits."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self.n = 0

    def add(self, x: float) -> None:
        if math.isfinite(x):
            self.counts[float(f"{x:.{SIGNIFICANT_DIGITS}g}")] += 1
            self.n += 1

    def value(self) -> Optional[float]:
        if not self.n:
            return None
        lo, hi = (self.n - 1) // 2, self.n // 2  # the middle one or two, as statistics.median
        seen, low = 0, None
        for x in sorted(self.counts):
            seen += self.counts[x]
            if low is None and seen > lo:
                low = x
            if seen > hi:
                return (low + x) / 2
        raise AssertionError("unreachable")


class _SteadySteps:
    """Step durations of the steady state: not an attempt's first step, not a checkpoint step.
    A checkpoint's event may come before or after its step's, so steps wait in a short window
    before they count."""

    def __init__(self) -> None:
        self.pending: deque[tuple[int, float]] = deque()
        self.ckpt_steps: deque[int] = deque(maxlen=STEP_WINDOW)
        self.steady = Median()

    def step(self, step: int, dt: float) -> None:
        if step not in self.ckpt_steps:
            self.pending.append((step, dt))
        while len(self.pending) > STEP_WINDOW:
            self.steady.add(self.pending.popleft()[1])

    def checkpoint(self, step: int) -> None:
        if not self.ckpt_steps or self.ckpt_steps[-1] != step:  # every rank saves each step
            self.ckpt_steps.append(step)
        self.pending = deque(p for p in self.pending if p[0] != step)

    def median(self) -> Optional[float]:
        """The median so far, the steps still waiting in the window counted; nothing changes,
        so the pass can go on (a live view asks while the run trains)."""
        if not self.pending:
            return self.steady.value()
        now = Median()
        now.counts, now.n = self.steady.counts.copy(), self.steady.n
        for _, dt in self.pending:
            now.add(dt)
        return now.value()


@dataclass
class _Evidence:
    """What one layer saw one way (how), and the ranks it named."""
    t: float
    layer: str
    how: str
    ranks: set = field(default_factory=set)


@dataclass
class _Failure:
    """A failure in progress, from its first evidence to the first step after training resumed.
    `last_seen` (rank -> its last event before the failure) is the caller's, left unchanged
    while the failure lasts."""
    opened: float
    last_step_t: Optional[float]  # the last step completed before it, when every rank was alive
    step_in_flight: int
    last_seen: dict
    injected: list = field(default_factory=list)
    errors: dict = field(default_factory=dict)  # rank -> (t, "rank r: Type: message"), its first
    evidence: dict = field(default_factory=dict)  # (layer, how) -> _Evidence
    deaths: dict = field(default_factory=dict)  # rank -> (exit code, signal name) of its process
    left: set = field(default_factory=set)  # ranks that left because a peer failed
    named: dict = field(default_factory=dict)  # rank -> (t, how) a layer first named it
    restarts: list = field(default_factory=list)
    phases: dict = field(default_factory=dict)
    tiers: set = field(default_factory=set)  # of the loads since the last restart
    resumed: Optional[dict] = None  # rank 0's last train_start
    leftovers: Optional[dict] = None  # rank 0's view, as its next in-process attempt starts
    done_before_resume: int = 0

    def note(self, e: dict) -> None:
        """Fold one event of the failure's window into its evidence."""
        name = e["event"]
        if name == "fault":
            self.injected.append({"step": e.get("step"), "rank": e["rank"], "type": e.get("type"),
                                  "t": e["t"]})
        elif name == "error":
            self.errors.setdefault(e["rank"], (e["t"], f"rank {e['rank']}: {e['type']}: {e['message']}"))
        elif name == "peer_failed":
            self.left.add(e["rank"])
        elif name == "abort":
            records = [r for r in e.get("interruptions") or [] if isinstance(r, list) and len(r) == 2]
            for rank, how in records or [(None, Detection.UNKNOWN)]:
                self._add(e["t"], "inprocess", str(how), rank)
        elif name == "workers_failed":
            for f in (f for f in e.get("failures") or [] if isinstance(f, dict)):
                self._add(e["t"], "launcher", Detection.PROCESS_DEATH, f.get("rank"))
                self.deaths.setdefault(f.get("rank"), (f.get("exit_code"), f.get("signal")))
        elif name == "heartbeat_timeout":
            self._add(e["t"], "launcher", Detection.HEARTBEAT_TIMEOUT, e.get("failed_rank"))
        elif name == "nodes_lost":
            self._add(e["t"], "launcher", Detection.NODE_LOST, None)
        elif name == "node_silent":  # a rank's watch of its neighbour node (`nodewatch`)
            self.left.add(e["rank"])  # the watcher leaves because of that node
            for rank in e.get("ranks") or [None]:
                self._add(e["t"], "launcher", Detection.NODE_LOST, rank)
        elif name == "worker_failed":
            self._add(e["t"], "job", Detection.PROCESS_DEATH, None)
            self.deaths.setdefault(None, (e.get("exit_code"), None))
        elif name == "leftovers" and e["rank"] == 0:
            self.leftovers = e
        if name in _PHASE_OF:
            self.phases.setdefault(_PHASE_OF[name], e["t"])
        if name in ("ckpt_load", "snapshot_load") and e.get("tier"):
            self.tiers.add(e["tier"])

    def _add(self, t: float, layer: str, how: str, rank: Optional[int]) -> None:
        ev = self.evidence.setdefault((layer, how), _Evidence(t, layer, how))
        if isinstance(rank, int):
            ev.ranks.add(rank)
            self.named.setdefault(rank, (t, how))

    def restart(self, layer: str) -> None:
        self.restarts.append(layer)
        self.tiers = set()

    def resume(self, e: dict, done_so_far: int) -> None:
        self.resumed = e
        self.done_before_resume = done_so_far

    def _stopped_first(self, rank: int) -> bool:
        """Whether a layer saw `rank` stop or die before it raised anything (a rank frozen past
        its soft timeout, then killed by the watchdog, may log an error as it goes)."""
        return rank in self.named and (rank not in self.errors or
                                       self.named[rank][0] <= self.errors[rank][0])

    def _failed(self) -> list[int]:
        """The ranks the evidence names as failed, the likeliest cause first: those a layer saw
        stop or die before they raised, in the order seen (NVRx records interruptions in the
        order they came); then those that raised, in order (a peer's exception, a collective's
        timeout or a lost connection, is what usually follows a rank's death or hang). A rank
        that left because a peer failed did not fail."""
        stopped = [r for r in self.named if self._stopped_first(r)]
        raised = sorted((r for r in self.errors if r not in stopped), key=lambda r: self.errors[r])
        return [r for r in stopped + raised if r not in self.left]

    def _failure_time(self, rank: Optional[int]) -> tuple[float, str]:
        """When it failed, and from what: the injected fault; else the last sign of life before
        it (the last step completed, when every rank was alive, or a later event of the failed
        rank): the moment of a real failure is rarely written, and an exception may come long
        after it (a peer's collective timeout); else the first exception; else its detection."""
        if self.injected:
            return self.injected[0]["t"], "injected"
        own = self.last_seen.get(rank) if rank is not None else None
        if own is not None and (self.last_step_t is None or own > self.last_step_t):
            return own, "last_event_of_rank"
        if self.last_step_t is not None:
            return self.last_step_t, "last_step"
        if self.errors:
            return min(self.errors.values())[0], "exception"
        return self.opened, "detection"

    def entry(self, first_step: Optional[dict]) -> tuple[dict, float]:
        """The faults[] entry, and the seconds it cost infra goodput (failure -> resumed)."""
        evidence = sorted(self.evidence.values(), key=lambda ev: ev.t)
        first = evidence[0] if evidence else None
        failed = self._failed()
        inj = self.injected[0] if self.injected else None
        rank = inj["rank"] if inj else (failed[0] if failed else None)
        t, source = self._failure_time(rank)
        naming = next((ev for ev in evidence if rank in ev.ranks), first)
        if rank in self.errors and not self._stopped_first(rank):
            how = Detection.EXCEPTION
        elif naming is not None:
            how = naming.how
        else:  # a restart with no evidence before it
            how = _SILENT_RESTART.get((self.restarts or [""])[0], Detection.UNKNOWN)
        exit_code, sig = self.deaths.get(rank, self.deaths.get(None, (None, None)))
        detected_t = first.t if first else self.opened
        resumed = self.resumed
        entry = {
            "step": inj["step"] if inj else self.step_in_flight,
            "rank": rank,
            "type": inj["type"] if inj else None,
            "t": t,
            "t_source": source,
            "injected": [{k: f[k] for k in ("step", "rank", "type")} for f in self.injected],
            "detected_by": first.layer if first else ("rank" if self.errors else
                                                     (self.restarts or ["unknown"])[0]),
            "detection": str(how),
            "detected_seconds": detected_t - t,
            "failed_ranks": failed,
            "exit_code": exit_code,
            "signal": sig,
            "error": self.errors[rank][1] if rank in self.errors else
            (min(self.errors.values())[1] if self.errors else None),
            "restarts": list(self.restarts),
            "evidence": [{"seconds": ev.t - t, "layer": ev.layer, "how": str(ev.how),
                          "ranks": sorted(ev.ranks)} for ev in evidence],
            "breakdown_seconds": {"detected": detected_t - t, **{
                phase: (self.phases[phase] - t if phase in self.phases else None)
                for phase, _ in _PHASES}},
            "resumed_from_step": resumed["step"] if resumed else None,
            "recovery_seconds": _done(first_step) - t if (first_step and resumed) else None,
            # Steps finished before the restart (some ranks finish the faulting step's
            # neighbours after the fault) and not in the state resumed from are trained again.
            "steps_lost": max(0, self.done_before_resume - resumed["step"]) if resumed else None,
            "restored_from": max(self.tiers, key=_TIERS.index) if self.tiers else None,
            # in-process restarts: what of the failed attempt was still alive, and the device
            # memory the next attempt started from (rank 0)
            "leftovers": self.leftovers.get("alive") if self.leftovers else None,
            "device_memory": self.leftovers.get("device_memory") if self.leftovers else None,
        }
        return entry, (resumed["t"] - t if resumed else 0.0)


class _Failures:
    """Splits the stream into failures; one entry each."""

    def __init__(self) -> None:
        self.entries: list[dict] = []
        self.downtime = 0.0
        self.current: Optional[_Failure] = None
        self.last_step_t: Optional[float] = None
        self.done = 0  # the highest step completed so far
        self.last_seen: dict[int, float] = {}
        self.launcher: Optional[tuple] = None  # rank 0's last launch: (launcher id, restart count)

    def feed(self, e: dict) -> None:
        name, rank = e["event"], e["rank"]
        restart = self._restart_layer(e) if rank == 0 else None
        evidence = name in ("fault", "error", "peer_failed") or name in _DETECTORS
        if self.current is None and (evidence or restart):
            # last_seen is left as it was until the failure ends: the failure's view of it
            self.current = _Failure(e["t"], self.last_step_t, self.done + 1, self.last_seen)
        f = self.current
        if f is None:
            self.last_seen[rank] = e["t"]
        else:
            f.note(e)
            if restart:
                f.restart(restart)
            if name == "train_start" and rank == 0:
                f.resume(e, self.done)
        if name == "step":
            if f is not None and f.resumed is not None and e["t"] >= f.resumed["t"]:
                self._close(e)
            self.last_step_t = _done(e)
            self.done = max(self.done, e["step"])

    def _restart_layer(self, e: dict) -> Optional[str]:
        """The layer a rank-0 event restarted, if it is a restart: an in-process re-entry, or a
        process start after the first (by the same start of the launcher: a worker-group
        restart; by another: the whole job)."""
        if e["event"] == "attempt_start":
            return "inprocess" if e.get("iteration", 0) > 0 else None
        if e["event"] != "launch":
            return None
        now = (e.get("launcher"), e.get("launcher_restart", 0))
        before, self.launcher = self.launcher, now
        if before is None:
            return None
        if now[0] is not None and before[0] is not None:
            return "launcher" if now[0] == before[0] else "job"
        # A launcher not started by trainer.recovery.launch names no start: its restart count
        # grows with each worker-group restart and begins at 0 again in a new job.
        return "launcher" if now[1] > before[1] else "job"

    def _close(self, first_step: Optional[dict]) -> None:
        entry, down = self.current.entry(first_step)
        self.entries.append(entry)
        self.downtime += down
        self.current = None

    def so_far(self) -> tuple[list[dict], float]:
        """Every failure's entry and the downtime so far, the one in progress included, without
        closing it."""
        if self.current is None:
            return self.entries, self.downtime
        entry, down = self.current.entry(None)
        return [*self.entries, entry], self.downtime + down


@dataclass
class _Totals:
    """Running sums of the steps and checkpoints."""
    steps: _SteadySteps = field(default_factory=_SteadySteps)
    every_step: Median = field(default_factory=Median)
    stalls: float = 0.0
    step_seconds: float = 0.0
    steady_loop: float = 0.0
    steady_loop_n: int = 0
    first_of_attempt: bool = False
    start_step: Optional[int] = None
    final_step: Optional[int] = None
    saves: int = 0
    blocking: float = 0.0
    blocking_n: int = 0
    final_seconds: float = 0.0
    bytes_per_rank: int = 0
    writes: float = 0.0
    writes_n: int = 0
    last_commit: Optional[dict] = None  # the newest durable checkpoint: its ckpt_commit event

    def feed(self, e: dict) -> None:
        name, rank = e["event"], e["rank"]
        if name == "step":
            dt, stall = e.get("dt", 0.0), e.get("stall", 0.0)
            self.every_step.add(dt)
            self.stalls += stall
            self.step_seconds += dt
            self.final_step = e["step"] if self.final_step is None else max(self.final_step, e["step"])
            if self.first_of_attempt:
                self.first_of_attempt = False
            else:
                self.steps.step(e["step"], dt)
                self.steady_loop += dt + stall
                self.steady_loop_n += 1
        elif name == "train_start" and rank == 0:
            self.first_of_attempt = True
            if self.start_step is None:
                self.start_step = e["step"]
        elif name == "ckpt_save":
            self.steps.checkpoint(e["step"])
            if rank == 0:
                self.saves += 1
                self.bytes_per_rank = e.get("bytes", 0)
                if e.get("final"):
                    self.final_seconds += e["blocking_s"]
                else:
                    self.blocking += e["blocking_s"]
                    self.blocking_n += 1
        elif name == "ckpt_drain" and rank == 0:
            self.final_seconds += e["seconds"]
        elif name == "ckpt_commit":
            self.writes += e["write_s"]
            self.writes_n += 1
            self.last_commit = e


class Goodput:
    """The one pass behind every figure: `feed` it the events in time order, ask `summary` at
    any moment. results.json asks once, at the end (`summarize`); a live view (the trainer's
    TensorBoard and metrics, `watch`) asks as the events come, and nothing is computed twice."""

    def __init__(self, max_steps: int, checkpoint_interval: int):
        self.max_steps, self.checkpoint_interval = max_steps, checkpoint_interval
        self.totals, self.failures = _Totals(), _Failures()
        self.t_first = self.t_last = self.t_launch = self.t_end = None
        self.events = 0

    def feed(self, e: dict) -> None:
        t = e["t"]
        self.events += 1
        self.t_first = t if self.t_first is None else min(self.t_first, t)
        self.t_last = t if self.t_last is None else max(self.t_last, t)
        if e["event"] == "launch":
            self.t_launch = t if self.t_launch is None else min(self.t_launch, t)
        elif e["event"] == "train_end" and e["rank"] == 0:
            self.t_end = t
        self.totals.feed(e)
        self.failures.feed(e)

    @property
    def ended(self) -> bool:
        """Rank 0 has ended training (its `train_end`)."""
        return self.t_end is not None

    def summary(self) -> dict[str, Any]:
        """Every figure of results.json, from the events fed so far (a failure still in
        progress is an entry without its recovery)."""
        if self.t_first is None:
            raise ValueError("the event log is empty")
        totals = self.totals
        faults, downtime = self.failures.so_far()
        t_begin = self.t_launch if self.t_launch is not None else self.t_first
        wall = max((self.t_end if self.t_end is not None else self.t_last) - t_begin, 1e-9)
        start_step = totals.start_step or 0
        final_step = totals.final_step if totals.final_step is not None else start_step
        useful_steps = max(0, final_step - start_step)
        step_time = totals.steps.median() or totals.every_step.value() or 0.0
        loop_s = totals.step_seconds + totals.stalls
        recoveries = [f["recovery_seconds"] for f in faults if f["recovery_seconds"] is not None]
        commit = totals.last_commit or {}
        return {
            "steps_completed": final_step,
            "max_steps": self.max_steps,
            "wall_seconds": wall,
            "step_time_seconds": step_time,
            "useful_steps": useful_steps,
            "training_efficiency_pct": 100.0 * (1.0 - totals.stalls / loop_s) if loop_s else None,
            "loop_step_seconds": totals.steady_loop / totals.steady_loop_n if totals.steady_loop_n else None,
            "training_goodput_pct": 100.0 * useful_steps * step_time / wall,
            "infra_goodput_pct": 100.0 * (wall - downtime) / wall,
            "recovery_seconds_mean": sum(recoveries) / len(recoveries) if recoveries else None,
            "restarts": sum(len(f["restarts"]) for f in faults),
            "checkpoint": {
                "count": totals.saves,
                "interval": self.checkpoint_interval,
                "blocking_seconds_total": totals.blocking,
                "blocking_seconds_mean": totals.blocking / totals.blocking_n if totals.blocking_n else 0.0,
                "final_seconds": totals.final_seconds,
                "write_seconds_mean": totals.writes / totals.writes_n if totals.writes_n else 0.0,
                "bytes_per_rank": totals.bytes_per_rank,
                "last_step": commit.get("step"),
                "last_committed_at": commit.get("t"),
                "last_write_seconds": commit.get("write_s"),
            },
            "faults": faults,
        }


def summarize(events: Iterable[dict], max_steps: int, checkpoint_interval: int) -> dict[str, Any]:
    """Every figure of results.json, from one pass over `events` in time order (what
    `trainer.accounting.events.read_events` yields)."""
    run = Goodput(max_steps, checkpoint_interval)
    for e in events:
        run.feed(e)
    return run.summary()
