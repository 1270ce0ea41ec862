"""The trainer's command line, generated from the one definition of its settings
(`config.training`). The checks only the machine that trains can make are `trainer.preflight`'s.

Flag names follow the published example (`--checkpoint_interval`, `--use_async_checkpoint`,
`--fault_*`) so its commands keep working. Every check runs before any process group starts:
a bad value is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import typing
from typing import Any, NoReturn, Optional, Sequence

from pydantic import ValidationError

from config.contract import MODE_NAMES  # one table of recovery modes
from config.training import GROUPS, STAGED_SHARE, TrainConfig, batch_problem, describe, shown
from trainer.errors import ConfigError

__all__ = ["MODE_NAMES", "STAGED_SHARE", "TrainConfig", "accumulation_steps", "build_parser",
           "from_values", "parse_args", "validate"]


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


def parse_args(argv: Optional[Sequence[str]] = None,
               prog: str = "python -m trainer") -> TrainConfig:
    """Parse and validate; on a bad value print one line and exit 2. What only the machine that
    trains can check (its files and directories) is `trainer.preflight`'s."""
    parser = build_parser(prog)
    ns = parser.parse_args(argv)
    try:
        return validate(from_values(**vars(ns)))
    except ConfigError as exc:
        parser.error(str(exc))
