"""Everything one synthesis needs, resolved once from the profile, the stack outputs and the CLI.

The charts read only this object, so every consistency check (profile vs outputs, the trainer's
settings with the pod's paths, names vs DNS limits) happens here, before any manifest is built.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from pydantic import ValidationError

from config import MODE_NAMES, InstanceSpec, Profile, RecoveryMode
from config.contract import EXPORT_DIR, EXPORT_DTYPE_DEFAULT, EXPORT_DTYPES, EXPORT_FORMATS
from config.grace import profile_grace_seconds
from config.training import TrainConfig, batch_problem_down_to, describe
from config.versions import NVRX_BARRIER_RENDEZVOUS_FROM, nvrx_shrinks_world
from k8s import naming, outputs
from k8s.errors import SynthError
from k8s.image import TrainerImage, trainer_image
from k8s.outputs import StackOutputs

SHM_MOUNT = "/dev/shm"
NODE_LOCAL_MOUNT = "/mnt/node-local"  # where the NVMe hostPath appears inside the pod
CONFIG_MOUNT = "/etc/nvrx-eks"
SCRATCH_MOUNT = "/tmp"  # also HOME: tempfile's default and every ~/.cache (k8s.environment)
HF_TOKEN_MOUNT = "/var/run/secrets/huggingface"
SETTINGS_FILE = "settings.json"


@dataclass(frozen=True)
class ExportRequest:
    """What the export Job writes: one format and dtype of one checkpoint (None: the newest
    committed one, whose step names the export directory once the Job has found it), with
    Adam's state (`optimizer`, dcp only) or without."""

    format: str = EXPORT_FORMATS[0]
    dtype: str = EXPORT_DTYPE_DEFAULT
    step: int | None = None
    optimizer: bool = False

    def check(self) -> "ExportRequest":
        if self.format not in EXPORT_FORMATS:
            raise SynthError(f"export format {self.format!r} is not one of {', '.join(EXPORT_FORMATS)}")
        if self.dtype not in EXPORT_DTYPES:
            raise SynthError(f"export dtype {self.dtype!r} is not one of {', '.join(EXPORT_DTYPES)}")
        if self.step is not None and self.step < 0:
            raise SynthError(f"--step {self.step} must be a step number, 0 or more")
        if self.optimizer and self.format != "dcp":
            raise SynthError(f"--optimizer applies to --format dcp, not {self.format}")
        return self


@dataclass(frozen=True)
class Deployment:
    """One run of one profile in one mode, with every external value resolved."""

    profile: Profile
    mode: str
    run_id: str
    image: TrainerImage
    namespace: str
    fsx_claim: str
    node_local_host_dir: str | None  # NodeLocalDir from the outputs; None unless node_dir == nvme
    namespace_owned_by_stack: bool
    export: ExportRequest = ExportRequest()

    @property
    def tokenizer(self) -> str:
        return self.profile.tokenizer

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
    def external_store(self) -> bool:
        """The stores live in the run's store pod, not in node rank 0: every mode whose launcher
        restarts workers (ft_launcher), so that no training node is special and any node,
        rank 0's included, can be lost and replaced by a spare."""
        return self.recovery_mode.launcher_restarts_workers

    @property
    def store_name(self) -> str:
        """The store's Deployment, Service and NetworkPolicy."""
        return naming.store_name(self.run_id)

    @property
    def master_addr(self) -> str:
        """Where the launchers find the stores: the store Service's DNS name, or (torchrun
        modes) rank 0's stable DNS name in subdomain `<service>`, for any node count: hostname
        `<job>-0` (Indexed Job) or `<jobset>-<replicated job>-0-0` (JobSet)."""
        if self.external_store:
            return f"{self.store_name}.{self.namespace}.svc"
        return f"{naming.pod_hostname(self.run_id, 0, self.workload)}.{self.service_name}"

    @property
    def pod_count(self) -> int:
        """Training pods: one per node of the group, spares included."""
        return self.profile.group_size

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
    def export_root(self) -> str:
        """Where the run's exports go, each in a directory named for what it holds."""
        return f"{self.run_dir}/{EXPORT_DIR}"

    @property
    def results_path(self) -> str:
        return f"{self.run_dir}/results.json"

    @property
    def data_dir(self) -> str:
        """One directory per (source, tokenizer, size, and text field where it is not the
        default): data of another model or another field never mixes in."""
        data = self.profile.data
        parts = (data.source, self.tokenizer, str(data.samples))
        if data.text_field != type(data).model_fields["text_field"].default:
            parts += (data.text_field,)
        return f"{self.fsx_mount}/data/" + ".".join(_slug(p) for p in parts)

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
        """SIGTERM to SIGKILL for a training pod, and the trainer's --termination_grace
        (`config.grace`)."""
        return profile_grace_seconds(self.profile)

    @property
    def train(self) -> TrainConfig:
        """The pods' trainer settings: the profile's, with the paths and mode of this run."""
        return trainer_settings(self)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"


def trainer_settings(dep: Deployment) -> TrainConfig:
    """The profile's trainer section plus what the deployment decides; the trainer's own rules
    (timeouts in order, weights matching the types...) run here, so a profile the trainer would
    reject fails at synth with its one-line message, not minutes later in a pod."""
    where = f"profile {dep.profile.name!r} (mode {dep.mode}): the trainer rejects its flags"
    try:
        train = TrainConfig(
            **dep.profile.trainer.model_dump(), data_path=dep.data_dir,
            checkpoint_dir=dep.checkpoint_dir, results_path=dep.results_path,
            node_dir=dep.node_dir, device="cuda", mode=dep.mode,
            termination_grace=dep.termination_grace_s,  # the pod's, to the second
            resume="auto")  # a restarted pod resumes; a new run starts in an empty directory
    except ValidationError as exc:
        raise SynthError(f"{where}: {describe(exc, lambda name: f'trainer.{name}')}") from None
    problem = batch_problem_when_shrunk(dep.profile, train)
    if problem:
        raise SynthError(f"{where}: {problem.replace('--batch_size', 'trainer.batch_size')}")
    return train


def batch_problem_when_shrunk(profile: Profile, train: TrainConfig) -> str | None:
    """Why some world from node_count down to min_nodes cannot keep the global batch exact. A
    global batch of 0 is batch_size x the world at the first start: the full node count."""
    global_batch = train.global_batch_size or train.batch_size * profile.world_size
    return batch_problem_down_to(global_batch, train.batch_size, profile.gpus_per_node,
                                 profile.node_count, profile.shrink_floor, "min_nodes")


def check_elastic(profile: Profile, mode: str) -> None:
    """Spares and shrinking need a launcher that restarts the workers inside the Job
    (ft_launcher); under torchrun a lost node ends every pod, so a spare would only wait.
    Shrinking also needs an image whose ft_launcher lets the world shrink: otherwise every pod
    would refuse `--min_nodes` at its start."""
    if profile.elastic and not RecoveryMode(mode).launcher_restarts_workers:
        allowed = ", ".join(m.value for m in RecoveryMode if m.launcher_restarts_workers)
        what = (f"spare_nodes {profile.spare_nodes}" if profile.spare_nodes
                else f"min_nodes {profile.shrink_floor} below node_count {profile.node_count}")
        raise SynthError(f"profile {profile.name!r}: {what} needs a mode whose launcher restarts "
                         f"workers within the Job ({allowed}), not {mode}")
    shrinks = profile.shrink_floor < profile.node_count
    if shrinks and not nvrx_shrinks_world(profile.nvrx_release):
        raise SynthError(
            f"profile {profile.name!r}: min_nodes {profile.shrink_floor} below node_count "
            f"{profile.node_count} needs an image with NVRx before "
            f"{'.'.join(map(str, NVRX_BARRIER_RENDEZVOUS_FROM))}, whose ft_launcher lets the world "
            f"shrink; nvrx_version {profile.nvrx_version} keeps it fixed (set nvrx_version: "
            "0.4.1 and `make image`, or drop min_nodes)")


def _check_mode(mode: str) -> str:
    if mode not in MODE_NAMES:
        raise SynthError(f"mode {mode!r} is not one of {', '.join(MODE_NAMES)}")
    return mode


def check_outputs_match(profile: Profile, out: StackOutputs) -> None:
    """Outputs of another deployment would point the manifests at the wrong cluster or namespace."""
    for key, expected in ((outputs.NAMESPACE, profile.namespace), (outputs.REGION, profile.region)):
        actual = out.get(key)
        if actual is not None and actual != expected:
            raise SynthError(
                f"{key} {actual!r} in {out.source} disagrees with profile {profile.name!r} "
                f"({expected!r}): wrong outputs file for this profile?"
            )


def resolve(
    profile: Profile,
    out: StackOutputs,
    mode: str | None = None,
    run_id: str | None = None,
    now: datetime | None = None,
    export: ExportRequest = ExportRequest(),
) -> Deployment:
    """Combine profile, outputs and CLI choices; raise SynthError naming the first bad value."""
    chosen_mode = _check_mode(mode or profile.recovery.mode)
    check_elastic(profile, chosen_mode)
    check_outputs_match(profile, out)
    rid = naming.validate_run_id(
        run_id or naming.default_run_id(chosen_mode, now), profile.group_size, profile.workload
    )
    node_local = None
    if profile.tiers.node_dir == "nvme":
        node_local = out.require(outputs.NODE_LOCAL_DIR, "tiers.node_dir is 'nvme'")
    dep = Deployment(
        profile=profile,
        mode=chosen_mode,
        run_id=rid,
        image=trainer_image(profile, out),
        namespace=profile.namespace,
        fsx_claim=out.require(outputs.FSX_PVC_NAME, "the FSx claim every pod mounts"),
        node_local_host_dir=node_local,
        namespace_owned_by_stack=out.get(outputs.NAMESPACE) is not None,
        export=export.check(),
    )
    trainer_settings(dep)  # refuse now what the pods would refuse
    return dep
