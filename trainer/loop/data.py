"""Tokenized data as one flat memory-mapped token file, and a sampler whose position is state.

Layout of a data directory: `tokens.bin` (little-endian uint16 or uint32 ids, documents
separated by the EOS id) and `meta.json`. Sample i is the window of seq_len + 1 tokens starting at
i * seq_len. The sampler walks a seeded permutation per epoch with one global cursor (samples
consumed by all ranks together), which is saved in every checkpoint: after a restart, at any
world size, training continues with exactly the next unseen samples. The permutation is
computed index by index (a Feistel bijection), so nothing of dataset size is ever built.

Preparation reads documents from a source (`trainer.loop.sources`: the bundled corpus, local
JSON lines or Parquet files, a Hugging Face dataset) and tokenizes them in batches over several
processes, writing as it goes: `python -m trainer.loop.data prepare --source SOURCE
--text_field FIELD --num_samples N --tokenizer byte|MODEL_DIR|HUB_ID --num_proc P --output DIR`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import shutil
import sys
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional

import numpy as np

from trainer.errors import ConfigError
from trainer.loop.sources import LOCAL, SPELLINGS, SourceError, document_batches

BYTE = "byte"
BYTE_EOS = 256
BYTE_VOCAB = 258  # 256 bytes + EOS + BOS
DEFAULT_TEXT_FIELD = "text"
BATCH_DOCUMENTS = 1000  # per batch a process tokenizes: large enough to amortize the hand-off
IN_FLIGHT = 2  # batches read ahead per process: keeps each busy, bounds memory
PROGRESS_INTERVAL_S = 5.0

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


def samples_in(num_tokens: int, seq_len: int) -> int:
    """The training samples in `num_tokens` tokens: windows of seq_len + 1 tokens, one every
    seq_len (the last token of one is the first of the next)."""
    return max(0, (num_tokens - 1) // seq_len)


def check_length(meta: DataMeta, seq_len: int, where: str) -> None:
    """Data that holds no whole sample of `seq_len` fails every rank the same way."""
    if samples_in(meta.num_tokens, seq_len) < 1:
        raise DataError(f"{where}: tokens.bin holds {meta.num_tokens} tokens, fewer than one "
                        f"sample of --seq_len {seq_len} ({seq_len + 1} tokens); lower --seq_len "
                        "or prepare more data")


def check_data(path: Path, model_vocab: Optional[int], model_tokenizer: Optional[str],
               sample: bool = False, flag: str = "--data_path",
               warn=lambda msg: print(msg, file=sys.stderr),
               seq_len: Optional[int] = None) -> DataMeta:
    """Refuse, with one line naming the file, data that the ranks would fail on late and
    vaguely: a missing or unreadable meta.json, a token file whose size disagrees with it, an
    unknown dtype, ids beyond the model's vocabulary, fewer tokens than one sample of
    `seq_len`. With `sample`, also read four small pieces of tokens.bin (start, end and two
    between) and check their ids: a cheap bound that catches a token file from another
    preparation. A tokenizer other than the model's is allowed (the tiny local runs train
    presets on bytes), with a warning."""
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
    if seq_len is not None:
        check_length(meta, seq_len, where)
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

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(text.encode("utf-8"), dtype=np.uint8) for text in texts]

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

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self._tok(texts, add_special_tokens=False)["input_ids"]

    def save(self, path: Path) -> None:
        self._tok.save_pretrained(path)


def get_tokenizer(ref: str):
    return ByteTokenizer() if ref == BYTE else HFTokenizer(ref)


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 65535 else np.uint32)


def encode_batch(tok, texts: list[str], dtype: np.dtype) -> np.ndarray:
    """The batch's documents as one run of ids, each document followed by EOS."""
    eos = np.array([tok.eos_token_id], dtype=dtype)
    pieces = [part for ids in tok.encode_batch(texts) for part in (np.asarray(ids, dtype), eos)]
    return np.concatenate(pieces) if pieces else np.empty(0, dtype)


def available_cpus(cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """The CPUs this process may use: its affinity, bounded by a cgroup v2 CPU quota (a pod's
    CPU limit, which the affinity does not show: it lists every CPU of the node)."""
    cpus = len(os.sched_getaffinity(0))
    try:
        quota, period = cpu_max.read_text().split()[:2]
        return cpus if quota == "max" else max(1, min(cpus, int(quota) // int(period)))
    except (OSError, ValueError):
        return cpus


_worker_state: Optional[tuple] = None  # (tokenizer, dtype), in each tokenizing process


def _one_thread_tokenizer(ref: str):
    """The tokenizer without the Rust library's own thread pool: the processes are the
    parallelism, so `--num_proc` is the CPUs used, as a pod's CPU request expects."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    return get_tokenizer(ref)


def _start_worker(ref: str, dtype: str) -> None:
    global _worker_state
    _worker_state = (_one_thread_tokenizer(ref), np.dtype(dtype))


def _encode_in_worker(texts: list[str]) -> tuple[int, np.ndarray]:
    tok, dtype = _worker_state
    return len(texts), encode_batch(tok, texts, dtype)


def encoded_batches(batches: Iterable[list[str]], ref: str, dtype: np.dtype,
                    num_proc: int) -> Iterator[tuple[int, np.ndarray]]:
    """(documents, ids) per batch, in the order of `batches`, whatever the number of processes:
    so the token file is the same byte for byte. At most IN_FLIGHT batches per process are
    read ahead, so memory does not grow with the dataset. Processes are spawned, not forked:
    the parent holds threads (the dataset's readers) that a fork would copy mid-step."""
    if num_proc == 1:
        tok = _one_thread_tokenizer(ref)
        yield from ((len(texts), encode_batch(tok, texts, dtype)) for texts in batches)
        return
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(num_proc, mp_context=context, initializer=_start_worker,
                             initargs=(ref, dtype.name)) as pool:
        pending: deque = deque()
        try:
            for texts in batches:
                pending.append(pool.submit(_encode_in_worker, texts))
                if len(pending) >= IN_FLIGHT * num_proc:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


def _si(n: float) -> str:
    """3 significant figures with k/M/B: 57.3M tokens reads faster than 57300112."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"


class Progress:
    """A line every `interval` seconds while a preparation runs: documents of the target,
    tokens, and their rates. Whole lines, not a bar redrawn with carriage returns, so that a
    pod's log reads like the terminal."""

    def __init__(self, target: int, interval: float = PROGRESS_INTERVAL_S, out=None,
                 clock=time.monotonic):
        self.target, self.interval, self._out, self._clock = target, interval, out, clock
        self.start = self._last = clock()

    def elapsed(self) -> float:
        return self._clock() - self.start

    def update(self, docs: int, tokens: int) -> None:
        now = self._clock()
        if now - self._last < self.interval:
            return
        self._last = now
        seconds = max(now - self.start, 1e-9)
        print(f"prepare: {docs:,} of {self.target:,} documents ({100 * docs // self.target}%), "
              f"{_si(tokens)} tokens; {_si(docs / seconds)} documents/s, "
              f"{_si(tokens / seconds)} tokens/s; {seconds:.0f} s",
              file=self._out or sys.stdout, flush=True)


def prepare(source: str, num_samples: int, tokenizer: str, output: Path, replace: bool = True,
            *, text_field: str = DEFAULT_TEXT_FIELD, num_proc: int = 1,
            batch_size: int = BATCH_DOCUMENTS, progress: Optional[Progress] = None) -> DataMeta:
    """Tokenize the first `num_samples` documents of `source` into `output`, streaming: batches
    are read, tokenized (over `num_proc` processes) and written in order, so memory stays
    bounded and the file is the same at any `num_proc`. The directory appears complete or not
    at all; a source that cannot be read as asked is refused before anything is written.

    With replace=False an existing complete directory wins (ranks racing to make the same data).
    """
    batches = document_batches(source, text_field, num_samples, batch_size)
    first = next(batches, None)  # opens the source: a missing field is refused here
    if first is None:
        raise SourceError(f"--source {source!r} holds no documents")
    tok = get_tokenizer(tokenizer)
    dtype = token_dtype(tok.vocab_size)
    output = Path(output)
    tmp = output.with_name(output.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        # Beside the tokens (export and later runs need no download); every process tokenizes
        # with these saved files, so the ids are what a reader of them gets.
        tok.save(tmp / "tokenizer")
        ref = BYTE if tokenizer == BYTE else str(tmp / "tokenizer")
        total, docs, top = 0, 0, -1
        with open(tmp / "tokens.bin", "wb") as f:
            for count, ids in encoded_batches(itertools.chain([first], batches), ref, dtype,
                                              num_proc):
                f.write(ids.tobytes())
                total, docs = total + ids.size, docs + count
                top = max(top, int(ids.max()))
                if progress:
                    progress.update(docs, total)
            f.flush()
            os.fsync(f.fileno())
        meta = DataMeta(total, dtype.name, tok.vocab_size, tok.eos_token_id, tok.name, source,
                        docs, top)
        (tmp / "meta.json").write_text(json.dumps(meta.__dict__, indent=1))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
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
        prepare(LOCAL, 20_000, BYTE, path, replace=False)
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
        check_length(self.meta, seq_len, str(path))  # checked before launch: never retried
        self.num_samples = samples_in(self.meta.num_tokens, seq_len)

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
            raise DataError(
                f"checkpoint data position is for {state['num_samples']} samples / seed "
                f"{state['seed']}, but this run has {self.num_samples} / {self.seed}: the "
                "dataset, --seq_len or --seed changed")
        if state.get("order") != ORDER:
            raise DataError(f"checkpoint sample order {state.get('order')!r} is not {ORDER!r}, "
                             "the only order this trainer reads")
        self._epoch, self._perm = None, None
        self.cursor = int(state["cursor"])


def _one_line(exc: BaseException) -> str:
    """The libraries' multi-line messages (a hub dataset's configurations, say) as one line."""
    return " ".join(str(exc).split())


def prepare_parser(sub) -> argparse.ArgumentParser:
    prep = sub.add_parser("prepare", help="tokenize a text dataset into a token file",
                          formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    prep.add_argument("--source", default=LOCAL, help=SPELLINGS)
    prep.add_argument("--text_field", default=DEFAULT_TEXT_FIELD,
                      help="the field that holds each document's text")
    prep.add_argument("--num_samples", type=int, default=100_000,
                      help="documents to take, from the start of the source")
    prep.add_argument("--tokenizer", default=BYTE, help="byte, a model directory, or a hub id")
    prep.add_argument("--num_proc", type=int, default=available_cpus(),
                      help="tokenizing processes; the default is the CPUs available")
    prep.add_argument("--progress_interval", type=float, default=PROGRESS_INTERVAL_S,
                      help="seconds between progress lines")
    prep.add_argument("--output", required=True)
    return prep


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.loop.data")
    sub = p.add_subparsers(dest="cmd", required=True)
    prep = prepare_parser(sub)
    args = p.parse_args(argv)
    for flag, value, floor in (("--num_samples", args.num_samples, 1),
                               ("--num_proc", args.num_proc, 1),
                               ("--progress_interval", args.progress_interval, 0)):
        if value < floor:
            prep.error(f"{flag} {value} must be at least {floor}")
    if not args.text_field:
        prep.error("--text_field must name a field")
    progress = Progress(args.num_samples, args.progress_interval)
    try:
        meta = prepare(args.source, args.num_samples, args.tokenizer, Path(args.output),
                       text_field=args.text_field, num_proc=args.num_proc, progress=progress)
    except ConnectionError as exc:  # the hub unreachable: worth a retry, unlike bad input
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError, OSError) as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 2
    seconds = progress.elapsed()
    print(f"{args.output}: {meta.documents} documents, {meta.num_tokens} tokens in "
          f"{seconds:.0f} s ({_si(meta.num_tokens / max(seconds, 1e-9))} tokens/s, --num_proc "
          f"{args.num_proc}), vocab {meta.vocab_size} ({meta.tokenizer})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
