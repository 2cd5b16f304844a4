"""RetroMAE configuration, and the config helpers every method shares."""

import dataclasses
import logging
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal

import transformers
from huggingface_hub.dataclasses import strict
from huggingface_hub.errors import StrictDataclassError

try:
    from transformers import BertConfig, PreTrainedConfig
except ImportError as error:  # transformers 4.x spells it PretrainedConfig; name what a Hub user must install
    raise ImportError(f"this model's code needs transformers >= 5 (installed: {transformers.__version__}); upgrade "
                      "it with: pip install -U 'transformers>=5'") from error

logger = logging.getLogger(__name__)


class ConfigValueError(StrictDataclassError, ValueError):
    """A config value its validator refused: what `@strict` raises (`StrictDataclassError`, the validator's error as
    `__cause__`) and a `ValueError`, as the README promises; the message is the validator's one line."""


class ConfigTypeError(StrictDataclassError, TypeError):
    """A config value of the wrong type or choice (as `ConfigValueError`, a `TypeError`)."""


@contextmanager
def plain_config_errors() -> Iterator[None]:
    """Raise `@strict`'s wrapped refusals as `ConfigValueError` / `ConfigTypeError` with the validator's message."""
    try:
        yield
    except (ConfigValueError, ConfigTypeError):
        raise
    except StrictDataclassError as error:
        cause = error.__cause__
        if not isinstance(cause, ValueError | TypeError):
            raise
        raise (ConfigTypeError if isinstance(cause, TypeError) else ConfigValueError)(str(cause)) from cause


def strict_config(cls: type) -> type:
    """`@strict` for our configs: its refusals (a field on assignment or in the constructor, `validate()`) are
    `ValueError` / `TypeError` too (`plain_config_errors`)."""
    cls = strict(cls)
    validate, set_attribute = cls.validate, cls.__setattr__

    def checked_validate(self) -> None:
        with plain_config_errors():
            validate(self)

    def checked_setattr(self, name: str, value: Any) -> None:
        with plain_config_errors():
            set_attribute(self, name, value)

    checked_validate.__is_defined_by_strict_decorator__ = True  # @strict on a subclass replaces only its own
    cls.validate, cls.__setattr__ = checked_validate, checked_setattr
    return cls


def rename_legacy_keys(config_name: str, settings: dict[str, Any], renames: Mapping[str, str]) -> dict[str, Any]:
    """Pop from `settings` the keys renamed in `renames` (old -> new name) and return their values under the new
    names, with a deprecation warning each."""
    renamed = {}
    for old_name, new_name in renames.items():
        value = settings.pop(old_name, None)
        if value is None:
            continue
        logger.warning(
            "%s: `%s` is deprecated; read as %s=%s. Rename it to `%s`.",
            config_name, old_name, new_name, value, new_name,
        )
        renamed[new_name] = value
    return renamed


class MethodConfigMixin:
    """What every method's config shares (first among its bases): its own `model_type` whatever config.json it is
    built from, the keys of `legacy_keys` (old key -> field; a class constant) read under their old names with a
    deprecation warning, so configs written before a rename keep loading, and `from_pretrained(path, field=value)`
    overrides validated as constructor arguments."""

    legacy_keys = {}

    def __post_init__(self, **kwargs):
        # a base's config.json (BERT's, stage 1's `retromae` for SentMAE) would leave its model_type on the instance, and
        # the model would read as that type (its export refused or named wrongly); saved configs take the class's anyway
        kwargs.pop("model_type", None)
        for name, value in rename_legacy_keys(type(self).__name__, kwargs, self.legacy_keys).items():
            setattr(self, name, value)
        super().__post_init__(**kwargs)

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs):
        # transformers builds `cls(**config_dict)`, validated, then sets each override of kwargs, which no class
        # validator sees: merged first, the overrides are validated with the rest and replace the values they override
        # before those are checked. PreTrainedConfig's own fields (dtype ...) and other kwargs keep transformers' way.
        kwargs.pop("model_type", None)  # the class's own, as `__post_init__` keeps it
        fields = {f.name for f in dataclasses.fields(cls)} - {f.name for f in dataclasses.fields(PreTrainedConfig)}
        overrides = {key: kwargs.pop(key) for key in [*kwargs] if key in fields or key in cls.legacy_keys}
        settings = dict(config_dict)
        settings.update(rename_legacy_keys(cls.__name__, settings, cls.legacy_keys))  # the file's, before overrides
        return super().from_dict({**settings, **overrides}, **kwargs)


def check_weight(name: str, value: float, note: str = "") -> None:
    """A loss weight: a finite number >= 0 (`value < 0` lets NaN through, and a NaN or inf weight makes the loss NaN);
    `note` ends the message."""
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name}={value} must be a finite number >= 0{note}")


def check_loss_settings(config: Any, weights: tuple[str, ...] = ("encoder_loss_weight", "decoder_loss_weight")
                        ) -> None:
    """The loss fields every method's config has: finite non-negative term `weights`, a positive chunk size, and its
    encoder's mask ratio in (0, 1)."""
    check_ratio("encoder_mask_ratio", config.encoder_mask_ratio)
    for name in weights:
        check_weight(name, getattr(config, name))
    if config.loss_chunk_size < 1:
        raise ValueError(f"loss_chunk_size={config.loss_chunk_size} must be >= 1")


def hides_whole_words(config: Any) -> bool:
    """Whether the decoder hides whole words (`decoder_visibility="reference"`), which needs the batch's word starts."""
    return getattr(config, "decoder_visibility", None) == "reference"


def check_ratio(name: str, value: float) -> None:
    """The one check of a mask ratio (configs and the collator): it lies in the open interval (0, 1)."""
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name}={value} must lie in the open interval (0, 1)")


@strict_config
class RetroMAEConfig(MethodConfigMixin, BertConfig):
    r"""BERT encoder plus a RetroMAE decoder (Xiao et al., 2022, "RetroMAE").

    Args:
        encoder_mask_ratio: share of ordinary tokens masked in the encoder input, in (0, 1) (paper: 0.15-0.3).
        decoder_mask_ratio: share of positions hidden from each decoder row (enhanced) or replaced by [MASK] (basic),
            in (0, 1) (paper: 0.5 enhanced, 0.7 basic).
        decoding: ``"enhanced"`` (§3.3: two-stream attention, per-row visibility, loss on every token) or ``"basic"``
            (§3.2: masked input, self-attention, loss on the masked tokens only).
        num_decoder_layers: exactly 1 for enhanced decoding, 1-3 for basic.
        query_stream: ``"position"``: queries h + p_i (eq. 4, official v1 code); ``"embeddings"``: h through the
            full embedding module (BGE / DupMAE code).
        whole_word_mask: mask whole words in the encoder input.
        encoder_loss_weight / decoder_loss_weight: >= 0 (paper: plain sum).
        decoder_init: ``"bert"`` (fresh BERT init, as the official code) or ``"copy_last_layer"`` (the encoder's last
            layer, as SimLM).
        mask_token_id: the tokenizer's mask id; needed by basic decoding.
        loss_chunk_size: >= 1, rows per chunk of the fused vocabulary projection + cross-entropy.
        decoder_visibility: ``"token"`` (eq. 7: each row sees a random n - round(n * decoder_mask_ratio) of the n
            real tokens, never itself, always [CLS]) or ``"reference"`` (the official collator's whole-word masks,
            `reference_visibility_mask`; enhanced decoding only, needs the batch's `decoder_word_starts`).
        decoder_targets: ``"ordinary"`` (the collator's `decoder_labels`: real non-special tokens, [UNK] excluded)
            or ``"reference"`` (the official code: every real token but the first and the last, [UNK] included).
    """

    model_type = "retromae"

    encoder_mask_ratio: float | int = 0.3
    decoder_mask_ratio: float | int = 0.5
    decoding: Literal["enhanced", "basic"] = "enhanced"
    num_decoder_layers: int = 1
    query_stream: Literal["position", "embeddings"] = "position"
    whole_word_mask: bool = True
    encoder_loss_weight: float | int = 1.0
    decoder_loss_weight: float | int = 1.0
    decoder_init: Literal["bert", "copy_last_layer"] = "bert"
    mask_token_id: int | None = None
    loss_chunk_size: int = 4096
    decoder_visibility: Literal["token", "reference"] = "token"
    decoder_targets: Literal["ordinary", "reference"] = "ordinary"

    def validate_retromae_fields(self) -> None:
        check_ratio("decoder_mask_ratio", self.decoder_mask_ratio)
        if self.decoder_visibility == "reference" and self.decoding != "enhanced":
            raise ValueError(
                "decoder_visibility='reference' samples the visibility matrix of enhanced decoding; "
                f"decoding={self.decoding!r} has none (use decoding='enhanced' or decoder_visibility='token')"
            )
        if self.decoding == "enhanced" and self.num_decoder_layers != 1:
            raise ValueError(
                f"num_decoder_layers={self.num_decoder_layers} with decoding='enhanced': enhanced decoding works "
                "with exactly one decoder layer (RetroMAE §3.3, Table 6); use decoding='basic' for 1-3 layers"
            )
        if not 1 <= self.num_decoder_layers <= 3:
            raise ValueError(f"num_decoder_layers={self.num_decoder_layers} must be 1, 2 or 3")
        if self.mask_token_id is not None and not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id={self.mask_token_id} is no id of the vocabulary (0 to "
                             f"{self.vocab_size - 1}, vocab_size={self.vocab_size}); set it from the tokenizer: "
                             "mask_token_id=tokenizer.mask_token_id")
        check_loss_settings(self)


__all__ = ["ConfigTypeError", "ConfigValueError", "RetroMAEConfig"]
