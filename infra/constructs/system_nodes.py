"""A small managed node group for CoreDNS and controllers: the GPU nodes are tainted."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra import constants as c
from infra.nag import acknowledge


@dataclass(frozen=True)
class SystemNodesProps:
    cluster: eks.Cluster
    instance_type: str
    node_count: int


def node_role(scope: Construct, construct_id: str, description: str) -> iam.Role:
    """The least a node needs: join the cluster and pull images. No CNI policy (vpc-cni has its
    own Pod Identity role), no SSM, no S3: pods that reach instance metadata get nothing else."""
    role = iam.Role(
        scope,
        construct_id,
        assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
        description=description,
        managed_policies=[
            iam.ManagedPolicy.from_aws_managed_policy_name("AmazonEKSWorkerNodePolicy"),
            iam.ManagedPolicy.from_aws_managed_policy_name("AmazonEC2ContainerRegistryPullOnly"),
        ],
    )
    acknowledge(
        role,
        (
            "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/AmazonEKSWorkerNodePolicy]",
            "Required by every EKS node to register and describe the cluster (EKS node IAM role).",
        ),
        (
            "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/AmazonEC2ContainerRegistryPullOnly]",
            "Narrowest AWS-maintained ECR policy: image pulls only (no list/describe).",
        ),
    )
    return role


def hardened_launch_template(
    scope: Construct, construct_id: str, root_gib: int
) -> ec2.LaunchTemplate:
    """IMDSv2 only, and an encrypted gp3 root volume."""
    return ec2.LaunchTemplate(
        scope,
        construct_id,
        require_imdsv2=True,
        # Hop limit 2: the FSx CSI node plugin (not host-network) reads instance metadata.
        http_put_response_hop_limit=2,
        block_devices=[
            ec2.BlockDevice(
                device_name="/dev/xvda",
                volume=ec2.BlockDeviceVolume.ebs(
                    root_gib,
                    volume_type=ec2.EbsDeviceVolumeType.GP3,
                    encrypted=True,
                    delete_on_termination=True,
                ),
            )
        ],
    )


class SystemNodes(Construct):
    """Managed AL2023 nodes spread over the private subnets of both AZs, untainted."""

    nodegroup: eks.Nodegroup
    role: iam.Role

    def __init__(self, scope: Construct, construct_id: str, props: SystemNodesProps) -> None:
        super().__init__(scope, construct_id)
        self.role = node_role(self, "NodeRole", "EKS system node group")
        template = hardened_launch_template(self, "LaunchTemplate", c.SYSTEM_ROOT_VOLUME_GIB)
        key, value = c.SYSTEM_NODE_GROUP_LABEL
        self.nodegroup = eks.Nodegroup(
            self,
            "Nodegroup",
            cluster=props.cluster,
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_STANDARD,
            instance_types=[ec2.InstanceType(props.instance_type)],
            min_size=props.node_count,
            desired_size=props.node_count,
            max_size=props.node_count,
            node_role=self.role,
            labels={key: value},
            launch_template_spec=eks.LaunchTemplateSpec(
                id=template.launch_template_id,
                version=template.latest_version_number,
            ),
            subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
        )
