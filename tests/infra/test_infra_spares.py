"""Hot spares in the stacks: the Auto Scaling group and a created capacity reservation sized for
node_count + spare_nodes, and the GPU nodes' health signal beyond EC2's (the node monitoring
add-on, the node-health agent with SetInstanceHealth on this group alone)."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest
import yaml

from config import ProfileError, profile_from_dict
from infra import constants as c
from infra.constructs.node_health import AGENT_FILE, NAME
from tests.infra.conftest import raw_profile
from tests.infra.test_infra_stacks import gpu_asg, gpu_launch_template, user_data_text

PROFILES = ["p5", "p4de"]


def test_the_group_holds_the_spares(synth):
    s = synth("p5-spares")
    assert (s.profile.node_count, s.profile.spare_nodes) == (2, 1)
    asg = gpu_asg(s)
    assert (asg["MinSize"], asg["MaxSize"], asg["DesiredCapacity"]) == ("3", "3", "3")


def test_a_created_capacity_reservation_holds_the_whole_group_in_the_placement_group(synth):
    s = synth("p5-spares")
    ((reservation_id, reservation),) = s.resources("gpu", "AWS::EC2::CapacityReservation").items()
    props = reservation["Properties"]
    assert props["InstanceCount"] == 3  # 2 training nodes + 1 spare
    assert props["InstanceType"] == "p5.48xlarge" and props["InstancePlatform"] == "Linux/UNIX"
    assert props["AvailabilityZone"] == s.profile.availability_zone
    assert props["InstanceMatchCriteria"] == "targeted" and props["EndDateType"] == "unlimited"
    ((pg_id, _),) = s.resources("gpu", "AWS::EC2::PlacementGroup").items()
    assert {"Fn::GetAtt": [pg_id, "GroupName"]} in props["PlacementGroupArn"]["Fn::Join"][1]
    assert ":placement-group/" in json.dumps(props["PlacementGroupArn"])
    data = gpu_launch_template(s)
    assert data["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": {"Ref": reservation_id}}
    }
    assert "InstanceMarketOptions" not in data


@pytest.mark.parametrize("variant", ["p5", "p5-capacity-block"])
def test_no_reservation_is_created_unless_asked(synth, variant):
    assert not synth(variant).resources("gpu", "AWS::EC2::CapacityReservation")


def test_a_capacity_block_must_be_named():
    with pytest.raises(ProfileError, match="capacity_block: true needs the id"):
        profile_from_dict(raw_profile("p5") | {"capacity_reservation": {"capacity_block": True}})


def test_spare_nodes_count_against_the_gpu_subnet():
    """A new VPC's /19 GPU subnet has 8,187 usable addresses, 50 per p5 (config.instances):
    163 nodes fit, spares included."""
    profile_from_dict(raw_profile("p5") | {"node_count": 162, "spare_nodes": 1})
    with pytest.raises(ProfileError, match="node_count 163 \\+ spare_nodes 1: .* at most 163"):
        profile_from_dict(raw_profile("p5") | {"node_count": 163, "spare_nodes": 1})


def test_gpu_nodes_pull_images_in_parallel(synth):
    """The trainer image's pull must not hold back the device plugins' images."""
    text = user_data_text(synth("p5"))
    config = yaml.safe_load(text.split("Content-Type: application/node.eks.aws")[1].split("--+AWS+CDK")[0])
    kubelet = config["spec"]["kubelet"]["config"]
    assert kubelet["serializeImagePulls"] is False
    assert kubelet["maxParallelImagePulls"] == c.MAX_PARALLEL_IMAGE_PULLS > 1


@pytest.mark.parametrize("variant", PROFILES)
def test_node_monitoring_agent_addon_waits_for_nodes(synth, variant):
    s = synth(variant)
    (addon,) = [a for a in s.resources("cluster", "AWS::EKS::Addon").values()
                if a["Properties"]["AddonName"] == c.NODE_MONITORING_ADDON]
    nodegroup_id, _ = s.one("cluster", "AWS::EKS::Nodegroup")
    assert nodegroup_id in addon["DependsOn"]


def node_health_role(s) -> tuple[str, dict[str, Any]]:
    (found,) = [(k, r) for k, r in s.resources("gpu", "AWS::IAM::Role").items()
                if r["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"]
                == {"Service": "pods.eks.amazonaws.com"}]
    return found


@pytest.mark.parametrize("variant", ["p5", "p5-spares"])
def test_node_health_may_mark_instances_of_this_group_only(synth, variant):
    s = synth(variant)
    role_id, role = node_health_role(s)
    assert set(role["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Action"]) == {
        "sts:AssumeRole", "sts:TagSession"}
    assert "ManagedPolicyArns" not in role["Properties"]
    policies = [p for p in s.resources("gpu", "AWS::IAM::Policy").values()
                if {"Ref": role_id} in p["Properties"]["Roles"]]
    (statement,) = [st for p in policies for st in p["Properties"]["PolicyDocument"]["Statement"]]
    assert statement["Effect"] == "Allow" and statement["Action"] == "autoscaling:SetInstanceHealth"
    asg_id, _ = s.one("gpu", "AWS::AutoScaling::AutoScalingGroup")
    parts = statement["Resource"]["Fn::Join"][1]
    assert parts[-1] == {"Ref": asg_id}
    assert parts[-2].endswith(":autoScalingGroup:*:autoScalingGroupName/")
    (association,) = s.resources("gpu", "AWS::EKS::PodIdentityAssociation").values()
    props = association["Properties"]
    assert (props["Namespace"], props["ServiceAccount"]) == (c.NODE_HEALTH_NAMESPACE, NAME)
    assert props["RoleArn"] == {"Fn::GetAtt": [role_id, "Arn"]}


def agent_manifest(s) -> tuple[dict, list[dict]]:
    (resource,) = s.resources("gpu", "Custom::AWSCDK-EKS-KubernetesResource").values()
    return resource, json.loads(resource["Properties"]["Manifest"])


@pytest.mark.parametrize("variant", ["p5", "p5-spares"])
def test_node_health_agent_manifests(synth, variant):
    s = synth(variant)
    resource, docs = agent_manifest(s)
    by_kind = {d["kind"]: d for d in docs}
    assert set(by_kind) == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment"}
    assert by_kind["ClusterRole"]["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}]
    assert by_kind["ConfigMap"]["data"]["agent.py"] == AGENT_FILE.read_text()
    deployment = by_kind["Deployment"]
    assert deployment["spec"]["replicas"] == 1
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == NAME
    assert pod["nodeSelector"] == {c.SYSTEM_NODE_GROUP_LABEL[0]: c.SYSTEM_NODE_GROUP_LABEL[1]}
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["runAsNonRoot"] and security["readOnlyRootFilesystem"] and not security["privileged"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert set(container["resources"]["limits"]) == {"cpu", "memory"}
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NODE_SELECTOR"] == "=".join(c.GPU_NODE_GROUP_LABEL)
    assert env["AWS_REGION"] == s.profile.region
    # created after its Pod Identity association: credentials are injected at pod creation
    (association_id,) = s.resources("gpu", "AWS::EKS::PodIdentityAssociation")
    assert association_id in resource["DependsOn"]
    for doc in docs:
        doc = json.loads(json.dumps(doc))
        doc["metadata"]["labels"].pop(next(k for k in doc["metadata"]["labels"] if k.startswith("aws.cdk")), None)
        kubernetes_validate.validate(doc, "1.35.0", strict=True)
