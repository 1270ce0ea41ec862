"""FSx for Lustre (SCRATCH_2 or PERSISTENT_2) next to the GPU nodes, its CSI driver, and the static
PV/PVC."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_fsx as fsx
from aws_cdk import aws_iam as iam
from constructs import Construct, IDependable

from config.fsx import FileSystem
from infra import constants as c
from infra.constructs.cluster import pod_identity_role
from infra.constructs.keys import rotating_key
from infra.errors import DeploymentError
from infra.nag import acknowledge


@dataclass(frozen=True)
class StorageProps:
    cluster: eks.Cluster
    vpc: ec2.IVpc
    subnet: ec2.ISubnet  # the GPU nodes' subnet: checkpoint traffic stays in one AZ
    file_system: FileSystem
    import_path: Optional[str]
    namespace: str
    namespace_manifest: IDependable
    pod_identity_agent: IDependable


def lustre_ports() -> list[ec2.Port]:
    low, high = c.LUSTRE_PORT_RANGE
    return [ec2.Port.tcp(c.LUSTRE_PORT), ec2.Port.tcp_range(low, high)]


def persistent_volume(
    *, name: str, capacity_gib: int, file_system_id: str, dns_name: str, mount_name: str
) -> dict:
    """A static PV for an existing FSx file system (FSx CSI driver, static provisioning)."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": f"{capacity_gib}Gi"},
            "volumeMode": "Filesystem",
            "accessModes": ["ReadWriteMany"],
            "mountOptions": ["flock"],
            # The file system's life is CloudFormation's business, not Kubernetes'.
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "csi": {
                "driver": c.FSX_CSI_DRIVER,
                "volumeHandle": file_system_id,
                "volumeAttributes": {"dnsname": dns_name, "mountname": mount_name},
            },
        },
    }


def persistent_volume_claim(
    *, name: str, namespace: str, volume_name: str, capacity_gib: int
) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "volumeName": volume_name,
            "resources": {"requests": {"storage": f"{capacity_gib}Gi"}},
        },
    }


class Storage(Construct):
    """Shared checkpoint and data storage.

    Both deployment types are encrypted in transit between supported instances and keep LZ4
    compression on. SCRATCH_2 is encrypted at rest with an FSx-managed key (always on, not
    configurable) and has no replication and no backups. PERSISTENT_2 replicates its disks within
    the AZ and replaces failed servers; it is encrypted at rest with a customer-managed, rotating
    KMS key of its own, and created with a metadata configuration in Automatic mode, so its
    Metadata IOPS grow with its capacity and can be raised later (only a file system created with
    one can). Its automatic daily backups are off: FSx deletes them with the file system, so they
    would not outlive `cdk destroy`, and the checkpoints they would copy change at every
    checkpoint interval; a user-initiated backup (`aws fsx create-backup`) outlives the stack.
    Either type is deleted by `cdk destroy` with everything on it: a retained file system would
    go on billing, and its network interfaces would keep the stack's subnet and security group
    from being deleted. The security group admits Lustre (988, 1018-1023) only from itself and
    the cluster security group that every node carries.

    The PV and PVC are created through the cluster's kubectl handler and depend on the file
    system, so `cdk destroy` deletes them (and waits) before it deletes the file system.
    """

    file_system: fsx.CfnFileSystem
    security_group: ec2.SecurityGroup
    csi_driver: eks.CfnAddon
    csi_role: iam.Role
    pv_name: str
    pvc_name: str
    volume: eks.KubernetesManifest

    def __init__(self, scope: Construct, construct_id: str, props: StorageProps) -> None:
        super().__init__(scope, construct_id)
        cluster = props.cluster

        self.security_group = ec2.SecurityGroup(
            self,
            "SecurityGroup",
            vpc=props.vpc,
            description="FSx for Lustre: Lustre ports from the cluster nodes and the file servers",
            allow_all_outbound=True,
        )
        nodes = ec2.SecurityGroup.from_security_group_id(
            self, "ClusterSecurityGroup", cluster.cluster_security_group_id, mutable=True
        )
        for port in lustre_ports():
            self.security_group.add_ingress_rule(
                self.security_group, port, "Lustre between file servers"
            )
            self.security_group.add_ingress_rule(nodes, port, "Lustre from cluster nodes")
            # Lustre clients also accept connections from the servers.
            nodes.add_ingress_rule(self.security_group, port, "Lustre from FSx")

        if props.import_path is not None and not props.import_path.startswith("s3://"):
            raise DeploymentError(
                f"fsx_import_path {props.import_path!r} must be an s3://bucket[/prefix] URI"
            )
        spec = props.file_system
        # The L1 resource: the L2 LustreFileSystem adds its own 988-1023 rule to the group.
        # Lustre 2.15 is supported by every deployment type and recommended for new file systems
        # (FSx API, CreateFileSystem FileSystemTypeVersion); the AL2023 client is 2.15.
        self.file_system = fsx.CfnFileSystem(
            self,
            "FileSystem",
            file_system_type="LUSTRE",
            file_system_type_version="2.15",
            storage_capacity=spec.capacity_gib,
            subnet_ids=[props.subnet.subnet_id],
            security_group_ids=[self.security_group.security_group_id],
            kms_key_id=(
                rotating_key(self, "Key", "FSx for Lustre checkpoints and data").key_id
                if spec.persistent
                else None
            ),
            lustre_configuration=fsx.CfnFileSystem.LustreConfigurationProperty(
                deployment_type=spec.deployment_type,
                per_unit_storage_throughput=spec.throughput_mb_s_per_tib,
                data_compression_type="LZ4",
                import_path=props.import_path,
                metadata_configuration=(
                    fsx.CfnFileSystem.MetadataConfigurationProperty(mode="AUTOMATIC")
                    if spec.persistent
                    else None
                ),
                automatic_backup_retention_days=0 if spec.persistent else None,
            ),
        )
        self.file_system.apply_removal_policy(cdk.RemovalPolicy.DESTROY)

        # The controller only serves static volumes here: describing file systems is all it does.
        self.csi_role = pod_identity_role(self, "CsiControllerRole", "FSx CSI controller")
        self.csi_role.add_to_policy(
            iam.PolicyStatement(actions=["fsx:DescribeFileSystems"], resources=["*"])
        )
        self.csi_driver = eks.CfnAddon(
            self,
            "CsiDriver",
            addon_name=c.FSX_CSI_ADDON,
            cluster_name=cluster.cluster_name,
            resolve_conflicts="OVERWRITE",
            preserve_on_delete=False,
            pod_identity_associations=[
                eks.CfnAddon.PodIdentityAssociationProperty(
                    role_arn=self.csi_role.role_arn, service_account=c.FSX_CSI_CONTROLLER_SA
                )
            ],
        )
        self.csi_driver.node.add_dependency(props.pod_identity_agent)

        self.pv_name = f"{props.namespace}-fsx"
        self.pvc_name = c.FSX_PVC_NAME
        self.volume = eks.KubernetesManifest(
            self,
            "Volume",
            cluster=cluster,
            manifest=[
                persistent_volume(
                    name=self.pv_name,
                    capacity_gib=spec.capacity_gib,
                    file_system_id=self.file_system.ref,
                    dns_name=self.file_system.attr_dns_name,
                    mount_name=self.file_system.attr_lustre_mount_name,
                ),
                persistent_volume_claim(
                    name=self.pvc_name,
                    namespace=props.namespace,
                    volume_name=self.pv_name,
                    capacity_gib=spec.capacity_gib,
                ),
            ],
        )
        # The manifest refers to the file system's id, DNS name and mount name, so CloudFormation
        # creates the PV/PVC after the file system and deletes them before it.
        self.volume.node.add_dependency(self.csi_driver)
        self.volume.node.add_dependency(props.namespace_manifest)

        acknowledge(
            self.csi_role,
            (
                "AwsSolutions-IAM5[Resource::*]",
                "fsx:DescribeFileSystems supports no resource-level permissions (Service Authorization "
                "Reference, Amazon FSx); the statement grants nothing else.",
            ),
        )
