"""Hard-negative mining: rank each query's corpus pool with the model, keep a range."""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Mapping
from dataclasses import dataclass

from sentence_transformers import SentenceTransformer
from sentence_transformers.util import (
    cos_sim,
)

from ..data.training_groups import (
    TrainingGroup,
    write_training_jsonl,
)
from ..inputs.finetune_options import check_mining_range
from ..training.finetune_losses import similarity_functions
from .metrics import RunningTopK

logger = logging.getLogger(__name__)

MINING_CHUNK_BYTES = 2**29  # mining: the float32 embeddings of one chunk of documents, and its score matrix


@dataclass(frozen=True)
class MinedNegatives:
    """What `mine_negatives` returns: the groups with their negatives and the ranks they were drawn from;
    `range_max` is the one used, lowered to the pool's size when the pool is smaller than asked."""

    groups: list[TrainingGroup]
    range_min: int
    range_max: int
    sampling: str

    @property
    def ranks(self) -> str:
        """The ranks for a log line or a run record: `ranks 10-55, random`."""
        return f"ranks {self.range_min}-{self.range_max}, {self.sampling}"


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
) -> MinedNegatives:
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
        The groups with `negatives` set, and the ranks used; queries for which fewer than `num_negatives`
        candidates remained are returned without negatives (and counted in the log).
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
    mined = MinedNegatives(result, range_min, range_max, sampling)
    without = sum(1 for g in result if not g.negatives)
    logger.info(
        "mined %d negatives for %d of %d queries (%s)%s", num_negatives, len(groups) - without, len(groups),
        mined.ranks, f"; {without} queries had too few candidates" if without else "",
    )
    if output_file is not None:
        write_training_jsonl(result, output_file)
        logger.info("hard negatives saved to %s (reuse with --negatives-file)", output_file)
    return mined


def _rank_documents(model: SentenceTransformer, groups: list[TrainingGroup], texts: list[str], depth: int,
                    batch_size: int) -> list[list[int]]:
    """Per group, the indices of its query's `depth` best `texts` by the model's similarity, best first. Queries and
    documents are encoded as the model encodes them for retrieval (`encode_query` / `encode_document`); documents
    are encoded and scored a chunk at a time, so memory holds one chunk's embeddings and scores, whatever the corpus."""
    if not groups:
        return []
    normalize = similarity_functions(model)[0] is cos_sim
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


__all__ = ["MinedNegatives", "mine_negatives"]
