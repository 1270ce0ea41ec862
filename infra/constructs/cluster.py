"""The EKS control plane: access entries, logging, endpoint, KMS for secrets, core add-ons."""

from __future__ import annotations

import json
from dataclasses import dataclass

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk.lambda_layer_kubectl_v35 import KubectlV35Layer
from constructs import Construct, IDependable

from config.versions import KUBECTL_LAYER_MINOR, kubectl_skew
from infra import checkov
from infra import constants as c
from infra.constructs.keys import rotating_key
from infra.nag import acknowledge

ALL_CONTROL_PLANE_LOGS = [
    eks.ClusterLoggingTypes.API,
    eks.ClusterLoggingTypes.AUDIT,
    eks.ClusterLoggingTypes.AUTHENTICATOR,
    eks.ClusterLoggingTypes.CONTROLLER_MANAGER,
    eks.ClusterLoggingTypes.SCHEDULER,
]


@dataclass(frozen=True)
class ClusterProps:
    cluster_name: str
    eks_version: str
    support_type: str  # "STANDARD" | "EXTENDED": what EKS does at the end of standard support
    endpoint_access: str  # "private" | "public_and_private" (config.ClusterSettings)
    public_access_cidrs: tuple[str, ...]
    namespace: str
    vpc: ec2.IVpc


def endpoint_access(mode: str, cidrs: tuple[str, ...]) -> eks.EndpointAccess:
    """Map the profile's endpoint setting to EKS; public access only from the CIDRs given (the
    profile requires them)."""
    if mode == "private":
        return eks.EndpointAccess.PRIVATE
    return eks.EndpointAccess.PUBLIC_AND_PRIVATE.only_from(*cidrs)


def pod_identity_role(scope: Construct, construct_id: str, description: str) -> iam.Role:
    """An IAM role that EKS Pod Identity may assume (and tag, for ABAC) on a pod's behalf."""
    return iam.Role(
        scope,
        construct_id,
        assumed_by=iam.SessionTagsPrincipal(iam.ServicePrincipal("pods.eks.amazonaws.com")),
        description=description,
    )


class EksCluster(Construct):
    """An `aws_eks_v2` cluster that authenticates through access entries only.

    - control-plane logs: all five types;
    - endpoint: from the profile (public CIDRs, private, or both);
    - Kubernetes secrets: envelope-encrypted with a customer-managed, rotating KMS key;
    - admin access: an `admin_role` any principal of the account may assume (if IAM allows it);
      the CloudFormation execution role gets no standing admin access;
    - add-ons: vpc-cni, kube-proxy, CoreDNS (after nodes exist) and the Pod Identity agent, all
      EKS-managed; vpc-cni gets its own role through Pod Identity, so the node roles do not carry
      the CNI policy (EKS best practice: pods must not inherit ENI permissions from the node).
      vpc-cni enforces NetworkPolicies (`enableNetworkPolicy`), so the runs' policies take effect;
    - upgrade policy: explicit. STANDARD makes EKS upgrade the control plane at the end of
      standard support instead of silently moving to (billed) extended support.
    """

    cluster: eks.Cluster
    admin_role: iam.Role
    secrets_key: kms.Key
    namespace: eks.KubernetesManifest
    pod_identity_agent: eks.Addon
    vpc_cni: eks.CfnAddon
    kube_proxy: eks.CfnAddon

    def __init__(self, scope: Construct, construct_id: str, props: ClusterProps) -> None:
        super().__init__(scope, construct_id)
        if kubectl_skew(props.eks_version) > 1:
            cdk.Annotations.of(self).add_warning_v2(
                "nvrx-eks:kubectl-skew",
                f"EKS {props.eks_version} is more than one minor version from the bundled kubectl "
                f"1.{KUBECTL_LAYER_MINOR} layer; Helm charts and manifests may fail to apply",
            )

        self.secrets_key = rotating_key(
            self, "SecretsKey", f"EKS secrets envelope encryption for {props.cluster_name}"
        )
        self.admin_role = iam.Role(
            self,
            "AdminRole",
            assumed_by=iam.AccountRootPrincipal(),
            description=f"Cluster admin for {props.cluster_name} (kubectl via update-kubeconfig --role-arn)",
        )
        self.cluster = eks.Cluster(
            self,
            "Cluster",
            cluster_name=props.cluster_name,
            version=eks.KubernetesVersion.of(props.eks_version),
            vpc=props.vpc,
            vpc_subnets=[ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)],
            endpoint_access=endpoint_access(props.endpoint_access, props.public_access_cidrs),
            cluster_logging=ALL_CONTROL_PLANE_LOGS,
            secrets_encryption_key=self.secrets_key,
            masters_role=self.admin_role,
            bootstrap_cluster_creator_admin_permissions=False,
            bootstrap_self_managed_addons=False,
            default_capacity_type=eks.DefaultCapacityType.NODEGROUP,
            default_capacity=0,
            service_ipv4_cidr=c.SERVICE_IPV4_CIDR,
            output_config_command=False,
            kubectl_provider_options=eks.KubectlProviderOptions(
                kubectl_layer=KubectlV35Layer(self, "KubectlLayer"),
            ),
        )
        cfn_cluster = self.cluster.node.default_child
        assert isinstance(cfn_cluster, eks.CfnCluster)
        cfn_cluster.upgrade_policy = eks.CfnCluster.UpgradePolicyProperty(
            support_type=props.support_type
        )

        self.pod_identity_agent = self.cluster.eks_pod_identity_agent
        cni_role = pod_identity_role(self, "VpcCniRole", "VPC CNI (aws-node) ENI and IP management")
        cni_role.add_managed_policy(
            iam.ManagedPolicy.from_aws_managed_policy_name("AmazonEKS_CNI_Policy")
        )
        cni_namespace, cni_sa = c.VPC_CNI_SERVICE_ACCOUNT
        cni_association = eks.CfnPodIdentityAssociation(
            self,
            "VpcCniPodIdentity",
            cluster_name=self.cluster.cluster_name,
            namespace=cni_namespace,
            service_account=cni_sa,
            role_arn=cni_role.role_arn,
        )
        self.vpc_cni = self._addon(
            "VpcCni", "vpc-cni", configuration={"enableNetworkPolicy": "true"}
        )
        # aws-node pods must be created after the association (the Pod Identity webhook injects
        # credentials at pod creation) and need the agent to fetch them.
        self.vpc_cni.node.add_dependency(cni_association)
        self.vpc_cni.node.add_dependency(self.pod_identity_agent)
        self.kube_proxy = self._addon("KubeProxy", "kube-proxy")

        self.namespace = self.cluster.add_manifest(
            "Namespace",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": props.namespace}},
        )

        acknowledge(
            cni_role,
            (
                "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/AmazonEKS_CNI_Policy]",
                "AWS-maintained policy the VPC CNI requires; attached to a Pod Identity role scoped "
                "to kube-system/aws-node instead of the node role.",
            ),
        )
        self._acknowledge_cdk_internals()

    def _addon(
        self, construct_id: str, name: str, configuration: dict | None = None
    ) -> eks.CfnAddon:
        addon = eks.CfnAddon(
            self,
            construct_id,
            addon_name=name,
            cluster_name=self.cluster.cluster_name,
            resolve_conflicts="OVERWRITE",
            preserve_on_delete=False,
            configuration_values=json.dumps(configuration) if configuration else None,
        )
        return addon  # its Ref to the cluster orders it after the cluster

    def add_core_dns(self, after: IDependable) -> eks.CfnAddon:
        """CoreDNS is a Deployment: create it once nodes that can run it exist. Before that its
        pods stay Pending and EKS reports the add-on DEGRADED, which CloudFormation accepts as
        created: the stack would succeed with cluster DNS that does not answer until nodes come."""
        core_dns = self._addon("CoreDns", "coredns")
        core_dns.node.add_dependency(after)
        return core_dns

    def add_node_monitoring(self, after: IDependable) -> eks.CfnAddon:
        """The EKS node monitoring agent: a DaemonSet on every node that reports GPU (Xid, NVML),
        EFA and network, storage, kernel and container-runtime faults as Node conditions, which
        the node-health agent turns into instance replacements (infra.constructs.node_health)."""
        addon = self._addon("NodeMonitoring", c.NODE_MONITORING_ADDON)
        addon.node.add_dependency(after)
        return addon

    def _acknowledge_cdk_internals(self) -> None:
        """Findings on resources aws_eks_v2 creates for itself (cluster role, kubectl handler)."""
        acknowledge(
            self.cluster.role,
            (
                "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/AmazonEKSClusterPolicy]",
                "The EKS service role must carry the AWS-managed AmazonEKSClusterPolicy (EKS user guide, "
                "cluster IAM role).",
            ),
        )

        provider = self.cluster.kubectl_provider
        self._skip_checkov_on_kubectl_lambdas(provider)
        stack = cdk.Stack.of(self)
        handler = provider.node.find_child("Handler")
        handler_id = stack.resolve(stack.get_logical_id(handler.node.default_child))
        ecr_public = next(x for x in handler.node.find_all() if isinstance(x, cdk.CfnCondition))
        condition_id = stack.resolve(stack.get_logical_id(ecr_public))
        managed = "arn:<AWS::Partition>:iam::aws:policy/"
        ecr_public_policy = (
            '{"Fn::If":["%s",{"Fn::Join":["",["arn:",{"Ref":"AWS::Partition"},'
            '":iam::aws:policy/AmazonElasticContainerRegistryPublicReadOnly"]]},'
            '{"Ref":"AWS::NoValue"}]}' % condition_id
        )
        acknowledge(
            provider,
            (
                f"AwsSolutions-IAM4[Policy::{managed}service-role/AWSLambdaBasicExecutionRole]",
                "aws_eks_v2 kubectl/helm custom-resource Lambdas: CloudWatch Logs writes only.",
            ),
            (
                f"AwsSolutions-IAM4[Policy::{managed}service-role/AWSLambdaVPCAccessExecutionRole]",
                "The kubectl Lambdas run in the VPC to reach the private API endpoint; this "
                "AWS-maintained policy is the ENI management that requires.",
            ),
            (
                f"AwsSolutions-IAM4[Policy::{managed}AmazonEC2ContainerRegistryReadOnly]",
                "Added by aws_eks_v2 so helm can pull OCI charts from ECR; read-only.",
            ),
            (
                f"AwsSolutions-IAM4[Policy::{ecr_public_policy}]",
                "Added by aws_eks_v2 (aws partition only) so helm can pull OCI charts from ECR "
                "Public; read-only.",
            ),
            (
                "AwsSolutions-L1",
                "The kubectl handler's Python runtime is chosen by aws_eks_v2 to match its bundled "
                "kubectl/helm/awscli layers; it is not configurable.",
            ),
            (
                f"AwsSolutions-IAM5[Resource::<{handler_id}.Arn>:*]",
                "The CDK provider framework invokes versions of its own kubectl handler; the "
                "wildcard covers qualifiers of that one function only.",
            ),
        )

    @staticmethod
    def _skip_checkov_on_kubectl_lambdas(provider: Construct) -> None:
        """checkov's Lambda findings on the functions aws_eks_v2 builds for its kubectl provider
        (the kubectl handler and the provider framework's onEvent), which this code does not
        construct and cannot configure."""
        for function in provider.node.find_all():
            if isinstance(function, lambda_.CfnFunction):
                checkov.skip(
                    function,
                    (
                        "CKV_AWS_115",
                        "Runs only while CloudFormation applies this stack's own manifests and "
                        "charts; a reserved concurrency would only throttle deployments.",
                    ),
                    (
                        "CKV_AWS_116",
                        "The CDK provider framework reports every failure to CloudFormation, which "
                        "rolls the deployment back; no event waits in a queue to be replayed.",
                    ),
                    (
                        "CKV_AWS_173",
                        "The environment holds no secret (an STS endpoint setting, the handler's "
                        "ARN); Lambda encrypts it at rest with its service key.",
                    ),
                )
