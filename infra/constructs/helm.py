"""A pinned Helm chart installed through the cluster's kubectl handler: one place for what every
chart of the stacks sets the same way (its pin from `infra.constants`)."""

from __future__ import annotations

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from infra.constants import PinnedChart


def install(scope: Construct, construct_id: str, cluster: eks.Cluster, pin: PinnedChart,
            values: dict, wait: bool, create_namespace: bool = False) -> eks.HelmChart:
    """`pin` with `values`; `wait` blocks the deployment until its resources are ready."""
    return eks.HelmChart(scope, construct_id, cluster=cluster, repository=pin.repository,
                         chart=pin.chart, version=pin.version, release=pin.release,
                         namespace=pin.namespace, create_namespace=create_namespace or None,
                         values=values, wait=wait)
