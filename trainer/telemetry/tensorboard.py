"""Rank 0's TensorBoard event files, under `tensorboard/` beside results.json:

    tensorboard/train/    the step figures and the run's figures, x = the step
    tensorboard/faults/   each failure's recovery, detection and steps lost, x = its number

A resumed attempt (a new process, or an in-process restart) may train again steps that were
already written: the steps after the state it resumed from. It opens a new event file whose
first record tells TensorBoard to drop every point of the run from that step on (the
SessionLog START of `purge_step`); its own points replace them, so the curves continue with
one point per step, the surviving one. At the end, the last point is written once more
the same way, with the run's figures as the whole log has them. Its faults writer drops every failure (purge at 0) and
writes them all again from the event log, which knows each of them whatever process wrote it
first. Points are flushed when written: a rank that dies at once (`os._exit`) loses none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from trainer.telemetry.metrics import StepFigures
from trainer.telemetry.figures import (closed_failures, failure_scalars, run_scalars,
                                       step_scalars)

DIRNAME = "tensorboard"


class TensorBoardRun:
    def __init__(self, output_dir: Path):
        self.root = Path(output_dir) / DIRNAME
        self._train = self._faults = None
        self._faults_written = 0
        self._from: Optional[int] = None  # an attempt's step, until its first write

    def begin(self, step: int) -> None:
        """An attempt that trains from `step` on: what was written after it goes, once it
        writes (the writer's import and files stay off the restart's way to its first step)."""
        self.close()
        self._from = step

    def _open(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._train = SummaryWriter(str(self.root / "train"), purge_step=self._from + 1)
        self._faults = SummaryWriter(str(self.root / "faults"), purge_step=0)
        self._faults_written, self._from = 0, None

    def write(self, figs: StepFigures, summary: Optional[dict]) -> None:
        if self._from is not None:
            self._open()
        for tag, value in {**step_scalars(figs), **run_scalars(summary)}.items():
            self._train.add_scalar(tag, value, figs.step, walltime=figs.time)
        self._train.flush()
        if summary is not None:
            self._write_failures(summary)

    def _write_failures(self, summary: dict) -> None:
        """The failures recovered from that this attempt has not written yet."""
        closed = closed_failures(summary)
        for number, entry in enumerate(closed[self._faults_written:], self._faults_written + 1):
            for tag, value in failure_scalars(entry).items():
                self._faults.add_scalar(tag, value, number, walltime=entry["t"])
        if len(closed) > self._faults_written:
            self._faults_written = len(closed)
            self._faults.flush()

    def end(self, figs: StepFigures, summary: Optional[dict]) -> None:
        """The run's last point again, with the run's figures as the whole log has them (the
        live pass lags the log by seconds): it replaces the point last written."""
        self.begin(figs.step - 1)
        self.write(figs, summary)
        self.close()

    def close(self) -> None:
        for writer in (self._train, self._faults):
            if writer is not None:
                writer.close()
        self._train = self._faults = None
