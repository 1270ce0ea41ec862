"""Assertions on the synthesized templates, per profile (p5, p4de) and variants."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from aws_cdk.assertions import Match

from config import network_interface_layout
from infra import constants as c

PROFILES = ["p5", "p4de"]
ALL_VARIANTS = ["p5", "p4de", "p5-capacity-block", "p4de-existing-vpc"]
CONTRACT_OUTPUTS = {
    "ClusterName",
    "KubeconfigCommand",
    "Region",
    "Namespace",
    "FsxFileSystemId",
    "FsxDnsName",
    "FsxMountName",
    "FsxPvcName",
    "EcrRepositoryUri",
    "GpuNodeRoleArn",
    "GpuAutoScalingGroupName",
    "NodeLocalDir",
}


def gpu_launch_template(s) -> dict[str, Any]:
    templates = [
        lt
        for lt in s.resources("gpu", "AWS::EC2::LaunchTemplate").values()
        if "NetworkInterfaces" in lt["Properties"]["LaunchTemplateData"]
    ]
    assert len(templates) == 1
    return templates[0]["Properties"]["LaunchTemplateData"]


def gpu_asg(s) -> dict[str, Any]:
    return s.one("gpu", "AWS::AutoScaling::AutoScalingGroup")[1]["Properties"]


def resolve_subnet(s, ref: Any) -> dict[str, Any] | str:
    """Follow a cross-stack import to the network stack's subnet resource (or a literal id)."""
    if isinstance(ref, str):
        return ref
    export = ref["Fn::ImportValue"]
    for output in s.templates["network"]["Outputs"].values():
        if output.get("Export", {}).get("Name") == export:
            return s.templates["network"]["Resources"][output["Value"]["Ref"]]
    raise AssertionError(f"no export {export}")


def user_data_text(s) -> str:
    parts = gpu_launch_template(s)["UserData"]["Fn::Base64"]["Fn::Join"][1]
    text = ""
    for part in parts:
        if isinstance(part, str):
            text += part
        elif "Fn::Base64" in part:  # the shell part, base64-encoded at deploy time
            text += part["Fn::Base64"]
        else:
            text += "TOKEN"
    return text


# --- cluster ------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", PROFILES)
def test_eks_version_and_auth(synth, variant):
    s = synth(variant)
    s.template("cluster").has_resource_properties(
        "AWS::EKS::Cluster",
        {
            "Version": s.profile.cluster.eks_version,
            "AccessConfig": Match.object_like({"AuthenticationMode": "API"}),
            "KubernetesNetworkConfig": Match.object_like({"ServiceIpv4Cidr": c.SERVICE_IPV4_CIDR}),
        },
    )


@pytest.mark.parametrize("variant", PROFILES)
def test_endpoint_access_and_control_plane_logging(synth, variant):
    # cdk-nag's EKS1/EKS2 rules only see the v1 Cluster class, so check both settings here.
    s = synth(variant)
    _, cluster = s.one("cluster", "AWS::EKS::Cluster")
    props = cluster["Properties"]
    vpc_config = props["ResourcesVpcConfig"]
    mode = s.profile.cluster.endpoint_access
    assert vpc_config["EndpointPublicAccess"] is (mode != "private")
    assert vpc_config["EndpointPrivateAccess"] is (mode != "public")
    cidrs = list(s.profile.cluster.public_access_cidrs) or ["0.0.0.0/0"]
    if mode != "private":
        assert vpc_config.get("PublicAccessCidrs", ["0.0.0.0/0"]) == cidrs
    enabled = {t["Type"] for t in props["Logging"]["ClusterLogging"]["EnabledTypes"]}
    assert enabled == {"api", "audit", "authenticator", "controllerManager", "scheduler"}


@pytest.mark.parametrize("variant", PROFILES)
def test_secrets_encrypted_with_rotating_kms_key(synth, variant):
    s = synth(variant)
    _, cluster = s.one("cluster", "AWS::EKS::Cluster")
    (encryption,) = cluster["Properties"]["EncryptionConfig"]
    assert encryption["Resources"] == ["secrets"]
    key_id = encryption["Provider"]["KeyArn"]["Fn::GetAtt"][0]
    key = s.templates["cluster"]["Resources"][key_id]
    assert key["Type"] == "AWS::KMS::Key" and key["Properties"]["EnableKeyRotation"] is True


@pytest.mark.parametrize("variant", PROFILES)
def test_core_addons_and_pod_identity(synth, variant):
    s = synth(variant)
    addons = {
        a["Properties"]["AddonName"]: (k, a)
        for k, a in s.resources("cluster", "AWS::EKS::Addon").items()
    }
    assert set(addons) == {
        "vpc-cni",
        "kube-proxy",
        "coredns",
        "eks-pod-identity-agent",
        c.FSX_CSI_ADDON,
        c.NODE_MONITORING_ADDON,
    }
    # CoreDNS waits for the system node group (a Deployment with no nodes leaves it DEGRADED).
    nodegroup_id, _ = s.one("cluster", "AWS::EKS::Nodegroup")
    assert nodegroup_id in addons["coredns"][1]["DependsOn"]
    # vpc-cni credentials come from Pod Identity, not the node role.
    (association,) = s.resources("cluster", "AWS::EKS::PodIdentityAssociation").values()
    assert (
        association["Properties"]["Namespace"],
        association["Properties"]["ServiceAccount"],
    ) == (c.VPC_CNI_SERVICE_ACCOUNT)


@pytest.mark.parametrize("variant", PROFILES)
def test_fsx_csi_addon_has_its_own_pod_identity_role(synth, variant):
    s = synth(variant)
    s.template("cluster").has_resource_properties(
        "AWS::EKS::Addon",
        {
            "AddonName": c.FSX_CSI_ADDON,
            "PodIdentityAssociations": [
                {"RoleArn": Match.any_value(), "ServiceAccount": c.FSX_CSI_CONTROLLER_SA}
            ],
        },
    )
    addon = next(
        a
        for a in s.resources("cluster", "AWS::EKS::Addon").values()
        if a["Properties"]["AddonName"] == c.FSX_CSI_ADDON
    )
    role = s.templates["cluster"]["Resources"][
        addon["Properties"]["PodIdentityAssociations"][0]["RoleArn"]["Fn::GetAtt"][0]
    ]
    statement = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert statement[0]["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert set(statement[0]["Action"]) == {"sts:AssumeRole", "sts:TagSession"}


@pytest.mark.parametrize("variant", PROFILES)
def test_namespace_is_created(synth, variant):
    s = synth(variant)
    manifests = [
        json.loads(r["Properties"]["Manifest"])
        for r in s.resources("cluster", "Custom::AWSCDK-EKS-KubernetesResource").values()
        if isinstance(r["Properties"]["Manifest"], str)
    ]
    assert any(
        m[0]["kind"] == "Namespace" and m[0]["metadata"]["name"] == s.profile.namespace
        for m in manifests
    )


# --- GPU nodes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["p5", "p4de", "g5-dev", "p5-capacity-block"])
def test_launch_template_network_interfaces_follow_the_layout(synth, variant):
    s = synth(variant)
    interfaces = gpu_launch_template(s)["NetworkInterfaces"]
    layout = network_interface_layout(s.profile.instance)
    assert [(i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"]) for i in interfaces] == [
        (slot.network_card_index, slot.device_index, slot.interface_type) for slot in layout
    ]
    efa = [i for i in interfaces if i["InterfaceType"] == "efa-only"]
    assert (
        len(efa)
        == s.profile.instance.efa_interfaces
        == {"p5": 32, "p4de": 4, "g5": 1}[s.profile.instance.family]
    )
    assert interfaces[0]["NetworkCardIndex"] == 0 and interfaces[0]["DeviceIndex"] == 0
    for interface in interfaces:
        assert interface["DeleteOnTermination"] is True
        assert len(interface["Groups"]) == 2  # cluster SG + EFA SG


@pytest.mark.parametrize("variant", PROFILES)
def test_efa_security_group_allows_all_traffic_within_itself_only(synth, variant):
    s = synth(variant)
    groups = gpu_launch_template(s)["NetworkInterfaces"][0]["Groups"]
    # The cluster security group comes from the cluster stack (an import), the EFA group is local.
    efa_id = next(
        g["Fn::GetAtt"][0] for g in groups if "Fn::GetAtt" in g and g["Fn::GetAtt"][0].startswith("GpuNodesEfa")
    )
    ingress = [
        r["Properties"]
        for r in s.resources("gpu", "AWS::EC2::SecurityGroupIngress").values()
        if r["Properties"]["GroupId"] == {"Fn::GetAtt": [efa_id, "GroupId"]}
    ]
    egress = [
        r["Properties"]
        for r in s.resources("gpu", "AWS::EC2::SecurityGroupEgress").values()
        if r["Properties"]["GroupId"] == {"Fn::GetAtt": [efa_id, "GroupId"]}
    ]
    self_ref = {"Fn::GetAtt": [efa_id, "GroupId"]}
    assert len(ingress) == 1
    assert ingress[0]["IpProtocol"] == "-1" and ingress[0]["SourceSecurityGroupId"] == self_ref
    assert len(egress) == 1
    assert egress[0]["IpProtocol"] == "-1" and egress[0]["DestinationSecurityGroupId"] == self_ref
    inline = s.templates["gpu"]["Resources"][efa_id]["Properties"]
    assert "SecurityGroupIngress" not in inline
    assert all(rule.get("CidrIp") != "0.0.0.0/0" for rule in inline.get("SecurityGroupEgress", []))


@pytest.mark.parametrize("variant", PROFILES)
def test_placement_group_present_when_configured(synth, variant):
    s = synth(variant)
    assert s.profile.placement_group
    ((pg_id, pg),) = s.resources("gpu", "AWS::EC2::PlacementGroup").items()
    assert pg["Properties"]["Strategy"] == "cluster"
    data = gpu_launch_template(s)
    assert data["Placement"] == {"GroupName": {"Fn::GetAtt": [pg_id, "GroupName"]}}
    assert "CapacityReservationSpecification" not in data
    assert "InstanceMarketOptions" not in data


def test_capacity_block_launches_into_the_placement_group(synth):
    s = synth("p5-capacity-block")
    ((pg_id, _),) = s.resources("gpu", "AWS::EC2::PlacementGroup").items()
    data = gpu_launch_template(s)
    assert data["Placement"] == {"GroupName": {"Fn::GetAtt": [pg_id, "GroupName"]}}
    assert data["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": "cr-0123456789abcdef0"}
    }
    assert data["InstanceMarketOptions"] == {"MarketType": "capacity-block"}


@pytest.mark.parametrize("variant", ["p5", "p4de", "p5-capacity-block"])
def test_gpu_launch_template_basics(synth, variant):
    s = synth(variant)
    data = gpu_launch_template(s)
    assert data["InstanceType"] == s.profile.instance_type
    # The AMI is the profile's release-versioned SSM parameter, never `recommended`.
    param = s.templates["gpu"]["Parameters"][data["ImageId"]["Ref"]]
    assert param["Type"] == "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"
    assert param["Default"] == s.profile.cluster.gpu_ami
    assert "/recommended/" not in param["Default"]
    assert f"/optimized-ami/{s.profile.cluster.eks_version}/" in param["Default"]
    (root,) = data["BlockDeviceMappings"]
    assert root["Ebs"]["Encrypted"] is True and root["Ebs"]["VolumeType"] == "gp3"
    assert root["Ebs"]["VolumeSize"] == c.ROOT_VOLUME_GIB_WITH_NVME


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_every_launch_template_requires_imdsv2(synth, variant):
    s = synth(variant)
    templates = s.all_resources("AWS::EC2::LaunchTemplate")
    assert len(templates) == 2  # GPU + system nodes
    for lt in templates.values():
        assert lt["Properties"]["LaunchTemplateData"]["MetadataOptions"]["HttpTokens"] == "required"
        for device in lt["Properties"]["LaunchTemplateData"]["BlockDeviceMappings"]:
            assert device["Ebs"]["Encrypted"] is True


@pytest.mark.parametrize("variant", PROFILES)
def test_gpu_user_data_joins_labels_taints_raids_and_reserves_hugepages(synth, variant):
    s = synth(variant)
    text = user_data_text(s)
    node_config = yaml.safe_load(
        text.split("Content-Type: application/node.eks.aws")[1].split("--+AWS+CDK")[0]
    )
    spec = node_config["spec"]
    assert node_config["kind"] == "NodeConfig" and spec["cluster"]["cidr"] == c.SERVICE_IPV4_CIDR
    assert "--node-labels=nvrx-eks/node-group=gpu" in spec["kubelet"]["flags"]
    assert "--register-with-taints=nvidia.com/gpu=true:NoSchedule" in spec["kubelet"]["flags"]
    assert spec["instance"]["localStorage"]["strategy"] == "RAID0"
    # kubelet admits only as many pods as the VPC CNI has addresses for.
    assert spec["kubelet"]["config"]["maxPods"] == s.profile.instance.max_pods
    assert f"vm.nr_hugepages={c.NR_HUGEPAGES_2MI}" in text
    # every tmpfs on 2 MiB pages (the pods' /dev/shm: the snapshot slots), now and at each boot
    huge = s.profile.tiers.huge_tmpfs and s.profile.tiers.node_dir == "shm"
    assert (f"echo force > {c.SHMEM_THP_KNOB}" in text) == huge
    assert (f"w {c.SHMEM_THP_KNOB} - - - - force' > {c.SHMEM_THP_TMPFILES}" in text) == huge


@pytest.mark.parametrize("variant", ["p5", "p4de", "p5-capacity-block", "p5-spares"])
def test_gpu_asg_is_fixed_size_in_the_gpu_subnet(synth, variant):
    s = synth(variant)
    asg = gpu_asg(s)
    n = str(s.profile.node_count + s.profile.spare_nodes)  # the spares are nodes of the group
    assert (asg["MinSize"], asg["MaxSize"], asg["DesiredCapacity"]) == (n, n, n)
    (subnet_ref,) = asg["VPCZoneIdentifier"]
    subnet = resolve_subnet(s, subnet_ref)
    assert subnet["Properties"]["AvailabilityZone"] == s.profile.availability_zone
    assert subnet["Properties"]["Tags"] and any(
        t == {"Key": "aws-cdk:subnet-type", "Value": "Private"}
        for t in subnet["Properties"]["Tags"]
    )


@pytest.mark.parametrize("variant", PROFILES)
def test_gpu_node_role_is_least_privilege_with_ec2_linux_access_entry(synth, variant):
    s = synth(variant)
    resources = s.templates["gpu"]["Resources"]
    role_id = next(
        k
        for k in resources
        if k.startswith("GpuNodesNodeRole") and resources[k]["Type"] == "AWS::IAM::Role"
    )
    role = resources[role_id]["Properties"]
    policies = {p["Fn::Join"][1][-1].rsplit("/", 1)[-1] for p in role["ManagedPolicyArns"]}
    assert policies == {"AmazonEKSWorkerNodePolicy", "AmazonEC2ContainerRegistryPullOnly"}
    assert not any(
        p["Properties"].get("Roles") and {"Ref": role_id} in p["Properties"]["Roles"]
        for p in s.all_resources("AWS::IAM::Policy").values()
    )
    s.template("gpu").has_resource_properties(
        "AWS::EKS::AccessEntry",
        {
            "Type": "EC2_LINUX",
            "PrincipalArn": {"Fn::GetAtt": [role_id, "Arn"]},
            "AccessPolicies": [],
        },
    )


# --- storage -----------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_fsx_scratch2_in_the_gpu_subnet(synth, variant):
    s = synth(variant)
    _, fs = s.one("cluster", "AWS::FSx::FileSystem")
    props = fs["Properties"]
    assert props["FileSystemType"] == "LUSTRE" and props["FileSystemTypeVersion"] == "2.15"
    assert props["StorageCapacity"] == s.profile.storage.fsx_capacity_gib
    # SCRATCH_2 has one throughput, no metadata configuration and no backups; it is always
    # encrypted at rest with an FSx-managed key and takes no KmsKeyId.
    assert props["LustreConfiguration"] == {"DeploymentType": "SCRATCH_2", "DataCompressionType": "LZ4"}
    assert "KmsKeyId" not in props
    assert props["SubnetIds"] == gpu_asg(s)["VPCZoneIdentifier"]
    assert fs["DeletionPolicy"] == "Delete"


def test_fsx_persistent2_has_the_profiles_tier_a_key_of_its_own_and_no_backups(synth):
    s = synth("p5-persistent")
    storage = s.profile.storage
    assert (storage.deployment_type, storage.throughput_mb_s_per_tib) == ("PERSISTENT_2", 500)
    template = s.template("cluster")
    template.resource_count_is("AWS::FSx::FileSystem", 1)
    template.has_resource(
        "AWS::FSx::FileSystem",
        {
            # `cdk destroy` deletes it, as it deletes SCRATCH_2: nothing is left billing.
            "DeletionPolicy": "Delete",
            "UpdateReplacePolicy": "Delete",
            "Properties": Match.object_like(
                {
                    "FileSystemTypeVersion": "2.15",  # what a metadata configuration needs
                    "StorageCapacity": 4800,
                    "KmsKeyId": {"Ref": Match.string_like_regexp("^StorageKey")},
                    "LustreConfiguration": Match.object_equals(
                        {
                            "DeploymentType": "PERSISTENT_2",
                            "PerUnitStorageThroughput": 500,
                            "DataCompressionType": "LZ4",
                            "MetadataConfiguration": {"Mode": "AUTOMATIC"},
                            "AutomaticBackupRetentionDays": 0,
                        }
                    ),
                }
            ),
        },
    )
    _, fs = s.one("cluster", "AWS::FSx::FileSystem")
    key = s.templates["cluster"]["Resources"][fs["Properties"]["KmsKeyId"]["Ref"]]
    assert key["Type"] == "AWS::KMS::Key" and key["Properties"]["EnableKeyRotation"] is True
    assert key["DeletionPolicy"] == "Delete" and key["Properties"]["PendingWindowInDays"] == 7
    assert fs["Properties"]["SubnetIds"] == gpu_asg(s)["VPCZoneIdentifier"]


@pytest.mark.parametrize("variant", PROFILES)
def test_fsx_security_group_opens_lustre_only_to_nodes(synth, variant):
    s = synth(variant)
    _, fs = s.one("cluster", "AWS::FSx::FileSystem")
    (sg_ref,) = fs["Properties"]["SecurityGroupIds"]
    fsx_sg = sg_ref["Fn::GetAtt"][0]
    _, cluster = s.one("cluster", "AWS::EKS::Cluster")
    cluster_id = next(k for k, v in s.templates["cluster"]["Resources"].items() if v is cluster)
    allowed_sources = [
        {"Fn::GetAtt": [fsx_sg, "GroupId"]},
        {"Fn::GetAtt": [cluster_id, "ClusterSecurityGroupId"]},
    ]
    rules = [
        r["Properties"]
        for r in s.resources("cluster", "AWS::EC2::SecurityGroupIngress").values()
        if r["Properties"]["GroupId"] == {"Fn::GetAtt": [fsx_sg, "GroupId"]}
    ]
    assert {(r["FromPort"], r["ToPort"]) for r in rules} == {(988, 988), (1018, 1023)}
    for rule in rules:
        assert rule["IpProtocol"] == "tcp"
        assert rule["SourceSecurityGroupId"] in allowed_sources
        assert "CidrIp" not in rule
    assert "SecurityGroupIngress" not in s.templates["cluster"]["Resources"][fsx_sg]["Properties"]


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_no_ingress_from_the_internet(synth, variant):
    # The profiles open nothing to the world; node and FSx traffic is security-group to group.
    s = synth(variant)
    rules: list[dict[str, Any]] = []
    for sg in s.all_resources("AWS::EC2::SecurityGroup").values():
        rules.extend(sg["Properties"].get("SecurityGroupIngress", []))
    rules.extend(
        r["Properties"] for r in s.all_resources("AWS::EC2::SecurityGroupIngress").values()
    )
    assert rules
    for rule in rules:
        assert rule.get("CidrIp") not in ("0.0.0.0/0",) and rule.get("CidrIpv6") not in ("::/0",), (
            rule
        )


@pytest.mark.parametrize("variant", PROFILES)
def test_pv_and_pvc_depend_on_the_file_system(synth, variant):
    s = synth(variant)
    fs_id, fs = s.one("cluster", "AWS::FSx::FileSystem")
    volume = next(
        r
        for r in s.resources("cluster", "Custom::AWSCDK-EKS-KubernetesResource").values()
        if "PersistentVolume" in json.dumps(r["Properties"]["Manifest"])
    )
    manifest = volume["Properties"]["Manifest"]
    # The manifest embeds the file system's id, DNS name and mount name: CloudFormation orders
    # the PV/PVC after the file system on create and before it on delete.
    refs = json.dumps(manifest)
    assert json.dumps({"Ref": fs_id}) in refs
    assert json.dumps({"Fn::GetAtt": [fs_id, "LustreMountName"]}) in refs
    assert json.dumps({"Fn::GetAtt": [fs_id, "DNSName"]}) in refs
    csi_id = next(
        k
        for k, a in s.resources("cluster", "AWS::EKS::Addon").items()
        if a["Properties"]["AddonName"] == c.FSX_CSI_ADDON
    )
    assert csi_id in volume["DependsOn"]
    text = "".join(p if isinstance(p, str) else "X" for p in manifest["Fn::Join"][1])
    pv, pvc = json.loads(text)
    assert pv["kind"] == "PersistentVolume" and pv["spec"]["csi"]["driver"] == c.FSX_CSI_DRIVER
    assert pv["spec"]["accessModes"] == ["ReadWriteMany"] and pv["spec"]["storageClassName"] == ""
    assert pvc["kind"] == "PersistentVolumeClaim"
    assert pvc["metadata"]["name"] == c.FSX_PVC_NAME
    assert pvc["metadata"]["namespace"] == s.profile.namespace
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"] and pvc["spec"]["storageClassName"] == ""
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"]
    assert (
        pvc["spec"]["resources"]["requests"]["storage"] == f"{s.profile.storage.fsx_capacity_gib}Gi"
    )


# --- device plugins, registry, network, outputs ------------------------------------------------


@pytest.mark.parametrize("variant", PROFILES)
def test_device_plugin_helm_charts_are_pinned_and_tolerate_the_gpu_taint(synth, variant):
    s = synth(variant)
    charts = {
        r["Properties"]["Chart"]: r["Properties"]
        for r in s.resources("cluster", "Custom::AWSCDK-EKS-HelmChart").values()
    }
    for pin in (c.NVIDIA_DEVICE_PLUGIN, c.EFA_DEVICE_PLUGIN):
        assert charts[pin.chart]["Version"] == pin.version
        assert charts[pin.chart]["Repository"] == pin.repository
        assert (charts[pin.chart]["Release"], charts[pin.chart]["Namespace"]) == (pin.release, pin.namespace)
    for chart in charts.values():
        values = json.loads(chart["Values"])
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in values[
            "tolerations"
        ]


def rotating_key_of(s, role: str, key_arn: Any) -> dict[str, Any]:
    """The KMS key a `Fn::GetAtt [key, Arn]` names, checked to rotate."""
    key = s.templates[role]["Resources"][key_arn["Fn::GetAtt"][0]]
    assert key["Type"] == "AWS::KMS::Key" and key["Properties"]["EnableKeyRotation"] is True
    return key


@pytest.mark.parametrize("variant", PROFILES)
def test_registry_scans_on_push_with_immutable_tags(synth, variant):
    s = synth(variant)
    s.template("registry").has_resource_properties(
        "AWS::ECR::Repository",
        {
            "ImageScanningConfiguration": {"ScanOnPush": True},
            "ImageTagMutability": "IMMUTABLE",
            "EmptyOnDelete": True,
        },
    )


@pytest.mark.parametrize("variant", PROFILES)
def test_registry_images_are_encrypted_with_a_rotating_key(synth, variant):
    s = synth(variant)
    _, repository = s.one("registry", "AWS::ECR::Repository")
    encryption = repository["Properties"]["EncryptionConfiguration"]
    assert encryption["EncryptionType"] == "KMS"
    rotating_key_of(s, "registry", encryption["KmsKey"])


@pytest.mark.parametrize("variant", ["p5", "p4de-existing-vpc"])
def test_flow_logs_are_encrypted_with_a_key_only_their_log_group_may_use(synth, variant):
    s = synth(variant)
    _, group = s.one("network", "AWS::Logs::LogGroup")
    name = group["Properties"]["LogGroupName"]
    key = rotating_key_of(s, "network", group["Properties"]["KmsKeyId"])
    statements = key["Properties"]["KeyPolicy"]["Statement"]
    (logs,) = [st for st in statements if st["Principal"].get("Service", "").startswith("logs.")]
    assert logs["Principal"]["Service"] == f"logs.{s.profile.region}.amazonaws.com"
    assert not any("*" == a or a.startswith("kms:Create") for a in logs["Action"])
    (arn,) = logs["Condition"]["ArnEquals"].values()
    assert arn["Fn::Join"][1][-1].endswith(f":log-group:{name}")
    # The only other statement is the account's own administration of the key, through IAM.
    (admin,) = [st for st in statements if st is not logs]
    assert admin["Principal"]["AWS"]["Fn::Join"][1][-1].endswith(":root")


@pytest.mark.parametrize("variant", PROFILES)
def test_new_vpc_has_flow_logs_and_spans_the_gpu_az(synth, variant):
    s = synth(variant)
    s.template("network").resource_count_is("AWS::EC2::VPC", 1)
    s.template("network").has_resource_properties(
        "AWS::EC2::FlowLog", {"ResourceType": "VPC", "TrafficType": "ALL"}
    )
    azs = {
        sn["Properties"]["AvailabilityZone"]
        for sn in s.resources("network", "AWS::EC2::Subnet").values()
    }
    assert s.profile.availability_zone in azs and len(azs) == 2


def test_existing_vpc_is_reused_with_flow_logs(synth):
    s = synth("p4de-existing-vpc")
    s.template("network").resource_count_is("AWS::EC2::VPC", 0)
    s.template("network").has_resource_properties(
        "AWS::EC2::FlowLog", {"ResourceId": "vpc-0123456789abcdef0", "ResourceType": "VPC"}
    )
    # The private subnet in the profile's AZ (index 1 in the cached lookup) carries GPUs and FSx.
    assert gpu_asg(s)["VPCZoneIdentifier"] == ["subnet-0ace0000000000001"]


@pytest.mark.parametrize("variant", PROFILES)
def test_outputs_match_the_manifest_contract(synth, variant):
    s = synth(variant)
    keys: list[str] = []
    for template in s.templates.values():
        keys.extend(k for k in template.get("Outputs", {}) if not k.startswith("ExportsOutput"))
    assert sorted(keys) == sorted(CONTRACT_OUTPUTS)  # each exactly once across stacks
    outputs = s.templates["cluster"]["Outputs"]
    assert outputs["Namespace"]["Value"] == s.profile.namespace
    assert outputs["FsxPvcName"]["Value"] == c.FSX_PVC_NAME
    assert outputs["NodeLocalDir"]["Value"] == c.NODE_LOCAL_DIR
    assert outputs["NodeLocalDir"]["Value"].startswith(c.NODEADM_RAID_MOUNT + "/")
    assert "update-kubeconfig" in json.dumps(outputs["KubeconfigCommand"]["Value"])


# --- pure helpers (no synthesis) ---------------------------------------------------------------


def test_node_user_data_without_efa_or_instance_store():
    from dataclasses import replace

    from config import INSTANCE_TYPES
    from infra.constructs.gpu_nodes import gpu_user_data, node_config

    config = node_config(
        cluster_name="c",
        endpoint="https://e",
        certificate_authority="ca",
        local_storage=False,
        max_pods=58,
    )
    assert "instance" not in config["spec"]
    no_efa = INSTANCE_TYPES["g5.xlarge"]
    assert no_efa.efa_interfaces == 0
    rendered = gpu_user_data(
        cluster_name="c", endpoint="https://e", certificate_authority="ca", instance=no_efa
    ).render()
    assert "nr_hugepages" not in rendered and "application/node.eks.aws" in rendered
    assert "x-shellscript" not in rendered  # no huge pages to reserve, no tmpfs to change
    rendered = gpu_user_data(
        cluster_name="c", endpoint="https://e", certificate_authority="ca", instance=no_efa,
        huge_tmpfs=True,
    ).render()
    assert "x-shellscript" in rendered
    bare = replace(no_efa, nvme_devices=0)
    rendered = gpu_user_data(
        cluster_name="c", endpoint="https://e", certificate_authority="ca", instance=bare
    ).render()
    assert "localStorage" not in rendered


def test_hugepages_cover_every_training_pod_with_headroom():
    from config import contract

    pages_needed = contract.HUGEPAGES_2MI_PER_POD_MIB // 2 * contract.TRAINING_PODS_PER_NODE
    assert c.NR_HUGEPAGES_2MI >= 2 * pages_needed == 5120


def test_cloudwatch_addon_only_where_the_profile_asks_with_its_own_pod_identity_role(synth):
    """`observability.cloudwatch`: the add-on, its agent's policy on a Pod Identity role of the
    add-on's service account (never on a node role); without it, no add-on."""
    s = synth("p4de-jobset")
    addons = [a for a in s.resources("cluster", "AWS::EKS::Addon").values()
              if a["Properties"]["AddonName"] == c.CLOUDWATCH_ADDON]
    (addon,) = addons
    (association,) = addon["Properties"]["PodIdentityAssociations"]
    assert association["ServiceAccount"] == c.CLOUDWATCH_AGENT_SA
    role = s.templates["cluster"]["Resources"][association["RoleArn"]["Fn::GetAtt"][0]]
    statement = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert statement[0]["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    (policy,) = role["Properties"]["ManagedPolicyArns"]
    assert "CloudWatchAgentServerPolicy" in json.dumps(policy)
    assert "Policies" not in role["Properties"]  # nothing beyond the managed policy
    assert set(addon["DependsOn"]) & {k for k, r in s.templates["cluster"]["Resources"].items()
                                      if r["Type"] == "AWS::EKS::Nodegroup"}
    for template in s.templates.values():  # no node role carries it
        for resource in template["Resources"].values():
            if resource["Type"] == "AWS::IAM::Role" and resource is not role:
                assert "CloudWatchAgentServerPolicy" not in json.dumps(resource["Properties"])
    default = synth("p5")
    assert not [a for a in default.resources("cluster", "AWS::EKS::Addon").values()
                if a["Properties"]["AddonName"] == c.CLOUDWATCH_ADDON]
