"""Stacks compose constructs and publish the outputs the manifests read; no resources here.

`cdk deploy --all --outputs-file cdk-outputs.json` writes one object per stack; the manifests
merge them, so every output key below appears in exactly one stack.
"""

from __future__ import annotations

import re

import aws_cdk as cdk
from constructs import Construct

from config import Profile
from infra import constants as c
from infra.constructs.cluster import ClusterProps, EksCluster
from infra.constructs.device_plugins import DevicePlugins, DevicePluginsProps
from infra.constructs.gpu_nodes import GpuNodes, GpuNodesProps
from infra.constructs.jobset import JobSetController, JobSetProps
from infra.constructs.network import Network, NetworkProps
from infra.constructs.node_health import NodeHealth, NodeHealthProps
from infra.constructs.observability import CloudWatchObservability, ObservabilityProps
from infra.constructs.registry import Registry, RegistryProps
from infra.constructs.storage import Storage, StorageProps
from infra.constructs.system_nodes import SystemNodes, SystemNodesProps
from infra.errors import DeploymentError


def _checked_name(profile: Profile) -> str:
    # The profile name becomes part of stack, cluster and repository names.
    if not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?", profile.name):
        raise DeploymentError(
            f"profile name {profile.name!r} must be lowercase letters, digits and dashes "
            "(it names the stacks, the cluster and the image repository)"
        )
    return profile.name


def stack_names(profile: Profile) -> dict[str, str]:
    prefix = f"nvrx-{_checked_name(profile)}"
    return {
        "network": f"{prefix}-network",
        "registry": f"{prefix}-registry",
        "cluster": f"{prefix}-cluster",
        "gpu": f"{prefix}-gpu",
    }


def cluster_name(profile: Profile) -> str:
    return f"nvrx-{_checked_name(profile)}"


def _outputs(stack: cdk.Stack, values: dict[str, str]) -> None:
    for key, value in values.items():
        cdk.CfnOutput(stack, key, value=value)


class NetworkStack(cdk.Stack):
    """VPC, flow logs and the GPU subnet. Kept apart so the cluster can be rebuilt in place."""

    def __init__(self, scope: Construct, construct_id: str, *, profile: Profile, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.network = Network(
            self,
            "Network",
            NetworkProps(
                availability_zone=profile.availability_zone,
                second_availability_zone=profile.cluster.second_availability_zone,
                vpc_cidr=profile.cluster.vpc_cidr,
                vpc_id=profile.cluster.vpc_id,
            ),
        )


class RegistryStack(cdk.Stack):
    """The trainer image repository, deployable (and pushable) before the cluster exists."""

    def __init__(self, scope: Construct, construct_id: str, *, profile: Profile, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.registry = Registry(
            self, "Registry", RegistryProps(f"nvrx-eks/{profile.name}/trainer")
        )
        _outputs(self, {"EcrRepositoryUri": self.registry.repository.repository_uri})


class ClusterStack(cdk.Stack):
    """EKS cluster, system nodes, device plugins, FSx with its PV/PVC; no GPU capacity, so a
    GPU shortage never rolls the cluster back (the GPU nodes are GpuStack's)."""

    def __init__(
        self, scope: Construct, construct_id: str, *, profile: Profile, network: Network, **kwargs
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        settings = profile.cluster
        name = cluster_name(profile)

        self.eks = EksCluster(
            self,
            "Eks",
            ClusterProps(
                cluster_name=name,
                eks_version=settings.eks_version,
                support_type=settings.support_type,
                endpoint_access=settings.endpoint_access,
                public_access_cidrs=settings.public_access_cidrs,
                namespace=profile.namespace,
                vpc=network.vpc,
            ),
        )
        cluster = self.eks.cluster

        self.system_nodes = SystemNodes(
            self,
            "SystemNodes",
            SystemNodesProps(
                cluster=cluster,
                instance_type=settings.system_instance_type,
                node_count=settings.system_node_count,
            ),
        )
        # Nodes become Ready only with the CNI and kube-proxy in place; CoreDNS needs nodes.
        self.system_nodes.nodegroup.node.add_dependency(self.eks.vpc_cni, self.eks.kube_proxy)
        self.eks.add_core_dns(after=self.system_nodes.nodegroup)
        # Node conditions for GPU, EFA, kernel and runtime faults: the node-health agent's signal.
        self.node_monitoring = self.eks.add_node_monitoring(after=self.system_nodes.nodegroup)

        self.jobset = None
        if profile.workload == "jobset":
            self.jobset = JobSetController(
                self,
                "JobSet",
                JobSetProps(cluster=cluster, after=self.system_nodes.nodegroup),
            )

        self.observability = None
        if profile.observability.cloudwatch:
            self.observability = CloudWatchObservability(
                self,
                "CloudWatch",
                ObservabilityProps(
                    cluster=cluster,
                    pod_identity_agent=self.eks.pod_identity_agent,
                    after=self.system_nodes.nodegroup,
                ),
            )

        self.device_plugins = DevicePlugins(
            self,
            "DevicePlugins",
            DevicePluginsProps(cluster=cluster, efa=profile.instance.efa_interfaces > 0),
        )

        self.storage = Storage(
            self,
            "Storage",
            StorageProps(
                cluster=cluster,
                vpc=network.vpc,
                subnet=network.gpu_subnet,
                file_system=profile.storage.file_system,
                import_path=profile.storage.fsx_import_path,
                namespace=profile.namespace,
                namespace_manifest=self.eks.namespace,
                pod_identity_agent=self.eks.pod_identity_agent,
            ),
        )

        fs = self.storage.file_system
        _outputs(
            self,
            {
                "ClusterName": cluster.cluster_name,
                "KubeconfigCommand": cdk.Fn.join(
                    " ",
                    [
                        "aws eks update-kubeconfig",
                        "--region",
                        self.region,
                        "--name",
                        cluster.cluster_name,
                        "--role-arn",
                        self.eks.admin_role.role_arn,
                    ],
                ),
                "Region": self.region,
                "Namespace": profile.namespace,
                "FsxFileSystemId": fs.ref,
                "FsxDnsName": fs.attr_dns_name,
                "FsxMountName": fs.attr_lustre_mount_name,
                "FsxPvcName": self.storage.pvc_name,
                "NodeLocalDir": c.NODE_LOCAL_DIR,
            },
        )


class GpuStack(cdk.Stack):
    """The GPU node group alone, so that a GPU capacity shortage (the Auto Scaling group cannot
    launch its instances) fails or stalls only this stack: the cluster, FSx and data stay, and
    `cdk deploy <prefix>-gpu` retries the GPU nodes alone."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        profile: Profile,
        network: Network,
        cluster: ClusterStack,
        **kwargs,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.gpu_nodes = GpuNodes(
            self,
            "GpuNodes",
            GpuNodesProps(
                cluster=cluster.eks.cluster,
                vpc=network.vpc,
                subnet=network.gpu_subnet,
                instance=profile.instance,
                node_count=profile.group_size,  # the spares too
                gpu_ami=profile.cluster.gpu_ami,
                placement_group=profile.placement_group,
                capacity_reservation=profile.capacity_reservation,
                huge_tmpfs=profile.tiers.huge_tmpfs and profile.tiers.node_dir == "shm",
            ),
        )
        self.node_health = NodeHealth(
            self,
            "NodeHealth",
            NodeHealthProps(
                cluster=cluster.eks.cluster,
                auto_scaling_group=self.gpu_nodes.auto_scaling_group,
                pod_identity_agent=cluster.eks.pod_identity_agent,
            ),
        )
        # Nodes become Ready only with the CNI and kube-proxy in place.
        self.add_stack_dependency(cluster)
        _outputs(self, {"GpuNodeRoleArn": self.gpu_nodes.role.role_arn,
                        "GpuAutoScalingGroupName": self.gpu_nodes.auto_scaling_group.ref})
