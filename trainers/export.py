"""Export a pre-training checkpoint as a sentence-transformers model: the folder users fine-tune and publish.

Two entry points share one implementation (`_export`):

* `export_sentence_transformer(checkpoint_dir, output_dir)`: from a folder written by `retromae pretrain`
  (a `checkpoint-N` folder or the output dir). Weights are read with safetensors only (no pickle, no remote code).
* `export_from_model(model, tokenizer, output_dir, run_info)`: from an in-memory `*ForPretraining` model
  (the Trainer's `save_model`).

Both build an `ExportRequest` (method, pre-training config, state dict, tokenizer, run info) and hand it to the
method's writer in `EXPORTERS`, the single dispatch point keyed on the method name. The CLS methods (retromae, bow,
seed, sentmae) use `write_cls_encoder`; DupMAE's hybrid CLS + sparse representation is written by
`retromae.trainers.export_dupmae.write_dupmae_export(request, build_dir)`. A writer fills an empty build folder;
everything else (validation, the temporary sibling folder, the atomic rename, overwrite, clean-up) happens here.

Layout decision: the CLS writer writes the **legacy sentence-transformers layout** by hand instead of calling
sentence-transformers 6.2's `SentenceTransformer.save` (ECOSYSTEM §3.2)::

    config.json, model.safetensors      plain BertModel: model_type "bert", no pooler, no auto_map
    tokenizer files                     the checkpoint's tokenizer
    modules.json                        sentence_transformers.models.Transformer -> .Pooling (no Normalize)
    sentence_bert_config.json           {"max_seq_length": N, "do_lower_case": false,
                                         "model_args": {"add_pooling_layer": false}}
    1_Pooling/config.json               word_embedding_dimension + pooling_mode_cls_token: true
    config_sentence_transformers.json   {"similarity_fn_name": "dot", "prompts": {"query": "", "document": ""}, ...}
    README.md                           model card (model_cards/pretrained_encoder.md)

6.2's own `save` writes module paths (`sentence_transformers.base.modules.transformer.Transformer`) and config keys
that older releases do not have, so its folders need sentence-transformers >= 6. The legacy files are the ones every
release since 2.x wrote and 6.2 still reads (tests/test_export.py loads them in 6.2 and checks the embeddings, the
dot similarity, the prompts and the maximum length); `similarity_fn_name` and `prompts` are read since 3.0 (inferred
from those releases, not run here). Five small JSON files buy that reach, so we write them.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import ModelCard, ModelCardData
from retromae.modeling.pretraining_base import BertPretrainingBase
from retromae.trainers.folders import (
    atomic_folder,
    check_destination,
    check_model_folder,
    folder_errors_as,
    is_hub_id,
    is_local_folder,
    public_name,
)
from retromae.trainers.methods import CITATIONS, METHODS, Method, method_of_config
from safetensors.torch import load_file
from transformers import AutoTokenizer, BertConfig, BertModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

RUN_INFO_FILE = "retromae_run.json"
CARD_TEMPLATE = "pretrained_encoder.md"
DEFAULT_MAX_SEQ_LENGTH = 512
EXPECTS = "export expects the output of `retromae pretrain` (a checkpoint-N folder or the output dir)"

# BertConfig's own fields: what the exported plain-BERT config.json keeps. Everything else in a method config
# (mask ratios, decoding, loss weights, ...) is a method hyperparameter and goes into the model card instead.
_ALL_BERT_FIELDS = frozenset(f.name for f in dataclasses.fields(BertConfig))
BERT_CONFIG_FIELDS = _ALL_BERT_FIELDS - {"architectures", "transformers_version"}
# method-config fields that are implementation knobs, not hyperparameters worth a line in the model card
NOT_HYPERPARAMETERS = frozenset({"loss_chunk_size", "mask_token_id"})

# Paper links by `Method.paper` key (methods.py holds the BibTeX, which has no URL).
PAPER_URLS = {
    "retromae": "https://arxiv.org/abs/2205.12035",
    "dupmae": "https://arxiv.org/abs/2305.02564",
    "bow": "https://arxiv.org/abs/2401.11248",
    "seed": "https://arxiv.org/abs/2102.09206",
    "sentmae": "https://arxiv.org/abs/2208.00231",
}



class ExportError(ValueError):
    """The checkpoint cannot be exported, or the output folder cannot be written, for a reason the user can fix."""


@dataclass(frozen=True)
class ExportRequest:
    """Everything a writer needs, whether it came from a checkpoint folder or an in-memory model.

    Args:
        method: the pre-training method.
        config: the pre-training config as a dict (config.json contents).
        state_dict: the pre-training weights with their prefixes (`bert.*`, `cls.*`, the method's heads).
        tokenizer: the checkpoint's tokenizer.
        run_info: contents of `retromae_run.json`, or None when not recorded.
        model_name: name used in the model card (and in its `hf upload <your-org>/<model_name>` command).
        folder_name: basename of the output folder (the card never shows a full local path).
    """

    method: Method
    config: dict[str, Any]
    state_dict: Mapping[str, torch.Tensor]
    tokenizer: PreTrainedTokenizerBase
    run_info: dict[str, Any] | None
    model_name: str
    folder_name: str


Writer = Callable[[ExportRequest, Path], None]


# ---- public API ----------------------------------------------------------------------------------------------------


def export_sentence_transformer(
    checkpoint_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    overwrite: bool = False,
    model_name: str | None = None,
) -> Path:
    """Export a pre-training checkpoint folder as a sentence-transformers model.

    Args:
        checkpoint_dir: a folder written by `retromae pretrain` (config.json of one of our methods,
            model.safetensors, tokenizer files, optionally retromae_run.json).
        output_dir: the folder to create. Built in a temporary sibling and renamed into place when complete.
        overwrite: replace a non-empty `output_dir` (only after the new folder is complete).
        model_name: name for the model card; default `<method>-<base model name>` (or `<method>-<output folder>`).

    Returns:
        `output_dir` as a `Path`.

    Raises:
        ExportError: the folder is not an exportable checkpoint, or `output_dir` exists and `overwrite` is False.
    """
    checkpoint_dir, output_dir = Path(checkpoint_dir), Path(output_dir)
    method, config = _read_checkpoint_config(checkpoint_dir)
    with folder_errors_as(ExportError):
        check_destination(output_dir, overwrite, source=checkpoint_dir)
    weight_files = _weight_files(checkpoint_dir)
    with folder_errors_as(ExportError):  # a checkpoint of a run killed mid-save (e.g. no tokenizer vocabulary)
        check_model_folder(checkpoint_dir, purpose="export")
    tokenizer = _read_checkpoint_tokenizer(checkpoint_dir)
    run_info = _read_run_info(checkpoint_dir)
    request = ExportRequest(
        method=method,
        config=config,
        state_dict=_read_weights(weight_files),
        tokenizer=tokenizer,
        run_info=run_info,
        model_name=model_name or _default_model_name(method, run_info, output_dir),
        folder_name=output_dir.name,
    )
    return _export(request, output_dir, overwrite)


def export_from_model(
    model: BertPretrainingBase,
    tokenizer: PreTrainedTokenizerBase,
    output_dir: str | os.PathLike,
    run_info: dict[str, Any] | None = None,
    overwrite: bool = False,
    *,
    model_name: str | None = None,
) -> Path:
    """Export an in-memory pre-training model (e.g. from the Trainer's `save_model`); same output as
    `export_sentence_transformer`. Call it on the main process only.

    Args:
        model: a `*ForPretraining` model of one of our methods (unwrapped, not DDP/FSDP-wrapped).
        tokenizer: its tokenizer.
        output_dir: the folder to create.
        run_info: the run record (schema of `retromae_run.json`), or None when not available.
        overwrite: replace a non-empty `output_dir`.
        model_name: name for the model card (default as in `export_sentence_transformer`).
    """
    if not isinstance(model, BertPretrainingBase):
        raise ExportError(
            f"export_from_model expects a retromae *ForPretraining model, got {type(model).__name__}; "
            "unwrap it first (e.g. accelerator.unwrap_model(model))"
        )
    output_dir = Path(output_dir)
    method = _method_of(model.config.model_type, type(model).__name__, hint=f"known methods: {', '.join(METHODS)}")
    with folder_errors_as(ExportError):
        check_destination(output_dir, overwrite)
    request = ExportRequest(
        method=method,
        config=model.config.to_dict(),
        state_dict=model.state_dict(),
        tokenizer=tokenizer,
        run_info=run_info,
        model_name=model_name or _default_model_name(method, run_info, output_dir),
        folder_name=output_dir.name,
    )
    return _export(request, output_dir, overwrite)


# ---- the shared implementation -------------------------------------------------------------------------------------


def _export(request: ExportRequest, output_dir: Path, overwrite: bool) -> Path:
    """Run the method's writer in a temporary sibling folder, then move the finished folder into place
    (`atomic_folder`, which also removes the temporary folders of an earlier, killed export to the same place)."""
    writer = exporter_for(request.method.name)
    with folder_errors_as(ExportError), atomic_folder(output_dir, overwrite=overwrite) as build_dir:
        writer(request, build_dir)
    logger.info("Exported %s encoder to %s", request.method.name, output_dir)
    return output_dir


def write_cls_encoder(request: ExportRequest, build_dir: Path) -> None:
    """Writer of the CLS methods: plain BERT + Pooling(cls), dot similarity, no Normalize (legacy ST layout).

    Weights are written in float32 (a bf16/fp16 checkpoint is upcast, which is exact)."""
    encoder = build_bert_encoder(request)
    encoder.save_pretrained(build_dir)
    request.tokenizer.save_pretrained(build_dir)

    dim = encoder.config.hidden_size
    max_seq_length = _max_seq_length(request.run_info, encoder.config.max_position_embeddings)
    _write_json(
        build_dir / "modules.json",
        [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        ],
    )
    _write_json(
        build_dir / "sentence_bert_config.json",
        # add_pooling_layer=False: the export has no pooler weights (CLS pooling never uses them)
        {"max_seq_length": max_seq_length, "do_lower_case": False, "model_args": {"add_pooling_layer": False}},
    )
    (build_dir / "1_Pooling").mkdir()
    # a model pre-trained with a cosine contrastive loss (SentMAE's default) is scored with cosine; else dot (RetroMAE)
    similarity = "cosine" if request.config.get("similarity") == "cos" else "dot"
    _write_json(
        build_dir / "1_Pooling" / "config.json",
        {
            "word_embedding_dimension": dim,
            "pooling_mode_cls_token": True,
            "pooling_mode_mean_tokens": False,
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
        },
    )
    _write_json(
        build_dir / "config_sentence_transformers.json",
        {
            "__version__": _library_versions(),
            "prompts": {"query": "", "document": ""},
            "default_prompt_name": None,
            "similarity_fn_name": similarity,
        },
    )
    card = render_model_card(
        request, embedding_dim=dim, num_layers=encoder.config.num_hidden_layers, max_seq_length=max_seq_length,
        similarity=similarity,
    )
    (build_dir / "README.md").write_text(card, encoding="utf-8")


def _write_dupmae(request: ExportRequest, build_dir: Path) -> None:
    """DupMAE (CLS + sparse ordinary-token representation) is exported by its own module."""
    try:
        module = importlib.import_module("retromae.trainers.export_dupmae")
    except ModuleNotFoundError as error:
        if error.name != "retromae.trainers.export_dupmae":
            raise
        raise ExportError(
            "DupMAE export is not available in this installation (retromae.trainers.export_dupmae)"
        ) from error
    module.write_dupmae_export(request, build_dir)


# The single dispatch point: method name -> writer.
EXPORTERS: dict[str, Writer] = {
    "retromae": write_cls_encoder,
    "bow": write_cls_encoder,
    "seed": write_cls_encoder,
    "sentmae": write_cls_encoder,
    "dupmae": _write_dupmae,
}


def exporter_for(method: str) -> Writer:
    """The writer for `method`; ExportError (a ValueError) for methods without one."""
    if method not in EXPORTERS:
        raise ExportError(
            f"no sentence-transformers exporter for method {method!r}; methods with one: {', '.join(sorted(EXPORTERS))}"
        )
    return EXPORTERS[method]


def build_bert_encoder(request: ExportRequest) -> BertModel:
    """A plain `BertModel` (no pooler) with the request's `bert.*` weights, loaded strictly."""
    config = BertConfig(**{k: v for k, v in request.config.items() if k in BERT_CONFIG_FIELDS})
    encoder = BertModel(config, add_pooling_layer=False)
    prefix = "bert."
    weights = {k[len(prefix) :]: v for k, v in request.state_dict.items() if k.startswith(prefix)}
    expected = set(encoder.state_dict())
    missing, unexpected = sorted(expected - set(weights)), sorted(set(weights) - expected)
    if missing or unexpected:
        raise ExportError(
            f"the checkpoint's encoder weights do not match its config: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]} (of {len(missing)} missing, {len(unexpected)} unexpected)"
        )
    try:
        encoder.load_state_dict(weights, strict=True)
    except RuntimeError as error:  # shape mismatch
        raise ExportError(f"the checkpoint's encoder weights do not match its config: {error}") from error
    return encoder.eval()


# ---- model card ----------------------------------------------------------------------------------------------------


CLS_REPRESENTATION = "last-layer `[CLS]` state, {dim} dimensions, not normalised"


def render_model_card(
    request: ExportRequest, *, embedding_dim: int, num_layers: int, max_seq_length: int,
    representation: str | None = None,
    similarity: str = "dot",
) -> str:
    """README.md from `model_cards/pretrained_encoder.md`; never contains a local filesystem path.

    Args:
        representation: how the sentence embedding is formed; None = the CLS export (plain BERT weights, no remote
            code). Any other value marks a model that needs `trust_remote_code=True`.
    """
    method, run_info = request.method, request.run_info or {}
    base_model = run_info.get("base_model")
    hub_base_model = base_model if is_hub_id(base_model) and not is_local_folder(base_model) else None
    title, _, summary = method.summary.partition(": ")
    if not summary:
        title, summary = method.name, method.summary
    repo_id = request.model_name if "/" in request.model_name else f"<your-org>/{request.model_name}"
    card_data = ModelCardData(
        language="en",
        license="apache-2.0",
        library_name="sentence-transformers",
        pipeline_tag="sentence-similarity",
        base_model=hub_base_model,
        tags=list(dict.fromkeys(["retromae", method.name, "sentence-transformers", "feature-extraction"])),
        model_name=request.model_name,
    )
    if hub_base_model:
        base_model_text = f"[{hub_base_model}](https://huggingface.co/{hub_base_model})"
    else:
        base_model_text = "a local checkpoint (not a Hub model id)" if base_model else "not recorded"
    template = resources.files("retromae.model_cards").joinpath(CARD_TEMPLATE).read_text(encoding="utf-8")
    card = ModelCard.from_template(
        card_data,
        template_str=template,
        method=method.name,
        method_title=title,
        method_summary=summary,
        paper_url=PAPER_URLS.get(method.paper, PAPER_URLS.get(method.name, "")),
        base_model_text=base_model_text,
        corpus=_public_name(run_info.get("corpus")) or "not recorded",
        num_layers=num_layers,
        embedding_dim=embedding_dim,
        hidden_size=request.config["hidden_size"],
        cls_model=representation is None,
        similarity=similarity,
        representation=representation or CLS_REPRESENTATION.format(dim=embedding_dim),
        max_seq_length=max_seq_length,
        global_step=run_info.get("global_step", "not recorded"),
        retromae_version=run_info.get("retromae_version", "not recorded"),
        method_hparams=_method_hyperparameters(request),
        training=_training_rows(run_info.get("training")),
        final_losses=[(k, _fmt(v, loss=True)) for k, v in (run_info.get("final_losses") or {}).items()],
        repo_id=repo_id,
        folder_name=request.folder_name,
        citation=CITATIONS.get(method.paper, CITATIONS.get(method.name, "")).strip(),
    )
    return str(card)


def _method_hyperparameters(request: ExportRequest) -> list[tuple[str, str]]:
    """The method config's fields beyond BertConfig (mask ratios, decoding, ...), with their values."""
    config_class = request.method.model_class.config_class
    names = [f.name for f in dataclasses.fields(config_class) if f.name not in _ALL_BERT_FIELDS]
    return [(n, _fmt(request.config[n])) for n in names if n in request.config and n not in NOT_HYPERPARAMETERS]


def _training_rows(training: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    if not training:
        return []
    rows = [(k, _fmt(v)) for k, v in training.items()]
    factors = ("per_device_train_batch_size", "gradient_accumulation_steps", "world_size")
    if all(isinstance(training.get(k), int) for k in factors):
        effective = training[factors[0]] * training[factors[1]] * training[factors[2]]
        rows.append(("effective_batch_size", str(effective)))
    return rows


def _fmt(value: Any, loss: bool = False) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if loss else f"{value:g}"
    return str(value)


def _public_name(name: Any) -> str | None:
    """A Hub id as is; anything path-like reduced to its basename (no local paths in the card)."""
    return public_name(name) if name else None


def _default_model_name(method: Method, run_info: Mapping[str, Any] | None, output_dir: Path) -> str:
    base_model = (run_info or {}).get("base_model")
    stem = _public_name(base_model).split("/")[-1] if base_model else output_dir.name
    return stem if stem.lower().startswith(method.name) else f"{method.name}-{stem}"


# ---- reading a checkpoint folder -----------------------------------------------------------------------------------


def _read_checkpoint_config(checkpoint_dir: Path) -> tuple[Method, dict[str, Any]]:
    if not checkpoint_dir.exists():
        raise ExportError(f"checkpoint folder {checkpoint_dir} does not exist; {EXPECTS}")
    if not checkpoint_dir.is_dir():
        raise ExportError(f"{checkpoint_dir} is not a folder; {EXPECTS}")
    config_file = checkpoint_dir / "config.json"
    if not config_file.is_file():
        raise ExportError(f"{checkpoint_dir} is not a retromae checkpoint: no config.json; {EXPECTS}")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ExportError(
            f"{checkpoint_dir} is not a retromae checkpoint: config.json is not valid JSON ({error})"
        ) from error
    return _method_of(config.get("model_type"), str(checkpoint_dir)), config


def _method_of(model_type: Any, subject: str, hint: str = EXPECTS) -> Method:
    try:
        return method_of_config(model_type)
    except ValueError as error:
        raise ExportError(
            f"{subject} is not a retromae checkpoint: config.json model_type {model_type!r}; {hint}"
        ) from error


def _weight_files(checkpoint_dir: Path) -> list[Path]:
    """model.safetensors, or the shards listed in model.safetensors.index.json; safetensors only, never pickle."""
    single, index = checkpoint_dir / "model.safetensors", checkpoint_dir / "model.safetensors.index.json"
    if single.is_file():
        files = [single]
    elif index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        files = [checkpoint_dir / name for name in sorted(set(weight_map.values()))]
    else:
        found = [p.name for p in checkpoint_dir.glob("*.bin")]
        hint = f" (found {', '.join(found)}: pickle weights are not read; re-save with safetensors)" if found else ""
        raise ExportError(f"{checkpoint_dir} is not a retromae checkpoint: no model.safetensors{hint}; {EXPECTS}")
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ExportError(f"{checkpoint_dir}: shards listed in model.safetensors.index.json are missing: {missing}")
    return files


def _read_weights(files: list[Path]) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(file))
    return state


def _read_checkpoint_tokenizer(checkpoint_dir: Path) -> PreTrainedTokenizerBase:
    """The checkpoint's tokenizer; `check_model_folder` has made sure its vocabulary file is there."""
    try:
        # trust_remote_code=False: the checkpoint's config.json has an auto_map, but the tokenizer is a plain one
        return AutoTokenizer.from_pretrained(str(checkpoint_dir), trust_remote_code=False)
    except (OSError, ValueError) as error:
        raise ExportError(f"cannot load the tokenizer of {checkpoint_dir}: {error}") from error


def _read_run_info(checkpoint_dir: Path) -> dict[str, Any] | None:
    path = checkpoint_dir / RUN_INFO_FILE
    if not path.is_file():
        logger.info("%s has no %s; the model card says 'not recorded'", checkpoint_dir, RUN_INFO_FILE)
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ExportError(f"{path} is not valid JSON ({error})") from error


def _max_seq_length(run_info: Mapping[str, Any] | None, max_position_embeddings: int) -> int:
    recorded = (run_info or {}).get("max_seq_length")
    return min(int(recorded) if recorded else DEFAULT_MAX_SEQ_LENGTH, max_position_embeddings)


# ---- helpers -------------------------------------------------------------------------------------------------------


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def _library_versions() -> dict[str, str]:
    import sentence_transformers
    import transformers

    return {
        "sentence_transformers": sentence_transformers.__version__,
        "transformers": transformers.__version__,
        "pytorch": torch.__version__,
    }


__all__ = [
    "EXPORTERS",
    "ExportError",
    "ExportRequest",
    "build_bert_encoder",
    "export_from_model",
    "export_sentence_transformer",
    "exporter_for",
    "render_model_card",
    "write_cls_encoder",
]
