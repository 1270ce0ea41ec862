"""What only the machine that trains can check, before anything is launched: the model
directory, the data and the checkpoint directory with what it already holds.

Each check fails the same way on every rank and every restart, so each runs before launch (the
local runner, the pods' launcher) and once more in the trainer, and a failure is one line and
exit code 2, never a retried job. `trainer.config` parses and validates the flags alone; these
checks read what the tiers and the loop write, so they sit above them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import NoReturn, Optional, Sequence

from config.presets import PRESETS, TOKENIZERS
from config.training import TrainConfig
from trainer.config import parse_args
from trainer.errors import ConfigError


def parse_and_check(argv: Sequence[str], prog: str, sample_data: bool = False) -> TrainConfig:
    """`config.parse_args`, then `check_environment`; a failure of either is one line naming
    `prog`, and exit 2. With `sample_data` (once per node: a launcher), the token file is
    sampled too."""
    cfg = parse_args(argv, prog)
    try:
        return check_environment(cfg, sample_data)
    except ConfigError as exc:
        _refuse(prog, str(exc))


def _refuse(prog: str, message: str) -> NoReturn:
    sys.stderr.write(f"{prog}: error: {message}\n")
    sys.exit(2)


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


def torch_home_with_a_space() -> Optional[str]:
    """The directory torch is imported from (found without importing it) where that path holds
    a space, None otherwise: torch.compile's C++ build step (inductor) passes torch's library
    directory to the linker unquoted, so every rank's first compiled forward fails there with a
    linker error (pytorch/pytorch#191010; seen with the pinned torch 2.13). A clone in
    `~/My Projects` with its `.venv` inside is such a place."""
    spec = importlib.util.find_spec("torch")
    home = os.path.dirname(spec.origin) if spec is not None and spec.origin else None
    return home if home is not None and any(c.isspace() for c in home) else None


def check_compile(cfg: TrainConfig) -> None:
    """--compile true only where torch.compile can link (`torch_home_with_a_space`)."""
    home = torch_home_with_a_space() if cfg.compile else None
    _need(home is None,
          f"--compile true: torch is installed under {home!r}, a path with a space, which "
          "torch.compile's C++ build step cannot link against (pytorch/pytorch#191010); "
          "install it under a path without one, or use --compile false")


def check_environment(cfg: TrainConfig, sample_data: bool = False) -> TrainConfig:
    """What only the machine that trains can check, before anything starts: the model
    directory, whether torch.compile can build here, the data and the checkpoint directory with
    what it already holds. With `sample_data` (once per node: the launcher), also read a sample
    of the token file."""
    check_model(cfg)
    check_compile(cfg)
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
