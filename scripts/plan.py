"""Capacity planning on paper, per node count: checkpoint sizes, host memory, what FSx must
write and what its metadata servers must do, the storage that keeps up, and recovery times.

Everything comes from the profile, the model preset's architecture numbers (no torch) and the
tables it names:
- a checkpoint holds fp32 weights and Adam's two moments, 12 bytes per parameter, split evenly
  over all ranks; FSx holds `keep_checkpoints` of them and the one being written;
- an asynchronous checkpoint must be written before the next one starts, or checkpoints queue
  up (or block training): checkpoint bytes / (checkpoint_interval x step time) is the write
  bandwidth the file system must sustain (`config.fsx` says what each one does);
- the metadata operations per checkpoint and per resume are counted from the durable store's
  code (`scripts.fsx_metadata`), the recovery times built from measured figures
  (`scripts.recovery_estimate`);
- the snapshot tiers keep shard-sized slots in host memory per rank (config.contract);
- on SIGTERM a pod commits its newest state before SIGKILL: its grace period
  (terminationGracePeriodSeconds, and the trainer's --termination_grace) holds one checkpoint
  write with a margin (`termination_grace_seconds`).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Optional, Sequence

from config import Profile, fsx
from config.contract import RecoveryMode, snapshot_bytes
from config.grace import termination_grace_seconds, write_seconds
from scripts import fsx_metadata, recovery_estimate
from scripts.recovery_estimate import Estimate

GB = 1e9
GIB = 2**30
LABEL_WIDTH = 44
COLUMN_WIDTH = 16
NOTE_WIDTH = 100


@dataclass(frozen=True)
class NodePlan:
    """One node count: one column of the table."""

    nodes: int
    ranks: int
    checkpoint_bytes_per_rank: int
    snapshot_bytes_per_rank: int
    host_bytes_per_node: int
    checkpoint_ops: fsx_metadata.PerRun
    resume_ops: fsx_metadata.PerRun
    recoveries: tuple[Estimate, ...]


@dataclass(frozen=True)
class Plan:
    model: str
    parameters: int
    checkpoint_bytes_total: int
    checkpoint_interval_steps: int
    keep_checkpoints: int
    step_seconds: Optional[float]
    node_memory_bytes: int
    current: fsx.FileSystem  # the profile's
    recommended: fsx.FileSystem
    columns: tuple[NodePlan, ...]

    @property
    def checkpoints_on_fsx(self) -> int:
        return checkpoints_on_fsx(self.keep_checkpoints)

    @property
    def interval_seconds(self) -> Optional[float]:
        return interval_seconds(self.checkpoint_interval_steps, self.step_seconds)

    @property
    def needed_write_mb_s(self) -> Optional[float]:
        return needed_write_mb_s(self.checkpoint_bytes_total, self.interval_seconds)

    def write_seconds(self, file_system: fsx.FileSystem) -> float:
        return write_seconds(self.checkpoint_bytes_total, file_system)

    @property
    def termination_grace_seconds(self) -> int:
        """SIGTERM to SIGKILL on the profile's file system."""
        return termination_grace_seconds(self.write_seconds(self.current))

    def min_step_seconds(self, file_system: fsx.FileSystem) -> Optional[float]:
        """The step time at which `file_system` just keeps up (None: no periodic checkpoints)."""
        if not self.checkpoint_interval_steps:
            return None
        return self.write_seconds(file_system) / self.checkpoint_interval_steps


def interval_seconds(interval_steps: int, step_seconds: Optional[float]) -> Optional[float]:
    """The time between checkpoints (None: no periodic checkpoints, or no step time given)."""
    return None if not interval_steps or step_seconds is None else interval_steps * step_seconds


def needed_write_mb_s(checkpoint_bytes: int, interval: Optional[float]) -> Optional[float]:
    """What the file system must write for each checkpoint to land before the next starts."""
    return None if interval is None else checkpoint_bytes / 1e6 / interval


def checkpoints_on_fsx(keep: int) -> int:
    """The kept ones, and the one being written: the next is written once it is committed."""
    return keep + 1


def floor_gib(checkpoint_bytes: int, keep: int) -> float:
    """The capacity the checkpoints take."""
    return checkpoints_on_fsx(keep) * checkpoint_bytes / GIB


def keeps_up(file_system: fsx.FileSystem, needed_mb_s: Optional[float], floor: float) -> bool:
    return file_system.capacity_gib >= floor and (needed_mb_s is None
                                                  or file_system.write_mb_s >= needed_mb_s)


def smallest_persistent(needed_mb_s: Optional[float], floor: float) -> fsx.FileSystem:
    """PERSISTENT_2 with the least capacity that keeps up, at the lowest tier that gets there:
    both cost more as they grow."""
    options = []
    for tier in fsx.PERSISTENT_2_TIERS:
        for_bandwidth = 0.0 if needed_mb_s is None else needed_mb_s / tier * 1024
        options.append((fsx.capacity_at_least(max(floor, for_bandwidth)), tier))
    capacity, tier = min(options)
    return fsx.FileSystem("PERSISTENT_2", capacity, tier)


def recommend(current: fsx.FileSystem, needed_mb_s: Optional[float], floor: float) -> fsx.FileSystem:
    """The profile's file system while it keeps up; SCRATCH_2 grown while only room is short;
    else PERSISTENT_2 (a SCRATCH_2 file system large enough to keep up has many servers, none of
    them replicated: AWS gives 50.4 TiB of it 93.9 % availability over a week)."""
    if keeps_up(current, needed_mb_s, floor):
        return current
    if not current.persistent:
        grown = fsx.FileSystem("SCRATCH_2", fsx.capacity_at_least(max(floor, current.capacity_gib)))
        if keeps_up(grown, needed_mb_s, floor):
            return grown
    return smallest_persistent(needed_mb_s, floor)


def _node_plan(profile: Profile, nodes: int, total: int, file_system: fsx.FileSystem) -> NodePlan:
    ranks = nodes * profile.gpus_per_node
    per_rank = -(-total // ranks)
    trainer = profile.trainer
    tiers = tuple(trainer.tiers) if trainer.snapshot_interval else ()
    snapshots = 0
    if tiers:
        peer = "peer" in tiers and nodes > 1
        snapshots = int(trainer.memory_budget_gib * GIB) or snapshot_bytes(
            per_rank, peer, durable=trainer.checkpoint_interval > 0)
    keep = trainer.keep_checkpoints
    recoveries = tuple(recovery_estimate.estimate(mode, tiers, per_rank, total, nodes, file_system)
                       for mode in (RecoveryMode.FT_LAUNCHER_INPROCESS, RecoveryMode.INPROCESS,
                                    RecoveryMode.FT_LAUNCHER, RecoveryMode.BASELINE))
    return NodePlan(
        nodes=nodes,
        ranks=ranks,
        checkpoint_bytes_per_rank=per_rank,
        # Per rank: the snapshot slots (checkpoints are written from one), or without the
        # tiers one staging buffer of a shard.
        snapshot_bytes_per_rank=snapshots,
        host_bytes_per_node=profile.gpus_per_node * (snapshots or per_rank),
        checkpoint_ops=fsx_metadata.checkpoint(ranks, keep),
        resume_ops=fsx_metadata.resume(ranks, keep),
        recoveries=recoveries,
    )


def make_plan(profile: Profile, nodes: Sequence[int] = (), step_seconds: Optional[float] = None) -> Plan:
    """The plan for the profile's model at each of `nodes` (default: the profile's node count)."""
    # Arithmetic on the preset's architecture numbers; trainer.loop.model imports torch only to build.
    from config.presets import PRESETS, STATE_BYTES_PER_PARAMETER, preset_parameters

    model = profile.trainer.model
    if model not in PRESETS:
        raise ValueError(f"trainer.model {model!r} is not a preset ({', '.join(PRESETS)}): cannot plan it")
    params = preset_parameters(model)
    total = params * STATE_BYTES_PER_PARAMETER
    trainer = profile.trainer
    current = profile.storage.file_system
    needed = needed_write_mb_s(total, interval_seconds(trainer.checkpoint_interval, step_seconds))
    recommended = recommend(current, needed, floor_gib(total, trainer.keep_checkpoints))
    columns = tuple(_node_plan(profile, n, total, recommended) for n in (nodes or [profile.node_count]))
    return Plan(model, params, total, trainer.checkpoint_interval, trainer.keep_checkpoints,
                step_seconds, profile.instance.memory_gib * GIB, current, recommended, columns)


# --- the report -----------------------------------------------------------------------------------
def _bytes(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", GB), ("MB", 1e6)):
        if n >= size:
            value = n / size
            return f"{value:.3g} {unit}" if value < 100 else f"{value:,.0f} {unit}"
    return f"{n / 1e3:.3g} kB"


def _seconds(s: float) -> str:
    if s < 10:
        return f"{s:.2g} s" if s < 1 else f"{s:.1f} s"
    return f"{s:,.0f} s"


def _serial(ops: fsx_metadata.MetadataOps) -> str:
    """Rank 0's share: its count, and the longest it takes, one operation after another."""
    return f"{ops.total:,} (<{_seconds(ops.total * fsx.OPERATION_LATENCY_BOUND_S)})"


def _busy(ops: fsx_metadata.MetadataOps, file_system: fsx.FileSystem) -> str:
    iops = file_system.metadata_iops
    return "not published" if iops is None else _seconds(ops.iops_seconds() / iops)


def _describe(file_system: fsx.FileSystem) -> str:
    iops = file_system.metadata_iops
    metadata = f", {iops:,} Metadata IOPS (Automatic mode)" if iops else ""
    return (f"{file_system.describe()}: writes {file_system.write_mb_s:,.0f} MB/s, reads "
            f"{file_system.read_mb_s:,.0f} MB/s{metadata}")


def _header(plan: Plan, profile_name: str) -> list[str]:
    lines = [
        f"{plan.model}: {plan.parameters / 1e9:.2f} B parameters; a checkpoint holds "
        f"{_bytes(plan.checkpoint_bytes_total)} (fp32 weights and Adam's two moments), "
        f"{plan.checkpoints_on_fsx} of them on FSx (keep_checkpoints {plan.keep_checkpoints} and "
        "the one being written)",
    ]
    interval = plan.interval_seconds
    if interval is not None:
        lines.append(f"a checkpoint every {plan.checkpoint_interval_steps} steps of "
                     f"{plan.step_seconds:g} s ({_seconds(interval)}): FSx must write "
                     f"{plan.needed_write_mb_s:,.0f} MB/s")
    elif plan.checkpoint_interval_steps:
        lines.append(f"a checkpoint every {plan.checkpoint_interval_steps} steps: the profile's "
                     "file system keeps up while a step takes at least "
                     f"{plan.min_step_seconds(plan.current):.2f} s (--step_seconds checks a step time)")
    lines.append(f"FSx of profile {profile_name}: {_describe(plan.current)}")
    lines.append(f"on SIGTERM a pod has {plan.termination_grace_seconds} s to commit its newest "
                 "state (terminationGracePeriodSeconds: one write on this file system, and margin)")
    if plan.recommended != plan.current:
        lines.append(f"recommended: {_describe(plan.recommended)}")
    else:
        known = ", which keeps up" if plan.needed_write_mb_s is not None else ""
        lines.append(f"recommended: the profile's file system{known}")
    return lines


def _rows(plan: Plan) -> list[tuple[str, list[str]]]:
    cols = plan.columns
    fs = plan.recommended
    rows = [
        ("ranks", [f"{c.ranks:,}" for c in cols]),
        ("checkpoint per rank", [_bytes(c.checkpoint_bytes_per_rank) for c in cols]),
        (f"host memory per node (of {plan.node_memory_bytes / GIB:,.0f} GiB)",
         [f"{c.host_bytes_per_node / GIB:,.1f} GiB" for c in cols]),
        ("FSx metadata operations per checkpoint",
         [f"{c.checkpoint_ops.all_ranks.total:,}" for c in cols]),
        ("  rank 0's, one after another", [_serial(c.checkpoint_ops.rank0) for c in cols]),
        ("  metadata servers busy", [_busy(c.checkpoint_ops.all_ranks, fs) for c in cols]),
        ("FSx metadata operations per resume", [f"{c.resume_ops.all_ranks.total:,}" for c in cols]),
        ("  rank 0's, one after another", [_serial(c.resume_ops.rank0) for c in cols]),
        ("recovery from an exception", ["" for _ in cols]),
    ]
    for i, first in enumerate(cols[0].recoveries):
        rows.append((f"  {first.mode.value} ({first.tier})",
                     [_seconds(c.recoveries[i].total_s) for c in cols]))
    return rows


def _table(plan: Plan) -> list[str]:
    head = " " * LABEL_WIDTH + "".join(
        f"{f'{c.nodes:,} node' + ('s' if c.nodes > 1 else ''):>{COLUMN_WIDTH}}" for c in plan.columns)
    body = [f"{label:<{LABEL_WIDTH}}" + "".join(f"{v:>{COLUMN_WIDTH}}" for v in values)
            for label, values in _rows(plan)]
    return [head] + [line.rstrip() for line in body]


def _notes(plan: Plan) -> list[str]:
    measured = recovery_estimate.MEASURED
    memory = measured[RecoveryMode.FT_LAUNCHER_INPROCESS].restore_bytes_per_s / GB
    node = measured[RecoveryMode.FT_LAUNCHER].restore_bytes_per_s / GB
    notes = [
        "the columns assume the recommended file system",
        "metadata operations: counted from the durable store's code; AWS gives the rate of "
        "creates, opens, closes and deletes per Metadata IOPS, stats, directory reads and fsyncs "
        "are counted as opens and file renames as deletes; rank 0's share takes at most a "
        "millisecond an operation (AWS: sub-millisecond latencies)",
        f"recovery: measured, each mode's recovery without its restore on two H200s "
        f"({recovery_estimate.SOURCE}); estimated, the restore of this shard (memory tier "
        f"{memory:.1f} GB/s and node tier {node:.1f} GB/s per rank as measured there; durable: "
        f"from FSx at its read throughput, at most {fsx.CLIENT_GB_S:g} GB/s per node); not "
        "included: rendezvous and process groups of this many ranks (measured nowhere beyond "
        "two GPUs), a hang's detection timeout, and after a durable restore the steps since "
        f"that checkpoint (up to {plan.checkpoint_interval_steps})",
    ]
    out = []
    for note in notes:
        out += textwrap.wrap(note, NOTE_WIDTH, initial_indent="  ", subsequent_indent="    ")
    return out


def _storage_settings(file_system: fsx.FileSystem) -> str:
    tier = (f", throughput_mb_s_per_tib: {file_system.throughput_mb_s_per_tib}"
            if file_system.persistent else "")
    return (f"storage: deployment_type: {file_system.deployment_type}{tier}, "
            f"fsx_capacity_gib: {file_system.capacity_gib}")


def _warnings(plan: Plan) -> list[str]:
    warnings = []
    current, recommended = plan.current, plan.recommended
    needed = plan.needed_write_mb_s
    floor = floor_gib(plan.checkpoint_bytes_total, plan.keep_checkpoints)
    if current.capacity_gib < floor:
        warnings.append(
            f"{current.describe()} cannot hold {plan.checkpoints_on_fsx} checkpoints of "
            f"{_bytes(plan.checkpoint_bytes_total)} ({floor:,.0f} GiB)")
    if needed is not None and current.write_mb_s < needed:
        warnings.append(
            f"{current.describe()} cannot keep up: a checkpoint of "
            f"{_bytes(plan.checkpoint_bytes_total)} every {_seconds(plan.interval_seconds)} needs "
            f"{needed:,.0f} MB/s, it writes {current.write_mb_s:,.0f} MB/s (one checkpoint takes "
            f"{_seconds(plan.write_seconds(current))})")
    if recommended != current:
        other = ("raise trainer.checkpoint_interval" if needed is not None and current.write_mb_s < needed
                 else "lower trainer.keep_checkpoints")
        warnings.append(f"{recommended.describe()} does: set {_storage_settings(recommended)}, or "
                        f"{other}")
    interval = plan.interval_seconds
    iops = recommended.metadata_iops
    for c in plan.columns:
        if interval is not None and iops is not None:
            busy = c.checkpoint_ops.all_ranks.iops_seconds() / iops
            if busy > interval:
                warnings.append(
                    f"at {c.nodes:,} nodes the metadata servers cannot keep up: a checkpoint keeps "
                    f"{iops:,} Metadata IOPS busy {_seconds(busy)}, longer than the "
                    f"{_seconds(interval)} between checkpoints; raise trainer.checkpoint_interval "
                    "or provision Metadata IOPS")
        if c.host_bytes_per_node > plan.node_memory_bytes / 2:
            warnings.append(f"at {c.nodes:,} nodes checkpoint buffers and snapshots take more "
                            "than half of the node's memory")
    return warnings


def report(plan: Plan, profile_name: str) -> tuple[list[str], list[str]]:
    """(lines, warnings) for the terminal: a header, one table, its notes."""
    return _header(plan, profile_name) + [""] + _table(plan) + [""] + _notes(plan), _warnings(plan)
