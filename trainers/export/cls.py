"""The exporter of the CLS methods (retromae, bow, seed, sentmae) and the request every exporter receives.

An exporter is a callable `(request: ExportRequest, build_dir: Path) -> None` that fills an empty folder; the method
registry names each method's exporter, and `retromae.trainers.export.sentence_transformer` does everything around
it (reading the checkpoint, the temporary sibling folder, the atomic rename, overwrite). Beside its exporter a
representation has its sentence-vector function (`SentenceVectors`: the vectors a validation scores during
pre-training, the CLS one here) and, when the export holds a module of its own, a `PoolingModule`.

Layout decision: the CLS exporter writes the **legacy sentence-transformers layout** by hand instead of calling
sentence-transformers 6.2's `SentenceTransformer.save`::

    config.json, model.safetensors      the base's plain model: model_type "bert" / "roberta" / "xlm-roberta" /
                                        "modernbert", no pooler, no auto_map (loads without remote code)
    tokenizer files                     the checkpoint's tokenizer
    modules.json                        sentence_transformers.models.Transformer -> .Pooling (-> .Normalize for
                                        cosine)
    sentence_bert_config.json           {"max_seq_length": N, "do_lower_case": false,
                                         "model_args": {"add_pooling_layer": false}} (the last only for a
                                         family whose model has a pooler: not ModernBERT)
    1_Pooling/config.json               word_embedding_dimension + pooling_mode_cls_token: true (or mean_tokens)
    config_sentence_transformers.json   {"model_type": "SentenceTransformer", "similarity_fn_name": "dot",
                                         "prompts": {"query": "", "document": ""}, ...}
    README.md                           model card (model_cards/pretrained_encoder.md)

6.2's own `save` writes module paths (`sentence_transformers.base.modules.transformer.Transformer`) and config keys
that older releases do not have, so its folders need sentence-transformers >= 6. The legacy files are the ones every
release since 2.x wrote and 6.2 still reads (tests/commands/test_export.py loads them in 6.2 and checks the embeddings, the
dot similarity, the prompts and the maximum length); `similarity_fn_name` and `prompts` are read since 3.0 (inferred
from those releases, not run here). Five small JSON files buy that reach, so we write them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from ..inputs.checkpoints import encoder_from_state_dict, encoder_kwargs, usable_positions
from ..inputs.io import write_json_atomic
from ..inputs.sentence_models import POOLING_SIMILARITY
from ..inputs.versions import library_versions
from .cards import MethodDescription, render_pretrained_card

DEFAULT_MAX_SEQ_LENGTH = 512


@dataclass(frozen=True)
class ExportRequest:
    """Everything an exporter needs, whether it came from a checkpoint folder or an in-memory model.

    Args:
        method: the registry entry of the pre-training method (name, summary, paper, model class).
        config: the pre-training config as a dict (config.json contents).
        state_dict: the pre-training weights with their prefixes (`bert.*`, `cls.*`, the method's heads).
        tokenizer: the checkpoint's tokenizer.
        run_info: contents of `retromae_run.json`, or None when not recorded.
        model_name: name used in the model card (and in its `hf upload <your-org>/<model_name>` command).
        folder_name: basename of the output folder (the card never shows a full local path).
        pooling: "cls" (the methods' own representation) or "mean" (e.g. to keep the head of a base such as
            all-MiniLM-L6-v2 that continued pre-training started from); CLS methods only.
        similarity: "dot" or "cosine" (adds a Normalize module); None = cosine for mean pooling or a SentMAE model
            trained with its cosine contrastive loss (`trained_with_cosine`), else dot. CLS methods only.
    """

    method: MethodDescription
    config: dict[str, Any]
    state_dict: Mapping[str, torch.Tensor]
    tokenizer: PreTrainedTokenizerBase
    run_info: dict[str, Any] | None
    model_name: str
    folder_name: str
    pooling: Literal["cls", "mean"] = "cls"
    similarity: Literal["dot", "cosine"] | None = None

    def similarity_name(self) -> str:
        """The requested similarity, else cosine for a model pre-trained with a cosine contrastive loss (SentMAE's
        default, `trained_with_cosine`), else the one the pooling implies (`POOLING_SIMILARITY`)."""
        if self.similarity:
            return self.similarity
        weight = self.config.get("contrastive_loss_weight", self.config.get("contrastive_weight"))  # or legacy key
        if trained_with_cosine(self.config.get("similarity"), weight):
            return "cosine"
        return POOLING_SIMILARITY[self.pooling]

    def max_seq_length(self) -> int:
        """The recorded training length (default 512), capped by the positions the encoder can use
        (`usable_positions`: RoBERTa / XLM-R `max_position_embeddings - pad_token_id - 1`)."""
        recorded = (self.run_info or {}).get("max_seq_length")
        return min(int(recorded) if recorded else DEFAULT_MAX_SEQ_LENGTH, usable_positions(self.config))


def trained_with_cosine(similarity: str | None, contrastive_loss_weight: float | None) -> bool:
    """Whether a model was pre-trained with a cosine contrastive loss: SentMAE's `similarity="cos"` with the loss on
    (`contrastive_loss_weight > 0`; at 0 the run is RetroMAE alone, whose vectors are scored by the dot product)."""
    return similarity == "cos" and contrastive_loss_weight is not None and contrastive_loss_weight > 0


Exporter = Callable[[ExportRequest, Path], None]
# (pre-training model, its encoder's last_hidden_state `(batch_size, seq_len, hidden_size)`, the tokenized batch
# (`input_ids`, `attention_mask`), task "query" or "document") -> float32 `(batch_size, dim)` vectors by metric-name
# prefix: "" what the export encodes, others parts a validation also scores
SentenceVectors = Callable[[nn.Module, torch.Tensor, Mapping[str, torch.Tensor], str], dict[str, torch.Tensor]]


def cls_sentence_vectors(model: nn.Module, hidden: torch.Tensor, batch: Mapping[str, torch.Tensor],
                         task: str) -> dict[str, torch.Tensor]:
    """What `write_cls_encoder` exports, under "": the last-layer [CLS] state, unit-normalised for a model trained
    with a cosine contrastive loss (`trained_with_cosine`: SentMAE's default)."""
    cls = hidden[:, 0].float()  # (batch_size, hidden_size)
    config = model.config
    if trained_with_cosine(getattr(config, "similarity", None), getattr(config, "contrastive_loss_weight", None)):
        cls = nn.functional.normalize(cls, dim=-1)
    return {"": cls}


@dataclass(frozen=True)
class PoolingModule:
    """A method's own sentence-transformers module (remote code at the folder root), as its export and every model
    fine-tuned from it hold it; found by `methods.hybrid_method_of` (such a folder has no pre-training config).

    Args:
        label: how a fine-tuning record's `pooling` starts (`describe`); model cards recognise the module by it.
        recognises: whether a module is one (by class name: a model loaded as remote code has its own copy of it).
        save: `(model, folder, **save_kwargs) -> folder`: `SentenceTransformer.save` plus the module's remote code.
    """

    label: str
    recognises: Callable[[nn.Module], bool]
    save: Callable[..., Path]

    def describe(self, model: nn.Module) -> str:
        """The fine-tuning record's `pooling` of a model holding the module, e.g. "<label> (hybrid)"."""
        module = next(m for m in model.modules() if self.recognises(m))
        return f"{self.label} ({getattr(module, 'representation', 'hybrid')})"


def write_cls_encoder(request: ExportRequest, build_dir: Path) -> None:
    """Exporter of the CLS methods: the base's plain model (BERT, RoBERTa, XLM-R or ModernBERT, as the checkpoint's
    `encoder_type`) + Pooling (CLS unless the request says mean), + Normalize for cosine (legacy sentence-transformers
    layout).

    Weights are written in float32 (a bf16/fp16 checkpoint is upcast, which is exact)."""
    encoder = encoder_from_state_dict(request.config, request.state_dict)
    encoder.save_pretrained(build_dir)
    request.tokenizer.save_pretrained(build_dir)

    dim = encoder.config.hidden_size
    max_seq_length = request.max_seq_length()
    pooling, similarity = request.pooling, request.similarity_name()
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if similarity == "cosine":  # unit vectors: cosine is then also the dot product a faiss inner-product index uses
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    write_json_atomic(build_dir / "modules.json", modules)
    transformer_config: dict = {"max_seq_length": max_seq_length, "do_lower_case": False}
    model_args = encoder_kwargs(encoder.config.model_type)
    if model_args:  # add_pooling_layer=False: the export has no pooler weights (CLS pooling never uses them)
        transformer_config["model_args"] = model_args
    write_json_atomic(build_dir / "sentence_bert_config.json", transformer_config)
    (build_dir / "1_Pooling").mkdir()
    write_json_atomic(
        build_dir / "1_Pooling" / "config.json",
        {
            "word_embedding_dimension": dim,
            "pooling_mode_cls_token": pooling == "cls",
            "pooling_mode_mean_tokens": pooling == "mean",
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
        },
    )
    write_json_atomic(
        build_dir / "config_sentence_transformers.json",
        {
            "model_type": "SentenceTransformer",  # what 6.2's own save writes; older releases ignore the key
            "__version__": library_versions(),
            "prompts": {"query": "", "document": ""},
            "default_prompt_name": None,
            "similarity_fn_name": similarity,
        },
    )
    card = render_pretrained_card(
        request.method, request.config, request.run_info, model_name=request.model_name,
        folder_name=request.folder_name, embedding_dim=dim, num_layers=encoder.config.num_hidden_layers,
        max_seq_length=max_seq_length, similarity=similarity, pooling=pooling,
    )
    (build_dir / "README.md").write_text(card, encoding="utf-8")


__all__ = [
    "DEFAULT_MAX_SEQ_LENGTH", "ExportRequest", "Exporter", "PoolingModule", "SentenceVectors",
    "cls_sentence_vectors", "trained_with_cosine", "write_cls_encoder",
]
