"""The documents a token file is made of, in batches, through Hugging Face `datasets`.

A source is one of:
- `local`: the bundled synthetic corpus (`trainer.loop.corpus`), what tiny CPU runs use;
- a `.jsonl`/`.json` file (JSON lines, optionally `.gz`), a `.parquet` file, or a directory of
  them, read in sorted path order (subdirectories included; hidden files and files of other
  kinds are skipped);
- `hf:REPO[:CONFIG[:SPLIT]]`, a dataset on the Hugging Face hub (split `train` by default), or a
  short name for one (`c4` is `hf:allenai/c4:en:train`).

Files and hub datasets are streamed, local files too: a batch is read when it is asked for, so
memory stays the same at any dataset size and no Arrow copy of the data is written to the cache. Streaming reads files and shards in a fixed order and never shuffles, so
the first N documents are the same on every run. `datasets` is imported only when a file or hub
source is opened: the ranks import this package without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from trainer.errors import ConfigError

LOCAL = "local"
LOCAL_FIELD = "text"  # the one field of the local corpus's documents
HUB_PREFIX = "hf:"
SHORT_NAMES = {"c4": "hf:allenai/c4:en:train"}
DEFAULT_SPLIT = "train"
# The datasets builder that reads each file suffix.
BUILDERS = {".jsonl": "json", ".json": "json", ".jsonl.gz": "json", ".json.gz": "json",
            ".parquet": "parquet"}
SPELLINGS = (f"{LOCAL}, {', '.join(SHORT_NAMES)}, {HUB_PREFIX}REPO[:CONFIG[:SPLIT]], or a "
             f"{'/'.join(BUILDERS)} file or a directory of them")


class SourceError(ConfigError):
    """A source that cannot be read as asked: named, with what is allowed or what is there."""


@dataclass(frozen=True)
class HubDataset:
    """A dataset on the Hugging Face hub: its repository, configuration and split."""

    repo: str
    config: str | None = None
    split: str = DEFAULT_SPLIT


def parse_hub(source: str) -> HubDataset:
    """`hf:REPO[:CONFIG[:SPLIT]]` (or a short name) as a HubDataset; an empty CONFIG is the
    dataset's default one."""
    spec = SHORT_NAMES.get(source, source)
    parts = spec[len(HUB_PREFIX):].split(":")
    repo = parts[0]
    if not spec.startswith(HUB_PREFIX) or len(parts) > 3 or repo.count("/") > 1 \
            or not all(repo.split("/")):
        raise SourceError(f"--source {source!r} is not a hub dataset; spell one "
                          f"{HUB_PREFIX}REPO[:CONFIG[:SPLIT]], e.g. {SHORT_NAMES['c4']}")
    config = parts[1] if len(parts) > 1 and parts[1] else None
    split = parts[2] if len(parts) > 2 and parts[2] else DEFAULT_SPLIT
    return HubDataset(repo, config, split)


def is_hub(source: str) -> bool:
    return source in SHORT_NAMES or source.startswith(HUB_PREFIX)


def builder_for(path: Path) -> str | None:
    """The datasets builder that reads `path`, or None for a file of another kind."""
    name = path.name.lower()
    return next((b for suffix, b in BUILDERS.items() if name.endswith(suffix)), None)


def data_files(source: str) -> list[Path]:
    """The files a local source names, in the order their documents are read."""
    path = Path(source)
    if path.is_file():
        if builder_for(path) is None:
            raise SourceError(f"--source {source!r} is not a {'/'.join(BUILDERS)} file")
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and builder_for(p)
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if not files:
            raise SourceError(f"--source {source!r} holds no {'/'.join(BUILDERS)} file")
        return files
    raise SourceError(f"--source {source!r} is not an existing file or directory; allowed: "
                      f"{SPELLINGS}")


def document_batches(source: str, text_field: str, limit: int,
                     batch_size: int) -> Iterator[list[str]]:
    """The first `limit` documents of `source`, the text in `text_field` of each, in batches of
    at most `batch_size`. A source that cannot be one (a bad hub spelling, a missing path, a
    file of another kind) is refused here; the data is opened when the first batch is asked for."""
    if source == LOCAL:
        from trainer.loop.corpus import documents

        if text_field != LOCAL_FIELD:
            raise _missing_field(text_field, "the local corpus", [LOCAL_FIELD])
        batches: Iterator[list[str]] = _chunks(documents(limit), batch_size)
    elif is_hub(source):
        batches = _hub_batches(source, parse_hub(source), text_field, batch_size)
    else:
        batches = _file_batches(data_files(source), text_field, batch_size)
    return _first(batches, limit)


def _chunks(docs: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(docs), size):
        yield docs[start:start + size]


def _first(batches: Iterator[list[str]], limit: int) -> Iterator[list[str]]:
    """Batches up to `limit` documents in all; the last one cut to fit."""
    left = limit
    for batch in batches:
        if left <= 0:
            return
        yield batch[:left]
        left -= len(batch)


def _quiet_datasets():
    """`datasets`, with its progress bars and logs off: one progress line of our own reads
    better in a pod's log than bars redrawn with carriage returns, and each error it logs it
    also raises, which is said once, in one line naming the file."""
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    return datasets


def _file_batches(files: list[Path], text_field: str, batch_size: int) -> Iterator[list[str]]:
    """Each file streamed on its own, in order: files of one directory may differ in their
    other fields, which one dataset over all of them would refuse to cast."""
    datasets = _quiet_datasets()
    for path in files:
        try:
            try:
                ds = datasets.load_dataset(builder_for(path), data_files=[str(path)],
                                           split="train", streaming=True)
            except StopIteration:  # the json builder's word for a file with no rows to infer from
                continue
            yield from _texts(ds, text_field, batch_size, str(path))
        except SourceError:
            raise
        except Exception as exc:  # pyarrow's and datasets' many types; the library omits the file
            raise SourceError(f"{path} cannot be read as {builder_for(path)}: {exc}") from None


def _hub_batches(source: str, hub: HubDataset, text_field: str,
                 batch_size: int) -> Iterator[list[str]]:
    """A hub dataset, streamed: shards are fetched as they are read, never the whole dataset.
    The token in HF_TOKEN (or the file HF_TOKEN_PATH names) opens gated datasets."""
    datasets = _quiet_datasets()
    try:
        ds = datasets.load_dataset(hub.repo, hub.config, split=hub.split, streaming=True)
    except ValueError as exc:  # an unknown configuration or split: the library names the allowed
        raise SourceError(f"--source {source!r}: {exc}") from None
    yield from _texts(ds, text_field, batch_size, source)


def _texts(ds, text_field: str, batch_size: int, where: str) -> Iterator[list[str]]:
    """The `text_field` column of a streamed dataset, batch by batch, checked: a missing field
    is refused with the fields there are; a document whose field is not text, by its index."""
    if ds.column_names == []:  # a file of blank lines: no fields, no documents
        return
    if ds.column_names is not None and text_field not in ds.column_names:
        raise _missing_field(text_field, where, ds.column_names)
    seen = 0
    for batch in ds.iter(batch_size=batch_size):
        if text_field not in batch:
            raise _missing_field(text_field, where, list(batch))
        texts = batch[text_field]
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise SourceError(f"--text_field {text_field!r} of document {seen + i} in "
                                  f"{where} is {type(text).__name__}, not text")
        seen += len(texts)
        yield texts


def _missing_field(text_field: str, where: str, fields: list[str]) -> SourceError:
    return SourceError(f"--text_field {text_field!r} is not a field of {where}; its fields: "
                       f"{', '.join(fields) or 'none'}")
