"""Checks of what `RetroMAETrainer` is given: a pre-training model, tokenized training data, ids in range, one
tokenizer on both sides (the mask id of basic decoding included), the longest sequence."""

from __future__ import annotations

import os
from typing import Any

import datasets
import pyarrow.compute as pc
from retromae.modeling.pretraining_base import PretrainingBase


def check_tokenized(dataset: Any, name: str) -> None:
    """Refuse a dataset (or a dict of them) without `input_ids`, e.g. read_corpus's text: transformers would say only
    that no column matches the model."""
    for key, part in (dataset.items() if isinstance(dataset, dict) else [(None, dataset)]):
        columns = getattr(part, "column_names", None)
        if isinstance(columns, list) and "input_ids" not in columns:
            where = name if key is None else f"{name}[{key!r}]"
            raise ValueError(f"{where} has no 'input_ids' column (columns: {columns}); tokenize it first: "
                             "retromae.tokenize_corpus(dataset, tokenizer, max_seq_length=...)")


def _token_ids(tokenizer: Any) -> tuple[int | None, ...]:
    """What masking and padding read off a tokenizer: its size and mask, pad, cls and sep ids."""
    return (len(tokenizer), *(getattr(tokenizer, f"{kind}_token_id", None) for kind in ("mask", "pad", "cls", "sep")))


def check_same_tokenizer(collator_tokenizer: Any, tokenizer: Any) -> None:
    """Refuse a collator built from another tokenizer than the trainer's (`processing_class`): it would mask
    special tokens as words, insert its own mask id and pad with its own pad id. Equal ids pass (a copy is fine).

    Raises:
        ValueError: naming both tokenizers' classes, sizes and special ids.
    """
    if _token_ids(collator_tokenizer) == _token_ids(tokenizer):
        return

    def described(which: Any) -> str:
        size, mask, pad, cls, sep = _token_ids(which)
        return f"{type(which).__name__} ({size} tokens, mask {mask}, pad {pad}, cls {cls}, sep {sep})"

    raise ValueError(f"data_collator's tokenizer {described(collator_tokenizer)} is not processing_class "
                     f"{described(tokenizer)}; build the collator from the same tokenizer: "
                     "PretrainingCollator(processing_class, ...)")


def check_pretraining_inputs(model: Any, model_init: Any, data_collator: Any) -> None:
    """Refuse a model that is not one of the package's pre-training models (a base masked LM, a path: the Trainer
    would fail deep inside transformers), and one whose mask id does not fit the collator's tokenizer
    (`check_mask_token`), or whose config no longer validates. A `model_init` in place of the model is left to the
    Trainer.

    Raises:
        TypeError: naming the model's type and the class to build.
        ValueError: from `check_mask_token` or the config's `validate()`.
    """
    if model is None and model_init is not None:
        return
    if not isinstance(model, PretrainingBase):
        path = f" {model!r}" if isinstance(model, str | os.PathLike) else ""
        raise TypeError(f"RetroMAETrainer needs a retromae *ForPretraining model (e.g. "
                        f"RetroMAEForPretraining.from_encoder_checkpoint(path)); got {type(model).__name__}{path}")
    model.config.validate()  # fields set on `model.config` after the model was built skip the class validators
    tokenizer = getattr(data_collator, "tokenizer", None)
    if tokenizer is not None:
        check_mask_token(model.config, tokenizer)


def check_mask_token(config: Any, tokenizer: Any) -> None:
    """Refuse a model whose basic decoding masks the decoder input with another id (`config.mask_token_id`) than the
    collator's tokenizer uses: it would train on another token in its place without a word.

    Raises:
        ValueError: naming both ids and the fix.
    """
    mask_id = getattr(config, "mask_token_id", None)
    if getattr(config, "decoding", None) != "basic" or mask_id is None or mask_id == tokenizer.mask_token_id:
        return
    raise ValueError(f"model.config.mask_token_id {mask_id} is not the collator tokenizer's mask id "
                     f"{tokenizer.mask_token_id} (basic decoding masks its input with it); build the model with "
                     "mask_token_id=tokenizer.mask_token_id")


def longest_sequence(dataset: Any) -> int | None:
    """The most tokens of a row of a `datasets.Dataset` (any `*input_ids` column), read off the Arrow list lengths
    without decoding the rows; None for other datasets (a stream has no length to read)."""
    if not isinstance(dataset, datasets.Dataset) or len(dataset) == 0:
        return None
    longest = 0
    for column in (name for name in dataset.column_names if name.endswith("input_ids")):
        lengths = pc.list_value_length(dataset.data.column(column))
        if dataset._indices is not None:  # a select/shuffle view: only its rows
            lengths = lengths.take(dataset._indices.column(0))
        longest = max(longest, pc.max(lengths).as_py() or 0)
    return longest
