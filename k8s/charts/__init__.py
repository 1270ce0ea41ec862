"""One cdk8s chart per concern; each becomes one manifest file."""

from k8s.charts.common import CommonChart
from k8s.charts.data_prep import DataPrepChart
from k8s.charts.export import ExportChart
from k8s.charts.namespace import NamespaceChart
from k8s.charts.results import ResultsChart, WatchChart
from k8s.charts.training import TrainingChart

__all__ = [
    "CommonChart",
    "DataPrepChart",
    "ExportChart",
    "NamespaceChart",
    "ResultsChart",
    "TrainingChart",
    "WatchChart",
]
