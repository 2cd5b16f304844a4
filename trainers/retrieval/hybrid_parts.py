"""What a DupMAE sentence-transformers model gives a hybrid index: its pooling module and fingerprint, and its
outputs as dense arrays and CSR rows."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from retromae.modeling.st_dupmae import is_dupmae_pooling

QUERY_SIDE_SETTINGS = ("query_top_k", "chunk_size")  # pooling settings that leave the documents unchanged


def check_queries(queries: Any) -> None:
    """Refuses a string (not a list of queries) and an empty or blank query, naming its position."""
    if isinstance(queries, str):
        raise TypeError("queries must be a list of strings, not a string")
    for i, query in enumerate(queries):
        if not isinstance(query, str) or not query.strip():
            raise ValueError(f"query {i} is empty: {query!r}; a query needs at least one non-space character")


def dupmae_pooling(model: Any):
    for module in model.modules():
        if is_dupmae_pooling(module):
            return module
    raise ValueError(
        f"{type(model).__name__} has no DupMAEPooling module: export the encoder with "
        "retromae.trainers.export.sentence_transformer.build_dupmae_sentence_transformer"
    )


def model_fingerprint(model: torch.nn.Module) -> str:
    """A content hash of a DupMAE SentenceTransformer: the pooling module's config and every weight of the model
    (names, dtypes, shapes, bytes). Equal models -- also when one was saved and reloaded, or loaded as remote code --
    give equal fingerprints; any changed weight or document-side setting gives a different one. `query_top_k` and
    `chunk_size` are left out: they do not change the stored documents. Cost: one pass over the weights (~0.5 s for
    BERT-base)."""
    digest = hashlib.blake2b(digest_size=16)
    config = {k: v for k, v in dupmae_pooling(model).get_config_dict().items() if k not in QUERY_SIDE_SETTINGS}
    for key in ("head_dense_bias", "head_norm_bias"):  # added for ModernBERT heads: at their default (True), a
        if config.get(key, True) is True:  # model hashes as before the keys existed (indexes built then still open)
            config.pop(key, None)
    digest.update(json.dumps(config, sort_keys=True).encode())
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}".encode())
        digest.update(tensor.view(torch.uint8).numpy().data if tensor.numel() else b"")
    return digest.hexdigest()


def as_numpy(x: Any, dtype=np.float32) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        x = (x.float() if x.is_floating_point() else x).numpy()
    return np.ascontiguousarray(np.asarray(x), dtype=dtype)


def top_columns(scores: np.ndarray, n: int) -> np.ndarray:
    """Column indices of the `n` largest entries of each row of `scores` `(Q, m)`, best first."""
    if scores.shape[1] > n:
        part = np.argpartition(-scores, n - 1, axis=1)[:, :n]
    else:
        part = np.broadcast_to(np.arange(scores.shape[1]), scores.shape)
    order = np.argsort(-np.take_along_axis(scores, part, 1), axis=1, kind="stable")
    return np.take_along_axis(part, order, 1)


def document_parts(outputs: list[dict[str, Any]], pooling: Any) -> dict[str, np.ndarray]:
    parts: dict[str, np.ndarray] = {}
    if pooling.has_dense:
        parts["dense"] = np.stack([as_numpy(o["dense_embedding"]) for o in outputs])
    if pooling.has_sparse:
        if "sparse_indices" in outputs[0]:
            parts["sparse_indices"] = np.stack([as_numpy(o["sparse_indices"], np.int64) for o in outputs])
            parts["sparse_values"] = np.stack([as_numpy(o["sparse_values"]) for o in outputs])
        else:  # doc_top_k == vocab_size: every entry is kept
            mu = np.stack([as_numpy(o["sparse_embedding"]) for o in outputs])
            parts["sparse_indices"] = np.broadcast_to(np.arange(mu.shape[1]), mu.shape)
            parts["sparse_values"] = mu
    return parts


def queries_sparse(outputs: list[dict[str, Any]], pooling: Any) -> Any:
    """The queries' OT parts: a dense `(Q, V)` array for the full mu, CSR when `query_top_k` sparsified them."""
    if "sparse_indices" in outputs[0]:
        indices = np.stack([as_numpy(o["sparse_indices"], np.int64) for o in outputs])
        values = np.stack([as_numpy(o["sparse_values"]) for o in outputs])
        num, k = indices.shape
        return sp.csr_matrix(
            (values.reshape(-1), indices.reshape(-1), np.arange(0, num * k + 1, k)), shape=(num, pooling.vocab_size)
        )
    return np.stack([as_numpy(o["sparse_embedding"]) for o in outputs])


class HybridIndexBase:
    """What every engine of DupMAE's hybrid index shares: the sizes of its parts, the checks of documents, queries
    and the encoding model, and `search_texts` over the engine's `search(dense, sparse, top_n)`.

    Args: dense_dim, vocab_size, doc_top_k, model_fingerprint and candidates as `HybridIndex`.
    """

    def __init__(self, dense_dim: int | None, vocab_size: int, doc_top_k: int | None, *,
                 model_fingerprint: str | None = None, candidates: int | None = None):
        if vocab_size < 1:
            raise ValueError(f"vocab_size={vocab_size} must be >= 1")
        if dense_dim is None and doc_top_k is None:
            raise ValueError("an index needs a dense part (dense_dim) or a sparse part (doc_top_k), or both")
        if dense_dim is not None and dense_dim < 1:
            raise ValueError(f"dense_dim={dense_dim} must be >= 1 (None: no dense part)")
        if doc_top_k is not None and not 1 <= doc_top_k <= vocab_size:
            raise ValueError(f"doc_top_k={doc_top_k} must lie in [1, vocab_size={vocab_size}] (None: no sparse part)")
        if candidates is not None and candidates < 1:
            raise ValueError(f"candidates={candidates} must be >= 1")
        self.dense_dim, self.vocab_size, self.doc_top_k = dense_dim, vocab_size, doc_top_k
        self.model_fingerprint = model_fingerprint
        self.ids: list[str] = []

    def __len__(self) -> int:
        return len(self.ids)

    def search_texts(
        self, model: Any, queries: Sequence[str], top_n: int = 10, batch_size: int = 32, verify_model: bool = True
    ) -> list[list[tuple[str, float]]]:
        """Encode `queries` with `model` (`encode_query`: full mu, or `query_top_k`) and search.

        `verify_model=False` skips the fingerprint check (one pass over the model's weights per call).

        Returns:
            Per query, `top_n` `(document id, score)` pairs, best first.

        Raises:
            ValueError: an empty query; `ValueError` when `model` is not the model that built the index.
        """
        check_queries(queries)
        if verify_model:
            self.check_fingerprint(model_fingerprint(model))
        if not queries:
            return []
        pooling = dupmae_pooling(model)
        outputs = model.encode_query(list(queries), batch_size=batch_size, output_value=None)
        dense = np.stack([as_numpy(o["dense_embedding"]) for o in outputs]) if pooling.has_dense else None
        sparse = queries_sparse(outputs, pooling) if pooling.has_sparse else None
        scores, positions = self.search(dense, sparse, top_n)
        return [  # a position of -1: an engine found fewer candidates than top_n
            [(self.ids[p], float(s)) for s, p in zip(row_s, row_p, strict=True) if p >= 0]
            for row_s, row_p in zip(scores, positions, strict=True)
        ]

    def check_fingerprint(self, fingerprint: str | None) -> None:
        """Refuse queries encoded by another model than the index's (None = not checked)."""
        if fingerprint is not None and self.model_fingerprint is not None and fingerprint != self.model_fingerprint:
            raise ValueError(
                f"this index was built with model {self.model_fingerprint} but the queries come from model "
                f"{fingerprint}; scores across models are meaningless -- rebuild the index with this model"
            )

    def _check_queries(self, query_dense: Any, query_sparse: Any) -> tuple[np.ndarray | None, Any, int]:
        num = None
        q_dense = q_sparse = None
        if self.dense_dim is not None:
            if query_dense is None:
                raise ValueError("this index has a dense part: pass query_dense")
            q_dense = as_numpy(query_dense)
            if q_dense.ndim != 2 or q_dense.shape[1] != self.dense_dim:
                raise ValueError(
                    f"query_dense has shape {q_dense.shape}, expected (num_queries, {self.dense_dim})"
                )
            num = q_dense.shape[0]
        if self.doc_top_k is not None:
            if query_sparse is None:
                raise ValueError("this index has a sparse part: pass query_sparse")
            q_sparse = (
                sp.csr_matrix(query_sparse, dtype=np.float32) if sp.issparse(query_sparse) else as_numpy(query_sparse)
            )
            if q_sparse.ndim != 2 or q_sparse.shape[1] != self.vocab_size:
                raise ValueError(
                    f"query_sparse has shape {q_sparse.shape}, expected (num_queries, {self.vocab_size})"
                )
            if num is not None and q_sparse.shape[0] != num:
                raise ValueError(f"{num} dense but {q_sparse.shape[0]} sparse queries")
            num = q_sparse.shape[0]
        return q_dense, q_sparse, num

    def _check_documents(self, ids: Sequence[str], dense: Any, sparse_indices: Any, sparse_values: Any
                         ) -> tuple[list[str], np.ndarray | None, np.ndarray | None, np.ndarray | None]:
        """`add`'s arguments checked against the index: the ids as strings, the dense parts `(n, dense_dim)`, the
        sparse ids and weights `(n, doc_top_k)` (None for a part the index lacks)."""
        n = len(ids)
        idx = val = None
        if self.dense_dim is not None:
            dense = as_numpy(dense)
            if dense.shape != (n, self.dense_dim):
                raise ValueError(f"dense has shape {dense.shape}, expected ({n}, {self.dense_dim})")
        if self.doc_top_k is not None:
            idx, val = as_numpy(sparse_indices, np.int64), as_numpy(sparse_values)
            if idx.shape != (n, self.doc_top_k) or val.shape != (n, self.doc_top_k):
                raise ValueError(
                    f"sparse_indices {idx.shape} / sparse_values {val.shape}, expected ({n}, {self.doc_top_k}) each"
                )
            if n and (idx.min() < 0 or idx.max() >= self.vocab_size):
                raise ValueError(f"sparse_indices outside [0, vocab_size={self.vocab_size})")
        new_ids = [str(i) for i in ids]
        if len(set(new_ids)) != n or set(new_ids) & set(self.ids):
            raise ValueError("document ids must be unique")
        return new_ids, dense if self.dense_dim is not None else None, idx, val


