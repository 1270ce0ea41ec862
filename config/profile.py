"""Deployment profiles: one YAML file drives the CDK stacks, the manifests and the trainer flags.

Everything that follows from the instance type (GPUs, EFA cards, instance store) is derived from
`config.instances`, never written in a profile, so a profile cannot disagree with the hardware.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from config.instances import InstanceSpec, instance_spec

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
MIN_EKS_VERSION = (1, 28)
RecoveryMode = Literal["baseline", "ft_launcher", "inprocess", "ft_launcher+inprocess"]
RECOVERY_MODES: tuple[str, ...] = ("baseline", "ft_launcher", "inprocess", "ft_launcher+inprocess")


class ProfileError(ValueError):
    """A profile that must not reach synthesis; the message names the bad value."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CapacityReservation(_Strict):
    """An On-Demand Capacity Reservation or an EC2 Capacity Block to launch the GPU nodes into."""

    id: str
    capacity_block: bool = False

    @field_validator("id")
    @classmethod
    def _id_shape(cls, v: str) -> str:
        if not re.fullmatch(r"cr-[0-9a-f]{8,17}", v):
            raise ValueError(f"capacity reservation id {v!r} must look like cr-0123456789abcdef0")
        return v


class ClusterSettings(_Strict):
    eks_version: str = "1.33"
    endpoint_access: Literal["public", "private", "public_and_private"] = "public_and_private"
    public_access_cidrs: tuple[str, ...] = ()
    vpc_id: Optional[str] = None
    vpc_cidr: str = "10.0.0.0/16"
    system_instance_type: str = "m6i.large"
    system_node_count: int = Field(default=2, ge=1)

    @field_validator("eks_version")
    @classmethod
    def _eks_version(cls, v: str) -> str:
        m = re.fullmatch(r"(\d+)\.(\d+)", str(v))
        if not m or (int(m[1]), int(m[2])) < MIN_EKS_VERSION:
            raise ValueError(f"eks_version {v!r} is not supported; use 1.28 or newer")
        return str(v)


class StorageSettings(_Strict):
    fsx_capacity_gib: int = 1200
    fsx_import_path: Optional[str] = None
    mount_path: str = "/fsx"

    @field_validator("fsx_capacity_gib")
    @classmethod
    def _scratch2_size(cls, v: int) -> int:
        if v != 1200 and (v <= 0 or v % 2400 != 0):
            raise ValueError(
                f"fsx_capacity_gib {v} is not a valid SCRATCH_2 size; use 1200 or a multiple of 2400"
            )
        return v


class RecoverySettings(_Strict):
    """Restart budgets and timeouts; the manifests and the trainer flags both read these."""

    mode: RecoveryMode = "ft_launcher+inprocess"
    max_restarts: int = Field(default=20, ge=0)
    backoff_limit: int = Field(default=10, ge=0)
    heartbeat_timeout_s: float = Field(default=300.0, gt=0)
    initial_heartbeat_timeout_s: float = Field(default=1200.0, gt=0)
    monitor_interval_s: float = Field(default=5.0, gt=0)
    soft_timeout_s: float = Field(default=60.0, gt=0)
    hard_timeout_s: float = Field(default=90.0, gt=0)
    barrier_timeout_s: float = Field(default=120.0, gt=0)
    completion_timeout_s: float = Field(default=120.0, gt=0)
    # Below hard_timeout_s: in in-process modes the trainer requires a hung collective to time out
    # (and raise) before the Wrapper's hard timeout kills the rank; 60 s as in the published example.
    nccl_timeout_s: float = Field(default=60.0, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> "RecoverySettings":
        if self.hard_timeout_s <= self.soft_timeout_s:
            raise ValueError(
                f"hard_timeout_s {self.hard_timeout_s} must exceed soft_timeout_s {self.soft_timeout_s}"
            )
        return self


class TierSettings(_Strict):
    """Checkpoint tiers (memory, node, peer, durable) and the host memory they may use."""

    snapshot_interval: int = Field(default=1, ge=0)
    tiers: tuple[Literal["memory", "node", "peer"], ...] = ("memory", "node", "peer")
    memory_budget_gib: float = Field(default=0.0, ge=0)  # per rank; 0: derived from the model
    shm_size_gib: float = Field(default=16.0, gt=0)  # /dev/shm headroom beyond checkpoint buffers
    node_dir: Literal["shm", "nvme"] = "shm"


class TrainerSettings(_Strict):
    model: str = "llama3.1-8b"
    max_steps: int = Field(default=2000, ge=1)
    seq_len: int = Field(default=2048, ge=8)
    batch_size: int = Field(default=1, ge=1)
    lr: float = Field(default=3e-4, gt=0)
    seed: int = 1234
    checkpoint_interval: int = Field(default=500, ge=0)
    use_async_checkpoint: bool = True
    keep_checkpoints: int = Field(default=2, ge=1)
    dataset_samples: int = Field(default=100_000, ge=1)
    fault_count: int = Field(default=0, ge=0)
    fault_seed: int = 42
    fault_types: tuple[str, ...] = ("exception", "hang")
    fault_type_weights: tuple[float, ...] = (0.6, 0.4)
    fault_after_step: int = Field(default=10, ge=0)


class Profile(_Strict):
    """One deployment: where it runs, on what hardware, and how the job trains and recovers."""

    name: str
    region: str
    availability_zone: str
    instance_type: str
    node_count: int = Field(ge=1)
    efa_interfaces: Optional[int] = None  # optional cross-check against the instance table
    capacity_reservation: Optional[CapacityReservation] = None
    placement_group: bool = True
    namespace: str = "nvrx"
    image: Optional[str] = None  # default: the stack's ECR repository, tag image_tag
    image_tag: str = "latest"
    cluster: ClusterSettings = ClusterSettings()
    storage: StorageSettings = StorageSettings()
    recovery: RecoverySettings = RecoverySettings()
    tiers: TierSettings = TierSettings()
    trainer: TrainerSettings = TrainerSettings()

    @field_validator("instance_type")
    @classmethod
    def _known_instance(cls, v: str) -> str:
        instance_spec(v)  # raises with the allowed list
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
        if self.placement_group and self.capacity_reservation is not None:
            raise ValueError(
                "placement_group must be false when a capacity_reservation is set "
                "(a reservation or capacity block cannot be combined with a cluster placement group)"
            )
        return self

    @property
    def instance(self) -> InstanceSpec:
        return instance_spec(self.instance_type)

    @property
    def gpus_per_node(self) -> int:
        return self.instance.gpus

    @property
    def world_size(self) -> int:
        return self.node_count * self.instance.gpus


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def profile_from_dict(data: dict) -> Profile:
    """Validate raw profile data; the first problem becomes a one-line ProfileError."""
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "profile"
        msg = err["msg"].removeprefix("Value error, ")
        raise ProfileError(f"profile {data.get('name', '?')!r}: {where}: {msg}") from None


def load_profile(name_or_path: str) -> Profile:
    """Load `config/profiles/NAME.yaml`, or a YAML file by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        raise ProfileError(
            f"profile {name_or_path!r} not found; available: {', '.join(available_profiles())}"
        )
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ProfileError(f"profile file {path} must hold a mapping")
    data.setdefault("name", path.stem)
    return profile_from_dict(data)
