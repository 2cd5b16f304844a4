"""retromae: retrieval-oriented pre-training of encoders (RetroMAE, DupMAE, BoW prediction, SEED-Encoder, SentMAE)
on BERT, RoBERTa, XLM-R or ModernBERT masked-LM bases, export as sentence-transformers models, fine-tuning and
evaluation for retrieval.

The Python API in one namespace (this folder installs as the `retromae` package; `modeling/` as `retromae.modeling`,
`trainers/` as `retromae.trainers`)::

    import retromae

    model = retromae.RetroMAEForPretraining.from_encoder_checkpoint("bert-base-uncased")
    trainer = retromae.RetroMAETrainer(model=model, args=..., train_dataset=..., data_collator=...)
    retromae.export_sentence_transformer("out/retromae", "out/retromae-st")

Names are imported on first use, so `import retromae` (and the `retromae` command) stay fast.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("retromae")
except PackageNotFoundError:  # a source tree that is not installed
    __version__ = "unknown"

# public name -> module that defines it
_MODULES: dict[str, str] = {
    # configs and models (also loadable with the Auto classes and trust_remote_code=True)
    "RetroMAEConfig": "retromae.modeling.configuration_retromae",
    "RetroMAEForPretraining": "retromae.modeling.modeling_retromae",
    "RetroMAEModel": "retromae.modeling.modeling_retromae",
    "DupMAEConfig": "retromae.modeling.configuration_dupmae",
    "DupMAEForPretraining": "retromae.modeling.modeling_dupmae",
    "DupMAEModel": "retromae.modeling.modeling_dupmae",
    "BoWConfig": "retromae.modeling.configuration_bow",
    "BoWForPretraining": "retromae.modeling.modeling_bow",
    "BoWModel": "retromae.modeling.modeling_bow",
    "SEEDConfig": "retromae.modeling.configuration_seed",
    "SEEDEncoderForPretraining": "retromae.modeling.modeling_seed",
    "SEEDEncoderModel": "retromae.modeling.modeling_seed",
    "SentMAEConfig": "retromae.modeling.configuration_sentmae",
    "SentMAEForPretraining": "retromae.modeling.modeling_sentmae",
    "SentMAEModel": "retromae.modeling.modeling_sentmae",
    # data, collator, trainer
    "read_corpus": "retromae.trainers.data.reading",
    "tokenize_corpus": "retromae.trainers.data.tokenize",
    "PretrainingCollator": "retromae.trainers.data.collator",
    "RetroMAETrainer": "retromae.trainers.training.trainer",
    # the method registry
    "METHODS": "retromae.trainers.methods",
    "get_method": "retromae.trainers.methods",
    # export, fine-tune, evaluate
    "export_sentence_transformer": "retromae.trainers.export.sentence_transformer",
    "export_from_model": "retromae.trainers.export.sentence_transformer",
    "finetune": "retromae.trainers.training.finetuning",
    "evaluate": "retromae.trainers.retrieval.mteb",
    # the one user-error type
    "UserError": "retromae.trainers.inputs.errors",
}

__all__ = ["__version__", *_MODULES]


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module 'retromae' has no attribute {name!r}")
    value = getattr(importlib.import_module(_MODULES[name]), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
