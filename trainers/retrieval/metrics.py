"""Ranking metrics (NDCG@10, MRR@10, Recall@100, as pytrec_eval computes them) and an exact running top-k."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

METRICS = ("ndcg@10", "mrr@10", "recall@100")
SEARCH_DEPTH = 100  # the deepest cut-off of METRICS


class RunningTopK:
    """The `depth` best documents of each query over score chunks seen one after the other (exact search with the
    score matrix bounded to `(n_queries, depth + chunk)`). Equal scores rank the highest document index first: as
    pytrec_eval and mteb break ties (by document id, descending), since `ValidationSet` indexes its documents in
    sorted-id order; a tie across a cut-off (rank 100) then keeps the documents `retromae evaluate` keeps."""

    def __init__(self, n_queries: int, depth: int = SEARCH_DEPTH, device: torch.device | str = "cpu"):
        self.depth = depth
        self.scores = torch.empty((n_queries, 0), device=device)
        self.ids = torch.empty((n_queries, 0), dtype=torch.long, device=device)

    def add(self, scores: torch.Tensor, first_id: int) -> None:
        """`scores`: `(n_queries, chunk)` of documents `first_id ..`."""
        ids = torch.arange(first_id, first_id + scores.shape[1], device=scores.device).expand(scores.shape[0], -1)
        merged, merged_ids = torch.cat([self.scores, scores.float()], dim=1), torch.cat([self.ids, ids], dim=1)
        # highest index first, then a stable sort by score: ties keep that order (topk's order of ties is arbitrary)
        by_id = merged_ids.argsort(dim=1, descending=True)  # (n_queries, kept + chunk)
        merged, merged_ids = merged.gather(1, by_id), merged_ids.gather(1, by_id)
        top = merged.argsort(dim=1, descending=True, stable=True)[:, : self.depth]  # (n_queries, <= depth)
        self.scores, self.ids = merged.gather(1, top), merged_ids.gather(1, top)

    def ranking(self) -> list[list[int]]:
        """Per query, the document indices best first."""
        return self.ids.tolist()


def retrieval_metrics(ranked: Sequence[Sequence[int]], qrels: Sequence[dict[int, int]]) -> dict[str, float]:
    """Mean NDCG@10, MRR@10 and Recall@100 over the queries (as pytrec_eval / mteb define them: linear gain
    rel / log2(rank + 1), reciprocal rank of the first relevant document in the top 10, share of the relevant
    documents in the top 100).

    Args:
        ranked: per query, document indices best first (at least the top 100 when there are that many), ties
            ordered as pytrec_eval orders them (`RunningTopK.ranking`).
        qrels: per query, document index -> relevance; only relevances > 0 count.

    Returns:
        `{"ndcg@10": ..., "mrr@10": ..., "recall@100": ...}`, each in [0, 1]; 0.0 each for no query.
    """
    totals = dict.fromkeys(METRICS, 0.0)
    for ranking, judged in zip(ranked, qrels, strict=True):
        relevant = {doc: rel for doc, rel in judged.items() if rel > 0}
        if not relevant:
            continue
        ideal = sorted(relevant.values(), reverse=True)[:10]
        dcg = sum(relevant.get(doc, 0) / math.log2(rank + 2) for rank, doc in enumerate(ranking[:10]))
        totals["ndcg@10"] += dcg / sum(rel / math.log2(rank + 2) for rank, rel in enumerate(ideal))
        first = next((rank for rank, doc in enumerate(ranking[:10]) if doc in relevant), None)
        totals["mrr@10"] += 0.0 if first is None else 1.0 / (first + 1)
        totals["recall@100"] += len(relevant.keys() & set(ranking[:100])) / len(relevant)
    return {name: total / max(len(ranked), 1) for name, total in totals.items()}


def metric_names(coverage: bool = False, prefixes: Sequence[str] = ("",)) -> list[str]:
    """The names (without `eval_`) an evaluation logs: `--metric-for-best-model` takes one of them. `prefixes`: the
    method's `metric_prefixes` (DupMAE's `cls_` metrics score its [CLS] part)."""
    names = [prefix + name for prefix in prefixes for name in METRICS]
    return names + [f"coverage@{k}" for k in DEFAULT_KS] if coverage else names


DEFAULT_KS = (10, 20, 50, 100)
__all__ = ["METRICS", "RunningTopK", "metric_names", "retrieval_metrics"]
