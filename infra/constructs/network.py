"""VPC for the cluster: private subnets in two AZs, the GPU nodes and FSx in the profile's AZ."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

from config import contract
from infra.constructs.keys import rotating_key
from infra.errors import DeploymentError

# Placeholders CDK uses while an availability-zone or VPC lookup is still pending.
_DUMMY_AZS = {"dummy1a", "dummy1b", "dummy1c"}
_DUMMY_VPC_ID = "vpc-12345"


@dataclass(frozen=True)
class NetworkProps:
    availability_zone: str  # where the GPU capacity is; GPU nodes and FSx go here
    second_availability_zone: Optional[str] = None  # the control plane's second AZ (new VPC)
    vpc_cidr: str = "10.0.0.0/16"
    vpc_id: Optional[str] = None  # reuse an existing VPC (needs a lookup, i.e. credentials once)


class Network(Construct):
    """A new VPC (or an existing one by id), its flow log, and the GPU subnet.

    EKS needs control-plane subnets in at least two AZs, so a new VPC spans the profile's AZ and
    the profile's `cluster.second_availability_zone` (checked against the account's AZs, like
    the first); everything latency-sensitive (GPU nodes, FSx) is pinned to the profile's AZ.
    """

    vpc: ec2.IVpc
    gpu_subnet: ec2.ISubnet

    def __init__(self, scope: Construct, construct_id: str, props: NetworkProps) -> None:
        super().__init__(scope, construct_id)
        stack = cdk.Stack.of(self)
        az = props.availability_zone
        known_azs = [a for a in stack.availability_zones if not cdk.Token.is_unresolved(a)]
        lookup_pending = not known_azs or set(known_azs) <= _DUMMY_AZS
        for name, zone in (("availability zone", az), ("second availability zone", props.second_availability_zone)):
            if zone and not lookup_pending and zone not in known_azs:
                raise DeploymentError(
                    f"{name} {zone} does not exist in {stack.region} for this account "
                    f"(it has {', '.join(known_azs)})"
                )

        if props.vpc_id:
            self.vpc = ec2.Vpc.from_lookup(self, "Vpc", vpc_id=props.vpc_id)
        else:
            if not props.second_availability_zone or props.second_availability_zone == az:
                raise DeploymentError(
                    "a new VPC needs a second availability zone other than "
                    f"{az} (cluster.second_availability_zone)"
                )
            self.vpc = self._new_vpc(az, props.second_availability_zone, props.vpc_cidr)

        # Flow logs for either kind of VPC: a second flow log on an existing VPC is harmless.
        log_group = self._flow_log_group(stack)
        ec2.FlowLog(
            self,
            "FlowLog",
            resource_type=ec2.FlowLogResourceType.from_vpc(self.vpc),
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(log_group),
            traffic_type=ec2.FlowLogTrafficType.ALL,
        )

        private = self.vpc.select_subnets(
            subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, availability_zones=[az]
        ).subnets
        if not private:
            if not (props.vpc_id and self.vpc.vpc_id == _DUMMY_VPC_ID):
                raise DeploymentError(
                    f"VPC {props.vpc_id or 'of this stack'} has no private subnet with egress in {az} "
                    "for the GPU nodes and FSx"
                )
            # The lookup is pending: the CLI resolves it and synthesizes again.
            private = self.vpc.select_subnets(
                subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS
            ).subnets
        self.gpu_subnet = private[0]

    def _flow_log_group(self, stack: cdk.Stack) -> logs.LogGroup:
        """The flow log group, encrypted with a key of its own. The key admits CloudWatch Logs of
        this region for this one log group only (the encryption context names its ARN), so the
        group is named: its ARN must be known before the group exists."""
        name = f"/nvrx-eks/{stack.stack_name}/vpc-flow-logs"
        arn = stack.format_arn(
            service="logs",
            resource="log-group",
            resource_name=name,
            arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
        )
        key = rotating_key(self, "FlowLogKey", f"VPC flow logs in {name}")
        key.add_to_resource_policy(
            iam.PolicyStatement(
                principals=[iam.ServicePrincipal(f"logs.{stack.region}.amazonaws.com")],
                actions=[
                    "kms:Encrypt",
                    "kms:Decrypt",
                    "kms:ReEncrypt*",
                    "kms:GenerateDataKey*",
                    "kms:DescribeKey",
                ],
                resources=["*"],  # in a key policy, "*" is this key
                conditions={"ArnEquals": {"kms:EncryptionContext:aws:logs:arn": arn}},
            )
        )
        return logs.LogGroup(
            self,
            "FlowLogGroup",
            log_group_name=name,
            encryption_key=key,
            retention=logs.RetentionDays.ONE_MONTH,
            removal_policy=cdk.RemovalPolicy.DESTROY,
        )

    def _new_vpc(self, az: str, other_az: str, cidr: str) -> ec2.Vpc:
        azs = [az, other_az]
        vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(cidr),
            availability_zones=azs,
            subnet_configuration=[
                ec2.SubnetConfiguration(
                    name="Public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24
                ),
                # /19: room for pod IPs (VPC CNI gives every pod a VPC address); EFA-only
                # interfaces take no address.
                ec2.SubnetConfiguration(
                    name="Private", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS,
                    cidr_mask=contract.PRIVATE_SUBNET_PREFIX,
                ),
            ],
            # One NAT gateway, in the GPU AZ, so GPU-node egress does not cross AZs.
            nat_gateways=1,
            nat_gateway_subnets=ec2.SubnetSelection(
                subnet_group_name="Public", availability_zones=[az]
            ),
            enable_dns_hostnames=True,
            enable_dns_support=True,
            restrict_default_security_group=False,
        )
        # Image layers from ECR and S3 data stay on the AWS network (and off the NAT bill).
        vpc.add_gateway_endpoint("S3", service=ec2.GatewayVpcEndpointAwsService.S3)
        # Subnet tags the AWS load balancer integration looks for.
        for subnet in vpc.public_subnets:
            cdk.Tags.of(subnet).add("kubernetes.io/role/elb", "1")
        for subnet in vpc.private_subnets:
            cdk.Tags.of(subnet).add("kubernetes.io/role/internal-elb", "1")
        return vpc
