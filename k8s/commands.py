"""Container commands: the launcher line, the trainer flags, the data-prep and export lines.

The launcher (trainer.recovery.launch) picks torchrun or ft_launcher and the flag spelling of the
installed NVRx version; the manifests only pass the contract's flags with values from the
profile. `$(JOB_COMPLETION_INDEX)` is expanded by the kubelet, so no shell is needed.
"""

from __future__ import annotations

from config.contract import rendezvous_argv
from config.training import TrainConfig, pod_owned
from config.training import shown as fmt  # values as the launcher's and trainer's parsers read them
from k8s import naming
from k8s.deployment import Deployment


def restarts_for(dep: Deployment) -> int:
    """The profile's budget where the launcher restarts workers (ft_launcher); elsewhere a failed
    worker fails the pod and the Job restarts it (torchrun runs with `--max-restarts 0`)."""
    return dep.profile.recovery.max_restarts if dep.recovery_mode.launcher_restarts_workers else 0


def deployment_rendezvous(dep: Deployment) -> list[str]:
    """The rendezvous the launchers join and, where it serves them, the store pod closes: the
    nodes that train, and where the launcher hosts no store (ft_launcher modes, whose store pod
    serves every store) the fewest they may shrink to and the spares beside them. torchrun modes
    take the node count alone: they have neither spares nor shrinking (k8s.deployment)."""
    profile = dep.profile
    shrinks = {"min_nodes": profile.shrink_floor, "spare_nodes": profile.spare_nodes} \
        if dep.external_store else {}
    return rendezvous_argv(profile.node_count, profile.recovery.rdzv_join_timeout_s, **shrinks)


def launcher_argv(dep: Deployment) -> list[str]:
    rec = dep.profile.recovery
    return [
        "python", "-m", "trainer.recovery.launch",
        "--mode", dep.mode,
        *deployment_rendezvous(dep),
        "--nproc_per_node", str(dep.instance.gpus),
        "--node_rank", f"$({naming.COMPLETION_INDEX_ENV})",
        "--master_addr", dep.master_addr,
        "--master_port", str(naming.RENDEZVOUS_PORT),
        *(["--external_store"] if dep.external_store else []),
        "--max_restarts", str(restarts_for(dep)),
        "--heartbeat_timeout", fmt(rec.heartbeat_timeout_s),
        "--initial_heartbeat_timeout", fmt(rec.initial_heartbeat_timeout_s),
        "--monitor_interval", fmt(rec.monitor_interval_s),
        "--metrics_port", str(naming.METRICS_PORT),
    ]  # fmt: skip


def trainer_argv(dep: Deployment) -> list[str]:
    """The pods' trainer flags: the deployment's own settings, and every setting whose value
    differs from the trainer's default, each spelled as its flag. The mode is the launcher's
    flag, which forwards it."""
    train, argv = dep.train, []
    for name, info in TrainConfig.model_fields.items():
        value = getattr(train, name)
        if name == "mode":
            continue
        if name in pod_owned() or value != info.default:
            argv += [f"--{name}", fmt(value)]
    return argv


def training_command(dep: Deployment) -> tuple[list[str], list[str]]:
    """(command, args) of the training container: launcher flags, '--', trainer flags."""
    argv = launcher_argv(dep)
    return argv[:3], [*argv[3:], "--", *trainer_argv(dep)]


def store_command(dep: Deployment) -> list[str]:
    """The store pod's command: every store of the run on the contract's ports from P, and the
    launchers' rendezvous, whose rounds it closes where the image's NVRx needs it to."""
    return ["python", "-m", "trainer.recovery.store_server",
            "--master_port", str(naming.RENDEZVOUS_PORT), "--host", "0.0.0.0",
            *deployment_rendezvous(dep)]  # fmt: skip


def data_prep_command(dep: Deployment, num_proc: int) -> tuple[list[str], list[str]]:
    """The profile's `data:` section as the data-prep Job's flags, with `num_proc` tokenizing
    processes: one per CPU of the pod, said outright rather than read back from its cgroup."""
    data = dep.profile.data
    return (
        ["python", "-m", "trainer.loop.data"],
        [
            "prepare",
            "--source", data.source,
            "--text_field", data.text_field,
            "--num_samples", str(data.samples),
            "--tokenizer", dep.tokenizer,
            "--num_proc", str(num_proc),
            "--output", dep.data_dir,
        ],
    )  # fmt: skip


def export_command(dep: Deployment) -> tuple[list[str], list[str]]:
    """The export of the run's checkpoint into `<run dir>/export/<format>-step<N>`; N is
    the step exported, which the Job knows once it has found the newest committed one."""
    request = dep.export
    step = [] if request.step is None else ["--step", str(request.step)]
    return (
        ["python", "-m", "trainer.export"],
        [
            "--checkpoint_dir", dep.checkpoint_dir,
            *step,
            "--format", request.format,
            "--dtype", request.dtype,
            "--out_root", dep.export_root,
            *(["--optimizer"] if request.optimizer else []),
        ],
    )  # fmt: skip
