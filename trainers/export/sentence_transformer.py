"""`retromae export`: a pre-training checkpoint as a sentence-transformers model, the folder users fine-tune and publish.

Two entry points share one implementation (`export_request`):

* `export_sentence_transformer(checkpoint, output_dir)`: from a folder written by `retromae pretrain` (a
  `checkpoint-N` folder or the output dir). Weights are read with safetensors only (no pickle, no remote code).
* `export_from_model(model, tokenizer, output_dir, run_info)`: from an in-memory `*ForPretraining` model (the
  Trainer's `save_model`).

Both build an `ExportRequest` (method, pre-training config, state dict, tokenizer, run info) and hand it to the
method's exporter, named by the method registry (`Method.exporter`): `export.cls.write_cls_encoder` for the CLS
methods, `export.dupmae.write_dupmae_export` for DupMAE's hybrid CLS + sparse representation. An exporter fills an
empty build folder; everything else (validation, the temporary sibling folder, the atomic rename, overwrite,
clean-up) happens here. `export_encoder` exports a method's encoder with representation overrides
(`Method.export_overrides`); `build_dupmae_sentence_transformer` is DupMAE's.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
from retromae.modeling.backbones import backbone_of
from retromae.modeling.pretraining_base import PretrainingBase
from sentence_transformers import SentenceTransformer
from torch import nn
from transformers import PreTrainedTokenizerBase

from ..inputs.checkpoints import (
    CheckpointError,
    check_tokenizer_saved,
    load_tokenizer,
    needs_remote_code,
    read_state_dict,
    usable_positions,
)
from ..inputs.folders import check_model_folder, is_trainer_checkpoint, public_name
from ..inputs.io import read_json_or_empty
from ..inputs.outputs import atomic_folder, claim_output, model_holding
from ..inputs.parameters import check_bool, check_path
from ..inputs.sentence_models import check_pooling, load_sentence_transformer
from ..methods import METHODS, Method, get_method, method_of_config, method_of_folder
from ..training.sharding import is_sharded
from .cls import ExportRequest
from .publishing import check_model_name

logger = logging.getLogger(__name__)
RUN_INFO_FILE = "retromae_run.json"
EXPECTS = "export expects the output of `retromae pretrain` (a checkpoint-N folder or the output dir)"


def is_pretraining_checkpoint_of(config: dict[str, Any], method: Method) -> bool:
    """Whether a config.json is a `retromae pretrain` checkpoint of `method` (its `model_type` is the method's and
    its architecture the method's pre-training class, not the method's encoder saved on its own), by the registry."""
    model_type = method.model_class.config_class.model_type
    return config.get("model_type") == model_type and method.model_class.__name__ in (config.get("architectures") or [])


def export_sentence_transformer(
    checkpoint: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    overwrite: bool = False,
    model_name: str | None = None,
    pooling: Literal["cls", "mean"] = "cls",
    similarity: Literal["dot", "cosine"] | None = None,
    exporter: Callable[[ExportRequest, Path], None] | None = None,
) -> Path:
    """Export a pre-training checkpoint folder as a sentence-transformers model.

    Args:
        checkpoint: a folder written by `retromae pretrain` (config.json of one of our methods, model.safetensors,
            tokenizer files, optionally retromae_run.json).
        output_dir: the folder to create. Built in a temporary sibling and renamed into place when complete.
        overwrite: replace a non-empty `output_dir` (only after the new folder is complete).
        model_name: name for the model card; default `<method>-<base model name>` (or `<method>-<output folder>`).
        pooling: "cls" (the methods' representation) or "mean", e.g. to keep the head of a base model such as
            all-MiniLM-L6-v2 whose pre-training was continued. Not for DupMAE, whose export has its own module.
        similarity: "dot" or "cosine" (adds a Normalize module); default cosine for mean pooling, else dot (cosine
            for a SentMAE model trained with the cosine loss).
        exporter: writes the folder in place of the method's own exporter (`export.parts`: DupMAE's parts).

    Returns:
        `output_dir` as a `Path`.

    Raises:
        ValueError: the folder is not a complete checkpoint of one of our methods, `output_dir` exists and
            `overwrite` is False, or `model_name` cannot name a Hub repository (`publishing.check_model_name`).
        TypeError: a path that is no str or `os.PathLike`, an `overwrite` that is not a bool, a `model_name` that is
            no str.
    """
    check_path("export_sentence_transformer", "checkpoint", checkpoint, "give the checkpoint folder (a str or "
               "os.PathLike); for a model in memory use export_from_model(model, tokenizer, output_dir)")
    check_path("export_sentence_transformer", "output_dir", output_dir)
    check_bool("export_sentence_transformer", "overwrite", overwrite)
    if model_name is not None:
        if not isinstance(model_name, str):
            raise TypeError(f"export_sentence_transformer: model_name={model_name!r} is not a str; give NAME or "
                            "OWNER/NAME, or None")
        check_model_name(model_name)  # the command line's check: the card's usage lines load OWNER/NAME
    check_pooling(pooling, similarity)
    checkpoint, output_dir = Path(checkpoint), Path(output_dir)
    method, config = read_checkpoint_config(checkpoint)
    in_checkpoint = next((p for p in (output_dir.absolute(), *output_dir.absolute().parents)
                          if is_trainer_checkpoint(p)), None)
    if in_checkpoint is not None:
        raise ValueError(f"output folder {output_dir} is or lies in the training checkpoint {in_checkpoint}, which "
                         "resuming the run needs; choose another folder")
    claim_output(output_dir, "output folder", overwrite, inputs={"the checkpoint": checkpoint}, owner=model_holding)
    check_tokenizer_saved(checkpoint, purpose="export")  # saved without one: say how to add it
    check_model_folder(checkpoint, purpose="export")  # e.g. a run killed mid-save (no tokenizer vocabulary)
    run_info = read_run_info(checkpoint)
    if exporter is not None:
        method = dataclasses.replace(method, exporter=exporter)
    request = ExportRequest(
        method=method,
        config=config,
        state_dict=read_state_dict(checkpoint),
        tokenizer=load_tokenizer(checkpoint),
        run_info=run_info,
        model_name=model_name or default_model_name(method, run_info, output_dir),
        folder_name=output_dir.name,
        pooling=pooling,
        similarity=similarity,
    )
    try:
        return export_request(request, output_dir, overwrite=overwrite)
    except CheckpointError as error:  # the weights do not fit the config
        raise ValueError(f"{checkpoint}: {error}") from None


def export_from_model(
    model: PretrainingBase,
    tokenizer: PreTrainedTokenizerBase,
    output_dir: str | os.PathLike,
    run_info: dict[str, Any] | None = None,
    overwrite: bool = False,
    *,
    model_name: str | None = None,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Export an in-memory pre-training model (e.g. from the Trainer's `save_model`); same output as
    `export_sentence_transformer`. Call it on the main process only; a sharded (FSDP) model's weights must come as
    `state_dict`, gathered by every process beforehand (`training.sharding.full_state_dict`).

    Args:
        model: a `*ForPretraining` model of one of our methods (unwrapped, not DDP/FSDP-wrapped).
        tokenizer: its tokenizer.
        output_dir: the folder to create.
        run_info: the run record (schema of `retromae_run.json`), or None when not available.
        overwrite: replace a non-empty `output_dir`.
        model_name: name for the model card (default as in `export_sentence_transformer`).
        state_dict: the model's whole weights (default: `model.state_dict()`, which a sharded model holds in part).
    """
    if not isinstance(model, PretrainingBase):
        raise ValueError(
            f"export_from_model expects a retromae *ForPretraining model, got {type(model).__name__}; "
            "unwrap it first (e.g. accelerator.unwrap_model(model))"
        )
    if state_dict is None and is_sharded(model):  # its state dict is this process's shards: a partial export
        raise ValueError("export_from_model got a sharded (FSDP) model without its whole weights; gather them on "
                         "every process with training.sharding.full_state_dict(model) and pass them as state_dict, "
                         "or export the saved checkpoint: retromae export CHECKPOINT OUTPUT")
    output_dir = Path(output_dir)
    # the config class's model_type, as its to_dict() and config.json give it
    method = method_of(type(model.config).model_type, type(model).__name__, hint=f"known methods: {', '.join(METHODS)}")
    claim_output(output_dir, "output folder", overwrite, owner=model_holding)
    request = ExportRequest(
        method=method,
        config=model.config.to_dict(),
        state_dict=model.state_dict() if state_dict is None else state_dict,
        tokenizer=tokenizer,
        run_info=run_info,
        model_name=model_name or default_model_name(method, run_info, output_dir),
        folder_name=output_dir.name,
    )
    return export_request(request, output_dir, overwrite=overwrite)


def export_request(request: ExportRequest, output_dir: Path, *, overwrite: bool) -> Path:
    """Run the method's exporter in a temporary sibling folder, then move the finished folder into place
    (`atomic_folder`, which also removes the temporary folders of an earlier, killed export to the same place)."""
    if request.method.representation != "cls" and (request.pooling, request.similarity) != ("cls", None):
        raise ValueError(
            f"--pooling and --similarity apply to the CLS methods; {request.method.name}'s export builds its own "
            "representation (for DupMAE: build_dupmae_sentence_transformer(..., representation=...))"
        )
    with atomic_folder(output_dir, overwrite=overwrite) as build_dir:
        request.method.exporter(request, build_dir)
    logger.info("Exported %s encoder to %s", request.method.name, output_dir)
    return output_dir


def export_encoder(
    method: Method,
    encoder: str | os.PathLike | nn.Module,
    tokenizer: PreTrainedTokenizerBase | None,
    output_dir: str | os.PathLike,
    *,
    max_seq_length: int | None = None,
    overwrite: bool = False,
    model_name: str | None = None,
    **representation: Any,
) -> SentenceTransformer:
    """Export an encoder of `method` as a sentence-transformers folder and load it back.

    Args:
        method: the registry entry whose classes `encoder` is of, and whose exporter writes the folder.
        encoder: the method's pre-training model, or its encoder (`encoder_class` on a BERT base,
            `any_encoder_class` on RoBERTa, XLM-R or ModernBERT) instance, or the folder of either (a
            `retromae pretrain` checkpoint, or a saved encoder, e.g. after fine-tuning DupMAE's W^cls).
        tokenizer: its tokenizer; None = read it from the `encoder` folder.
        output_dir: the folder to create (built in a temporary sibling, renamed into place).
        max_seq_length: the Transformer's maximum length (default 512, capped by the position embeddings).
        overwrite: replace a non-empty `output_dir`.
        model_name: name for the model card (default `<method>-<output folder>`).
        **representation: overrides of the config fields `method.export_overrides` names (DupMAE:
            `representation`, `dense_dim`, `doc_top_k`, `query_top_k`, `ot_activation`, `sparse_weight`; a changed
            `dense_dim` gets a fresh projection).

    Returns:
        The exported model, loaded with `SentenceTransformer(output_dir)` (`trust_remote_code=True` for a folder
        with remote code: DupMAE's).
    """
    unknown = set(representation) - set(method.export_overrides)
    if unknown:
        raise ValueError(
            f"unknown representation overrides {sorted(unknown)}; allowed: {', '.join(method.export_overrides)}"
        )
    output_dir = Path(output_dir)
    claim_output(output_dir, "output folder", overwrite,
                 inputs={"the encoder": encoder} if isinstance(encoder, str | os.PathLike) else None,
                 owner=model_holding)
    if isinstance(encoder, str | os.PathLike):
        folder = Path(encoder)
        if tokenizer is None:
            check_tokenizer_saved(folder, purpose="export")
        check_model_folder(folder, purpose="export", tokenizer=tokenizer is None)
        folder_config = read_json_or_empty(folder / "config.json")
        if (is_pretraining_checkpoint_of(folder_config, method) and tokenizer is None and not representation
                and not max_seq_length):
            # a `retromae pretrain` checkpoint as is: the generic exporter (run info, model card) does it
            export_sentence_transformer(folder, output_dir, overwrite=overwrite, model_name=model_name)
            return _load_export(output_dir)
        tokenizer = tokenizer or load_tokenizer(folder)
        encoder = method.encoder_class_for(folder_config).from_pretrained(str(folder))
    if tokenizer is None:
        raise ValueError("pass the tokenizer of an in-memory encoder")
    config, state = _config_and_state(method, encoder)
    config.update(representation)
    request = ExportRequest(
        method=method,
        config=config,
        state_dict=state,
        tokenizer=tokenizer,
        run_info={"max_seq_length": max_seq_length} if max_seq_length else None,
        model_name=model_name or f"{method.name}-{output_dir.name}",
        folder_name=output_dir.name,
    )
    with atomic_folder(output_dir, overwrite=overwrite) as build_dir:
        method.exporter(request, build_dir)
    return _load_export(output_dir)


def build_dupmae_sentence_transformer(
    encoder: str | os.PathLike | nn.Module,
    tokenizer: PreTrainedTokenizerBase | None,
    output_dir: str | os.PathLike,
    **options: Any,
) -> SentenceTransformer:
    """`export_encoder` of DupMAE (same arguments after `method`), under the name scripts and messages use."""
    return export_encoder(get_method("dupmae"), encoder, tokenizer, output_dir, **options)


def _config_and_state(method: Method, encoder: nn.Module) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The config dict and weights of one of `method`'s models, the weights under the pre-training model's names
    (`bert.` / `roberta.` / `model.` before the encoder's); a `TypeError` for any other object."""
    model_class = method.model_class
    if isinstance(encoder, model_class | model_class.any_encoder_class):  # already under the prefix
        return encoder.config.to_dict(), dict(encoder.state_dict())
    if isinstance(encoder, model_class.encoder_class):  # a BERT base: its unprefixed BertModel names
        prefix = backbone_of(encoder.config).prefix
        return encoder.config.to_dict(), {
            (f"{prefix}.{k}" if k.startswith(("embeddings.", "encoder.")) else k): v
            for k, v in encoder.state_dict().items()
        }
    expected = (model_class.encoder_class, model_class.any_encoder_class, model_class)
    raise TypeError(f"expected a {', '.join(c.__name__ for c in expected)} or a folder, got {type(encoder).__name__}")


def _load_export(folder: Path) -> SentenceTransformer:
    """An export just written, loaded back (with its remote code, where it has some: DupMAE's module)."""
    return SentenceTransformer(str(folder), trust_remote_code=needs_remote_code(folder))


def load_as_sentence_transformer(
    model_ref: str | os.PathLike,
    *,
    pooling: str | None = None,
    max_seq_length: int | None = None,
    work_dir: str | os.PathLike | None = None,
    device: str | None = None,
) -> tuple[SentenceTransformer, dict[str, Any]]:
    """A model to fine-tune or evaluate, as a `SentenceTransformer`; a pre-training checkpoint is exported first.

    Args:
        model_ref: a sentence-transformers folder, a `retromae pretrain` checkpoint (exported into `work_dir`), a
            plain HF encoder folder (CLS pooling by default, with a warning), or a Hub id; see
            `inputs.sentence_models.load_sentence_transformer`.
        pooling: only for folders without modules.json (a pre-training checkpoint or a plain encoder): "cls"
            (default, dot product) or "mean" (cosine).
        max_seq_length: override the model's maximum length.
        work_dir: where a pre-training checkpoint is exported to (required for those).
        device: torch device (default: sentence-transformers' choice).

    Returns:
        `(model, info)`: info has `kind` (sentence-transformers | retromae-checkpoint | transformers | hub),
        `pretraining_method` (or None), `trust_remote_code`, and `pooling_assumed` for a folder without modules.json.
    """
    path = Path(model_ref).expanduser()
    info: dict[str, Any] = {"kind": "hub", "pretraining_method": None, "trust_remote_code": False}
    if path.is_dir():
        check_model_folder(path, purpose="--model")
        method = pretraining_method(path)
        info["pretraining_method"] = method
        if not (path / "modules.json").is_file() and (path / "config.json").is_file() and method is not None:
            if work_dir is None:
                raise ValueError(f"{path.name} is a pre-training checkpoint; pass a work folder to export it into")
            exported = Path(work_dir) / "pretrained-encoder"
            logger.info("exporting the %s pre-training checkpoint %s to %s", method, path.name, exported)
            export_sentence_transformer(path, exported, overwrite=True, pooling=pooling or "cls")
            info["kind"] = "retromae-checkpoint"
            path, pooling = exported, None  # the export holds the pooling now
        if (path / "modules.json").is_file():
            if info["kind"] == "hub":
                info["kind"] = "sentence-transformers"
            info["trust_remote_code"] = needs_remote_code(path)
        else:
            info.update(kind="transformers", pooling_assumed=pooling or "cls")
        model_ref = path
    model = load_sentence_transformer(model_ref, pooling=pooling, device=device)
    _check_vocabulary(model, Path(model_ref).name)
    if max_seq_length is not None:
        _set_max_seq_length(model, max_seq_length)
    return model, info


def _check_vocabulary(model: SentenceTransformer, name: str) -> None:
    """Refuses a tokenizer with more tokens than the model has word embeddings (its higher ids would fail inside
    torch)."""
    auto_model = getattr(model[0], "auto_model", None)
    tokenizer = getattr(model, "tokenizer", None)
    if auto_model is None or tokenizer is None:
        return
    rows = auto_model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > rows:
        raise ValueError(f"{name}: its tokenizer has {len(tokenizer)} tokens but the model has {rows} word "
                         "embeddings (vocab_size in config.json); give the model the tokenizer it was trained with")


def _set_max_seq_length(model: SentenceTransformer, max_seq_length: int) -> None:
    """Refuses a length the encoder's positions cannot hold (longer inputs would fail inside torch), and one too
    short for the special tokens and a text token (the tokenizer then leaves every text untruncated)."""
    config = getattr(getattr(model[0], "auto_model", None), "config", None)
    limit = usable_positions(config) if getattr(config, "max_position_embeddings", None) else None
    tokenizer = getattr(model, "tokenizer", None)
    lowest = 1 + (tokenizer.num_special_tokens_to_add(pair=False) if tokenizer is not None else 0)
    if max_seq_length < lowest or (limit is not None and max_seq_length > limit):
        upper = limit or "the encoder's limit"
        raise ValueError(f"--max-seq-length {max_seq_length}: give {lowest} to {upper} (tokens per text, special "
                         "tokens included)")
    model.max_seq_length = max_seq_length


def pretraining_method(folder: Path) -> str | None:
    """The name of the retromae method of a pre-training checkpoint or of an export (`methods.method_of_folder`)."""
    method = method_of_folder(folder)
    return method.name if method is not None else None


def read_checkpoint_config(checkpoint: Path) -> tuple[Method, dict[str, Any]]:
    """The method and config.json of a pre-training checkpoint; ValueError for anything else."""
    if not checkpoint.exists():
        raise ValueError(f"checkpoint folder {checkpoint} does not exist; {EXPECTS}")
    if not checkpoint.is_dir():
        raise ValueError(f"{checkpoint} is not a folder; {EXPECTS}")
    config_file = checkpoint / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{checkpoint} is not a retromae checkpoint: no config.json; {EXPECTS}")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{checkpoint} is not a retromae checkpoint: config.json is not valid JSON ({error})") from None
    return method_of(config.get("model_type"), str(checkpoint)), config


def method_of(model_type: Any, subject: str, hint: str = EXPECTS) -> Method:
    """The registry entry of a config's `model_type`; ValueError naming `subject` when it is not one of ours."""
    try:
        return method_of_config(model_type)
    except ValueError:
        raise ValueError(
            f"{subject} is not a retromae checkpoint: config.json model_type {model_type!r}; {hint}"
        ) from None


def read_run_info(checkpoint: Path) -> dict[str, Any] | None:
    """The checkpoint's `retromae_run.json`, or None when it has none (the card then says "not recorded")."""
    path = checkpoint / RUN_INFO_FILE
    if not path.is_file():
        logger.info("%s has no %s; the model card says 'not recorded'", checkpoint, RUN_INFO_FILE)
        return None
    run_info = read_json_or_empty(path)
    if not run_info:
        logger.warning("%s is not a JSON object; the model card says 'not recorded'", path)
    return run_info or None


def default_model_name(method: Method, run_info: dict[str, Any] | None, output_dir: Path) -> str:
    """`<method>-<base model name>`, or `<method>-<output folder>` when no base model is recorded."""
    base_model = (run_info or {}).get("base_model")
    stem = public_name(base_model).split("/")[-1] if base_model else output_dir.name
    return stem if stem.lower().startswith(method.name) else f"{method.name}-{stem}"


__all__ = [
    "ExportRequest", "build_dupmae_sentence_transformer", "default_model_name", "export_encoder", "export_from_model",
    "export_request", "export_sentence_transformer", "is_pretraining_checkpoint_of", "load_as_sentence_transformer",
    "method_of", "pretraining_method", "read_checkpoint_config", "read_run_info"
]
