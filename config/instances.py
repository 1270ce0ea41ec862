"""The one table of accelerated instance types: everything GPU/EFA-shaped is derived from here.

Sources (checked November 2026):
- GPUs, vCPUs, memory, instance store: "Amazon EC2 instance type specifications - accelerated
  computing", https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html
- EFA interfaces and network cards: "Maximize network bandwidth on Amazon EC2 instances with
  multiple network cards", https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html
  and the EC2 `DescribeInstanceTypes` fields `NetworkInfo.EfaInfo.MaximumEfaInterfaces` /
  `NetworkInfo.MaximumNetworkCards`.
- GPUDirect RDMA over EFA (`FI_EFA_USE_DEVICE_RDMA=1`): p4d/p4de/p5/p5e/p5en; not g5/g6.
- Interfaces on network card 0 and IPv4 addresses per interface: `DescribeInstanceTypes`
  `NetworkInfo.NetworkCards[0].MaximumNetworkInterfaces` and `Ipv4AddressesPerInterface`; they
  reproduce the VPC CNI's eni-max-pods.txt (p5: 2 x 50 -> 100, p4d: 15 x 50 -> 737).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

InterfaceType = Literal["interface", "efa", "efa-only"]


@dataclass(frozen=True)
class InstanceSpec:
    """Hardware facts of one EC2 instance type."""

    instance_type: str
    gpus: int
    gpu_model: str
    gpu_memory_gib: int
    vcpus: int
    memory_gib: int
    efa_interfaces: int
    network_cards: int
    nvme_devices: int
    nvme_device_gib: int
    gpudirect_rdma: bool
    card0_interfaces: int  # network interfaces network card 0 can hold
    ipv4_per_interface: int

    @property
    def family(self) -> str:
        return self.instance_type.split(".", 1)[0]

    @property
    def cni_interfaces(self) -> int:
        """Interfaces the VPC CNI can use for pod IPs: those of card 0 not taken by the
        launch template's EFA-only interface there (the CNI only uses card 0)."""
        efa_on_card0 = 1 if self.efa_interfaces else 0
        return self.card0_interfaces - efa_on_card0

    @property
    def subnet_addresses(self) -> int:
        """VPC addresses one node can take: every address of every interface the CNI uses (its
        warm pool fills whole interfaces)."""
        return self.cni_interfaces * self.ipv4_per_interface

    @property
    def max_pods(self) -> int:
        """kubelet's maxPods that matches the pod IPs the VPC CNI can hand out (the CNI's own
        formula: interfaces x (addresses - 1) + 2 host-network pods). Without it kubelet would
        admit pods that then wait forever for an IP (p5: 51 instead of 100)."""
        return self.cni_interfaces * (self.ipv4_per_interface - 1) + 2


@dataclass(frozen=True)
class NetworkInterfaceSlot:
    """One entry of a launch template's NetworkInterfaces list."""

    network_card_index: int
    device_index: int
    interface_type: InterfaceType


INSTANCE_TYPES: dict[str, InstanceSpec] = {
    spec.instance_type: spec
    for spec in (
        # 8x H100 80 GB, 32 EFA (3,200 Gbps), 8x 3.84 TB NVMe.
        InstanceSpec("p5.48xlarge", 8, "H100", 80, 192, 2048, 32, 32, 8, 3576, True, 2, 50),
        # 8x H200 141 GB, 32 EFA (3,200 Gbps), 8x 3.84 TB NVMe.
        InstanceSpec("p5e.48xlarge", 8, "H200", 141, 192, 2048, 32, 32, 8, 3576, True, 2, 50),
        # 8x H200 141 GB, 16 EFAv3 (3,200 Gbps), 8x 3.84 TB NVMe.
        InstanceSpec("p5en.48xlarge", 8, "H200", 141, 192, 2048, 16, 16, 8, 3576, True, 2, 50),
        # 8x A100 40 GB, 4 EFA (400 Gbps), 8x 1 TB NVMe.
        InstanceSpec("p4d.24xlarge", 8, "A100", 40, 96, 1152, 4, 4, 8, 931, True, 15, 50),
        # 8x A100 80 GB, 4 EFA (400 Gbps), 8x 1 TB NVMe.
        InstanceSpec("p4de.24xlarge", 8, "A100", 80, 96, 1152, 4, 4, 8, 931, True, 15, 50),
        # Small test types: 1 GPU; EFA only from the 8xlarge size up.
        InstanceSpec("g5.xlarge", 1, "A10G", 24, 4, 16, 0, 1, 1, 232, False, 4, 15),
        InstanceSpec("g5.8xlarge", 1, "A10G", 24, 32, 128, 1, 1, 1, 838, False, 8, 30),
        InstanceSpec("g6.xlarge", 1, "L4", 24, 4, 16, 0, 1, 1, 232, False, 4, 15),
        InstanceSpec("g6.8xlarge", 1, "L4", 24, 32, 128, 1, 1, 2, 419, False, 8, 30),
    )
}


def instance_spec(instance_type: str) -> InstanceSpec:
    try:
        return INSTANCE_TYPES[instance_type]
    except KeyError:
        allowed = ", ".join(sorted(INSTANCE_TYPES))
        raise ValueError(f"unknown instance type {instance_type!r}; allowed: {allowed}") from None


def network_interface_layout(spec: InstanceSpec) -> list[NetworkInterfaceSlot]:
    """The launch template's interfaces, as AWS recommends for multi-card EFA instances.

    The primary interface (card 0, device 0) is a plain ENA interface that carries the node's
    IP traffic; every EFA is an EFA-only interface (no IP address consumed from the subnet):
    card 0 device 1, then device 0 of each further card. A type without EFA gets only the primary.
    """
    slots = [NetworkInterfaceSlot(0, 0, "interface")]
    for i in range(spec.efa_interfaces):
        slots.append(NetworkInterfaceSlot(i, 1 if i == 0 else 0, "efa-only"))
    return slots
