"""Seconds from an exception to the first productive step, per recovery mode, at any node count:
measured parts and estimated parts kept apart.

Measured, in one place (`MEASURED`): the recovery of each mode from the exceptions of the
published fault schedule on two H200s (BENCHMARKS.md#recovery-2gpu; per fault, the recovery and
its restore stage, `loaded` - `buffers_ready` of #restart-stages, from the raw files linked
there), llama-1b with 7.41 GB of state per rank. What a recovery costs without its restore is
taken as is; the restore is estimated for the shard of the planned node count:
- memory or node tier: the shard at the speed the tier restored at there;
- durable (from FSx): every rank reads its shard at once, so the whole checkpoint at the file
  system's read throughput, and each node's ranks' shards at most at one client's
  (`config.fsx`), whichever takes longer.
Not included: what grows with the world, measured nowhere beyond two GPUs (rendezvous and
process groups of N ranks, rank 0's serial metadata work, shown apart by the plan), and for a
hang the timeout that detects it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from config import fsx
from config.contract import RecoveryMode

SOURCE = "BENCHMARKS.md#recovery-2gpu"
MEASURED_BYTES_PER_RANK = 7.41e9  # llama-1b on two GPUs: fp32 weights and Adam's two moments


@dataclass(frozen=True)
class MeasuredRecovery:
    tier: str  # where the measured recoveries restored from: memory, node or durable
    faults: tuple[tuple[float, float], ...]  # (recovery, its restore stage) per exception, s
    raw: str  # the raw file under bench/results/ that holds them

    @property
    def without_restore_s(self) -> float:
        return statistics.median(total - restore for total, restore in self.faults)

    @property
    def restore_bytes_per_s(self) -> float:
        return MEASURED_BYTES_PER_RANK / statistics.median(r for _, r in self.faults)


_RAW = "h200x2-recovery-seed42/recovery-{}.json"
MEASURED: dict[RecoveryMode, MeasuredRecovery] = {
    # The exception during a durable write (4.60 s) left out: its row says why it is slower.
    RecoveryMode.FT_LAUNCHER_INPROCESS: MeasuredRecovery(
        "memory", ((1.73, 0.381), (1.37, 0.393), (2.03, 0.328)), _RAW.format("ft_launcher-inprocess")),
    RecoveryMode.INPROCESS: MeasuredRecovery(
        "memory", ((4.22, 0.413), (6.37, 0.390), (3.91, 0.327), (3.89, 0.368)),
        _RAW.format("inprocess")),
    RecoveryMode.FT_LAUNCHER: MeasuredRecovery(
        "node", ((8.43, 0.216), (7.12, 0.209), (6.54, 0.196), (6.16, 0.204)),
        _RAW.format("ft_launcher")),
    # Three of them found no checkpoint yet and restarted from step 0; one read from the durable
    # store on the local disk (3.38 s): only the stages before the restore are used.
    RecoveryMode.BASELINE: MeasuredRecovery(
        "durable", ((28.94, 0.241), (36.84, 0.499), (41.58, 0.252), (46.80, 3.383)),
        _RAW.format("baseline")),
}


@dataclass(frozen=True)
class Estimate:
    mode: RecoveryMode
    tier: str
    measured_s: float  # the recovery without its restore, as measured
    restore_s: float  # estimated for this shard

    @property
    def total_s(self) -> float:
        return self.measured_s + self.restore_s


def tier_for(mode: RecoveryMode, tiers: tuple[str, ...]) -> str:
    """Where `mode` restores from after an exception: the tier its measured runs used, if the
    profile keeps it, else the durable store."""
    tier = MEASURED[mode].tier
    return tier if tier in tiers else "durable"


def durable_read_s(checkpoint_bytes: int, nodes: int, file_system: fsx.FileSystem) -> float:
    """Every rank reads its own shard at once: the file system serves the whole checkpoint, and
    each node's client its ranks' part of it."""
    whole = checkpoint_bytes / (file_system.read_mb_s * 1e6)
    per_node = checkpoint_bytes / nodes / (fsx.CLIENT_GB_S * 1e9)
    return max(whole, per_node)


def estimate(mode: RecoveryMode, tiers: tuple[str, ...], shard_bytes: int, checkpoint_bytes: int,
             nodes: int, file_system: fsx.FileSystem) -> Estimate:
    measured = MEASURED[mode]
    tier = tier_for(mode, tiers)
    if tier == "durable":
        restore = durable_read_s(checkpoint_bytes, nodes, file_system)
    else:
        restore = shard_bytes / measured.restore_bytes_per_s
    return Estimate(mode, tier, measured.without_restore_s, restore)
