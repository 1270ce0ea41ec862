"""The GPU nodes' health signal beyond EC2's: the node-health agent (`infra.node_health.agent`)
on a system node, with the one permission it needs.

- its Pod Identity role may call `autoscaling:SetInstanceHealth` on the GPU Auto Scaling group
  alone (the group's name in the resource ARN), nothing else; no node role carries it;
- its ClusterRole reads Nodes (get, list), nothing else;
- its program is a ConfigMap of this repository's `agent.py`, run by a plain Python image:
  nothing to build or push, and the program a deploy runs is the one reviewed here;
- unprivileged, non-root, read-only root filesystem, CPU and memory limited, on the system
  nodes; one replica (two would only mark the same instance twice).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import aws_cdk as cdk
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct, IDependable

from infra import constants as c
from infra.constructs.cluster import pod_identity_role
from infra.nag import acknowledge

AGENT_FILE = Path(__file__).resolve().parents[1] / "node_health" / "agent.py"
NAME = "nvrx-node-health"
MOUNT = "/opt/nvrx-node-health"


@dataclass(frozen=True)
class NodeHealthProps:
    cluster: eks.Cluster
    auto_scaling_group: autoscaling.CfnAutoScalingGroup
    pod_identity_agent: IDependable


def group_arn(scope: Construct, group_name: str) -> str:
    """The group's ARN up to its generated id: `...:autoScalingGroup:*:autoScalingGroupName/<name>`."""
    stack = cdk.Stack.of(scope)
    return stack.format_arn(service="autoscaling", resource="autoScalingGroup",
                            resource_name=f"*:autoScalingGroupName/{group_name}",
                            arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME)


def agent_manifests(region: str) -> list[dict]:
    """ServiceAccount, ClusterRole and binding, the program's ConfigMap and the Deployment."""
    labels = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/part-of": "nvrx-eks"}
    metadata = {"name": NAME, "namespace": c.NODE_HEALTH_NAMESPACE, "labels": labels}
    gpu_key, gpu_value = c.GPU_NODE_GROUP_LABEL
    system_key, system_value = c.SYSTEM_NODE_GROUP_LABEL
    env = {"AWS_REGION": region, "NODE_SELECTOR": f"{gpu_key}={gpu_value}",
           **{k: str(v) for k, v in c.NODE_HEALTH_RULES.items()}}
    container = {
        "name": "agent",
        "image": c.NODE_HEALTH_IMAGE,
        "command": ["python", f"{MOUNT}/agent.py"],
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "resources": {"requests": {"cpu": "20m", "memory": "64Mi"},
                      "limits": {"cpu": "200m", "memory": "64Mi"}},
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534,
                            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "privileged": False, "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "volumeMounts": [{"name": "program", "mountPath": MOUNT, "readOnly": True}],
    }
    pod = {
        "serviceAccountName": NAME,
        "nodeSelector": {system_key: system_value},
        "containers": [container],
        "volumes": [{"name": "program", "configMap": {"name": NAME}}],
    }
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": NAME, "labels": labels},
         "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": NAME, "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
         "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": c.NODE_HEALTH_NAMESPACE}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata,
         "data": {"agent.py": AGENT_FILE.read_text()}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata,
         "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
                  "selector": {"matchLabels": {"app.kubernetes.io/name": NAME}},
                  "template": {"metadata": {"labels": labels}, "spec": pod}}},
    ]


class NodeHealth(Construct):
    role: iam.Role
    manifest: eks.KubernetesManifest

    def __init__(self, scope: Construct, construct_id: str, props: NodeHealthProps) -> None:
        super().__init__(scope, construct_id)
        self.role = pod_identity_role(self, "Role", "nvrx node-health agent: mark broken GPU nodes Unhealthy")
        self.role.add_to_policy(iam.PolicyStatement(
            actions=["autoscaling:SetInstanceHealth"],
            resources=[group_arn(self, props.auto_scaling_group.ref)],
        ))
        association = eks.CfnPodIdentityAssociation(
            self, "PodIdentity", cluster_name=props.cluster.cluster_name,
            namespace=c.NODE_HEALTH_NAMESPACE, service_account=NAME, role_arn=self.role.role_arn,
        )
        self.manifest = eks.KubernetesManifest(
            self, "Agent", cluster=props.cluster, manifest=agent_manifests(cdk.Stack.of(self).region),
        )
        # Pod Identity injects credentials when the pod is created: association first.
        self.manifest.node.add_dependency(association, props.pod_identity_agent)
        stack = cdk.Stack.of(self)
        group_id = stack.resolve(stack.get_logical_id(props.auto_scaling_group))
        acknowledge(
            self.role,
            (
                f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:autoscaling:{stack.region}:"
                f"{stack.account}:autoScalingGroup:*:autoScalingGroupName/<{group_id}>]",
                "The wildcard stands for the group's generated id only: the ARN names the one GPU "
                "Auto Scaling group, and SetInstanceHealth is the one action allowed on it.",
            ),
        )
