"""The training DataLoader's reads: a batch of token rows fetched from the Arrow table in one take, each list column
kept flat with its row lengths, so padding is one numpy scatter instead of a conversion per row."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch


class RowBatch(Sequence):
    """Rows fetched together (`ArrowRows.__getitems__`): ``columns`` maps each column to its values of all rows,
    a list column's concatenated; ``lengths`` maps each list column to its rows' lengths ``(B,)``.

    ``batch[i]`` is row i as ``datasets``' numpy format gives it (a list column's value a 1-D view into the flat
    values), so a collator that reads rows one by one works unchanged; `PretrainingCollator.pad` reads ``flat``.
    """

    def __init__(self, columns: dict[str, np.ndarray], lengths: dict[str, np.ndarray], size: int):
        self._columns = columns
        self._lengths = lengths
        self._offsets = {name: np.concatenate(([0], np.cumsum(n))) for name, n in lengths.items()}
        self._size = size

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index: int) -> dict[str, Any]:  # type: ignore[override]
        if not -self._size <= index < self._size:
            raise IndexError(f"row {index} of a batch of {self._size}")
        index %= self._size
        return {name: values[self._offsets[name][index]:self._offsets[name][index + 1]] if name in self._offsets
                else values[index] for name, values in self._columns.items()}

    def flat(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """List column ``name``'s values of all rows, concatenated, and each row's length ``(B,)``; None without it."""
        if name not in self._lengths:
            return None
        return self._columns[name], self._lengths[name]


def _flat_column(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray | None] | None:
    """A null-free list-of-numbers column as (values, row lengths); any other list column None (no flat form); a
    column of scalars as (values, None)."""
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
        return column.to_numpy(zero_copy_only=False), None
    value_type = column.type.value_type
    if column.null_count or not (pa.types.is_integer(value_type) or pa.types.is_floating(value_type)):
        return None
    array = column.combine_chunks()
    values = pc.list_flatten(array)
    if values.null_count:
        return None
    return values.to_numpy(), pc.list_value_length(array).to_numpy().astype(np.int64)


class ArrowRows(torch.utils.data.Dataset):
    """A `datasets.Dataset` read a batch at a time: ``__getitems__`` returns a `RowBatch` when every list column is
    a null-free list of numbers (token rows), else the numpy-format rows ``datasets`` gives. ``__getitem__`` gives one
    row in numpy format. Indexing (a shuffle or select) is followed; the table is not copied."""

    def __init__(self, dataset: datasets.Dataset):
        self._arrow = dataset.with_format("arrow")

    def __len__(self) -> int:
        return len(self._arrow)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: list[int]) -> RowBatch | list[dict[str, Any]]:
        table = self._arrow[indices]
        flat = {name: _flat_column(table.column(name)) for name in table.column_names}
        if any(value is None for value in flat.values()):
            return self._arrow.with_format("numpy").__getitems__(indices)
        return RowBatch({name: value for name, (value, _) in flat.items()},
                        {name: lengths for name, (_, lengths) in flat.items() if lengths is not None}, len(indices))


def array_rows(dataset: Any) -> Any:
    """`dataset` read through `ArrowRows` when it is a `datasets.Dataset` in its default format (Python lists), else
    as it is. `benchmarks/collation_speed.py` times fetching and padding a batch both ways."""
    if isinstance(dataset, datasets.Dataset) and dataset.format["type"] is None:
        return ArrowRows(dataset)
    return dataset


__all__ = ["ArrowRows", "RowBatch", "array_rows"]
