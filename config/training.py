"""Every trainer setting, defined once: its type, default, bounds and a one-line description.

From this one model come the trainer's command line and its `--help` (`trainer.config`), the
profile's `trainer:` section (`config.profile`), the manifests' trainer arguments
(`k8s.commands`), the settings reference in the docs, and the validation at every one of those
places, with the same one-line messages. Settings that the deployment decides (paths in the pod,
the recovery mode, the device) are marked `pod`: a profile cannot set them.

Checks here are pure: they need no file, no torch and no network, so they run at synth time as
well as in the pod. What only the machine that trains can know (the data, the checkpoint
directory, a model directory) is checked there (`trainer.preflight.check_environment`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from config.contract import MODE_NAMES, TERMINATION_GRACE_FLOOR_S, RecoveryMode
from config.presets import PRESETS

FAULT_TYPES = ("exception", "hang", "sigkill", "segfault", "oom", "node")
TIERS = ("memory", "node", "peer")
# Share of each snapshot's bytes that goes through device memory, by snapshot_staging.
STAGED_SHARE = {"host": 0.0, "device": 1.0, "split": 0.5}
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
GROUPS = ("model and data", "speed", "checkpoints", "snapshot tiers", "outputs", "recovery",
          "fault injection")


def setting(default: Any, description: str, group: str, *, pod: str = "", metavar: str = "",
            **bounds: Any) -> Any:
    """One setting: its default, what it does (one line), its --help group and its bounds.
    `pod`: why the deployment, not a profile, sets it (empty: a profile may)."""
    assert group in GROUPS, group
    extra = {"group": group, "pod": pod, "metavar": metavar}
    return Field(default=default, description=description, json_schema_extra=extra, **bounds)


class TrainConfig(BaseModel):
    """The one configuration object that flows through the trainer."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    # -- model and data -----------------------------------------------------------------------
    model: str = setting("tiny", f"a preset ({', '.join(PRESETS)}), a Hugging Face model "
                         "directory, or a hub id (the only case that uses the network)",
                         "model and data")
    data_path: Optional[str] = setting(None, "directory made by `python -m trainer.loop.data "
                                       "prepare`; none: the bundled local corpus, prepared on "
                                       "first use", "model and data",
                                       pod="the run's data directory on FSx")
    max_steps: int = setting(100, "optimizer steps to train", "model and data", ge=1)
    seq_len: int = setting(128, "tokens per training sequence", "model and data", ge=1)
    batch_size: int = setting(4, "sequences per rank per forward pass (the micro-batch)",
                              "model and data", ge=1)
    global_batch_size: int = setting(0, "sequences per optimizer step over all ranks, kept at "
                                     "any world size by gradient accumulation (0: batch_size x "
                                     "world size at the first start)", "model and data", ge=0)
    lr: float = setting(3e-4, "peak learning rate (linear warm-up, cosine decay to 10 %)",
                        "model and data", gt=0)
    weight_decay: float = setting(0.1, "AdamW weight decay of matrices; norms, biases and other "
                                  "1-D parameters are never decayed", "model and data", ge=0)
    warmup_steps: int = setting(10, "steps of linear learning-rate warm-up", "model and data",
                                ge=0)
    grad_clip: float = setting(1.0, "gradient norm clip (0: off)", "model and data", ge=0)
    seed: int = setting(1234, "seed of the initial weights and the data order",
                        "model and data", ge=0, lt=2**32)
    device: Literal["auto", "cpu", "cuda"] = setting("auto", "where ranks compute (auto: a GPU "
                                                     "if there is one)", "model and data",
                                                     pod="cuda on every GPU node")
    deterministic: bool = setting(False, "bit-reproducible GPU training: deterministic kernels "
                                  "and attention backward, fixed NCCL algorithm and protocol "
                                  "(slower)", "model and data")
    # -- speed --------------------------------------------------------------------------------
    compile: bool = setting(False, "torch.compile each decoder layer", "speed")
    activation_checkpointing: Literal["none", "selective", "full"] = setting(
        "none", "recompute activations in the backward pass: of every other decoder layer "
        "(selective) or of all of them (full)", "speed")
    compute_dtype: Literal["auto", "bf16", "fp32"] = setting(
        "auto", "dtype of the forward and backward passes (weights, optimizer state and gradient "
        "reductions stay fp32); auto: bf16 on GPUs and on CPUs that compute it natively, fp32 on "
        "CPUs that would emulate it", "speed")
    # -- checkpoints --------------------------------------------------------------------------
    checkpoint_dir: Optional[str] = setting(None, "where durable checkpoints go (none: no "
                                            "checkpoints)", "checkpoints",
                                            pod="the run's directory on FSx")
    checkpoint_interval: int = setting(0, "steps between durable checkpoints (0: only the last "
                                       "step)", "checkpoints", ge=0)
    use_async_checkpoint: bool = setting(True, "write checkpoints in a background process; "
                                         "only the copy to host memory blocks training",
                                         "checkpoints")
    final_checkpoint: bool = setting(True, "checkpoint the last step (false: benchmarks, "
                                     "throwaway runs)", "checkpoints")
    keep_checkpoints: int = setting(2, "newest committed checkpoints to keep", "checkpoints",
                                    ge=1)
    resume: Literal["auto", "required", "never"] = setting(
        "auto", "auto: the newest complete checkpoint if any; required: error if none; never: "
        "error if any", "checkpoints", pod="auto: a restarted pod resumes")
    allow_fresh_start: bool = setting(False, "where committed checkpoints exist but none can be "
                                      "restored, set them aside (step_NNNNNNNN.skipped) and "
                                      "train from step 0 instead of stopping with exit code 2",
                                      "checkpoints")
    checkpoint_timeout: float = setting(600.0, "seconds a background write, a drain or the "
                                        "final save may take before training fails",
                                        "checkpoints", gt=0)
    startup_timeout: float = setting(1200.0, "seconds start-up (model, buffers, restore, first "
                                     "step) may take", "checkpoints", gt=0)
    termination_grace: float = setting(
        float(TERMINATION_GRACE_FLOOR_S), "seconds between SIGTERM and SIGKILL: on SIGTERM the "
        "newest state is committed if its write fits, and the launcher waits this long for the "
        "ranks", "checkpoints", gt=0,
        pod="the pod's terminationGracePeriodSeconds, sized from the checkpoint's write time")
    # -- snapshot tiers -----------------------------------------------------------------------
    snapshot_interval: Union[int, Literal["auto"]] = setting(
        "auto", "steps between snapshots, or auto: the fewest that keep their cost under 1 % "
        "of throughput, measured in each attempt's first steps (trainer.snapshots.cadence)",
        "snapshot tiers")
    tiers: tuple[str, ...] = setting((), "snapshot tiers: memory, node, peer",
                                     "snapshot tiers", metavar="memory,node,peer")
    memory_budget_gib: float = setting(0.0, "host memory the snapshot buffers may use per rank "
                                       "(0: what the tiers need)", "snapshot tiers", ge=0)
    node_dir: Optional[str] = setting(None, "node-local directory of the node tier (none: "
                                      "/dev/shm/nvrx-eks)", "snapshot tiers",
                                      pod="the pod's /dev/shm or the instance-store NVMe")
    snapshot_staging: Literal["host", "device", "split"] = setting(
        "host", "how a snapshot leaves the GPU: straight to host memory; through device memory "
        "first (the optimizer waits only for a device copy, one more shard of device memory); "
        "or half each", "snapshot tiers")
    # -- outputs ------------------------------------------------------------------------------
    results_path: Optional[str] = setting(None, "results.json; the event log is written beside "
                                          "it", "outputs", pod="the run's directory on FSx")
    log_interval: int = setting(10, "steps between rank-0 log lines", "outputs", ge=1)
    trace_samples: bool = setting(False, "log the sample indices of every step (verification)",
                                  "outputs")
    profile_from: int = setting(0, "first step of a torch.profiler window (0: off); traces go "
                                "to profile/ beside results.json", "outputs", ge=0)
    profile_steps: int = setting(3, "steps in the profiler window", "outputs", ge=1)
    tensorboard: bool = setting(True, "rank 0 writes TensorBoard event files to tensorboard/ "
                                "beside results.json", "outputs")
    wandb_project: Optional[str] = setting(None, "also log to this Weights & Biases project "
                                           "(needs the wandb extra); a restart resumes the "
                                           "checkpoint directory's W&B run", "outputs")
    # -- recovery -----------------------------------------------------------------------------
    mode: Literal[MODE_NAMES] = setting("baseline", "the recovery mode (config/contract.py)",  # type: ignore[valid-type]
                                        "recovery", pod="the profile's recovery.mode")
    soft_timeout: float = setting(60.0, "in-process: seconds without progress before a rank "
                                  "counts as hung", "recovery", gt=1)
    hard_timeout: float = setting(90.0, "in-process: seconds without progress before a hung "
                                  "rank is killed", "recovery", gt=0)
    barrier_timeout: float = setting(120.0, "in-process: seconds the ranks wait for each other "
                                     "at a restart", "recovery", gt=0)
    completion_timeout: float = setting(120.0, "in-process: seconds a restart's completion may "
                                        "take", "recovery", gt=0)
    inprocess_max_restarts: int = setting(20, "in-process restarts before the job fails",
                                          "recovery", ge=0)
    min_world_size: int = setting(0, "in-process restarts may continue with this many ranks "
                                  "(0: all of them)", "recovery", ge=0)
    nccl_timeout: float = setting(0.0, "collective timeout in seconds, NCCL or gloo (0: 60; in "
                                  "in-process modes on CPU ranks 10, gloo cannot be aborted)",
                                  "recovery", ge=0)
    # -- fault injection ----------------------------------------------------------------------
    fault_count: int = setting(0, "faults of the seeded schedule", "fault injection", ge=0)
    fault_seed: int = setting(42, "seed of the fault schedule", "fault injection", ge=0,
                              lt=2**32)
    fault_types: tuple[str, ...] = setting(("exception", "hang"), "fault types to draw from: "
                                           + ", ".join(FAULT_TYPES), "fault injection",
                                           metavar="a,b")
    fault_type_weights: tuple[float, ...] = setting((), "weights of the fault types (none: "
                                                    "equal)", "fault injection", metavar="w1,w2")
    fault_after_step: int = setting(10, "faults fall on later steps only", "fault injection",
                                    ge=0)
    fault_probability: float = setting(0.0, "chance per step and rank of a random extra fault "
                                       "(not deterministic)", "fault injection", ge=0, le=1)

    @model_validator(mode="after")
    def _rules(self) -> "TrainConfig":
        for message in cross_field_problems(self):
            raise ValueError(message)
        return self

    # -- derived ------------------------------------------------------------------------------
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
        """nccl_timeout, or its default. Gloo collectives cannot be aborted: on CPU ranks an
        in-process restart waits this long for a rank blocked behind a failed peer, so the
        default there is short; NCCL communicators are aborted, so theirs can be generous."""
        if self.nccl_timeout:
            return self.nccl_timeout
        if self.inprocess and device_type == "cpu":
            return min(10.0, self.hard_timeout / 2)
        return min(60.0, self.hard_timeout * 2 / 3) if self.inprocess else 60.0

    def to_dict(self) -> dict:
        return self.model_dump(mode="json")


def choices(name: str) -> tuple[str, ...]:
    """The allowed values of a setting with a fixed set of them; empty for any other."""
    import typing

    hint = typing.get_type_hints(TrainConfig)[name]
    return typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else ()


def is_model_reference(ref: str) -> bool:
    """A preset, a path (checked where it lives: in the pod), or a hub id (org/name)."""
    return ref in PRESETS or ref.startswith(("/", "./", "../")) \
        or bool(_HUB_ID.fullmatch(ref))


def cross_field_problems(cfg: TrainConfig) -> list[str]:
    """The rules that tie settings together, each a one-line message; empty when all hold."""
    rules = [
        (cfg.global_batch_size % cfg.batch_size == 0,
         f"--global_batch_size {cfg.global_batch_size} is not a multiple of --batch_size "
         f"{cfg.batch_size}"),
        (all(t in FAULT_TYPES for t in cfg.fault_types),
         f"--fault_types {next((t for t in cfg.fault_types if t not in FAULT_TYPES), '')!r} is "
         f"unknown; allowed: {', '.join(FAULT_TYPES)}"),
        (len(cfg.fault_types) > 0 or cfg.fault_count == 0, "--fault_types is empty"),
        (not cfg.fault_type_weights or len(cfg.fault_type_weights) == len(cfg.fault_types),
         f"--fault_type_weights has {len(cfg.fault_type_weights)} values for "
         f"{len(cfg.fault_types)} fault types"),
        (not cfg.fault_type_weights or (all(w >= 0 for w in cfg.fault_type_weights)
                                        and sum(cfg.fault_type_weights) > 0),
         f"--fault_type_weights {cfg.fault_type_weights} must be non-negative with a positive sum"),
        (cfg.fault_after_step + cfg.fault_count <= cfg.max_steps or cfg.fault_count == 0,
         f"--fault_count {cfg.fault_count} faults do not fit between --fault_after_step "
         f"{cfg.fault_after_step} and --max_steps {cfg.max_steps}"),
        (all(t in TIERS for t in cfg.tiers),
         f"--tiers {next((t for t in cfg.tiers if t not in TIERS), '')!r} is unknown; allowed: "
         f"{', '.join(TIERS)}"),
        (cfg.snapshot_interval == "auto" or cfg.snapshot_interval >= 1,
         f"--snapshot_interval {cfg.snapshot_interval} must be auto or at least 1"),
        (cfg.snapshot_staging == "host" or bool(cfg.tiers),
         f"--snapshot_staging {cfg.snapshot_staging} needs snapshot --tiers"),
        (cfg.soft_timeout < cfg.hard_timeout < cfg.barrier_timeout,
         f"timeouts must satisfy soft ({cfg.soft_timeout}) < hard ({cfg.hard_timeout}) "
         f"< barrier ({cfg.barrier_timeout})"),
        (not cfg.inprocess or not cfg.nccl_timeout or cfg.nccl_timeout < cfg.hard_timeout,
         f"--nccl_timeout {cfg.nccl_timeout:g} must be below --hard_timeout {cfg.hard_timeout:g} "
         f"in mode {cfg.mode}: a rank blocked in a collective must come back before it is killed"),
        (cfg.resume != "required" or cfg.checkpoint_dir is not None,
         "--resume required needs --checkpoint_dir"),
        (cfg.resume != "required" or not cfg.allow_fresh_start,
         "--allow_fresh_start true contradicts --resume required, which never starts from step 0"),
        (cfg.checkpoint_interval == 0 or cfg.checkpoint_dir is not None,
         f"--checkpoint_interval {cfg.checkpoint_interval} needs --checkpoint_dir"),
        (not cfg.tiers or cfg.checkpoint_dir is not None, "--tiers needs --checkpoint_dir"),
        (cfg.fault_count == 0 or cfg.checkpoint_dir is not None,
         "fault injection needs --checkpoint_dir (the fault record is kept there)"),
        (is_model_reference(cfg.model),
         f"--model {cfg.model!r} is neither a preset ({', '.join(PRESETS)}), a path, "
         "nor a hub id (org/name)"),
    ]
    return [message for ok, message in rules if not ok]


def batch_problem(global_batch: int, micro_batch: int, world_size: int) -> Optional[str]:
    """Why a world of `world_size` ranks cannot keep the global batch exact, or None."""
    per_pass = micro_batch * world_size
    if global_batch % per_pass == 0:
        return None
    return (f"global batch size {global_batch} cannot be kept at world size {world_size}: it is "
            f"not a multiple of --batch_size {micro_batch} x {world_size} ranks = {per_pass}; "
            "choose a --batch_size that divides it")


def batch_problem_down_to(global_batch: int, micro_batch: int, ranks_per_node: int, nodes: int,
                          min_nodes: int, min_nodes_name: str = "--min_nodes") -> Optional[str]:
    """Why some world the run may train at cannot keep the global batch exact, or None.

    Training shrinks one lost node at a time, so it may meet every node count from `nodes` down
    to `min_nodes`; the global batch is split into equal micro-batches only (no uneven ones), so
    each of those worlds must divide it. Checked before anything starts, not after a node is
    lost."""
    for n in range(nodes, min_nodes - 1, -1):
        problem = batch_problem(global_batch, micro_batch, n * ranks_per_node)
        if problem is None:
            continue
        if n == nodes:
            return problem
        return (f"{min_nodes_name} {min_nodes} lets training shrink to {n} nodes, where the "
                f"{problem}")
    return None


def _bound_phrase(err: dict) -> str:
    """A bound that failed, in the words of the rest of the project's messages."""
    ctx = err.get("ctx") or {}
    kind = err["type"]
    if kind == "greater_than_equal":
        return "must be 0 or more" if ctx["ge"] == 0 else f"must be at least {ctx['ge']}"
    if kind == "greater_than":
        return "must be positive" if ctx["gt"] == 0 else f"must exceed {ctx['gt']}"
    if kind in ("less_than", "less_than_equal"):
        return f"must be {'below' if kind == 'less_than' else 'at most'} " \
               f"{ctx.get('lt', ctx.get('le'))}"
    if kind == "finite_number":
        return "must be a finite number"
    if kind == "literal_error":
        return f"is not one of {ctx['expected']}"
    msg = err["msg"].removeprefix("Value error, ").removeprefix("Input ")
    return msg[:1].lower() + msg[1:]


def describe(exc: ValidationError, name_of=lambda field: f"--{field}") -> str:
    """The first problem of a validation error as one line: `--seed -1 must be 0 or more`, or
    with `name_of`, the same under another name (a profile's `trainer.seed`)."""
    errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    return describe_error(errors[0], name_of)


def describe_error(err: dict, name_of=lambda field: f"--{field}") -> str:
    """One pydantic error of a setting (its `loc` starts at the setting's name) as one line."""
    field = ".".join(str(p) for p in err["loc"])
    if not field:  # a cross-field rule: its message names its settings, as flags
        return re.sub(r"--(\w+)", lambda m: name_of(m[1]) if m[1] in TrainConfig.model_fields
                      else m[0], err["msg"].removeprefix("Value error, "))
    if err["type"] == "extra_forbidden":
        return f"{name_of(field)}: unknown setting"
    bounds = field_bounds(str(err["loc"][0]))
    shown = err.get("input")
    if isinstance(shown, str):
        shown = repr(shown)
    if err["type"] in ("greater_than_equal", "less_than") and {"ge", "lt"} <= set(bounds):
        return f"{name_of(field)} {shown} must be between {bounds['ge']} and {bounds['lt'] - 1}"
    if err["type"] in ("greater_than_equal", "less_than_equal") and {"ge", "le"} <= set(bounds):
        return f"{name_of(field)} {shown} must be between {bounds['ge']} and {bounds['le']}"
    return f"{name_of(field)} {shown} {_bound_phrase(err)}"


def field_bounds(name: str) -> dict:
    info = TrainConfig.model_fields.get(name)
    out: dict = {}
    for m in getattr(info, "metadata", ()):
        for key in ("ge", "gt", "le", "lt"):
            if getattr(m, key, None) is not None:
                out[key] = getattr(m, key)
    return out


def shown(value: Any) -> str:
    """A setting's value as the command line spells it: true, 1.5, a,b; none for no value."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, tuple):
        return ",".join(shown(v) for v in value)
    return str(value)


def settings_lines(cfg: TrainConfig) -> list[str]:
    """Every setting of `cfg`, one line per group: what a run will use, printed before it runs."""
    by_group: dict[str, list[str]] = {g: [] for g in GROUPS}
    for name, info in TrainConfig.model_fields.items():
        by_group[info.json_schema_extra["group"]].append(f"{name}={shown(getattr(cfg, name))}")
    return [f"{group}: {' '.join(items)}" for group, items in by_group.items()]


def pod_owned() -> dict[str, str]:
    """Settings the deployment decides, and why: a profile cannot set them."""
    return {name: info.json_schema_extra["pod"] for name, info in TrainConfig.model_fields.items()
            if info.json_schema_extra["pod"]}
