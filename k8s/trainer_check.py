"""The trainer's own validator, run at synthesis on the exact flags the pods will get.

A profile the trainer would reject (timeouts out of order, unknown fault types, weights that do
not match the types...) fails here with exit 2, not minutes later in a pod. trainer.config
imports no torch, so this runs on an install without the trainer extra.
"""

from __future__ import annotations

from typing import NoReturn

from k8s import commands
from k8s.deployment import Deployment
from k8s.errors import SynthError


def check_trainer_args(dep: Deployment) -> None:
    """Parse and validate the trainer flags of `dep`; raise SynthError naming the problem."""
    from trainer.config import TrainConfig, build_parser, validate
    from trainer.errors import ConfigError

    parser = build_parser()
    where = f"profile {dep.profile.name!r} (mode {dep.mode})"

    def refuse(message: str) -> NoReturn:
        raise SynthError(f"{where}: the trainer rejects its flags: {message}")

    parser.error = refuse  # type: ignore[method-assign]  # argparse reports through error()
    namespace = parser.parse_args([*commands.trainer_argv(dep), "--mode", dep.mode])
    try:
        validate(TrainConfig(**vars(namespace)))
    except ConfigError as exc:
        refuse(str(exc))
