"""The registry of pre-training methods: one entry per method, used by the CLI, the Trainer and the exporter."""

from __future__ import annotations

from dataclasses import dataclass

from retromae.modeling.modeling_retromae import RetroMAEForPretraining


@dataclass(frozen=True)
class Method:
    """A pre-training method.

    Args:
        name: the value of `retromae pretrain --method`.
        model_class: its `*ForPretraining` class (a `BertPretrainingBase` subclass).
        summary: one line for `--help` and model cards.
        paper: citation key of the paper (see `CITATIONS`).
    """

    name: str
    model_class: type
    summary: str
    paper: str


METHODS: dict[str, Method] = {
    "retromae": Method(
        "retromae",
        RetroMAEForPretraining,
        "RetroMAE: encoder MLM + one-layer decoder reconstructing the input from the [CLS] embedding",
        "retromae",
    ),
}

CITATIONS: dict[str, str] = {
    "retromae": """@inproceedings{xiao2022retromae,
  title = {RetroMAE: Pre-Training Retrieval-oriented Language Models Via Masked Auto-Encoder},
  author = {Xiao, Shitao and Liu, Zheng and Shao, Yingxia and Cao, Zhao},
  booktitle = {Proceedings of the 2022 Conference on Empirical Methods in Natural Language Processing},
  year = {2022}
}""",
}


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
