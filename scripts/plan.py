"""Capacity planning on paper: checkpoint sizes, the durable tier's write time, host memory.

Everything comes from the profile and the model preset's architecture numbers (no torch):
- a checkpoint holds fp32 weights and Adam's two moments, 12 bytes per parameter, split evenly
  over all ranks;
- FSx for Lustre SCRATCH_2 gives 200 MB/s of throughput per TiB of capacity, shared by all
  writers, so a checkpoint takes total bytes / (capacity in TiB x 200 MB/s) to write;
- an asynchronous checkpoint must be written before the next one starts, or checkpoints queue
  up (or block training): write time <= checkpoint_interval x step time;
- the snapshot tiers keep shard-sized slots in host memory per rank (config.contract);
- on SIGTERM a pod commits its newest state before SIGKILL: its grace period
  (terminationGracePeriodSeconds, and the trainer's --termination_grace) holds one checkpoint
  write with a margin (`termination_grace_seconds`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from config import Profile
from config.contract import TERMINATION_GRACE_FLOOR_S, snapshot_bytes

SCRATCH2_MB_PER_S_PER_TIB = 200
GRACE_WRITE_FACTOR = 1.25  # FSx's throughput varies: the write must still end before SIGKILL
GRACE_STOP_S = 60  # the rest of a stop: the step in flight, the snapshot copy, commit, exit


@dataclass(frozen=True)
class Plan:
    model: str
    parameters: int
    nodes: int
    ranks: int
    checkpoint_bytes_total: int
    checkpoint_bytes_per_rank: int
    fsx_capacity_gib: int
    fsx_throughput_mb_s: float
    write_seconds: float
    termination_grace_seconds: int
    checkpoint_interval_steps: int
    snapshot_bytes_per_rank: int
    host_bytes_per_node: int
    node_memory_bytes: int

    def min_step_seconds(self) -> float | None:
        """The step time at which the durable tier just keeps up (None: no periodic checkpoints)."""
        if not self.checkpoint_interval_steps:
            return None
        return self.write_seconds / self.checkpoint_interval_steps

    def keeps_up(self, step_seconds: float) -> bool:
        needed = self.min_step_seconds()
        return needed is None or step_seconds >= needed


def fsx_throughput_mb_s(capacity_gib: int) -> float:
    return capacity_gib / 1024 * SCRATCH2_MB_PER_S_PER_TIB


def fsx_write_seconds(total_bytes: int, capacity_gib: int) -> float:
    """Seconds for all ranks together to write `total_bytes` to the file system."""
    return total_bytes / (fsx_throughput_mb_s(capacity_gib) * 1e6)


def termination_grace_seconds(write_seconds: float) -> int:
    """SIGTERM to SIGKILL: one checkpoint write with a margin, and the rest of a stop; at least
    the floor (config.contract). A write already in flight at SIGTERM is committed in it; a
    newer one then only if it still fits (trainer.recovery.termination)."""
    return max(TERMINATION_GRACE_FLOOR_S,
               math.ceil(write_seconds * GRACE_WRITE_FACTOR + GRACE_STOP_S))


def make_plan(profile: Profile, nodes: int | None = None) -> Plan:
    """The plan for the profile's model at `nodes` nodes (default: the profile's node count)."""
    # Arithmetic on the preset's architecture numbers; trainer.loop.model imports torch only to build.
    from config.presets import PRESETS, STATE_BYTES_PER_PARAMETER, preset_parameters

    model = profile.trainer.model
    if model not in PRESETS:
        raise ValueError(f"trainer.model {model!r} is not a preset ({', '.join(PRESETS)}): cannot plan it")
    nodes = nodes or profile.node_count
    ranks = nodes * profile.gpus_per_node
    params = preset_parameters(model)
    total = params * STATE_BYTES_PER_PARAMETER
    per_rank = -(-total // ranks)
    tiers = profile.trainer
    snapshots = 0
    if tiers.tiers and tiers.snapshot_interval:
        peer = "peer" in tiers.tiers and nodes > 1
        snapshots = int(tiers.memory_budget_gib * 2**30) or snapshot_bytes(
            per_rank, peer, durable=profile.trainer.checkpoint_interval > 0)
    throughput = fsx_throughput_mb_s(profile.storage.fsx_capacity_gib)
    write_seconds = fsx_write_seconds(total, profile.storage.fsx_capacity_gib)
    return Plan(
        model=model,
        parameters=params,
        nodes=nodes,
        ranks=ranks,
        checkpoint_bytes_total=total,
        checkpoint_bytes_per_rank=per_rank,
        fsx_capacity_gib=profile.storage.fsx_capacity_gib,
        fsx_throughput_mb_s=throughput,
        write_seconds=write_seconds,
        termination_grace_seconds=termination_grace_seconds(write_seconds),
        checkpoint_interval_steps=profile.trainer.checkpoint_interval,
        # Per rank: the snapshot slots (checkpoints are written from one), or without the
        # tiers one staging buffer of a shard.
        snapshot_bytes_per_rank=snapshots,
        host_bytes_per_node=profile.gpus_per_node * (snapshots or per_rank),
        node_memory_bytes=profile.instance.memory_gib * 2**30,
    )


def report(plan: Plan, step_seconds: float | None) -> tuple[list[str], list[str]]:
    """(lines, warnings) for the terminal."""
    gb = 1e9
    lines = [
        f"model {plan.model}: {plan.parameters / 1e9:.2f} B parameters; {plan.nodes} nodes, {plan.ranks} ranks",
        f"checkpoint: {plan.checkpoint_bytes_total / gb:.1f} GB in total, {plan.checkpoint_bytes_per_rank / gb:.2f} GB per rank",
        f"FSx SCRATCH_2 {plan.fsx_capacity_gib} GiB: {plan.fsx_throughput_mb_s:.0f} MB/s, "
        f"one checkpoint takes {plan.write_seconds:.0f} s to write",
        f"on SIGTERM a pod has {plan.termination_grace_seconds} s to commit its newest state "
        "(terminationGracePeriodSeconds)",
        f"host memory per node for checkpoint buffers and snapshot tiers: "
        f"{plan.host_bytes_per_node / 2**30:.1f} GiB of {plan.node_memory_bytes / 2**30:.0f} GiB",
    ]
    warnings = []
    needed = plan.min_step_seconds()
    if needed is not None:
        lines.append(
            f"checkpoint every {plan.checkpoint_interval_steps} steps: the durable tier keeps up "
            f"while a step takes at least {needed:.2f} s"
        )
        if step_seconds is not None and not plan.keeps_up(step_seconds):
            warnings.append(
                f"the durable tier cannot keep up: a checkpoint takes {plan.write_seconds:.0f} s to write "
                f"but one starts every {plan.checkpoint_interval_steps * step_seconds:.0f} s "
                f"({plan.checkpoint_interval_steps} steps of {step_seconds:g} s); raise "
                "trainer.checkpoint_interval or storage.fsx_capacity_gib"
            )
    if plan.host_bytes_per_node > plan.node_memory_bytes / 2:
        warnings.append("checkpoint buffers and snapshots take more than half of the node's memory")
    return lines, warnings
