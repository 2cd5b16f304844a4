"""sentence-transformers module for DupMAE's hybrid representation (paper §3.4): [W^cls h ; top-k(mu)].

Loaded as remote code from the root of an exported model (modules.json type ``"st_dupmae.DupMAEPooling"``,
`SentenceTransformer(path, trust_remote_code=True)`); imports torch, transformers, sentence-transformers and our
`layers_dupmae.py` only. Never imported by `modeling_*.py` (STYLE R1).

Query or document? sentence-transformers 6.2 passes a `task` keyword to every module that lists it in
`forward_kwargs`: `model.encode_query(...)` runs the modules with ``task="query"``, `model.encode_document(...)` with
``task="document"``, plain `model.encode(...)` with ``task=None`` (treated as a document, as sentence-transformers'
own token-pooling modules do). Training losses call the model without the keyword and leave the column's task (from
the trainer's `router_mapping`) in ``features["task"]``, which is read when the keyword is absent, as `Router` does.
"""

import shutil
from pathlib import Path
from typing import Any

import torch
from sentence_transformers.base.modules import Module
from torch import nn
from transformers.activations import ACT2FN

from .layers_dupmae import OT_ACTIVATIONS, activate_ot, ordinary_token_mask, token_max_logits

REPRESENTATIONS = ("hybrid", "cls", "ot")


class _HeadTransform(nn.Module):
    """BERT's MLM-head transform (dense -> activation -> LayerNorm); names as `BertPredictionHeadTransform`."""

    def __init__(self, hidden_size: int, hidden_act: str, layer_norm_eps: float):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.transform_act_fn = ACT2FN[hidden_act]
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.transform_act_fn(self.dense(hidden)))


class DupMAEPooling(Module):
    """DupMAE pooling: token embeddings -> dense [CLS] part + sparse OT part, concatenated.

    Adds to `features`:
        ``dense_embedding`` `(batch_size, dense_dim)`: W^cls h (eq. 10), h = token_embeddings[:, 0] (BERT's [CLS],
            right padding); h itself for ``representation="cls"``; absent for ``"ot"``.
        ``ot_embedding`` `(batch_size, vocab_size)`: the full mu, MLM-head logits max-pooled over ordinary tokens
            (eq. 6-7; special tokens by `special_token_ids`, padding by the attention mask), after `ot_activation`.
        ``sparse_embedding`` `(batch_size, vocab_size)`: sqrt(`sparse_weight`) * mu with all but its top-k entries
            zeroed (eq. 11): k = `doc_top_k` for documents, `query_top_k` for queries (None = the full mu, as eq. 12).
        ``sparse_indices`` / ``sparse_values`` `(batch_size, k)`: the kept entries (documents, and queries with a
            `query_top_k`), weighted as in ``sparse_embedding`` -- what an index stores.
        ``sentence_embedding`` `(batch_size, dense_dim + vocab_size)`: concat of the dense and sparse parts, so with
            ``similarity_fn_name="dot"``, `encode_query(q) @ encode_document(d).T` is eq. 12:
            h_q . h_d + lambda * sum_{i in top-k(d)} mu_q[i] mu_d[i] (lambda = `sparse_weight`, the paper's 1).

    Weights: `dense_proj` (the fine-tuned W^cls) and a copy of the MLM head (`transform.*`, `decoder_weight`
    `(vocab_size, hidden_size)` = the word embeddings, `decoder_bias`), stored in this module's folder as
    safetensors (the head duplicates the word-embedding matrix: vocab_size * hidden_size * 4 bytes).

    Args:
        hidden_size: the encoder's hidden size d.
        vocab_size: |V|.
        dense_dim: d' (1..hidden_size).
        doc_top_k: k for documents (1..vocab_size).
        query_top_k: k for queries; None keeps the full mu.
        special_token_ids: the tokenizer's special ids; None = exclude the first and last real position.
        representation: ``"hybrid"`` (default), ``"cls"`` (dense [CLS] only, no projection) or ``"ot"`` (sparse only).
        ot_activation: ``"none"`` (the paper's mu) or ``"log1p_relu"`` (SPLADE's saturation; `activate_ot`).
        sparse_weight: lambda > 0, the weight of the sparse term of the score (1.0 = the paper).
        hidden_act / layer_norm_eps: the MLM-head transform's activation and LayerNorm epsilon.
        chunk_size: logits rows per chunk when computing mu.
    """

    config_keys = [
        "hidden_size",
        "vocab_size",
        "dense_dim",
        "doc_top_k",
        "query_top_k",
        "special_token_ids",
        "representation",
        "ot_activation",
        "sparse_weight",
        "hidden_act",
        "layer_norm_eps",
        "chunk_size",
    ]
    forward_kwargs = {"task"}

    def __init__(
        self,
        hidden_size: int,
        vocab_size: int,
        dense_dim: int = 384,
        doc_top_k: int = 384,
        query_top_k: int | None = None,
        special_token_ids: list[int] | None = None,
        representation: str = "hybrid",
        ot_activation: str = "none",
        sparse_weight: float = 1.0,
        hidden_act: str = "gelu",
        layer_norm_eps: float = 1e-12,
        chunk_size: int = 4096,
    ):
        super().__init__()
        if representation not in REPRESENTATIONS:
            raise ValueError(f"representation={representation!r} is not supported; choose one of {REPRESENTATIONS}")
        if not 1 <= dense_dim <= hidden_size:
            raise ValueError(f"dense_dim={dense_dim} must lie in [1, hidden_size={hidden_size}]")
        if representation == "cls" and dense_dim != hidden_size:
            raise ValueError(f"representation='cls' has no projection: dense_dim={dense_dim} must be {hidden_size}")
        if not 1 <= doc_top_k <= vocab_size:
            raise ValueError(f"doc_top_k={doc_top_k} must lie in [1, vocab_size={vocab_size}]")
        if query_top_k is not None and not 1 <= query_top_k <= vocab_size:
            raise ValueError(f"query_top_k={query_top_k} must be None (full mu) or lie in [1, vocab_size={vocab_size}]")
        if chunk_size < 1:
            raise ValueError(f"chunk_size={chunk_size} must be >= 1")
        if ot_activation not in OT_ACTIVATIONS:
            raise ValueError(f"ot_activation={ot_activation!r} is not supported; choose one of {OT_ACTIVATIONS}")
        if not sparse_weight > 0:
            raise ValueError(f"sparse_weight={sparse_weight} must be > 0 (1.0 = the paper's eq. 12)")
        self.hidden_size = hidden_size
        self.vocab_size = vocab_size
        self.dense_dim = dense_dim
        self.doc_top_k = doc_top_k
        self.query_top_k = query_top_k
        self.special_token_ids = sorted(set(special_token_ids)) if special_token_ids is not None else None
        self.representation = representation
        self.ot_activation = ot_activation
        self.sparse_weight = sparse_weight
        self.hidden_act = hidden_act
        self.layer_norm_eps = layer_norm_eps
        self.chunk_size = chunk_size
        self.dense_proj = nn.Linear(hidden_size, dense_dim) if representation == "hybrid" else None
        if representation != "cls":
            self.transform = _HeadTransform(hidden_size, hidden_act, layer_norm_eps)
            self.decoder_weight = nn.Parameter(torch.empty(vocab_size, hidden_size).normal_(std=0.02))
            self.decoder_bias = nn.Parameter(torch.zeros(vocab_size))

    @property
    def has_dense(self) -> bool:
        return self.representation != "ot"

    @property
    def has_sparse(self) -> bool:
        return self.representation != "cls"

    def top_k_for(self, task: str | None) -> int | None:
        """k of the sparse part for `task` (None = keep the full mu)."""
        if task == "query":
            return self.query_top_k
        if task in (None, "document"):
            return self.doc_top_k
        raise ValueError(f"task={task!r}: DupMAEPooling knows 'query' and 'document' (None = 'document')")

    def forward(self, features: dict[str, Any], task: str | None = None, **kwargs) -> dict[str, Any]:
        k = self.top_k_for(task if task is not None else features.get("task"))
        token_embeddings = features["token_embeddings"]  # (B, L, H)
        attention_mask = features["attention_mask"]  # (B, L)
        parts = []
        if self.has_dense:
            h = token_embeddings[:, 0]  # (B, H) [CLS]
            dense = self.dense_proj(h) if self.dense_proj is not None else h
            features["dense_embedding"] = dense
            parts.append(dense)
        if self.has_sparse:
            keep = ordinary_token_mask(features.get("input_ids"), attention_mask, self.special_token_ids)  # (B, L)
            logits = token_max_logits(
                self.transform(token_embeddings), self.decoder_weight, self.decoder_bias, keep, self.chunk_size
            )  # (B, V)
            mu = activate_ot(logits, self.ot_activation)
            features["ot_embedding"] = mu
            scale = self.sparse_weight**0.5
            if k is None or k >= self.vocab_size:
                sparse = mu * scale
            else:
                values, indices = mu.topk(k, dim=-1)  # (B, k), the kept entries
                values = values * scale
                sparse = torch.zeros_like(mu).scatter(-1, indices, values)  # (B, V)
                features["sparse_indices"] = indices
                features["sparse_values"] = values
            features["sparse_embedding"] = sparse
            parts.append(sparse)
        features["sentence_embedding"] = torch.cat(parts, dim=-1)
        return features

    def get_embedding_dimension(self) -> int:
        return (self.dense_dim if self.has_dense else 0) + (self.vocab_size if self.has_sparse else 0)

    def get_sentence_embedding_dimension(self) -> int:
        return self.get_embedding_dimension()

    def save(self, output_path: str, *args, safe_serialization: bool = True, **kwargs) -> None:
        """Config + safetensors weights into `output_path`; inside a SentenceTransformer folder (its parent holds
        config_sentence_transformers.json) also this file and `layers_dupmae.py` into the folder ROOT, where
        modules.json's ``"st_dupmae.DupMAEPooling"`` is resolved (sentence-transformers itself copies a remote-code
        module only into the module subfolder, so a re-saved model would not load)."""
        self.save_config(output_path)
        self.save_torch_weights(output_path, safe_serialization=safe_serialization)
        root = Path(output_path).resolve().parent
        if (root / "config_sentence_transformers.json").is_file():
            here = Path(__file__).resolve().parent
            for name in (Path(__file__).name, "layers_dupmae.py"):
                if (here / name).resolve() != (root / name).resolve():
                    shutil.copyfile(here / name, root / name)

    @classmethod
    def load(
        cls,
        model_name_or_path: str,
        subfolder: str = "",
        token: bool | str | None = None,
        cache_folder: str | None = None,
        revision: str | None = None,
        local_files_only: bool = False,
        **kwargs,
    ) -> "DupMAEPooling":
        hub = dict(
            subfolder=subfolder,
            token=token,
            cache_folder=cache_folder,
            revision=revision,
            local_files_only=local_files_only,
        )
        module = cls(**cls.load_config(model_name_or_path, **hub))
        return cls.load_torch_weights(model_name_or_path, model=module, **hub)


def find_dupmae_pooling(model: torch.nn.Module) -> DupMAEPooling:
    """The `DupMAEPooling` module of a SentenceTransformer (matched by class name: a model loaded as remote code
    has its own copy of the class)."""
    for module in model.modules():
        if type(module).__name__ == "DupMAEPooling":
            return module
    raise ValueError(
        f"{type(model).__name__} has no DupMAEPooling module; export it with build_dupmae_sentence_transformer"
    )


def decode(model: torch.nn.Module, text_or_embedding: str | torch.Tensor, top_k: int = 20) -> list[tuple[str, float]]:
    """A text's strongest OT tokens: the `top_k` largest entries of mu as `(token, weight)`, descending.

    Args:
        model: a SentenceTransformer whose last module is `DupMAEPooling`.
        text_or_embedding: a text (encoded as a query, so the full mu is used), a mu / sparse vector `(vocab_size,)`,
            or a sentence embedding `(dense_dim + vocab_size,)` (its last vocab_size entries are read).
        top_k: tokens to list (>= 1).
    """
    if top_k < 1:
        raise ValueError(f"top_k={top_k} must be >= 1")
    pooling = find_dupmae_pooling(model)
    if not pooling.has_sparse:
        raise ValueError("representation='cls' has no OT part to decode")
    if isinstance(text_or_embedding, str):
        if not text_or_embedding.strip():
            raise ValueError("cannot decode an empty text")
        mu = model.encode_query([text_or_embedding], output_value="ot_embedding", convert_to_tensor=True)[0]
    else:
        mu = torch.as_tensor(text_or_embedding)
        if mu.ndim != 1 or mu.shape[0] < pooling.vocab_size:
            raise ValueError(
                f"expected a 1-D vector with >= vocab_size={pooling.vocab_size} entries, got {tuple(mu.shape)}"
            )
        mu = mu[-pooling.vocab_size :]
    values, indices = mu.float().topk(min(top_k, mu.shape[0]))
    tokens = model.tokenizer.convert_ids_to_tokens(indices.tolist())
    return [(token, float(value)) for token, value in zip(tokens, values.tolist(), strict=True)]


__all__ = ["DupMAEPooling", "decode", "find_dupmae_pooling"]
