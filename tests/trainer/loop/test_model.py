"""Model presets and loading weights from a local Hugging Face directory, sharded with FSDP2."""

import os
import socket
import sys
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from config.presets import PRESETS, preset_parameters
from trainer.distributed import DistEnv
from trainer.loop.model import llama_config, parameter_count
from trainer.loop.parallel import build_sharded_model

pytestmark = pytest.mark.slow  # real FSDP builds of the presets


def test_preset_arithmetic_matches_the_built_model():
    for name in PRESETS:
        assert preset_parameters(name) == parameter_count(name)
    assert preset_parameters("llama3.1-8b") == 8_030_261_248  # Meta's Llama 3.1 8B



def test_weights_from_a_local_directory_are_loaded_exactly(tmp_path, one_rank_group):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(7)
    saved = LlamaForCausalLM(LlamaConfig(**llama_config("tiny").to_hf()))
    saved.save_pretrained(tmp_path / "model")
    model = build_sharded_model(str(tmp_path / "model"), seed=0, env=one_rank_group,
                                param_bytes=0)
    expected = dict(saved.named_parameters())
    for name, p in model.named_parameters():
        assert torch.equal(p.full_tensor(), expected[name]), name


def _build_everything(rank: int, world: int, port: int, hf_dirs: dict, out: str) -> None:
    """One rank of a real gloo job: every way a model starts, as full tensors (rank 0 saves)."""
    from trainer.loop.weights import FULL_INIT_MAX_BYTES, param_fingerprint

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))
    try:
        env = DistEnv(rank, world, 0, world, torch.device("cpu"))
        sources = {"preset, built whole": ("tiny", FULL_INIT_MAX_BYTES),
                   "preset, by row blocks": ("tiny", 0),  # the path of presets over 4 GiB
                   **{name: (path, 0) for name, path in hf_dirs.items()}}
        found = {}
        for label, (ref, max_bytes) in sources.items():
            model = build_sharded_model(ref, 11, env, param_bytes=1, full_init_max_bytes=max_bytes)
            found[label] = ({n: p.full_tensor().detach() for n, p in model.named_parameters()},
                            param_fingerprint(model), model.training)
        if rank == 0:
            torch.save(found, out)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # Leave without interpreter teardown, as the trainer does (trainer/__main__.py): gloo's C++
    # destructors can abort at exit, which would read as a failed rank.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _start(world: int, hf_dirs: dict, out) -> dict:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_build_everything, args=(world, port, hf_dirs, str(out)), nprocs=world)
    return torch.load(out)


def test_models_start_the_same_at_every_world_size(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    originals, hf_dirs = {}, {}
    for tied in (False, True):
        name = f"hugging face directory, tied={tied}"
        torch.manual_seed(3)
        config = LlamaConfig(**{**llama_config("tiny").to_hf(), "tie_word_embeddings": tied})
        originals[name] = LlamaForCausalLM(config)
        originals[name].save_pretrained(tmp_path / name.replace(" ", "_"))
        hf_dirs[name] = str(tmp_path / name.replace(" ", "_"))
    assert list((tmp_path / hf_dirs[name]).glob("*.safetensors"))
    one, two = _start(1, hf_dirs, tmp_path / "one.pt"), _start(2, hf_dirs, tmp_path / "two.pt")
    assert one.keys() == two.keys()
    for label in one:
        (params1, sha1, training1), (params2, sha2, training2) = one[label], two[label]
        assert sha1 == sha2, label
        assert training1 and training2, label
        for n in params1:
            assert torch.equal(params1[n], params2[n]), (label, n)
    for name, original in originals.items():
        params = two[name][0]
        expected = dict(original.named_parameters())
        assert params.keys() == expected.keys()
        for n, p in params.items():
            assert torch.equal(p, expected[n]), (name, n)
    blocks = one["preset, by row blocks"][0]
    assert torch.equal(blocks["model.norm.weight"], torch.ones(256))
    weight = blocks["model.layers.0.mlp.gate_proj.weight"]
    assert abs(float(weight.std()) - 0.02) < 0.001
    assert not torch.equal(weight, one["preset, built whole"][0]["model.layers.0.mlp.gate_proj.weight"])


class _DeviceReads(TorchDispatchMode):
    """Records every tensor read back to the host (`.item()`, `bool(tensor)`)."""

    READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default)

    def __init__(self):
        super().__init__()
        self.reads: list[torch.Tensor] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.READS:
            self.reads.append(args[0])
        return func(*args, **(kwargs or {}))


def test_a_training_step_reads_nothing_back_from_the_device(one_rank_group):
    """On a GPU any such read makes the host wait for all queued work, a running snapshot copy
    included. Adam's step counts live on the host by design and are the only reads allowed."""
    from trainer.loop.model import optimizer_groups
    from trainer.loop.train import train_step

    model = build_sharded_model("tiny", seed=0, env=one_rank_group, param_bytes=0)
    optimizer = torch.optim.AdamW(optimizer_groups(model, 0.1), lr=1e-3)
    batch = [torch.randint(0, 264, (2, 33))]
    for _ in range(2):  # the second step has optimizer state
        with _DeviceReads() as mode:
            train_step(model, optimizer, batch, 1e-3, 1.0, world_size=1, tokens_per_step=64)
    counts = {id(s["step"]) for s in optimizer.state.values()}
    assert [t for t in mode.reads if id(t) not in counts] == []
