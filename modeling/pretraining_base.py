"""What every pre-training model shares: an encoder of a supported family (`backbones`), its tied MLM head, the
masked-position MLM loss, the forward pass, and the checkpoint format (`auto_map` for the four Auto classes)."""

import dataclasses
import logging
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
from torch.nn import functional as F
from transformers import BertConfig, BertModel, PreTrainedConfig
from transformers.modeling_outputs import BaseModelOutputWithPooling, BaseModelOutputWithPoolingAndCrossAttentions
from transformers.models.bert.modeling_bert import BertPreTrainedModel
from transformers.utils import ModelOutput

from .backbones import (
    BACKBONES,
    BertBackbone,
    DecoderEmbeddings,
    backbone_for,
    backbone_of,
    encoder_type_of,
    encoder_type_of_config,
    whole_for_editing,
)
from .loading import QuietLoadReportMixin, base_config_fields, checked_types
from .masked_lm import BaseInitMixin, EncoderHeadMixin, MaskedLMBase
from .vocab_losses import IGNORE_INDEX, linear_argmax_accuracy, linear_cross_entropy

logger = logging.getLogger(__name__)

# base weights no model here uses: the pooler (our sentence embedding is the [CLS] state) and BERT's NSP head
UNUSED_BERT_KEYS = (r"(^|\.)pooler\.", r"^cls\.seq_relationship\.")
# where `from_pretrained` finds a config on the Hub (read again to see the checkpoint's base)
HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder")
# tokenizer ids only RetroMAE's basic decoding reads; a config without the field drops them with this warning
COLLATOR_OPTIONS = {
    "mask_token_id": "its model reads no mask token (the collator masks the encoder input with the tokenizer's)",
}


@dataclass
class PretrainingOutput(ModelOutput):
    """Output of every `*ForPretraining` model.

    Args:
        loss: weighted sum of the components below that the method uses.
        encoder_mlm_loss: the encoder's masked-language-model loss (mean over masked tokens).
        decoder_loss: the decoder's reconstruction loss (mean over its target tokens).
        bow_loss: bag-of-words loss (DupMAE's OT decoding, BoW prediction).
        contrastive_loss: in-batch contrastive loss (SentMAE).
        sentence_embedding: `(batch_size, hidden_size)` last-layer [CLS] state of the masked encoder input.
        encoder_mlm_accuracy / decoder_accuracy: top-1 accuracies, while `measure_accuracy` is set (no gradient).
    """

    loss: torch.Tensor | None = None
    encoder_mlm_loss: torch.Tensor | None = None
    decoder_loss: torch.Tensor | None = None
    bow_loss: torch.Tensor | None = None
    contrastive_loss: torch.Tensor | None = None
    sentence_embedding: torch.Tensor | None = None
    encoder_mlm_accuracy: torch.Tensor | None = None
    decoder_accuracy: torch.Tensor | None = None


class BaseLayoutMixin:
    """`from_pretrained` / `_from_config` that build the encoder class of the config's base: two same-named local
    folders (`checkpoint-3` of a BERT and of a RoBERTa run) share one remote-code config class in transformers."""

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        if issubclass(cls, ClsEncoderModel) and not isinstance(kwargs.get("config"), PreTrainedConfig):
            _refuse_other_base(cls, args[0] if args else kwargs.get("pretrained_model_name_or_path"), kwargs)
        target = _encoder_class_for(cls, kwargs.get("config"))
        if target is not cls:
            return target.from_pretrained(*args, **kwargs)
        return super().from_pretrained(*args, **kwargs)

    @classmethod
    def _from_config(cls, config, **kwargs):
        target = _encoder_class_for(cls, config)
        if target is not cls:
            return target._from_config(config, **kwargs)
        return super()._from_config(config, **kwargs)


class ClsEncoderModel(BaseLayoutMixin, QuietLoadReportMixin, BertModel):
    """The `AutoModel` of a BERT-based checkpoint: a `BertModel` without pooler whose `pooler_output` is the
    last-layer [CLS] state; loads a pre-training checkpoint with the `bert.` prefix stripped and its heads left out."""

    quiet_missing_keys = UNUSED_BERT_KEYS  # a pooler asked for with add_pooling_layer=True: its output is replaced
    quiet_unexpected_keys = (*UNUSED_BERT_KEYS, r"^cls\.", r"^decoder\.")

    def __init__(self, config: BertConfig, add_pooling_layer: bool = False):
        super().__init__(config, add_pooling_layer=add_pooling_layer)

    def forward(self, *args, **kwargs) -> BaseModelOutputWithPoolingAndCrossAttentions:
        kwargs["return_dict"] = True
        output = super().forward(*args, **kwargs)
        output.pooler_output = output.last_hidden_state[:, 0]  # (batch_size, hidden_size)
        return output


class AnyEncoderModel(BaseLayoutMixin, BaseInitMixin, QuietLoadReportMixin, BertPreTrainedModel):
    """The `AutoModel` of a checkpoint on a RoBERTa, XLM-R or ModernBERT base: the base's model under its
    pre-training name (`roberta`, `model`), so the checkpoint's keys load as they are; `pooler_output` is the
    last-layer first-token state. Each method subclasses it with its `config_class`."""

    quiet_missing_keys = UNUSED_BERT_KEYS
    quiet_unexpected_keys = (*UNUSED_BERT_KEYS, r"^cls\.", r"^lm_head\.", r"^decoder\.")

    def __init__(self, config):
        super().__init__(config)
        self.backbone = backbone_of(config)
        self.base_model_prefix = self.backbone.prefix
        setattr(self, self.backbone.prefix, self.backbone.build_encoder(config))
        self.build_heads(config)
        self.post_init()

    def build_heads(self, config) -> None:
        """Modules a method's encoder adds on top of the base (DupMAE's), built before `post_init`."""

    def get_input_embeddings(self):
        return self.backbone.word_embeddings(self.base_model)

    def forward(
        self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None, **kwargs,
    ) -> BaseModelOutputWithPooling:
        if self.backbone.takes_token_type_ids:
            kwargs["token_type_ids"] = token_type_ids
        output = self.base_model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True, **kwargs)
        return BaseModelOutputWithPooling(
            last_hidden_state=output.last_hidden_state,
            pooler_output=output.last_hidden_state[:, 0],  # (batch_size, hidden_size)
            hidden_states=output.hidden_states,
            attentions=output.attentions,
        )


def _check_inputs(input_ids: torch.Tensor, **aligned: torch.Tensor | None) -> None:
    """Refuse `input_ids` other than a 2-D integer tensor (`TypeError`), `aligned` tensors of another shape and one
    label tensor without the other (`ValueError`). Not the ids' range: that needs a host sync every step."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.is_floating_point():
        is_tensor = isinstance(input_ids, torch.Tensor)
        got = f"{input_ids.dim()}-D {input_ids.dtype}" if is_tensor else type(input_ids).__name__
        raise TypeError(f"input_ids must be a (batch_size, seq_len) integer tensor, got {got}; tokenize a batch with "
                        "return_tensors='pt'")
    for name, tensor in aligned.items():
        if tensor is not None and getattr(tensor, "shape", None) != input_ids.shape:
            raise ValueError(f"{name} must have input_ids' shape {tuple(input_ids.shape)}, got "
                             f"{tuple(getattr(tensor, 'shape', ())) or type(tensor).__name__}")
    if (aligned["encoder_labels"] is None) != (aligned["decoder_labels"] is None):
        raise ValueError("pass both encoder_labels and decoder_labels (PretrainingCollator makes them) or neither")


class PretrainingBase(EncoderHeadMixin, BaseInitMixin, QuietLoadReportMixin, BertPreTrainedModel):
    """Encoder + MLM head named as in the base's `*ForMaskedLM` (BERT: `bert` + `cls`; see `backbones`), so the base's
    checkpoints load unchanged, and the forward pass every method shares.

    Subclasses set `config_class` and `encoder_class`, build their heads in `__init__` before `self.post_init()` and
    implement `method_losses` and `loss_weights`; their own batch keys go in `method_input_names`, extra rows through
    `method_batch`. `accepts_loss_kwargs = False`: the Trainer divides by gradient accumulation itself."""

    accepts_loss_kwargs = False
    supports_gradient_checkpointing = True
    encoder_class: type = ClsEncoderModel  # the `AutoModel` on a BERT base
    any_encoder_class: type = AnyEncoderModel  # the `AutoModel` on any other base
    masked_lm_class: type = MaskedLMBase  # the `AutoModelForMaskedLM` on any base
    # state-dict prefixes of the method's own new modules (reported as missing when starting from plain BERT)
    head_prefixes: tuple[str, ...] = ()
    # new when starting from BERT: the decoders and a bare BertModel's MLM head (`from_encoder_checkpoint` logs them)
    quiet_missing_keys = (r"^decoder\.", r"^cls\.predictions\.", r"^lm_head\.")
    quiet_unexpected_keys = (*UNUSED_BERT_KEYS, *(f"^{re.escape(k)}" for b in BACKBONES for k in b.base_head_prefixes))
    # the method's own batch keys, beyond the five every method takes
    method_input_names: tuple[str, ...] = ()
    # set for the forwards whose accuracies are wanted (the steps the Trainer logs): one more projection per term
    measure_accuracy: bool = False
    # the vocabulary losses' runtime options, never saved (`linear_cross_entropy`'s compiled, vocab_multiple, kernel)
    compile_loss: bool = False
    loss_vocab_multiple: int = 1
    loss_kernel: str = "chunked"

    def __init__(self, config: BertConfig):
        config.validate()  # fields set one by one after construction (`config.x = ...`) passed no class validator
        super().__init__(config)
        self.build_encoder_and_head(config)

    def decoder_embeddings(self) -> DecoderEmbeddings:
        """The encoder's embeddings as the decoders take them (`DecoderEmbeddings`)."""
        own_positions = getattr(getattr(self, "decoder", None), "position_embeddings", None)
        return DecoderEmbeddings(self.backbone, self.base_model, own_positions)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Last-layer hidden states `(batch_size, seq_len, hidden_size)`."""
        return self.backbone.encode(self.base_model, input_ids, attention_mask, token_type_ids)

    def mlm_loss(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of the tied MLM head where `labels` `(batch_size, seq_len)` != -100, from `hidden`
        `(batch_size, seq_len, hidden_size)`."""
        keep = labels.reshape(-1) != IGNORE_INDEX  # (B*L,)
        rows = hidden.reshape(-1, hidden.shape[-1])[keep]  # (n_labels, H)
        transform, weight, bias = self.head_parts()
        return linear_cross_entropy(transform(rows), weight, bias, labels.reshape(-1)[keep],
                                    chunk_size=self.config.loss_chunk_size, compiled=self.compile_loss,
                                    vocab_multiple=self.loss_vocab_multiple, kernel=self.loss_kernel)

    def mlm_accuracy(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The top-1 accuracy of the tied MLM head where `labels != -100` (shapes as `mlm_loss`'s); NaN when no
        label is set."""
        keep = labels.reshape(-1) != IGNORE_INDEX
        transform, weight, bias = self.head_parts()
        with torch.no_grad():
            return linear_argmax_accuracy(transform(hidden.reshape(-1, hidden.shape[-1])[keep]), weight, bias,
                                          labels.reshape(-1)[keep], chunk_size=self.config.loss_chunk_size)

    def decoder_terms(self, decoder_hidden: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        """`decoder_loss` of the tied MLM head on a decoder's states `(B, L, H)` against `targets` `(B, L)`, and its
        `decoder_accuracy` while `measure_accuracy` is set."""
        terms = {"decoder_loss": self.mlm_loss(decoder_hidden, targets)}
        if self.measure_accuracy:
            terms["decoder_accuracy"] = self.mlm_accuracy(decoder_hidden, targets)
        return terms

    def vocab_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The tied MLM head applied to `hidden` `(..., hidden_size)` -> `(..., vocab_size)`."""
        transform, weight, bias = self.head_parts()
        return F.linear(transform(hidden), weight, bias)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_labels: torch.Tensor | None = None,
        decoder_labels: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        **method_inputs: torch.Tensor,
    ) -> PretrainingOutput:
        r"""
        Args:
            input_ids: `(batch_size, seq_len)` encoder input, masked by the collator; [CLS] at position 0.
            attention_mask: `(batch_size, seq_len)`, 1 for real tokens (right padding).
            encoder_labels: `(batch_size, seq_len)` original ids at the encoder's masked positions, -100 elsewhere.
            decoder_labels: `(batch_size, seq_len)` original ids at every real non-special position, -100 elsewhere.
                Both label tensors, or neither: then only `sentence_embedding` is returned.
            token_type_ids: `(batch_size, seq_len)`, optional.
            **method_inputs: the method's own inputs (`method_input_names`); any other name raises `TypeError`.

        Returns:
            `PretrainingOutput`: `loss` = encoder_loss_weight * `encoder_mlm_loss` + the method's weighted terms;
            `sentence_embedding` `(batch_size, hidden_size)` of the given rows.
        """
        unknown = sorted(set(method_inputs) - set(self.method_input_names))
        if unknown:
            raise TypeError(
                f"{type(self).__name__}.forward() got unexpected inputs {unknown}; besides input_ids, attention_mask, "
                f"encoder_labels, decoder_labels and token_type_ids it takes {list(self.method_input_names)}"
            )
        _check_inputs(input_ids, attention_mask=attention_mask, encoder_labels=encoder_labels,
                      decoder_labels=decoder_labels, token_type_ids=token_type_ids)
        batch = self.method_batch(
            PretrainingBatch(input_ids, attention_mask, encoder_labels, decoder_labels, token_type_ids, method_inputs)
        )
        if batch.attention_mask is None:
            batch.attention_mask = torch.ones_like(batch.input_ids)
        hidden = self.encode(batch.input_ids, batch.attention_mask, batch.token_type_ids)  # (B', L, H)
        sentence_embedding = hidden[:, 0]  # (B', H); B' > B when the method added rows
        if encoder_labels is None or decoder_labels is None:
            return PretrainingOutput(sentence_embedding=sentence_embedding[: len(input_ids)])
        encoder_mlm_loss = self.mlm_loss(hidden, batch.encoder_labels)
        terms = self.method_losses(hidden, sentence_embedding, batch)
        if self.measure_accuracy:
            terms["encoder_mlm_accuracy"] = self.mlm_accuracy(hidden, batch.encoder_labels)
        weights = self.loss_weights()
        loss = weights["encoder_mlm_loss"] * encoder_mlm_loss
        for name, value in terms.items():
            if name.endswith("_loss"):
                loss = loss + weights[name] * value
        return PretrainingOutput(
            loss=loss,
            encoder_mlm_loss=encoder_mlm_loss,
            sentence_embedding=sentence_embedding[: len(input_ids)],
            **terms,
        )

    def method_batch(self, batch: "PretrainingBatch") -> "PretrainingBatch":
        """The rows the pass runs on (default: the batch as given); a method may merge in extra rows (SentMAE's
        positives), and `forward` returns the sentence embeddings of the first `batch_size` rows only."""
        return batch

    def method_losses(
        self, hidden: torch.Tensor, sentence_embedding: torch.Tensor, batch: "PretrainingBatch"
    ) -> dict[str, torch.Tensor]:
        """The method's loss terms by `PretrainingOutput` field (`decoder_loss`, `bow_loss`, `contrastive_loss`; terms
        switched off are left out), and `decoder_accuracy` while `measure_accuracy` is set.

        Args:
            hidden: `(batch_size, seq_len, hidden_size)` encoder states of the masked input.
            sentence_embedding: `(batch_size, hidden_size)` their [CLS] row.
            batch: the forward's inputs (`attention_mask` filled in), the unmasked ids as `batch.original_ids`.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement method_losses")

    def loss_weights(self) -> dict[str, float | torch.Tensor]:
        """The weight of each loss term in `loss`: `encoder_mlm_loss` and every key `method_losses` returns."""
        raise NotImplementedError(f"{type(self).__name__} must implement loss_weights")

    @classmethod
    def _class_ref(cls, klass: type) -> str:
        return f"{klass.__module__.rsplit('.', 1)[-1]}.{klass.__name__}"

    def save_pretrained(self, save_directory: str | os.PathLike, *args, **kwargs):
        """Save weights (safetensors), config with `auto_map` for the four Auto classes, and the modeling files."""
        cls = type(self)
        self.config.auto_map = {
            "AutoConfig": cls._class_ref(cls.config_class),
            "AutoModel": cls._class_ref(cls.encoder_class if self.backbone is BertBackbone else cls.any_encoder_class),
            "AutoModelForPreTraining": cls._class_ref(cls),
            "AutoModelForMaskedLM": cls._class_ref(cls.masked_lm_class),
        }
        self.config.architectures = [cls.__name__]
        kwargs.pop("safe_serialization", None)  # safetensors only
        return super().save_pretrained(save_directory, *args, **kwargs)

    @classmethod
    def from_encoder_checkpoint(
        cls, model_name_or_path: str | os.PathLike, attn_implementation: str | None = None, **config_overrides
    ):
        """Start pre-training from a masked-LM checkpoint of a supported base (`SUPPORTED_ENCODER_TYPES`, bare or
        `*ForMaskedLM`) or from one of ours; any other `model_type` raises a `ValueError` listing the supported ones.

        The config keeps the checkpoint's architecture and takes the method's fields from `config_overrides`.
        Modules absent from the checkpoint are initialised as BERT does, the MLM output tied to the word embeddings;
        `decoder_init="copy_last_layer"` copies the encoder's last layer into a fresh decoder (BERT-layout bases
        only). `attn_implementation` is the encoder's (None: transformers' default).
        """
        model_type, backbone = checked_types(model_name_or_path, _method_types())
        fields = base_config_fields(model_name_or_path, model_type)
        config = cls.config_class(**{**fields, **cls._known_options(config_overrides)})
        model, info = cls.from_pretrained(
            model_name_or_path, config=config, output_loading_info=True, attn_implementation=attn_implementation
        )
        missing = set(info["missing_keys"])
        head_prefix = f"{backbone.head_name}."
        if any(k.startswith(head_prefix) for k in missing) and backbone.load_base_head(model.mlm_head, model_name_or_path):
            missing = {k for k in missing if not k.startswith(head_prefix)}
        encoder_prefix = f"{backbone.prefix}."
        if any(k.startswith(encoder_prefix) for k in missing):
            raise ValueError(
                f"{model_name_or_path} is not a {backbone.display_name} checkpoint: encoder weights missing "
                f"({sorted(k for k in missing if k.startswith(encoder_prefix))[:3]} ...)"
            )
        newly_initialised = sorted({".".join(k.split(".")[:2]) for k in missing})
        if newly_initialised:
            logger.info("Initialised from scratch (absent from %s): %s", model_name_or_path, newly_initialised)
        model.after_encoder_checkpoint_loaded(missing)
        return model

    @classmethod
    def from_encoder_config(
        cls, model_name_or_path: str | os.PathLike, attn_implementation: str | None = None,
        architecture_overrides: str | None = None, **config_overrides,
    ):
        """A randomly initialised model with the architecture of `model_name_or_path`'s config (weights not read),
        changed by `architecture_overrides` ("num_hidden_layers=6,hidden_size=384"), from torch's global RNG.

        Raises:
            ValueError: an unsupported `model_type`, an override key the config lacks, a value of the wrong type or
                a size below 1.
        """
        model_type, _ = checked_types(model_name_or_path, _method_types())
        fields = base_config_fields(model_name_or_path, model_type, architecture_overrides)
        config = cls.config_class(**{**fields, **cls._known_options(config_overrides)})
        attention = {"attn_implementation": attn_implementation} if attn_implementation else {}
        model = cls._from_config(config, **attention)
        model.after_encoder_checkpoint_loaded(set(model.state_dict()))
        return model

    @classmethod
    def _known_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """`options`, refusing (`ValueError`) any the config class lacks, which it would keep as a stray attribute
        and train with the default; a `COLLATOR_OPTIONS` key the config lacks is dropped with a warning."""
        known = {f.name for f in dataclasses.fields(cls.config_class)}
        dropped = (set(options) & set(COLLATOR_OPTIONS)) - known
        for name in sorted(dropped):
            logger.warning("%s=%r ignored: %s has no %s, %s", name, options[name], cls.config_class.__name__, name,
                           COLLATOR_OPTIONS[name])
        options = {name: value for name, value in options.items() if name not in dropped}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"unknown {cls.config_class.__name__} option(s) {unknown}; see its docstring for the "
                             "method's options")
        return options

    def after_encoder_checkpoint_loaded(self, missing_keys: set[str]) -> None:
        """With `decoder_init="copy_last_layer"`, each decoder layer absent from the checkpoint starts as a copy of the
        encoder's last layer (as SimLM; `ValueError` on a base without BERT's layout); a warning names the new parts
        of a decoder the checkpoint holds in part."""
        # only a model with a decoder misses `decoder.*` keys, and every such config has `decoder_init`
        new_layers = sorted({int(k.split(".")[2]) for k in missing_keys if k.startswith("decoder.layers.")})
        decoder = {k for k in self.state_dict() if k.startswith("decoder.")}
        if decoder & missing_keys and decoder - missing_keys:  # a trained decoder grown, not a base's first one
            start = ("as copies of the encoder's last layer" if self.config.decoder_init == "copy_last_layer"
                     else "from BERT initialisation")
            logger.warning("the checkpoint holds part of the decoder; these parts start %s: %s", start,
                           sorted({".".join(k.split(".")[:3]) for k in decoder & missing_keys}))
        if new_layers and self.config.decoder_init == "copy_last_layer":
            if not self.backbone.has_position_table:
                raise ValueError(
                    f"decoder_init='copy_last_layer' copies a BERT-layout layer; a {encoder_type_of(self.config)} "
                    "encoder's layers have another layout: use decoder_init='bert'"
                )
            last = self.backbone.last_layer(self.base_model)
            with whole_for_editing(last, *(self.decoder.layers[index] for index in new_layers)):
                for index in new_layers:
                    self.decoder.layers[index].load_state_dict(last.state_dict())


def _pretraining_classes() -> list[type]:
    """Every pre-training model class defined so far (each method's module registers its own by subclassing)."""
    found, pending = [], [PretrainingBase]
    while pending:
        for subclass in pending.pop().__subclasses__():
            found.append(subclass)
            pending.append(subclass)
    return found


def _method_types() -> set[str]:
    return {c.config_class.model_type for c in _pretraining_classes()}


def _refuse_other_base(klass: type, path: Any, kwargs: dict[str, Any]) -> None:
    """Refuse in one line a checkpoint on another base than BERT for a BERT-only encoder class (`RetroMAEModel`):
    transformers would load none of its weights and only print a load report."""
    hub_kwargs = {k: kwargs[k] for k in HUB_KWARGS if k in kwargs}
    try:
        config = PreTrainedConfig.get_config_dict(path, **hub_kwargs)[0]
    except (OSError, TypeError, ValueError):  # no config: from_pretrained says why
        return
    encoder_type = encoder_type_of_config(config)
    if encoder_type not in BertBackbone.model_types:
        remote = "" if config.get("model_type") == encoder_type else ", trust_remote_code=True"  # ours: auto_map
        raise ValueError(
            f"{path} is a {backbone_for(encoder_type).display_name} checkpoint and {klass.__name__} is a BERT "
            f"encoder that would load none of its weights; load it with AutoModel.from_pretrained({str(path)!r}"
            f"{remote})"
        )


def _encoder_class_for(klass: type, config: PreTrainedConfig | None) -> type:
    """The encoder class of `klass`'s method for `config`'s base; `klass` itself without a config or when it is no
    method's encoder class (e.g. a user's subclass)."""
    if not isinstance(config, PreTrainedConfig):
        return klass
    for method in _pretraining_classes():
        if klass in (method.encoder_class, method.any_encoder_class):
            return method.encoder_class if backbone_of(config) is BertBackbone else method.any_encoder_class
    return klass


@dataclass
class PretrainingBatch:
    """The inputs of a pre-training forward pass, as `method_losses` sees them; every tensor `(batch_size, seq_len)`.

    Args:
        input_ids: the encoder input, masked by the collator.
        attention_mask: 1 for real tokens.
        encoder_labels: original ids at the encoder's masked positions, -100 elsewhere.
        decoder_labels: original ids at every real non-special position, -100 elsewhere.
        token_type_ids: optional.
        method_inputs: the method's own inputs by name (e.g. `decoder_word_starts`); a name absent from the batch
            is absent here too.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    encoder_labels: torch.Tensor | None
    decoder_labels: torch.Tensor | None
    token_type_ids: torch.Tensor | None = None
    method_inputs: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def original_ids(self) -> torch.Tensor:
        """The unmasked input: the encoder's masked positions hold their labels again."""
        return torch.where(self.encoder_labels != IGNORE_INDEX, self.encoder_labels, self.input_ids)


__all__ = ["AnyEncoderModel", "ClsEncoderModel", "IGNORE_INDEX", "PretrainingBase", "PretrainingBatch", "PretrainingOutput"]
