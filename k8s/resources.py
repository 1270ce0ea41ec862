"""Pod resources derived from the instance table: one training pod owns one whole node.

GPUs and EFA interfaces are requested in full (a pod that gets fewer would silently train slower
or fall back to TCP). CPU and memory leave headroom for the kubelet, system daemons and the
DaemonSets every GPU node runs (device plugins, FSx CSI node, VPC CNI), and memory also leaves
out the 2 MiB hugepages that the node pre-allocates (those are not allocatable as memory).
Worked example, g5.8xlarge (the tightest): 128 GiB nominal, about 124 GiB seen by the kernel,
minus kube-reserved for its 205 pods (2.5 GiB; maxPods follows the VPC CNI, config.instances), eviction threshold and 10 GiB of huge pages leaves
about 111 GiB allocatable; the pod asks for 107 GiB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cdk8s_plus_35 import k8s

from config import InstanceSpec, Profile
from config import contract
from config.contract import snapshot_bytes
from k8s import naming
from k8s.errors import SynthError

SYSTEM_MEMORY_FRACTION = 0.08  # kube/system reserved, eviction threshold, DaemonSets, kernel
MIN_SYSTEM_MEMORY_GIB = 4
SYSTEM_CPU_FRACTION = 0.05
MIN_SYSTEM_CPUS = 1
HUGEPAGES_GIB = math.ceil(naming.EFA_HUGEPAGES_MIB / 1024)
# EFA nodes pre-allocate huge pages for two training pods (a replacement may be admitted while
# its predecessor terminates: config/contract.py); all of them are missing from allocatable memory.
NODE_HUGEPAGE_PODS = contract.TRAINING_PODS_PER_NODE * contract.HUGEPAGES_POD_HEADROOM


# checkov's CPU-limit finding, on the training container only: the init, data-prep and results
# containers have limits (k8s.pod).
CPU_LIMIT_SKIP = (
    "CKV_K8S_11",
    "No CPU limit on the trainer: its pod has the node to itself and requests all its CPUs but the "
    "system's share; throttling under a limit would stall NCCL and data-loader threads, and with "
    "them every rank of the job",
)


@dataclass(frozen=True)
class PodResources:
    """Requests and limits of the training container (requests == limits for device resources)."""

    gpus: int
    efa: int
    hugepages: str | None
    cpus: int
    memory_gib: int

    def requests(self) -> dict[str, k8s.Quantity]:
        res = {
            "cpu": k8s.Quantity.from_number(self.cpus),
            "memory": k8s.Quantity.from_string(f"{self.memory_gib}Gi"),
        }
        return {**res, **self._devices()}

    def limits(self) -> dict[str, k8s.Quantity]:
        """Memory is bounded (the /dev/shm tmpfs is charged to it); CPU is not, to avoid throttling."""
        return {"memory": k8s.Quantity.from_string(f"{self.memory_gib}Gi"), **self._devices()}

    def requirements(self) -> k8s.ResourceRequirements:
        return k8s.ResourceRequirements(requests=self.requests(), limits=self.limits())

    def _devices(self) -> dict[str, k8s.Quantity]:
        devices = {naming.GPU_RESOURCE: k8s.Quantity.from_number(self.gpus)}
        if self.efa:
            devices[naming.EFA_RESOURCE] = k8s.Quantity.from_number(self.efa)
        if self.hugepages:
            devices[naming.HUGEPAGES_RESOURCE] = k8s.Quantity.from_string(self.hugepages)
        return devices


def training_resources(spec: InstanceSpec) -> PodResources:
    """Whole-node sizing for one instance type."""
    efa = spec.efa_interfaces
    reserved_mem = max(MIN_SYSTEM_MEMORY_GIB, math.ceil(spec.memory_gib * SYSTEM_MEMORY_FRACTION))
    memory = spec.memory_gib - reserved_mem - (HUGEPAGES_GIB * NODE_HUGEPAGE_PODS if efa else 0)
    cpus = spec.vcpus - max(MIN_SYSTEM_CPUS, math.ceil(spec.vcpus * SYSTEM_CPU_FRACTION))
    if memory <= 0 or cpus <= 0:
        raise SynthError(f"instance type {spec.instance_type} is too small for a training pod")
    return PodResources(
        gpus=spec.gpus,
        efa=efa,
        hugepages=naming.EFA_HUGEPAGES if efa else None,
        cpus=cpus,
        memory_gib=memory,
    )


def checkpoint_buffers_gib(profile: Profile) -> float:
    """Host memory one rank's checkpoint buffers take in /dev/shm, from the trainer's own rule.

    Without snapshot tiers, checkpoints are staged in one buffer of one shard; with them,
    checkpoints are written from the snapshot slots (config.contract.snapshot_bytes). A shard is
    the model's training state divided over all ranks.
    `trainer.memory_budget_gib` overrides the snapshot part (it is also what the trainer is given).
    """
    from config.presets import PRESETS, STATE_BYTES_PER_PARAMETER, preset_parameters

    t = profile.trainer
    if t.model not in PRESETS:
        if t.memory_budget_gib:
            return t.memory_budget_gib
        raise SynthError(f"profile {profile.name!r}: trainer.model {t.model!r} is not a preset, so "
                         "trainer.memory_budget_gib must give the snapshot memory per rank")
    shard = preset_parameters(t.model) * STATE_BYTES_PER_PARAMETER / profile.world_size
    if t.tiers and t.snapshot_interval:
        peer = "peer" in t.tiers and profile.node_count > 1
        return t.memory_budget_gib or snapshot_bytes(
            int(shard), peer, durable=t.checkpoint_interval > 0) / 2**30
    return shard / 2**30


def shm_size_gib(profile: Profile) -> float:
    """/dev/shm of a training pod: every local rank's checkpoint buffers plus the profile's
    headroom (`tiers.shm_size_gib`) for NCCL and the data loader."""
    per_rank = checkpoint_buffers_gib(profile) if profile.tiers.node_dir == "shm" else 0.0
    return math.ceil(profile.gpus_per_node * per_rank + profile.tiers.shm_size_gib)


def check_memory_budget(profile: Profile, resources: PodResources) -> None:
    """/dev/shm is charged to the container's memory limit; half of it stays for the ranks."""
    shm = shm_size_gib(profile)
    if shm > resources.memory_gib / 2:
        raise SynthError(
            f"profile {profile.name!r}: /dev/shm of {shm} GiB (checkpoint buffers of "
            f"{profile.gpus_per_node} ranks plus tiers.shm_size_gib {profile.tiers.shm_size_gib:g}) "
            f"leaves too little of the {resources.memory_gib} GiB of a {profile.instance_type} "
            "training pod; lower trainer.memory_budget_gib, the snapshot tiers or the model size")


def gib_quantity(gib: float) -> str:
    """A GiB amount as a Kubernetes quantity string, exact for fractional values."""
    if float(gib).is_integer():
        return f"{int(gib)}Gi"
    return f"{math.ceil(gib * 1024)}Mi"
