"""`/metrics` for Prometheus, served by a node's launcher from its workers' figures file
(`published`). Values are read at each scrape: nothing is cached, and a worker restart leaves
the endpoint up with the last figures published (their age says how old they are).

    nvrx_eks_step                          the step of the newest step-log line
    nvrx_eks_max_steps                     steps the run trains to
    nvrx_eks_tokens_per_second             tokens/s over that line's window, stalls included
    nvrx_eks_mfu_ratio                     model FLOPs utilization (GPUs with a known peak)
    nvrx_eks_figures_age_seconds           seconds since the workers last published
    rank 0's node only (the run's figures, from its live pass over the event log):
    nvrx_eks_restarts                      restarts so far, every layer's
    nvrx_eks_last_recovery_seconds         the last failure's recovery (failure -> first step)
    nvrx_eks_checkpoint_step               the newest durable (committed) checkpoint
    nvrx_eks_checkpoint_age_seconds        seconds since it was committed
    nvrx_eks_training_goodput_ratio        useful steps x fault-free step time / wall time
    nvrx_eks_infra_goodput_ratio           (wall time - time lost to failures) / wall time
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Iterator, Optional

from trainer.telemetry.published import read

PREFIX = "nvrx_eks_"
# name, help, the value from the figures file (None: absent) and the scrape time
GAUGES: tuple[tuple[str, str, Callable[[dict, float], Optional[float]]], ...] = (
    ("step", "the step of the newest step-log line", lambda f, now: f.get("step")),
    ("max_steps", "steps the run trains to", lambda f, now: f.get("max_steps")),
    ("tokens_per_second", "tokens per second over the last step-log window, stalls included",
     lambda f, now: f.get("tokens_per_second")),
    ("mfu_ratio", "model FLOPs utilization over the last step-log window",
     lambda f, now: None if f.get("mfu_pct") is None else f["mfu_pct"] / 100),
    ("figures_age_seconds", "seconds since the workers last published their figures",
     lambda f, now: now - f["published_at"]),
    ("restarts", "restarts so far, of every recovery layer", lambda f, now: f.get("restarts")),
    ("last_recovery_seconds", "the last failure's recovery: failure to first step after it",
     lambda f, now: f.get("last_recovery_seconds")),
    ("checkpoint_step", "the newest durable checkpoint's step",
     lambda f, now: f.get("checkpoint_step")),
    ("checkpoint_age_seconds", "seconds since the newest durable checkpoint was committed",
     lambda f, now: None if f.get("checkpoint_committed_at") is None
     else now - f["checkpoint_committed_at"]),
    ("training_goodput_ratio", "useful steps times the fault-free step time, over wall time",
     lambda f, now: None if f.get("training_goodput_pct") is None
     else f["training_goodput_pct"] / 100),
    ("infra_goodput_ratio", "wall time not lost to failures, over wall time",
     lambda f, now: None if f.get("infra_goodput_pct") is None else f["infra_goodput_pct"] / 100),
)


class FiguresCollector:
    """A prometheus_client collector reading the figures file at each scrape."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def collect(self) -> Iterator:
        from prometheus_client.core import GaugeMetricFamily

        figures = read(self.path)
        if figures is None:
            return
        now = time.time()
        for name, text, value in GAUGES:
            v = value(figures, now)
            if v is not None:
                yield GaugeMetricFamily(PREFIX + name, text, value=float(v))


def serve(port: int, figures_path: Path, addr: str = "0.0.0.0"):
    """Serve `/metrics` on `addr:port` from a thread; returns the HTTP server (its
    `shutdown()` stops it)."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(FiguresCollector(figures_path))
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return server
