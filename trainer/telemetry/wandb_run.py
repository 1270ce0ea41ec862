"""The optional W&B run: the same scalars as TensorBoard, in one W&B run per checkpoint
directory, resumed by every restart.

The run's id is derived from the checkpoint directory's identity (`lease.lineage_id`, created
with its first checkpoint), so every restart of a lineage, in any pod, logs into the same run,
and a new directory at an old path starts another. W&B keeps a run's steps increasing: a
resumed attempt that trains again steps already logged does not log them again (their points
stay those first logged); the figures of the run (goodput, restarts, the last recovery) follow
on its next new step. Each failure's figures go to the run's summary under `failures/`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from trainer.telemetry.metrics import StepFigures
from trainer.telemetry.figures import closed_failures, failure_scalars, run_scalars, step_scalars


def run_id(lineage: str) -> str:
    return f"nvrx-eks-{lineage}"


class WandbRun:
    """Started at its first write: W&B's start (seconds, a service process) stays off a
    restart's way to its first step."""

    def __init__(self, project: str, output_dir: Path, lineage: Optional[str], config: dict):
        self._init = dict(project=project, id=run_id(lineage) if lineage else None,
                          resume="allow" if lineage else None, dir=str(output_dir), config=config)
        self._run = None

    @property
    def run(self):
        if self._run is None:
            import wandb  # the launcher checked that it is installed (trainer.config.check_wandb)

            self._run = wandb.init(**self._init)
        return self._run

    def write(self, figs: StepFigures, summary: Optional[dict]) -> None:
        if figs.step < self.run.step:  # already logged by an earlier attempt
            return
        self.run.log({**step_scalars(figs), **run_scalars(summary)}, step=figs.step)
        if summary is not None:
            for number, entry in enumerate(closed_failures(summary), 1):
                for name, value in failure_scalars(entry).items():
                    self.run.summary[f"failures/{number}/{name}"] = value

    def end(self, figs: StepFigures, summary: Optional[dict]) -> None:
        """The run's figures as the whole log has them, in the run's summary."""
        self.run.summary.update(run_scalars(summary))
        self.close()

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
