"""The one configuration object that flows through the trainer, and its command line.

Flag names follow the published example (`--checkpoint_interval`, `--use_async_checkpoint`,
`--fault_*`) so its commands keep working. Every check runs before any process group starts:
a bad value is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, Optional, Sequence

from config.contract import MODE_NAMES as MODES  # one table of recovery modes
from config.contract import TERMINATION_GRACE_FLOOR_S, RecoveryMode
from trainer.errors import ConfigError

FAULT_TYPES = ("exception", "hang", "sigkill", "segfault", "oom", "node")
TIERS = ("memory", "node", "peer")
RESUME = ("auto", "required", "never")
DEVICES = ("auto", "cpu", "cuda")
ACTIVATION_CHECKPOINTING = ("none", "selective", "full")
# Share of each snapshot's bytes that goes through device memory, by --snapshot_staging.
STAGED_SHARE = {"host": 0.0, "device": 1.0, "split": 0.5}
SNAPSHOT_STAGING = tuple(STAGED_SHARE)


@dataclass
class TrainConfig:
    # model and data
    model: str = "tiny"
    data_path: Optional[str] = None
    max_steps: int = 100
    seq_len: int = 128
    batch_size: int = 4
    global_batch_size: int = 0  # 0: batch_size * world size at the first start
    lr: float = 3e-4
    weight_decay: float = 0.1
    warmup_steps: int = 10
    grad_clip: float = 1.0
    seed: int = 1234
    device: str = "auto"
    deterministic: bool = False
    # speed
    compile: bool = False
    activation_checkpointing: str = "none"
    # checkpoints (durable tier)
    checkpoint_dir: Optional[str] = None
    checkpoint_interval: int = 0
    use_async_checkpoint: bool = True
    final_checkpoint: bool = True
    keep_checkpoints: int = 2
    resume: str = "auto"
    checkpoint_timeout: float = 600.0
    startup_timeout: float = 1200.0
    termination_grace: float = float(TERMINATION_GRACE_FLOOR_S)
    # snapshot tiers
    snapshot_interval: int = 0
    tiers: tuple[str, ...] = ()
    memory_budget_gib: float = 0.0
    node_dir: Optional[str] = None
    snapshot_staging: str = "host"
    # outputs
    results_path: Optional[str] = None
    log_interval: int = 10
    trace_samples: bool = False
    profile_from: int = 0
    profile_steps: int = 3
    # recovery
    mode: str = "baseline"
    soft_timeout: float = 60.0
    hard_timeout: float = 90.0
    barrier_timeout: float = 120.0
    completion_timeout: float = 120.0
    inprocess_max_restarts: int = 20
    min_world_size: int = 0  # 0: the world may not shrink
    nccl_timeout: float = 0.0  # 0: derived, see collective_timeout
    # fault injection
    fault_count: int = 0
    fault_seed: int = 42
    fault_types: tuple[str, ...] = ("exception", "hang")
    fault_type_weights: tuple[float, ...] = ()
    fault_after_step: int = 10
    fault_probability: float = 0.0

    @property
    def output_dir(self) -> Optional[Path]:
        """Where the event log and profiles go: beside results.json, else the checkpoints."""
        if self.results_path:
            return Path(self.results_path).resolve().parent
        return Path(self.checkpoint_dir) if self.checkpoint_dir else None

    @property
    def inprocess(self) -> bool:
        return RecoveryMode(self.mode).in_process

    @property
    def ft_launcher(self) -> bool:
        return RecoveryMode(self.mode).uses_ft_launcher

    def collective_timeout(self, device_type: str) -> float:
        """--nccl_timeout, or its default. Gloo collectives cannot be aborted: on CPU ranks an
        in-process restart waits this long for a rank blocked behind a failed peer, so the
        default there is short; NCCL communicators are aborted, so theirs can be generous."""
        if self.nccl_timeout:
            return self.nccl_timeout
        if self.inprocess and device_type == "cpu":
            return min(10.0, self.hard_timeout / 2)
        return min(60.0, self.hard_timeout * 2 / 3) if self.inprocess else 60.0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def accumulation_steps(global_batch: int, micro_batch: int, world_size: int) -> int:
    """Micro-batches per rank per optimizer step that keep the global batch exact."""
    per_pass = micro_batch * world_size
    if global_batch % per_pass:
        raise ConfigError(
            f"global batch size {global_batch} cannot be kept at world size {world_size}: it is "
            f"not a multiple of --batch_size {micro_batch} x {world_size} ranks = {per_pass}; "
            "choose a --batch_size that divides it")
    return global_batch // per_pass


def _bool(text: str) -> bool:
    t = text.strip().lower()
    if t in ("true", "1", "yes", "on"):
        return True
    if t in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean; use true or false")


def _csv(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(p) for p in _csv(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers")


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def build_parser(prog: str = "python -m trainer") -> argparse.ArgumentParser:
    d = TrainConfig()
    p = _OneLineParser(prog=prog, description="FSDP2 LLaMA training that survives faults.")
    g = p.add_argument_group("model and data")
    g.add_argument("--model", default=d.model,
                   help="preset (tiny, llama-1b, llama3.1-8b), a local Hugging Face model "
                        "directory, or a hub id (the only case that uses the network)")
    g.add_argument("--data_path", default=d.data_path,
                   help="directory made by `python -m trainer.loop.data prepare`; default: the "
                        "bundled local corpus, prepared on first use")
    g.add_argument("--max_steps", type=int, default=d.max_steps)
    g.add_argument("--seq_len", type=int, default=d.seq_len)
    g.add_argument("--batch_size", type=int, default=d.batch_size,
                   help="sequences per rank per forward pass (the micro-batch)")
    g.add_argument("--global_batch_size", type=int, default=d.global_batch_size,
                   help="sequences per optimizer step over all ranks, kept through restarts at "
                        "any world size by gradient accumulation (0: --batch_size x world size "
                        "at the first start; a resume keeps the checkpoint's)")
    g.add_argument("--lr", type=float, default=d.lr)
    g.add_argument("--weight_decay", type=float, default=d.weight_decay,
                   help="AdamW weight decay of matrices; norms, biases and other 1-D "
                        "parameters are never decayed")
    g.add_argument("--warmup_steps", type=int, default=d.warmup_steps)
    g.add_argument("--grad_clip", type=float, default=d.grad_clip)
    g.add_argument("--seed", type=int, default=d.seed)
    g.add_argument("--device", choices=DEVICES, default=d.device)
    g.add_argument("--deterministic", type=_bool, default=d.deterministic, metavar="true|false",
                   help="bit-reproducible GPU training: deterministic kernels and attention "
                        "backward, fixed NCCL algorithm and protocol (slower; see BENCHMARKS.md)")
    g = p.add_argument_group("speed")
    g.add_argument("--compile", type=_bool, default=d.compile, metavar="true|false",
                   help="torch.compile each decoder layer")
    g.add_argument("--activation_checkpointing", choices=ACTIVATION_CHECKPOINTING,
                   default=d.activation_checkpointing,
                   help="recompute activations in the backward pass: of every other decoder "
                        "layer (selective) or of all of them (full)")
    g = p.add_argument_group("checkpoints")
    g.add_argument("--checkpoint_dir", default=d.checkpoint_dir)
    g.add_argument("--checkpoint_interval", type=int, default=d.checkpoint_interval,
                   help="steps between durable checkpoints (0: only at the end)")
    g.add_argument("--use_async_checkpoint", type=_bool, default=d.use_async_checkpoint,
                   metavar="true|false")
    g.add_argument("--final_checkpoint", type=_bool, default=d.final_checkpoint,
                   metavar="true|false",
                   help="false: no checkpoint of the last step (benchmarks, throwaway runs)")
    g.add_argument("--keep_checkpoints", type=int, default=d.keep_checkpoints)
    g.add_argument("--resume", choices=RESUME, default=d.resume,
                   help="auto: newest complete checkpoint if any; required: error if none")
    g.add_argument("--checkpoint_timeout", type=float, default=d.checkpoint_timeout,
                   help="seconds a background write, a drain or the final save may take "
                        "before training fails")
    g.add_argument("--startup_timeout", type=float, default=d.startup_timeout,
                   help="seconds start-up (model, buffers, restore, first step) may take")
    g.add_argument("--termination_grace", type=float, default=d.termination_grace,
                   help="seconds between SIGTERM and SIGKILL (a pod's terminationGracePeriodSeconds): "
                        "on SIGTERM the newest state is committed if its write fits, and the "
                        "launcher waits this long for the ranks")
    g = p.add_argument_group("snapshot tiers")
    g.add_argument("--snapshot_interval", type=int, default=d.snapshot_interval,
                   help="steps between in-memory snapshots (0: off)")
    g.add_argument("--tiers", type=_csv, default=d.tiers, metavar="memory,node,peer")
    g.add_argument("--memory_budget_gib", type=float, default=d.memory_budget_gib,
                   help="host memory the snapshot buffers may use per rank (0: what the tiers need: "
                        "two shards, five with the peer tier)")
    g.add_argument("--node_dir", default=d.node_dir,
                   help="node-local directory for the node tier (default /dev/shm/nvrx-eks)")
    g.add_argument("--snapshot_staging", choices=SNAPSHOT_STAGING, default=d.snapshot_staging,
                   help="device: copy each snapshot to device memory first (milliseconds), so "
                        "the optimizer never waits for the copy to host; costs one more shard "
                        "of device memory. On 2x H200 its steps ran 2-3%% slower than without "
                        "snapshots, host staging's 6-10%% (BENCHMARKS.md section 5). split: "
                        "half through device memory, half straight to the host, with half "
                        "the device memory: 1.4%% slower, against device 1.7%% and host 4.7%% "
                        "in one call with snapshots alone (section 6)")
    g = p.add_argument_group("outputs")
    g.add_argument("--results_path", default=d.results_path,
                   help="results.json; events.jsonl is written beside it")
    g.add_argument("--log_interval", type=int, default=d.log_interval)
    g.add_argument("--trace_samples", type=_bool, default=d.trace_samples, metavar="true|false",
                   help="log the sample indices of every step (for verification)")
    g.add_argument("--profile_from", type=int, default=d.profile_from,
                   help="first step of a torch.profiler window (0: off); traces and a summary "
                        "go to profile/ beside results.json")
    g.add_argument("--profile_steps", type=int, default=d.profile_steps,
                   help="steps in the profiler window")
    g = p.add_argument_group("recovery")
    g.add_argument("--mode", choices=MODES, default=d.mode)
    g.add_argument("--soft_timeout", type=float, default=d.soft_timeout)
    g.add_argument("--hard_timeout", type=float, default=d.hard_timeout)
    g.add_argument("--barrier_timeout", type=float, default=d.barrier_timeout)
    g.add_argument("--completion_timeout", type=float, default=d.completion_timeout)
    g.add_argument("--inprocess_max_restarts", type=int, default=d.inprocess_max_restarts)
    g.add_argument("--min_world_size", type=int, default=d.min_world_size,
                   help="in-process restarts may continue with this many ranks (0: all of them)")
    g.add_argument("--nccl_timeout", type=float, default=d.nccl_timeout,
                   help="collective timeout in seconds (NCCL, or gloo on CPU ranks); default "
                        "60, in in-process modes 10 on CPU ranks (gloo cannot be aborted)")
    g = p.add_argument_group("fault injection")
    g.add_argument("--fault_count", type=int, default=d.fault_count)
    g.add_argument("--fault_seed", type=int, default=d.fault_seed)
    g.add_argument("--fault_types", type=_csv, default=d.fault_types, metavar="a,b")
    g.add_argument("--fault_type_weights", type=_floats, default=d.fault_type_weights, metavar="w1,w2")
    g.add_argument("--fault_after_step", type=int, default=d.fault_after_step)
    g.add_argument("--fault_probability", type=float, default=d.fault_probability,
                   help="chance per step and rank of a random extra fault (not deterministic)")
    return p


def validate(cfg: TrainConfig) -> TrainConfig:
    """Reject values that would fail later, naming the value and what is allowed."""

    def need(ok: bool, msg: str) -> None:
        if not ok:
            raise ConfigError(msg)

    for name in ("max_steps", "seq_len", "batch_size", "profile_steps"):
        v = getattr(cfg, name)
        need(v >= 1, f"--{name} {v} must be at least 1")
    for name in ("checkpoint_interval", "snapshot_interval", "fault_count", "fault_after_step",
                 "warmup_steps", "inprocess_max_restarts", "profile_from"):
        v = getattr(cfg, name)
        need(v >= 0, f"--{name} {v} must be 0 or more")
    need(cfg.lr > 0, f"--lr {cfg.lr} must be positive")
    need(cfg.weight_decay >= 0, f"--weight_decay {cfg.weight_decay} must be 0 or more")
    need(cfg.global_batch_size >= 0,
         f"--global_batch_size {cfg.global_batch_size} must be 0 (automatic) or more")
    need(cfg.global_batch_size % cfg.batch_size == 0,
         f"--global_batch_size {cfg.global_batch_size} is not a multiple of --batch_size "
         f"{cfg.batch_size}")
    world = int(os.environ.get("WORLD_SIZE", 0))  # set by torchrun and ft_launcher
    if cfg.global_batch_size and world:
        accumulation_steps(cfg.global_batch_size, cfg.batch_size, world)
    need(cfg.activation_checkpointing in ACTIVATION_CHECKPOINTING,
         f"--activation_checkpointing {cfg.activation_checkpointing!r} is unknown; allowed: "
         f"{', '.join(ACTIVATION_CHECKPOINTING)}")
    need(cfg.log_interval >= 1, f"--log_interval {cfg.log_interval} must be at least 1")
    need(cfg.keep_checkpoints >= 1, f"--keep_checkpoints {cfg.keep_checkpoints} must be at least 1")
    need(cfg.checkpoint_timeout > 0, f"--checkpoint_timeout {cfg.checkpoint_timeout} must be positive")
    need(cfg.startup_timeout > 0, f"--startup_timeout {cfg.startup_timeout} must be positive")
    need(cfg.termination_grace > 0,
         f"--termination_grace {cfg.termination_grace} must be positive")
    need(cfg.nccl_timeout >= 0, f"--nccl_timeout {cfg.nccl_timeout} must be positive (0: default)")
    need(cfg.min_world_size >= 0, f"--min_world_size {cfg.min_world_size} must be 0 or more")
    need(0.0 <= cfg.fault_probability <= 1.0,
         f"--fault_probability {cfg.fault_probability} must be between 0 and 1")
    for t in cfg.fault_types:
        need(t in FAULT_TYPES, f"--fault_types {t!r} is unknown; allowed: {', '.join(FAULT_TYPES)}")
    need(len(cfg.fault_types) > 0 or cfg.fault_count == 0, "--fault_types is empty")
    if cfg.fault_type_weights:
        need(len(cfg.fault_type_weights) == len(cfg.fault_types),
             f"--fault_type_weights has {len(cfg.fault_type_weights)} values for "
             f"{len(cfg.fault_types)} fault types")
        need(all(w >= 0 for w in cfg.fault_type_weights) and sum(cfg.fault_type_weights) > 0,
             f"--fault_type_weights {cfg.fault_type_weights} must be non-negative with a positive sum")
    need(cfg.fault_after_step + cfg.fault_count <= cfg.max_steps or cfg.fault_count == 0,
         f"--fault_count {cfg.fault_count} faults do not fit between --fault_after_step "
         f"{cfg.fault_after_step} and --max_steps {cfg.max_steps}")
    for t in cfg.tiers:
        need(t in TIERS, f"--tiers {t!r} is unknown; allowed: {', '.join(TIERS)}")
    need(not cfg.tiers or cfg.snapshot_interval >= 1,
         f"--tiers {','.join(cfg.tiers)} needs --snapshot_interval of at least 1")
    need(cfg.snapshot_staging == "host" or bool(cfg.tiers),
         f"--snapshot_staging {cfg.snapshot_staging} needs snapshot --tiers")
    need(cfg.memory_budget_gib >= 0, f"--memory_budget_gib {cfg.memory_budget_gib} must be 0 or more")
    need(cfg.soft_timeout < cfg.hard_timeout < cfg.barrier_timeout,
         f"timeouts must satisfy soft ({cfg.soft_timeout}) < hard ({cfg.hard_timeout}) "
         f"< barrier ({cfg.barrier_timeout})")
    need(not cfg.inprocess or not cfg.nccl_timeout or cfg.nccl_timeout < cfg.hard_timeout,
         f"--nccl_timeout {cfg.nccl_timeout} must be below --hard_timeout {cfg.hard_timeout} in "
         f"mode {cfg.mode}: a rank blocked in a collective must come back before it is killed")
    need(cfg.soft_timeout > 1.0, f"--soft_timeout {cfg.soft_timeout} must exceed 1 second")
    need(cfg.resume != "required" or cfg.checkpoint_dir is not None,
         "--resume required needs --checkpoint_dir")
    need(cfg.checkpoint_interval == 0 or cfg.checkpoint_dir is not None,
         f"--checkpoint_interval {cfg.checkpoint_interval} needs --checkpoint_dir")
    need(not cfg.tiers or cfg.checkpoint_dir is not None, "--tiers needs --checkpoint_dir")
    need(cfg.fault_count == 0 or cfg.checkpoint_dir is not None,
         "fault injection needs --checkpoint_dir (the fault record is kept there)")
    for name in ("seed", "fault_seed"):
        v = getattr(cfg, name)
        need(0 <= v < 2**32, f"--{name} {v} must be between 0 and {2**32 - 1}")
    for name in ("lr", "grad_clip", "soft_timeout", "hard_timeout", "barrier_timeout",
                 "completion_timeout", "nccl_timeout", "checkpoint_timeout", "startup_timeout",
                 "termination_grace", "memory_budget_gib"):
        v = getattr(cfg, name)
        need(math.isfinite(v), f"--{name} {v} must be a finite number")
    need(cfg.grad_clip >= 0, f"--grad_clip {cfg.grad_clip} must be 0 (off) or positive")
    from trainer.loop.model import PRESETS, is_model_reference  # light import: no torch

    need(is_model_reference(cfg.model),
         f"--model {cfg.model!r} is neither a preset ({', '.join(PRESETS)}), "
         "an existing directory, nor a hub id (org/name)")
    return cfg


def check_environment(cfg: TrainConfig) -> TrainConfig:
    """What only the machine that trains can check, before anything starts: the data, the
    checkpoint directory and what it already holds. (`validate` alone runs at synth time.)"""

    def need(ok: bool, msg: str) -> None:
        if not ok:
            raise ConfigError(msg)

    if cfg.data_path is not None:
        data = Path(cfg.data_path)
        need(data.is_dir(), f"--data_path {cfg.data_path!r} is not a directory; build one with "
                            "`python -m trainer.loop.data prepare`")
        for name in ("meta.json", "tokens.bin"):
            need((data / name).is_file(), f"--data_path {cfg.data_path!r} has no {name}; build it "
                                          "with `python -m trainer.loop.data prepare`")
    if cfg.checkpoint_dir is not None:
        ckpt = Path(cfg.checkpoint_dir)
        existing = next((p for p in [ckpt, *ckpt.parents] if p.exists()), None)
        need(existing is None or existing.is_dir(),
             f"--checkpoint_dir {cfg.checkpoint_dir!r}: {existing} is not a directory")
        need(existing is None or os.access(existing, os.W_OK | os.X_OK),
             f"--checkpoint_dir {cfg.checkpoint_dir!r}: {existing} is not writable")
        from trainer.durable.store import CheckpointStore

        latest = CheckpointStore(cfg.checkpoint_dir).latest_step()
        need(cfg.resume != "required" or latest is not None,
             f"--resume required, but {cfg.checkpoint_dir} holds no complete checkpoint")
        need(cfg.resume != "never" or latest is None,
             f"--resume never, but {cfg.checkpoint_dir} already holds checkpoints (step "
             f"{latest}); use a new --checkpoint_dir")
    return cfg


def parse_args(argv: Optional[Sequence[str]] = None, prog: str = "python -m trainer",
               environment: bool = True) -> TrainConfig:
    """Parse and validate (and, unless told not to, check the data and directories of this
    machine); on a bad value print one line and exit 2."""
    parser = build_parser(prog)
    ns = parser.parse_args(argv)
    cfg = TrainConfig(**vars(ns))
    try:
        cfg = validate(cfg)
        return check_environment(cfg) if environment else cfg
    except ConfigError as exc:
        parser.error(str(exc))
