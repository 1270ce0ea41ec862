"""Export out of the shard format, from the checkpoints of a real 2-rank CPU run: Hugging Face
directories that transformers loads with the trainer's logits, DCP checkpoints that load into a
fresh model, the same files whatever the world size that wrote the shards, and damaged or
uncommitted checkpoints refused by name."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from config.presets import preset_parameters
from tests.jobs import MODEL, ROOT, env_for, ok, run_local
from trainer.accounting.events import EventLog
from trainer.durable.manager import CheckpointManager
from trainer.durable.run_settings import SETTINGS_FILE
from trainer.durable.store import MANIFEST, shard_name, step_dir_name
from trainer.export.cli import main
from trainer.loop.data import ByteTokenizer
from trainer.loop.model import build_model

# The module's tests share one run (`run_dir`): one worker of `make test` runs them all.
pytestmark = pytest.mark.xdist_group("export")

STEPS, INTERVAL = 4, 2
# A third of the model's fp32 weights: a Hugging Face export in several files.
SPLIT_GB = f"{preset_parameters(MODEL) * 4 / 3e9:g}"
BATCH = torch.randint(0, ByteTokenizer.vocab_size, (2, 48), generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def run_dir(cache_dir, tmp_path_factory) -> Path:
    """A real 2-rank run of the tests' model: checkpoints at steps 2 and 4."""
    run = tmp_path_factory.mktemp("world2")
    ok(run_local(cache_dir, "baseline", run, "--max_steps", str(STEPS),
                 "--checkpoint_interval", str(INTERVAL)))
    return run


def export(checkpoints: Path, *args: str) -> None:
    assert main(["--checkpoint_dir", str(checkpoints), *args]) == 0


def restored(checkpoints: Path, model: torch.nn.Module) -> tuple[torch.nn.Module, torch.optim.Optimizer, dict]:
    """`model` and an AdamW with the newest checkpoint loaded by the trainer's own restore path
    (at world size 1: every saved shard read, the rows of each copied in)."""
    optimizer = torch.optim.AdamW(model.parameters())
    manager = CheckpointManager(str(checkpoints), rank=0, world_size=1, device=torch.device("cpu"),
                                use_async=False, retain=2, timeout_s=60, events=EventLog(None, 0),
                                node_root=checkpoints.parent / "node")
    meta = manager.restore(model, optimizer, required=True)
    manager.close()
    return model, optimizer, meta


def logits(model: torch.nn.Module) -> torch.Tensor:
    """The trainer's model returns logits; transformers' returns an output that holds them."""
    with torch.no_grad():
        out = model.eval()(BATCH)
    return getattr(out, "logits", out)


def test_hf_export_loads_in_transformers_with_the_trainers_logits(run_dir, one_rank_group, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ckpts = run_dir / "checkpoints"
    trainer_model, _, meta = restored(ckpts, build_model(MODEL, seed=0))
    assert meta["step"] == STEPS
    expected = logits(trainer_model)

    export(ckpts, "--format", "hf", "--out", str(tmp_path / "fp32"), "--max_file_gb", SPLIT_GB)
    index = json.loads((tmp_path / "fp32" / "model.safetensors.index.json").read_text())
    files = sorted({f for f in index["weight_map"].values()})
    assert len(files) > 1 and files == [f"model-{i:05d}-of-{len(files):05d}.safetensors"
                                        for i in range(1, len(files) + 1)]
    assert set(index["weight_map"]) == {n for n, _ in trainer_model.named_parameters()}
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "fp32")
    assert loaded.dtype == torch.float32
    assert torch.equal(logits(loaded), expected)

    export(ckpts, "--format", "hf", "--dtype", "bf16", "--out_root", str(tmp_path))
    half = AutoModelForCausalLM.from_pretrained(tmp_path / f"hf-bf16-step{STEPS}")
    assert half.dtype == torch.bfloat16
    for name, p in trainer_model.named_parameters():  # each weight rounded once, to nearest
        assert torch.equal(half.get_parameter(name), p.detach().to(torch.bfloat16)), name
        p.data = p.data.to(torch.bfloat16)  # buffers (rotary frequencies) stay fp32, as in HF's
    assert torch.equal(logits(half), logits(trainer_model))

    # The run trained on bytes: its tokenizer comes along, with the very same ids.
    tok = AutoTokenizer.from_pretrained(tmp_path / "fp32")
    text = "Ünïcode, tabs\tand emoji 🙂"
    (ids,) = ByteTokenizer().encode_batch([text])
    assert tok(text, add_special_tokens=False)["input_ids"] == ids.tolist()
    assert tok.decode(ids.tolist()) == text
    assert (tok.eos_token_id, loaded.config.eos_token_id) == (ByteTokenizer.eos_token_id,) * 2
    record = json.loads((tmp_path / "fp32" / "EXPORT.json").read_text())
    assert (record["step"], record["world_size"], record["model"]) == (STEPS, 2, MODEL)


def test_dcp_export_loads_into_a_freshly_built_model(run_dir, one_rank_group, tmp_path):
    import torch.distributed.checkpoint as dcp

    ckpts = run_dir / "checkpoints"
    trainer_model, optimizer, _ = restored(ckpts, build_model(MODEL, seed=0))
    export(ckpts, "--format", "dcp", "--optimizer", "--out", str(tmp_path / "dcp"))

    fresh = build_model(MODEL, seed=99)  # other random weights, all overwritten
    state = fresh.state_dict()
    dcp.load(state, checkpoint_id=tmp_path / "dcp", no_dist=True)
    for name, p in trainer_model.named_parameters():
        assert torch.equal(fresh.get_parameter(name), p), name

    moments = {name: {"step": torch.zeros(()), "exp_avg": torch.zeros_like(p),
                      "exp_avg_sq": torch.zeros_like(p)} for name, p in fresh.named_parameters()}
    dcp.load({"optimizer": {"state": moments}}, checkpoint_id=tmp_path / "dcp", no_dist=True)
    for name, p in trainer_model.named_parameters():
        for kind, value in moments[name].items():
            assert torch.equal(value, optimizer.state[p][kind]), (name, kind)


def test_the_export_does_not_depend_on_the_world_size_that_wrote_the_shards(run_dir, one_rank_group,
                                                                            tmp_path):
    """The same state saved by one rank (the run's step-4 checkpoint resumed by a one-rank FSDP2
    model and checkpointed again) exports to the same bytes as the two ranks' checkpoint."""
    from trainer.loop.parallel import build_sharded_model

    ckpts = run_dir / "checkpoints"
    model = build_sharded_model(MODEL, 0, one_rank_group, param_bytes=1, initialize=False)
    model, optimizer, meta = restored(ckpts, model)
    one = tmp_path / "world1"
    one.mkdir()
    shutil.copy(ckpts / SETTINGS_FILE, one / SETTINGS_FILE)
    manager = CheckpointManager(str(one), rank=0, world_size=1, device=torch.device("cpu"),
                                use_async=False, retain=2, timeout_s=60, events=EventLog(None, 0),
                                node_root=tmp_path / "node")
    manager.save(STEPS, model, optimizer, {k: meta[k] for k in ("sampler", "rng", "loss")})
    manager.finish()
    manager.close()
    assert json.loads((one / step_dir_name(STEPS) / MANIFEST).read_text())["world_size"] == 1

    for source, name in ((ckpts, "two"), (one, "one")):
        export(source, "--format", "hf", "--out", str(tmp_path / name / "hf"), "--max_file_gb", SPLIT_GB)
        export(source, "--format", "dcp", "--optimizer", "--out", str(tmp_path / name / "dcp"))
    for fmt, pattern in (("hf", "*.safetensors"), ("hf", "*.json"), ("dcp", "*.distcp")):
        two = sorted((tmp_path / "two" / fmt).glob(pattern))
        assert two, pattern
        for path in two:
            if path.name == "EXPORT.json":  # names its source checkpoint
                continue
            assert path.read_bytes() == (tmp_path / "one" / fmt / path.name).read_bytes(), path.name


def test_a_damaged_or_uncommitted_checkpoint_is_refused_by_name(run_dir, tmp_path, capsys):
    ckpts = tmp_path / "checkpoints"
    shutil.copytree(run_dir / "checkpoints", ckpts)
    shard = ckpts / step_dir_name(STEPS) / shard_name(1)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, same size: only the digest can tell
    shard.write_bytes(bytes(data))
    out = tmp_path / "exports"
    proc = subprocess.run([sys.executable, "-m", "trainer.export", "--checkpoint_dir", str(ckpts),
                           "--format", "hf", "--out_root", str(out)],
                          cwd=ROOT, env=env_for(tmp_path), capture_output=True, text=True, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("export:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-2000:]
    assert f"{shard}: sha256" in errors[0] and f"older committed steps: {INTERVAL}" in errors[0]
    assert not out.exists() or not any(out.iterdir())  # nothing written, not even a partial

    export(ckpts, "--format", "hf", "--step", str(INTERVAL), "--out_root", str(out))
    assert (out / f"hf-step{INTERVAL}" / "config.json").is_file()

    def refused(*args: str) -> str:
        capsys.readouterr()
        assert main(["--checkpoint_dir", str(ckpts), *args, "--out", str(tmp_path / "never")]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        return line

    (ckpts / step_dir_name(INTERVAL) / MANIFEST).unlink()
    uncommitted = refused("--step", str(INTERVAL), "--format", "dcp")
    assert f"{ckpts / step_dir_name(INTERVAL) / MANIFEST} does not exist" in uncommitted
    assert uncommitted.endswith(f"committed steps: {STEPS}")
    assert f"no checkpoint {ckpts / step_dir_name(3)}" in refused("--step", "3", "--format", "dcp")
    missing = str(tmp_path / "no-such-tokenizer")  # refused before a shard is read
    assert f"tokenizer {missing!r} cannot be loaded" in refused("--format", "hf", "--tokenizer", missing)
    assert not (tmp_path / "never").exists()


def test_bad_arguments_are_one_line_before_anything_is_read(tmp_path, capsys):
    (tmp_path / "checkpoints").mkdir()
    cases = {("--format", "hf", "--optimizer"): "--optimizer applies to --format dcp",
             ("--format", "dcp", "--tokenizer", "byte"): "--tokenizer applies to --format hf",
             ("--format", "hf", "--step", "-1"): "--step -1",
             ("--format", "hf", "--max_file_gb", "0"): "--max_file_gb 0 must be positive",
             # no checkpoint at all: said first, before the missing model of the run
             ("--format", "hf"): f"no committed checkpoint in {tmp_path / 'checkpoints'}"}
    for args, message in cases.items():
        code = main(["--checkpoint_dir", str(tmp_path / "checkpoints"), *args,
                     "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and message in err[0], (args, err)
    assert not (tmp_path / "out").exists()


def test_tied_embeddings_load_tied_from_both_formats(one_rank_group, tmp_path):
    """llama-1b and llama-3b tie the output projection to the embedding: one parameter in the
    shards. A small tied model, checkpointed by one rank: Hugging Face ties it again from the
    embedding alone, and DCP holds it under both state-dict keys, so a fresh model loads both."""
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM, LlamaConfig

    from trainer.atomic import write_json_atomic
    from trainer.loop.model import llama_config

    fields = {**llama_config("tiny").to_hf(), "tie_word_embeddings": True}
    LlamaConfig(**fields).save_pretrained(tmp_path / "tied")
    model = build_model(str(tmp_path / "tied"), seed=5)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    optimizer = torch.optim.AdamW(model.parameters())
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    write_json_atomic(ckpts / SETTINGS_FILE, {"model": str(tmp_path / "tied"), "data_path": None})
    manager = CheckpointManager(str(ckpts), rank=0, world_size=1, device=torch.device("cpu"),
                                use_async=False, retain=2, timeout_s=60, events=EventLog(None, 0),
                                node_root=tmp_path / "node")
    manager.save(1, model, optimizer, {"loss": 0.0})
    manager.finish()
    manager.close()

    export(ckpts, "--format", "hf", "--out", str(tmp_path / "hf"))
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert "lm_head.weight" not in index["weight_map"]
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    assert torch.equal(logits(loaded), logits(model))

    export(ckpts, "--format", "dcp", "--out", str(tmp_path / "dcp"))
    fresh = build_model(str(tmp_path / "tied"), seed=6)
    state = fresh.state_dict()
    assert {"lm_head.weight", "model.embed_tokens.weight"} <= state.keys()
    dcp.load(state, checkpoint_id=tmp_path / "dcp", no_dist=True)
    for name, p in model.named_parameters():
        assert torch.equal(fresh.get_parameter(name), p), name
    assert torch.equal(fresh.lm_head.weight, model.lm_head.weight)
