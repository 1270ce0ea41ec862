"""Everything one synthesis needs, resolved once from the profile, the stack outputs and the CLI.

The charts read only this object, so every consistency check (profile vs outputs, mode vs
timeouts, names vs DNS limits) happens here, before any manifest is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from config import RECOVERY_MODES, InstanceSpec, Profile, RecoveryMode
from config.contract import TERMINATION_GRACE_FLOOR_S
from k8s import naming, outputs
from k8s.errors import SynthError
from k8s.outputs import StackOutputs
from scripts.plan import make_plan

SHM_MOUNT = "/dev/shm"
NODE_LOCAL_MOUNT = "/mnt/node-local"  # where the NVMe hostPath appears inside the pod
CONFIG_MOUNT = "/etc/nvrx-eks"
SETTINGS_FILE = "settings.json"
DEFAULT_TOKENIZER = "byte"


@dataclass(frozen=True)
class Deployment:
    """One run of one profile in one mode, with every external value resolved."""

    profile: Profile
    mode: str
    run_id: str
    image: str
    namespace: str
    fsx_claim: str
    node_local_host_dir: str | None  # NodeLocalDir from the outputs; None unless node_dir == nvme
    namespace_owned_by_stack: bool
    tokenizer: str = DEFAULT_TOKENIZER

    @property
    def image_pull_policy(self) -> str:
        """IfNotPresent for a fixed tag, so a replacement pod never waits on the registry; Always
        for a moving tag (latest, or none), so a rebuilt image is not shadowed by a node's cache."""
        name = self.image.rsplit("/", 1)[-1]
        if "@" in name:
            return "IfNotPresent"
        tag = name.split(":", 1)[1] if ":" in name else "latest"
        return "Always" if tag == "latest" else "IfNotPresent"

    @property
    def instance(self) -> InstanceSpec:
        return self.profile.instance

    @property
    def has_efa(self) -> bool:
        return self.instance.efa_interfaces > 0

    @property
    def recovery_mode(self) -> RecoveryMode:
        return RecoveryMode(self.mode)

    @property
    def workload(self) -> str:
        """'job' (one Indexed Job) or 'jobset' (a JobSet of one replicated Job)."""
        return self.profile.workload

    @property
    def job_name(self) -> str:
        return naming.train_job_name(self.run_id)

    @property
    def service_name(self) -> str:
        """The headless Service shares the Job's name: pod DNS is `<job>-<index>.<job>`."""
        return self.job_name

    @property
    def master_addr(self) -> str:
        """Rank 0's stable DNS name in subdomain `<service>`, for any node count: hostname
        `<job>-0` (Indexed Job) or `<jobset>-<replicated job>-0-0` (JobSet)."""
        return f"{naming.pod_hostname(self.run_id, 0, self.workload)}.{self.service_name}"

    @property
    def fsx_mount(self) -> str:
        return self.profile.storage.mount_path.rstrip("/") or "/"

    @property
    def run_dir(self) -> str:
        return f"{self.fsx_mount}/runs/{self.run_id}"

    @property
    def checkpoint_dir(self) -> str:
        return f"{self.run_dir}/checkpoints"

    @property
    def results_path(self) -> str:
        return f"{self.run_dir}/results.json"

    @property
    def data_dir(self) -> str:
        return f"{self.fsx_mount}/data/c4"

    @property
    def node_local_host_path(self) -> str | None:
        """The run's own subdirectory of the instance-store RAID, so runs never share snapshots."""
        if self.node_local_host_dir is None:
            return None
        return f"{self.node_local_host_dir.rstrip('/')}/nvrx-runs/{self.run_id}"

    @property
    def node_dir(self) -> str:
        """What the trainer gets as --node_dir for the node-local checkpoint tier."""
        if self.profile.tiers.node_dir == "nvme":
            return NODE_LOCAL_MOUNT
        return f"{SHM_MOUNT}/nvrx"

    @property
    def termination_grace_s(self) -> int:
        """SIGTERM to SIGKILL for a training pod, and the trainer's --termination_grace: sized
        from the checkpoint's write time (`scripts.plan`). A model that is not a preset has no
        known size: the floor then."""
        from trainer.loop.model import PRESETS  # no torch

        if self.profile.trainer.model not in PRESETS:
            return TERMINATION_GRACE_FLOOR_S
        return make_plan(self.profile).termination_grace_seconds


def _check_mode(mode: str) -> str:
    if mode not in RECOVERY_MODES:
        raise SynthError(f"mode {mode!r} is not one of {', '.join(RECOVERY_MODES)}")
    return mode


def _check_timeouts(profile: Profile, mode: str) -> None:
    """In in-process modes a collective stuck on a dead peer must time out and raise (the pods run
    with TORCH_NCCL_ASYNC_ERROR_HANDLING=2, so the watchdog aborts the communicator without
    killing the process) before the Wrapper's hard timeout kills the rank. The trainer rejects
    the opposite order at start-up with exit code 2; catching it here saves a failed Job."""
    rec = profile.recovery
    if RecoveryMode(mode).in_process and rec.nccl_timeout_s >= rec.hard_timeout_s:
        raise SynthError(
            f"profile {profile.name!r}: recovery.nccl_timeout_s {rec.nccl_timeout_s:g} must be below "
            f"recovery.hard_timeout_s {rec.hard_timeout_s:g} in mode {mode!r} (a rank blocked in a "
            "collective must get its NCCL error before the in-process hard timeout kills it)"
        )


def check_outputs_match(profile: Profile, out: StackOutputs) -> None:
    """Outputs of another deployment would point the manifests at the wrong cluster or namespace."""
    for key, expected in ((outputs.NAMESPACE, profile.namespace), (outputs.REGION, profile.region)):
        actual = out.get(key)
        if actual is not None and actual != expected:
            raise SynthError(
                f"{key} {actual!r} in {out.source} disagrees with profile {profile.name!r} "
                f"({expected!r}): wrong outputs file for this profile?"
            )


def image_for(profile: Profile, out: StackOutputs) -> str:
    """profile.image if set, else the stack's ECR repository at profile.image_tag."""
    if profile.image:
        return profile.image
    repo = out.require(outputs.ECR_REPOSITORY_URI, "the profile sets no image")
    return f"{repo}:{profile.image_tag}"


def resolve(
    profile: Profile,
    out: StackOutputs,
    mode: str | None = None,
    run_id: str | None = None,
    tokenizer: str = DEFAULT_TOKENIZER,
    now: datetime | None = None,
) -> Deployment:
    """Combine profile, outputs and CLI choices; raise SynthError naming the first bad value."""
    chosen_mode = _check_mode(mode or profile.recovery.mode)
    _check_timeouts(profile, chosen_mode)
    check_outputs_match(profile, out)
    rid = naming.validate_run_id(
        run_id or naming.default_run_id(chosen_mode, now), profile.node_count, profile.workload
    )
    node_local = None
    if profile.tiers.node_dir == "nvme":
        node_local = out.require(outputs.NODE_LOCAL_DIR, "tiers.node_dir is 'nvme'")
    dep = Deployment(
        profile=profile,
        mode=chosen_mode,
        run_id=rid,
        image=image_for(profile, out),
        namespace=profile.namespace,
        fsx_claim=out.require(outputs.FSX_PVC_NAME, "the FSx claim every pod mounts"),
        node_local_host_dir=node_local,
        namespace_owned_by_stack=out.get(outputs.NAMESPACE) is not None,
        tokenizer=tokenizer,
    )
    from k8s.trainer_check import check_trainer_args  # imports k8s.commands, which imports us

    check_trainer_args(dep)
    return dep
