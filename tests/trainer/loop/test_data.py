"""The token file, its windows, and a sampler whose position is all the state it needs."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tracemalloc

from trainer.loop.data import (FeistelPermutation, GlobalSampler, TokenDataset, main,
                               prepare)


def test_prepare_local_corpus_and_read_windows(tmp_path):
    meta = prepare("local", 200, "byte", tmp_path / "d")
    assert meta.num_tokens > 10_000 and meta.vocab_size == 258 and meta.documents == 200
    assert json.loads((tmp_path / "d" / "meta.json").read_text())["num_tokens"] == meta.num_tokens
    ds = TokenDataset(tmp_path / "d", seq_len=32)
    tokens = np.fromfile(tmp_path / "d" / "tokens.bin", dtype=np.uint16)
    assert len(ds) == (len(tokens) - 1) // 32
    assert ds.sample(3).tolist() == tokens[96:129].tolist()
    assert not list(tmp_path.glob("d.tmp*"))


def test_prepare_from_a_text_file_and_cli_errors(tmp_path, capsys):
    src = tmp_path / "corpus.txt"
    src.write_text("first doc\n\nsecond doc\n\nthird")
    assert main(["prepare", "--source", str(src), "--output", str(tmp_path / "o"), "--num_samples", "2"]) == 0
    assert json.loads((tmp_path / "o" / "meta.json").read_text())["documents"] == 2
    assert main(["prepare", "--source", str(tmp_path / "missing.txt"), "--output", str(tmp_path / "x")]) == 2
    assert "neither 'local', 'c4' nor an existing file" in capsys.readouterr().err


def _run(n, seed, world, batch, steps, state=None):
    """Each rank owns a sampler, as in training; returns the batches and the saved position."""
    samplers = [GlobalSampler(n, seed) for _ in range(world)]
    for s in samplers:
        if state:
            s.load_state_dict(state)
    batches = [[s.next_batch(r, world, batch) for r, s in enumerate(samplers)] for _ in range(steps)]
    assert len({s.cursor for s in samplers}) == 1
    return batches, samplers[0].state_dict()


@settings(max_examples=100, deadline=None)
@given(n=st.integers(5, 300), world=st.integers(1, 8), batch=st.integers(1, 4),
       steps=st.integers(1, 40), cut=st.integers(0, 40), seed=st.integers(0, 1000))
def test_resumed_sampler_continues_exactly(n, world, batch, steps, cut, seed):
    cut = min(cut, steps)
    whole, _ = _run(n, seed, world, batch, steps)
    first, state = _run(n, seed, world, batch, cut)
    rest, _ = _run(n, seed, world, batch, steps - cut, state)
    assert first + rest == whole  # nothing replayed, nothing skipped
    flat = [i for step in whole for ranks in step for i in ranks]
    for k in range(0, len(flat) - n + 1, n):  # every epoch is a permutation of all samples
        assert sorted(flat[k:k + n]) == list(range(n))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 3000), key=st.integers(0, 2**64 - 1))
def test_feistel_permutation_is_a_bijection(n, key):
    perm = FeistelPermutation(n, key)
    assert sorted(perm(i) for i in range(n)) == list(range(n))


def test_epochs_and_seeds_give_different_orders():
    n = 1000
    orders = {tuple(GlobalSampler(n, seed)._permutation(epoch)(i) for i in range(n))
              for seed in (1, 2) for epoch in (0, 1)}
    assert len(orders) == 4
    assert next(iter(orders)) != tuple(range(n))


def _sampler_peak_bytes(n: int) -> int:
    """Peak bytes allocated while a sampler starts at a late cursor and draws a few batches."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        s = GlobalSampler(n, seed=3, cursor=n // 2 + 17)
        for _ in range(4):
            s.next_batch(1, 2, 8)
        s.load_state_dict({**s.state_dict(), "cursor": n + 5})  # a restart in the next epoch
        s.next_batch(0, 2, 8)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_sampler_memory_does_not_grow_with_the_dataset():
    small, huge = _sampler_peak_bytes(1_000), _sampler_peak_bytes(1_000_000_000)
    assert huge < 2 * small + 4096, (small, huge)
    assert huge < 64 * 1024  # nothing of dataset size: 1e9 int64 indices would be 8 GB


def test_a_checkpoint_of_another_sample_order_is_refused():
    s = GlobalSampler(50, 5)
    with pytest.raises(ValueError, match="sample order None is not 'feistel-v1'"):
        s.load_state_dict({"cursor": 10, "seed": 5, "num_samples": 50})
