"""The JobSet controller (kubernetes-sigs/jobset), for profiles with `workload: jobset`.

A JobSet's failure policy restarts all of its child Jobs at once, the gang restart a
single Indexed Job only reaches pod by pod. The controller runs on the system nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct, IDependable

from infra import constants as c
from infra.constructs import helm


@dataclass(frozen=True)
class JobSetProps:
    cluster: eks.Cluster
    after: IDependable  # nodes that can run the controller


def jobset_values() -> dict:
    """The controller on the untainted system nodes, never on a GPU node."""
    key, value = c.SYSTEM_NODE_GROUP_LABEL
    return {"controller": {"nodeSelector": {key: value}}}


class JobSetController(Construct):
    """The pinned JobSet Helm chart (OCI), installed through the cluster's kubectl handler."""

    chart: eks.HelmChart

    def __init__(self, scope: Construct, construct_id: str, props: JobSetProps) -> None:
        super().__init__(scope, construct_id)
        # wait: its webhook must answer before the first JobSet is submitted
        self.chart = helm.install(self, "Chart", props.cluster, c.JOBSET, jobset_values(),
                                  wait=True, create_namespace=True)
        self.chart.node.add_dependency(props.after)
