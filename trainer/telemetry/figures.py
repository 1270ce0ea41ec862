"""The names and values every sink shows: one mapping from the step figures and the run's
figures (a `Goodput` summary) to scalars, so TensorBoard, W&B and the metrics endpoint never
disagree on what a figure is called or how it is computed."""

from __future__ import annotations

from typing import Optional

from trainer.telemetry.metrics import StepFigures


def step_scalars(figs: StepFigures) -> dict[str, float]:
    """The step window's figures, by TensorBoard tag."""
    out = {
        "train/loss": figs.loss,
        "train/grad_norm": figs.grad_norm,
        "train/lr": figs.lr,
        "throughput/tokens_per_second": figs.tokens_per_second,
        "throughput/tokens_per_second_per_gpu": figs.tokens_per_second_per_gpu,
        "stall/checkpoint_seconds": figs.checkpoint_stall_s,
        "stall/snapshot_seconds": figs.snapshot_stall_s,
    }
    if figs.mfu_pct is not None:
        out["throughput/mfu_pct"] = figs.mfu_pct
    if figs.memory_gib is not None:
        out["memory/peak_reserved_gib"] = figs.memory_gib
    return out


def closed_failures(summary: dict) -> list[dict]:
    """The failures training has recovered from, in order (the one in progress is left out:
    its recovery is not known yet)."""
    return [f for f in summary["faults"] if f["recovery_seconds"] is not None]


def last_recovery_seconds(summary: dict) -> Optional[float]:
    closed = closed_failures(summary)
    return closed[-1]["recovery_seconds"] if closed else None


def run_scalars(summary: Optional[dict]) -> dict[str, float]:
    """The run's figures so far (a `Goodput` summary; None: not known yet), by tag."""
    if summary is None:
        return {}
    ckpt = summary["checkpoint"]
    out = {
        "goodput/training_pct": summary["training_goodput_pct"],
        "goodput/infra_pct": summary["infra_goodput_pct"],
        "recovery/restarts": float(summary["restarts"]),
        "recovery/failures": float(len(summary["faults"])),
    }
    if (last := last_recovery_seconds(summary)) is not None:
        out["recovery/last_recovery_seconds"] = last
    if ckpt["last_step"] is not None:
        out["checkpoint/last_committed_step"] = float(ckpt["last_step"])
        out["checkpoint/write_seconds"] = ckpt["last_write_seconds"]
    return out


# One faults[] entry's figures, shown per failure (x: the failure's number, 1, 2, ...).
FAILURE_FIELDS = ("recovery_seconds", "detected_seconds", "steps_lost")


def failure_scalars(entry: dict) -> dict[str, float]:
    return {name: float(entry[name]) for name in FAILURE_FIELDS if entry.get(name) is not None}
