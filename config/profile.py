"""Deployment profiles: one YAML file drives the CDK stacks, the manifests and the trainer flags.

Everything that follows from the instance type (GPUs, EFA cards, instance store) is derived from
`config.instances`, never written in a profile, so a profile cannot disagree with the hardware.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal, Optional, Union  # noqa: F401 - the trainer settings' annotations

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from config import fsx
from config.contract import MODE_NAMES, PRIVATE_SUBNET_PREFIX, RecoveryMode
from config.errors import ProfileError
from config.instances import InstanceSpec, instance_spec
from config.presets import TOKENIZERS
from config.training import TrainConfig, pod_owned
from config.versions import DEFAULT_EKS_VERSION, DEFAULT_NVRX_VERSION, check_eks_version, nvrx_release

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
Workload = Literal["job", "jobset"]
_AMI_ID = re.compile(r"ami-[0-9a-f]{8,17}")
_AMI_SSM_PREFIX = "/aws/service/eks/optimized-ami/"

__all__ = ["ProfileError", "Profile", "RecoveryMode"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CapacityReservation(_Strict):
    """An On-Demand Capacity Reservation or an EC2 Capacity Block to launch the GPU nodes into.

    Either works inside the cluster placement group: EC2 launches reserved instances into a
    cluster placement group when the reservation was made for it (a Capacity Block always is
    co-located). `capacity_block: true` also sets the launch template's market type.

    Without `id` the GPU stack creates an On-Demand Capacity Reservation itself, for every node
    of the group (node_count + spare_nodes), in the placement group; an existing reservation or
    Capacity Block must hold that many instances of the profile's type.
    """

    id: Optional[str] = None
    capacity_block: bool = False

    @field_validator("id")
    @classmethod
    def _id_shape(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not re.fullmatch(r"cr-[0-9a-f]{8,17}", v):
            raise ValueError(f"capacity reservation id {v!r} must look like cr-0123456789abcdef0")
        return v

    @model_validator(mode="after")
    def _block_is_bought(self) -> "CapacityReservation":
        if self.capacity_block and self.id is None:
            raise ValueError("capacity_block: true needs the id of the Capacity Block you bought "
                             "(the stack can create On-Demand Capacity Reservations only)")
        return self

    @property
    def created(self) -> bool:
        """The stack creates the reservation (no id given)."""
        return self.id is None


class ClusterSettings(_Strict):
    """The control plane, its version and upgrade policy, and the GPU node image.

    `gpu_ami` pins the node image: an AMI id, or the release-versioned SSM parameter of an
    EKS-optimized AL2023 NVIDIA AMI. Replacement nodes then boot the very image the running
    ones have; an upgrade is an explicit change of this field.
    """

    eks_version: str = DEFAULT_EKS_VERSION
    support_type: Literal["STANDARD", "EXTENDED"] = "STANDARD"
    gpu_ami: str
    # The API endpoint is private unless CIDRs are given; see the README for the way in. A
    # public-only endpoint limited to CIDRs would lock out the kubectl handler (a Lambda in the
    # VPC reaches the private endpoint), so it is not offered.
    endpoint_access: Literal["private", "public_and_private"] = "private"
    public_access_cidrs: tuple[str, ...] = ()
    # EKS needs control-plane subnets in two AZs: the profile's and this one (new VPCs only).
    second_availability_zone: Optional[str] = None
    vpc_id: Optional[str] = None
    vpc_cidr: str = "10.0.0.0/16"
    system_instance_type: str = "m6i.large"
    system_node_count: int = Field(default=2, ge=1)

    @field_validator("eks_version", mode="before")
    @classmethod
    def _eks_version(cls, v: object) -> str:
        if not isinstance(v, str):
            raise ValueError(
                f"eks_version {v!r} must be a quoted string such as \"1.35\" "
                "(YAML reads 1.30 as the number 1.3)"
            )
        return check_eks_version(v)

    @field_validator("public_access_cidrs")
    @classmethod
    def _cidrs(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for cidr in v:
            if not re.fullmatch(r"\d{1,3}(\.\d{1,3}){3}/\d{1,2}", cidr):
                raise ValueError(f"public_access_cidrs entry {cidr!r} is not an IPv4 CIDR")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "ClusterSettings":
        if self.endpoint_access != "private" and not self.public_access_cidrs:
            raise ValueError(
                f"endpoint_access {self.endpoint_access!r} needs public_access_cidrs (the networks "
                "allowed to reach the API server); use 'private' to keep the endpoint off the internet"
            )
        if self.support_type == "STANDARD" and check_eks_version(self.eks_version, extended=False) is None:
            raise ValueError(
                f"eks_version {self.eks_version!r} is past standard support; use a newer version "
                "or set support_type: EXTENDED (extended support is billed extra)"
            )
        self._check_ami()
        return self

    def _check_ami(self) -> None:
        ami = self.gpu_ami
        if _AMI_ID.fullmatch(ami):
            return
        if not ami.startswith(_AMI_SSM_PREFIX) or not ami.endswith("/image_id"):
            raise ValueError(
                f"gpu_ami {ami!r} must be an AMI id (ami-...) or an SSM parameter path "
                f"{_AMI_SSM_PREFIX}<version>/amazon-linux-2023/x86_64/nvidia/<release>/image_id"
            )
        if "/recommended/" in ami:
            raise ValueError(
                f"gpu_ami {ami!r} follows the newest release on every deploy; name a release "
                "(README: Configuration lists them) so replacement nodes match the running ones"
            )
        if f"{_AMI_SSM_PREFIX}{self.eks_version}/" not in ami:
            raise ValueError(
                f"gpu_ami {ami!r} is not an image for eks_version {self.eks_version}"
            )


class StorageSettings(_Strict):
    """The FSx for Lustre file system (`config.fsx`): SCRATCH_2, or PERSISTENT_2 with a throughput
    tier; `nvrx-eks plan` says which one keeps up with the checkpoints."""

    deployment_type: fsx.DeploymentType = "SCRATCH_2"
    throughput_mb_s_per_tib: Optional[int] = None  # PERSISTENT_2: 125, 250, 500 or 1000
    fsx_capacity_gib: int = fsx.SMALLEST_GIB
    fsx_import_path: Optional[str] = None
    mount_path: str = "/fsx"

    @field_validator("fsx_capacity_gib")
    @classmethod
    def _size(cls, v: int) -> int:
        return fsx.check_capacity(v)

    @model_validator(mode="after")
    def _tier(self) -> "StorageSettings":
        fsx.check_throughput(self.deployment_type, self.throughput_mb_s_per_tib)
        if self.fsx_import_path is not None and self.deployment_type != "SCRATCH_2":
            raise ValueError(
                f"fsx_import_path needs deployment_type SCRATCH_2: {self.deployment_type} links S3 "
                "through a data repository association, which the stack does not create"
            )
        return self

    @property
    def file_system(self) -> fsx.FileSystem:
        return fsx.FileSystem(self.deployment_type, self.fsx_capacity_gib,
                              self.throughput_mb_s_per_tib)


class RecoverySettings(_Strict):
    """The launcher's and the Job's side of recovery; the trainer's own timeouts are settings of
    the `trainer:` section (soft_timeout, hard_timeout, nccl_timeout, ...)."""

    mode: RecoveryMode = RecoveryMode.FT_LAUNCHER_INPROCESS
    max_restarts: int = Field(default=20, ge=0)  # ft_launcher's worker-group restarts
    backoff_limit: int = Field(default=10, ge=0)
    heartbeat_timeout_s: float = Field(default=300.0, gt=0)
    initial_heartbeat_timeout_s: float = Field(default=1200.0, gt=0)
    monitor_interval_s: float = Field(default=0.3, gt=0)  # NVRx 0.7's default
    # How long a node waits at rendezvous for the others. It must outlast a node replacement:
    # detection and eviction (~2 min), a new p5 booting and joining (~10 min), the image pull
    # (~5-10 min for 20 GB). NVRx's default of 600 s does not.
    rdzv_join_timeout_s: float = Field(default=1800.0, gt=0)


class TierSettings(_Strict):
    """Where the node tier lives and what the nodes give it; which tiers run, and how often, are
    settings of the `trainer:` section (tiers, snapshot_interval, memory_budget_gib)."""

    shm_size_gib: float = Field(default=16.0, gt=0)  # /dev/shm headroom beyond checkpoint buffers
    node_dir: Literal["shm", "nvme"] = "shm"
    # GPU nodes back every tmpfs (the pods' /dev/shm) with 2 MiB pages: a restarted worker
    # registers its snapshot slots with CUDA several times faster (BENCHMARKS.md).
    huge_tmpfs: bool = True


class ObservabilitySettings(_Strict):
    """Who scrapes the training pods' metrics, and what the cluster keeps of a run beyond them.

    Every training pod serves Prometheus metrics (`config.contract.METRICS_PORT`) and carries
    the `prometheus.io/*` annotations; its NetworkPolicy admits the pods of
    `monitoring_namespace` to that port, and nothing else new. `pod_monitor` adds a PodMonitor
    for the Prometheus operator (its CRDs must be installed: without them the run's manifest
    would not apply). `cloudwatch` installs the Amazon CloudWatch Observability add-on: GPU
    (DCGM) and EFA metrics, and the pods' logs kept in CloudWatch Logs after the pods are gone.
    """

    monitoring_namespace: str = "monitoring"
    pod_monitor: bool = False
    cloudwatch: bool = False

    @field_validator("monitoring_namespace")
    @classmethod
    def _dns_label(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", v):
            raise ValueError(f"monitoring_namespace {v!r} is not a valid Kubernetes "
                             "name (RFC 1123 label)")
        return v


def _trainer_section() -> type[BaseModel]:
    """The profile's `trainer:` section: every trainer setting a profile may set, under its own
    name, with the trainer's own type, default, bounds and description (`config.training`).
    The rules between settings run once the deployment adds its own (`k8s.deployment`)."""
    fields = {name: (info.annotation, info) for name, info in TrainConfig.model_fields.items()
              if name not in pod_owned()}
    return create_model("TrainerSettings", __config__=ConfigDict(extra="forbid", frozen=True,
                                                                  allow_inf_nan=False), **fields)


TrainerSettings = _trainer_section()


class DataSettings(_Strict):
    """The data-prep Job: what it tokenizes onto FSx, with which tokenizer."""

    # c4 (hf:allenai/c4:en:train), a hub dataset hf:REPO[:CONFIG[:SPLIT]], or a path on FSx: a
    # .jsonl or .parquet file or a directory of them (`python -m trainer.loop.data prepare --help`)
    source: str = "c4"
    samples: int = Field(default=100_000, ge=1)  # documents to take, from the start
    text_field: str = Field(default="text", min_length=1)  # the field holding each document's text
    # None: the model's own (config.presets.TOKENIZERS); "byte" for tiny test runs.
    tokenizer: Optional[str] = None


class Profile(_Strict):
    """One deployment: where it runs, on what hardware, and how the job trains and recovers."""

    name: str
    region: str
    availability_zone: str
    instance_type: str
    node_count: int = Field(ge=1)  # the nodes that train
    # Hot spares: nodes that join the run and wait; a spare takes a lost node's place at once
    # (the launcher's in-job restart), and the lost pod's replacement becomes the next spare.
    spare_nodes: int = Field(default=0, ge=0)
    # The fewest nodes training goes on with once no spare is left (None: node_count, no shrink).
    min_nodes: Optional[int] = Field(default=None, ge=1)
    efa_interfaces: Optional[int] = None  # optional cross-check against the instance table
    capacity_reservation: Optional[CapacityReservation] = None
    placement_group: bool = True
    namespace: str = "nvrx"
    # The trainer image: a full reference with a tag or digest, else the stack's ECR repository at
    # image_tag, else at the git commit (what `make image` pushes). Never `latest` (k8s.image).
    image: Optional[str] = None
    image_tag: Optional[str] = None
    # The NVRx release in that image (`make image` builds with it): synthesis refuses what it
    # cannot do (a shrinking world from 0.6).
    nvrx_version: str = DEFAULT_NVRX_VERSION
    # job: one Indexed Job (default); jobset: a JobSet, which restarts all its Jobs at once.
    workload: Workload = "job"
    cluster: ClusterSettings
    storage: StorageSettings = StorageSettings()
    recovery: RecoverySettings = RecoverySettings()
    tiers: TierSettings = TierSettings()
    trainer: TrainerSettings = TrainerSettings()  # type: ignore[valid-type]
    data: DataSettings = DataSettings()
    observability: ObservabilitySettings = ObservabilitySettings()

    @field_validator("instance_type")
    @classmethod
    def _known_instance(cls, v: str) -> str:
        instance_spec(v)  # raises with the allowed list
        return v

    @field_validator("nvrx_version")
    @classmethod
    def _supported_nvrx(cls, v: str) -> str:
        nvrx_release(v)  # raises with the allowed releases
        return v

    @field_validator("namespace")
    @classmethod
    def _dns_label(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", v):
            raise ValueError(f"namespace {v!r} is not a valid Kubernetes name (RFC 1123 label)")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "Profile":
        if not re.fullmatch(rf"{re.escape(self.region)}[a-z]", self.availability_zone):
            raise ValueError(
                f"availability_zone {self.availability_zone!r} is not in region {self.region!r}"
            )
        derived = self.instance.efa_interfaces
        if self.efa_interfaces is not None and self.efa_interfaces != derived:
            raise ValueError(
                f"efa_interfaces {self.efa_interfaces} disagrees with {self.instance_type}, "
                f"which has {derived}"
            )
        if self.min_nodes is not None and self.min_nodes > self.node_count:
            raise ValueError(f"min_nodes {self.min_nodes} must be at most node_count "
                             f"{self.node_count} (training shrinks down to it, never grows past)")
        self._check_second_az()
        self._check_subnet_room()
        return self

    def _check_subnet_room(self) -> None:
        """A new VPC's GPU subnet must give every node its addresses; an existing VPC's subnets
        are the user's to size."""
        if self.cluster.vpc_id is not None:
            return
        usable = 2 ** (32 - PRIVATE_SUBNET_PREFIX) - 5  # AWS reserves five per subnet
        room = usable // self.instance.subnet_addresses
        if self.group_size > room:
            raise ValueError(
                f"node_count {self.node_count} + spare_nodes {self.spare_nodes}: the new VPC's "
                f"GPU subnet (/{PRIVATE_SUBNET_PREFIX}, {usable} addresses) holds at most {room} "
                f"{self.instance_type} nodes at {self.instance.subnet_addresses} addresses each; "
                "deploy into an existing VPC with a larger subnet (cluster.vpc_id)"
            )

    def _check_second_az(self) -> None:
        second = self.cluster.second_availability_zone
        if self.cluster.vpc_id is not None:
            return
        if second is None:
            raise ValueError(
                "cluster.second_availability_zone is required for a new VPC (EKS needs control-plane "
                f"subnets in two AZs), e.g. {self.region}{'b' if not self.availability_zone.endswith('b') else 'a'}"
            )
        if not re.fullmatch(rf"{re.escape(self.region)}[a-z]", second) or second == self.availability_zone:
            raise ValueError(
                f"cluster.second_availability_zone {second!r} must be another AZ of region "
                f"{self.region!r} than {self.availability_zone!r}"
            )

    @property
    def tokenizer(self) -> str:
        """The data-prep tokenizer: the profile's, else the model's own."""
        model = self.trainer.model
        return self.data.tokenizer or TOKENIZERS.get(model, model)

    @property
    def nvrx_release(self) -> tuple[int, ...]:
        """`nvrx_version` as a tuple (validated when the profile loads)."""
        return nvrx_release(self.nvrx_version)

    @property
    def instance(self) -> InstanceSpec:
        return instance_spec(self.instance_type)

    @property
    def gpus_per_node(self) -> int:
        return self.instance.gpus

    @property
    def world_size(self) -> int:
        return self.node_count * self.instance.gpus

    @property
    def group_size(self) -> int:
        """Every GPU node of the run: the training nodes and the spares (pods, Auto Scaling
        group, capacity reservation)."""
        return self.node_count + self.spare_nodes

    @property
    def shrink_floor(self) -> int:
        """The fewest nodes that train: min_nodes, else node_count."""
        return self.node_count if self.min_nodes is None else self.min_nodes

    @property
    def elastic(self) -> bool:
        """Spares or shrinking: only a launcher that restarts workers within the Job can do
        either (`config.contract.RecoveryMode.launcher_restarts_workers`)."""
        return self.spare_nodes > 0 or self.shrink_floor < self.node_count


