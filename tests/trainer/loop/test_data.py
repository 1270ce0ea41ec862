"""The token file, its windows, and a sampler whose position is all the state it needs."""

import io
import json
import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.jobs import ROOT, env_for

from trainer.loop.data import (DataMeta, FeistelPermutation, GlobalSampler, Progress, TokenDataset,
                               available_cpus, main, prepare)
from trainer.loop.sources import HubDataset, parse_hub


def test_prepare_local_corpus_and_read_windows(tmp_path):
    meta = prepare("local", 200, "byte", tmp_path / "d")
    assert meta.num_tokens > 10_000 and meta.vocab_size == 258 and meta.documents == 200
    assert json.loads((tmp_path / "d" / "meta.json").read_text())["num_tokens"] == meta.num_tokens
    ds = TokenDataset(tmp_path / "d", seq_len=32)
    tokens = np.fromfile(tmp_path / "d" / "tokens.bin", dtype=np.uint16)
    assert len(ds) == (len(tokens) - 1) // 32
    assert ds.sample(3).tolist() == tokens[96:129].tolist()
    assert not list(tmp_path.glob("d.tmp*"))


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


# -- preparation: sources through `datasets`, tokenized in batches over processes ---------------
def _reference_tokens(tok_dir, texts) -> bytes:
    """What one process writes, computed without the preparation code: each document's ids
    from the tokenizer as transformers loads it, then EOS, as uint16."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    ids = [i for t in texts for i in tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]]
    return np.asarray(ids, dtype=np.uint16).tobytes()


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _write_parquet(path, columns):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path, row_group_size=7)  # several row groups


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A word tokenizer, and its texts as a .jsonl file, a .parquet file and a directory of
    both (with a file of another kind, skipped), each with fields besides the text."""
    root = tmp_path_factory.mktemp("corpus")
    texts = _word_tokenizer(root / "tok", 300)
    first, second = texts[:130], texts[130:]
    tree = root / "tree"
    (tree / "b").mkdir(parents=True)
    _write_jsonl(tree / "a.jsonl", [{"id": i, "text": t} for i, t in enumerate(first)])
    _write_parquet(tree / "b" / "c.parquet", {"text": second, "url": [f"u{i}" for i in range(len(second))]})
    (tree / "README.md").write_text("not data")
    return {"root": root, "tok": root / "tok", "texts": texts, "first": first, "second": second,
            "jsonl": tree / "a.jsonl", "parquet": tree / "b" / "c.parquet", "dir": tree}


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "dir"])
def test_files_and_a_directory_give_the_reference_tokens(corpus, tmp_path, kind):
    texts = {"jsonl": corpus["first"], "parquet": corpus["second"], "dir": corpus["texts"]}[kind]
    meta = prepare(str(corpus[kind]), 10_000, str(corpus["tok"]), tmp_path / "d")
    assert (tmp_path / "d" / "tokens.bin").read_bytes() == _reference_tokens(corpus["tok"], texts)
    assert (meta.documents, meta.source, meta.vocab_size) == (len(texts), str(corpus[kind]), 302)
    assert meta == DataMeta.read(tmp_path / "d")


def test_the_first_n_documents_are_taken_across_files(corpus, tmp_path):
    prepare(str(corpus["dir"]), 150, str(corpus["tok"]), tmp_path / "d", batch_size=16)
    assert (tmp_path / "d" / "tokens.bin").read_bytes() == \
        _reference_tokens(corpus["tok"], corpus["texts"][:150])


@pytest.mark.slow  # spawns tokenizing processes
def test_two_processes_write_the_same_bytes_as_one(corpus, tmp_path):
    for name, procs in (("one", "1"), ("two", "2")):
        assert main(["prepare", "--source", str(corpus["dir"]), "--tokenizer", str(corpus["tok"]),
                     "--num_proc", procs, "--output", str(tmp_path / name)]) == 0
    # many small batches, so both processes tokenize and their results interleave
    prepare(str(corpus["dir"]), 10_000, str(corpus["tok"]), tmp_path / "small", num_proc=2,
            batch_size=9)
    for name in ("two", "small"):
        for part in ("tokens.bin", "meta.json", "tokenizer/tokenizer.json"):
            assert (tmp_path / name / part).read_bytes() == (tmp_path / "one" / part).read_bytes()
    assert not list(tmp_path.glob("*.tmp*"))


def test_text_field_picks_the_field(corpus, tmp_path):
    texts = corpus["texts"][:40]
    source = tmp_path / "docs.jsonl"
    _write_jsonl(source, [{"text": "w1 w2", "body": t} for t in texts])
    assert main(["prepare", "--source", str(source), "--text_field", "body", "--tokenizer",
                 str(corpus["tok"]), "--num_proc", "1", "--output", str(tmp_path / "d")]) == 0
    assert (tmp_path / "d" / "tokens.bin").read_bytes() == _reference_tokens(corpus["tok"], texts)


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_a_missing_text_field_is_one_line_naming_the_fields(corpus, tmp_path, capsys, kind):
    fields = {"jsonl": "id, text", "parquet": "text, url"}[kind]
    assert main(["prepare", "--source", str(corpus[kind]), "--text_field", "body",
                 "--output", str(tmp_path / "d")]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"error: --text_field 'body' is not a field of {corpus[kind]}; its fields: {fields}"]
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_the_local_corpus_has_one_field(tmp_path, capsys):
    assert main(["prepare", "--source", "local", "--text_field", "body",
                 "--output", str(tmp_path / "d")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: --text_field 'body' is not a field of the local corpus; its fields: text"]


def test_a_missing_field_in_a_later_file_leaves_nothing_behind(corpus, tmp_path, capsys):
    source = tmp_path / "src"
    source.mkdir()
    _write_jsonl(source / "1.jsonl", [{"text": t} for t in corpus["texts"][:5]])
    _write_jsonl(source / "2.jsonl", [{"body": "w1"}])
    assert main(["prepare", "--source", str(source), "--output", str(tmp_path / "d")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: --text_field 'text' is not a field of {source / '2.jsonl'}; its fields: body"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no data, no temporary


def test_a_document_that_is_not_text_is_refused_by_its_index(tmp_path, capsys):
    source = tmp_path / "docs.jsonl"
    _write_jsonl(source, [{"text": "a"}, {"text": "b"}, {"text": None}])
    assert main(["prepare", "--source", str(source), "--output", str(tmp_path / "d")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: --text_field 'text' of document 2 in {source} is NoneType, not text"]


def _file(directory, name, text=None):
    """`directory / name`: a directory if the name ends with '/', else written with `text`
    if any."""
    path = directory / name
    if name.endswith("/"):
        path.mkdir()
    elif text is not None:
        path.write_text(text)
    return path


@pytest.mark.parametrize("name, text, fragment", [
    ("missing.jsonl", None, "is not an existing file or directory; allowed: local, c4, hf:"),
    ("notes.txt", "x", "is not a .jsonl/.json/"),
    ("empty/", None, "holds no .jsonl/.json/"),
    ("empty.jsonl", "", "holds no documents"),
    ("blank.jsonl", "\n\n", "holds no documents"),
])
def test_a_source_that_is_not_one_is_refused(tmp_path, capsys, name, text, fragment):
    source = _file(tmp_path, name, text)
    assert main(["prepare", "--source", str(source), "--output", str(tmp_path / "out")]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and fragment in lines[0] and str(source) in lines[0], lines
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("source, hub", [
    ("c4", HubDataset("allenai/c4", "en", "train")),
    ("hf:allenai/c4:en:validation", HubDataset("allenai/c4", "en", "validation")),
    ("hf:roneneldan/TinyStories", HubDataset("roneneldan/TinyStories", None, "train")),
    ("hf:HuggingFaceFW/fineweb-edu:sample-10BT", HubDataset("HuggingFaceFW/fineweb-edu", "sample-10BT", "train")),
    ("hf:wikitext::test", HubDataset("wikitext", None, "test")),
])
def test_hub_sources_are_spelled_repo_config_split(source, hub):
    assert parse_hub(source) == hub


@pytest.mark.parametrize("source", ["hf:", "hf:a/b/c", "hf:a:b:c:d", "hf:/c4", "hf:owner/"])
def test_a_bad_hub_spelling_is_refused(source, tmp_path, capsys):
    assert main(["prepare", "--source", source, "--output", str(tmp_path / "out")]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and f"--source {source!r} is not a hub dataset" in lines[0]


@pytest.mark.slow  # a process of its own, for the hub library's offline switch
def test_a_hub_source_goes_to_the_hub_through_datasets(tmp_path):
    """Offline, the hub is not reached, and the library says so: one line, exit 1 (worth a
    retry, unlike bad input). Nothing is downloaded."""
    proc = subprocess.run([sys.executable, "-m", "trainer.loop.data", "prepare", "--source", "c4",
                           "--output", str(tmp_path / "out")],
                          cwd=ROOT, env={**env_for(tmp_path / "cache"), "HF_HUB_OFFLINE": "1",
                                         "HF_HOME": str(tmp_path / "hf")},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "'allenai/c4'" in lines[0], lines
    assert not (tmp_path / "out").exists()


def test_progress_lines_count_documents_and_tokens(tmp_path, capsys):
    assert main(["prepare", "--source", "local", "--num_samples", "2500", "--num_proc", "1",
                 "--progress_interval", "0", "--output", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out.splitlines()
    progress = [l for l in out if l.startswith("prepare: ")]
    assert [l.split(" documents")[0] for l in progress] == [
        "prepare: 1,000 of 2,500", "prepare: 2,000 of 2,500", "prepare: 2,500 of 2,500"]
    assert all(" tokens; " in l and " documents/s, " in l and l.endswith(" s") for l in progress)
    meta = DataMeta.read(tmp_path / "d")
    assert out[-1].startswith(f"{tmp_path / 'd'}: 2500 documents, {meta.num_tokens} tokens in ")


def test_progress_is_a_line_every_interval():
    clock, out = [0.0], io.StringIO()
    progress = Progress(100, interval=5, out=out, clock=lambda: clock[0])
    for t, docs in ((1, 10), (4.9, 20), (5, 30), (6, 40), (10.5, 50)):
        clock[0] = t
        progress.update(docs, docs * 1000)
    assert [l.split(" documents")[0] for l in out.getvalue().splitlines()] == [
        "prepare: 30 of 100", "prepare: 50 of 100"]
    assert "(50%), 50k tokens; 4.76 documents/s, 4.76k tokens/s; 10 s" in out.getvalue()


@pytest.mark.parametrize("cpu_max, cpus", [("250000 100000\n", 2), ("50000 100000\n", 1),
                                            ("max 100000\n", None), (None, None), ("junk", None)])
def test_available_cpus_follow_a_cgroup_quota(tmp_path, cpu_max, cpus):
    path = tmp_path / "cpu.max"
    if cpu_max is not None:
        path.write_text(cpu_max)
    affinity = len(os.sched_getaffinity(0))
    assert available_cpus(path) == (affinity if cpus is None else min(cpus, affinity))


def _prepare_peak_bytes(source, output) -> int:
    """Peak bytes allocated (Python and numpy) while `source` is prepared."""
    tracemalloc.start()
    try:
        prepare(str(source), 10**9, "byte", output, batch_size=500)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_preparation_memory_does_not_grow_with_the_dataset(tmp_path):
    """Ten times the documents, in ten times the files: the same peak. What a source holds at
    once is one batch and one file's read buffer, never the whole dataset or its tokens."""
    small, large = tmp_path / "small", tmp_path / "large"
    for directory, files in ((small, 2), (large, 20)):
        directory.mkdir()
        for k in range(files):
            _write_jsonl(directory / f"{k:03d}.jsonl",
                         [{"text": f"document {k} {i} " * 20} for i in range(4000)])
    prepare(str(small), 10**9, "byte", tmp_path / "warm", batch_size=500)  # imports, caches
    small_peak = _prepare_peak_bytes(small, tmp_path / "s")
    large_peak = _prepare_peak_bytes(large, tmp_path / "l")
    meta = DataMeta.read(tmp_path / "l")
    assert meta.documents == 80_000
    assert large_peak < 1.5 * small_peak, (small_peak, large_peak)
    assert large_peak < meta.num_tokens, (large_peak, meta.num_tokens)  # under half the token file
