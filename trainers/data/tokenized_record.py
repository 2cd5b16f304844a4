"""The record `pretrain --save-tokenized` keeps beside a tokenized corpus (`TOKENIZED_RECORD`): the tokenizer, length
and packing its rows were made with, so that a run with another tokenizer or length is refused instead of training
ids that mean other tokens, or sequences shorter than it says."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ..inputs.io import read_json_or_empty
from ..inputs.versions import package_version

TOKENIZED_RECORD = "retromae_tokenized.json"
SPECIAL_TOKENS = ("cls", "sep", "bos", "eos", "pad", "mask", "unk")
# what a token id means, with its name in messages; `name_or_path` is not compared (a run's copy of the same tokenizer)
IDENTITY_FIELDS = (("vocab_size", "size"), ("vocab_sha256", "vocabulary"), ("special_ids", "special token ids"))


def tokenizer_identity(tokenizer: Any) -> dict[str, Any]:
    """What a token id means to `tokenizer`: its size, a sha256 of its vocabulary (`get_vocab`) and the ids of its
    special tokens; and its `name_or_path`, for messages."""
    vocabulary = json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False)
    return {
        "name_or_path": str(tokenizer.name_or_path),
        "vocab_size": len(tokenizer),
        "vocab_sha256": hashlib.sha256(vocabulary.encode("utf-8")).hexdigest(),
        "special_ids": {name: getattr(tokenizer, f"{name}_token_id", None) for name in SPECIAL_TOKENS},
    }


def write_tokenized_record(folder: str | os.PathLike, tokenizer: Any, *, max_seq_length: int, packing: bool) -> None:
    """Write `TOKENIZED_RECORD` into `folder` (a tokenized corpus being saved, inside its `atomic_folder`): the
    tokenizer (`tokenizer_identity`), `max_seq_length` and `packing` its rows were made with."""
    record = {"tokenizer": tokenizer_identity(tokenizer), "max_seq_length": max_seq_length, "packing": packing,
              "retromae_version": package_version()}
    (Path(folder) / TOKENIZED_RECORD).write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n",
                                                 encoding="utf-8")


def check_tokenized_record(folder: Path, where: str, tokenizer: Any, max_seq_length: int) -> bool:
    """Whether `folder` holds a `TOKENIZED_RECORD` (False: saved in Python, or before the record existed).

    Raises:
        ValueError: in one line naming `where` and the fix, when the record cannot be read, or names another
            tokenizer (size, vocabulary or special ids) or another `max_seq_length` than the run's.
    """
    if not (folder / TOKENIZED_RECORD).is_file():
        return False
    again = "tokenize the text again with this run's --model (or --tokenizer) and --save-tokenized FOLDER"
    record = read_json_or_empty(folder / TOKENIZED_RECORD)
    made_with = record.get("tokenizer")
    if not isinstance(made_with, dict) or not isinstance(record.get("max_seq_length"), int):
        raise ValueError(f"{where}: its {TOKENIZED_RECORD} cannot be read (not the JSON --save-tokenized writes); "
                         f"{again}")
    ours = tokenizer_identity(tokenizer)
    differ = [label for key, label in IDENTITY_FIELDS if made_with.get(key) != ours[key]]
    if differ:
        raise ValueError(f"{where} was tokenized with the tokenizer {made_with.get('name_or_path')} "
                         f"({made_with.get('vocab_size')} tokens), whose {', '.join(differ[:-1]) + ' and ' if differ[1:] else ''}{differ[-1]} differ from this "
                         f"run's {ours['name_or_path']} ({ours['vocab_size']} tokens), so its ids mean other tokens "
                         f"here: {again}, or train with the model whose tokenizer made it")
    made_at = record["max_seq_length"]
    if made_at != max_seq_length:
        raise ValueError(f"{where} was tokenized at --max-seq-length {made_at} (longer passages were cut there), and "
                         f"this run asks for {max_seq_length}: pass --max-seq-length {made_at}, or tokenize the text "
                         f"again at {max_seq_length} with --save-tokenized FOLDER")
    return True


def recorded_packing(corpus: str | os.PathLike | None) -> bool:
    """Whether `corpus` is a folder whose `TOKENIZED_RECORD` says its rows were packed (a run from it trains packed
    rows, whatever its own --packing)."""
    return corpus is not None and read_json_or_empty(Path(corpus).expanduser() / TOKENIZED_RECORD).get("packing") is True


__all__ = ["TOKENIZED_RECORD", "check_tokenized_record", "recorded_packing", "tokenizer_identity",
           "write_tokenized_record"]
