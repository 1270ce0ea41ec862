"""Where each step-log line goes: one set of figures, every sink.

`Telemetry` lives as long as its process (`ProcessState.telemetry`): its live pass and writers
survive an in-process restart, and each attempt `begin`s at the step it resumed from. Rank 0
prints the line and writes TensorBoard and W&B; the local rank 0 of every node publishes the
node's figures file, when its launcher serves one.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Callable, Mapping, Optional

from config.contract import FIGURES_FILE_ENV
from trainer.config import TrainConfig
from trainer.distributed import DistEnv
from trainer.telemetry.metrics import StepFigures
from trainer.telemetry import published


class Telemetry:
    def __init__(self, cfg: TrainConfig, env: DistEnv, environ: Mapping[str, str] = os.environ):
        self.rank = env.rank
        self.live = self.tensorboard = self.wandb = None
        self.last: Optional[StepFigures] = None  # the newest line's figures
        self._warned = False
        figures = environ.get(FIGURES_FILE_ENV)
        self.figures_path = Path(figures) if figures and env.local_rank == 0 else None
        out = cfg.output_dir
        if env.rank != 0 or out is None:
            return
        from trainer.telemetry.live import LiveRun

        self.live = LiveRun(out, cfg.max_steps, cfg.checkpoint_interval, environ)
        if cfg.tensorboard:
            from trainer.telemetry.tensorboard import TensorBoardRun

            self.tensorboard = TensorBoardRun(out)
        if cfg.wandb_project:
            from trainer.durable.lease import lineage_id
            from trainer.telemetry.wandb_run import WandbRun

            lineage = lineage_id(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
            self.wandb = WandbRun(cfg.wandb_project, out, lineage, cfg.to_dict())

    def begin(self, step: int) -> None:
        """An attempt that trains from `step` on."""
        if self.tensorboard is not None:
            self.tensorboard.begin(step)

    def report(self, figs: StepFigures, log: Callable[[str], None]) -> None:
        summary = self.live.summary() if self.live is not None else None
        self.last = figs
        if self.rank == 0:
            log(figs.line())
        for sink in (self.tensorboard, self.wandb):
            if sink is not None:
                self._guarded(sink.write, figs, summary)
        if self.figures_path is not None:
            with contextlib.suppress(OSError):  # the launcher's directory went with it
                published.publish(self.figures_path, published.figures(figs, summary))

    def _guarded(self, write: Callable, *args) -> None:
        """A sink that cannot write (a full or failing disk, W&B unreachable) costs its points,
        never the training: one warning, then silence."""
        try:
            write(*args)
        except Exception as exc:  # noqa: BLE001 (any library's error: a sink is never fatal)
            if not self._warned:
                self._warned = True
                print(f"rank {self.rank}: warning: {type(exc).__name__}: {exc}; figures are being "
                      "lost (training goes on)", file=sys.stderr, flush=True)

    def close(self) -> None:
        """At process exit: the last point once more, with the run's figures as the whole log
        of the node has them, then the writers closed."""
        summary = None
        if self.live is not None:
            self._guarded(self.live.catch_up, True)
            self.live.close()
            summary = self.live.summary()
        for sink in (self.tensorboard, self.wandb):
            if sink is None:
                continue
            if self.last is not None:
                self._guarded(sink.end, self.last, summary)
            else:
                self._guarded(sink.close)
