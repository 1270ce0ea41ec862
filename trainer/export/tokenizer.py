"""The tokenizer an export carries: which one the run trained with, written in Hugging Face's
format beside the weights, so `AutoTokenizer.from_pretrained` reads the export directory.

A run names its data directory in its settings (`<checkpoint_dir>/SETTINGS.json`), and data
preparation keeps the tokenizer there (`<data>/tokenizer/`). Byte-level data has no files: its
tokenizer (ids 0-255 the UTF-8 bytes, then EOS and BOS, `trainer.loop.data.ByteTokenizer`) is
built here as a Hugging Face tokenizer with exactly those ids.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Optional

from trainer.export.source import ExportError
from trainer.loop.data import BYTE_EOS, BYTE_VOCAB

BYTE = "byte"
NONE = "none"
BYTE_BOS = BYTE_VOCAB - 1
BYTE_SPECIAL = {BYTE_EOS: "<eos>", BYTE_BOS: "<bos>"}


def of_run(settings: Optional[dict], log: Callable[[str], None]) -> Optional[str]:
    """The tokenizer the run trained with: a directory, a hub id or "byte"; None (with a line
    saying why) when its settings do not tell."""
    if settings is None:
        log("export: no tokenizer: the checkpoint directory records no settings "
            "(SETTINGS.json); pass --tokenizer")
        return None
    data = settings.get("data_path")
    if not data:
        return BYTE  # the bundled corpus, which is always byte-level (`ensure_local_data`)
    saved = Path(data) / "tokenizer"
    if saved.is_dir() and any(saved.iterdir()):
        return str(saved)
    try:
        name = json.loads((Path(data) / "meta.json").read_text(encoding="utf-8"))["tokenizer"]
    except (OSError, ValueError, KeyError, TypeError):
        log(f"export: no tokenizer: the run's data directory {data} holds neither tokenizer/ nor "
            "a readable meta.json; pass --tokenizer")
        return None
    return name


def load(ref: str):
    """Tokenizer `ref` (a directory, a hub id or "byte"), loaded before any weight is written,
    so that one that cannot be is refused first."""
    if ref == BYTE:
        return byte_tokenizer()
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(ref, local_files_only=os.path.isdir(ref))
    except (OSError, ValueError) as exc:
        raise ExportError(f"tokenizer {ref!r} cannot be loaded ({exc}); pass --tokenizer DIR, "
                          "or --tokenizer none") from None


def byte_tokenizer():
    """`ByteTokenizer` as a Hugging Face fast tokenizer: a byte-level BPE without merges whose
    vocabulary maps each byte's printable stand-in (GPT-2's table) to the byte's value."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    stand_in = bytes_to_unicode()
    tok = Tokenizer(models.BPE(vocab={stand_in[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(BYTE_SPECIAL[i], special=True)
                            for i in sorted(BYTE_SPECIAL)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=BYTE_SPECIAL[BYTE_EOS],
                                   bos_token=BYTE_SPECIAL[BYTE_BOS])
