"""Self-managed GPU nodes: one launch template carrying every EFA card, in one AZ."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import aws_cdk as cdk
import yaml
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

from config import InstanceSpec, network_interface_layout
from config.profile import CapacityReservation
from infra import constants as c
from infra.constructs.system_nodes import node_role
from infra.nag import acknowledge


def node_image_id(scope: Construct, gpu_ami: str) -> str:
    """The profile's pinned GPU image: an AMI id as is, or a release-versioned SSM parameter
    (resolved at deploy time, but naming one release, so every deploy gets the same image)."""
    if gpu_ami.startswith("ami-"):
        return gpu_ami
    return ec2.MachineImage.from_ssm_parameter(gpu_ami).get_image(scope).image_id


def node_config(
    *,
    cluster_name: str,
    endpoint: str,
    certificate_authority: str,
    local_storage: bool,
    max_pods: int,
) -> dict:
    """nodeadm's NodeConfig (node.eks.aws/v1alpha1): join, label, taint, RAID0 the instance
    store, and cap pods at what the VPC CNI can give addresses to."""
    label_key, label_value = c.GPU_NODE_GROUP_LABEL
    taint_key, taint_value, taint_effect = c.GPU_TAINT
    spec: dict = {
        "cluster": {
            "name": cluster_name,
            "apiServerEndpoint": endpoint,
            "certificateAuthority": certificate_authority,
            "cidr": c.SERVICE_IPV4_CIDR,
        },
        "kubelet": {
            # Parallel pulls: the trainer image (tens of GB, pre-pulled by the manifests'
            # DaemonSet as soon as the node is Ready) must not queue the small device-plugin
            # images behind it, or a new node advertises no GPU until the big pull is done.
            "config": {"maxPods": max_pods, "serializeImagePulls": False,
                       "maxParallelImagePulls": c.MAX_PARALLEL_IMAGE_PULLS},
            "flags": [
                f"--node-labels={label_key}={label_value}",
                f"--register-with-taints={taint_key}={taint_value}:{taint_effect}",
            ],
        },
    }
    if local_storage:
        spec["instance"] = {"localStorage": {"strategy": "RAID0"}}
    return {"apiVersion": "node.eks.aws/v1alpha1", "kind": "NodeConfig", "spec": spec}


def hugepages_script(nr_hugepages: int) -> list[str]:
    """Shell lines that reserve 2 MiB huge pages now and on every boot."""
    return [
        f"echo 'vm.nr_hugepages = {nr_hugepages}' > /etc/sysctl.d/90-nvrx-hugepages.conf",
        f"sysctl -q -w vm.nr_hugepages={nr_hugepages}",
        f'got=$(cat /proc/sys/vm/nr_hugepages); [ "$got" -ge {nr_hugepages} ] || '
        f'echo "nvrx-eks: only $got of {nr_hugepages} huge pages allocated" >&2',
    ]


def huge_tmpfs_script() -> list[str]:
    """Shell lines that back every tmpfs with huge pages now and on every boot. Registering the
    snapshot slots a failed worker left took a restarted one 3.5-3.8 s on 4 KiB pages and
    0.6-0.7 s on 2 MiB pages (22 GB, one H200; BENCHMARKS.md section 8)."""
    return [
        f"echo 'w {c.SHMEM_THP_KNOB} - - - - force' > {c.SHMEM_THP_TMPFILES}",
        f"if [ -w {c.SHMEM_THP_KNOB} ]; then echo force > {c.SHMEM_THP_KNOB}; "
        f"else echo 'nvrx-eks: no {c.SHMEM_THP_KNOB}: tmpfs stays on 4 KiB pages' >&2; fi",
    ]


def gpu_user_data(
    *, cluster_name: str, endpoint: str, certificate_authority: str, instance: InstanceSpec,
    huge_tmpfs: bool = False,
) -> ec2.MultipartUserData:
    """MIME user data: the NodeConfig part for nodeadm, a shell part for cloud-init.

    nodeadm-run.service (which starts kubelet) is ordered after cloud-final.service, so the
    huge pages exist before kubelet counts them, and tmpfs takes huge pages before kubelet
    mounts any pod's /dev/shm.
    """
    user_data = ec2.MultipartUserData()
    config = node_config(
        cluster_name=cluster_name,
        endpoint=endpoint,
        certificate_authority=certificate_authority,
        local_storage=instance.nvme_devices > 0,
        max_pods=instance.max_pods,
    )
    user_data.add_part(
        ec2.MultipartBody.from_raw_body(
            content_type="application/node.eks.aws",
            body="---\n" + yaml.safe_dump(config, sort_keys=False, width=10_000),
        )
    )
    lines = hugepages_script(c.NR_HUGEPAGES_2MI) if instance.efa_interfaces > 0 else []
    if huge_tmpfs:
        lines += huge_tmpfs_script()
    if lines:
        script = ec2.UserData.for_linux()
        script.add_commands("set -euo pipefail", *lines)
        user_data.add_part(ec2.MultipartBody.from_user_data(script))
    return user_data


@dataclass(frozen=True)
class GpuNodesProps:
    cluster: eks.Cluster
    vpc: ec2.IVpc
    subnet: ec2.ISubnet
    instance: InstanceSpec
    node_count: int  # every node of the group: the training nodes and the spares
    gpu_ami: str
    placement_group: bool
    capacity_reservation: Optional[CapacityReservation]
    huge_tmpfs: bool = False  # every tmpfs (the pods' /dev/shm) on 2 MiB pages


class GpuNodes(Construct):
    """A fixed-size Auto Scaling group of GPU nodes joined through nodeadm: the profile's
    training nodes and its spares (node_count + spare_nodes).

    The launch template lists one network interface per slot of
    `config.network_interface_layout` (p5: the ENA primary plus 32 EFA-only interfaces), in a
    cluster placement group when the profile asks for one, and into the profile's On-Demand
    Capacity Reservation or Capacity Block when it names one (both combine with the group).

    Every interface is in the cluster security group (control plane, system nodes, FSx
    clients) and in an EFA group that allows all traffic to and from itself, as EFA requires.
    Security groups add up: the EFA group's egress rule does not restrict anything, since the
    cluster security group already allows all outbound traffic.
    """

    role: iam.Role
    efa_security_group: ec2.SecurityGroup
    launch_template: ec2.CfnLaunchTemplate
    auto_scaling_group: autoscaling.CfnAutoScalingGroup
    placement_group: Optional[ec2.PlacementGroup]
    capacity_reservation: Optional[ec2.CfnCapacityReservation]  # the one this group created
    access_entry: eks.AccessEntry

    def __init__(self, scope: Construct, construct_id: str, props: GpuNodesProps) -> None:
        super().__init__(scope, construct_id)
        cluster = props.cluster
        spec = props.instance

        self.role = node_role(self, "NodeRole", f"EKS GPU nodes ({spec.instance_type})")
        profile = iam.InstanceProfile(self, "InstanceProfile", role=self.role)
        # API authentication mode: self-managed nodes join through an EC2_LINUX access entry.
        self.access_entry = eks.AccessEntry(
            self,
            "AccessEntry",
            cluster=cluster,
            principal=self.role.role_arn,
            access_entry_type=eks.AccessEntryType.EC2_LINUX,
            access_policies=[],
        )

        self.efa_security_group = ec2.SecurityGroup(
            self,
            "EfaSecurityGroup",
            vpc=props.vpc,
            description="EFA: all traffic between GPU nodes",
            allow_all_outbound=False,
        )
        self.efa_security_group.add_ingress_rule(
            self.efa_security_group, ec2.Port.all_traffic(), "EFA within the group"
        )
        self.efa_security_group.add_egress_rule(
            self.efa_security_group, ec2.Port.all_traffic(), "EFA within the group"
        )
        groups = [cluster.cluster_security_group_id, self.efa_security_group.security_group_id]

        self.placement_group = None
        if props.placement_group:
            self.placement_group = ec2.PlacementGroup(
                self, "PlacementGroup", strategy=ec2.PlacementGroupStrategy.CLUSTER
            )

        user_data = gpu_user_data(
            cluster_name=cluster.cluster_name,
            endpoint=cluster.cluster_endpoint,
            certificate_authority=cluster.cluster_certificate_authority_data,
            instance=spec,
            huge_tmpfs=props.huge_tmpfs,
        )
        root_gib = (
            c.ROOT_VOLUME_GIB_WITH_NVME if spec.nvme_devices else c.ROOT_VOLUME_GIB_WITHOUT_NVME
        )
        data = ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
            image_id=node_image_id(self, props.gpu_ami),
            instance_type=spec.instance_type,
            iam_instance_profile=ec2.CfnLaunchTemplate.IamInstanceProfileProperty(
                arn=profile.instance_profile_arn
            ),
            user_data=cdk.Fn.base64(user_data.render()),
            metadata_options=ec2.CfnLaunchTemplate.MetadataOptionsProperty(
                http_endpoint="enabled",
                http_tokens="required",
                # 2: the FSx CSI node plugin (not host-network) reads instance metadata; the node
                # role is kept minimal for that reason.
                http_put_response_hop_limit=2,
            ),
            block_device_mappings=[
                ec2.CfnLaunchTemplate.BlockDeviceMappingProperty(
                    device_name="/dev/xvda",
                    ebs=ec2.CfnLaunchTemplate.EbsProperty(
                        volume_size=root_gib,
                        volume_type="gp3",
                        encrypted=True,
                        delete_on_termination=True,
                    ),
                )
            ],
            network_interfaces=[
                ec2.CfnLaunchTemplate.NetworkInterfaceProperty(
                    network_card_index=slot.network_card_index,
                    device_index=slot.device_index,
                    interface_type=slot.interface_type,
                    groups=groups,
                    delete_on_termination=True,
                )
                for slot in network_interface_layout(spec)
            ],
            monitoring=ec2.CfnLaunchTemplate.MonitoringProperty(enabled=True),
            placement=ec2.CfnLaunchTemplate.PlacementProperty(
                group_name=self.placement_group.placement_group_name
            )
            if self.placement_group
            else None,
            capacity_reservation_specification=self._capacity_reservation(props),
            instance_market_options=ec2.CfnLaunchTemplate.InstanceMarketOptionsProperty(
                market_type="capacity-block"
            )
            if props.capacity_reservation and props.capacity_reservation.capacity_block
            else None,
            tag_specifications=[
                ec2.CfnLaunchTemplate.TagSpecificationProperty(
                    resource_type=kind,
                    tags=[cdk.CfnTag(key="Name", value=f"{cluster.cluster_name}-gpu")],
                )
                for kind in ("instance", "volume")
            ],
        )
        self.launch_template = ec2.CfnLaunchTemplate(
            self, "LaunchTemplate", launch_template_data=data
        )

        count = str(props.node_count)
        self.auto_scaling_group = autoscaling.CfnAutoScalingGroup(
            self,
            "AutoScalingGroup",
            min_size=count,
            max_size=count,
            desired_capacity=count,
            vpc_zone_identifier=[props.subnet.subnet_id],
            launch_template=autoscaling.CfnAutoScalingGroup.LaunchTemplateSpecificationProperty(
                launch_template_id=self.launch_template.ref,
                version=self.launch_template.attr_latest_version_number,
            ),
            # EC2's status checks pass on a wedged node (hung kubelet, GPU Xid, EFA fault): the
            # node-health agent marks those Unhealthy through SetInstanceHealth, which the
            # group acts on whatever its health check type (infra.constructs.node_health). A
            # fixed-size group terminates the instance, then launches its replacement into
            # the slot that frees in the capacity reservation.
            health_check_type="EC2",
            tags=[
                autoscaling.CfnAutoScalingGroup.TagPropertyProperty(
                    key=f"kubernetes.io/cluster/{cluster.cluster_name}",
                    value="owned",
                    propagate_at_launch=True,
                ),
            ],
        )
        # Nodes must find their access entry, else the API server refuses them.
        self.auto_scaling_group.node.add_dependency(self.access_entry)

        acknowledge(
            self.auto_scaling_group,
            (
                "AwsSolutions-AS3",
                "Fixed-size group (min = max = desired): no scaling events to notify about; a "
                "replaced node shows up as a Kubernetes node event and in the training job's log.",
            ),
        )

    def _capacity_reservation(
        self, props: GpuNodesProps
    ) -> Optional[ec2.CfnLaunchTemplate.CapacityReservationSpecificationProperty]:
        """The profile's reservation, or one created for exactly the group's size (training
        nodes and spares): a replaced instance frees its slot when it terminates, and the Auto
        Scaling group launches the replacement into that slot."""
        self.capacity_reservation = None
        reservation: Optional[CapacityReservation] = props.capacity_reservation
        if reservation is None:
            return None
        reservation_id = reservation.id
        if reservation.created:
            self.capacity_reservation = self._create_reservation(props)
            reservation_id = self.capacity_reservation.ref
        return ec2.CfnLaunchTemplate.CapacityReservationSpecificationProperty(
            capacity_reservation_target=ec2.CfnLaunchTemplate.CapacityReservationTargetProperty(
                capacity_reservation_id=reservation_id
            )
        )

    def _create_reservation(self, props: GpuNodesProps) -> ec2.CfnCapacityReservation:
        """A targeted On-Demand Capacity Reservation (only this launch template uses it), with
        no end date, in the cluster placement group where there is one. It is billed from
        creation whether instances run in it or not, as the instances would be."""
        placement = None
        if self.placement_group is not None:
            placement = cdk.Stack.of(self).format_arn(
                service="ec2", resource="placement-group",
                resource_name=self.placement_group.placement_group_name,
            )
        return ec2.CfnCapacityReservation(
            self,
            "CapacityReservation",
            instance_type=props.instance.instance_type,
            instance_platform="Linux/UNIX",
            availability_zone=props.subnet.availability_zone,
            instance_count=props.node_count,
            instance_match_criteria="targeted",
            end_date_type="unlimited",
            placement_group_arn=placement,
        )
