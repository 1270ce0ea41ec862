"""The token file, its windows, and a sampler whose position is all the state it needs."""

import json
import subprocess
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.jobs import ROOT

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


# -- the data checked before launch: one line naming the file, exit 2 --------------------------
def _word_tokenizer(path, words: int):
    """A small word-level tokenizer built here (nothing downloaded), saved as a model directory
    saves one: what `--tokenizer DIR` loads."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    texts = [" ".join(f"w{(i * 7 + j) % words}" for j in range(50)) for i in range(words)]
    tok.train_from_iterator(texts, trainers.WordLevelTrainer(vocab_size=words + 2,
                                                             special_tokens=["[UNK]", "</s>"]))
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="</s>") \
        .save_pretrained(path)
    return texts


def _local_run(cache_dir, tmp_path, data):
    from tests.jobs import env_for, local_cmd

    return subprocess.run(local_cmd("baseline", tmp_path / "run", "--max_steps", "2",
                                    "--data_path", str(data)),
                          cwd=ROOT, env=env_for(cache_dir), capture_output=True, text=True,
                          timeout=120)


def test_a_tokenizer_that_does_not_fit_the_model_is_refused_before_launch(tmp_path, cache_dir):
    tok_dir = tmp_path / "tok"
    texts = _word_tokenizer(tok_dir, 500)
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    assert main(["prepare", "--source", str(source), "--num_samples", "400", "--tokenizer",
                 str(tok_dir), "--output", str(tmp_path / "data")]) == 0
    meta = json.loads((tmp_path / "data" / "meta.json").read_text())
    assert meta["vocab_size"] == 502 and 264 <= meta["max_token_id"] < 502
    proc = _local_run(cache_dir, tmp_path, tmp_path / "data")
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "has 502 ids, but the model's vocabulary has 264" in lines[0]
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing launched


@pytest.mark.parametrize("damage, fragment", [
    ("truncate", "tokens.bin holds"),
    ("meta-not-json", "meta.json is not a data description"),
    ("ids-beyond-vocab", "beyond the vocabulary of 258"),
])
def test_damaged_data_is_refused_before_launch(tmp_path, cache_dir, damage, fragment):
    data = tmp_path / "data"
    main(["prepare", "--source", "local", "--num_samples", "50", "--output", str(data)])
    tokens = data / "tokens.bin"
    if damage == "truncate":
        tokens.write_bytes(tokens.read_bytes()[:-6])
    elif damage == "meta-not-json":
        (data / "meta.json").write_text("{not json")
    else:  # ids past the byte vocabulary, meta.json untouched: only the sample shows them
        ids = np.fromfile(tokens, dtype=np.uint16)
        ids[:64] = 4000
        ids.tofile(tokens)
    proc = _local_run(cache_dir, tmp_path, data)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and fragment in lines[0] and str(data) in lines[0]


def test_prepared_data_keeps_its_tokenizer_beside_the_tokens(tmp_path):
    from transformers import AutoTokenizer

    texts = _word_tokenizer(tmp_path / "tok", 300)
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:20]))
    main(["prepare", "--source", str(source), "--num_samples", "20", "--tokenizer",
          str(tmp_path / "tok"), "--output", str(tmp_path / "data")])
    saved = AutoTokenizer.from_pretrained(tmp_path / "data" / "tokenizer", local_files_only=True)
    assert saved("w1 w2", add_special_tokens=False)["input_ids"] == \
        AutoTokenizer.from_pretrained(tmp_path / "tok")("w1 w2", add_special_tokens=False)["input_ids"]
