"""How often to snapshot: the smallest interval whose snapshots cost at most 1 % of throughput.

A snapshot copies the rank's whole training state to host memory. Where a step's compute is
longer than that copy, the copy hides under it; where it is shorter (a small model, short
sequences, many ranks per host) a snapshot of every step caps the step at the copy: one H200
trained llama-1b at batch 1 at 42 % of its throughput with a snapshot of every step.

With `--snapshot_interval auto` (the default) each attempt measures, after `WARMUP_STEPS`
steps: `PROBE_STEPS` steps without a snapshot, then `PROBE_STEPS` snapshots `PROBE_GAP` steps
apart. A snapshot's cost is what the steps after it took beyond the steps without, until the
next one, plus the host's time taking it (`Tiers.after_step`). Every rank then takes the interval k = ceil(cost / (1 % of a
step)), agreed by one all-reduce of two numbers (the largest cost and step time of any rank), so
every rank snapshots the same steps. Until then no snapshot is taken but the probe's: a fault
in an attempt's first `WARMUP_STEPS + PROBE_STEPS` steps resumes from an older state.

A fixed interval is honoured exactly. Where it leaves steps without a snapshot before them
(k > 1), the same figures come from the steps as they run, and an interval that costs more than
`WARN_PCT` is warned about once; a snapshot of every step leaves nothing to compare with, and
`bench.run throughput` measures it against runs without. Rank 0 says what was measured and
chosen, and what a fault is then expected to lose (half an interval of steps); `results.json`
keeps it (`snapshot_cadence`). CheckFreq (FAST '21) likewise tunes its checkpoint frequency
online against an overhead bound; Young and Daly's interval, sqrt(2 x MTBF x cost), needs a
failure rate, which a run learns only from its faults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

import torch
import torch.distributed as dist

WARMUP_STEPS = 2  # the first steps build kernels, caches and allocator pools
PROBE_STEPS = 3  # steps measured without a snapshot, and snapshots measured
PROBE_GAP = 4  # steps between the probe's snapshots: a copy drained to the host in the
# background (device staging) slows the steps after it, and all of them count
BOUND_PCT = 1.0  # what `auto` lets snapshots cost
WARN_PCT = 5.0  # what a fixed interval may cost before it is warned about


@dataclass
class Cadence:
    """The snapshot steps of one attempt, starting after step `start`."""

    setting: Union[int, str]  # --snapshot_interval: a number of steps, or "auto"
    start: int
    device: torch.device
    log: Callable[[str], None] = print
    interval: Optional[int] = None  # None while measuring
    plain: list[float] = field(default_factory=list)  # step times without a snapshot before
    after: list[float] = field(default_factory=list)  # step times right after a snapshot
    taking: list[float] = field(default_factory=list)  # host seconds taking each snapshot
    figures: dict = field(default_factory=dict)  # what was measured and chosen
    _snapshot_before: Optional[int] = None  # the newest step a snapshot was taken after

    @property
    def _probe_end(self) -> int:
        return self.start + WARMUP_STEPS + PROBE_STEPS + PROBE_STEPS * PROBE_GAP

    def __post_init__(self) -> None:
        if self.setting != "auto":
            self.interval = int(self.setting)

    def due(self, step: int) -> bool:
        """Whether to snapshot after `step` (a durable checkpoint or the last step aside)."""
        if self.setting != "auto":
            return step % self.interval == 0
        r = step - self.start - WARMUP_STEPS - PROBE_STEPS
        if self.interval is None:  # measuring: the probe's snapshots, PROBE_GAP steps apart
            return 0 <= r < PROBE_STEPS * PROBE_GAP and r % PROBE_GAP == 0
        return (step - self._probe_end) % self.interval == 0

    def observe(self, step: int, dt: float, snapshot_s: float, snapshotted: bool) -> None:
        """A step's figures as the loop reports them (in step order, on every rank alike)."""
        if self.figures:
            return
        if self.setting != "auto":
            self._observe_fixed(step, dt, snapshot_s, snapshotted)
            return
        r = step - self.start
        if r <= WARMUP_STEPS:
            return
        if r <= WARMUP_STEPS + PROBE_STEPS:
            self.plain.append(dt)
        else:
            self.after.append(dt)
        if snapshotted and r >= WARMUP_STEPS + PROBE_STEPS:
            self.taking.append(snapshot_s)
        if step == self._probe_end:
            self._decide(snapshots=PROBE_STEPS)

    def _observe_fixed(self, step: int, dt: float, snapshot_s: float, snapshotted: bool) -> None:
        """A fixed interval: sort the steps into those after a snapshot and those not, until
        there are `PROBE_STEPS` of each (never, with a snapshot of every step)."""
        after = self._snapshot_before == step - 1
        if snapshotted:
            self._snapshot_before = step
        if step - self.start <= WARMUP_STEPS:
            return
        (self.after if after else self.plain).append(dt)
        if snapshotted:
            self.taking.append(snapshot_s)
        if len(self.plain) >= PROBE_STEPS and len(self.after) >= PROBE_STEPS:
            self._decide(snapshots=len(self.after))

    def _decide(self, snapshots: int) -> None:
        """Cost of one snapshot: what the steps measured after snapshots took beyond as many
        steps without, shared among the `snapshots` snapshots, plus the host's time taking one."""
        step_s = sum(self.plain) / len(self.plain)
        extra = sum(self.after) - step_s * len(self.after)
        taking = sum(self.taking) / len(self.taking) if self.taking else 0.0
        cost = max(0.0, extra / snapshots) + taking
        if self.setting == "auto" and dist.is_initialized():  # one interval on every rank
            both = torch.tensor([cost, step_s], dtype=torch.float64,
                                device=self.device if self.device.type == "cuda" else "cpu")
            dist.all_reduce(both, op=dist.ReduceOp.MAX)
            cost, step_s = both.tolist()
        auto = self.setting == "auto"
        needed = max(1, math.ceil(cost / (BOUND_PCT / 100 * step_s))) if step_s > 0 else 1
        self.interval = needed if auto else int(self.setting)
        overhead = 100 * cost / (self.interval * step_s) if step_s > 0 else 0.0
        self.figures = {"interval": self.interval, "auto": auto, "step_s": round(step_s, 5),
                        "snapshot_cost_s": round(cost, 5), "overhead_pct": round(overhead, 3),
                        "interval_for_1pct": needed,
                        "expected_loss_steps": self.interval / 2,
                        "expected_loss_s": round(self.interval / 2 * step_s, 4),
                        "measured_steps": PROBE_STEPS}
        line = (f"snapshots every {self.interval} step(s) ({'auto' if auto else 'fixed'}): a "
                f"snapshot costs {cost:.3f} s against a {step_s:.3f} s step, {overhead:.2f} % of "
                f"throughput; a fault loses {self.interval / 2:g} steps "
                f"({self.interval / 2 * step_s:.2f} s) on average")
        self.log(line)
        if not auto and overhead > WARN_PCT:
            self.log(f"warning: --snapshot_interval {self.setting} costs {overhead:.1f} % of "
                     f"throughput (measured); --snapshot_interval {needed} (or auto) would keep "
                     f"it under {BOUND_PCT:g} %")
