"""NVIDIA and EFA device plugins as pinned Helm charts, scheduled onto the tainted GPU nodes."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from infra import constants as c
from infra.constructs import helm


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
        # wait=False: GPU capacity may arrive later (reservations); do not block the stack
        self.nvidia = helm.install(self, "Nvidia", props.cluster, c.NVIDIA_DEVICE_PLUGIN,
                                   nvidia_values(), wait=False)
        self.efa = helm.install(self, "Efa", props.cluster, c.EFA_DEVICE_PLUGIN, efa_values(),
                                wait=False) if props.efa else None
