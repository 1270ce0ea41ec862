"""Container commands: the launcher line, the trainer flags and the data-prep line.

The launcher (trainer.recovery.launch) picks torchrun or ft_launcher and the flag spelling of the
installed NVRx version; the manifests only pass the contract's flags with values from the
profile. `$(JOB_COMPLETION_INDEX)` is expanded by the kubelet, so no shell is needed.
"""

from __future__ import annotations

from k8s import naming
from k8s.deployment import Deployment


def fmt(value: float | int | bool) -> str:
    """Numbers as the trainer's argparse expects them: 300.0 -> '300', 0.6 -> '0.6'."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def restarts_for(dep: Deployment) -> int:
    """The profile's budget where the launcher restarts workers (ft_launcher); elsewhere a failed
    worker fails the pod and the Job restarts it (torchrun runs with `--max-restarts 0`)."""
    return dep.profile.recovery.max_restarts if dep.recovery_mode.launcher_restarts_workers else 0


def launcher_argv(dep: Deployment) -> list[str]:
    rec = dep.profile.recovery
    return [
        "python", "-m", "trainer.recovery.launch",
        "--mode", dep.mode,
        "--nnodes", str(dep.profile.node_count),
        "--nproc_per_node", str(dep.instance.gpus),
        "--node_rank", f"$({naming.COMPLETION_INDEX_ENV})",
        "--master_addr", dep.master_addr,
        "--master_port", str(naming.RENDEZVOUS_PORT),
        "--max_restarts", str(restarts_for(dep)),
        "--heartbeat_timeout", fmt(rec.heartbeat_timeout_s),
        "--initial_heartbeat_timeout", fmt(rec.initial_heartbeat_timeout_s),
        "--monitor_interval", fmt(rec.monitor_interval_s),
        "--rdzv_join_timeout", fmt(rec.rdzv_join_timeout_s),
    ]  # fmt: skip


def trainer_argv(dep: Deployment) -> list[str]:
    t, rec, tiers = dep.profile.trainer, dep.profile.recovery, dep.profile.tiers
    return [
        "--model", t.model,
        "--data_path", dep.data_dir,
        "--max_steps", str(t.max_steps),
        "--seq_len", str(t.seq_len),
        "--batch_size", str(t.batch_size),
        "--lr", fmt(t.lr),
        "--seed", str(t.seed),
        "--checkpoint_dir", dep.checkpoint_dir,
        "--checkpoint_interval", str(t.checkpoint_interval),
        "--termination_grace", str(dep.termination_grace_s),  # the pod's, to the second
        "--use_async_checkpoint", fmt(t.use_async_checkpoint),
        "--keep_checkpoints", str(t.keep_checkpoints),
        "--resume", "auto",  # a restarted pod resumes; a new run starts in an empty directory
        "--results_path", dep.results_path,
        "--device", "cuda",
        "--fault_count", str(t.fault_count),
        "--fault_seed", str(t.fault_seed),
        "--fault_types", ",".join(t.fault_types),
        "--fault_type_weights", ",".join(fmt(w) for w in t.fault_type_weights),
        "--fault_after_step", str(t.fault_after_step),
        "--soft_timeout", fmt(rec.soft_timeout_s),
        "--hard_timeout", fmt(rec.hard_timeout_s),
        "--barrier_timeout", fmt(rec.barrier_timeout_s),
        "--completion_timeout", fmt(rec.completion_timeout_s),
        "--inprocess_max_restarts", str(rec.max_restarts),
        "--nccl_timeout", fmt(rec.nccl_timeout_s),
        "--snapshot_interval", str(tiers.snapshot_interval),
        "--tiers", ",".join(tiers.tiers),
        "--memory_budget_gib", fmt(tiers.memory_budget_gib),
        "--node_dir", dep.node_dir,
    ]  # fmt: skip


def training_command(dep: Deployment) -> tuple[list[str], list[str]]:
    """(command, args) of the training container: launcher flags, '--', trainer flags."""
    argv = launcher_argv(dep)
    return argv[:3], [*argv[3:], "--", *trainer_argv(dep)]


def data_prep_command(dep: Deployment) -> tuple[list[str], list[str]]:
    return (
        ["python", "-m", "trainer.loop.data"],
        [
            "prepare",
            "--source", "c4",
            "--num_samples", str(dep.profile.trainer.dataset_samples),
            "--tokenizer", dep.tokenizer,
            "--output", dep.data_dir,
        ],
    )  # fmt: skip
