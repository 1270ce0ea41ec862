"""Tokenized data as one flat memory-mapped token file, and a sampler whose position is state.

Layout of a data directory: `tokens.bin` (little-endian uint16 or uint32 ids, documents
separated by the EOS id) and `meta.json`. Sample i is the window of seq_len + 1 tokens starting at
i * seq_len. The sampler walks a seeded permutation per epoch with one global cursor (samples
consumed by all ranks together), which is saved in every checkpoint: after a restart, at any
world size, training continues with exactly the next unseen samples. The permutation is
computed index by index (a Feistel bijection), so nothing of dataset size is ever built.

Command: `python -m trainer.loop.data prepare --source local|c4|FILE --num_samples N
--tokenizer byte|MODEL_DIR|HUB_ID --output DIR`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional

import numpy as np

from trainer.errors import ConfigError

BYTE_EOS = 256
BYTE_VOCAB = 258  # 256 bytes + EOS + BOS
C4_REPO = "allenai/c4"
C4_FILE = "en/c4-train.{:05d}-of-01024.json.gz"


TOKEN_DTYPES = ("uint16", "uint32")
SAMPLE_BYTES = 1 << 16  # per probe of the token file before launch: four probes, 256 KiB


@dataclass(frozen=True)
class DataMeta:
    """meta.json: what tokens.bin holds and which tokenizer made it."""

    num_tokens: int
    dtype: str
    vocab_size: int
    eos_id: int
    tokenizer: str
    source: str
    documents: int
    max_token_id: int = -1  # the largest id in tokens.bin (-1: not recorded)

    @staticmethod
    def read(path: Path) -> "DataMeta":
        return DataMeta(**json.loads((path / "meta.json").read_text(encoding="utf-8")))


class DataError(ConfigError):
    """A data directory that would fail inside the ranks: refused before launch, by name."""


def check_data(path: Path, model_vocab: Optional[int], model_tokenizer: Optional[str],
               sample: bool = False, flag: str = "--data_path",
               warn=lambda msg: print(msg, file=sys.stderr)) -> DataMeta:
    """Refuse, with one line naming the file, data that the ranks would fail on late and
    vaguely: a missing or unreadable meta.json, a token file whose size disagrees with it, an
    unknown dtype, ids beyond the model's vocabulary. With `sample`, also read four small
    pieces of tokens.bin (start, end and two between) and check their ids: a cheap bound that
    catches a token file from another preparation. A tokenizer other than the model's is
    allowed (the tiny local runs train presets on bytes), with a warning."""
    where = f"{flag} {str(path)!r}"
    if not path.is_dir():
        raise DataError(f"{where} is not a directory; build one with "
                        "`python -m trainer.loop.data prepare`")
    for name in ("meta.json", "tokens.bin"):
        if not (path / name).is_file():
            raise DataError(f"{where} has no {name}; build it with "
                            "`python -m trainer.loop.data prepare`")
    try:
        meta = DataMeta.read(path)
    except (ValueError, TypeError) as exc:  # JSON, UTF-8 and missing or unknown keys
        raise DataError(f"{where}: meta.json is not a data description ({exc}); prepare the "
                        "data again") from None
    if meta.dtype not in TOKEN_DTYPES:
        raise DataError(f"{where}: meta.json names dtype {meta.dtype!r}; allowed: "
                        f"{', '.join(TOKEN_DTYPES)}")
    itemsize = np.dtype(meta.dtype).itemsize
    size = (path / "tokens.bin").stat().st_size
    if size != meta.num_tokens * itemsize:
        raise DataError(f"{where}: tokens.bin holds {size} bytes, but meta.json says "
                        f"{meta.num_tokens} tokens of {meta.dtype} ({meta.num_tokens * itemsize} "
                        "bytes): a truncated file, or one from another preparation")
    if model_vocab is not None and meta.vocab_size > model_vocab:
        raise DataError(f"{where}: tokenizer {meta.tokenizer!r} has {meta.vocab_size} ids, but "
                        f"the model's vocabulary has {model_vocab}; prepare the data with the "
                        "model's tokenizer")
    bound = min(v for v in (model_vocab, meta.vocab_size) if v is not None)
    if meta.max_token_id >= bound:
        raise DataError(f"{where}: meta.json records token id {meta.max_token_id}, beyond the "
                        f"vocabulary of {bound}")
    if sample:
        top = _sampled_max(path / "tokens.bin", meta.dtype, meta.num_tokens)
        if top >= bound:
            raise DataError(f"{where}: tokens.bin holds token id {top}, beyond the vocabulary "
                            f"of {bound}: the file does not match meta.json")
        if model_tokenizer is not None and meta.tokenizer != model_tokenizer:
            warn(f"warning: {where} was tokenized with {meta.tokenizer!r}, but the model is "
                 f"trained with {model_tokenizer!r}")
    return meta


def _sampled_max(tokens: Path, dtype: str, num_tokens: int) -> int:
    """The largest id in four pieces of the token file."""
    per = SAMPLE_BYTES // np.dtype(dtype).itemsize
    ids = np.memmap(tokens, dtype=dtype, mode="r", shape=(num_tokens,))
    starts = {0, max(0, num_tokens - per), num_tokens // 3, 2 * num_tokens // 3}
    return max((int(ids[s:s + per].max()) for s in starts if s < num_tokens), default=-1)


class ByteTokenizer:
    """UTF-8 bytes as ids: no files, no network; what the tiny local model uses."""

    vocab_size = BYTE_VOCAB
    eos_token_id = BYTE_EOS
    name = "byte"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def save(self, path: Path) -> None:
        """Bytes need no files."""


class HFTokenizer:
    """A model directory's tokenizer, or a hub id's, which downloads (with the token in
    HF_TOKEN or the file HF_TOKEN_PATH names, for gated models such as Meta's Llama)."""

    def __init__(self, ref: str):
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(ref, local_files_only=os.path.isdir(ref))
        self.vocab_size = len(self._tok)
        self.eos_token_id = self._tok.eos_token_id
        self.name = ref

    def encode(self, text: str) -> list[int]:
        return self._tok(text, add_special_tokens=False)["input_ids"]

    def save(self, path: Path) -> None:
        self._tok.save_pretrained(path)


def get_tokenizer(ref: str):
    return ByteTokenizer() if ref == "byte" else HFTokenizer(ref)


def _c4_documents(limit: int) -> Iterator[str]:
    """The first `limit` documents of C4 (en), shard by shard, through the Hugging Face hub."""
    from huggingface_hub import hf_hub_download

    seen, shard = 0, 0
    while seen < limit:
        path = hf_hub_download(C4_REPO, C4_FILE.format(shard), repo_type="dataset")
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                yield json.loads(line)["text"]
                seen += 1
                if seen >= limit:
                    return
        shard += 1


def _file_documents(path: Path, limit: int) -> Iterator[str]:
    """Documents of a .jsonl file (field "text") or a text file (blank-line separated)."""
    if path.suffix == ".jsonl":
        with path.open(encoding="utf-8") as f:
            docs: Iterable[str] = (json.loads(line)["text"] for line in f if line.strip())
            for i, d in enumerate(docs):
                if i >= limit:
                    return
                yield d
        return
    paras = [p.strip() for p in path.read_text(encoding="utf-8").split("\n\n") if p.strip()]
    yield from paras[:limit]


def documents(source: str, limit: int) -> Iterator[str]:
    if source == "local":
        from trainer.loop.corpus import documents as local_docs

        return iter(local_docs(limit))
    if source == "c4":
        return _c4_documents(limit)
    path = Path(source)
    if not path.is_file():
        raise ValueError(f"--source {source!r} is neither 'local', 'c4' nor an existing file")
    return _file_documents(path, limit)


def prepare(source: str, num_samples: int, tokenizer: str, output: Path,
            replace: bool = True) -> DataMeta:
    """Tokenize documents into `output`; the directory appears complete or not at all.

    With replace=False an existing complete directory wins (ranks racing to make the same data).
    """
    tok = get_tokenizer(tokenizer)
    dtype = np.uint16 if tok.vocab_size <= 65535 else np.uint32
    output = Path(output)
    tmp = output.with_name(output.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    total, docs, top = 0, 0, -1
    with open(tmp / "tokens.bin", "wb") as f:
        for text in documents(source, num_samples):
            ids = np.asarray(tok.encode(text) + [tok.eos_token_id], dtype=dtype)
            f.write(ids.tobytes())
            total += ids.size
            docs += 1
            top = max(top, int(ids.max()))
        f.flush()
        os.fsync(f.fileno())
    meta = DataMeta(total, np.dtype(dtype).name, tok.vocab_size, tok.eos_token_id, tok.name,
                    source, docs, top)
    tok.save(tmp / "tokenizer")  # beside the tokens: export and later runs need no download
    (tmp / "meta.json").write_text(json.dumps(meta.__dict__, indent=1))
    if output.exists() and replace:
        shutil.rmtree(output)
    try:
        os.replace(tmp, output)
    except OSError:
        if replace or not (output / "meta.json").is_file():
            raise
        shutil.rmtree(tmp)  # another process made the same data first
        return DataMeta.read(output)
    return meta


def default_data_path() -> Path:
    """Where the bundled local corpus is prepared on first use."""
    root = os.environ.get("NVRX_EKS_CACHE") or Path.home() / ".cache" / "nvrx-eks"
    return Path(root) / "data" / "local-byte"


def ensure_local_data() -> Path:
    """Prepare the bundled corpus once per machine (atomic, so concurrent ranks are safe)."""
    path = default_data_path()
    if not (path / "meta.json").exists():
        prepare("local", 20_000, "byte", path, replace=False)
    return path


class TokenDataset:
    """Fixed windows over the memory-mapped token file."""

    def __init__(self, path: str | Path, seq_len: int):
        self.path = Path(path)
        if not (self.path / "meta.json").is_file():
            raise FileNotFoundError(
                f"--data_path {str(path)!r} has no meta.json; build it with "
                "`python -m trainer.loop.data prepare`")
        self.meta = DataMeta.read(self.path)
        self.seq_len = seq_len
        self.tokens = np.memmap(self.path / "tokens.bin", dtype=self.meta.dtype, mode="r",
                                shape=(self.meta.num_tokens,))
        self.num_samples = (self.meta.num_tokens - 1) // seq_len
        if self.num_samples < 1:
            raise ValueError(f"{path} holds {self.meta.num_tokens} tokens: fewer than one "
                             f"sample of --seq_len {seq_len}")

    def __len__(self) -> int:
        return self.num_samples

    def sample(self, index: int) -> np.ndarray:
        start = index * self.seq_len
        return np.asarray(self.tokens[start:start + self.seq_len + 1], dtype=np.int64)


_MASK64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64's finalizer: a cheap, well-spread 64-bit hash."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


class FeistelPermutation:
    """A keyed bijection of [0, n) computed per index: no table, so its cost does not grow with n.

    A balanced Feistel network permutes [0, 4^h) with 4^h < 4n; indices that land at or beyond
    n are encrypted again (cycle walking) until they fall inside, which keeps it a bijection of
    [0, n). Expected walks per index: under 4.
    """

    ROUNDS = 6

    def __init__(self, n: int, key: int):
        if n < 1:
            raise ValueError(f"a permutation needs at least one element, got n={n}")
        self.n = n
        self._half = max(1, ((n - 1).bit_length() + 1) // 2)
        self._mask = (1 << self._half) - 1
        base = _mix64(key & _MASK64)
        self._keys = [_mix64(base ^ _mix64(r + 1)) for r in range(self.ROUNDS)]

    def _encrypt(self, x: int) -> int:
        left, right = x >> self._half, x & self._mask
        for k in self._keys:
            left, right = right, left ^ (_mix64(right ^ k) & self._mask)
        return (left << self._half) | right

    def __call__(self, index: int) -> int:
        if not 0 <= index < self.n:
            raise IndexError(f"index {index} outside [0, {self.n})")
        x = self._encrypt(index)
        while x >= self.n:
            x = self._encrypt(x)
        return x


ORDER = "feistel-v1"  # the sample order this code produces, named in every sampler state


class GlobalSampler:
    """Deterministic order over all ranks; `cursor` counts samples consumed globally.

    Each epoch's order is a Feistel permutation keyed by (seed, epoch), computed index by index,
    so a (re)start costs the same at any dataset size. The order's name is part of the state,
    so a checkpoint of another order is refused instead of continuing in a different order.
    """

    def __init__(self, num_samples: int, seed: int, cursor: int = 0):
        self.num_samples = num_samples
        self.seed = seed
        self.cursor = cursor
        self._epoch: Optional[int] = None
        self._perm = None

    def _permutation(self, epoch: int) -> "FeistelPermutation":
        key = _mix64((self.seed & _MASK64) ^ _mix64(epoch + 0x9E3779B97F4A7C15))
        return FeistelPermutation(self.num_samples, key)

    def _index(self, position: int) -> int:
        epoch, offset = divmod(position, self.num_samples)
        if epoch != self._epoch:
            self._perm = self._permutation(epoch)
            self._epoch = epoch
        return self._perm(offset)

    def next_batch(self, rank: int, world_size: int, batch_size: int) -> list[int]:
        """This rank's sample indices for the next micro-batch; advances the global cursor."""
        base = self.cursor + rank * batch_size
        indices = [self._index(base + j) for j in range(batch_size)]
        self.cursor += world_size * batch_size
        return indices

    def state_dict(self) -> dict:
        return {"cursor": self.cursor, "seed": self.seed, "num_samples": self.num_samples,
                "order": ORDER}

    def load_state_dict(self, state: dict) -> None:
        if state["num_samples"] != self.num_samples or state["seed"] != self.seed:
            raise ValueError(
                f"checkpoint data position is for {state['num_samples']} samples / seed "
                f"{state['seed']}, but this run has {self.num_samples} / {self.seed}: the "
                "dataset, --seq_len or --seed changed")
        if state.get("order") != ORDER:
            raise ValueError(f"checkpoint sample order {state.get('order')!r} is not {ORDER!r}, "
                             "the only order this trainer reads")
        self._epoch, self._perm = None, None
        self.cursor = int(state["cursor"])


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.loop.data")
    sub = p.add_subparsers(dest="cmd", required=True)
    prep = sub.add_parser("prepare", help="tokenize a text dataset into a token file")
    prep.add_argument("--source", default="local", help="local, c4, or a .txt/.jsonl file")
    prep.add_argument("--num_samples", type=int, default=100_000, help="documents to take")
    prep.add_argument("--tokenizer", default="byte", help="byte, a model directory, or a hub id")
    prep.add_argument("--output", required=True)
    args = p.parse_args(argv)
    if args.num_samples < 1:
        p.error(f"--num_samples {args.num_samples} must be at least 1")
    try:
        meta = prepare(args.source, args.num_samples, args.tokenizer, Path(args.output))
    except (ValueError, FileNotFoundError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.output}: {meta.documents} documents, {meta.num_tokens} tokens, "
          f"vocab {meta.vocab_size} ({meta.tokenizer})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
