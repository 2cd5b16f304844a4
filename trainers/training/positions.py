"""`--extend-position-embeddings`: a learned absolute position table grown to more positions the way BGE-M3 grew
XLM-R's (copies of the learned table, then continued pre-training at the new length). The limits of the bases
(`inputs.checkpoints.usable_positions`):

- BERT: positions 0 .. max_position_embeddings - 1 (row i is position i).
- RoBERTa / XLM-R: rows 0 .. padding_idx belong to no real position (row padding_idx is the padding's); the first
  token is row padding_idx + 1, so `max_position_embeddings - padding_idx - 1` positions are usable (514 - 1 - 1 =
  512 for roberta-base).
- ModernBERT: rotary positions, no table; its config's max_position_embeddings (8192) is its native length, which
  it runs at without extension.
"""

from __future__ import annotations

import logging

import torch
from retromae.modeling.backbones import backbone_of
from torch import nn

from ..inputs.checkpoints import position_offset, usable_positions

logger = logging.getLogger(__name__)


def tiled_rows(table: torch.Tensor, offset: int, length: int) -> torch.Tensor:
    """The position table `(offset + length, hidden)` whose rows offset.. repeat the learned rows of `table`
    `(offset + old, hidden)` in order (row offset + j is row offset + j % old); rows 0 .. offset - 1 are kept."""
    learned = table[offset:]
    repeats = -(-length // learned.shape[0])  # ceil
    return torch.cat([table[:offset], learned.repeat(repeats, 1)[:length]])


def check_extension_length(length: int | None, max_seq_length: int) -> None:
    """Refuse, before any model is loaded, an `--extend-position-embeddings` that grows no table (0 or less; None
    is the option left out) or one too short for `--max-seq-length`: the run would stop on the length later.

    Raises:
        ValueError: one line naming both values and the value to pass.
    """
    if length is None:
        return
    if length < 1:
        raise ValueError(f"--extend-position-embeddings {length}: give the number of positions to grow the table to, "
                         f"at least --max-seq-length {max_seq_length}, or leave the option out")
    if length < max_seq_length:
        raise ValueError(f"--extend-position-embeddings {length} is below --max-seq-length {max_seq_length}, so the "
                         f"grown table would still be too short; pass --extend-position-embeddings {max_seq_length} "
                         "or more")


def extend_position_embeddings(model: nn.Module, tokenizer, length: int) -> None:
    """Grow the encoder's learned absolute position table (BERT, RoBERTa, XLM-R) to `length` usable positions by
    copying the learned table repeatedly (RoBERTa / XLM-R keep their padding offset); update
    `config.max_position_embeddings`, the embeddings' `position_ids` / `token_type_ids` buffers and the tokenizer's
    `model_max_length`. The decoders of the methods take the encoder's table, so they see the new rows too.

    Raises:
        ValueError: a base without a position table (ModernBERT's rotary positions), or `length` not above the
            current limit.
    """
    config, backbone = model.config, backbone_of(model.config)
    if not backbone.has_position_table:
        raise ValueError(
            f"--extend-position-embeddings applies to learned absolute positions (BERT, RoBERTa, XLM-R); a "
            f"{backbone.display_name} base has rotary positions and runs at its native length "
            f"({config.max_position_embeddings}, max_position_embeddings): drop the option"
        )
    current = usable_positions(config)
    if length <= current:
        raise ValueError(f"--extend-position-embeddings {length} must exceed the model's {current} usable positions")
    offset = position_offset(config)
    embeddings = model.base_model.embeddings
    old = embeddings.position_embeddings
    weight = tiled_rows(old.weight.data, offset, length)
    new = nn.Embedding(offset + length, old.embedding_dim, padding_idx=old.padding_idx,
                       device=old.weight.device, dtype=old.weight.dtype)
    new.weight.data.copy_(weight)
    embeddings.position_embeddings = new
    rows = offset + length
    device = embeddings.position_ids.device
    embeddings.position_ids = torch.arange(rows, device=device).expand((1, -1))  # a registered buffer: stays one
    if hasattr(embeddings, "token_type_ids"):
        embeddings.token_type_ids = torch.zeros((1, rows), dtype=embeddings.token_type_ids.dtype, device=device)
    config.max_position_embeddings = rows
    if tokenizer is not None:
        tokenizer.model_max_length = length
    logger.info("Position table extended from %d to %d usable positions (copies of the learned %d rows)", current,
                length, current)


def check_model_and_tokenizer(model, tokenizer, max_seq_length: int, model_ref: str,
                              from_scratch: bool = False) -> None:
    """Refuse, in one line, a tokenizer larger than the embedding matrix and a --max-seq-length beyond the encoder's
    usable positions (`inputs.checkpoints.usable_positions`: RoBERTa / XLM-R lose padding_idx + 1 rows of their table);
    `from_scratch`: the fix named is a --config-overrides size."""
    config = model.config
    if len(tokenizer) > config.vocab_size:
        fix = ("raise vocab_size in --config-overrides (or drop it)" if from_scratch
               else "use the tokenizer that belongs to the model (--tokenizer)")
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens but the model {model_ref} has only {config.vocab_size} "
            f"embedding rows; {fix}"
        )
    limit, offset = usable_positions(config), position_offset(config)
    if max_seq_length > limit:
        where = (f"max_position_embeddings {config.max_position_embeddings} - padding offset {offset}" if offset
                 else "max_position_embeddings")
        grow = (" (or raise it: --config-overrides max_position_embeddings=N)" if from_scratch
                else " (or grow the table: --extend-position-embeddings N)" if backbone_of(config).has_position_table
                else "")
        raise ValueError(
            f"--max-seq-length {max_seq_length} exceeds the model's position limit "
            f"({limit}, {where} in {model_ref}); use a value <= that{grow}"
        )
    if max_seq_length < 8:
        raise ValueError(f"--max-seq-length {max_seq_length} is too short; use at least 8")
    # the Trainer sets config.pad_token_id to the tokenizer's, and RoBERTa / XLM-R count positions from it
    if offset and tokenizer.pad_token_id != config.pad_token_id:
        raise ValueError(
            f"the tokenizer's pad token id {tokenizer.pad_token_id} differs from pad_token_id {config.pad_token_id} "
            f"of the model {model_ref}, from which its positions are counted; set pad_token in tokenizer_config.json "
            f"to the model's (id {config.pad_token_id}), or use the tokenizer that belongs to the model (--tokenizer)"
        )


__all__ = ["check_extension_length", "check_model_and_tokenizer", "extend_position_embeddings", "tiled_rows"]
