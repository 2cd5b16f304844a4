"""`ArrowRows` / `RowBatch`: a batch fetched in one Arrow take pads to exactly what the rows one by one give."""

from __future__ import annotations

import pickle

import datasets
import numpy as np
import pytest
import torch
from retromae.trainers.data.builtin import builtin_corpus
from retromae.trainers.data.collator import PretrainingCollator
from retromae.trainers.data.pairs import ContrastiveCollator
from retromae.trainers.data.token_rows import ArrowRows, RowBatch, array_rows
from retromae.trainers.data.tokenize import tokenize_corpus

pytestmark = pytest.mark.usefixtures("datasets_cache")
INDICES = [5, 0, 17, 3, 3, 11]  # out of order, one row twice


@pytest.fixture(scope="module")
def rows(tokenizer) -> datasets.Dataset:
    """18 tokenized passages of 16..90 tokens, as `tokenize_corpus` stores them."""
    return tokenize_corpus(builtin_corpus().select(range(18)), tokenizer, max_seq_length=16 + 74)


def one_by_one(dataset: datasets.Dataset, indices: list[int]) -> list[dict]:
    return [dataset[i] for i in indices]  # Python lists, the default format


def assert_same_padding(collator, fetched, expected) -> None:
    padded, reference = collator.pad(fetched), collator.pad(expected)
    assert set(padded) == set(reference)
    assert all(torch.equal(padded[key], reference[key]) and padded[key].dtype == reference[key].dtype
               for key in reference)


def test_a_batch_pads_as_its_rows_one_by_one(tokenizer, rows):
    batch = ArrowRows(rows).__getitems__(INDICES)
    assert isinstance(batch, RowBatch) and len(batch) == len(INDICES)
    assert len({len(rows[i]["input_ids"]) for i in INDICES}) > 2, "rows of different lengths"
    assert_same_padding(PretrainingCollator(tokenizer), batch, one_by_one(rows, INDICES))


@pytest.mark.parametrize("change", ["shuffle", "select", "chunks", "no_word_starts", "int64_starts"])
def test_indexing_chunks_and_columns_are_followed(tokenizer, rows, change):
    """A shuffled or selected dataset reads through its index mapping; a table of several chunks, a dataset
    without word starts and other integer types pad the same."""
    dataset = {
        "shuffle": lambda: rows.shuffle(seed=0),
        "select": lambda: rows.select([9, 2, 14, 7, 0, 1, 3, 4, 5, 6, 8, 10, 11, 12, 13, 15, 16, 17]),
        "chunks": lambda: datasets.concatenate_datasets([rows.select(range(9)), rows.select(range(9, 18))]),
        "no_word_starts": lambda: rows.remove_columns("word_starts"),
        "int64_starts": lambda: rows.cast_column("word_starts", datasets.List(datasets.Value("int64"))),
    }[change]()
    batch = ArrowRows(dataset).__getitems__(INDICES)
    assert isinstance(batch, RowBatch)
    assert_same_padding(PretrainingCollator(tokenizer), batch, one_by_one(dataset, INDICES))


def test_rows_of_a_batch_read_as_numpy_rows(rows):
    """`batch[i]` is what `datasets`' numpy format gives, so collators that read rows one by one work unchanged."""
    batch, numpy_rows = ArrowRows(rows).__getitems__(INDICES), rows.with_format("numpy")
    for position, index in enumerate(INDICES):
        row, expected = batch[position], numpy_rows[index]
        assert set(row) == set(expected) and all(np.array_equal(row[key], expected[key]) for key in expected)
    assert np.array_equal(batch[-1]["input_ids"], batch[len(INDICES) - 1]["input_ids"])
    with pytest.raises(IndexError):
        batch[len(INDICES)]
    assert [r["input_ids"].tolist() for r in batch] == [rows[i]["input_ids"] for i in INDICES]


def test_columns_of_scalars_ride_along(tokenizer, rows):
    """A dataset that kept other columns (an id, the text) still reads as one batch; its rows carry them."""
    dataset = rows.add_column("doc_id", list(range(100, 118))).add_column("text", [f"t{i}" for i in range(18)])
    batch = ArrowRows(dataset).__getitems__(INDICES)
    assert isinstance(batch, RowBatch)
    assert [(int(row["doc_id"]), str(row["text"])) for row in batch] == [(100 + i, f"t{i}") for i in INDICES]
    assert_same_padding(PretrainingCollator(tokenizer), batch, one_by_one(dataset, INDICES))


def test_a_column_with_missing_rows_reads_as_numpy_rows(tokenizer, rows):
    """A null in a list column has no flat form: the batch falls back to `datasets`' numpy rows and pads the same."""
    starts = [None if i == 3 else row for i, row in enumerate(rows["word_starts"])]
    dataset = rows.remove_columns("word_starts").add_column("word_starts", starts)
    batch = ArrowRows(dataset).__getitems__(INDICES)
    assert isinstance(batch, list)
    assert_same_padding(PretrainingCollator(tokenizer), batch, one_by_one(dataset, INDICES))


def test_word_starts_of_another_length_are_refused(tokenizer):
    batch = RowBatch({"input_ids": np.arange(5), "word_starts": np.ones(4, dtype=np.int8)},
                     {"input_ids": np.array([2, 3]), "word_starts": np.array([2, 2])}, 2)
    with pytest.raises(ValueError, match="'word_starts' must have the length of its 'input_ids'"):
        PretrainingCollator(tokenizer).pad(batch)


@pytest.mark.parametrize("positives", ["spans", "pairs"])
def test_contrastive_batches_pad_as_their_rows(tokenizer, rows, positives):
    dataset = rows
    if positives == "pairs":
        dataset = rows.add_column("positive_input_ids", rows["input_ids"][::-1])
        dataset = dataset.add_column("positive_word_starts", rows["word_starts"][::-1])
    collator = ContrastiveCollator(tokenizer, positives=positives)
    fetched, expected = ArrowRows(dataset).__getitems__(INDICES), one_by_one(dataset, INDICES)
    assert_same_padding(collator, fetched, expected)
    masked = [collator.mask_batch(collator.pad(f), torch.Generator().manual_seed(0)) for f in (fetched, expected)]
    assert all(torch.equal(masked[0][key], masked[1][key]) for key in masked[1])


def test_a_worker_unpickles_the_same_reader(tokenizer, rows):
    """DataLoader workers receive the reader pickled."""
    reader = array_rows(rows.shuffle(seed=1))
    copy = pickle.loads(pickle.dumps(reader))
    assert len(copy) == len(reader)
    assert_same_padding(PretrainingCollator(tokenizer), copy.__getitems__(INDICES), reader.__getitems__(INDICES))
    assert set(copy[4]) == {"input_ids", "word_starts"}


def test_only_default_format_datasets_are_wrapped(rows):
    assert isinstance(array_rows(rows), ArrowRows)
    for given in (rows.with_format("torch"), rows.to_iterable_dataset(), [{"input_ids": [1, 2]}]):
        assert array_rows(given) is given
