"""Objects shared by every run of a namespace: the service account the pods run as."""

from __future__ import annotations

from cdk8s import Chart
from cdk8s_plus_35 import k8s
from constructs import Construct

from k8s import naming
from k8s.charts.base import meta
from k8s.deployment import Deployment


class CommonChart(Chart):
    def __init__(self, scope: Construct, id: str, dep: Deployment) -> None:
        super().__init__(scope, id)
        # The pods never call the Kubernetes API: no token is mounted.
        k8s.KubeServiceAccount(
            self,
            "service-account",
            metadata=meta(naming.SERVICE_ACCOUNT, naming.base_labels("identity"), dep.namespace),
            automount_service_account_token=False,
        )
