"""The trainer's command line, generated from the one definition of its settings
(`config.training`), and the checks only the machine that trains can make.

Flag names follow the published example (`--checkpoint_interval`, `--use_async_checkpoint`,
`--fault_*`) so its commands keep working. Every check runs before any process group starts:
a bad value is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import typing
from pathlib import Path
from typing import Any, NoReturn, Optional, Sequence

from pydantic import ValidationError

from config.contract import MODE_NAMES  # one table of recovery modes
from config.presets import PRESETS, TOKENIZERS
from config.training import GROUPS, STAGED_SHARE, TrainConfig, batch_problem, describe, shown
from trainer.errors import ConfigError

__all__ = ["MODE_NAMES", "STAGED_SHARE", "TrainConfig", "accumulation_steps", "build_parser",
           "check_environment", "from_values", "parse_args", "validate"]


def from_values(**values: Any) -> TrainConfig:
    """A TrainConfig from setting values; a bad one raises ConfigError naming it."""
    try:
        return TrainConfig(**values)
    except ValidationError as exc:
        raise ConfigError(describe(exc)) from None


def accumulation_steps(global_batch: int, micro_batch: int, world_size: int) -> int:
    """Micro-batches per rank per optimizer step that keep the global batch exact."""
    problem = batch_problem(global_batch, micro_batch, world_size)
    if problem:
        raise ConfigError(problem)
    return global_batch // (micro_batch * world_size)


def validate(cfg: TrainConfig) -> TrainConfig:
    """What the launcher's world adds to the settings' own rules: the global batch must divide
    over the ranks it starts (WORLD_SIZE, set by torchrun and ft_launcher)."""
    world = int(os.environ.get("WORLD_SIZE", 0))
    if cfg.global_batch_size and world:
        accumulation_steps(cfg.global_batch_size, cfg.batch_size, world)
    return cfg


# -- the command line ---------------------------------------------------------------------------
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


def _argument(annotation: Any) -> dict:
    """argparse keywords for a setting's type."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is bool:
        return {"type": _bool, "metavar": "true|false"}
    if origin is typing.Literal:
        return {"choices": args}
    if origin is tuple:
        return {"type": _floats if args[0] is float else _csv}
    if origin is typing.Union:  # Optional[str]
        return {"type": str}
    return {"type": annotation}


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def build_parser(prog: str = "python -m trainer") -> argparse.ArgumentParser:
    """Every setting as a flag of its own name, in its group, with its description and default."""
    p = _OneLineParser(prog=prog, description="FSDP2 LLaMA training that survives faults.")
    groups = {name: p.add_argument_group(name) for name in GROUPS}
    hints = typing.get_type_hints(TrainConfig)
    for name, info in TrainConfig.model_fields.items():
        extra = info.json_schema_extra
        kwargs = _argument(hints[name])
        if extra["metavar"]:
            kwargs["metavar"] = extra["metavar"]
        help_text = f"{info.description} (default: {shown(info.default)})".replace("%", "%%")
        groups[extra["group"]].add_argument(f"--{name}", default=info.default, help=help_text,
                                            **kwargs)
    return p


def parse_args(argv: Optional[Sequence[str]] = None, prog: str = "python -m trainer",
               environment: bool = True, sample_data: bool = False) -> TrainConfig:
    """Parse and validate (and, unless told not to, check the data and directories of this
    machine; a launcher, once per node, also samples the token file); on a bad value print one
    line and exit 2."""
    parser = build_parser(prog)
    ns = parser.parse_args(argv)
    try:
        cfg = validate(from_values(**vars(ns)))
        return check_environment(cfg, sample_data) if environment else cfg
    except ConfigError as exc:
        parser.error(str(exc))


# -- what only the machine that trains can check ------------------------------------------------
def _need(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


def model_vocab(ref: str) -> Optional[int]:
    """The vocabulary size of a preset or a model directory, without torch; None for a hub id
    (only its download would tell)."""
    if ref in PRESETS:
        return PRESETS[ref]["vocab_size"]
    config = Path(ref) / "config.json"
    if config.is_file():
        return int(json.loads(config.read_text()).get("vocab_size", 0)) or None
    return None


def expected_tokenizer(ref: str) -> Optional[str]:
    """The tokenizer a model is trained with: a preset's, or a model directory's own."""
    if ref in TOKENIZERS:
        return TOKENIZERS[ref]
    return ref if Path(ref).is_dir() else None


def check_model(cfg: TrainConfig) -> None:
    """A path names a model directory on this machine (in a pod: on FSx)."""
    if cfg.model.startswith(("/", "./", "../")):
        _need(Path(cfg.model).is_dir(),
              f"--model {cfg.model!r} is not a directory on this machine")
        _need((Path(cfg.model) / "config.json").is_file(),
              f"--model {cfg.model!r} has no config.json: not a Hugging Face model directory")


def check_checkpoint_dir(cfg: TrainConfig, loud: bool) -> None:
    """Writable, holding what --resume asks for, trained so far with compatible settings (a
    change that the run can take is printed when `loud`)."""
    if cfg.checkpoint_dir is None:
        return
    ckpt = Path(cfg.checkpoint_dir)
    existing = next((p for p in [ckpt, *ckpt.parents] if p.exists()), None)
    _need(existing is None or existing.is_dir(),
          f"--checkpoint_dir {cfg.checkpoint_dir!r}: {existing} is not a directory")
    _need(existing is None or os.access(existing, os.W_OK | os.X_OK),
          f"--checkpoint_dir {cfg.checkpoint_dir!r}: {existing} is not writable")
    from trainer.durable.store import CheckpointStore

    latest = CheckpointStore(cfg.checkpoint_dir).latest_step()
    _need(cfg.resume != "required" or latest is not None,
          f"--resume required, but {cfg.checkpoint_dir} holds no complete checkpoint")
    _need(cfg.resume != "never" or latest is None,
          f"--resume never, but {cfg.checkpoint_dir} already holds checkpoints (step "
          f"{latest}); use a new --checkpoint_dir")
    from trainer.durable.run_settings import check_unchanged

    check_unchanged(cfg, log=print if loud else lambda _: None)


def check_environment(cfg: TrainConfig, sample_data: bool = False) -> TrainConfig:
    """What only the machine that trains can check, before anything starts: the model
    directory, the data and the checkpoint directory with what it already holds. With
    `sample_data` (once per node: the launcher), also read a sample of the token file."""
    check_model(cfg)
    check_training_data(cfg, sample_data)
    check_checkpoint_dir(cfg, loud=sample_data)
    check_wandb(cfg)
    return cfg


def check_training_data(cfg: TrainConfig, sample_data: bool = False) -> None:
    """The data the ranks will read, whatever fails on it fails every rank and every restart
    alike: --data_path, or the bundled corpus where it is prepared already (else the ranks
    prepare it, and a problem with it still ends the run with exit code 2, unretried)."""
    from trainer.loop.data import DataMeta, check_data, check_length, default_data_path

    if cfg.data_path is not None:
        check_data(Path(cfg.data_path), model_vocab(cfg.model), expected_tokenizer(cfg.model),
                   sample=sample_data, flag="--data_path", seq_len=cfg.seq_len)
        return
    bundled = default_data_path()
    try:
        meta = DataMeta.read(bundled)
    except (OSError, ValueError, TypeError):  # not prepared yet (or half): the ranks prepare it
        return
    check_length(meta, cfg.seq_len, f"the bundled corpus {str(bundled)!r}")


def check_wandb(cfg: TrainConfig) -> None:
    """W&B is an optional extra: a run that asks for it without it installed stops here."""
    if cfg.wandb_project:
        import importlib.util

        _need(importlib.util.find_spec("wandb") is not None,
              f"--wandb_project {cfg.wandb_project!r} needs the wandb package, which is not "
              "installed: pip install 'nvrx-eks[wandb]'")
