"""EKS version and upgrade policy, stack boundaries, networking defaults, CNI settings, JobSet."""

from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Match

from config.versions import KUBECTL_LAYER_MINOR, STANDARD_SUPPORT

PROFILES = ["p5", "p4de"]


@pytest.mark.parametrize("variant", PROFILES)
def test_version_in_standard_support_with_an_explicit_upgrade_policy(synth, variant):
    s = synth(variant)
    assert s.profile.cluster.eks_version in STANDARD_SUPPORT
    s.template("cluster").has_resource_properties(
        "AWS::EKS::Cluster",
        {
            "Version": s.profile.cluster.eks_version,
            "UpgradePolicy": {"SupportType": "STANDARD"},
        },
    )
    # The bundled kubectl layer is within one minor version of the cluster.
    assert abs(int(s.profile.cluster.eks_version.split(".")[1]) - KUBECTL_LAYER_MINOR) <= 1
    assert not [m for m in s.messages if "kubectl-skew" in m[1]]


@pytest.mark.parametrize("variant", PROFILES)
def test_gpu_capacity_lives_in_its_own_stack(synth, variant):
    s = synth(variant)
    assert not s.resources("cluster", "AWS::AutoScaling::AutoScalingGroup")
    assert not s.resources("cluster", "AWS::EC2::PlacementGroup")
    assert len(s.resources("gpu", "AWS::AutoScaling::AutoScalingGroup")) == 1
    assert len(s.resources("gpu", "AWS::EC2::PlacementGroup")) == 1
    # Only GPU node resources: nothing a capacity failure could take down with it. The
    # node-health agent (role, policy, Pod Identity, its manifest) serves these nodes alone.
    kinds = {r["Type"] for r in s.templates["gpu"]["Resources"].values()}
    assert kinds <= {
        "AWS::IAM::Role", "AWS::IAM::InstanceProfile", "AWS::EKS::AccessEntry",
        "AWS::EC2::SecurityGroup", "AWS::EC2::SecurityGroupIngress", "AWS::EC2::SecurityGroupEgress",
        "AWS::EC2::PlacementGroup", "AWS::EC2::LaunchTemplate", "AWS::AutoScaling::AutoScalingGroup",
        "AWS::EC2::CapacityReservation", "AWS::IAM::Policy", "AWS::EKS::PodIdentityAssociation",
        "Custom::AWSCDK-EKS-KubernetesResource",
    }  # fmt: skip


@pytest.mark.parametrize("variant", PROFILES)
def test_vpc_spans_exactly_the_profiles_two_azs(synth, variant):
    s = synth(variant)
    azs = {
        r["Properties"]["AvailabilityZone"] for r in s.resources("network", "AWS::EC2::Subnet").values()
    }
    assert azs == {s.profile.availability_zone, s.profile.cluster.second_availability_zone}


@pytest.mark.parametrize("variant", PROFILES)
def test_endpoint_is_private_by_default(synth, variant):
    s = synth(variant)
    assert s.profile.cluster.endpoint_access == "private"
    _, cluster = s.one("cluster", "AWS::EKS::Cluster")
    vpc_config = cluster["Properties"]["ResourcesVpcConfig"]
    assert vpc_config["EndpointPublicAccess"] is False and vpc_config["EndpointPrivateAccess"] is True


def test_public_endpoint_is_limited_to_the_profiles_cidrs(synth):
    s = synth("p4de-jobset")
    _, cluster = s.one("cluster", "AWS::EKS::Cluster")
    vpc_config = cluster["Properties"]["ResourcesVpcConfig"]
    assert vpc_config["EndpointPublicAccess"] is True
    assert vpc_config["PublicAccessCidrs"] == ["203.0.113.0/24"]


@pytest.mark.parametrize("variant", PROFILES)
def test_vpc_cni_enforces_network_policies(synth, variant):
    s = synth(variant)
    (cni,) = [a for a in s.resources("cluster", "AWS::EKS::Addon").values() if a["Properties"]["AddonName"] == "vpc-cni"]
    assert json.loads(cni["Properties"]["ConfigurationValues"]) == {"enableNetworkPolicy": "true"}


def test_jobset_controller_only_when_chosen(synth):
    def jobset_charts(variant: str) -> list[dict]:
        charts = synth(variant).resources("cluster", "Custom::AWSCDK-EKS-HelmChart").values()
        return [c["Properties"] for c in charts if c["Properties"]["Chart"] == "jobset"]

    assert jobset_charts("p4de") == []
    (chart,) = jobset_charts("p4de-jobset")
    assert chart["Repository"].startswith("oci://registry.k8s.io/jobset/")
    assert chart["Version"] and chart["Namespace"] == "jobset-system" and chart["Wait"] is True
    values = json.loads(chart["Values"]) if isinstance(chart["Values"], str) else chart["Values"]
    assert values["controller"]["nodeSelector"] == {"nvrx-eks/node-group": "system"}


def test_jobset_variant_passes_the_nag_checks(synth):
    assert synth("p4de-jobset").violations == []


@pytest.mark.parametrize("variant", PROFILES)
def test_core_dns_waits_for_the_system_nodes(synth, variant):
    s = synth(variant)
    nodegroup_id, _ = s.one("cluster", "AWS::EKS::Nodegroup")
    s.template("cluster").has_resource(
        "AWS::EKS::Addon",
        {"Properties": Match.object_like({"AddonName": "coredns"}), "DependsOn": Match.array_with([nodegroup_id])},
    )


def test_gpu_image_pinned_by_ami_id(synth):
    s = synth("g5-ami-id")
    (lt,) = [
        t for t in s.resources("gpu", "AWS::EC2::LaunchTemplate").values()
        if "NetworkInterfaces" in t["Properties"]["LaunchTemplateData"]
    ]
    assert lt["Properties"]["LaunchTemplateData"]["ImageId"] == "ami-0123456789abcdef0"
    assert not s.templates["gpu"].get("Parameters", {}).keys() - {"BootstrapVersion"}


@pytest.mark.parametrize(
    "instance_type, max_pods",
    [
        # card 0 holds 2 interfaces of 50 addresses; the EFA-only one leaves 1: 1 x 49 + 2.
        ("p5.48xlarge", 51),
        # 15 interfaces on card 0, one taken by EFA: 14 x 49 + 2 (737 without EFA).
        ("p4de.24xlarge", 688),
        # 8 interfaces of 30 addresses, one EFA: 7 x 29 + 2 (234 without EFA).
        ("g5.8xlarge", 205),
        # No EFA: 4 x 14 + 2, the VPC CNI's own figure.
        ("g5.xlarge", 58),
    ],
)
def test_max_pods_by_hand(instance_type, max_pods):
    from config import instance_spec

    assert instance_spec(instance_type).max_pods == max_pods


@pytest.mark.parametrize("variant", PROFILES)
def test_kubectl_handler_reaches_the_private_endpoint_from_the_vpc(synth, variant):
    s = synth(variant)
    handlers = [
        f["Properties"] for k, f in s.resources("cluster", "AWS::Lambda::Function").items() if "KubectlProvider" in k
    ]
    assert handlers and all(h["VpcConfig"]["SubnetIds"] for h in handlers)
