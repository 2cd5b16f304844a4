"""What a DupMAE sentence-transformers model gives a hybrid index: its pooling module and fingerprint, and its
outputs as dense arrays and CSR rows."""

from __future__ import annotations

import hashlib
import json
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
