"""`python -m trainer.export`: one committed checkpoint of a run, out of the per-rank shard
format, as a Hugging Face model directory (`hf`) or a PyTorch Distributed Checkpoint (`dcp`).

    python -m trainer.export --checkpoint_dir runs/r1/checkpoints --format hf --out model/
    python -m trainer.export --checkpoint_dir D --step 500 --format dcp --out_root D/../export

One process on CPU, at any world size of the run. Every shard is verified against the
manifest before anything is written; the export appears complete under its name or not at
all (it is written beside it in a staging directory of its own, then renamed; one export to
a target runs at a time: `landing`). Bad input, a damaged or an uncommitted checkpoint, a second
export to the same target, a write the storage refuses: one line naming the value or file,
exit code 2.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from config.contract import (EXPORT_DTYPE_DEFAULT, EXPORT_DTYPES, EXPORT_FILE_BYTES,
                             EXPORT_FORMATS, export_name)
from trainer.atomic import read_json, write_json_atomic
from trainer.durable.run_settings import SETTINGS_FILE
from trainer.durable.store import MANIFEST, CheckpointError, CheckpointStore
from trainer.errors import ConfigError
from trainer.export import model as models
from trainer.export import tokenizer as tokenizers
from trainer.export.landing import Staging, staged
from trainer.export.progress import PREFIX, Progress, size
from trainer.export.source import Checkpoint, ExportError, choose

PROG = "python -m trainer.export"
EXPORT_RECORD = "EXPORT.json"  # beside the exported files: which checkpoint they come from
ERROR_EXIT = 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint_dir", required=True, type=Path, help="the run's checkpoints")
    p.add_argument("--step", type=int, help="the checkpoint to export (default: the newest "
                   "committed one)")
    p.add_argument("--format", required=True, choices=EXPORT_FORMATS,
                   help="hf: safetensors, config and tokenizer; dcp: torch.distributed.checkpoint")
    p.add_argument("--dtype", choices=tuple(EXPORT_DTYPES), default=EXPORT_DTYPE_DEFAULT,
                   help=f"of the weights (default {EXPORT_DTYPE_DEFAULT}: as trained, exact)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", type=Path, help="the directory to create")
    where.add_argument("--out_root", type=Path, help="create <out_root>/<format>-step<N> "
                       "(<format>-<dtype>-step<N> for bf16)")
    p.add_argument("--model", help="preset, model directory or hub id (default: the run's, "
                   f"from {SETTINGS_FILE})")
    p.add_argument("--tokenizer", help="hf: a tokenizer directory, hub id, 'byte' or 'none' "
                   "(default: the run's, from its data directory)")
    p.add_argument("--max_file_gb", type=float, default=EXPORT_FILE_BYTES / 1e9,
                   help="hf: the most gigabytes of weights per safetensors file (default "
                   "%(default)g); the export holds one file's worth in memory")
    p.add_argument("--optimizer", action="store_true",
                   help="dcp: Adam's state too, under optimizer.state.<parameter>.<kind>")
    return p


def check_args(args: argparse.Namespace) -> None:
    if args.step is not None and args.step < 0:
        raise ExportError(f"--step {args.step} must be a step number, 0 or more")
    if not args.max_file_gb > 0:
        raise ExportError(f"--max_file_gb {args.max_file_gb:g} must be positive")
    if args.optimizer and args.format != "dcp":
        raise ExportError(f"--optimizer applies to --format dcp, not {args.format}")
    if args.tokenizer is not None and args.format != "hf":
        raise ExportError(f"--tokenizer applies to --format hf, not {args.format}")
    if not args.checkpoint_dir.is_dir():
        raise ExportError(f"--checkpoint_dir {str(args.checkpoint_dir)!r} is not a directory")


def model_ref(args: argparse.Namespace, settings: Optional[dict]) -> str:
    if args.model:
        return args.model
    if settings and settings.get("model"):
        return settings["model"]
    raise ExportError(f"{args.checkpoint_dir / SETTINGS_FILE} does not name the run's model: "
                      "pass --model")


def target(args: argparse.Namespace, step: int) -> Path:
    return args.out or args.out_root / export_name(args.format, step, args.dtype)


def run(args: argparse.Namespace, log: Callable[[str], None] = print) -> Path:
    """The export, from checks to the final rename; returns the directory written. The
    checkpoint to export is found first (without one, nothing else matters); the target's lock
    is held from before any shard is read until the export has landed (`landing`)."""
    t0 = time.monotonic()
    check_args(args)
    settings = read_json(args.checkpoint_dir / SETTINGS_FILE)
    store = CheckpointStore(args.checkpoint_dir)
    step, path = choose(store, args.step)
    ref = model_ref(args, settings)
    out = target(args, step)
    with staged(out) as stage:
        model = models.meta_model(ref)
        tokenizer_ref = _tokenizer_ref(args, settings, log)
        tokenizer = tokenizers.load(tokenizer_ref) if tokenizer_ref else None
        ckpt = _open(store, step, path, args.step is None, log)
        models.check_matches(ckpt, model, ref)
        nbytes = _write(args, ckpt, model, ref, tokenizer, stage, log)
        write_json_atomic(stage.path / EXPORT_RECORD, _record(args, ckpt, ref, tokenizer_ref))
    log(f"{PREFIX} step {step} of {args.checkpoint_dir} (world size {ckpt.world_size}) as "
        f"{args.format} {args.dtype}: {size(nbytes)} in {out} ({time.monotonic() - t0:.1f} s)")
    return out


def _tokenizer_ref(args: argparse.Namespace, settings: Optional[dict],
                   log: Callable[[str], None]) -> Optional[str]:
    """The tokenizer an `hf` export carries: --tokenizer, else the run's; None: none."""
    if args.format != "hf":
        return None
    ref = args.tokenizer or tokenizers.of_run(settings, log)
    return None if ref == tokenizers.NONE else ref


def _open(store: CheckpointStore, step: int, path: Path, newest: bool,
          log: Callable[[str], None]) -> Checkpoint:
    """The checkpoint's shards, verified; a damaged newest one names the older ones."""
    try:
        manifest = store.read_manifest(path)
        progress = Progress("verified", "shards", len(manifest["shards"]),
                            sum(s["bytes"] for s in manifest["shards"]), log)
        return Checkpoint.open(store, step, path, manifest, progress.add)
    except CheckpointError as exc:
        older = [str(s) for s, _ in store.committed() if s < step]
        if newest and older:
            raise CheckpointError(f"{exc}; older committed steps: {', '.join(older)} "
                                  "(pass --step)") from None
        raise


def _write(args: argparse.Namespace, ckpt: Checkpoint, model, ref: str, tokenizer,
           stage: Staging, log: Callable[[str], None]) -> int:
    """The export's files, into the staging directory, once it is known to have room."""
    from trainer.export import dcp, hf
    from trainer.export.model import torch_dtype
    from trainer.loop.model import hf_config

    dtype = torch_dtype(args.dtype)
    if args.format == "hf":
        stage.expect(hf.weight_bytes(ckpt, dtype))
        return hf.write(ckpt, hf_config(ref), stage.path, dtype, tokenizer,
                        int(args.max_file_gb * 1e9), log)
    stage.expect(dcp.tensor_bytes(ckpt, model, dtype, args.optimizer))
    return dcp.write(ckpt, model, stage.path, dtype, args.optimizer, log)


def _record(args: argparse.Namespace, ckpt: Checkpoint, ref: str,
            tokenizer: Optional[str]) -> dict:
    """What the export holds and where it comes from: the manifest's digest names the exact
    checkpoint (its shards' digests are in it)."""
    meta = ckpt.meta
    return {"format": args.format, "dtype": args.dtype, "model": ref, "tokenizer": tokenizer,
            "optimizer": args.optimizer, "step": ckpt.step, "checkpoint": str(ckpt.path),
            "world_size": ckpt.world_size,
            "manifest_sha256": hashlib.sha256((ckpt.path / MANIFEST).read_bytes()).hexdigest(),
            "loss": meta.get("loss"), "global_batch_size": meta.get("global_batch_size"),
            "exported_at": time.time()}


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        run(args)
    except (ConfigError, CheckpointError) as exc:  # ExportError is a ConfigError
        print(f"{PREFIX} error: {exc}", file=sys.stderr)
        return ERROR_EXIT
    except OSError as exc:
        print(f"{PREFIX} error: {exc}", file=sys.stderr)
        return 1
    return 0
