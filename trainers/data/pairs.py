"""(anchor, positive) batches for an in-batch contrastive loss on top of the RetroMAE collator.

Two sources of positives (paper §2.2):

- ``"spans"`` (coCondenser-style, in-domain retrieval): the corpus is read and tokenized as for RetroMAE
  (``read_corpus`` -> ``tokenize_corpus``, no packing); ``ContrastiveCollator`` cuts two disjoint random spans from
  each tokenized passage, one becomes the anchor and the other its positive.
- ``"pairs"`` (NLI, query-passage): a JSONL file with one ``{"anchor": ..., "positive": ...}`` object per line,
  read by ``read_pairs`` and tokenized by ``tokenize_pairs``.

Either way ``ContrastiveCollator`` masks anchors and positives with the ordinary encoder-MLM masking of
``PretrainingCollator`` (both are reconstructed by RetroMAE, see ``SentMAEForPretraining``) and returns the anchors'
tensors plus the same tensors for the positives under a ``positive_`` prefix.

```python
pairs = tokenize_pairs(read_pairs("nli.jsonl"), tokenizer, max_seq_length=64)
batch = ContrastiveCollator(tokenizer, positives="pairs")(list(pairs.select(range(8))))
model(**batch).contrastive_loss
```
"""

from __future__ import annotations

import functools
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import datasets
import torch
from retromae.modeling.modeling_sentmae import POSITIVE_PREFIX

from ..inputs.io import iter_jsonl
from .collator import UNMASKED_KEY, PretrainingCollator
from .reading import code_fingerprint
from .token_rows import RowBatch
from .tokenize import special_template, word_start_flags

logger = logging.getLogger(__name__)

PAIR_FIELDS = ("anchor", "positive")

__all__ = ["ContrastiveCollator", "cut_two_spans", "read_pairs", "tokenize_pairs"]


# ---------------------------------------------------------------------------------------------------------------------
# Pair files
# ---------------------------------------------------------------------------------------------------------------------


def read_pairs(path: str | os.PathLike) -> datasets.Dataset:
    """Reads a JSONL file of ``{"anchor": str, "positive": str}`` objects (other keys are ignored).

    Whitespace is collapsed; blank lines are skipped. The pairs are held in memory (an NLI or MS MARCO query-passage
    set has well under ten million pairs).

    Returns:
        A ``datasets.Dataset`` with the columns ``"anchor"`` and ``"positive"``.

    Raises:
        ValueError: the file is missing or empty, or a line is not UTF-8, not JSON, or lacks a non-empty string
            ``"anchor"`` / ``"positive"``; the message gives the file and 1-based line.
    """
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"pair file {str(path)!r} does not exist; check the path (relative to {Path.cwd()})")
    if file.suffix != ".jsonl":
        raise ValueError(f"pair file {str(path)!r} must be JSONL (.jsonl), one {{'anchor', 'positive'}} per line")
    columns: dict[str, list[str]] = {name: [] for name in PAIR_FIELDS}
    for where, record in iter_jsonl(file, error=ValueError, example='{"anchor": "...", "positive": "..."}'):
        for name in PAIR_FIELDS:
            value = record.get(name)
            if not isinstance(value, str) or not value.strip():
                problem = f"no {name!r} field" if name not in record else f"{name!r} is not a non-empty string"
                raise ValueError(
                    f"{where}: {problem} (keys: {sorted(record)}); every line needs a non-empty string "
                    f'"anchor" and "positive"'
                )
            columns[name].append(" ".join(value.split()))
    if not columns["anchor"]:
        raise ValueError(f"pair file {str(file)!r} holds no pair; add lines {{\"anchor\": ..., \"positive\": ...}}")
    logger.info("Read %d pairs from %s", len(columns["anchor"]), file)
    return datasets.Dataset.from_dict(columns)


def tokenize_pairs(pairs: datasets.Dataset, tokenizer: Any, *, max_seq_length: int) -> datasets.Dataset:
    """Tokenizes both sides of every pair (``[CLS] ... [SEP]``, truncated to ``max_seq_length``; cached).

    Returns:
        A dataset with ``"input_ids"``, ``"word_starts"`` (the anchor) and ``"positive_input_ids"``,
        ``"positive_word_starts"``. A pair whose anchor or positive yields no ordinary token is dropped.
    """
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"tokenize_pairs needs a fast tokenizer (word_ids()), got {type(tokenizer).__name__}")
    missing = [name for name in PAIR_FIELDS if name not in pairs.column_names]
    if missing:
        raise ValueError(f"the pair dataset has no {missing} column(s) (columns: {pairs.column_names})")
    ids, starts = datasets.Sequence(datasets.Value("int32")), datasets.Sequence(datasets.Value("int8"))
    features = datasets.Features(
        {"input_ids": ids, "word_starts": starts, f"{POSITIVE_PREFIX}input_ids": ids, f"{POSITIVE_PREFIX}word_starts": starts}
    )
    tokenized = pairs.map(
        _tokenize_pair_batch,
        batched=True,
        fn_kwargs={"tokenizer": tokenizer, "max_seq_length": max_seq_length, "code": _pairs_fingerprint()},
        remove_columns=pairs.column_names,
        features=features,
        desc="Tokenizing pairs",
    )
    if len(tokenized) < len(pairs):
        logger.warning("Dropped %d pair(s) whose anchor or positive has no token", len(pairs) - len(tokenized))
    if len(tokenized) == 0:
        raise ValueError("no pair left after tokenizing: every anchor or positive is empty")
    return tokenized


@functools.lru_cache(maxsize=1)
def _pairs_fingerprint() -> str:
    return code_fingerprint(_tokenize_pair_batch, word_start_flags)


def _tokenize_pair_batch(batch: dict[str, list], tokenizer: Any, max_seq_length: int, code: str = "") -> dict[str, list]:
    """``code`` is unused: it invalidates the ``datasets`` cache when this code changes."""
    sides = {}
    for name in PAIR_FIELDS:
        encoding = tokenizer(
            batch[name], truncation=True, max_length=max_seq_length, return_attention_mask=False,
            return_token_type_ids=False,
        )
        sides[name] = [(ids, encoding.word_ids(row)) for row, ids in enumerate(encoding["input_ids"])]
    out: dict[str, list] = {key: [] for key in ("input_ids", "word_starts", "positive_input_ids", "positive_word_starts")}
    for (a_ids, a_words), (p_ids, p_words) in zip(sides["anchor"], sides["positive"], strict=True):
        if all(w is None for w in a_words) or all(w is None for w in p_words):
            continue
        out["input_ids"].append(a_ids)
        out["word_starts"].append(word_start_flags(a_words))
        out["positive_input_ids"].append(p_ids)
        out["positive_word_starts"].append(word_start_flags(p_words))
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Spans
# ---------------------------------------------------------------------------------------------------------------------


def cut_two_spans(word_starts: list[int], draws: list[float]) -> tuple[tuple[int, int], tuple[int, int]]:
    """Two disjoint spans of whole words from a passage of ``n`` tokens (coCondenser-style positives).

    With W words: the passage splits at a word boundary c drawn uniformly from [round(W/4), round(3W/4)] (clipped to
    [1, W-1]), so each part keeps at least about a quarter of the words; from each part of k words a run of
    ceil(k/2) .. k whole words is taken at a random offset. The first span is the earlier one unless the last draw
    is < 0.5 (then they swap, so anchors are not always the passage's beginning). A passage of one word gives the
    same span twice (the two copies are still masked independently).

    Args:
        word_starts: ``(n,)`` 1 where a token begins a word (the passage without special tokens).
        draws: 6 uniform numbers in [0, 1) (split, length and offset of each span, swap).

    Returns:
        ``((start, end), (start, end))`` token ranges (end exclusive) of the anchor and the positive.
    """
    n = len(word_starts)
    begins = [i for i, start in enumerate(word_starts) if start or i == 0]  # token index of each word's start
    n_words = len(begins)
    if n_words < 2:
        return (0, n), (0, n)
    bounds = [*begins, n]  # word w covers tokens bounds[w] .. bounds[w + 1]

    def pick(u: float, low: int, high: int) -> int:  # uniform integer in [low, high]
        return min(high, low + int(u * (high - low + 1)))

    low, high = max(1, round(n_words / 4)), min(n_words - 1, round(3 * n_words / 4))
    split = pick(draws[0], low, max(low, high))
    spans = []
    for first_word, words, u_len, u_off in ((0, split, draws[1], draws[2]), (split, n_words - split, draws[3], draws[4])):
        length = pick(u_len, math.ceil(words / 2), words)
        offset = first_word + pick(u_off, 0, words - length)
        spans.append((bounds[offset], bounds[offset + length]))
    first, second = spans
    return (second, first) if draws[5] < 0.5 else (first, second)


# ---------------------------------------------------------------------------------------------------------------------
# Collator
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class ContrastiveCollator(PretrainingCollator):
    """``PretrainingCollator`` for (anchor, positive) batches: B features -> B anchors + B positives.

    ``positives="spans"``: each feature is a tokenized passage (``input_ids``, ``word_starts``, special tokens
    included); ``cut_two_spans`` makes the anchor and the positive, each re-wrapped in the tokenizer's special tokens.
    ``positives="pairs"``: each feature carries the anchor (``input_ids``, ``word_starts``) and the positive
    (``positive_input_ids``, ``positive_word_starts``), e.g. from ``tokenize_pairs``.

    All 2B sequences are padded to one length and masked exactly as ``PretrainingCollator`` masks (same fields, same
    generator). The span cuts are random, so they belong to ``mask_batch`` (drawn from the same generator, before
    the masks): under ``RetroMAETrainer`` they come from the trainer's per-process generator too, never from a
    DataLoader worker.

    Returns (``__call__``): ``input_ids``, ``attention_mask``, ``encoder_labels``, ``decoder_labels`` of the anchors,
    ``(batch_size, padded_length)`` each, and the same four keys prefixed with ``positive_`` for the positives.
    """

    positives: Literal["spans", "pairs"] = "spans"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.positives not in ("spans", "pairs"):
            raise ValueError(f"positives={self.positives!r} is not supported; choose 'spans' or 'pairs'")
        self._prefix, self._suffix = special_template(self.tokenizer) if self.positives == "spans" else ([], [])

    def pad(self, features: list[dict[str, Any]] | RowBatch) -> dict[str, torch.Tensor]:
        """Pairs: anchors then positives, ``(2B, L)``. Spans: the B passages; the spans are cut in ``mask_batch``."""
        if not features:
            raise ValueError("ContrastiveCollator got an empty batch")
        if self.positives == "spans":
            return super().pad(features)
        anchors, positives = self._split_pairs(features)
        return super().pad(anchors + positives)

    def mask_batch(self, batch: dict[str, torch.Tensor], generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        if self.positives == "spans":  # span draws first (in Python, on the CPU), then the masks of all 2B sequences
            anchors, positives = self._cut_spans(_unpadded_rows(batch), generator)
            device = batch["input_ids"].device
            batch = {key: value.to(device) for key, value in super().pad(anchors + positives).items()}
        masked = super().mask_batch(batch, generator)  # (2B, L) each
        size = masked["input_ids"].shape[0] // 2
        out = {key: value[:size] for key, value in masked.items()}
        out.update({POSITIVE_PREFIX + key: value[size:] for key, value in masked.items()})
        return out

    def _split_pairs(self, features: list[dict[str, Any]]) -> tuple[list[dict], list[dict]]:
        key = POSITIVE_PREFIX + "input_ids"
        if any(f.get(key) is None for f in features):
            raise ValueError(
                f"positives='pairs' needs '{key}' in every feature (tokenize the pairs with tokenize_pairs); "
                "a plain corpus row takes positives='spans'"
            )
        anchors = [{"input_ids": f["input_ids"], "word_starts": f.get("word_starts")} for f in features]
        positives = [{"input_ids": f[key], "word_starts": f.get(POSITIVE_PREFIX + "word_starts")} for f in features]
        return anchors, positives

    def _cut_spans(
        self, features: list[dict[str, Any]], generator: torch.Generator | None
    ) -> tuple[list[dict], list[dict]]:
        draws = torch.rand(len(features), 6, generator=generator).tolist()  # (B, 6)
        prefix, suffix = self._prefix, self._suffix
        anchors, positives = [], []
        for feature, row_draws in zip(features, draws, strict=True):
            ids = list(map(int, feature["input_ids"]))
            starts = feature.get("word_starts")
            starts = list(map(int, starts)) if starts is not None else [1] * len(ids)
            head = len(prefix) if ids[: len(prefix)] == prefix else 0
            tail = len(suffix) if suffix and len(ids) - head >= len(suffix) and ids[-len(suffix) :] == suffix else 0
            body_ids, body_starts = ids[head : len(ids) - tail], starts[head : len(ids) - tail]
            for (begin, end), out in zip(cut_two_spans(body_starts, row_draws), (anchors, positives), strict=True):
                span_starts = body_starts[begin:end]
                if span_starts:
                    span_starts[0] = 1
                out.append({
                    "input_ids": prefix + body_ids[begin:end] + suffix,
                    "word_starts": [1] * len(prefix) + span_starts + [1] * len(suffix),
                })
        return anchors, positives


def _unpadded_rows(batch: dict[str, torch.Tensor]) -> list[dict[str, list[int]]]:
    """The features behind a batch of ``PretrainingCollator.pad``: ids and word starts without the padding."""
    lengths = batch["attention_mask"].sum(dim=1).tolist()
    ids, starts = batch["input_ids"].tolist(), batch[UNMASKED_KEY].tolist()
    return [{"input_ids": i[:n], "word_starts": w[:n]} for i, w, n in zip(ids, starts, lengths, strict=True)]
