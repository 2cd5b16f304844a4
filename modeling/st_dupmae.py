"""sentence-transformers module for DupMAE's hybrid representation (paper §3.4): [W^cls h ; top-k(mu)].

Loaded as remote code from an exported model's root (modules.json type ``"st_dupmae.DupMAEPooling"``), never imported
by `modeling_*.py`. sentence-transformers resolves module types from the root but saves each module's code into its
subfolder, so `DupMAEPooling.save` also writes the code files into the model's root: a model loaded as remote code
re-saves with `model.save` / `push_to_hub`. A model built from this package's class needs `save_sentence_transformer`
(`model.save` would name the type `retromae.modeling.st_dupmae.DupMAEPooling`). `task`: ``"query"`` from
`encode_query`, else a document; a call without it (training losses) reads ``features["task"]``, as `Router` does.
"""

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
from sentence_transformers.base.modules import Module
from torch import nn
from transformers.activations import ACT2FN

from .layers_dupmae import (
    REPRESENTATIONS,
    check_representation,
    dense_and_ot_parts,
    hybrid_embedding,
    ordinary_token_mask,
    sparse_top_k,
)

# the files `SentenceTransformer(path, trust_remote_code=True)` loads from the root of a DupMAE model folder
REMOTE_CODE_FILES = ("st_dupmae.py", "layers_dupmae.py")
MODULE_TYPE = "st_dupmae.DupMAEPooling"
SENTENCE_TRANSFORMER_CONFIG = "config_sentence_transformers.json"  # at the root of every SentenceTransformer folder


class _HeadTransform(nn.Module):
    """The MLM-head transform (dense -> activation -> LayerNorm) under BERT's names; ModernBERT's takes
    `dense_bias` = its `classifier_bias` and `norm_bias` = its `norm_bias` (both False by default)."""

    def __init__(self, hidden_size: int, hidden_act: str, layer_norm_eps: float, dense_bias: bool = True,
                 norm_bias: bool = True):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size, bias=dense_bias)
        self.transform_act_fn = ACT2FN[hidden_act]
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=layer_norm_eps, bias=norm_bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.transform_act_fn(self.dense(hidden)))


class DupMAEPooling(Module):
    """DupMAE pooling: token embeddings -> dense [CLS] part + sparse OT part, concatenated.

    Adds to `features`:
        ``dense_embedding`` `(batch_size, dense_dim)`: W^cls h (eq. 10), h = token_embeddings[:, 0] (right padding);
            h itself for ``"cls"``; absent for ``"ot"``.
        ``ot_embedding`` `(batch_size, vocab_size)`: the full mu over the ordinary tokens (eq. 6-7), after
            `ot_activation`.
        ``sparse_embedding`` `(batch_size, vocab_size)`: sqrt(`sparse_weight`) * top-k(mu) (eq. 11), k = `doc_top_k`
            for documents, `query_top_k` for queries (None = the full mu).
        ``sparse_indices`` / ``sparse_values`` `(batch_size, k)`: its kept entries, where k < vocab_size.
        ``sentence_embedding`` `(batch_size, dense_dim + vocab_size)`: [dense ; sparse], so with
            ``similarity_fn_name="dot"`` `encode_query(q) @ encode_document(d).T` is eq. 12.

    Weights (safetensors in the module's folder): `dense_proj` and a copy of the MLM head (`transform.*`,
    `decoder_weight` `(vocab_size, hidden_size)` = the word embeddings, `decoder_bias`).

    Args:
        hidden_size / vocab_size: d and |V|.
        dense_dim, doc_top_k, query_top_k, special_token_ids, representation, ot_activation, sparse_weight: as
            `DupMAEConfig`'s fields; `check_representation` refuses what does not fit.
        hidden_act / layer_norm_eps / head_dense_bias / head_norm_bias: the MLM-head transform's activation,
            LayerNorm epsilon and biases (True as BERT's; ModernBERT's head has none by default).
        chunk_size: >= 1, logits rows per chunk when computing mu.
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
        "head_dense_bias",
        "head_norm_bias",
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
        head_dense_bias: bool = True,
        head_norm_bias: bool = True,
    ):
        super().__init__()
        check_representation(
            representation, hidden_size, vocab_size, dense_dim, doc_top_k, query_top_k, ot_activation, sparse_weight
        )
        if chunk_size < 1:
            raise ValueError(f"chunk_size={chunk_size} must be >= 1")
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
        self.head_dense_bias = head_dense_bias
        self.head_norm_bias = head_norm_bias
        self.dense_proj = nn.Linear(hidden_size, dense_dim) if representation == "hybrid" else None
        if representation != "cls":
            self.transform = _HeadTransform(hidden_size, hidden_act, layer_norm_eps, head_dense_bias, head_norm_bias)
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
        keep = None
        if self.has_sparse:
            keep = ordinary_token_mask(features.get("input_ids"), features["attention_mask"], self.special_token_ids)
        ot_head = (self.transform, self.decoder_weight, self.decoder_bias) if self.has_sparse else None
        dense, mu = dense_and_ot_parts(
            token_embeddings, keep, self.representation, self.dense_proj, ot_head, self.ot_activation, self.chunk_size
        )
        sparse = None
        if dense is not None:
            features["dense_embedding"] = dense
        if mu is not None:
            features["ot_embedding"] = mu
            sparse, indices, values = sparse_top_k(mu, k, self.sparse_weight)
            if indices is not None:
                features["sparse_indices"] = indices
                features["sparse_values"] = values
            features["sparse_embedding"] = sparse
        features["sentence_embedding"] = hybrid_embedding(dense, sparse)
        return features

    def get_embedding_dimension(self) -> int:
        return (self.dense_dim if self.has_dense else 0) + (self.vocab_size if self.has_sparse else 0)

    def get_sentence_embedding_dimension(self) -> int:
        return self.get_embedding_dimension()

    def save(self, output_path: str, *args, safe_serialization: bool = True, **kwargs) -> None:
        """Config + safetensors weights into `output_path`, this module's own folder; inside a SentenceTransformer
        folder (its parent holds `SENTENCE_TRANSFORMER_CONFIG`, which sentence-transformers writes before the
        modules) also `REMOTE_CODE_FILES` into that root, where `trust_remote_code=True` loading looks for them."""
        self.save_config(output_path)
        self.save_torch_weights(output_path, safe_serialization=safe_serialization)
        root = Path(output_path).resolve().parent
        if (root / SENTENCE_TRANSFORMER_CONFIG).is_file():
            write_remote_code(type(self), root)

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
        config = cls.load_config(model_name_or_path, **hub)
        missing = [key for key in ("hidden_size", "vocab_size") if key not in config]
        if missing:  # load_config gives {} for a missing file: say which, not a TypeError from __init__
            where = Path(model_name_or_path) / subfolder / "config.json"
            raise ValueError(f"{where} is missing or lacks {', '.join(missing)} (the DupMAEPooling module's config "
                             "is damaged)")
        return cls.load_torch_weights(model_name_or_path, model=cls(**config), **hub)


def write_remote_code(module_class: type, folder: Path) -> None:
    """Copy `REMOTE_CODE_FILES` from the folder of `module_class`'s source file (this package's `modeling/`, or
    transformers' module cache for remote code) into `folder`; a file is not copied onto itself."""
    source_dir = Path(sys.modules[module_class.__module__].__file__).parent
    for name in REMOTE_CODE_FILES:
        if (source_dir / name).resolve() != (folder / name).resolve():
            shutil.copyfile(source_dir / name, folder / name)


def save_sentence_transformer(model: torch.nn.Module, path: str | Path, **save_kwargs: Any) -> Path:
    """`model.save(path)` for a SentenceTransformer with a `DupMAEPooling`, plus `st_dupmae.py` and
    `layers_dupmae.py` at the root of `path` and the module type ``"st_dupmae.DupMAEPooling"`` in modules.json."""
    path = Path(path)
    pooling = find_dupmae_pooling(model)
    model.save(str(path), **save_kwargs)
    write_remote_code(type(pooling), path)
    modules_file = path / "modules.json"
    modules = json.loads(modules_file.read_text(encoding="utf-8"))
    for entry in modules:
        if entry["type"].rsplit(".", 1)[-1] == type(pooling).__name__:
            entry["type"] = MODULE_TYPE
    modules_file.write_text(json.dumps(modules, indent=2) + "\n", encoding="utf-8")
    return path


def is_dupmae_pooling(module: torch.nn.Module) -> bool:
    """Whether `module` is a `DupMAEPooling` (matched by class name: a model loaded as remote code has its own copy
    of the class, imported from the model folder's `st_dupmae.py`)."""
    return type(module).__name__ == DupMAEPooling.__name__


def find_dupmae_pooling(model: torch.nn.Module) -> DupMAEPooling:
    """The `DupMAEPooling` module of a SentenceTransformer (`is_dupmae_pooling`)."""
    for module in model.modules():
        if is_dupmae_pooling(module):
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


__all__ = [
    "MODULE_TYPE",
    "REMOTE_CODE_FILES",
    "REPRESENTATIONS",
    "DupMAEPooling",
    "decode",
    "find_dupmae_pooling",
    "is_dupmae_pooling",
    "save_sentence_transformer",
    "write_remote_code",
]
