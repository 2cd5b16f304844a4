"""`retromae finetune`: train a bi-encoder for retrieval from a retromae checkpoint, export, or any BERT / ST folder.

The recipe is the papers' (DupMAE paper eq. 13-15, RetroMAE paper §4.1), each stage one `SentenceTransformerTrainer` run
that continues from the previous stage's model:

1. ``in-batch``: contrastive loss with in-batch negatives (eq. 13), sentence-transformers'
   `MultipleNegativesRankingLoss` on (query, positive) pairs.
2. ``hard-negatives``: negatives for every training query are mined with the current (stage-1) model, which ranks
   the whole pool by its own similarity (exact search; the dot product of a retromae export, as the papers
   retrieve): the top `range_max` documents, the query's positives removed (by text), the first `range_min` ranks
   skipped (likely unlabelled positives), `num_negatives` drawn at random from the rest. They are saved to
   ``<work dir>/hard_negatives.jsonl`` (reusable with ``--negatives-file``), then the same loss trains on (query,
   positive, negative_1..k) with in-batch negatives too (eq. 14). Negatives that the training data already carries
   are used instead of mining.
3. ``distill``: KL divergence between the softmax of the student's scores over (positive, negatives) and the
   softmax of cross-encoder scores read from a TSV file (`query-id  corpus-id  score`), reduction ``batchmean``
   (eq. 15; sentence-transformers' `DistillKLDivLoss`), times ``--distill-loss-weight`` (default 1), plus
   ``--contrastive-loss-weight`` (default 0) times the in-batch contrastive loss. The RetroMAE authors' code uses
   KL(``reduction="mean"``, i.e. divided by batch x group size) + 1e-4 x contrastive; we follow the paper (KL
   ``batchmean`` alone) and keep the contrastive term as an option.

Scores and pooling. A retromae export (CLS pooling, dot product) trains with the dot product and ``scale=1``
(temperature 1, the papers' setting); a model whose `similarity_fn_name` is cosine (e.g. all-MiniLM-L6-v2) with
cosine and ``scale=20`` (sentence-transformers' default). A model folder WITHOUT modules.json (a plain BERT
checkpoint) is loaded with CLS pooling + dot product and a warning: sentence-transformers itself would build MEAN
pooling for such a folder, which averages token states that RetroMAE-style pre-training never trained as a sentence
embedding, and BEIR numbers computed that way are wrong (lower). ``--pooling mean`` overrides (mean pooling +
cosine, for a plain folder and a pre-training checkpoint alike; `retromae export --pooling/--similarity` makes any
other head). The DupMAE hybrid model (`st_dupmae.DupMAEPooling`, remote code) trains through the same losses: its
sentence embedding is [W^cls h ; top-k(mu)] and the dot product of two is the paper's eq. 12, so W^cls, the encoder
and the OT head all learn.

Several devices. Under ``torchrun`` (DDP) the contrastive loss gathers the embeddings of all ranks
(`MultipleNegativesRankingLoss(gather_across_devices=True)`, sentence-transformers 6.2: `all_gather_with_grad`, the
local block offset by `get_rank() * batch_size`, i.e. the global rank), so every query sees the positives and
negatives of the whole global batch (fine-tuning on one device's batch alone is reported to lose 1-2 points).
``--no-gather-across-devices`` turns it off. On one device, ``--mini-batch-size N`` gives a batch larger than fits
in memory all its in-batch negatives (GradCache, `CachedMultipleNegativesRankingLoss`). Batches are drawn with
`BatchSamplers.NO_DUPLICATES` so that no text appears twice in a batch (a duplicate positive would be a false
in-batch negative).

Output: a sentence-transformers folder (written to a temporary sibling and renamed into place; an existing folder is
replaced only with ``--overwrite``) with a model card from `model_cards/finetuned_encoder.md` and
``retromae_finetune.json`` (the run record the card is rendered from; `retromae evaluate --update-card` adds results
to it). Trainer checkpoints and mined negatives go to the work folder ``<output>.work`` (``--work-dir``).

Resuming. The work folder keeps each finished stage's model and record (``finetune_state.json``). A run started
again with ``--resume-from-checkpoint last`` and the same settings skips the finished stages, reuses the mined
negatives and continues the interrupted stage from its newest trainer checkpoint (``--save-strategy steps
--save-steps N`` to write them; by default a stage restarts). The settings are saved when a run starts, so a resume
with other settings is refused from the first stage on. Without the flag a run starts over.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import os
import random
import shutil
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from datasets import Dataset
from retromae.modeling.configuration_retromae import rename_legacy_keys
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from sentence_transformers.base.losses.merged_forward import embed_columns
from sentence_transformers.sentence_transformer.losses import (
    CachedMultipleNegativesRankingLoss,
    DistillKLDivLoss,
    MultipleNegativesRankingLoss,
)
from sentence_transformers.util import (
    cos_sim,
    dot_score,
    fullname,
    pairwise_cos_sim,
    pairwise_dot_score,
)
from torch import nn
from transformers import set_seed
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .beir import (
    ON_MISSING,
    RetrievalData,
    RetrievalDataError,
    TrainingGroup,
    clean_groups,
    doc_text,
    groups_to_dataset,
    groups_to_distillation_dataset,
    load_training_groups,
    read_beir,
    read_beir_corpus,
    read_teacher_scores,
    read_training_jsonl,
    write_training_jsonl,
)
from .core.arguments import check_training_arguments, start_command
from .core.cards import FINETUNE_RUN_INFO_FILE, write_finetuned_card
from .core.checkpoints import divergence, save_without_pooler
from .core.errors import UserError
from .core.folders import (
    atomic_folder,
    check_destination,
    hub_id_of_model,
    is_hub_id,
    model_location,
    public_name,
)
from .core.io import read_json_or_empty, write_json_atomic
from .core.lock import folder_lock
from .core.versions import library_versions, package_version
from .evaluate import evaluate_folder
from .export import load_as_sentence_transformer
from .methods import METHODS, hybrid_method_of
from .trainer import RESUME_LAST, last_complete_checkpoint
from .validation import RunningTopK

logger = logging.getLogger(__name__)

STAGES = ("in-batch", "hard-negatives", "distill")
NEGATIVES_FILE = "hard_negatives.jsonl"
MINING_CHUNK_BYTES = 2**29  # mining: the float32 embeddings of one chunk of documents, and its score matrix
STATE_FILE = "finetune_state.json"  # in the work folder: the finished stages of a run, for resuming it
STAGE_MODEL = "model"  # in a stage's folder: the model that stage finished with
# options that decide nothing a stage trains: they may differ between a run and its resumption
MAY_CHANGE_ON_RESUME = frozenset({
    "overwrite", "resume_from_checkpoint", "logging_dir", "logging_steps", "logging_strategy", "disable_tqdm",
    "report_to", "save_steps", "save_strategy", "save_total_limit", "local_rank", "dataloader_num_workers",
    "eval_data", "eval_split", "model_name", "base_model_name", "mini_batch_size",
})

__all__ = [
    "STAGES",
    "DistillationLoss",
    "FinetuneResult",
    "finetune",
    "finetune_command",
    "check_mining_range",
    "mine_negatives",
    "run_finetune",
]


# ---- arguments -----------------------------------------------------------------------------------------------------


@dataclass
class FinetuneModelArguments:
    model: str = field(
        metadata={"help": "starting point: a `retromae pretrain` checkpoint, a `retromae export` folder, any "
                  "sentence-transformers folder (e.g. the DupMAE hybrid export), or a plain BERT folder"}
    )
    pooling: Literal["cls", "mean"] | None = field(
        default=None,
        metadata={"help": "pooling for a folder WITHOUT modules.json, a pre-training checkpoint included: cls + dot "
                  "product (default, the papers' BEIR protocol) or mean + cosine (the head of bases such as "
                  "all-MiniLM-L6-v2); sentence-transformers folders keep their own"},
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
    # old option name -> new: every loss weight is `<term>_loss_weight`; the old names are read with a warning
    renamed = {"distill_weight": "distill_loss_weight", "contrastive_weight": "contrastive_loss_weight"}

    scale: float | None = field(
        default=None,
        metadata={"help": "contrastive logit scale = 1/temperature (default: 1 for dot-product models, 20 for cosine)"},
    )
    distill_loss_weight: float = field(default=1.0, metadata={"help": "weight of the KL (batchmean) distillation loss"})
    contrastive_loss_weight: float = field(
        default=0.0,
        metadata={"help": "weight of the in-batch contrastive loss added in the distill stage (RetroMAE code: 1e-4)"},
    )
    distill_temperature: float = field(default=1.0, metadata={"help": "temperature of student and teacher softmax"})
    gather_across_devices: bool = field(
        default=True, metadata={"help": "DDP: in-batch negatives from all ranks (global batch); no effect on 1 process"}
    )
    mini_batch_size: int | None = field(
        default=None,
        metadata={"help": "GradCache (CachedMultipleNegativesRankingLoss) in the in-batch and hard-negatives stages: "
                  "embed each column of a batch N texts at a time, so a --per-device-train-batch-size too large "
                  "for memory trains with all its in-batch negatives; the same loss, one more forward per text"},
    )

    def __post_init__(self):
        if self.mini_batch_size is not None and self.mini_batch_size < 1:
            raise UserError(f"--mini-batch-size {self.mini_batch_size}: give a positive number of texts")
        if self.scale is not None and not self.scale > 0:
            raise UserError(f"--scale {self.scale}: give a logit scale > 0 (1/temperature), or leave it unset")
        if not self.distill_temperature > 0:
            raise UserError(f"--distill-temperature {self.distill_temperature}: give a temperature > 0")
        if not self.distill_loss_weight > 0:
            raise UserError(f"--distill-loss-weight {self.distill_loss_weight}: give a weight > 0")
        if self.contrastive_loss_weight < 0:
            raise UserError(f"--contrastive-loss-weight {self.contrastive_loss_weight}: give a weight >= 0")


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
    already_finished: bool = False  # resumed after its end: nothing was trained or written


# ---- describing the model ------------------------------------------------------------------------------------------


def _pooling_description(model: SentenceTransformer) -> str:
    hybrid = hybrid_method_of(model)
    if hybrid is not None:  # the method's own module
        return hybrid.pooling_module.describe(model)
    for module in model.modules():
        name = type(module).__name__
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
    raise UserError(f"similarity {model.similarity_fn_name!r} is not supported for fine-tuning (use dot or cosine)")


class DistillationLoss(nn.Module):
    """Eq. 15 of the DupMAE paper: KL(teacher || student) over each query's group (positive + negatives), reduction
    `batchmean`, plus an optional in-batch contrastive term.

    loss = distill_loss_weight * KL_batchmean(softmax(t / T) || log_softmax(s / T)) * T^2
           + contrastive_loss_weight * MultipleNegativesRankingLoss

    The two parts are returned as a dict (`distill_loss`, `contrastive_loss`), so the trainer logs each. The
    embeddings are computed once and shared by both parts.

    Args:
        model: the student SentenceTransformer.
        distill_loss_weight: weight of the KL term (> 0).
        contrastive_loss_weight: weight of the in-batch contrastive term (>= 0; 0 = the paper's eq. 15 alone).
        temperature: softmax temperature T of both score lists (> 0).
        scale: logit scale of the contrastive term.
        gather_across_devices: the contrastive term's in-batch negatives from all DDP ranks.
    """

    def __init__(
        self,
        model: SentenceTransformer,
        distill_loss_weight: float = 1.0,
        contrastive_loss_weight: float = 0.0,
        temperature: float = 1.0,
        scale: float | None = None,
        gather_across_devices: bool = False,
    ):
        super().__init__()
        if not distill_loss_weight > 0:
            raise UserError(f"distill_loss_weight must be > 0, got {distill_loss_weight}")
        if contrastive_loss_weight < 0:
            raise UserError(f"contrastive_loss_weight must be >= 0, got {contrastive_loss_weight}")
        similarity, pairwise, default_scale = _similarities(model)
        self.model = model
        self.distill_loss_weight = distill_loss_weight
        self.contrastive_loss_weight = contrastive_loss_weight
        self.kl = DistillKLDivLoss(model, similarity_fct=pairwise, temperature=temperature)
        self.contrastive = MultipleNegativesRankingLoss(
            model, scale=scale or default_scale, similarity_fct=similarity, gather_across_devices=gather_across_devices
        )

    def forward(self, sentence_features: Iterable[dict[str, torch.Tensor]], labels: torch.Tensor) -> dict[str, torch.Tensor]:
        embeddings = embed_columns(self.model, sentence_features)  # [query, positive, negative_1, ...], each (B, D)
        return self.compute_loss_from_embeddings(embeddings, labels)

    def compute_loss_from_embeddings(self, embeddings: list[torch.Tensor], labels: torch.Tensor) -> dict[str, torch.Tensor]:
        """Args: embeddings `[query, positive, negative_1, ...]`, each `(batch_size, dim)`; labels (teacher scores)
        `(batch_size, 1 + num_negatives)`, positive first."""
        losses = {"distill_loss": self.distill_loss_weight * self.kl.compute_loss_from_embeddings(embeddings, labels)}
        if self.contrastive_loss_weight > 0:
            losses["contrastive_loss"] = self.contrastive_loss_weight * self.contrastive.compute_loss_from_embeddings(
                embeddings, labels
            )
        return losses

    def get_config_dict(self) -> dict[str, Any]:
        return {"distill_loss_weight": self.distill_loss_weight, "contrastive_loss_weight": self.contrastive_loss_weight,
                **self.kl.get_config_dict(), "contrastive": self.contrastive.get_config_dict()}


def contrastive_loss(model: SentenceTransformer, scale: float | None, gather_across_devices: bool,
                     mini_batch_size: int | None = None) -> nn.Module:
    """sentence-transformers' `MultipleNegativesRankingLoss` at the model's similarity; with `mini_batch_size` its
    GradCache form, which gives the same loss and gradients in the memory of `mini_batch_size` texts."""
    similarity, _, default_scale = _similarities(model)
    options = dict(scale=scale or default_scale, similarity_fct=similarity, gather_across_devices=gather_across_devices)
    if mini_batch_size is None:
        return MultipleNegativesRankingLoss(model, **options)
    return CachedMultipleNegativesRankingLoss(model, mini_batch_size=mini_batch_size, **options)


# ---- hard-negative mining ------------------------------------------------------------------------------------------


def check_mining_range(num_negatives: int, range_min: int, range_max: int) -> None:
    """Refuse a rank range `[range_min, range_max)` that cannot hold `num_negatives` (>= 1) negatives."""
    if num_negatives < 1:
        raise UserError(f"--num-negatives must be >= 1 to mine hard negatives, got {num_negatives}")
    if range_min < 0:
        raise UserError(f"--mine-range-min {range_min}: give the number of top ranks to skip, >= 0")
    if range_max - range_min < num_negatives:
        raise UserError(f"the rank range [{range_min}, {range_max}) (--mine-range-min, --mine-range-max) holds "
                            f"fewer than --num-negatives {num_negatives} candidates")


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
    """Mine hard negatives for `groups` with `model`, ranking the whole pool by the model's own similarity (dot
    product or cosine, exact search), as the papers retrieve with the model being fine-tuned.

    Every query's positives are removed from its candidates (by text), the first `range_min` ranks skipped, and
    `num_negatives` drawn at random from the ranks up to `range_max` (`sampling="random"`, seeded by `seed`) or the
    top ones (`"top"`), kept in rank order. Documents with the same text count once.

    Args:
        groups: the training queries with their positives.
        corpus: document id -> text, the candidate pool (the positives are added to it).
        output_file: where to save the result as JSONL (reusable with `--negatives-file`).

    Returns:
        The groups with `negatives` set; queries for which fewer than `num_negatives` candidates remained are
        returned without negatives (and counted in the log).
    """
    check_mining_range(num_negatives, range_min, range_max)
    text_to_id: dict[str, str] = {}
    for doc_id, text in [*corpus.items(), *(p for g in groups for p in g.positives)]:
        if text.strip():  # a blank document is no negative
            text_to_id.setdefault(text, doc_id)
    if range_max > len(text_to_id):
        logger.warning("mining: the corpus has only %d documents; range_max %d lowered to it", len(text_to_id),
                       range_max)
        range_max = len(text_to_id)
    texts = list(text_to_id)
    positive_texts = [{text for _, text in g.positives} for g in groups]
    depth = range_max + max((len(p) for p in positive_texts), default=0)
    rankings = _rank_documents(model, groups, texts, depth, batch_size)
    rng = random.Random(seed)
    result = []
    for group, positives, ranked in zip(groups, positive_texts, rankings, strict=True):
        candidates = [texts[i] for i in ranked if texts[i] not in positives][range_min:range_max]
        if len(candidates) < num_negatives:
            chosen = []
        elif sampling == "top":
            chosen = candidates[:num_negatives]
        else:
            chosen = [candidates[i] for i in sorted(rng.sample(range(len(candidates)), num_negatives))]
        result.append(TrainingGroup(group.query_id, group.query, group.positives,
                                    [(text_to_id[text], text) for text in chosen]))
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


def _rank_documents(model: SentenceTransformer, groups: list[TrainingGroup], texts: list[str], depth: int,
                    batch_size: int) -> list[list[int]]:
    """Per group, the indices of its query's `depth` best `texts` by the model's similarity, best first. Queries and
    documents are encoded as the model encodes them for retrieval (`encode_query` / `encode_document`); documents
    are encoded and scored a chunk at a time, so memory holds one chunk's embeddings and scores, whatever the corpus."""
    if not groups:
        return []
    normalize = _similarities(model)[0] is cos_sim
    options = dict(batch_size=batch_size, convert_to_tensor=True, normalize_embeddings=normalize)
    queries = model.encode_query([g.query for g in groups], show_progress_bar=False, **options).float()
    chunk = max(1, MINING_CHUNK_BYTES // (4 * queries.shape[1]))  # documents per chunk
    block = max(1, MINING_CHUNK_BYTES // (4 * chunk))  # queries scored against a chunk at once
    tops = [(RunningTopK(len(part), depth, queries.device), part) for part in queries.split(block)]
    for start in range(0, len(texts), chunk):
        docs = model.encode_document(texts[start : start + chunk], show_progress_bar=True, **options).float()
        for top, part in tops:
            top.add(part @ docs.T, start)
    return [ranked for top, _ in tops for ranked in top.ranking()]


# ---- the pipeline --------------------------------------------------------------------------------------------------


def _parse_stages(text: str, teacher_scores: str | None) -> list[str]:
    stages = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in stages if s not in STAGES]
    if unknown or not stages:
        raise UserError(f"--stages {text!r}: unknown stage(s) {unknown}; choose from {', '.join(STAGES)}")
    if len(set(stages)) != len(stages) or stages != sorted(stages, key=STAGES.index):
        raise UserError(f"--stages {text!r}: each stage at most once, in the order {', '.join(STAGES)}")
    if "distill" in stages and not teacher_scores:
        raise UserError("the distill stage needs cross-encoder scores: pass --teacher-scores FILE.tsv")
    return stages


def _corpus_pool(data_args: FinetuneDataArguments, beir: RetrievalData | None,
                 groups: list[TrainingGroup]) -> dict[str, str]:
    if data_args.corpus:
        corpus_file = Path(data_args.corpus)
        if not corpus_file.is_file():
            raise UserError(f"--corpus {data_args.corpus} does not exist")
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
        raise UserError(
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


def _prepare_checkpoint(model: SentenceTransformer, checkpoint: Path) -> None:
    """The trainer reloads a checkpoint as a SentenceTransformer built from the classes its modules.json names: name
    the classes of the model in training (a DupMAE hybrid model's pooling module is remote code, imported under
    another module path), and keep a pooler-less encoder without a pooler."""
    modules_file = checkpoint / "modules.json"
    entries = json.loads(modules_file.read_text(encoding="utf-8"))
    for entry in entries:
        entry["type"] = fullname(model[int(entry["idx"])])
    write_json_atomic(modules_file, entries)
    save_without_pooler(model, checkpoint)


def _train_stage(model, args, dataset, loss, stage: str, resume: bool) -> dict[str, Any]:
    """Train one stage; resuming, from the newest complete trainer checkpoint in its folder (if any), else afresh."""
    started = time.time()
    checkpoint = last_complete_checkpoint(args.output_dir) if resume else None
    if checkpoint is None:
        shutil.rmtree(args.output_dir, ignore_errors=True)  # this run's own stage folder: checkpoints of an older run
    else:
        logger.info("stage %s: continuing from %s", stage, checkpoint)
        _prepare_checkpoint(model, checkpoint)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=dataset, loss=loss)
    output = trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    _check_finite(model, trainer.state.log_history, stage, output.global_step)
    logger.info("stage %s: %d steps, training loss %.4f", stage, output.global_step, output.training_loss)
    record = {"steps": output.global_step, "train_loss": round(float(output.training_loss), 4),
              "seconds": round(time.time() - started, 1)}
    if checkpoint is not None:  # the Trainer's mean covers the steps after the checkpoint only
        record["train_loss_from_step"] = int(checkpoint.name.rsplit("-", 1)[1]) + 1
    return record


def _check_finite(model: SentenceTransformer, log_history: list[dict[str, Any]], stage: str, steps: int) -> None:
    """Refuse a stage whose weights became NaN or infinite, before its model is saved anywhere."""
    diverged = divergence(model, log_history)
    if diverged:
        raise UserError(f"stage {stage} diverged: {diverged}, after {steps} steps; lower --learning-rate (or "
                        "--scale) and run again (nothing was written)")


def _run_settings(model_args, data_args, loss_args, training_args) -> dict[str, Any]:
    """The settings that decide what the stages train (not `MAY_CHANGE_ON_RESUME`), JSON-safe; an existing local
    path resolved, so that `./data` and `/abs/data` are one setting."""
    values = {**dataclasses.asdict(model_args), **dataclasses.asdict(data_args), **dataclasses.asdict(loss_args),
              **training_args.to_dict()}
    kept = {name: value for name, value in values.items() if name not in MAY_CHANGE_ON_RESUME}
    for name, value in kept.items():
        if name in {"output_dir", "work_dir"} and value:  # may not exist yet
            kept[name] = str(Path(value).expanduser().resolve())
        elif isinstance(value, str) and value:
            kept[name] = model_location(value)
    return json.loads(json.dumps(kept, sort_keys=True, default=str))


def _settings_key(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def _read_state(work_dir: Path, settings: dict[str, Any], resume: bool,
                main_process: bool) -> tuple[dict[str, Any], bool]:
    """The run's state (`{"settings_key": ..., "settings": ..., "stages": [...], "negatives": ...}`) and whether it
    continues an earlier run: the work folder's when resuming a run with the same settings, else a fresh one, saved
    at once (the main process) so that a run killed in its first stage is resumed only with its own settings."""
    state = read_json_or_empty(work_dir / STATE_FILE)
    key = _settings_key(settings)
    if resume and state:
        if state.get("settings_key") != key:
            recorded = state.get("settings") or {}
            changed = sorted(name for name in recorded.keys() | settings.keys()
                             if recorded.get(name) != settings.get(name))
            shown = ", ".join(f"--{name.replace('_', '-')} {recorded.get(name)!r} -> {settings.get(name)!r}"
                              for name in changed[:3]) + (", ..." if len(changed) > 3 else "")
            raise UserError(
                f"--resume-from-checkpoint: the run in {work_dir} used other settings "
                f"({shown or 'not recorded by the older retromae that ran it'}); give the same options as that run "
                "(output, logging and evaluation options may change), or start over in another --output-dir "
                "(without the flag, this one starts over and clears its stages)"
            )
        return state, True
    if resume:
        logger.info("--resume-from-checkpoint: nothing to resume in %s; starting from the first stage", work_dir)
    elif state.get("stages"):
        logger.warning("%s holds %d finished stage(s) of an earlier run; starting over (continue a run with "
                       "--resume-from-checkpoint last)", work_dir, len(state["stages"]))
    fresh = {"settings_key": key, "settings": settings, "stages": [], "negatives": None}
    if main_process:  # before a stage folder of an earlier run is cleared
        write_json_atomic(work_dir / STATE_FILE, fresh)
    return fresh, False


def _finish_stage(state: dict[str, Any], work_dir: Path, model: SentenceTransformer, record: dict[str, Any],
                  main_process: bool) -> None:
    """Add the stage's record to `state` and save it with the stage's model in the work folder (the main process),
    so that a resumed run starts after this stage; then the stage's Trainer checkpoints, which no resume reads any
    more (hundreds of MB each, optimizer included), are deleted."""
    state["stages"].append(record)
    if main_process:
        stage_dir = work_dir / f"stage-{record['stage']}"
        with atomic_folder(stage_dir / STAGE_MODEL, overwrite=True) as build_dir:
            _save_model(model, build_dir)
        write_json_atomic(work_dir / STATE_FILE, state)
        for checkpoint in stage_dir.glob(f"{PREFIX_CHECKPOINT_DIR}-*"):
            shutil.rmtree(checkpoint, ignore_errors=True)


def _model_after_finished_stages(model: SentenceTransformer, stages: list[str], state: dict[str, Any],
                                 work_dir: Path) -> SentenceTransformer:
    """The model the last finished stage saved (`model` when none finished); refuses finished stages that do not
    begin `stages`."""
    finished = [record["stage"] for record in state["stages"]]
    if not finished:
        return model
    if finished != stages[: len(finished)]:
        raise UserError(f"--resume-from-checkpoint: {work_dir} finished the stages {finished}, which do not "
                        f"begin --stages {','.join(stages)}")
    logger.info("resuming after the finished stage(s) %s", ", ".join(finished))
    return load_as_sentence_transformer(work_dir / f"stage-{finished[-1]}" / STAGE_MODEL, work_dir=work_dir)[0]


@dataclass
class CheckedNegatives:
    """What `_read_negatives_before_training` read, for the stages to use: the corpus to mine from, or the groups
    with their negatives (cleaned; `dropped` counts what cleaning dropped) and each stage's dataset and report."""

    pool: dict[str, str] | None = None
    groups: list[TrainingGroup] | None = None
    dropped: dict[str, int] = field(default_factory=dict)
    datasets: dict[str, tuple[Dataset, dict[str, Any]]] = field(default_factory=dict)


def _read_negatives_before_training(stages: list[str], groups: list[TrainingGroup], beir: RetrievalData | None,
                                    teacher_scores: dict[str, dict[str, float]] | None,
                                    data_args: FinetuneDataArguments, seed: int) -> CheckedNegatives:
    """Read what the stages after in-batch read, before anything trains: negatives from `--negatives-file` or the
    training data must fill those stages' rows (with teacher scores for distill); for mining, the corpus is read.
    Negatives mined later are checked once mined."""
    if stages == ["in-batch"]:
        return CheckedNegatives()
    if not data_args.negatives_file and not any(g.negatives for g in groups):
        pool = _corpus_pool(data_args, beir, groups)
        _check_pool_holds_negatives(len(pool), data_args)
        if "distill" in stages:
            _check_positives_scored(groups, teacher_scores or {}, data_args)
        return CheckedNegatives(pool=pool)
    if data_args.negatives_file:
        groups = _negatives_from_file(data_args.negatives_file, groups)
    checked = CheckedNegatives()
    checked.groups, checked.dropped = clean_groups(groups)
    if "hard-negatives" in stages:
        checked.datasets["hard-negatives"] = groups_to_dataset(checked.groups, data_args.num_negatives, seed=seed)
    if "distill" in stages:
        checked.datasets["distill"] = groups_to_distillation_dataset(
            checked.groups, teacher_scores, data_args.num_negatives, on_missing=data_args.on_missing, seed=seed)
    return checked


def _check_pool_holds_negatives(pool_size: int, data_args: FinetuneDataArguments) -> None:
    """Refuse mining that cannot give any query `--num-negatives` negatives: the ranks it takes them from,
    [`--mine-range-min`, `--mine-range-max`), stop at the pool's size."""
    available = min(data_args.mine_range_max, pool_size) - data_args.mine_range_min
    if available < data_args.num_negatives:
        raise UserError(
            f"mining ranks the {pool_size} documents of the corpus and takes negatives from ranks "
            f"[{data_args.mine_range_min}, {min(data_args.mine_range_max, pool_size)}): at most {max(available, 0)} "
            f"per query, fewer than --num-negatives {data_args.num_negatives}; lower --num-negatives or "
            "--mine-range-min, or give a larger --corpus"
        )


def _check_positives_scored(groups: list[TrainingGroup], teacher_scores: dict[str, dict[str, float]],
                            data_args: FinetuneDataArguments) -> None:
    """Refuse teacher scores that miss every positive of a query (the distill stage needs the positive's score as
    much as its mined negatives'): any query with `--on-missing error`, all of them otherwise."""
    unscored = [g for g in groups if not any(doc_id in teacher_scores.get(g.query_id, {}) for doc_id, _ in g.positives)]
    if not unscored or (data_args.on_missing != "error" and len(unscored) < len(groups)):
        return
    example = unscored[0]
    fix = ("score them, or pass --on-missing skip to drop those queries" if len(unscored) < len(groups)
           else "check that its query and document ids are those of --train-data")
    raise UserError(f"--teacher-scores {data_args.teacher_scores} scores no positive of {len(unscored)} of the "
                    f"{len(groups)} training queries (e.g. query {example.query_id!r}, document "
                    f"{example.positives[0][0]!r}); {fix}")


def _attach_negatives(model: SentenceTransformer, groups: list[TrainingGroup], state: dict[str, Any],
                      data_args: FinetuneDataArguments, training_args: FinetuneTrainingArguments,
                      beir: RetrievalData | None, work_dir: Path,
                      checked: CheckedNegatives) -> tuple[list[TrainingGroup], dict[str, int], str]:
    """`groups` with hard negatives, cleaned, what cleaning dropped, and where the negatives came from:
    `--negatives-file` or the training data (as `checked` read them), the run this one resumes, or mined now with
    `model` (saved to `NEGATIVES_FILE`, recorded in `state`)."""
    if checked.groups is not None:
        source = (f"file {Path(data_args.negatives_file).name}" if data_args.negatives_file
                  else "supplied with the training data")
        return checked.groups, checked.dropped, source
    if state["negatives"]:
        return (*clean_groups(_negatives_from_file(work_dir / NEGATIVES_FILE, groups)), state["negatives"])
    groups = mine_negatives(
        model, groups, checked.pool if checked.pool is not None else _corpus_pool(data_args, beir, groups),
        num_negatives=data_args.num_negatives,
        range_min=data_args.mine_range_min, range_max=data_args.mine_range_max,
        sampling=data_args.mine_sampling, batch_size=training_args.per_device_train_batch_size * 4,
        seed=training_args.seed, output_file=work_dir / NEGATIVES_FILE,
    )
    state["negatives"] = (
        f"mined with the {'previous-stage' if state['stages'] else 'starting'} model "
        f"(ranks {data_args.mine_range_min}-{data_args.mine_range_max}, {data_args.mine_sampling})"
    )
    if training_args.process_index == 0:  # a resumed run reads them from NEGATIVES_FILE
        write_json_atomic(work_dir / STATE_FILE, state)
    return (*clean_groups(groups), state["negatives"])


def _stage_data_and_loss(stage: str, model: SentenceTransformer, groups: list[TrainingGroup],
                         teacher_scores: dict[str, dict[str, float]] | None, data_args: FinetuneDataArguments,
                         loss_args: FinetuneLossArguments, seed: int, gather: bool,
                         built: tuple[Dataset, dict[str, Any]] | None) -> tuple[Dataset, dict[str, Any], nn.Module, str]:
    """A stage's dataset, its build report (`built`, when read before training), its loss and the loss's
    description for the run record."""
    if stage == "distill":
        dataset, report = built or groups_to_distillation_dataset(
            groups, teacher_scores, data_args.num_negatives, on_missing=data_args.on_missing, seed=seed
        )
        loss = DistillationLoss(model, loss_args.distill_loss_weight, loss_args.contrastive_loss_weight,
                                loss_args.distill_temperature, loss_args.scale, gather)
        description = f"KL(batchmean) to cross-encoder scores x {loss_args.distill_loss_weight:g}"
        if loss_args.contrastive_loss_weight:
            description += f" + in-batch contrastive x {loss_args.contrastive_loss_weight:g}"
        return dataset, report, loss, description
    negatives = 0 if stage == "in-batch" else data_args.num_negatives
    dataset, report = built or groups_to_dataset(groups, negatives, seed=seed)
    description = "in-batch negatives" if stage == "in-batch" else f"{negatives} hard negatives + in-batch negatives"
    loss = contrastive_loss(model, loss_args.scale, gather, loss_args.mini_batch_size)
    name = "MultipleNegativesRankingLoss" if loss_args.mini_batch_size is None else (
        f"CachedMultipleNegativesRankingLoss, mini-batches of {loss_args.mini_batch_size}")
    return dataset, report, loss, f"{description} ({name})"


def _check_run_inputs(model_args: FinetuneModelArguments, data_args: FinetuneDataArguments,
                      training_args: FinetuneTrainingArguments, stages: list[str]) -> Path:
    """The work folder, after refusing, before anything is loaded or trained, what would fail in a later stage or
    lose files: an output folder that is or holds an input or the working directory, a work folder inside the
    output folder, a missing file, a rank range that cannot hold the negatives, a resume value other than `last`,
    teacher scores without the distill stage, an in-batch stage without in-batch negatives."""
    output_dir = Path(training_args.output_dir)
    files = {"--corpus": data_args.corpus, "--negatives-file": data_args.negatives_file,
             "--teacher-scores": data_args.teacher_scores}
    check_destination(output_dir, training_args.overwrite, inputs={
        "--model": model_args.model, "--train-data": data_args.train_data, "--eval-data": data_args.eval_data, **files})
    if (training_args.overwrite and output_dir.is_dir() and any(output_dir.iterdir())
            and not any((output_dir / name).is_file() for name in ("modules.json", "config.json"))):
        raise UserError(f"--output-dir {output_dir} holds no model (no modules.json or config.json), so "
                        "--overwrite will not replace it: choose a new or empty folder")
    work_dir = _work_dir(training_args)
    if output_dir.resolve() in (work_dir.resolve(), *work_dir.resolve().parents):
        raise UserError(f"--work-dir {work_dir} is inside --output-dir {output_dir}, which the finished model "
                        f"replaces; choose a folder beside it (default: {output_dir.name}.work)")
    _check_work_dir(work_dir)
    resume = training_args.resume_from_checkpoint
    if resume is not None and resume not in RESUME_LAST:
        raise UserError(f"--resume-from-checkpoint {resume}: `retromae finetune` continues its own run, each "
                        "stage from its newest checkpoint in the work folder; pass `last`")
    for flag, path in files.items():
        if path and Path(path).is_dir():
            hint = f" (a BEIR folder's corpus is {Path(path) / 'corpus.jsonl'})" if flag == "--corpus" else ""
            raise UserError(f"{flag} {path} is a folder, not a file{hint}")
        if path and not Path(path).is_file():
            raise UserError(f"{flag} {path}: no such file")
    if data_args.eval_data:  # read whole now: a bad line would otherwise be found after training
        read_beir(data_args.eval_data, split=data_args.eval_split, on_missing=data_args.on_missing)
    if data_args.teacher_scores and "distill" not in stages:
        raise UserError("--teacher-scores is read by the distill stage only: add distill to --stages, or drop "
                        "the flag")
    if stages != ["in-batch"] and data_args.num_negatives < 1:  # mined, read from a file or carried by the data
        raise UserError(f"--num-negatives {data_args.num_negatives}: the {stages[-1]} stage needs at least one "
                        "negative per query; give 1 or more")
    if stages != ["in-batch"] and not data_args.negatives_file:
        check_mining_range(data_args.num_negatives, data_args.mine_range_min, data_args.mine_range_max)
    if "in-batch" in stages and training_args.per_device_train_batch_size < 2 and training_args.world_size == 1:
        raise UserError("the in-batch stage with --per-device-train-batch-size 1 has no negative (its loss is "
                        "always 0): give a batch of 2 or more queries")
    return work_dir


def _work_dir(training_args: FinetuneTrainingArguments) -> Path:
    """--work-dir, by default OUTPUT_DIR.work beside the output folder."""
    output_dir = Path(training_args.output_dir)
    return Path(training_args.work_dir or output_dir.parent / f"{output_dir.name}.work")


def _finished_run(model_args: FinetuneModelArguments, data_args: FinetuneDataArguments,
                  loss_args: FinetuneLossArguments, training_args: FinetuneTrainingArguments,
                  stages: list[str]) -> FinetuneResult | None:
    """The result of this very run when `--resume-from-checkpoint last` finds it finished: its work folder records
    every stage under the same settings and its output folder holds the model those stages wrote. None otherwise
    (the output folder is then refused as any other, `check_destination`)."""
    if training_args.resume_from_checkpoint not in RESUME_LAST:
        return None
    state = read_json_or_empty(_work_dir(training_args) / STATE_FILE)
    settings = _run_settings(model_args, data_args, loss_args, training_args)
    if state.get("settings_key") != _settings_key(settings):
        return None
    output_dir = Path(training_args.output_dir)
    info = read_json_or_empty(output_dir / FINETUNE_RUN_INFO_FILE)
    done = [record.get("stage") for record in state.get("stages") or []]
    if done != stages or [record.get("stage") for record in info.get("stages") or []] != stages:
        return None
    return FinetuneResult(output_dir, info, already_finished=True)


def _check_work_dir(work_dir: Path) -> None:
    """Refuse a work folder that is a file or holds what no fine-tuning run made: a run writes and clears its
    stage folders and negatives there. A run's own folder holds `STATE_FILE` (written when it starts); before that,
    only the export of a pre-training checkpoint and temporary siblings."""
    if work_dir.exists() and not work_dir.is_dir():
        raise UserError(f"--work-dir {work_dir} is a file; choose a folder")
    ours = {"pretrained-encoder"}
    if (work_dir / STATE_FILE).is_file():
        ours |= {STATE_FILE, NEGATIVES_FILE, "eval", *(f"stage-{stage}" for stage in STAGES)}
    foreign = sorted(p.name for p in work_dir.iterdir() if p.name not in ours and not p.name.startswith(".")) \
        if work_dir.is_dir() else []
    if foreign:
        raise UserError(f"work folder {work_dir} holds files no `retromae finetune` run made ({', '.join(foreign[:3])}"
                        f"{', ...' if len(foreign) > 3 else ''}), which the run could replace or delete; choose a "
                        "new or empty folder with --work-dir")


def run_finetune(
    model_args: FinetuneModelArguments,
    data_args: FinetuneDataArguments,
    loss_args: FinetuneLossArguments,
    training_args: FinetuneTrainingArguments,
) -> FinetuneResult:
    """Run the stages and write the fine-tuned sentence-transformers folder (see the module docstring)."""
    stages = _parse_stages(data_args.stages, data_args.teacher_scores)
    if loss_args.mini_batch_size is not None and "distill" in stages:
        raise UserError("--mini-batch-size applies to the in-batch and hard-negatives stages, not distill: run "
                        "the distill stage in a fine-tuning of its own without it")
    if model_args.base_model_name is not None and not is_hub_id(model_args.base_model_name):
        raise UserError(f"--base-model-name {model_args.base_model_name!r} is not a Hub id (owner/name); the card "
                        "names no local paths: omit the flag to record the starting model as local")
    finished = _finished_run(model_args, data_args, loss_args, training_args, stages)
    if finished is not None:  # as `pretrain` resumed after its end: nothing to train, nothing to replace
        return finished
    work_dir = _check_run_inputs(model_args, data_args, training_args, stages)
    new_work_dir = not work_dir.exists()
    # one run per work folder: a second would train into the first one's checkpoints
    with folder_lock(work_dir, enabled=training_args.process_index == 0):
        try:
            return _run_stages(model_args, data_args, loss_args, training_args, stages, work_dir)
        except UserError:
            if new_work_dir and not (work_dir / STATE_FILE).is_file():  # refused before training: no folder left
                shutil.rmtree(work_dir, ignore_errors=True)
            raise


def _run_stages(model_args: FinetuneModelArguments, data_args: FinetuneDataArguments,
                loss_args: FinetuneLossArguments, training_args: FinetuneTrainingArguments, stages: list[str],
                work_dir: Path) -> FinetuneResult:
    """`run_finetune` once its inputs are checked and its work folder is locked."""
    output_dir = Path(training_args.output_dir)
    teacher_scores = read_teacher_scores(data_args.teacher_scores) if "distill" in stages else None
    set_seed(training_args.seed)

    groups, beir = load_training_groups(data_args.train_data, split=data_args.split, on_missing=data_args.on_missing)
    groups, dropped = clean_groups(groups)
    checked = _read_negatives_before_training(stages, groups, beir, teacher_scores, data_args, training_args.seed)
    # a pre-training checkpoint is exported into the work folder first
    model, model_info = load_as_sentence_transformer(
        model_args.model, pooling=model_args.pooling, max_seq_length=model_args.max_seq_length, work_dir=work_dir
    )
    work_dir.mkdir(parents=True, exist_ok=True)
    state, resume = _read_state(work_dir, _run_settings(model_args, data_args, loss_args, training_args),
                                training_args.resume_from_checkpoint in RESUME_LAST, training_args.process_index == 0)
    model = _model_after_finished_stages(model, stages, state, work_dir)
    # all_gather only where there is more than one process (else sentence-transformers warns on every step)
    gather = loss_args.gather_across_devices and training_args.world_size > 1
    negatives_source = None
    for stage in stages[len(state["stages"]):]:
        if stage != "in-batch" and negatives_source is None:  # the first stage that needs negatives gets them
            groups, more_dropped, negatives_source = _attach_negatives(model, groups, state, data_args,
                                                                       training_args, beir, work_dir, checked)
            for key, value in more_dropped.items():
                dropped[key] = dropped.get(key, 0) + value
        dataset, report, loss, description = _stage_data_and_loss(stage, model, groups, teacher_scores, data_args,
                                                                  loss_args, training_args.seed, gather,
                                                                  checked.datasets.get(stage))
        logger.info("stage %s: %d examples, columns %s", stage, len(dataset), dataset.column_names)
        args = _stage_args(training_args, work_dir, stage, dataset.column_names, hybrid_method_of(model) is not None)
        record = {"stage": stage, "loss": description, "examples": len(dataset),
                  "negatives_per_query": 0 if stage == "in-batch" else data_args.num_negatives,
                  "negatives": negatives_source if stage != "in-batch" else None,
                  "loss_config": _loss_config(loss), **report}
        record.update(_train_stage(model, args, dataset, loss, stage, resume))
        _finish_stage(state, work_dir, model, record, training_args.process_index == 0)

    info = _run_info(model, model_info, model_args, data_args, loss_args, training_args, beir, groups, dropped,
                     state["stages"], output_dir)
    if training_args.process_index == 0:
        save_finetuned_model(model, output_dir, info, overwrite=training_args.overwrite)
        if data_args.eval_data:
            try:
                evaluate_folder(output_dir, beir_folders=[data_args.eval_data], split=data_args.eval_split,
                                output_dir=work_dir / "eval", update_card=True, on_missing=data_args.on_missing,
                                overwrite=True)  # the run's own folder
            except UserError as error:
                raise UserError(f"{error}; the fine-tuned model is written to {output_dir}: evaluate it with "
                                "`retromae evaluate` once that is fixed") from None
            info = read_json_or_empty(output_dir / FINETUNE_RUN_INFO_FILE)
    return FinetuneResult(output_dir, info)

ARGUMENT_CLASSES = (FinetuneModelArguments, FinetuneDataArguments, FinetuneLossArguments, FinetuneTrainingArguments)


def finetune(
    model: str | os.PathLike,
    train_data: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    stages: str | Sequence[str] = ("in-batch", "hard-negatives"),
    overwrite: bool = False,
    **options: Any,
) -> FinetuneResult:
    """Fine-tune a bi-encoder for retrieval and write it as a sentence-transformers folder (`retromae finetune`).

    Args:
        model: the starting point: a `retromae pretrain` checkpoint, a `retromae export` folder, any
            sentence-transformers folder, a plain BERT folder or a Hub id.
        train_data: a BEIR folder, a .jsonl file of {query, positive, negatives}, a datasets folder or a Hub dataset.
        output_dir: the folder to write (built in a temporary sibling, renamed into place when complete).
        stages: the stages in order, from `STAGES` ("distill" needs `teacher_scores=`).
        overwrite: replace an existing `output_dir`.
        **options: any other setting of `retromae finetune` by its field name, e.g. `max_steps=100`,
            `per_device_train_batch_size=32`, `learning_rate=2e-5`, `eval_data="beir/scifact"`, `teacher_scores=...`,
            `num_negatives=7`, `pooling="cls"`, `model_name="my-org/model"` (see `retromae finetune --help`).

    Returns:
        The output folder and the run record (`FinetuneResult`).

    Raises:
        UserError: an unknown option; any `UserError` of the data or the model.
    """
    options.update(rename_legacy_keys("retromae.finetune", options, FinetuneLossArguments.renamed))
    values: dict[str, Any] = {
        **options, "model": os.fspath(model), "train_data": os.fspath(train_data), "output_dir": os.fspath(output_dir),
        "overwrite": overwrite, "stages": stages if isinstance(stages, str) else ",".join(stages),
    }
    arguments = []
    for argument_class in ARGUMENT_CLASSES:
        names = {f.name for f in dataclasses.fields(argument_class) if f.init}
        arguments.append(argument_class(**{name: values.pop(name) for name in list(values) if name in names}))
    if values:
        raise UserError(f"unknown fine-tuning option(s) {', '.join(sorted(values))}; see `retromae finetune --help`")
    check_training_arguments(arguments[-1])  # the command line's are checked as they are parsed
    return run_finetune(*arguments)


def _loss_config(loss: nn.Module) -> dict[str, Any]:
    config = loss.get_config_dict() if hasattr(loss, "get_config_dict") else {}
    return {k: (v if isinstance(v, int | float | str | bool | dict | type(None)) else str(v)) for k, v in config.items()}


def _run_info(model, model_info, model_args, data_args, loss_args, training_args, beir, groups, dropped,
              stage_records, output_dir: Path) -> dict[str, Any]:

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
    if loss_args.mini_batch_size is not None:
        hyper["mini_batch_size"] = loss_args.mini_batch_size
    if "distill" in [r["stage"] for r in stage_records]:
        hyper.update(distill_loss_weight=loss_args.distill_loss_weight, contrastive_loss_weight=loss_args.contrastive_loss_weight,
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
        "trust_remote_code": bool(model_info.get("trust_remote_code") or hybrid_method_of(model) is not None),
        "train_data": {"name": train_name, "split": data_args.split, "queries": len(groups),
                       "format": "beir" if beir is not None else "pairs", "dropped": dropped},
        "stages": stage_records,
        "hyperparameters": hyper,
        "eval_results": [],
        "retromae_version": package_version(),
        "library_versions": library_versions(),
    }


def _save_model(model: SentenceTransformer, folder: Path) -> None:
    """The sentence-transformers files of `model` (a hybrid model with its module's remote code), without a card."""
    hybrid = hybrid_method_of(model)
    if hybrid is not None:
        hybrid.pooling_module.save(model, folder, create_model_card=False)
    else:
        model.save(str(folder), create_model_card=False)
        save_without_pooler(model, folder)


def save_finetuned_model(model: SentenceTransformer, output_dir: str | os.PathLike, info: dict[str, Any],
                         overwrite: bool = False) -> Path:
    """Write `model` + its card + the run record to `output_dir`, atomically (temporary sibling, then rename)."""
    output_dir = Path(output_dir)
    with atomic_folder(output_dir, overwrite=overwrite) as build_dir:
        _save_model(model, build_dir)
        write_finetuned_card(build_dir, info, METHODS)
    logger.info("fine-tuned model written to %s", output_dir)
    return output_dir


# ---- CLI -----------------------------------------------------------------------------------------------------------


def finetune_command(argv: list[str]) -> int:
    """`retromae finetune MODEL TRAIN_DATA [options]`."""
    model_args, data_args, loss_args, training_args = start_command(
        argv, (FinetuneModelArguments, FinetuneDataArguments, FinetuneLossArguments, FinetuneTrainingArguments), prog="retromae finetune",
        description="Fine-tune an encoder for retrieval (in-batch negatives -> mined hard negatives -> distillation) "
        "with sentence-transformers. Usage: retromae finetune MODEL TRAIN_DATA --output-dir OUT", positional=["model", "train_data"],
        renamed=FinetuneLossArguments.renamed,
    )
    if data_args.on_missing not in ON_MISSING:  # Literal choices are enforced by argparse; config files too
        raise UserError(f"--on-missing must be one of {ON_MISSING}")
    try:
        result = run_finetune(model_args, data_args, loss_args, training_args)
    except RetrievalDataError as error:
        raise UserError(str(error)) from None
    if training_args.process_index == 0 and result.already_finished:
        stages = ", ".join(stage["stage"] for stage in result.info["stages"])
        print(f"retromae: this fine-tuning had already finished (stages: {stages}); its model is {result.output_dir}; "
              "nothing was trained", flush=True)
    elif training_args.process_index == 0:
        lines = [f"retromae: fine-tuned model written to {result.output_dir}"]
        for stage in result.info["stages"]:
            resumed = stage.get("train_loss_from_step")
            lines.append(f"  {stage['stage']}: {stage['examples']} examples, {stage['steps']} steps, "
                         f"training loss {stage['train_loss']:.4f}"
                         + (f" (steps {resumed}-{stage['steps']}, after resuming)" if resumed else ""))
        for row in result.info.get("eval_results") or []:
            lines.append(f"  {row['dataset_name']} ({row['split']}): NDCG@10 {row['ndcg_at_10']:.4f}")
        print("\n".join(lines), flush=True)
    return 0


# read_beir is re-exported for users who build RetrievalData themselves
__all__ += ["read_beir"]
