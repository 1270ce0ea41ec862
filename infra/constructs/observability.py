"""The Amazon CloudWatch Observability add-on, for profiles with `observability.cloudwatch`.

It installs the CloudWatch agent (Container Insights with its DCGM exporter for the GPUs and
the EFA metrics of every EFA device) and Fluent Bit, which ships every container's log to
CloudWatch Logs: a pod's log outlives the pod, its node and the cluster.

Its permissions, `CloudWatchAgentServerPolicy`, go to a role of its own that EKS Pod Identity
hands to the add-on's service account, not to the node roles: on a node role they would reach
every pod of the node, the training pods included, which need no AWS access at all. This is
how the VPC CNI and the FSx CSI driver get theirs (`cluster`, `storage`).
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct, IDependable

from infra import constants as c
from infra.constructs.cluster import pod_identity_role
from infra.nag import acknowledge

POLICY = "CloudWatchAgentServerPolicy"


@dataclass(frozen=True)
class ObservabilityProps:
    cluster: eks.Cluster
    pod_identity_agent: IDependable
    after: IDependable  # nodes that can run its controller


class CloudWatchObservability(Construct):
    addon: eks.CfnAddon
    role: iam.Role

    def __init__(self, scope: Construct, construct_id: str, props: ObservabilityProps) -> None:
        super().__init__(scope, construct_id)
        self.role = pod_identity_role(self, "AgentRole", "CloudWatch agent and Fluent Bit: metrics and logs")
        self.role.add_managed_policy(iam.ManagedPolicy.from_aws_managed_policy_name(POLICY))
        self.addon = eks.CfnAddon(
            self,
            "Addon",
            addon_name=c.CLOUDWATCH_ADDON,
            cluster_name=props.cluster.cluster_name,
            resolve_conflicts="OVERWRITE",
            preserve_on_delete=False,
            pod_identity_associations=[
                eks.CfnAddon.PodIdentityAssociationProperty(
                    role_arn=self.role.role_arn, service_account=c.CLOUDWATCH_AGENT_SA
                )
            ],
        )
        # Credentials come through the agent; the add-on's controller is a Deployment, which
        # needs nodes (before them, EKS would report the add-on DEGRADED and CloudFormation
        # would take it as created).
        self.addon.node.add_dependency(props.pod_identity_agent, props.after)
        acknowledge(
            self.role,
            (
                f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{POLICY}]",
                "The AWS-maintained policy the CloudWatch agent and Fluent Bit need (PutMetricData, "
                "log groups and streams, EC2 and EKS descriptions); on a Pod Identity role of the "
                "add-on's service account alone, never on a node role.",
            ),
        )
