"""Export DupMAE as a sentence-transformers model: `Transformer` (the base's plain model: BERT, RoBERTa, XLM-R or
ModernBERT) + `DupMAEPooling` (remote code).

Layout of an exported folder::

    config.json, model.safetensors      the base's plain model: model_type "bert" / "roberta" / "xlm-roberta" /
                                        "modernbert", no pooler, no auto_map
    tokenizer files, sentence_bert_config.json
    modules.json                        [Transformer, "st_dupmae.DupMAEPooling" in 1_DupMAEPooling/]
    st_dupmae.py, layers_dupmae.py      the module's code, at the ROOT (so `trust_remote_code=True` finds it)
    1_DupMAEPooling/config.json         hidden_size, vocab_size, dense_dim, doc_top_k, query_top_k, special_token_ids ...
    1_DupMAEPooling/model.safetensors   dense_proj (W^cls) + the MLM head (transform, decoder_weight, decoder_bias)
    config_sentence_transformers.json   model_type "SentenceTransformer", similarity_fn_name "dot", prompts {"query": "",
                                        "document": ""}
    README.md                           model card (export via `write_dupmae_export`)

Load it with `SentenceTransformer(path, trust_remote_code=True)`; `encode_query` keeps the full OT vector mu,
`encode_document` its top-k, and `similarity` (dot) is the paper's eq. 12 score. The folder needs
sentence-transformers >= 5.4 (the module subclasses `sentence_transformers.base.modules.Module`).

A model loaded from the folder re-saves with `model.save`; one built from this package's `DupMAEPooling` with
`save_dupmae_sentence_transformer` (why: `modeling/st_dupmae.py`).

The registry's dupmae entry points here: its exporter (`write_dupmae_export`), the overrides an export takes
(`REPRESENTATION_FIELDS`), its validation vectors (`hybrid_sentence_vectors`) and its module (`DUPMAE_POOLING`).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from retromae.modeling.backbones import Backbone, backbone_for, encoder_type_of_config
from retromae.modeling.layers_dupmae import initial_dense_projection
from retromae.modeling.modeling_dupmae import hybrid_representation, representation_parts
from retromae.modeling.st_dupmae import (
    DupMAEPooling,
    is_dupmae_pooling,
    save_sentence_transformer,
)
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Transformer
from torch import nn
from transformers import PreTrainedTokenizerBase

from ..inputs.checkpoints import encoder_from_state_dict, encoder_kwargs
from ..inputs.sentence_models import save_without_pooler
from .cards import render_pretrained_card, sentence_transformers_needed
from .cls import ExportRequest, PoolingModule, cls_sentence_vectors

logger = logging.getLogger(__name__)

# representation fields a caller may override at export time (validated by DupMAEPooling)
REPRESENTATION_FIELDS = ("representation", "dense_dim", "doc_top_k", "query_top_k", "ot_activation", "sparse_weight")
_MU = ("the {vocab_size}-dimensional ordinary-token vector mu (the MLM-head logits max-pooled over the non-special "
       "tokens); documents keep its top-{doc_top_k} entries, queries all of it")
# each representation's embedding, as the card's summary row and its section say it
EMBEDDINGS = {
    "hybrid": ("[CLS] projected to {dense_dim} dimensions ⊕ max-pooled ordinary-token vocabulary weights ({vocab_size} "
               "dimensions, top-{doc_top_k} kept for documents); dot product",
               "the [CLS] state projected to {dense_dim} dimensions, concatenated with " + _MU + ", so the dot product "
               "of `encode_query` and `encode_document` outputs is eq. 12: dense . dense + lambda * sum over the "
               "document's top-k ids of mu_q * mu_d"),
    "cls": ("the [CLS] state itself ({dense_dim} dimensions, Table 4's CLS:768); dot product",
            "the {dense_dim}-dimensional [CLS] state itself, without projection or sparse part (Table 4's CLS:768)"),
    "ot": ("max-pooled ordinary-token vocabulary weights ({vocab_size} dimensions, top-{doc_top_k} kept for "
           "documents; Table 4's OT:768); dot product", _MU + " (Table 4's OT:768), scored by their dot product"),
}
DUPMAE_CARD_SECTION = """
## DupMAE representation

This model's embedding is DupMAE's representation (paper §3.4), built by the custom module
`st_dupmae.DupMAEPooling` at the root of this folder (load with `trust_remote_code=True`; it needs
sentence-transformers >= {release}): {embedding}. Representation: `{representation}`; mu values: `{ot_activation}`
(`log1p_relu` = SPLADE's log(1 + relu(mu))); lambda (`sparse_weight`): {sparse_weight}.

```python
from sentence_transformers import SentenceTransformer
model = SentenceTransformer("<this folder or repo>", trust_remote_code=True)
scores = model.similarity(model.encode_query(["..."]), model.encode_document(["..."]))
```

The projection (`dense_proj`) is learnt during fine-tuning; in a pre-training export it is a random
Johnson-Lindenstrauss map drawn from the checkpoint config's `dense_proj_seed`, the same matrix that
`AutoModel.from_pretrained(checkpoint, trust_remote_code=True)` uses, so both give the same dense vectors. For large corpora index the compact form (dense part + top-k pairs) with
`retromae.trainers.retrieval.hybrid_index.HybridIndex` instead of the full concatenated vectors.
"""


def _head_weights(backbone: type[Backbone], state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The checkpoint's MLM head (`backbone.head_state`) under `DupMAEPooling`'s names (`transform.dense.*`,
    `transform.LayerNorm.*`, `decoder_weight`, `decoder_bias`)."""
    head = backbone.head_state(state_dict)
    if head is None:
        raise ValueError(
            f"the weights have no {backbone.display_name} MLM head for the OT representation "
            f"({backbone.head_name}.* or the word embeddings missing)"
        )
    weights = {}
    for ours, theirs in (("transform.dense.", backbone.head_dense), ("transform.LayerNorm.", backbone.head_norm)):
        weights.update({ours + k[len(theirs):]: v for k, v in head.items() if k.startswith(theirs)})
    weights["decoder_weight"] = head[f"{backbone.head_decoder}weight"]
    bias = head.get(backbone.head_bias or f"{backbone.head_decoder}bias")
    if bias is None:  # ModernBERT's decoder_bias=False: no bias, i.e. zeros
        bias = torch.zeros(weights["decoder_weight"].shape[0], dtype=weights["decoder_weight"].dtype)
    weights["decoder_bias"] = bias
    return weights


def build_dupmae_pooling(
    config: Mapping[str, Any],
    state_dict: Mapping[str, torch.Tensor],
    special_token_ids: list[int] | None,
) -> DupMAEPooling:
    """A `DupMAEPooling` holding a DupMAE checkpoint's representation weights.

    Args:
        config: a DupMAE config as a dict (`hidden_size`, `vocab_size`, `dense_dim`, `doc_top_k`, ...).
        state_dict: pre-training (`bert.*`, `cls.*`; `roberta.*` / `model.*`, `lm_head.*` on other bases) or
            encoder (`embeddings.*`, `cls.*`, `dense_proj.*`) weights.
        special_token_ids: the tokenizer's special ids (None: fall back to the first/last position rule).

    When the weights have no projection W^cls (a pre-training checkpoint: the paper learns it in fine-tuning), it
    starts as `initial_dense_projection` of the config's `dense_proj_seed`, exactly the matrix `DupMAEModel`
    (AutoModel) starts from, so the export and AutoModel give the same dense vectors.
    """
    backbone = backbone_for(encoder_type_of_config(config))
    pooling = DupMAEPooling(
        hidden_size=config["hidden_size"],
        vocab_size=config["vocab_size"],
        dense_dim=config.get("dense_dim", 384),
        doc_top_k=config.get("doc_top_k", 384),
        query_top_k=config.get("query_top_k"),
        special_token_ids=special_token_ids,
        representation=config.get("representation", "hybrid"),
        ot_activation=config.get("ot_activation", "none"),
        sparse_weight=config.get("sparse_weight", 1.0),
        chunk_size=config.get("loss_chunk_size", 4096),
        **backbone.head_options(config),
    )
    weights: dict[str, torch.Tensor] = {}
    if pooling.has_sparse:
        weights.update(_head_weights(backbone, state_dict))
    if pooling.dense_proj is not None:
        if "dense_proj.weight" in state_dict and tuple(state_dict["dense_proj.weight"].shape) == (
            pooling.dense_dim,
            pooling.hidden_size,
        ):
            weights["dense_proj.weight"] = state_dict["dense_proj.weight"]
            weights["dense_proj.bias"] = state_dict["dense_proj.bias"]
        else:
            logger.info(
                "dense_proj (W^cls, %d -> %d) is newly initialised: fine-tune it",
                pooling.hidden_size,
                pooling.dense_dim,
            )
            seed = config.get("dense_proj_seed", 0)
            weights["dense_proj.weight"] = initial_dense_projection(pooling.hidden_size, pooling.dense_dim, seed)
            weights["dense_proj.bias"] = torch.zeros(pooling.dense_dim)
    pooling.load_state_dict({k: v.detach().float().cpu() for k, v in weights.items()}, strict=True)
    return pooling.eval()


def save_dupmae_sentence_transformer(model: SentenceTransformer, path: str | os.PathLike, **save_kwargs) -> Path:
    """`model.save(path)` plus the remote-code layout: the module files at the root and modules.json type
    `"st_dupmae.DupMAEPooling"`, so `SentenceTransformer(path, trust_remote_code=True)` loads it anywhere."""
    path = save_sentence_transformer(model, path, **save_kwargs)
    save_without_pooler(model, path)
    return path


def assemble_dupmae_sentence_transformer(
    encoder_state: Mapping[str, torch.Tensor],
    config: Mapping[str, Any],
    tokenizer: PreTrainedTokenizerBase,
    output_dir: str | os.PathLike,
    max_seq_length: int,
    **save_kwargs,
) -> Path:
    """Write the sentence-transformers folder into `output_dir` (which may exist and be empty)."""
    encoder = encoder_from_state_dict(config, encoder_state)
    pooling = build_dupmae_pooling(config, encoder_state, tokenizer.all_special_ids)
    with tempfile.TemporaryDirectory(prefix="dupmae-export-") as staging:
        encoder.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        transformer = Transformer(staging, max_seq_length=max_seq_length,
                                  model_kwargs=encoder_kwargs(encoder.config.model_type))
        model = SentenceTransformer(
            modules=[transformer, pooling],
            similarity_fn_name="dot",
            prompts={"query": "", "document": ""},
            device="cpu",
        )
        return save_dupmae_sentence_transformer(model, output_dir, **save_kwargs)


def write_dupmae_export(request: ExportRequest, build_dir: Path) -> None:
    """The DupMAE exporter (the registry's `exporter` of dupmae): fills the empty `build_dir`."""
    max_seq_length = request.max_seq_length()
    assemble_dupmae_sentence_transformer(
        request.state_dict, request.config, request.tokenizer, build_dir, max_seq_length, create_model_card=False
    )
    pooling_config = json.loads((build_dir / "1_DupMAEPooling" / "config.json").read_text(encoding="utf-8"))
    dense = pooling_config["dense_dim"] if pooling_config["representation"] != "ot" else 0
    sparse = pooling_config["vocab_size"] if pooling_config["representation"] != "cls" else 0
    summary, embedding = (text.format(**pooling_config) for text in EMBEDDINGS[pooling_config["representation"]])
    card = render_export_card(request, dense + sparse, representation=f"DupMAE {pooling_config['representation']}: "
                                                                      f"{summary}")
    section = DUPMAE_CARD_SECTION.format(**pooling_config, embedding=embedding,
                                         release=sentence_transformers_needed(build_dir))
    (build_dir / "README.md").write_text(card + section, encoding="utf-8")


def render_export_card(request: ExportRequest, embedding_dim: int, *, representation: str, **options: Any) -> str:
    """`render_pretrained_card` of a DupMAE export of `request`; `options`: its `usage`, `tags`, `pipeline_tag`."""
    return render_pretrained_card(
        request.method, request.config, request.run_info, model_name=request.model_name,
        folder_name=request.folder_name, embedding_dim=embedding_dim, num_layers=request.config["num_hidden_layers"],
        max_seq_length=request.max_seq_length(), representation=representation, **options,
    )


def load_dupmae_sentence_transformer(path: str | os.PathLike, **kwargs: Any) -> SentenceTransformer:
    """`SentenceTransformer(path, trust_remote_code=True)` (the module is remote code at the folder root)."""
    return SentenceTransformer(str(path), trust_remote_code=True, **kwargs)


# the module of the export and of every model fine-tuned from it; "DupMAE hybrid" is what fine-tuning records wrote
DUPMAE_POOLING = PoolingModule(label="DupMAE hybrid", recognises=is_dupmae_pooling,
                               save=save_dupmae_sentence_transformer)


def hybrid_sentence_vectors(model: nn.Module, hidden: torch.Tensor, batch: Mapping[str, torch.Tensor],
                            task: str) -> dict[str, torch.Tensor]:
    """DupMAE's validation vectors: "" its own representation `(batch_size, dense_dim + vocab_size)` as its encoder
    (`DupMAEModel`) and export compute it before fine-tuning, [W h ; sqrt(lambda) top-k(mu)] with W the config's
    fixed projection and the model's own MLM head (`head_parts`, any base); "cls_" its [CLS] part. Only the [CLS]
    part, under "", for `representation="cls"` or a model without its MLM head. `task`: the top-k differ."""
    cls = cls_sentence_vectors(model, hidden, batch, task)
    config = model.config
    if config.representation == "cls" or not callable(getattr(model, "head_parts", None)):
        return cls
    weight = initial_dense_projection(config.hidden_size, config.dense_dim, config.dense_proj_seed).to(hidden)
    dense, mu = representation_parts(config, hidden, batch["input_ids"], batch["attention_mask"],
                                     lambda h: h @ weight.T, model.head_parts())
    return {"": hybrid_representation(config, dense, mu, task).float(), "cls_": cls[""]}


__all__ = [
    "DUPMAE_POOLING",
    "REPRESENTATION_FIELDS",
    "assemble_dupmae_sentence_transformer",
    "build_dupmae_pooling",
    "hybrid_sentence_vectors",
    "load_dupmae_sentence_transformer",
    "render_export_card",
    "save_dupmae_sentence_transformer",
    "write_dupmae_export",
]
