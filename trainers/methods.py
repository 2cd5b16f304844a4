"""The registry of pre-training methods: one entry per method, used by the CLI, the Trainer and the exporter."""

from __future__ import annotations

from dataclasses import dataclass

from retromae.modeling.modeling_bow import BoWForPretraining
from retromae.modeling.modeling_dupmae import DupMAEForPretraining
from retromae.modeling.modeling_retromae import RetroMAEForPretraining
from retromae.modeling.modeling_seed import SEEDEncoderForPretraining
from retromae.modeling.modeling_sentmae import SentMAEForPretraining


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
    "bow": Method(
        "bow",
        BoWForPretraining,
        "Bag-of-Word prediction: encoder MLM + predicting the input's token set from [CLS] (no decoder)",
        "bow",
    ),
    "seed": Method(
        "seed",
        SEEDEncoderForPretraining,
        "SEED-Encoder: encoder MLM + weak 3-layer auto-regressive decoder seeing [CLS] and the previous 2 tokens",
        "seed",
    ),
    "dupmae": Method(
        "dupmae",
        DupMAEForPretraining,
        "DupMAE: RetroMAE's [CLS] decoding + bag-of-words decoding from the max-pooled ordinary-token logits",
        "dupmae",
    ),
    "sentmae": Method(
        "sentmae",
        SentMAEForPretraining,
        "SentMAE stage 2: RetroMAE continued from a stage-1 retromae checkpoint + in-batch contrastive loss on [CLS]",
        "sentmae",
    ),
}

CITATIONS: dict[str, str] = {
    "retromae": """@inproceedings{xiao2022retromae,
  title = {RetroMAE: Pre-Training Retrieval-oriented Language Models Via Masked Auto-Encoder},
  author = {Xiao, Shitao and Liu, Zheng and Shao, Yingxia and Cao, Zhao},
  booktitle = {Proceedings of the 2022 Conference on Empirical Methods in Natural Language Processing},
  year = {2022}
}""",
    "bow": """@inproceedings{ma2024drop,
  title = {Drop your Decoder: Pre-training with Bag-of-Word Prediction for Dense Passage Retrieval},
  author = {Ma, Guangyuan and Wu, Xing and Lin, Zijia and Hu, Songlin},
  booktitle = {Proceedings of the 47th International ACM SIGIR Conference on Research and Development in Information Retrieval},
  year = {2024}
}""",
    "seed": """@inproceedings{lu2021less,
  title = {Less is More: Pre-train a Strong Text Encoder for Dense Retrieval Using a Weak Decoder},
  author = {Lu, Shuqi and He, Di and Xiong, Chenyan and Ke, Guolin and Malik, Waleed and Dou, Zhicheng and Bennett, Paul and Liu, Tie-Yan and Overwijk, Arnold},
  booktitle = {Proceedings of the 2021 Conference on Empirical Methods in Natural Language Processing},
  year = {2021}
}""",
    "dupmae": """@inproceedings{liu2023retromae2,
  title = {RetroMAE-2: Duplex Masked Auto-Encoder For Pre-Training Retrieval-Oriented Language Models},
  author = {Liu, Zheng and Xiao, Shitao and Shao, Yingxia and Cao, Zhao},
  booktitle = {Proceedings of the 61st Annual Meeting of the Association for Computational Linguistics (Volume 1: Long Papers)},
  year = {2023}
}""",
    "sentmae": """@article{liu2022sentmae,
  title = {Masked Autoencoders As The Unified Learners For Pre-Trained Sentence Representation},
  author = {Liu, Alexander and Yang, Samuel},
  journal = {arXiv preprint arXiv:2208.00231},
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
