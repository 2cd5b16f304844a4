"""The registry of pre-training methods: the one place that knows how the methods differ.

Each `Method` names its model class (modeling/), its paper, how its training data and collator are built, which
config settings decide something before the model is built, and how its encoder is exported. The drivers
(`pretrain`, `export`, ...) only ask the registry; adding a method means a model in modeling/, an entry in
`METHODS` and tests.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from retromae.modeling.configuration_retromae import rename_legacy_keys
from retromae.modeling.modeling_bow import BoWForPretraining
from retromae.modeling.modeling_dupmae import DupMAEForPretraining
from retromae.modeling.modeling_retromae import RetroMAEForPretraining
from retromae.modeling.modeling_seed import SEEDEncoderForPretraining
from retromae.modeling.modeling_sentmae import SentMAEForPretraining

from .contrastive_data import contrastive_training_data, corpus_training_data, pair_positive_settings
from .core.cards import Paper, read_papers
from .core.errors import UserError
from .data import DataInputs, TrainingData
from .export_cls import Exporter, write_cls_encoder
from .export_dupmae import write_dupmae_export

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
            raise UserError(f"--method-options is not valid JSON: {error}") from None
        if not isinstance(options, dict):
            raise UserError("--method-options must be a JSON object")
        return options


SETTING_FLAGS = tuple(f.name for f in dataclasses.fields(MethodArguments) if f.name != "method_options")


@dataclass(frozen=True)
class Method:
    """A pre-training method.

    Args:
        name: the value of `retromae pretrain --method`.
        model_class: its `*ForPretraining` class (a `BertPretrainingBase` subclass).
        paper: its paper (BibTeX entry and address, cited by model cards), from `model_cards/papers.bib`.
        summary: one line for `retromae methods` and model cards ("Title: what it does").
        exporter: writes the sentence-transformers folder of a checkpoint into an empty build folder.
        training_data: builds the dataset and collator of a run from the model's config.
        data_settings: config settings the data inputs decide before the model is built (e.g. `--pairs`).
    """

    name: str
    model_class: type
    paper: Paper
    summary: str
    exporter: Exporter = write_cls_encoder
    training_data: TrainingDataBuilder = corpus_training_data
    data_settings: DataSettings = no_data_settings

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

    def config_settings(self, arguments: MethodArguments, inputs: DataInputs, tokenizer: Any) -> dict[str, Any]:
        """The config fields a run sets: setting flags, `--method-options`, what the data decides and the tokenizer's
        special ids. Integers given for float fields become floats (a config is a strict dataclass).

        Raises:
            UserError: a setting that is not a field of this method's config, one set both by its flag and in
                `--method-options`, or invalid `--method-options`.
        """
        given, options = arguments.given(), arguments.options()
        # keys a config had before a rename still load (with a deprecation warning), as in its saved config.json
        config_class = self.model_class.config_class
        options.update(rename_legacy_keys(config_class.__name__, options, getattr(config_class, "legacy_keys", {})))
        both = sorted(set(given) & set(options))
        if both:  # which one counts would be a guess
            flags = ", ".join(f"--{name.replace('_', '-')}" for name in both)
            raise UserError(f"{', '.join(both)} set both by {flags} and in method_options; set it once (a "
                            "--method-options on the command line overrides the config file's keys one by one)")
        requested = {**given, **options}
        requested.update(self.data_settings(inputs, requested))
        fields = self.config_fields
        not_applicable = sorted(set(requested) - set(fields))
        if not_applicable:
            raise UserError(f"setting(s) {', '.join(not_applicable)} do not apply to method {self.name!r}")
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
                       "RetroMAE: encoder MLM + one-layer decoder reconstructing the input from the [CLS] embedding"),
    "bow": Method("bow", BoWForPretraining, PAPERS["ma2024drop"],
                  "Bag-of-Word prediction: encoder MLM + predicting the input's token set from [CLS] (no decoder)"),
    "seed": Method("seed", SEEDEncoderForPretraining, PAPERS["lu2021less"],
                   "SEED-Encoder: encoder MLM + weak 3-layer auto-regressive decoder seeing [CLS] and the previous 2 tokens"),
    "dupmae": Method("dupmae", DupMAEForPretraining, PAPERS["liu2023retromae2"],
                     "DupMAE: RetroMAE's [CLS] decoding + bag-of-words decoding from the max-pooled ordinary-token logits",
                     exporter=write_dupmae_export),
    "sentmae": Method(
        "sentmae", SentMAEForPretraining, PAPERS["liu2022sentmae"],
        "SentMAE stage 2: RetroMAE continued from a stage-1 retromae checkpoint + in-batch contrastive loss on [CLS]",
        training_data=contrastive_training_data, data_settings=pair_positive_settings,
    ),
}


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise UserError(f"unknown method {name!r}; choose one of {', '.join(sorted(METHODS))}")
    return METHODS[name]


def method_of_config(model_type: str) -> Method:
    """The method whose config has this `model_type` (e.g. read from a checkpoint's config.json)."""
    for method in METHODS.values():
        if method.model_class.config_class.model_type == model_type:
            return method
    raise UserError(
        f"model_type {model_type!r} is not a retromae pre-training checkpoint; known: "
        f"{', '.join(m.model_class.config_class.model_type for m in METHODS.values())}"
    )


def list_methods(argv: list[str]) -> int:
    """`retromae methods`: one line per method."""
    if argv and argv[0] not in {"-h", "--help"}:
        raise UserError(f"unknown option(s): {' '.join(argv)} (`retromae methods` takes none)")
    for method in METHODS.values():
        print(f"{method.name:12s} {method.summary}")
    return 0


__all__ = [
    "METHODS", "PAPERS", "SETTING_FLAGS", "DataSettings", "Method", "MethodArguments", "TrainingDataBuilder", "get_method",
    "list_methods", "method_of_config", "no_data_settings",
]
