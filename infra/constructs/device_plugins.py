"""NVIDIA and EFA device plugins as pinned Helm charts, scheduled onto the tainted GPU nodes."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from infra import constants as c


@dataclass(frozen=True)
class DevicePluginsProps:
    cluster: eks.Cluster
    efa: bool  # the instance type has EFA interfaces


def gpu_node_placement() -> dict:
    """Tolerate the GPU taint and run only on the GPU node group."""
    label_key, label_value = c.GPU_NODE_GROUP_LABEL
    taint_key, _, taint_effect = c.GPU_TAINT
    return {
        "tolerations": [
            {"key": "CriticalAddonsOnly", "operator": "Exists"},
            {"key": taint_key, "operator": "Exists", "effect": taint_effect},
        ],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": label_key, "operator": "In", "values": [label_value]}
                            ]
                        }
                    ]
                }
            }
        },
    }


def nvidia_values() -> dict:
    # The chart's default affinity wants node-feature-discovery labels, which this cluster does
    # not run; our node-group label replaces it.
    return {**gpu_node_placement(), "gfd": {"enabled": False}, "nfd": {"enabled": False}}


def efa_values() -> dict:
    # The chart pins itself to EFA-capable instance types; we add the taint toleration.
    return {"tolerations": gpu_node_placement()["tolerations"]}


class DevicePlugins(Construct):
    """`nvidia.com/gpu` and `vpc.amazonaws.com/efa` extended resources for the scheduler."""

    nvidia: eks.HelmChart
    efa: eks.HelmChart | None

    def __init__(self, scope: Construct, construct_id: str, props: DevicePluginsProps) -> None:
        super().__init__(scope, construct_id)
        self.nvidia = eks.HelmChart(
            self,
            "Nvidia",
            cluster=props.cluster,
            repository=c.NVIDIA_DEVICE_PLUGIN_REPO,
            chart=c.NVIDIA_DEVICE_PLUGIN_CHART,
            version=c.NVIDIA_DEVICE_PLUGIN_VERSION,
            release="nvidia-device-plugin",
            namespace="kube-system",
            values=nvidia_values(),
            wait=False,  # GPU capacity may arrive later (reservations); do not block the stack
        )
        self.efa = None
        if props.efa:
            self.efa = eks.HelmChart(
                self,
                "Efa",
                cluster=props.cluster,
                repository=c.EFA_DEVICE_PLUGIN_REPO,
                chart=c.EFA_DEVICE_PLUGIN_CHART,
                version=c.EFA_DEVICE_PLUGIN_VERSION,
                release="aws-efa-k8s-device-plugin",
                namespace="kube-system",
                values=efa_values(),
                wait=False,
            )
