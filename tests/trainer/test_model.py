"""Model presets and loading weights from a local Hugging Face directory, sharded with FSDP2."""

import socket

import pytest
import torch
import torch.distributed as dist

from trainer.model import PRESETS, llama_config, parameter_count, preset_parameters
from trainer.parallel import DistEnv, build_sharded_model


def test_preset_arithmetic_matches_transformers():
    for name in PRESETS:
        assert preset_parameters(name) == parameter_count(name)
    assert preset_parameters("llama3.1-8b") == 8_030_261_248  # Meta's Llama 3.1 8B


@pytest.fixture
def one_rank_group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield DistEnv(0, 1, 0, 1, torch.device("cpu"))
    dist.destroy_process_group()


def test_weights_from_a_local_directory_are_loaded_exactly(tmp_path, one_rank_group):
    from transformers import LlamaForCausalLM

    torch.manual_seed(7)
    saved = LlamaForCausalLM(llama_config("tiny"))
    saved.save_pretrained(tmp_path / "model")
    model = build_sharded_model(str(tmp_path / "model"), seed=0, env=one_rank_group,
                                param_bytes=0)
    expected = dict(saved.named_parameters())
    for name, p in model.named_parameters():
        assert torch.equal(p.full_tensor(), expected[name]), name
