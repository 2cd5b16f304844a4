"""`retromae export --format dense|sparse`: DupMAE's two parts as folders that plain sentence-transformers loads
without remote code (the default `--format hybrid` is `export.dupmae.write_dupmae_export`, unchanged).

* ``dense``: `SentenceTransformer(path)`: Transformer -> Pooling (CLS) -> Dense (W^cls, identity activation; left
  out for ``representation="cls"``, whose dense part is the [CLS] state itself). Its vectors are the hybrid export's
  ``dense_embedding`` exactly: the same weights and the same operations. Dot product.
* ``sparse``: `SparseEncoder(path)`: Transformer (``transformer_task="fill-mask"``: the base's own ``*ForMaskedLM``
  with the checkpoint's MLM head) -> SpladePooling (max, ``relu``), ``max_active_dims`` = ``doc_top_k``. Not exact:
  sentence-transformers 6.2 has no module for what DupMAE does; `SPARSE_DIFFERENCES` lists where it differs (the
  tests measure it: tests/test_parts.py).

Both folders get the model card of the other exports (`render_export_card`) with their own usage section;
`export_part` is the `retromae export --format` entry point.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Literal

import torch
from retromae.modeling.backbones import backbone_for, encoder_type_of_config
from sentence_transformers import SentenceTransformer, SparseEncoder
from sentence_transformers.base.modules import Dense, Transformer
from sentence_transformers.sentence_transformer.modules import Pooling
from sentence_transformers.sparse_encoder.modules import SpladePooling
from torch import nn
from transformers import AutoModelForMaskedLM, PreTrainedModel

from ..inputs.checkpoints import (
    encoder_from_state_dict,
    encoder_kwargs,
)
from ..inputs.sentence_models import save_without_pooler
from .cards import sentence_transformers_needed
from .cls import ExportRequest
from .dupmae import build_dupmae_pooling, render_export_card
from .sentence_transformer import (
    export_sentence_transformer,
    read_checkpoint_config,
)

Format = Literal["hybrid", "dense", "sparse"]
FORMATS: tuple[str, ...] = ("hybrid", "dense", "sparse")
# where the sparse export's vectors differ from DupMAE's mu (also written into its model card)
SPARSE_DIFFERENCES = """
1. SpladePooling takes the max over every attended position, [CLS] and [SEP] included; DupMAE's mu skips the special
   tokens. An entry differs where a special token's logit is the largest (everywhere else it is exact).
2. SpladePooling's `relu` is log(1 + relu(x)) (it offers no plain relu), so the values equal DupMAE's only for a
   checkpoint with `ot_activation="log1p_relu"`; with the default `"none"` (raw logits) the entries keep their order
   (the map is monotone) but not their values, and the sparse scores are not eq. 12's.
3. Negative logits become 0: a document keeps at most its positive entries, and a query's negative entries (which
   eq. 12 multiplies in with `"none"`) drop out. Elasticsearch's `sparse_vector` takes no negatives either.
4. `max_active_dims` applies to queries too (DupMAE keeps the full query mu unless `query_top_k` is set):
   `encode_query(texts, max_active_dims=vocab_size)` keeps them all.
5. `sparse_weight` (lambda) is not applied: multiply the sparse scores by it when fusing them with the dense ones.
"""

# the usage section of each part's model card (`render_export_card`)
DENSE_USAGE = """The dense part of DupMAE's hybrid representation, {dim} dimensions, dot product. Requires
sentence-transformers >= {release}. The sparse part is exported with `retromae export --format sparse`; the paper's
hybrid score (eq. 12) is this dot product plus lambda = {sparse_weight} times the sparse one.

```python
from sentence_transformers import SentenceTransformer
model = SentenceTransformer("<this folder or repo>")
scores = model.similarity(model.encode_query(["..."]), model.encode_document(["..."]))
```
"""
SPARSE_USAGE = """The sparse (ordinary-token) part of DupMAE's hybrid representation as a SPLADE-style
`SparseEncoder` over the encoder and its MLM head (the base's own masked-LM model). Requires sentence-transformers
>= {release}; releases before 6.2 do not read `max_active_dims` ({doc_top_k}) from this folder and keep every
positive entry, so pass it when loading, as below. Where the vectors differ from DupMAE's own:
{differences}
```python
from sentence_transformers import SparseEncoder
model = SparseEncoder("<this folder or repo>", max_active_dims={doc_top_k})
scores = model.similarity(model.encode_query(["..."], max_active_dims={vocab_size}), model.encode_document(["..."]))
```
"""


def masked_lm_from_state_dict(config: dict[str, Any], state_dict: dict[str, torch.Tensor]) -> PreTrainedModel:
    """The base's own `*ForMaskedLM` (BERT, RoBERTa, XLM-R or ModernBERT) holding a DupMAE checkpoint's encoder and
    MLM head, strictly loaded; ValueError when the weights have no head. The output layer stays tied to the word
    embeddings only where the checkpoint's are equal."""
    backbone = backbone_for(encoder_type_of_config(config))
    encoder = encoder_from_state_dict(config, state_dict)
    head = backbone.head_state(state_dict)
    if head is None:
        raise ValueError(f"the weights have no {backbone.display_name} MLM head ({backbone.head_name}.*) for the "
                         "sparse export")
    base_config = encoder.config
    embeddings = backbone.word_embeddings(encoder).weight
    base_config.tie_word_embeddings = torch.equal(head[f"{backbone.head_decoder}weight"], embeddings)
    model = AutoModelForMaskedLM.from_config(base_config)
    expected = set(model.state_dict())
    weights = {f"{model.base_model_prefix}.{k}": v for k, v in encoder.state_dict().items()}
    for name, tensor in head.items():  # BERT/RoBERTa: under `cls.` / `lm_head.`; ModernBERT: at the top level
        prefixed = f"{backbone.head_name}.{name}"
        weights[prefixed if prefixed in expected else name] = tensor
    missing, unexpected = expected - set(weights), set(weights) - expected
    if missing or unexpected:
        raise ValueError(f"the MLM head does not fit {type(model).__name__}: missing {sorted(missing)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]}")
    model.load_state_dict(weights, strict=True)
    return model.eval()


def _transformer(model: PreTrainedModel, request: ExportRequest, staging: str, **kwargs: Any) -> Transformer:
    """sentence-transformers' Transformer over `model` saved with the tokenizer into `staging`."""
    model.save_pretrained(staging)
    request.tokenizer.save_pretrained(staging)
    return Transformer(staging, max_seq_length=request.max_seq_length(), **kwargs)


def dense_projection(pooling: nn.Module) -> Dense | None:
    """W^cls of a `DupMAEPooling` as sentence-transformers' Dense (identity activation), None without one."""
    if pooling.dense_proj is None:
        return None
    dense = Dense(pooling.hidden_size, pooling.dense_dim, bias=True, activation_function=nn.Identity())
    dense.linear.load_state_dict(pooling.dense_proj.state_dict())
    return dense


def write_dupmae_dense(request: ExportRequest, build_dir: Path) -> None:
    """Exporter of `--format dense`: Transformer -> CLS Pooling (-> Dense W^cls), dot product, no remote code."""
    pooling = build_dupmae_pooling(request.config, request.state_dict, request.tokenizer.all_special_ids)
    if not pooling.has_dense:
        raise ValueError("representation='ot' has no dense part; export --format sparse")
    encoder = encoder_from_state_dict(request.config, request.state_dict)
    with tempfile.TemporaryDirectory(prefix="dupmae-dense-") as staging:
        transformer = _transformer(encoder, request, staging, model_kwargs=encoder_kwargs(encoder.config.model_type))
        modules = [transformer, Pooling(encoder.config.hidden_size, pooling_mode="cls")]
        dense = dense_projection(pooling)
        modules += [dense] if dense is not None else []
        model = SentenceTransformer(modules=modules, similarity_fn_name="dot", prompts={"query": "", "document": ""},
                                    device="cpu")
        model.save(str(build_dir), create_model_card=False)
        save_without_pooler(model, build_dir)
    usage = DENSE_USAGE.format(dim=pooling.dense_dim, sparse_weight=pooling.sparse_weight,
                               release=sentence_transformers_needed(build_dir))
    representation = ("[CLS] state projected by W^cls" if dense else "[CLS] state") + (
        f", {pooling.dense_dim} dimensions (DupMAE's dense part)")
    card = render_export_card(request, pooling.dense_dim, representation=representation, usage=usage, tags=["dense"])
    (build_dir / "README.md").write_text(card, encoding="utf-8")


def write_dupmae_sparse(request: ExportRequest, build_dir: Path) -> None:
    """Exporter of `--format sparse`: `*ForMaskedLM` -> SpladePooling(max, relu), `max_active_dims=doc_top_k`, no
    remote code; how its vectors differ from DupMAE's mu: the module docstring."""
    pooling = build_dupmae_pooling(request.config, request.state_dict, request.tokenizer.all_special_ids)
    if not pooling.has_sparse:
        raise ValueError("representation='cls' has no sparse part; export --format dense")
    masked_lm = masked_lm_from_state_dict(request.config, dict(request.state_dict))
    with tempfile.TemporaryDirectory(prefix="dupmae-sparse-") as staging:
        transformer = _transformer(masked_lm, request, staging, transformer_task="fill-mask")
        # relu = log1p(relu(.)) in SpladePooling: DupMAE's "log1p_relu" mu, the closest it offers (docstring)
        splade = SpladePooling("max", activation_function="relu", embedding_dimension=pooling.vocab_size)
        model = SparseEncoder(modules=[transformer, splade], similarity_fn_name="dot", max_active_dims=pooling.doc_top_k,
                              device="cpu")
        model.save(str(build_dir), create_model_card=False)
    usage = SPARSE_USAGE.format(doc_top_k=pooling.doc_top_k, vocab_size=pooling.vocab_size,
                                differences=SPARSE_DIFFERENCES, release=sentence_transformers_needed(build_dir))
    representation = (f"MLM head's logits max-pooled over the tokens, log(1 + relu(.)), top-{pooling.doc_top_k} of "
                      f"{pooling.vocab_size} entries kept (DupMAE's sparse part, approximated: see *Usage*)")
    card = render_export_card(request, pooling.vocab_size, representation=representation, usage=usage,
                              tags=["sparse-encoder"], pipeline_tag="feature-extraction")
    (build_dir / "README.md").write_text(card, encoding="utf-8")


# None: the method's own exporter (the hybrid export)
FORMAT_EXPORTERS = {"hybrid": None, "dense": write_dupmae_dense, "sparse": write_dupmae_sparse}


def export_part(
    checkpoint: str | os.PathLike,
    output_dir: str | os.PathLike,
    export_format: Format,
    *,
    overwrite: bool = False,
    model_name: str | None = None,
) -> Path:
    """`export_sentence_transformer` of a DupMAE checkpoint in one of `FORMATS`, with that format's exporter;
    "hybrid" is exactly that call.

    Raises:
        ValueError: an unknown format, a checkpoint of another method (the message names `--format`), or what
            `export_sentence_transformer` refuses.
    """
    if export_format not in FORMATS:
        raise ValueError(f"--format {export_format!r}: choose one of {', '.join(FORMATS)}")
    method, _ = read_checkpoint_config(Path(checkpoint))
    if export_format != "hybrid" and method.name != "dupmae":
        raise ValueError(f"--format {export_format} applies to DupMAE checkpoints; {checkpoint} is {method.name}'s: "
                         "leave out --format (its export is already plain sentence-transformers)")
    return export_sentence_transformer(checkpoint, output_dir, overwrite=overwrite, model_name=model_name,
                                       exporter=FORMAT_EXPORTERS[export_format])


__all__ = [
    "FORMATS", "FORMAT_EXPORTERS", "SPARSE_DIFFERENCES", "dense_projection", "export_part",
    "masked_lm_from_state_dict", "write_dupmae_dense", "write_dupmae_sparse",
]
