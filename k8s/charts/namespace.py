"""The namespace, for clusters where the infra stack does not own it (the wrapper skips it otherwise)."""

from __future__ import annotations

from cdk8s import Chart
from cdk8s_plus_35 import k8s
from constructs import Construct

from k8s import naming
from k8s.charts.base import meta
from k8s.deployment import Deployment


class NamespaceChart(Chart):
    def __init__(self, scope: Construct, id: str, dep: Deployment) -> None:
        super().__init__(scope, id)
        k8s.KubeNamespace(self, "namespace", metadata=meta(dep.namespace, naming.base_labels("namespace")))
