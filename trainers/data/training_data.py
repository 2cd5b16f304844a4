"""The training data of each method (`methods.Method.training_data`): the corpus masked by `PretrainingCollator`,
or (anchor, positive) batches for an in-batch contrastive loss (SentMAE stage 2, the recipe's anchor)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import datasets
from retromae.modeling.configuration_retromae import hides_whole_words

from .collator import DataInputs, PretrainingCollator, TrainingData
from .pairs import ContrastiveCollator, read_pairs, tokenize_pairs
from .reading import read_corpus
from .tokenize import load_tokenized_corpus, saved_token_rows, tokenize_corpus
from .tokenized_record import recorded_packing

logger = logging.getLogger(__name__)

__all__ = ["contrastive_training_data", "corpus_training_data", "pair_positive_settings", "span_pair_training_data"]


def corpus_training_data(config: Any, tokenizer: Any, inputs: DataInputs) -> TrainingData:
    """The data of a method without positives of its own: the corpus, masked by ``PretrainingCollator``.

    With the continued-pre-training recipe's contrastive anchor (``inputs.contrastive_anchor``), batches of two spans
    of each passage instead (``span_pair_training_data``).
    """
    if inputs.pairs:
        raise ValueError(
            f"--pairs feeds the in-batch contrastive loss of a method that has one (see `retromae methods`); this run's "
            f"method ({config.model_type}) has none: use --corpus for its text"
        )
    if inputs.contrastive_anchor:
        if hides_whole_words(config):
            raise ValueError('--contrastive-anchor-weight does not support decoder_visibility="reference" yet; use '
                             'the default "token"')
        return span_pair_training_data(config, tokenizer, inputs, purpose="--contrastive-anchor-weight",
                                       needs_text="the anchor's positives are two spans of each passage's text: pass "
                                                  "the text corpus as --corpus, or drop --contrastive-anchor-weight")
    dataset = load_tokenized_corpus(inputs.corpus, tokenizer, max_seq_length=inputs.max_seq_length,
                                    streaming=inputs.streaming, text_column=inputs.text_column)  # None for text
    # packing happens while tokenizing, which this corpus is past (a folder saved packed agrees with the flag)
    if dataset is not None and inputs.packing and not recorded_packing(inputs.corpus):
        raise ValueError(f"--packing applies while a corpus is tokenized, and {inputs.corpus} is already tokenized "
                         "(its rows train as saved): drop --packing, or tokenize the text again with --packing "
                         "--save-tokenized FOLDER")
    if dataset is None:
        texts = read_corpus(inputs.corpus, text_format=inputs.text_format, streaming=inputs.streaming,
                            text_column=inputs.text_column, config=inputs.corpus_config, split=inputs.corpus_split,
                            revision=inputs.corpus_revision)
        dataset = tokenize_corpus(texts, tokenizer, max_seq_length=inputs.max_seq_length, packing=inputs.packing,
                                  num_proc=inputs.tokenize_workers)
    # no generator: RetroMAETrainer draws the masks from its own per-process, checkpointed generator
    collator = PretrainingCollator(tokenizer, mask_ratio=config.encoder_mask_ratio, whole_word_mask=config.whole_word_mask,
                                   max_length=inputs.max_seq_length)
    if isinstance(dataset, datasets.Dataset) and len(dataset) < inputs.global_batch_size:
        if inputs.drop_last:  # the one batch is short, so dropped: no step would train
            raise ValueError(f"the corpus holds {len(dataset)} sequences and --dataloader-drop-last drops every batch "
                             f"of {inputs.global_batch_size}: lower --per-device-train-batch-size or drop "
                             "--dataloader-drop-last")
        logger.warning("the corpus holds %d sequences, fewer than a global batch of %d: each step trains on all of "
                       "them, a smaller batch than asked for", len(dataset), inputs.global_batch_size)
    return TrainingData(dataset, collator)


def span_pair_training_data(config: Any, tokenizer: Any, inputs: DataInputs, *, purpose: str,
                            needs_text: str) -> TrainingData:
    """Batches of two disjoint spans of each corpus passage, anchor and positive, masked as usual: the data of an
    in-batch contrastive loss on a plain corpus. ``purpose`` names what asks for it (a flag) in messages;
    ``needs_text`` says, after "--corpus FOLDER is tokenized, and", why it needs the text and the fix.

    Raises:
        ValueError: a tokenized ``--corpus`` folder (the spans are cut from the text), ``--packing`` (the spans could
            come from different documents), or fewer than 2 passages per global batch (the other passages' spans are
            the negatives).
    """
    if saved_token_rows(inputs.corpus, inputs.text_column) is not None:
        raise ValueError(f"--corpus {inputs.corpus} is tokenized, and {needs_text}")
    if inputs.packing:
        raise ValueError(
            f"{purpose} takes its positives from two spans of one passage, but --packing joins passages into blocks "
            "(the spans could come from different documents); drop --packing"
        )
    _check_in_batch_negatives(inputs, purpose, unit="passages")
    texts = read_corpus(inputs.corpus, text_format=inputs.text_format, streaming=inputs.streaming,
                        text_column=inputs.text_column, config=inputs.corpus_config, split=inputs.corpus_split,
                        revision=inputs.corpus_revision)
    dataset = tokenize_corpus(texts, tokenizer, max_seq_length=inputs.max_seq_length, num_proc=inputs.tokenize_workers)
    _check_enough_rows(dataset, inputs, unit="passages")
    collator = ContrastiveCollator(tokenizer, mask_ratio=config.encoder_mask_ratio,
                                   whole_word_mask=config.whole_word_mask, positives="spans",
                                   max_length=inputs.max_seq_length)
    return TrainingData(dataset, collator, drop_last=True)  # a last batch of one passage would have no negative


def pair_positive_settings(inputs: DataInputs, requested: dict[str, Any]) -> dict[str, Any]:
    """The config setting that ``--pairs`` decides before the model is built: the positives are the given pairs."""
    if not inputs.pairs:
        return {}
    if requested.get("positives") == "spans":
        raise ValueError('--pairs gives pair positives but --method-options sets "positives": "spans"; drop one')
    return {"positives": "pairs"}


def contrastive_training_data(config: Any, tokenizer: Any, inputs: DataInputs) -> TrainingData:
    """The data of a method with an in-batch contrastive loss (SentMAE stage 2).

    With ``contrastive_loss_weight > 0`` the positives come from ``--pairs FILE.jsonl`` (``positives="pairs"``, set
    by ``pair_positive_settings``) or, by default, from two spans of each ``--corpus`` passage. With
    ``contrastive_loss_weight == 0`` the method is plain RetroMAE and reads the corpus (``corpus_training_data``).

    Raises:
        ValueError: settings that cannot work together (``--pairs`` with ``--corpus``/``--packing``/``--streaming``
            or without a contrastive loss, span positives with ``--packing``, ``positives="pairs"`` without
            ``--pairs``, the recipe's contrastive anchor on top of this loss), or a global batch of fewer than 2.
    """
    if not config.contrastive_loss_weight > 0:
        if inputs.pairs:
            raise ValueError("--pairs feeds the in-batch contrastive loss, which contrastive_loss_weight 0 switches "
                             "off; use --corpus for the text, or set contrastive_loss_weight > 0")
        return corpus_training_data(config, tokenizer, inputs)
    if inputs.contrastive_anchor:
        raise ValueError(f"--method {type(config).model_type} already has its contrastive loss (contrastive_loss_weight "
                         f"{config.contrastive_loss_weight}); drop --contrastive-anchor-weight")
    if inputs.pairs:
        data = _pair_training_data(config, tokenizer, inputs)
    elif config.positives == "pairs":
        raise ValueError(
            'positives="pairs" needs --pairs FILE.jsonl (one {"anchor": ..., "positive": ...} per line); '
            'or use "positives": "spans" to cut two spans from each --corpus passage'
        )
    else:
        data = span_pair_training_data(
            config, tokenizer, inputs, purpose="span positives",
            needs_text="SentMAE's span positives are two spans of each passage's text: pass the text corpus as "
                       "--corpus, or pairs with --pairs FILE.jsonl, or switch the contrastive loss off with "
                       "--method-options '{\"contrastive_loss_weight\": 0}'")
    logger.info(
        "SentMAE stage 2: RetroMAE + %s x in-batch contrastive loss (tau %s, %s similarity), positives: %s",
        config.contrastive_loss_weight, config.temperature, config.similarity, config.positives,
    )
    return data


def _pair_training_data(config: Any, tokenizer: Any, inputs: DataInputs) -> TrainingData:
    """Batches of the (anchor, positive) pairs of ``inputs.pairs``, both sides the pre-training text."""
    for flag, value in (("--corpus", inputs.corpus), ("--packing", inputs.packing), ("--streaming", inputs.streaming)):
        if value:
            raise ValueError(
                f"{flag} does not apply with --pairs: both sides of every pair are the pre-training text "
                f"(read into memory, one sequence per side); drop {flag}"
            )
    _check_in_batch_negatives(inputs, "the in-batch contrastive loss", unit="pairs")
    dataset = tokenize_pairs(read_pairs(inputs.pairs), tokenizer, max_seq_length=inputs.max_seq_length)
    _check_enough_rows(dataset, inputs, unit="pairs")
    collator = ContrastiveCollator(tokenizer, mask_ratio=config.encoder_mask_ratio,
                                   whole_word_mask=config.whole_word_mask, positives="pairs",
                                   max_length=inputs.max_seq_length)
    return TrainingData(dataset, collator, drop_last=True, corpus_name=Path(inputs.pairs).name)


def _check_in_batch_negatives(inputs: DataInputs, purpose: str, *, unit: str) -> None:
    """Refuse a global batch of one: each anchor's negatives are the other rows' positives."""
    if inputs.global_batch_size < 2:
        raise ValueError(
            f"{purpose} needs at least 2 {unit} per batch (each anchor's negatives are the other {unit}' positives), "
            f"got a global batch of {inputs.global_batch_size}: raise --per-device-train-batch-size to 2 or more"
        )


def _check_enough_rows(dataset: datasets.Dataset | datasets.IterableDataset, inputs: DataInputs, *, unit: str) -> None:
    if isinstance(dataset, datasets.Dataset) and len(dataset) < inputs.global_batch_size:
        raise ValueError(
            f"only {len(dataset)} {unit} for a global batch of {inputs.global_batch_size}: "
            "add data or lower --per-device-train-batch-size"
        )
