"""The registry of pre-training methods: the one place that knows how the methods differ.

Each `Method` names its model class (modeling/), its paper, how its training data and collator are built, which
config settings decide something before the model is built, how its encoder is exported and what that export encodes
(its representation, the vectors a validation scores, the metrics it logs, its own sentence-transformers module).
The drivers (`pretrain`, `export`, ...) only ask the registry, also to recognise a method's checkpoint
(`method_of_config`, `method_of_folder`) or a hybrid sentence-transformers model (`hybrid_method_of`); adding a
method means a model in modeling/, an entry in `METHODS` and tests.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from huggingface_hub import ModelCard
from retromae.modeling.backbones import BertBackbone, encoder_type_of_config
from retromae.modeling.configuration_retromae import rename_legacy_keys
from retromae.modeling.modeling_bow import BoWForPretraining
from retromae.modeling.modeling_dupmae import DupMAEForPretraining
from retromae.modeling.modeling_retromae import RetroMAEForPretraining
from retromae.modeling.modeling_seed import SEEDEncoderForPretraining
from retromae.modeling.modeling_sentmae import SentMAEForPretraining
from torch import nn

from .data.collator import DataInputs, TrainingData
from .data.training_data import contrastive_training_data, corpus_training_data, pair_positive_settings
from .export.cards import Paper, read_papers
from .export.cls import Exporter, PoolingModule, SentenceVectors, cls_sentence_vectors, write_cls_encoder
from .export.dupmae import DUPMAE_POOLING, REPRESENTATION_FIELDS, hybrid_sentence_vectors, write_dupmae_export
from .inputs.io import read_json_or_empty

# builds a method's training data from its (already built) config, the tokenizer and the run's data inputs
TrainingDataBuilder = Callable[[Any, Any, DataInputs], TrainingData]
# config settings the data inputs decide before the model is built (given the settings the user asked for)
DataSettings = Callable[[DataInputs, dict[str, Any]], dict[str, Any]]


def no_data_settings(inputs: DataInputs, requested: dict[str, Any]) -> dict[str, Any]:
    return {}


@dataclass
class MethodArguments:
    """`retromae pretrain`'s flags for method config settings. A flag applies to every method whose config has the
    field of that name (`Method.settings`); given for another method, it is refused."""

    encoder_mask_ratio: float | None = field(default=None, metadata={"help": "encoder MLM mask ratio in (0, 1); default 0.3"})
    decoder_mask_ratio: float | None = field(default=None, metadata={"help": "decoder mask ratio in (0, 1); default 0.5"})
    decoding: Literal["enhanced", "basic"] | None = field(
        default=None, metadata={"help": "RetroMAE decoding: enhanced (paper default) or basic (Table 6 ablation)"}
    )
    num_decoder_layers: int | None = field(default=None, metadata={"help": "decoder layers (1; 1-3 with basic decoding)"})
    query_stream: Literal["position", "embeddings"] | None = field(
        default=None, metadata={"help": "decoder queries: h + p_i (position, paper) or the embedding module (embeddings)"}
    )
    decoder_init: Literal["bert", "copy_last_layer"] | None = field(
        default=None, metadata={"help": "fresh decoder: BERT init, or a copy of the encoder's last layer"}
    )
    whole_word_mask: bool | None = field(default=None, metadata={"help": "mask whole words in the encoder input (default on)"})
    method_options: str | None = field(
        default=None, metadata={"help": 'other config fields of the method as JSON, e.g. \'{"bow_loss_weight": 0.1}\''}
    )

    def given(self) -> dict[str, Any]:
        """The settings given by their own flags (not `--method-options`), by config field name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "method_options" and getattr(self, f.name) is not None}

    def options(self) -> dict[str, Any]:
        """`--method-options` as a dict."""
        if not self.method_options:
            return {}
        try:
            options = json.loads(self.method_options)
        except json.JSONDecodeError as error:
            raise ValueError(f"--method-options is not valid JSON: {error}") from None
        if not isinstance(options, dict):
            raise ValueError("--method-options must be a JSON object")
        return options


SETTING_FLAGS = tuple(f.name for f in dataclasses.fields(MethodArguments) if f.name != "method_options")


@dataclass(frozen=True)
class Method:
    """A pre-training method.

    Args:
        name: the value of `retromae pretrain --method`.
        model_class: its `*ForPretraining` class (a `PretrainingBase` subclass).
        paper: its paper (BibTeX entry and address, cited by model cards), from `model_cards/papers.bib`.
        summary: one line for `retromae methods` and model cards ("Title: what it does").
        exporter: writes the sentence-transformers folder of a checkpoint into an empty build folder.
        training_data: builds the dataset and collator of a run from the model's config.
        data_settings: config settings the data inputs decide before the model is built (e.g. `--pairs`).
        representation: what its export encodes: "cls" (the [CLS] state, plain sentence-transformers modules) or
            "hybrid" (dense + sparse parts, in its own `pooling_module`).
        sentence_vectors: the vectors of a batch a retrieval validation scores, from the model's encoder states.
        metric_prefixes: the prefixes of the metrics a validation logs: "" for its representation, and one for each
            other part `sentence_vectors` returns (DupMAE: "cls_", its [CLS] part).
        export_overrides: the config fields `export.sentence_transformer.export_encoder` may change at export time.
        pooling_module: the sentence-transformers module of its export (hybrid), else None.
        finetuning_recipe: `retromae finetune` follows its paper's recipe, so every fine-tuned card cites it.
    """

    name: str
    model_class: type
    paper: Paper
    summary: str
    exporter: Exporter = write_cls_encoder
    training_data: TrainingDataBuilder = corpus_training_data
    data_settings: DataSettings = no_data_settings
    representation: Literal["cls", "hybrid"] = "cls"
    sentence_vectors: SentenceVectors = cls_sentence_vectors
    metric_prefixes: tuple[str, ...] = ("",)
    export_overrides: tuple[str, ...] = ()
    pooling_module: PoolingModule | None = None
    finetuning_recipe: bool = False

    @property
    def config_fields(self) -> dict[str, dataclasses.Field]:
        return {f.name: f for f in dataclasses.fields(self.model_class.config_class)}

    @property
    def settings(self) -> tuple[str, ...]:
        """The setting flags (`MethodArguments`) that apply to this method: those naming a field of its config."""
        return tuple(name for name in SETTING_FLAGS if name in self.config_fields)

    @property
    def continues_from(self) -> tuple[str, ...]:
        """The model types of other methods' checkpoints this method continues (SentMAE stage 2: a retromae one)."""
        return getattr(self.model_class, "continues_from", ())

    @property
    def pooling_label(self) -> str | None:
        """How a fine-tuning record's `pooling` names its own module (`PoolingModule.label`); None without one."""
        return self.pooling_module.label if self.pooling_module is not None else None

    def encoder_class_for(self, config: Mapping[str, Any]) -> type:
        """Its encoder (`AutoModel`) class for a config.json's base: `encoder_class` on BERT (a plain BertModel's
        names), `any_encoder_class` on any other (as `save_pretrained`'s auto_map)."""
        on_bert = encoder_type_of_config(config) in BertBackbone.model_types
        return self.model_class.encoder_class if on_bert else self.model_class.any_encoder_class

    def config_settings(self, arguments: MethodArguments, inputs: DataInputs, tokenizer: Any) -> dict[str, Any]:
        """The config fields a run sets: setting flags, `--method-options`, what the data decides and the tokenizer's
        special ids. Integers given for float fields become floats (a config is a strict dataclass).

        Raises:
            ValueError: a setting that is not a field of this method's config, one set both by its flag and in
                `--method-options`, or invalid `--method-options`.
        """
        given, options = arguments.given(), arguments.options()
        # keys a config had before a rename still load (with a deprecation warning), as in its saved config.json
        config_class = self.model_class.config_class
        options.update(rename_legacy_keys(config_class.__name__, options, getattr(config_class, "legacy_keys", {})))
        both = sorted(set(given) & set(options))
        if both:  # which one counts would be a guess
            flags = ", ".join(f"--{name.replace('_', '-')}" for name in both)
            raise ValueError(f"{', '.join(both)} set both by {flags} and in method_options; set it once (a "
                             "--method-options on the command line overrides the config file's keys one by one)")
        requested = {**given, **options}
        requested.update(self.data_settings(inputs, requested))
        fields = self.config_fields
        not_applicable = sorted(set(requested) - set(fields))
        if not_applicable:
            raise ValueError(f"setting(s) {', '.join(not_applicable)} do not apply to method {self.name!r}")
        settings = {name: float(value) if "float" in str(fields[name].type) and type(value) is int else value
                    for name, value in requested.items()}
        if "mask_token_id" in fields and tokenizer.mask_token_id is not None:
            settings.setdefault("mask_token_id", tokenizer.mask_token_id)
        if "special_token_ids" in fields:
            settings.setdefault("special_token_ids", sorted(set(tokenizer.all_special_ids)))
        return settings


PAPERS = read_papers()

METHODS: dict[str, Method] = {
    "retromae": Method("retromae", RetroMAEForPretraining, PAPERS["xiao2022retromae"],
                       "RetroMAE: encoder MLM + one-layer decoder reconstructing the input from the [CLS] embedding",
                       finetuning_recipe=True),
    "bow": Method("bow", BoWForPretraining, PAPERS["ma2024drop"],
                  "Bag-of-Word prediction: encoder MLM + predicting the input's token set from [CLS] (no decoder)"),
    "seed": Method("seed", SEEDEncoderForPretraining, PAPERS["lu2021less"],
                   "SEED-Encoder: encoder MLM + weak 3-layer auto-regressive decoder seeing [CLS] and the previous 2 tokens"),
    "dupmae": Method("dupmae", DupMAEForPretraining, PAPERS["liu2023retromae2"],
                     "DupMAE: RetroMAE's [CLS] decoding + bag-of-words decoding from the max-pooled ordinary-token logits",
                     exporter=write_dupmae_export, representation="hybrid", sentence_vectors=hybrid_sentence_vectors,
                     metric_prefixes=("", "cls_"), export_overrides=REPRESENTATION_FIELDS, pooling_module=DUPMAE_POOLING,
                     finetuning_recipe=True),
    "sentmae": Method(
        "sentmae", SentMAEForPretraining, PAPERS["liu2022sentmae"],
        "SentMAE stage 2: RetroMAE continued from a stage-1 retromae checkpoint + in-batch contrastive loss on [CLS]",
        training_data=contrastive_training_data, data_settings=pair_positive_settings,
    ),
}
DEFAULT_METHOD = "retromae"  # `retromae pretrain --method`'s default


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose one of {', '.join(sorted(METHODS))}")
    return METHODS[name]


def method_of_config(model_type: str) -> Method:
    """The method whose config has this `model_type` (e.g. read from a checkpoint's config.json)."""
    for method in METHODS.values():
        if method.model_class.config_class.model_type == model_type:
            return method
    raise ValueError(
        f"model_type {model_type!r} is not a retromae pre-training checkpoint; known: "
        f"{', '.join(m.model_class.config_class.model_type for m in METHODS.values())}"
    )


def sentence_vectors_of(model_type: str) -> SentenceVectors:
    """The sentence-vector function of the method whose config has this `model_type`; [CLS] for any other model."""
    try:
        return method_of_config(model_type).sentence_vectors
    except ValueError:  # e.g. a plain encoder: its [CLS] state
        return cls_sentence_vectors


def method_of_folder(folder: Path) -> Method | None:
    """The method of a pre-training checkpoint (its config's model_type) or of an export (its model card's tags: the
    library's "retromae" and the method's name); None for any other folder."""
    model_type = read_json_or_empty(folder / "config.json").get("model_type")
    if model_type is not None:
        try:
            return method_of_config(model_type)
        except ValueError:
            pass
    readme = folder / "README.md"
    if readme.is_file():
        try:
            tags = ModelCard.load(readme).data.to_dict().get("tags") or []
        except Exception:  # a hand-written README without front matter
            return None
        if "retromae" in tags:
            return next((METHODS[t] for t in tags if t in METHODS), None)
    return None


def hybrid_method_of(model: nn.Module) -> Method | None:
    """The method whose own module a sentence-transformers model embeds with (`Method.pooling_module`): how an
    exported or fine-tuned hybrid model, which has no pre-training config, is recognised; None for a dense model."""
    for method in METHODS.values():
        module = method.pooling_module
        if module is not None and any(module.recognises(m) for m in model.modules()):
            return method
    return None


def list_methods(argv: list[str]) -> int:
    """`retromae methods`: one line per method."""
    if argv and argv[0] not in {"-h", "--help"}:
        raise ValueError(f"unknown option(s): {' '.join(argv)} (`retromae methods` takes none)")
    for method in METHODS.values():
        print(f"{method.name:12s} {method.summary}")
    return 0


__all__ = [
    "DEFAULT_METHOD", "METHODS", "PAPERS", "SETTING_FLAGS", "DataSettings", "Method", "MethodArguments",
    "TrainingDataBuilder", "get_method", "hybrid_method_of", "list_methods", "method_of_config", "method_of_folder",
    "no_data_settings", "sentence_vectors_of",
]
