"""Loading a base checkpoint: transformers' load report shown only when it matters, and the architecture fields
a method config takes from a base's config."""

import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from transformers import AutoConfig, BertConfig, PreTrainedConfig

from .backbones import DEFAULT_ENCODER_TYPE, SUPPORTED_ENCODER_TYPES, BertBackbone, backbone_for, encoder_type_of_config

# config keys that describe a file, not the architecture
CONFIG_META_KEYS = {"model_type", "architectures", "auto_map", "transformers_version"}
# a base config's fields under the names of BERT's that our decoders (BertLayers) read
BERT_FIELD_ALIASES = {
    "hidden_act": "hidden_activation",
    "layer_norm_eps": "norm_eps",
    "hidden_dropout_prob": "mlp_dropout",
    "attention_probs_dropout_prob": "attention_dropout",
}


class _HoldLoadReport(logging.Filter):
    """Holds back transformers' messages on missing / unexpected keys in `from_pretrained` (the LOAD REPORT table,
    the "checkpoint seem corrupted" line), to show them only if they matter."""

    held_messages = ("LOAD REPORT", "This checkpoint seem corrupted")

    def __init__(self):
        super().__init__()
        self.held: list[logging.LogRecord] = []
        self.show = True  # whether leaving `held_load_report` logs them

    def filter(self, record: logging.LogRecord) -> bool:
        if any(message in str(record.msg) for message in self.held_messages):
            self.held.append(record)
            return False
        return True


def _only_expected_keys(info: dict, quiet_missing: tuple[str, ...], quiet_unexpected: tuple[str, ...]) -> bool:
    """True when every missing / unexpected key of a load matches the class's patterns (and nothing mismatched)."""

    def covered(keys, patterns) -> bool:
        return all(any(re.search(p, key) for p in patterns) for key in keys)

    return (
        not info.get("mismatched_keys")
        and not info.get("error_msgs")
        and covered(info.get("missing_keys", ()), quiet_missing)
        and covered(info.get("unexpected_keys", ()), quiet_unexpected)
    )


class ShapeMismatchError(ValueError):
    """A checkpoint's weights have other shapes than its config.json gives."""


def _drop_tp_plan_warnings(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(("The following layers were not sharded", "The following TP rules"))


@contextmanager
def held_load_report(where: str | os.PathLike) -> Iterator[_HoldLoadReport]:
    """Hold transformers' load report during the `from_pretrained` calls in the block, and show it on leaving unless
    the block set `show = False` on the yielded hold. transformers' RuntimeError for weights whose shapes differ
    from the config becomes a one-line `ShapeMismatchError` naming `where` and one such tensor."""
    report_logger = logging.getLogger("transformers.modeling_utils")
    level, shown = report_logger.level, report_logger.isEnabledFor(logging.WARNING)
    report_logger.setLevel(logging.WARNING)  # the report names the mismatch, whatever transformers' verbosity
    # that level also makes transformers check the (empty) tensor-parallel plan: it lists every weight as "not sharded"
    tp_logger = logging.getLogger("transformers.distributed.tensor_parallel")
    drops_tp_warnings = _drop_tp_plan_warnings not in tp_logger.filters  # the outermost block adds and removes it
    if drops_tp_warnings:
        tp_logger.addFilter(_drop_tp_plan_warnings)
    hold = _HoldLoadReport()
    report_logger.filters.insert(0, hold)  # first: a nested block's hold decides on its own loads
    try:
        yield hold
    except RuntimeError as error:
        if "ignore_mismatched_sizes" not in str(error):
            raise
        report = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(record.getMessage() for record in hold.held))
        # its rows: name | MISMATCH | "Reinit due to size mismatch - ckpt: ... vs model: ..."
        rows = [line.split("|") for line in report.splitlines() if line.count("|") >= 2 and "MISMATCH" in line]
        # the report's row order follows set iteration (the hash seed): name the first by name, the same every run
        row = min(rows, key=lambda cells: cells[0].strip(), default=None)
        example = f", e.g. {row[0].strip()} ({row[2].split(' - ')[-1].strip()})" if row else ""
        raise ShapeMismatchError(f"{where}: its weights have other shapes than its config.json gives{example}; fix "
                                 "config.json, or save the model again") from None
    finally:
        if drops_tp_warnings:
            tp_logger.removeFilter(_drop_tp_plan_warnings)
        report_logger.removeFilter(hold)
        report_logger.setLevel(level)
        if hold.show and shown:
            for record in hold.held:
                report_logger.handle(record)


class QuietLoadReportMixin:
    """`from_pretrained` that logs transformers' LOAD REPORT table only when it lists a key matching none of
    `quiet_missing_keys` / `quiet_unexpected_keys` (regular expressions); `output_loading_info=True` still returns
    every key. Mismatched shapes: `ShapeMismatchError` (`held_load_report`)."""

    quiet_missing_keys: tuple[str, ...] = ()
    quiet_unexpected_keys: tuple[str, ...] = ()

    @classmethod
    def from_pretrained(cls, *args, output_loading_info: bool = False, **kwargs):
        where = args[0] if args else kwargs.get("pretrained_model_name_or_path")
        with held_load_report(where) as hold:
            model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
            hold.show = not _only_expected_keys(info, cls.quiet_missing_keys, cls.quiet_unexpected_keys)
        return (model, info) if output_loading_info else model


def checked_types(model_name_or_path: str | os.PathLike, method_types: set[str]) -> tuple[str, type]:
    """The `model_type` of a checkpoint's config (a base's or one of `method_types`) and its family's backbone. `ValueError` (naming the supported types)
    for another type and for a local folder that is missing or lacks config.json (a name starting with `/`, `.` or
    `~`, with two `/` or more, or whose parent folder exists); a name failing as a Hub id too gets a one-line
    `OSError`."""
    if not isinstance(model_name_or_path, str | os.PathLike):
        raise ValueError(f"model_name_or_path must be a folder or a Hub id, got {model_name_or_path!r}")
    path = os.path.expanduser(os.fspath(model_name_or_path))
    parent = os.path.dirname(path.rstrip("/"))
    looks_local = (os.path.isabs(path) or path.startswith((".", "~")) or path.count("/") > 1 or os.path.isdir(path)
                   or (parent != "" and os.path.isdir(parent)))  # `models/nope` beside an existing `models/`
    if looks_local and not os.path.isfile(os.path.join(path, "config.json")):
        problem = "has no config.json" if os.path.isdir(path) else "does not exist"
        raise ValueError(f"model folder {model_name_or_path} {problem}; give a saved model's folder or a Hub id")
    try:
        config_dict = BertConfig.get_config_dict(model_name_or_path)[0]
    except OSError as error:
        if os.path.exists(path) or error.errno is not None:  # a real folder, or a system error (disk full ...)
            raise
        # `owner/name` may be a Hub id or a folder not made yet: say both, in one line (transformers' spans three)
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise OSError(f"{model_name_or_path}: no local folder of that name ({os.path.abspath(path)} does not exist), "
                      f"and as a Hub id it could not be loaded: {reason}") from error
    model_type = config_dict.get("model_type") or DEFAULT_ENCODER_TYPE
    if model_type not in (*SUPPORTED_ENCODER_TYPES, *method_types):
        backbone_for(model_type)  # raises, naming what is supported
    return model_type, backbone_for(encoder_type_of_config(config_dict))


def _overridden(config: PreTrainedConfig, overrides: str | None) -> PreTrainedConfig:
    """`config` changed by "key=value,..." (`update_from_string`: existing keys, scalar values of their type); a
    `ValueError` names the item at fault. A per-layer `layer_types` (ModernBERT's local/global pattern) follows a
    new `num_hidden_layers`, its pattern repeated."""
    for item in (overrides or "").split(","):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not item.strip():
            continue
        if not sep or not key:
            raise ValueError(f"{item.strip()!r} is not key=value")
        try:
            config.update_from_string(f"{key}={value}")
        except (ValueError, TypeError) as error:
            raise ValueError(f"{key}={value}: {error}") from None
        is_size = key.startswith("num_") or key.endswith("_size") or key == "max_position_embeddings"
        if is_size and isinstance(getattr(config, key), int) and getattr(config, key) < 1:
            raise ValueError(f"{key}={value}: a size or count, at least 1")
    pattern = getattr(config, "layer_types", None)
    if isinstance(pattern, list) and pattern and len(pattern) != config.num_hidden_layers:
        config.layer_types = [pattern[i % len(pattern)] for i in range(config.num_hidden_layers)]
    return config


def base_config_fields(model_name_or_path: str | os.PathLike, model_type: str,
                       overrides: str | None = None) -> dict[str, Any]:
    """The architecture fields a method config takes from a checkpoint: a base's full config with `encoder_type` and
    BERT's names for the fields our decoders read, or our checkpoints' fields as they are; `overrides`
    ("key=value,...") change the base's config first."""
    if model_type not in SUPPORTED_ENCODER_TYPES or model_type in BertBackbone.model_types:
        base = _overridden(BertConfig.from_pretrained(model_name_or_path), overrides)
        return {k: v for k, v in base.to_dict().items() if k not in CONFIG_META_KEYS}
    base_config = _overridden(AutoConfig.from_pretrained(model_name_or_path), overrides)
    fields = {k: v for k, v in base_config.to_dict().items() if k not in CONFIG_META_KEYS}
    for bert_name, base_name in BERT_FIELD_ALIASES.items():
        if base_name in fields and bert_name not in fields:
            fields[bert_name] = fields[base_name]
    if hasattr(base_config, "sliding_window"):  # a ModernBertConfig property its model reads
        fields["sliding_window"] = base_config.sliding_window
    fields["encoder_type"] = model_type
    return fields


__all__ = ["QuietLoadReportMixin", "ShapeMismatchError", "base_config_fields", "checked_types", "held_load_report"]
