"""Pre-training batches: the collator (padding in DataLoader workers, masking in the training process) and what a
method's training data holds."""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, field
from typing import Any

import datasets
import numpy as np
import torch
from retromae.modeling.configuration_retromae import check_ratio

from ..inputs.parameters import check_bool, check_number
from .reading import TextFormat
from .token_rows import RowBatch

logger = logging.getLogger(__name__)
UNMASKED_KEY = "word_starts"  # in a padded batch that still awaits masking (models take no such input)


def masking_generator(seed: int, process_index: int, stream: str = "train") -> torch.Generator:
    """A CPU generator for the masks of one process, distinct for every ``(seed, process_index, stream)``.

    Hashing the three (instead of ``seed + process_index``) keeps seed 1 on rank 0 apart from seed 0 on rank 1.
    """
    digest = hashlib.sha256(f"retromae-masking/{stream}/{seed}/{process_index}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)  # < 2**63


@dataclass
class PretrainingCollator:
    """Pads tokenized rows and applies the encoder's masked-language-model corruption, vectorized in torch.

    Masking (per row, on the padded ``(B, L)`` tensors, no Python loop over rows or tokens):

    - Special tokens (``tokenizer.all_special_ids``) and padding are never masked.
    - The number of masked tokens is exactly ``n_mask = max(1, round(mask_ratio * n_ordinary))``, ``n_ordinary``
      being the row's non-special, non-padding tokens.
    - Whole-word units: a word starts where ``word_starts`` is 1 (and at every special token and the token after
      it). Words get a random key and are taken in key order while the cumulative token count stays
      ``<= n_mask``; the remaining budget is then filled with single-token words not yet chosen, in the same random
      order. The count therefore equals ``n_mask`` whenever enough single-token words exist; a row made only of
      long multi-piece words may get fewer. ``whole_word_mask=False`` makes every token its own word (always exact).
    - Of the masked positions, a share ``replace_with_mask`` becomes ``tokenizer.mask_token_id``, a share
      ``replace_with_random`` a uniformly random non-special id in ``[0, len(tokenizer))``, the rest stays unchanged.

    The work is split in two halves: ``pad`` (deterministic: padding and word starts) and ``mask_batch`` (every
    random draw). ``collator(features)`` is ``mask_batch(pad(features), generator)``. ``RetroMAETrainer`` runs only
    ``pad`` in the DataLoader workers and ``mask_batch`` in the training process, with its own generator per process
    (checkpointed), so masks never repeat across workers or epochs and a resumed run continues exactly.
    Standalone calls draw from ``generator`` when given, else from torch's global RNG.
    The original ids are ``torch.where(encoder_labels != -100, encoder_labels, input_ids)``.

    Args:
        tokenizer: The tokenizer that produced the ids (needs ``pad_token_id`` and ``mask_token_id``).
        mask_ratio: Share of ordinary tokens to mask, in (0, 1).
        whole_word_mask: Mask whole words (all their pieces) instead of single tokens.
        pad_to_multiple_of: Pad the length to a multiple of this (8 suits tensor cores); ``None`` pads to the longest.
        max_length: Never pad beyond this many positions (the run's ``max_seq_length``, which the model's position
            table may end at); ``None``: no cap.
        replace_with_mask: Share of masked positions replaced by the mask token, in [0, 1].
        replace_with_random: Share of masked positions replaced by a random token, in [0, 1]; with
            ``replace_with_mask`` at most 1.
        generator: Optional ``torch.Generator`` for the random draws of standalone calls (``RetroMAETrainer`` uses
            its own).

    Features: dicts with ``"input_ids"`` (list or tensor) and optionally ``"word_starts"`` (default: every token
    starts a word); other keys are ignored.

    Returns (``__call__``): a dict of ``torch.long`` tensors of shape ``(batch_size, padded_length)``:
    ``input_ids`` (corrupted encoder input), ``attention_mask``, ``encoder_labels`` (original id at masked
    positions, -100 elsewhere) and ``decoder_labels`` (original id at every real non-special position, -100 at
    special tokens and padding).
    """

    tokenizer: Any
    mask_ratio: float = 0.3
    whole_word_mask: bool = True
    pad_to_multiple_of: int | None = 8
    replace_with_mask: float = 0.8
    replace_with_random: float = 0.1
    generator: torch.Generator | None = None
    max_length: int | None = None
    _special_ids: torch.Tensor = field(init=False, repr=False, compare=False)
    _random_ids: torch.Tensor = field(init=False, repr=False, compare=False)
    _id_tables: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        self._check_types()
        check_ratio("mask_ratio", self.mask_ratio)
        for name in ("replace_with_mask", "replace_with_random"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name}={getattr(self, name)} is not in the allowed range [0, 1]")
        if self.replace_with_mask + self.replace_with_random > 1.0:
            raise ValueError(
                f"replace_with_mask + replace_with_random = {self.replace_with_mask + self.replace_with_random} "
                f"exceeds 1; lower one of them"
            )
        if self.pad_to_multiple_of is not None and self.pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of={self.pad_to_multiple_of} must be a positive integer or None")
        for name in ("pad_token_id", "mask_token_id"):
            if getattr(self.tokenizer, name, None) is None:
                raise ValueError(f"the tokenizer has no {name}; set it, e.g. tokenizer.add_special_tokens(...)")
        self._special_ids = torch.tensor(sorted(set(self.tokenizer.all_special_ids)), dtype=torch.long)
        vocab = torch.arange(len(self.tokenizer))
        self._random_ids = vocab[~torch.isin(vocab, self._special_ids)]

    def _check_types(self) -> None:
        """Refuse a tokenizer that is none (None, its path) and options of the wrong type, naming the parameter."""
        if not hasattr(self.tokenizer, "all_special_ids"):
            fix = (f"load it first: AutoTokenizer.from_pretrained({os.fspath(self.tokenizer)!r})"
                   if isinstance(self.tokenizer, str | os.PathLike) else "e.g. AutoTokenizer.from_pretrained(model)")
            raise TypeError(f"PretrainingCollator: tokenizer={self.tokenizer!r} is not a tokenizer; pass the one that "
                            f"tokenized the rows, {fix}")
        for name in ("mask_ratio", "replace_with_mask", "replace_with_random"):
            check_number("PretrainingCollator", name, getattr(self, name))
        for name in ("pad_to_multiple_of", "max_length"):
            check_number("PretrainingCollator", name, getattr(self, name), integer=True, optional=True)
        check_bool("PretrainingCollator", "whole_word_mask", self.whole_word_mask)

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return self.mask_batch(self.pad(features), self.generator)

    def pad(self, features: list[dict[str, Any]] | RowBatch) -> dict[str, torch.Tensor]:
        """The deterministic half: ``input_ids`` (uncorrupted), ``attention_mask`` and ``word_starts``, ``(B, L)`` long.

        The presence of ``word_starts`` (``UNMASKED_KEY``) marks a batch that still needs ``mask_batch``.
        """
        input_ids, word_starts, attention_mask = self._pad(features)
        return {"input_ids": input_ids, "attention_mask": attention_mask.long(), UNMASKED_KEY: word_starts}

    def mask_batch(self, batch: dict[str, torch.Tensor], generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """The random half: the model inputs of a batch from ``pad``, drawn from ``generator`` (global RNG if None).

        The random numbers are drawn on the CPU and everything else runs on the batch's device without waiting for
        it (integer and comparison ops, a stable sort), so a CPU and a GPU run with the same generator state get the
        same masks and the training loop does not stall.
        """
        B, L = batch["input_ids"].shape
        word_keys = torch.rand(B, L, generator=generator)  # random order of the words
        share_draws = torch.rand(B, L, generator=generator)  # 80/10/10
        replacements = torch.randint(len(self._random_ids), (B, L), generator=generator)  # used where "random"
        home = batch["input_ids"].device
        device = home if home.type != "mps" else torch.device("cpu")  # MPS has no float64
        # host -> device copies of fresh CPU tensors need no wait; the batch itself is already there (but for MPS)
        draws = (word_keys, share_draws, replacements)
        word_keys, share_draws, replacements = (draw.to(device, non_blocking=True) for draw in draws)
        input_ids, attention_mask, word_starts = (batch[key].to(device) for key in ("input_ids", "attention_mask",
                                                                                     UNMASKED_KEY))
        special_ids, random_ids, mask_counts = self._device_tables(device, L)
        ordinary = torch.isin(input_ids, special_ids, invert=True) & attention_mask.bool()  # (B, L)
        masked = self._choose_masked(ordinary, word_starts, word_keys, mask_counts)
        out = {
            "input_ids": self._corrupt(input_ids, masked, share_draws, random_ids[replacements]),
            "attention_mask": attention_mask.long(),
            "encoder_labels": torch.where(masked, input_ids, -100),
            "decoder_labels": torch.where(ordinary, input_ids, -100),
        }
        return out if device == home else {key: value.to(home) for key, value in out.items()}

    def _device_tables(self, device: torch.device, length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The special ids, the random-replacement ids and the mask count of every row size 0..``length`` on
        ``device``, copied to an accelerator once (the counts again only for a longer batch)."""
        tables = self._id_tables.get(device)
        if tables is None or len(tables[2]) <= length:
            # round() on the float64 product, as in the class docstring: one lookup instead of a chain of ops per batch
            counts = [0] + [max(1, round(self.mask_ratio * n)) for n in range(1, length + 1)]
            tables = (self._special_ids.to(device), self._random_ids.to(device), torch.tensor(counts, device=device))
            self._id_tables[device] = tables
        return tables

    def _pad(self, features: list[dict[str, Any]] | RowBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Right-pads ids (pad id) and word starts (1): ``(B, L)`` long, long, and a bool attention mask."""
        if not len(features):
            raise ValueError("PretrainingCollator got an empty batch")
        ids, starts, lengths = _flat_rows(features)
        length = longest = int(lengths.max())
        if self.pad_to_multiple_of:
            length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of
            if self.max_length is not None:  # e.g. L = 300 = the position limit: 304 would run past the table
                length = max(min(length, self.max_length), longest)
        input_ids = np.full((len(lengths), length), self.tokenizer.pad_token_id, dtype=np.int64)
        word_starts = np.ones((len(lengths), length), dtype=np.int64)
        attention_mask = np.arange(length) < lengths[:, None]  # (B, L)
        input_ids[attention_mask] = ids
        if starts is not None:
            word_starts[attention_mask] = starts
        return torch.from_numpy(input_ids), torch.from_numpy(word_starts), torch.from_numpy(attention_mask)

    def _choose_masked(self, ordinary: torch.Tensor, word_starts: torch.Tensor, word_keys: torch.Tensor,
                       mask_counts: torch.Tensor) -> torch.Tensor:
        """Exactly ``n_mask`` ordinary tokens per row, in whole-word units (see the class docstring): ``(B, L)`` bool.

        ``word_keys``: ``(B, L)`` uniform draws; word w of a row is taken in the order of ``word_keys[:, w]``.
        ``mask_counts``: ``n_mask`` of a row of n ordinary tokens at index n (``_device_tables``).
        """
        B, L = ordinary.shape
        if self.whole_word_mask:
            # A word also starts at every special/pad token and at the token right after one.
            outside = ~ordinary
            starts = (word_starts != 0) | outside
            starts[:, 1:] |= outside[:, :-1]
            starts[:, 0] = True
        else:
            starts = torch.ones_like(ordinary)
        word_index = torch.cumsum(starts, dim=1).sub_(1)  # (B, L), word of each token, 0 .. L-1
        word_length = torch.zeros((B, L), dtype=torch.long, device=ordinary.device).scatter_add_(
            1, word_index, ordinary.long())
        keys = word_keys.masked_fill(word_length == 0, 2.0)  # (B, L words); no-token words sort last
        order = torch.sort(keys, dim=1, stable=True).indices  # (B, L): words in random order, the same on every device
        sorted_length = word_length.gather(1, order)
        budget = mask_counts[word_length.sum(dim=1, keepdim=True)]  # (B, 1): the row's ordinary tokens -> n_mask
        chosen = (torch.cumsum(sorted_length, dim=1) <= budget) & (sorted_length > 0)
        # Fill what is left of the budget with unchosen single-token words, in the same random order.
        left = budget - torch.where(chosen, sorted_length, 0).sum(dim=1, keepdim=True)
        single = (sorted_length == 1) & ~chosen
        chosen |= single & (torch.cumsum(single, dim=1) <= left)
        chosen_words = torch.zeros_like(chosen).scatter_(1, order, chosen)  # back in word order
        return chosen_words.gather(1, word_index) & ordinary

    def _corrupt(
        self, input_ids: torch.Tensor, masked: torch.Tensor, share_draws: torch.Tensor, replacements: torch.Tensor
    ) -> torch.Tensor:
        """80/10/10: mask token, random non-special token, unchanged (shares from the fields).

        ``share_draws``: ``(B, L)`` uniform draws; ``replacements``: ``(B, L)`` random non-special ids, used only where
        a random token goes (drawn for every position so that no host sync counts those first).
        """
        random_share = self.replace_with_mask + self.replace_with_random
        replaced = torch.where(masked & (share_draws < random_share), replacements, input_ids)
        # the mask token last: it takes the draws below replace_with_mask out of the random share
        return replaced.masked_fill(masked & (share_draws < self.replace_with_mask), self.tokenizer.mask_token_id)


def _flat_rows(features: list[dict[str, Any]] | RowBatch) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """The rows' ids and word starts, each concatenated (starts None when no row has them), and their lengths (B,).

    Rows given one by one (lists, arrays or tensors) are converted in numpy: a Python list converts about 3x faster
    to a numpy array than to a tensor.
    """
    if isinstance(features, RowBatch):
        ids, lengths = features.flat("input_ids")
        starts = features.flat("word_starts")
        if starts is not None and not np.array_equal(starts[1], lengths):
            raise ValueError("every feature's 'word_starts' must have the length of its 'input_ids'")
        return ids, None if starts is None else starts[0], lengths
    rows = [np.asarray(f["input_ids"], dtype=np.int64) for f in features]
    lengths = np.array([len(row) for row in rows], dtype=np.int64)
    if all(f.get("word_starts") is None for f in features):
        return np.concatenate(rows), None, lengths
    starts = [
        np.asarray(f["word_starts"], dtype=np.int64) if f.get("word_starts") is not None else np.ones_like(row)
        for f, row in zip(features, rows, strict=True)
    ]
    if any(s.shape != row.shape for s, row in zip(starts, rows, strict=True)):
        raise ValueError("every feature's 'word_starts' must have the length of its 'input_ids'")
    return np.concatenate(rows), np.concatenate(starts), lengths


@dataclass(frozen=True)
class DataInputs:
    """What a method's training-data builder reads (`methods.Method.training_data`): plain values of the run.

    Args:
        corpus: the pre-training text (see `read_corpus`; None: the built-in corpus).
        text_format: how a .txt corpus splits into passages.
        max_seq_length: tokens per sequence, special tokens included.
        packing: concatenate passages into full-length blocks.
        streaming: stream the corpus instead of reading it into memory.
        pairs: a JSONL file of {"anchor", "positive"} pairs, for a method with an in-batch contrastive loss.
        global_batch_size: sequences per optimizer micro-step over all processes (in-batch negatives need >= 2).
        drop_last: the DataLoader drops a short last batch (`--dataloader-drop-last`).
        contrastive_anchor: the continued-pre-training recipe adds an in-batch contrastive loss with span positives
            (`training.recipe.RecipeArguments.contrastive_anchor_weight`).
        tokenize_workers: processes that tokenize a corpus of more than 10,000 passages (None: `tokenize_corpus`'s
            default).
        text_column, corpus_config, corpus_split, corpus_revision: where the corpus text is (`read_corpus`'s
            text_column, config, split, revision).
    """

    corpus: str | None = None
    text_format: TextFormat = "auto"
    max_seq_length: int = 256
    packing: bool = False
    streaming: bool = False
    pairs: str | None = None
    global_batch_size: int = 8
    drop_last: bool = False
    contrastive_anchor: bool = False
    tokenize_workers: int | None = None
    text_column: str = "text"
    corpus_config: str | None = None
    corpus_split: str | None = None
    corpus_revision: str | None = None


@dataclass(frozen=True)
class TrainingData:
    """A method's training data: the tokenized dataset and the collator that pads and masks its batches.

    Args:
        dataset: tokenized rows (`input_ids`, `word_starts`, and `positive_*` for pairs).
        collator: a `PretrainingCollator` (or subclass); the trainer draws its masks.
        drop_last: drop the last incomplete batch of an epoch (a batch of one pair has no in-batch negative).
        corpus_name: the name of the text the run read when it is not the corpus (e.g. the pair file), for the
            model card.
    """

    dataset: datasets.Dataset | datasets.IterableDataset
    collator: PretrainingCollator
    drop_last: bool = False
    corpus_name: str | None = None


__all__ = ["DataInputs", "PretrainingCollator", "TrainingData", "UNMASKED_KEY", "masking_generator"]
