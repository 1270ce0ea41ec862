"""The settings a checkpoint directory's run trains with, recorded beside its checkpoints, so a
restart that changes them is caught before launch.

A changed model, sequence length or seed cannot continue the run: the shards, the data windows
or the data order would not match. It is refused with one line and exit code 2. Any other
change (a new learning rate, more steps) is allowed, and each is logged once, from the old
value to the new.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from trainer.atomic import read_json, write_json_atomic
from trainer.errors import ConfigError

SETTINGS_FILE = "SETTINGS.json"
# What the checkpoints and the sampler state depend on.
IDENTITY = ("model", "seq_len", "seed")
# Where a run writes and how it recovers: not a change of the training.
NOT_COMPARED = {"checkpoint_dir", "results_path", "node_dir", "data_path", "resume",
                "allow_fresh_start", "device", "log_interval", "trace_samples", "profile_from",
                "profile_steps", "tensorboard", "wandb_project"}


def check_unchanged(cfg, log: Callable[[str], None]) -> None:
    """Against the recorded settings of the run in `cfg.checkpoint_dir`, if it holds one."""
    recorded = read_json(Path(cfg.checkpoint_dir) / SETTINGS_FILE) if cfg.checkpoint_dir else None
    if not recorded:
        return
    now = cfg.to_dict()
    for name in IDENTITY:
        if name in recorded and recorded[name] != now[name]:
            raise ConfigError(
                f"--{name} {now[name]!r} differs from {recorded[name]!r}, which the run in "
                f"{cfg.checkpoint_dir} trains with; its checkpoints cannot continue with another "
                f"--{name}: use a new --checkpoint_dir")
    for name, value in now.items():
        if name in IDENTITY or name in NOT_COMPARED or name not in recorded:
            continue
        if recorded[name] != value:
            log(f"--{name} changes from {_spelled(recorded[name])} to {_spelled(value)} for the "
                f"run in {cfg.checkpoint_dir}")


def record(cfg) -> None:
    """Rank 0, once the directory is leased: these settings are now the run's."""
    write_json_atomic(Path(cfg.checkpoint_dir) / SETTINGS_FILE, cfg.to_dict())


def _spelled(value) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)
