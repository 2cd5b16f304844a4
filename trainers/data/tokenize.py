"""Tokenizing a corpus once: rows or packed blocks of token ids with word-start flags."""

from __future__ import annotations

import functools
import itertools
import logging
import numbers
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import datasets
import pyarrow.compute as pc
from datasets.distributed import split_dataset_by_node

from ..inputs.parameters import check_bool
from .arrow_reading import check_text_column
from .dataset_checks import longest_sequence
from .reading import code_fingerprint
from .tokenized_record import check_tokenized_record

logger = logging.getLogger(__name__)

MIN_PACKED_BLOCK = 8  # a trailing packed block shorter than this many tokens is dropped
NUM_PROC_MIN_ROWS = 10_000  # tokenize in several processes only above this many rows


def map_processes(num_rows: int, min_rows: int, num_proc: int | None = None) -> int | None:
    """Processes for a ``Dataset.map`` over `num_rows` rows: only for more than `min_rows`, `num_proc` or by default
    ``min(4, cpus)``; None (in process) otherwise or when that is 1."""
    if num_rows <= min_rows:
        return None
    chosen = num_proc if num_proc is not None else min(4, os.cpu_count() or 1)
    return chosen if chosen > 1 else None


# [UNK] is never masked nor predicted: a corpus mostly [UNK] for its tokenizer (wrong language or script) trains nothing
MAX_UNK_SHARE = 0.5  # more [UNK] than this among the text tokens: refused
WARN_UNK_SHARE = 0.05  # more than this: a warning
UNK_SAMPLE_ROWS = 1000  # sequences the share is measured on (spread over the corpus; the first ones of a stream)
WARN_TRUNCATED_SHARE = 0.9  # truncation dropping more of the text tokens than this: a warning


def tokenize_corpus(
    dataset: datasets.Dataset | datasets.IterableDataset | Sequence[str],
    tokenizer: Any,
    *,
    max_seq_length: int,
    packing: bool = False,
    num_proc: int | None = None,
) -> datasets.Dataset | datasets.IterableDataset:
    """Tokenizes a ``"text"`` corpus once (cached for a ``Dataset``, lazy for an ``IterableDataset``).

    Truncation (``packing=False``): each passage becomes one sequence with the tokenizer's special tokens
    (``[CLS] ... [SEP]``), truncated to ``max_seq_length``. Packing (``packing=True``): passages are tokenized without
    special tokens, concatenated and cut into blocks of ``max_seq_length - num_special_tokens`` tokens, each wrapped
    with the special tokens; the last, shorter block of each ``map`` batch (1,000 passages) is kept when it has at
    least 8 tokens. Sequences without any ordinary token (empty passages) are dropped.

    A corpus whose text tokens are mostly ``[UNK]`` (more than ``MAX_UNK_SHARE``, measured on ``UNK_SAMPLE_ROWS``
    sequences) is refused: the tokenizer does not know its language or script, and ``[UNK]`` is never masked, so
    training would learn nothing; more than ``WARN_UNK_SHARE`` gets a warning.

    Args:
        dataset: A ``datasets.Dataset`` or ``datasets.IterableDataset`` with a ``"text"`` column, e.g. from
            :func:`read_corpus`, or a list of passage strings.
        tokenizer: A fast (``tokenizers``-backed) tokenizer; ``word_ids()`` gives the word boundaries.
        max_seq_length: Maximum tokens per sequence, special tokens included.
        packing: Concatenate passages into full-length blocks instead of truncating each one.
        num_proc: Processes for a ``Dataset`` with more than 10,000 rows (default ``min(4, os.cpu_count())``; 1: this
            process only); ignored otherwise.

    Returns:
        The dataset with the columns ``"input_ids"`` (token ids, special tokens included, length
        ``<= max_seq_length``) and ``"word_starts"`` (1 where a token begins a new word, special tokens included;
        0 for the continuation pieces of a word). All input columns are removed.

    Raises:
        TypeError: ``dataset`` is none of the accepted types, ``max_seq_length`` is not an integer or ``packing``
            not a bool.
        ValueError: The tokenizer is not fast, ``max_seq_length`` leaves no room for an ordinary token, or
            ``num_proc`` is below 1.
        ValueError: The ``"text"`` column does not hold strings.
        ValueError: No sequence is left (every passage is empty; not checked for an ``IterableDataset``), or the
            text is mostly ``[UNK]``. The message names the corpus (``info.dataset_name``, see :func:`read_corpus`).
    """
    dataset = _as_dataset(dataset)
    check_bool("tokenize_corpus", "packing", packing)
    if isinstance(max_seq_length, bool) or not isinstance(max_seq_length, numbers.Integral):
        raise TypeError(f"tokenize_corpus: max_seq_length={max_seq_length!r} is not a whole number of tokens; pass an "
                        "int, e.g. max_seq_length=256")
    max_seq_length = int(max_seq_length)  # e.g. a numpy integer
    if num_proc is not None and (isinstance(num_proc, bool) or not isinstance(num_proc, numbers.Integral)
                                 or num_proc < 1):
        raise ValueError(f"tokenize_corpus: num_proc={num_proc!r} is not a number of processes; pass 1 or more (or "
                         "None for min(4, CPUs))")
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            f"tokenize_corpus needs a fast tokenizer (word_ids()), got {type(tokenizer).__name__}; "
            f"load it with AutoTokenizer.from_pretrained(..., use_fast=True)"
        )
    prefix, suffix = special_template(tokenizer)
    if max_seq_length <= len(prefix) + len(suffix):
        raise ValueError(
            f"max_seq_length={max_seq_length} leaves no room for text after {len(prefix) + len(suffix)} special tokens"
        )
    fn_kwargs = {
        "tokenizer": tokenizer,
        "max_seq_length": max_seq_length,
        "prefix": prefix,
        "suffix": suffix,
        "packing": packing,
        "code": _tokenizer_fingerprint(),  # unused by the function: invalidates the cache when this code changes
    }
    features = datasets.Features(
        {
            "input_ids": datasets.Sequence(datasets.Value("int32")),
            "word_starts": datasets.Sequence(datasets.Value("int8")),
        }
    )
    if dataset.column_names is not None and "text" not in dataset.column_names:
        raise ValueError(
            f"the dataset has no 'text' column (columns: {dataset.column_names}); "
            f"read it with read_corpus or rename the passage column to 'text'"
        )
    # read_corpus names its datasets; another one may carry only its builder's name ("generator", "json")
    source = dataset.info.dataset_name if dataset.info.dataset_name != dataset.info.builder_name else None
    source = source or "the corpus"
    if dataset.features is not None:  # the command line's check: a list of two strings would be a sentence pair
        check_text_column(dataset.features, source, "text")
    if isinstance(dataset, datasets.IterableDataset):
        tokenized = dataset.map(
            _tokenize_batch, batched=True, fn_kwargs=fn_kwargs, remove_columns=dataset.column_names, features=features
        ).select_columns(["input_ids", "word_starts"])
        _check_unknown_tokens(tokenized, tokenizer, source)
        return tokenized
    tokenized = dataset.map(
        _tokenize_batch,
        batched=True,
        fn_kwargs=fn_kwargs,
        remove_columns=dataset.column_names,
        features=features,
        num_proc=map_processes(len(dataset), NUM_PROC_MIN_ROWS, num_proc),
        desc="Tokenizing (packing)" if packing else "Tokenizing",
    )
    if len(tokenized) == 0:
        raise ValueError(
            f"no sequence left after tokenizing {len(dataset)} passages of {source}: every passage is empty (or holds "
            f"only characters the tokenizer drops); check that the corpus 'text' column holds text"
        )
    logger.info("Tokenized %d passages into %d sequences (packing=%s)", len(dataset), len(tokenized), packing)
    if not packing:
        report_truncation(dataset, tokenizer, max_seq_length - len(prefix) - len(suffix), source)
    _check_unknown_tokens(tokenized, tokenizer, source)
    return tokenized


def sample_rows(total: int) -> list[int] | range:
    """The rows a share is measured on: `UNK_SAMPLE_ROWS` spread evenly over `total`, or all of them."""
    return [i * total // UNK_SAMPLE_ROWS for i in range(UNK_SAMPLE_ROWS)] if total > UNK_SAMPLE_ROWS else range(total)


def report_truncation(passages: datasets.Dataset | Sequence[str], tokenizer: Any, room: int, source: str,
                      fix: str = "pack them into full sequences (--packing, where the method takes it) or raise "
                                 "--max-seq-length") -> None:
    """Log the share of the text tokens that truncating each passage (a "text" Dataset or strings) to `room` text
    tokens drops, measured on `UNK_SAMPLE_ROWS` passages spread over them; above `WARN_TRUNCATED_SHARE` a warning
    that adds `fix` (a .txt read as blocks has had its own warning, naming the empty line: `auto_blocks_note`)."""
    total = len(passages)
    rows = sample_rows(total)
    texts = passages.select(rows)["text"] if isinstance(passages, datasets.Dataset) else [passages[i] for i in rows]
    lengths = [len(ids) for ids in tokenizer([text or "" for text in texts], add_special_tokens=False, verbose=False,
                                             return_attention_mask=False, return_token_type_ids=False)["input_ids"]]
    dropped = sum(max(0, length - room) for length in lengths)
    if not dropped:
        return
    share = dropped / sum(lengths)
    sample = f"a sample of {len(lengths)} passages" if total > UNK_SAMPLE_ROWS else f"all {total} passages"
    message = (f"truncation to the sequence length drops {share_text(share)} of the text tokens of {source} "
               f"({sample}, up to {max(lengths)} tokens each)")
    if share <= WARN_TRUNCATED_SHARE:
        logger.info("%s", message)
        return
    logger.warning("%s: %s", message, fix)


def share_text(share: float) -> str:
    """`share` as a percentage with one decimal that reads 100% only when it is 1 (99.99% is "over 99.9%")."""
    text = f"{share:.1%}"
    return "over 99.9%" if text == "100.0%" and share < 1 else text


def _as_dataset(corpus: Any) -> datasets.Dataset | datasets.IterableDataset:
    """``corpus`` as a dataset: a list (or tuple) of passage strings becomes one with a ``"text"`` column.

    Raises:
        TypeError: anything else, naming the accepted types.
    """
    if isinstance(corpus, datasets.Dataset | datasets.IterableDataset):
        return corpus
    if isinstance(corpus, list | tuple):
        other = next((item for item in corpus if not isinstance(item, str)), None)
        if other is None:
            return datasets.Dataset.from_dict({"text": list(corpus)},
                                              features=datasets.Features({"text": datasets.Value("string")}))
        got = f"a {type(corpus).__name__} holding {type(other).__name__}"
    else:
        got = type(corpus).__name__
    raise TypeError(f"tokenize_corpus takes a datasets.Dataset, datasets.IterableDataset or a list of strings (one "
                    f"passage each; for files, read_corpus(path)), got {got}")


SAVED_DATASET_FILES = ("dataset_info.json", "state.json", "dataset_dict.json")  # what save_to_disk writes


def saved_token_rows(source: str | os.PathLike | None, text_column: str = "text") -> datasets.Dataset | None:
    """The rows of a `save_to_disk` folder that hold "input_ids" (of its "train" split or its only one), unchecked;
    None for anything else. Raises ValueError when such a folder cannot be loaded, or also holds the text
    (`text_column`): which of the two to train is the user's choice."""
    if source is None:
        return None
    path = Path(source).expanduser()
    if not path.is_dir() or not any((path / name).is_file() for name in SAVED_DATASET_FILES):
        return None
    try:
        loaded = datasets.load_from_disk(str(path))
    except (OSError, ValueError) as error:  # a file of the folder missing or damaged (json, arrow)
        raise ValueError(f"--corpus {source}: this `save_to_disk` folder cannot be loaded ({type(error).__name__}: "
                         f"{' '.join(str(error).split())[:300]}); save it again") from None
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded and len(loaded) != 1:
            return None  # read_corpus names the splits
        loaded = loaded["train"] if "train" in loaded else next(iter(loaded.values()))
    if "input_ids" not in loaded.column_names:
        return None
    if text_column in loaded.column_names:
        raise ValueError(f"--corpus {source} holds both a {text_column!r} column and an 'input_ids' column, and "
                         f"either could be the corpus: to train the text, save it without the ids "
                         f"(dataset.remove_columns('input_ids').save_to_disk(...)); to train the ids, without the text "
                         f"(dataset.remove_columns('{text_column}'))")
    return loaded


def load_tokenized_corpus(
    source: str | os.PathLike | None, tokenizer: Any, *, max_seq_length: int, streaming: bool = False,
    text_column: str = "text",
) -> datasets.Dataset | datasets.IterableDataset | None:
    """A pre-tokenised corpus: a ``save_to_disk`` folder whose rows already hold ``"input_ids"`` (e.g.
    ``tokenize_corpus(...).save_to_disk(folder)``: tokenise once, train many times), or None when ``source`` is
    anything else (text, read by ``read_corpus``).

    The rows are used as saved (special tokens included); ``"word_starts"`` is kept when present (without it every
    token is its own word for whole-word masking). A ``DatasetDict`` gives its ``"train"`` split, or its only one.
    A folder saved by ``pretrain --save-tokenized`` records its tokenizer and length (``TOKENIZED_RECORD``), and
    trains only with the same ones; without the record, a row longer than ``max_seq_length`` is refused and
    shorter rows get a warning.

    Raises:
        ValueError: in one line naming the folder and the fix, when the recorded tokenizer or ``max_seq_length`` is
            not the run's, a token id is not one of the tokenizer's (``>= len(tokenizer)`` or negative), a row (of a
            sample spread over the corpus) does not start and end with the special tokens the tokenizer puts around a
            text (another tokenizer's ids), a row is longer than ``max_seq_length``, the ``input_ids`` are not lists
            of integers, the folder holds no rows, or it holds a ``text_column`` too.
    """
    loaded = saved_token_rows(source, text_column)
    if loaded is None:
        return None
    where = f"--corpus {source}"
    feature = loaded.features["input_ids"]
    inner = getattr(feature, "feature", None)
    if not str(getattr(inner, "dtype", "")).startswith(("int", "uint")):
        raise ValueError(f"{where}: its 'input_ids' column holds {feature!r}, not lists of token ids; save the result "
                         "of retromae.tokenize_corpus (or lists of integer ids) there")
    if len(loaded) == 0:
        raise ValueError(f"{where} holds no rows: the pre-tokenised corpus is empty")
    recorded = check_tokenized_record(Path(source).expanduser(), where, tokenizer, max_seq_length)
    loaded = loaded.select_columns([name for name in ("input_ids", "word_starts") if name in loaded.column_names])
    _check_token_ids(loaded, tokenizer, where)
    _check_row_ends(loaded, tokenizer, where)
    longest = longest_sequence(loaded) or 0
    if longest > max_seq_length:
        raise ValueError(f"{where} holds rows of up to {longest} tokens, but --max-seq-length is {max_seq_length}: "
                         f"raise --max-seq-length to {longest} or tokenise the text again with the shorter length")
    if not recorded and longest < max_seq_length:
        logger.warning("%s records no tokenized length (it was not saved by --save-tokenized) and its longest row has "
                       "%d tokens, under --max-seq-length %d: if it was tokenized at %d, longer passages were cut "
                       "there, and this run trains on sequences of up to %d tokens", where, longest, max_seq_length,
                       longest, longest)
    if "word_starts" not in loaded.column_names:
        logger.warning("%s has no 'word_starts' column: whole-word masking masks single tokens", where)
    logger.info("Pre-tokenised corpus %s: %d sequences of up to %d tokens", source, len(loaded), longest)
    # streamed in up to 64 shards, in order: shuffled by the buffer's seed, and split among DDP processes
    corpus = loaded.to_iterable_dataset(num_shards=min(len(loaded), 64)) if streaming else loaded
    corpus.info.dataset_name = str(source)
    return corpus


def _check_token_ids(rows: datasets.Dataset, tokenizer: Any, where: str) -> None:
    """Refuse an id the tokenizer does not have (``>= len(tokenizer)`` or negative)."""
    flat = pc.list_flatten(rows.data.column("input_ids"))
    bounds = pc.min_max(flat).as_py() if len(flat) else {"min": None, "max": None}
    vocabulary = len(tokenizer)
    if bounds["max"] is not None and (bounds["max"] >= vocabulary or bounds["min"] < 0):
        bad = bounds["max"] if bounds["max"] >= vocabulary else bounds["min"]
        raise ValueError(f"{where} holds token id {bad}, but the tokenizer {tokenizer.name_or_path} has ids 0 to "
                         f"{vocabulary - 1}: it was tokenised with another tokenizer; tokenise the text again with "
                         "this one (or pass the tokenizer it was made with, --tokenizer)")


def _check_row_ends(rows: datasets.Dataset, tokenizer: Any, where: str) -> None:
    """Refuse rows (`UNK_SAMPLE_ROWS` spread over them) that do not start with the special tokens the tokenizer puts
    before a text and end with those it puts after (``[CLS] ... [SEP]``), as every row of `tokenize_corpus` does,
    packed or not: position 0 is the sentence embedding, and other ids are another tokenizer's (or no token rows)."""
    prefix, suffix = special_template(tokenizer)
    indices = sample_rows(len(rows))
    for index, ids in zip(indices, rows.with_format(None).select(indices)["input_ids"], strict=True):
        ends = (("starts", ids[:len(prefix)], prefix), ("ends", ids[max(0, len(ids) - len(suffix)):], suffix))
        for end, found, expected in ends:
            if found != expected:
                raise ValueError(
                    f"{where}: row {index} {end} with {_shown(tokenizer, found)}, not {_shown(tokenizer, expected)}, "
                    f"which the tokenizer {tokenizer.name_or_path} {end} every text with: the rows were made by "
                    "another tokenizer (or are not token rows); tokenize the text again with this run's --model (or "
                    "--tokenizer) and --save-tokenized FOLDER")


def _shown(tokenizer: Any, ids: list[int]) -> str:
    """Token ids as this tokenizer reads them: "[CLS] (101)"."""
    tokens = tokenizer.convert_ids_to_tokens(ids)
    return " ".join(f"{token} ({token_id})" for token, token_id in zip(tokens, ids, strict=True)) or "nothing"


def shuffle_stream(
    dataset: datasets.Dataset | datasets.IterableDataset, buffer_size: int, seed: int
) -> datasets.Dataset | datasets.IterableDataset:
    """A streamed corpus (``IterableDataset``) read through a shuffle buffer of ``buffer_size`` rows (and its shards
    in a shuffled order), seeded by ``seed``; the order changes with ``set_epoch`` (the Trainer's epochs). A
    ``Dataset`` (shuffled by the Trainer's sampler) or ``buffer_size`` 0 is returned unchanged (file order).

    Raises:
        ValueError: ``buffer_size`` is negative.
    """
    if isinstance(buffer_size, bool) or not isinstance(buffer_size, numbers.Integral) or buffer_size < 0:
        raise ValueError(f"--shuffle-buffer {buffer_size}: give a number of sequences, 0 to keep the file order")
    if not isinstance(dataset, datasets.IterableDataset) or buffer_size == 0:
        return dataset
    return dataset.shuffle(seed=seed, buffer_size=int(buffer_size))


def unknown_token_share(tokenizer: Any, rows: Iterable[Sequence[int]]) -> float | None:
    """The share of ``[UNK]`` among the text tokens (all but the other special tokens) of ``rows`` of token ids;
    None when the tokenizer has no unknown token (byte-level BPE) or the rows hold no text token."""
    unk = tokenizer.unk_token_id
    if unk is None:
        return None
    counts = Counter(token for ids in rows for token in ids)
    others = set(tokenizer.all_special_ids) - {unk}
    text = sum(count for token, count in counts.items() if token not in others)
    return counts[unk] / text if text else None


def _check_unknown_tokens(
    tokenized: datasets.Dataset | datasets.IterableDataset, tokenizer: Any, source: str
) -> None:
    """Refuse a corpus mostly ``[UNK]`` for ``tokenizer`` (``MAX_UNK_SHARE``), warn above ``WARN_UNK_SHARE``."""
    if isinstance(tokenized, datasets.IterableDataset):
        rows = [row["input_ids"] for row in itertools.islice(tokenized, UNK_SAMPLE_ROWS)]
        sample = f"the first {len(rows)} sequences of the stream"
    else:
        total = len(tokenized)
        rows = tokenized.select(sample_rows(total))["input_ids"]
        sample = f"a sample of {len(rows)} of {total} sequences" if total > UNK_SAMPLE_ROWS else f"all {total} sequences"
    share = unknown_token_share(tokenizer, rows)
    if share is None or share <= WARN_UNK_SHARE:
        return
    message = (f"{share:.0%} of the text tokens of {source} are [UNK] ({sample}): the tokenizer "
               f"{tokenizer.name_or_path} does not know the corpus's language or script")
    if share > MAX_UNK_SHARE:
        raise ValueError(f"{message}; [UNK] is never masked, so training would learn nothing: use a model and "
                         "tokenizer made for this language (--model, --tokenizer), or check that this is the corpus "
                         "meant")
    logger.warning("%s; training learns nothing from [UNK]", message)


@functools.lru_cache(maxsize=1)
def _tokenizer_fingerprint() -> str:
    return code_fingerprint(_tokenize_batch, _packed_blocks, word_start_flags)


def special_template(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The special ids the tokenizer puts before and after a single sequence, e.g. ``([CLS], [SEP])``.

    transformers 5 fast tokenizers have no ``build_inputs_with_special_tokens``; the post-processor's template is read
    off a probe encoding instead (specials = positions whose ``word_ids()`` is ``None``).
    """
    probe = tokenizer("hello world", add_special_tokens=True, return_attention_mask=False, return_token_type_ids=False)
    ids, word_ids = probe["input_ids"], probe.word_ids()
    ordinary = [i for i, word in enumerate(word_ids) if word is not None]
    if not ordinary:
        raise ValueError(f"{type(tokenizer).__name__} produced no ordinary token for 'hello world'")
    prefix, suffix = ids[: ordinary[0]], ids[ordinary[-1] + 1 :]
    expected = tokenizer.num_special_tokens_to_add(pair=False)
    if len(prefix) + len(suffix) != expected:
        raise ValueError(
            f"{type(tokenizer).__name__} adds {expected} special tokens but only {len(prefix) + len(suffix)} "
            f"surround the text; packing supports tokenizers whose template is prefix + text + suffix"
        )
    return prefix, suffix


def word_start_flags(word_ids: list[int | None]) -> list[int]:
    """1 where a token begins a word (special tokens, ``None``, included), 0 for a word's continuation pieces."""
    starts, previous = [], None
    for word in word_ids:
        starts.append(1 if word is None or word != previous else 0)
        previous = word
    return starts


def _tokenize_batch(
    batch: dict[str, list], tokenizer: Any, max_seq_length: int, prefix: list[int], suffix: list[int], packing: bool,
    code: str = "",
) -> dict[str, list]:
    """Without packing, one truncated ``[CLS] ... [SEP]`` sequence per non-empty passage; with packing, the batch's
    passages concatenated and cut into ``prefix + block + suffix`` sequences."""
    texts = [text or "" for text in batch["text"]]
    options = {"add_special_tokens": False, "verbose": False} if packing else {"truncation": True, "max_length": max_seq_length}
    encoding = tokenizer(texts, return_attention_mask=False, return_token_type_ids=False, **options)
    rows = [(ids, encoding.word_ids(row)) for row, ids in enumerate(encoding["input_ids"])]
    if packing:
        return _packed_blocks(rows, max_seq_length - len(prefix) - len(suffix), prefix, suffix)
    kept = [(ids, word_start_flags(word_ids)) for ids, word_ids in rows if any(w is not None for w in word_ids)]
    return {"input_ids": [ids for ids, _ in kept], "word_starts": [starts for _, starts in kept]}


def _packed_blocks(
    rows: list[tuple[list[int], list[int | None]]], block: int, prefix: list[int], suffix: list[int]
) -> dict[str, list]:
    """The rows' ids, concatenated, in blocks of ``block`` ids between ``prefix`` and ``suffix``; a last block
    shorter than ``min(block, MIN_PACKED_BLOCK)`` is dropped."""
    flat_ids = [token for ids, _ in rows for token in ids]
    flat_starts = [start for _, word_ids in rows for start in word_start_flags(word_ids)]
    input_ids, word_starts = [], []
    for start in range(0, len(flat_ids), block):
        ids, starts = flat_ids[start : start + block], flat_starts[start : start + block]
        if len(ids) < min(block, MIN_PACKED_BLOCK):
            break
        starts[0] = 1  # a word cut at the block edge starts a new unit
        input_ids.append(prefix + ids + suffix)
        word_starts.append([1] * len(prefix) + starts + [1] * len(suffix))
    return {"input_ids": input_ids, "word_starts": word_starts}


def rank_stream(dataset: datasets.IterableDataset, rank: int, world_size: int) -> datasets.IterableDataset:
    """The part of a stream that process ``rank`` of ``world_size`` trains on (``split_dataset_by_node``): whole shards
    (files) when their number divides by ``world_size``, else every ``world_size``-th row. The parts are disjoint and
    together the whole stream; a seeded shuffle (``shuffle_stream``) is the same on every process, so it stays so."""
    return split_dataset_by_node(dataset, rank=rank, world_size=world_size) if world_size > 1 else dataset


__all__ = [
    "load_tokenized_corpus", "rank_stream", "report_truncation", "saved_token_rows", "shuffle_stream",
    "special_template", "tokenize_corpus", "unknown_token_share", "word_start_flags",
]
