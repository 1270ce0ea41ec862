"""Build the charts for one Deployment and write one YAML file per chart.

File names carry an order prefix (namespace, shared objects, data prep, the run, results,
watch, export), so `kubectl apply -f` on any subset in name order creates dependencies first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import cdk8s
import yaml
from cdk8s import Chart
from constructs import Construct

from k8s.charts import (
    CommonChart,
    DataPrepChart,
    ExportChart,
    NamespaceChart,
    ResultsChart,
    TrainingChart,
    WatchChart,
)
from k8s.deployment import Deployment

ChartFactory = Callable[[Construct, str, Deployment], Chart]

NAMESPACE = "namespace"
COMMON = "common"
DATA_PREP = "data-prep"
TRAIN = "train"
RESULTS = "results"
WATCH = "watch"
EXPORT = "export"
ALL_PARTS = (NAMESPACE, COMMON, DATA_PREP, TRAIN, RESULTS, WATCH, EXPORT)

_FACTORIES: dict[str, ChartFactory] = {
    NAMESPACE: NamespaceChart,
    COMMON: CommonChart,
    DATA_PREP: DataPrepChart,
    TRAIN: TrainingChart,
    RESULTS: ResultsChart,
    WATCH: WatchChart,
    EXPORT: ExportChart,
}


def file_name(part: str, run_id: str) -> str:
    """Shared objects keep one file per outdir; per-run files carry the run id."""
    return {
        NAMESPACE: "00-namespace.yaml",
        COMMON: "10-common.yaml",
        DATA_PREP: "20-data-prep.yaml",
        TRAIN: f"30-train-{run_id}.yaml",
        RESULTS: f"40-results-{run_id}.yaml",
        WATCH: f"45-watch-{run_id}.yaml",
        EXPORT: f"50-export-{run_id}.yaml",
    }[part]


def build(dep: Deployment, parts: Iterable[str] = ALL_PARTS) -> dict[str, list[dict]]:
    """{file name: [manifest dicts]} for the requested parts, in apply order."""
    app = cdk8s.App()
    charts = {file_name(part, dep.run_id): _FACTORIES[part](app, part, dep) for part in parts}
    return {name: list(chart.to_json()) for name, chart in sorted(charts.items())}


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (settings.json, init scripts) as literal blocks, readable in review."""


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str_representer)


def to_yaml(docs: list[dict]) -> str:
    return yaml.dump_all(docs, Dumper=_BlockDumper, sort_keys=False, default_flow_style=False)


def write(manifests: dict[str, list[dict]], outdir: Path) -> list[Path]:
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, docs in manifests.items():
        path = outdir / name
        path.write_text(to_yaml(docs))
        written.append(path)
    return written
