"""The node's figures file: what the workers of a node publish for its launcher to serve.

The launcher outlives its workers (it restarts them), so it serves `/metrics` (`exporter`); the
workers hand it their figures through one small JSON file in the launcher's own directory
(FIGURES_FILE_ENV), replaced whole at each step-log line by the node's local rank 0. Every
node publishes its own step, tokens/s and MFU; rank 0's node adds the run's figures (restarts,
the last recovery, the newest durable checkpoint, goodput so far), which only rank 0's live
pass has (`live`). Nothing crosses nodes or touches the shared file system.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from trainer.telemetry.metrics import StepFigures
from trainer.telemetry.figures import last_recovery_seconds


def figures(figs: StepFigures, summary: Optional[dict]) -> dict:
    """The file's content: the node's step figures, and the run's where known."""
    out = {"published_at": figs.time, "step": figs.step, "max_steps": figs.max_steps,
           "tokens_per_second": figs.tokens_per_second, "mfu_pct": figs.mfu_pct}
    if summary is not None:
        ckpt = summary["checkpoint"]
        out.update({"restarts": summary["restarts"],
                    "last_recovery_seconds": last_recovery_seconds(summary),
                    "checkpoint_step": ckpt["last_step"],
                    "checkpoint_committed_at": ckpt["last_committed_at"],
                    "training_goodput_pct": summary["training_goodput_pct"],
                    "infra_goodput_pct": summary["infra_goodput_pct"]})
    return out


def publish(path: Path, content: dict) -> None:
    """Replace the file whole (a reader never sees half of it); no fsync: it lives as long as
    the launcher, in node-local storage."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(content))
    os.replace(tmp, path)


def read(path: Path) -> Optional[dict]:
    """The newest figures, or None before the first publication."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
