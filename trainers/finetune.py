"""`retromae finetune`: train a bi-encoder for retrieval from a retromae checkpoint, export, or any BERT / ST folder.

The recipe is the papers' (dupmae.txt eq. 13-15, retromae.txt §4.1), each stage one `SentenceTransformerTrainer` run
that continues from the previous stage's model:

1. ``in-batch``: contrastive loss with in-batch negatives (eq. 13), sentence-transformers'
   `MultipleNegativesRankingLoss` on (query, positive) pairs.
2. ``hard-negatives``: negatives for every training query are mined with the current (stage-1) model by
   sentence-transformers' `mine_hard_negatives` through a faiss index (`use_faiss=True`): the top `range_max`
   documents, the query's positives removed, the first `range_min` ranks skipped (likely unlabelled positives),
   `num_negatives` drawn at random from the rest. They are saved to ``<work dir>/hard_negatives.jsonl`` (reusable
   with ``--negatives-file``), then the same loss trains on (query, positive, negative_1..k) with in-batch negatives
   too (eq. 14). Negatives that the training data already carries are used instead of mining. Deviation: ST 6.2
   ranks the candidates by cosine (it encodes with `normalize_embeddings=True`), also for a dot-product model; the
   papers retrieve with the dot product. Positives are removed by text (every qrels positive of the query).
3. ``distill``: KL divergence between the softmax of the student's scores over (positive, negatives) and the
   softmax of cross-encoder scores read from a TSV file (`query-id  corpus-id  score`), reduction ``batchmean``
   (eq. 15; sentence-transformers' `DistillKLDivLoss`), times ``--distill-weight`` (default 1), plus
   ``--contrastive-weight`` (default 0) times the in-batch contrastive loss. The RetroMAE reference code uses
   KL(``reduction="mean"``, i.e. divided by batch x group size, REFERENCE F1) + 1e-4 x contrastive; we follow the
   paper (KL ``batchmean`` alone) and keep the contrastive term as an option.

Scores and pooling. A retromae export (CLS pooling, dot product) trains with the dot product and ``scale=1``
(temperature 1, the papers' setting); a model whose `similarity_fn_name` is cosine (e.g. all-MiniLM-L6-v2) with
cosine and ``scale=20`` (sentence-transformers' default). A model folder WITHOUT modules.json (a plain BERT
checkpoint) is loaded with CLS pooling + dot product and a warning: sentence-transformers itself would build MEAN
pooling for such a folder, which averages token states that RetroMAE-style pre-training never trained as a sentence
embedding, and BEIR numbers computed that way are wrong (REFERENCE F3, RetroMAE issue #6). ``--pooling mean``
overrides. The DupMAE hybrid model (`st_dupmae.DupMAEPooling`, remote code) trains through the same losses: its
sentence embedding is [W^cls h ; top-k(mu)] and the dot product of two is the paper's eq. 12, so W^cls, the encoder
and the OT head all learn.

Several devices. Under ``torchrun`` (DDP) the contrastive loss gathers the embeddings of all ranks
(`MultipleNegativesRankingLoss(gather_across_devices=True)`, sentence-transformers 6.2: `all_gather_with_grad`, the
local block offset by `get_rank() * batch_size`, i.e. the global rank), so every query sees the positives and
negatives of the whole global batch (RetroMAE issue #23: single-GPU fine-tuning loses 1-2 points without it).
``--no-gather-across-devices`` turns it off. Batches are drawn with `BatchSamplers.NO_DUPLICATES` so that no text
appears twice in a batch (a duplicate positive would be a false in-batch negative).

Output: a sentence-transformers folder (written to a temporary sibling and renamed into place; an existing folder is
replaced only with ``--overwrite``) with a model card from `model_cards/finetuned_encoder.md` and
``retromae_finetune.json`` (the run record the card is rendered from; `retromae evaluate --update-card` adds results
to it). Trainer checkpoints and mined negatives go to the work folder ``<output>.work`` (``--work-dir``).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import random
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import torch
from huggingface_hub import EvalResult, ModelCard, ModelCardData
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from sentence_transformers.sentence_transformer.losses import DistillKLDivLoss, MultipleNegativesRankingLoss
from sentence_transformers.util import cos_sim, dot_score, pairwise_cos_sim, pairwise_dot_score
from torch import nn

from .beir import (
    ON_MISSING,
    RetrievalData,
    RetrievalDataError,
    TrainingGroup,
    clean_groups,
    groups_to_dataset,
    groups_to_distillation_dataset,
    load_training_groups,
    read_beir,
    read_beir_corpus,
    read_teacher_scores,
    read_training_jsonl,
    write_training_jsonl,
)
from .export import CITATIONS, PAPER_URLS
from .folders import (
    atomic_folder,
    check_destination,
    check_model_folder,
    folder_errors_as,
    hub_id_of_model,
    is_hub_id,
    public_name,
)

logger = logging.getLogger(__name__)

STAGES = ("in-batch", "hard-negatives", "distill")
RUN_INFO_FILE = "retromae_finetune.json"
CARD_TEMPLATE = "finetuned_encoder.md"
NEGATIVES_FILE = "hard_negatives.jsonl"
# the metrics of the summary table and the card: (mteb score key, display name)
CARD_METRICS = (("ndcg_at_10", "NDCG@10"), ("mrr_at_10", "MRR@10"), ("recall_at_100", "Recall@100"),
                ("recall_at_1000", "Recall@1000"))
NO_MODULES_WARNING = (
    "{model} has no modules.json (it is not a sentence-transformers folder): assuming {pooling} pooling and the "
    "{similarity} product. RetroMAE-style pre-training trains the last-layer [CLS] state as the sentence embedding "
    "and the papers' BEIR protocol scores with [CLS] + dot product; sentence-transformers' own default for such a "
    "folder is MEAN pooling, which averages token states that were never trained as an embedding and gives wrong "
    "(lower) BEIR numbers. Pass --pooling mean only for a model that was trained with mean pooling."
)

__all__ = [
    "STAGES",
    "DistillationLoss",
    "FinetuneError",
    "FinetuneResult",
    "load_encoder",
    "mine_negatives",
    "needs_remote_code",
    "render_finetuned_card",
    "run_finetune",
    "finetune_command",
    "write_model_card",
]


class FinetuneError(ValueError):
    """The fine-tuning input cannot be used; the message says why and what to do."""


# ---- arguments -----------------------------------------------------------------------------------------------------


@dataclass
class FinetuneModelArguments:
    model: str = field(
        metadata={"help": "starting point: a `retromae pretrain` checkpoint, a `retromae export` folder, any "
                  "sentence-transformers folder (e.g. the DupMAE hybrid export), or a plain BERT folder"}
    )
    pooling: Literal["cls", "mean"] | None = field(
        default=None,
        metadata={"help": "pooling for a folder WITHOUT modules.json (default cls + dot product, the papers' BEIR "
                  "protocol); sentence-transformers folders keep their own"},
    )
    max_seq_length: int | None = field(default=None, metadata={"help": "maximum tokens per text (default: the model's)"})
    model_name: str | None = field(
        default=None, metadata={"help": "model name for the card, e.g. my-org/retromae-scifact (default: folder name)"}
    )
    base_model_name: str | None = field(
        default=None, metadata={"help": "Hub id of the starting model for the card (default: guessed, no local paths)"}
    )


@dataclass
class FinetuneDataArguments:
    train_data: str = field(
        metadata={"help": "training data: a BEIR folder (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv), a .jsonl file "
                  "of {query, positive, negatives}, a datasets save_to_disk folder or a Hub dataset name"}
    )
    split: str = field(default="train", metadata={"help": "qrels / dataset split to train on"})
    corpus: str | None = field(
        default=None,
        metadata={"help": "corpus.jsonl to mine negatives from when --train-data is not a BEIR folder (default: all "
                  "positives and negatives of the training data)"},
    )
    on_missing: Literal["skip", "error"] = field(
        default="error",
        metadata={"help": "qrels naming unknown queries/documents, or pairs without teacher scores: refuse (error) "
                  "or drop them with a count (skip)"},
    )
    stages: str = field(
        default="in-batch,hard-negatives",
        metadata={"help": f"comma-separated stages in order, from {', '.join(STAGES)}; distill needs --teacher-scores"},
    )
    num_negatives: int = field(default=7, metadata={"help": "hard negatives per query (RetroMAE: group of 8 = 1+7)"})
    negatives_file: str | None = field(
        default=None,
        metadata={"help": "reuse mined negatives (a hard_negatives.jsonl written by an earlier run) instead of mining"},
    )
    mine_range_min: int = field(default=10, metadata={"help": "mining: skip the top N ranks (likely unlabelled positives)"})
    mine_range_max: int = field(default=100, metadata={"help": "mining: sample negatives from ranks up to N"})
    mine_sampling: Literal["random", "top"] = field(
        default="random", metadata={"help": "mining: draw negatives at random from the rank range, or take the top"}
    )
    teacher_scores: str | None = field(
        default=None, metadata={"help": "cross-encoder scores for distill: TSV query-id, corpus-id, score"}
    )
    eval_data: str | None = field(
        default=None, metadata={"help": "a BEIR folder to evaluate the result on (results go into the model card)"}
    )
    eval_split: str = field(default="dev", metadata={"help": "qrels split of --eval-data"})


@dataclass
class FinetuneLossArguments:
    scale: float | None = field(
        default=None,
        metadata={"help": "contrastive logit scale = 1/temperature (default: 1 for dot-product models, 20 for cosine)"},
    )
    distill_weight: float = field(default=1.0, metadata={"help": "weight of the KL (batchmean) distillation loss"})
    contrastive_weight: float = field(
        default=0.0,
        metadata={"help": "weight of the in-batch contrastive loss added in the distill stage (RetroMAE code: 1e-4)"},
    )
    distill_temperature: float = field(default=1.0, metadata={"help": "temperature of student and teacher softmax"})
    gather_across_devices: bool = field(
        default=True, metadata={"help": "DDP: in-batch negatives from all ranks (global batch); no effect on 1 process"}
    )


@dataclass
class FinetuneTrainingArguments(SentenceTransformerTrainingArguments):
    """sentence-transformers' training arguments with fine-tuning defaults; `output_dir` is the final model folder."""

    output_dir: str | None = field(
        default="out/retromae-finetuned", metadata={"help": "the sentence-transformers folder to write"}
    )
    overwrite: bool = field(default=False, metadata={"help": "replace an existing output folder"})
    work_dir: str | None = field(
        default=None, metadata={"help": "trainer checkpoints and mined negatives (default: OUTPUT_DIR.work)"}
    )
    learning_rate: float = field(default=2e-5, metadata={"help": "peak learning rate (RetroMAE MS MARCO: 2e-5)"})
    num_train_epochs: float = field(default=1.0, metadata={"help": "epochs per stage"})
    per_device_train_batch_size: int = field(default=16, metadata={"help": "queries per device per step"})
    warmup_steps: float = field(default=0.1, metadata={"help": "warm-up steps, or a fraction of the stage if < 1"})
    logging_steps: float = field(default=10, metadata={"help": "log the loss every N steps"})
    save_strategy: str = field(default="no", metadata={"help": "trainer checkpoints: no, steps or epoch"})
    batch_sampler: str = field(
        default="no_duplicates", metadata={"help": "batch sampler (no_duplicates: no repeated text in a batch)"}
    )


@dataclass
class FinetuneResult:
    output_dir: Path
    info: dict[str, Any]


# ---- loading the starting model ------------------------------------------------------------------------------------


def needs_remote_code(folder: str | os.PathLike) -> bool:
    """Whether a sentence-transformers folder's modules.json references a class outside `sentence_transformers`
    (loading it then needs `trust_remote_code=True`, sentence-transformers >= 6)."""
    modules_file = Path(folder) / "modules.json"
    if not modules_file.is_file():
        return False
    try:
        modules = json.loads(modules_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return False
    return any(not str(m.get("type", "")).startswith("sentence_transformers.") for m in modules if isinstance(m, dict))


def _read_config(folder: Path) -> dict[str, Any]:
    try:
        return json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise FinetuneError(f"{folder.name}: cannot read config.json ({error})") from None


def _pretraining_method(folder: Path) -> str | None:
    """The retromae method of a pre-training checkpoint (config model_type) or of an export (model-card tags)."""
    from .methods import METHODS, method_of_config

    if (folder / "config.json").is_file():
        try:
            return method_of_config(_read_config(folder).get("model_type")).name
        except ValueError:
            pass
    readme = folder / "README.md"
    if readme.is_file():
        try:
            tags = ModelCard.load(readme).data.to_dict().get("tags") or []
        except Exception:  # a hand-written README without front matter
            return None
        if "retromae" in tags:
            return next((t for t in tags if t in METHODS), None)
    return None


def load_encoder(
    model_ref: str | os.PathLike,
    *,
    pooling: str | None = None,
    max_seq_length: int | None = None,
    work_dir: str | os.PathLike | None = None,
    device: str | None = None,
) -> tuple[SentenceTransformer, dict[str, Any]]:
    """Load a starting model as a `SentenceTransformer`.

    Args:
        model_ref: a sentence-transformers folder (modules.json; remote-code modules are trusted when modules.json
            references them), a `retromae pretrain` checkpoint (exported first into `work_dir`), a plain HF encoder
            folder (Transformer + `pooling`, CLS by default, with a warning), or a Hub id.
        pooling: only for folders without modules.json: "cls" (default) or "mean".
        max_seq_length: override the model's maximum length.
        work_dir: where a pre-training checkpoint is exported to (required for those).
        device: torch device (default: sentence-transformers' choice).

    Returns:
        `(model, info)`: info has `kind` (sentence-transformers | retromae-checkpoint | transformers | hub),
        `pretraining_method` (or None), `trust_remote_code`.
    """
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    from .export import export_sentence_transformer

    path = Path(model_ref).expanduser()
    info: dict[str, Any] = {"kind": "hub", "pretraining_method": None, "trust_remote_code": False}
    if path.is_dir():
        with folder_errors_as(FinetuneError):
            check_model_folder(path, purpose="--model")
        method = _pretraining_method(path)
        info["pretraining_method"] = method
        if not (path / "modules.json").is_file() and (path / "config.json").is_file() and method is not None:
            if work_dir is None:
                raise FinetuneError(f"{path.name} is a pre-training checkpoint; pass a work folder to export it into")
            exported = Path(work_dir) / "pretrained-encoder"
            logger.info("exporting the %s pre-training checkpoint %s to %s", method, path.name, exported)
            export_sentence_transformer(path, exported, overwrite=True)
            info["kind"] = "retromae-checkpoint"
            path = exported
        if (path / "modules.json").is_file():
            if pooling is not None:
                raise FinetuneError(
                    f"--pooling applies to folders without modules.json; {path.name} is a sentence-transformers folder "
                    "and keeps its own pooling"
                )
            remote = needs_remote_code(path)
            info.update(kind=info["kind"] if info["kind"] != "hub" else "sentence-transformers", trust_remote_code=remote)
            try:
                model = SentenceTransformer(str(path), trust_remote_code=remote, device=device)
            except (OSError, ValueError, KeyError, ImportError) as error:
                raise FinetuneError(f"cannot load the sentence-transformers folder {path.name}: {error}") from None
        elif (path / "config.json").is_file():
            pooling = pooling or "cls"
            similarity = "dot" if pooling == "cls" else "cosine"
            logger.warning(NO_MODULES_WARNING.format(model=path.name, pooling=pooling.upper(), similarity=similarity))
            config = _read_config(path)
            model_kwargs = {"add_pooling_layer": False} if config.get("model_type") == "bert" else {}
            transformer = Transformer(str(path), model_kwargs=model_kwargs)
            model = SentenceTransformer(
                modules=[transformer, Pooling(transformer.get_embedding_dimension(), pooling_mode=pooling)],
                similarity_fn_name=similarity,
                prompts={"query": "", "document": ""},
                device=device,
            )
            info.update(kind="transformers", pooling_assumed=pooling)
        else:
            raise FinetuneError(f"{path.name} holds neither modules.json nor config.json; not a model folder")
    else:
        if os.path.isabs(str(model_ref)) or str(model_ref).startswith((".", "~")):
            raise FinetuneError(f"model folder {model_ref} does not exist")
        try:
            model = SentenceTransformer(str(model_ref), device=device)
        except Exception as error:  # offline / unknown id: the hub message says which
            raise FinetuneError(f"cannot load model {model_ref!r}: {error}") from None
    if max_seq_length is not None:
        model.max_seq_length = max_seq_length
    return model, info


def _is_hybrid(model: SentenceTransformer) -> bool:
    return any(type(m).__name__ == "DupMAEPooling" for m in model.modules())


def _pooling_description(model: SentenceTransformer) -> str:
    for module in model.modules():
        name = type(module).__name__
        if name == "DupMAEPooling":
            return f"DupMAE hybrid ({getattr(module, 'representation', 'hybrid')})"
        if name == "Pooling":
            config = module.get_config_dict()
            mode = config.get("pooling_mode")
            if mode is None:  # legacy keys
                mode = next((k[len("pooling_mode_"):].removesuffix("_token").removesuffix("_tokens")
                             for k, v in config.items() if k.startswith("pooling_mode_") and v), "unknown")
            return str(mode)
    return "unknown"


# ---- losses --------------------------------------------------------------------------------------------------------


def _similarities(model: SentenceTransformer):
    """(matrix similarity, pairwise similarity, default scale) for the model's similarity function."""
    if (model.similarity_fn_name or "cosine") == "cosine":
        return cos_sim, pairwise_cos_sim, 20.0
    if model.similarity_fn_name == "dot":
        return dot_score, pairwise_dot_score, 1.0
    raise FinetuneError(f"similarity {model.similarity_fn_name!r} is not supported for fine-tuning (use dot or cosine)")


class DistillationLoss(nn.Module):
    """Eq. 15 of dupmae.txt: KL(teacher || student) over each query's group (positive + negatives), reduction
    `batchmean`, plus an optional in-batch contrastive term.

    loss = distill_weight * KL_batchmean(softmax(t / T) || log_softmax(s / T)) * T^2
           + contrastive_weight * MultipleNegativesRankingLoss

    The two parts are returned as a dict (`distill_loss`, `contrastive_loss`), so the trainer logs each. The
    embeddings are computed once and shared by both parts.

    Args:
        model: the student SentenceTransformer.
        distill_weight: weight of the KL term (> 0).
        contrastive_weight: weight of the in-batch contrastive term (>= 0; 0 = the paper's eq. 15 alone).
        temperature: softmax temperature T of both score lists (> 0).
        scale: logit scale of the contrastive term.
        gather_across_devices: the contrastive term's in-batch negatives from all DDP ranks.
    """

    def __init__(
        self,
        model: SentenceTransformer,
        distill_weight: float = 1.0,
        contrastive_weight: float = 0.0,
        temperature: float = 1.0,
        scale: float | None = None,
        gather_across_devices: bool = False,
    ):
        super().__init__()
        if not distill_weight > 0:
            raise ValueError(f"distill_weight must be > 0, got {distill_weight}")
        if contrastive_weight < 0:
            raise ValueError(f"contrastive_weight must be >= 0, got {contrastive_weight}")
        similarity, pairwise, default_scale = _similarities(model)
        self.model = model
        self.distill_weight = distill_weight
        self.contrastive_weight = contrastive_weight
        self.kl = DistillKLDivLoss(model, similarity_fct=pairwise, temperature=temperature)
        self.contrastive = MultipleNegativesRankingLoss(
            model, scale=scale or default_scale, similarity_fct=similarity, gather_across_devices=gather_across_devices
        )

    def forward(self, sentence_features: Iterable[dict[str, torch.Tensor]], labels: torch.Tensor) -> dict[str, torch.Tensor]:
        from sentence_transformers.base.losses.merged_forward import embed_columns

        embeddings = embed_columns(self.model, sentence_features)  # [query, positive, negative_1, ...], each (B, D)
        return self.compute_loss_from_embeddings(embeddings, labels)

    def compute_loss_from_embeddings(self, embeddings: list[torch.Tensor], labels: torch.Tensor) -> dict[str, torch.Tensor]:
        """Args: embeddings `[query, positive, negative_1, ...]`, each `(batch_size, dim)`; labels (teacher scores)
        `(batch_size, 1 + num_negatives)`, positive first."""
        losses = {"distill_loss": self.distill_weight * self.kl.compute_loss_from_embeddings(embeddings, labels)}
        if self.contrastive_weight > 0:
            losses["contrastive_loss"] = self.contrastive_weight * self.contrastive.compute_loss_from_embeddings(
                embeddings, labels
            )
        return losses

    def get_config_dict(self) -> dict[str, Any]:
        return {"distill_weight": self.distill_weight, "contrastive_weight": self.contrastive_weight,
                **self.kl.get_config_dict(), "contrastive": self.contrastive.get_config_dict()}


def contrastive_loss(model: SentenceTransformer, scale: float | None, gather_across_devices: bool):
    similarity, _, default_scale = _similarities(model)
    return MultipleNegativesRankingLoss(
        model, scale=scale or default_scale, similarity_fct=similarity, gather_across_devices=gather_across_devices
    )


# ---- hard-negative mining ------------------------------------------------------------------------------------------


def mine_negatives(
    model: SentenceTransformer,
    groups: list[TrainingGroup],
    corpus: Mapping[str, str],
    *,
    num_negatives: int,
    range_min: int = 10,
    range_max: int = 100,
    sampling: str = "random",
    batch_size: int = 32,
    seed: int = 42,
    output_file: str | os.PathLike | None = None,
) -> list[TrainingGroup]:
    """Mine hard negatives for `groups` with `model` (sentence-transformers' `mine_hard_negatives`, faiss).

    Every query's positives are removed from its candidates, the first `range_min` ranks skipped, and
    `num_negatives` drawn from the ranks up to `range_max` (`sampling="random"`) or the top ones (`"top"`).
    sentence-transformers ranks the candidates by the cosine of the embeddings (it encodes with
    `normalize_embeddings=True`), also for a dot-product model.

    Args:
        groups: the training queries with their positives.
        corpus: document id -> text, the candidate pool (must contain the positives' texts or ids).
        output_file: where to save the result as JSONL (reusable with `--negatives-file`).

    Returns:
        The groups with `negatives` set; queries for which fewer than `num_negatives` candidates remained are
        returned without negatives (and counted in the log).
    """
    from datasets import Dataset
    from sentence_transformers.util import mine_hard_negatives

    if num_negatives < 1:
        raise FinetuneError(f"--num-negatives must be >= 1 to mine hard negatives, got {num_negatives}")
    if range_min < 0 or range_max - range_min < num_negatives:
        raise FinetuneError(
            f"the rank range [{range_min}, {range_max}) holds fewer than --num-negatives {num_negatives} candidates"
        )
    pool = dict(corpus)
    for group in groups:
        pool.update(group.positives)
    if range_max > len(pool):
        logger.warning("mining: the corpus has only %d documents; range_max %d lowered to it", len(pool), range_max)
        range_max = len(pool)
    text_to_id: dict[str, str] = {}
    for doc_id, text in pool.items():
        text_to_id.setdefault(text, doc_id)
    pairs = Dataset.from_dict({
        "query": [g.query for g in groups for _ in g.positives],
        "positive": [text for g in groups for _, text in g.positives],
    })
    random.seed(seed)  # mine_hard_negatives samples with the `random` module
    mined = mine_hard_negatives(
        pairs, model, anchor_column_name="query", positive_column_name="positive", corpus=list(pool.values()),
        range_min=range_min, range_max=range_max, num_negatives=num_negatives, sampling_strategy=sampling,
        output_format="n-tuple", batch_size=batch_size, use_faiss=True, verbose=False,
    )
    negative_columns = [c for c in mined.column_names if c.startswith("negative")]
    by_query: dict[str, list[tuple[str, str]]] = {}
    for row in mined:
        by_query.setdefault(row["query"], [(text_to_id[row[c]], row[c]) for c in negative_columns])
    result = [TrainingGroup(g.query_id, g.query, g.positives, by_query.get(g.query, [])) for g in groups]
    without = sum(1 for g in result if not g.negatives)
    logger.info(
        "mined %d negatives for %d of %d queries (ranks %d-%d, %s)%s", num_negatives, len(groups) - without,
        len(groups), range_min, range_max, sampling,
        f"; {without} queries had too few candidates" if without else "",
    )
    if output_file is not None:
        write_training_jsonl(result, output_file)
        logger.info("hard negatives saved to %s (reuse with --negatives-file)", output_file)
    return result


# ---- the pipeline --------------------------------------------------------------------------------------------------


def _parse_stages(text: str, teacher_scores: str | None) -> list[str]:
    stages = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in stages if s not in STAGES]
    if unknown or not stages:
        raise FinetuneError(f"--stages {text!r}: unknown stage(s) {unknown}; choose from {', '.join(STAGES)}")
    if len(set(stages)) != len(stages) or stages != sorted(stages, key=STAGES.index):
        raise FinetuneError(f"--stages {text!r}: each stage at most once, in the order {', '.join(STAGES)}")
    if "distill" in stages and not teacher_scores:
        raise FinetuneError("the distill stage needs cross-encoder scores: pass --teacher-scores FILE.tsv")
    return stages


def _corpus_pool(data_args: FinetuneDataArguments, beir: RetrievalData | None,
                 groups: list[TrainingGroup]) -> dict[str, str]:
    if data_args.corpus:
        corpus_file = Path(data_args.corpus)
        if not corpus_file.is_file():
            raise FinetuneError(f"--corpus {data_args.corpus} does not exist")
        from .beir import doc_text

        return {doc_id: doc_text(d["title"], d["text"]) for doc_id, d in read_beir_corpus(corpus_file).items()}
    if beir is not None:
        return {doc_id: beir.doc_text(doc_id) for doc_id in beir.corpus}
    pool: dict[str, str] = {}
    for group in groups:
        pool.update(group.positives)
        pool.update(group.negatives)
    return pool


def _negatives_from_file(path: str, groups: list[TrainingGroup]) -> list[TrainingGroup]:
    mined = {g.query_id: g.negatives for g in read_training_jsonl(path)}
    result = [TrainingGroup(g.query_id, g.query, g.positives, mined.get(g.query_id, [])) for g in groups]
    found = sum(1 for g in result if g.negatives)
    if not found:
        raise FinetuneError(
            f"--negatives-file {Path(path).name} has no negatives for any training query (query ids do not match; "
            "was it mined from this training data?)"
        )
    logger.info("negatives for %d of %d queries read from %s", found, len(groups), Path(path).name)
    return result


def _stage_args(training_args: FinetuneTrainingArguments, work_dir: Path, stage: str, columns: list[str],
                hybrid: bool):
    args = copy.copy(training_args)
    args.output_dir = str(work_dir / f"stage-{stage}")
    if training_args.world_size > 1:
        args.dataloader_drop_last = True  # all_gather needs equal batch sizes on every rank
    if args.device.type == "cpu":
        args.dataloader_pin_memory = False  # pinning needs an accelerator; torch warns on every DataLoader
    if hybrid and not args.router_mapping:
        # query column = task "query" (full OT vector), the others "document" (top-k); sentence-transformers 6.2
        # stamps it into each column's features as features["task"]
        args.router_mapping = {c: ("query" if c == "query" else "document") for c in columns}
    return args


def _train_stage(model, args, dataset, loss, stage: str) -> dict[str, Any]:
    started = time.time()
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=dataset, loss=loss)
    output = trainer.train()
    logger.info("stage %s: %d steps, training loss %.4f", stage, output.global_step, output.training_loss)
    return {"steps": output.global_step, "train_loss": round(float(output.training_loss), 4),
            "seconds": round(time.time() - started, 1)}


def run_finetune(
    model_args: FinetuneModelArguments,
    data_args: FinetuneDataArguments,
    loss_args: FinetuneLossArguments,
    training_args: FinetuneTrainingArguments,
) -> FinetuneResult:
    """Run the stages and write the fine-tuned sentence-transformers folder (see the module docstring)."""
    from transformers import set_seed

    stages = _parse_stages(data_args.stages, data_args.teacher_scores)
    if model_args.base_model_name is not None and not is_hub_id(model_args.base_model_name):
        raise FinetuneError(f"--base-model-name {model_args.base_model_name!r} is not a Hub id (owner/name); the card "
                            "names no local paths: omit the flag to record the starting model as local")
    output_dir = Path(training_args.output_dir)
    with folder_errors_as(FinetuneError):
        check_destination(output_dir, training_args.overwrite, source=Path(model_args.model))
    work_dir = Path(training_args.work_dir or output_dir.parent / f"{output_dir.name}.work")
    work_dir.mkdir(parents=True, exist_ok=True)
    set_seed(training_args.seed)

    groups, beir = load_training_groups(data_args.train_data, split=data_args.split, on_missing=data_args.on_missing)
    groups, dropped = clean_groups(groups)
    model, model_info = load_encoder(
        model_args.model, pooling=model_args.pooling, max_seq_length=model_args.max_seq_length, work_dir=work_dir
    )
    # all_gather only where there is more than one process (else sentence-transformers warns on every step)
    gather = loss_args.gather_across_devices and training_args.world_size > 1
    stage_records = []
    negatives_source = None
    for stage in stages:
        if stage == "in-batch":
            dataset, report = groups_to_dataset(groups, 0, seed=training_args.seed)
            loss = contrastive_loss(model, loss_args.scale, gather)
            description = "in-batch negatives (MultipleNegativesRankingLoss)"
        else:
            if negatives_source is None:  # the first stage that needs negatives gets them
                if data_args.negatives_file:
                    groups = _negatives_from_file(data_args.negatives_file, groups)
                    negatives_source = f"file {Path(data_args.negatives_file).name}"
                elif any(g.negatives for g in groups):
                    negatives_source = "supplied with the training data"
                else:
                    groups = mine_negatives(
                        model, groups, _corpus_pool(data_args, beir, groups), num_negatives=data_args.num_negatives,
                        range_min=data_args.mine_range_min, range_max=data_args.mine_range_max,
                        sampling=data_args.mine_sampling, batch_size=training_args.per_device_train_batch_size * 4,
                        seed=training_args.seed, output_file=work_dir / NEGATIVES_FILE,
                    )
                    negatives_source = (
                        f"mined with the {'previous-stage' if stage_records else 'starting'} model "
                        f"(ranks {data_args.mine_range_min}-{data_args.mine_range_max}, {data_args.mine_sampling})"
                    )
                groups, more_dropped = clean_groups(groups)
                for key, value in more_dropped.items():
                    dropped[key] = dropped.get(key, 0) + value
            if stage == "hard-negatives":
                dataset, report = groups_to_dataset(groups, data_args.num_negatives, seed=training_args.seed)
                loss = contrastive_loss(model, loss_args.scale, gather)
                description = f"{data_args.num_negatives} hard negatives + in-batch negatives (MultipleNegativesRankingLoss)"
            else:
                scores = read_teacher_scores(data_args.teacher_scores)
                dataset, report = groups_to_distillation_dataset(
                    groups, scores, data_args.num_negatives, on_missing=data_args.on_missing, seed=training_args.seed
                )
                loss = DistillationLoss(
                    model, loss_args.distill_weight, loss_args.contrastive_weight, loss_args.distill_temperature,
                    loss_args.scale, gather,
                )
                description = (
                    f"KL(batchmean) to cross-encoder scores x {loss_args.distill_weight:g}"
                    + (f" + in-batch contrastive x {loss_args.contrastive_weight:g}" if loss_args.contrastive_weight else "")
                )
        logger.info("stage %s: %d examples, columns %s", stage, len(dataset), dataset.column_names)
        args = _stage_args(training_args, work_dir, stage, dataset.column_names, _is_hybrid(model))
        record = {"stage": stage, "loss": description, "examples": len(dataset),
                  "negatives_per_query": 0 if stage == "in-batch" else data_args.num_negatives,
                  "negatives": negatives_source if stage != "in-batch" else None,
                  "loss_config": _loss_config(loss), **report}
        record.update(_train_stage(model, args, dataset, loss, stage))
        stage_records.append(record)

    info = _run_info(model, model_info, model_args, data_args, loss_args, training_args, beir, groups, dropped,
                     stage_records, output_dir)
    if training_args.process_index == 0:
        save_finetuned_model(model, output_dir, info, overwrite=training_args.overwrite)
        if data_args.eval_data:
            from .evaluate import evaluate_folder

            evaluate_folder(output_dir, beir_folders=[data_args.eval_data], split=data_args.eval_split,
                            output_dir=work_dir / "eval", update_card=True, on_missing=data_args.on_missing)
            info = json.loads((output_dir / RUN_INFO_FILE).read_text(encoding="utf-8"))
    return FinetuneResult(output_dir, info)


def _loss_config(loss: nn.Module) -> dict[str, Any]:
    config = loss.get_config_dict() if hasattr(loss, "get_config_dict") else {}
    return {k: (v if isinstance(v, int | float | str | bool | dict | type(None)) else str(v)) for k, v in config.items()}


def _run_info(model, model_info, model_args, data_args, loss_args, training_args, beir, groups, dropped,
              stage_records, output_dir: Path) -> dict[str, Any]:
    from .cli import _version
    from .export import _library_versions

    # a local starting folder is recorded by its own Hub id when it names one, never by its path
    base = model_args.base_model_name or hub_id_of_model(model_args.model)
    train_name = beir.name if beir is not None else public_name(data_args.train_data) or "training data"
    hyper = {
        "learning_rate": training_args.learning_rate,
        "per_device_train_batch_size": training_args.per_device_train_batch_size,
        "world_size": training_args.world_size,
        "gradient_accumulation_steps": training_args.gradient_accumulation_steps,
        "num_train_epochs": training_args.num_train_epochs,
        "max_steps": training_args.max_steps,
        "warmup_steps": training_args.warmup_steps,
        "weight_decay": training_args.weight_decay,
        "lr_scheduler_type": str(getattr(training_args.lr_scheduler_type, "value", training_args.lr_scheduler_type)),
        "batch_sampler": str(getattr(training_args.batch_sampler, "value", training_args.batch_sampler)),
        "seed": training_args.seed,
        "max_seq_length": model.max_seq_length,
        "num_negatives": data_args.num_negatives,
        "scale": loss_args.scale or _similarities(model)[2],
        "gather_across_devices": loss_args.gather_across_devices,
    }
    if "distill" in [r["stage"] for r in stage_records]:
        hyper.update(distill_weight=loss_args.distill_weight, contrastive_weight=loss_args.contrastive_weight,
                     distill_temperature=loss_args.distill_temperature)
    return {
        "model_name": model_args.model_name or output_dir.name,
        "base_model": base,
        "starting_point": model_info["kind"],
        "pretraining_method": model_info.get("pretraining_method"),
        "pooling": _pooling_description(model),
        "similarity": model.similarity_fn_name,
        "embedding_dim": model.get_embedding_dimension(),
        "max_seq_length": model.max_seq_length,
        "trust_remote_code": bool(model_info.get("trust_remote_code") or _is_hybrid(model)),
        "train_data": {"name": train_name, "split": data_args.split, "queries": len(groups),
                       "format": "beir" if beir is not None else "pairs", "dropped": dropped},
        "stages": stage_records,
        "hyperparameters": hyper,
        "eval_results": [],
        "retromae_version": _version(),
        "library_versions": _library_versions(),
    }


def save_finetuned_model(model: SentenceTransformer, output_dir: str | os.PathLike, info: dict[str, Any],
                         overwrite: bool = False) -> Path:
    """Write `model` + its card + the run record to `output_dir`, atomically (temporary sibling, then rename)."""
    output_dir = Path(output_dir)
    with folder_errors_as(FinetuneError), atomic_folder(output_dir, overwrite=overwrite) as build_dir:
        if _is_hybrid(model):
            from .export_dupmae import save_dupmae_sentence_transformer

            save_dupmae_sentence_transformer(model, build_dir, create_model_card=False)
        else:
            model.save(str(build_dir), create_model_card=False)
        write_model_card(build_dir, info)
    logger.info("fine-tuned model written to %s", output_dir)
    return output_dir


# ---- model card ----------------------------------------------------------------------------------------------------


def _eval_results(rows: list[dict[str, Any]], model_name: str) -> list[EvalResult]:
    results = []
    for row in rows:
        for key, label in CARD_METRICS:
            if row.get(key) is None:
                continue
            results.append(EvalResult(
                task_type="retrieval", task_name="Retrieval", dataset_type=row["dataset_id"],
                dataset_name=row["dataset_name"], dataset_split=row["split"], metric_type=key,
                metric_name=label, metric_value=float(row[key]),
            ))
    return results


def render_finetuned_card(info: Mapping[str, Any]) -> str:
    """README.md of a fine-tuned model from its run record (`retromae_finetune.json`); never a local path."""
    from .methods import METHODS

    method = info.get("pretraining_method")
    method_info = METHODS.get(method) if method else None
    model_name = info.get("model_name") or "retromae-finetuned"
    repo_id = model_name if "/" in model_name else f"<your-org>/{model_name}"
    base_model = info.get("base_model")
    hub_base = base_model if is_hub_id(base_model) else None
    train = info.get("train_data") or {}
    eval_rows = list(info.get("eval_results") or [])
    datasets = [d for d in dict.fromkeys([train.get("name"), *(r.get("dataset_id") for r in eval_rows)]) if is_hub_id(d)]
    tags = ["sentence-transformers", "sentence-similarity", "feature-extraction", "retromae", "retrieval"]
    if method:
        tags.append(method)
    if info.get("trust_remote_code"):
        tags.append("custom_code")
    card_data = ModelCardData(
        language="en", license="apache-2.0", library_name="sentence-transformers", pipeline_tag="sentence-similarity",
        base_model=hub_base, datasets=datasets or None, tags=list(dict.fromkeys(tags)), model_name=model_name,
        eval_results=_eval_results(eval_rows, model_name) or None,
    )
    citations = []
    for key in dict.fromkeys([method_info.paper if method_info else None, "retromae", "dupmae"]):
        if key and key in CITATIONS:
            citations.append(CITATIONS[key].strip())
    trust = info.get("trust_remote_code")
    template = resources.files("retromae.model_cards").joinpath(CARD_TEMPLATE).read_text(encoding="utf-8")
    card = ModelCard.from_template(
        card_data,
        template_str=template,
        model_name=model_name,
        repo_id=repo_id,
        base_model_text=(f"[{hub_base}](https://huggingface.co/{hub_base})" if hub_base
                         else "a local model (no Hub id recorded)" if not base_model else f"`{base_model}` (local)"),
        method_text=(f"{method_info.summary.partition(':')[0]} (`{method}`, [paper]({PAPER_URLS.get(method_info.paper, '')}))"
                     if method_info else "not a retromae pre-training (or not recorded)"),
        pooling=info.get("pooling"),
        similarity=info.get("similarity"),
        embedding_dim=info.get("embedding_dim"),
        max_seq_length=info.get("max_seq_length"),
        hybrid=str(info.get("pooling", "")).startswith("DupMAE"),
        trust_remote_code=trust,
        load_args=", trust_remote_code=True" if trust else "",
        train_name=train.get("name"),
        train_split=train.get("split"),
        train_queries=train.get("queries"),
        dropped=[(k.replace("_", " "), v) for k, v in (train.get("dropped") or {}).items() if v],
        stages=info.get("stages") or [],
        hyperparameters=[(k, _fmt(v)) for k, v in (info.get("hyperparameters") or {}).items()],
        eval_rows=[{**row, **{k: _fmt(row.get(k)) for k, _ in CARD_METRICS}} for row in eval_rows],
        metric_labels=[label for _, label in CARD_METRICS],
        metric_keys=[key for key, _ in CARD_METRICS],
        retromae_version=info.get("retromae_version", "unknown"),
        citations=citations,
        folder_name=model_name.split("/")[-1],
    )
    return str(card)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}" if 1e-3 <= abs(value) < 10 else f"{value:g}"
    return str(value)


def write_model_card(folder: str | os.PathLike, info: Mapping[str, Any]) -> None:
    """Write `retromae_finetune.json` and README.md into `folder` (each via a temporary file + rename)."""
    folder = Path(folder)
    for name, text in ((RUN_INFO_FILE, json.dumps(info, indent=2) + "\n"), ("README.md", render_finetuned_card(info))):
        tmp = folder / f".{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, folder / name)


# ---- CLI -----------------------------------------------------------------------------------------------------------


def finetune_command(argv: list[str]) -> int:
    """`retromae finetune MODEL TRAIN_DATA [options]`."""
    from transformers import HfArgumentParser

    from .cli import _configure_logging, _parse, _positional_to_flags

    parser = HfArgumentParser(
        (FinetuneModelArguments, FinetuneDataArguments, FinetuneLossArguments, FinetuneTrainingArguments),
        prog="retromae finetune",
        description="Fine-tune an encoder for retrieval (in-batch negatives -> mined hard negatives -> distillation) "
        "with sentence-transformers. Usage: retromae finetune MODEL TRAIN_DATA --output-dir OUT",
    )
    model_args, data_args, loss_args, training_args = _parse(
        parser, _positional_to_flags(argv, ["model", "train_data"])
    )
    _configure_logging(training_args.get_process_log_level())
    if data_args.on_missing not in ON_MISSING:  # Literal choices are enforced by argparse; config files too
        raise FinetuneError(f"--on-missing must be one of {ON_MISSING}")
    try:
        result = run_finetune(model_args, data_args, loss_args, training_args)
    except RetrievalDataError as error:
        raise FinetuneError(str(error)) from None
    if training_args.process_index == 0:
        lines = [f"retromae: fine-tuned model written to {result.output_dir}"]
        for stage in result.info["stages"]:
            lines.append(f"  {stage['stage']}: {stage['examples']} examples, {stage['steps']} steps, "
                         f"training loss {stage['train_loss']:.4f}")
        for row in result.info.get("eval_results") or []:
            lines.append(f"  {row['dataset_name']} ({row['split']}): NDCG@10 {row['ndcg_at_10']:.4f}")
        print("\n".join(lines), flush=True)
    return 0


# read_beir is re-exported for users who build RetrievalData themselves
__all__ += ["read_beir"]
