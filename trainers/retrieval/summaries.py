"""The summary files of `retromae evaluate` (`summary.json`, `summary.md` in its `--output-dir`): one row per task,
split and subset with NDCG@10, MRR@10, Recall@100 and Recall@1000. A folder holds one model's results
(`results_holding`); a later evaluation of that model on other tasks adds its rows to the earlier ones
(`write_summary`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..export.cards import CARD_METRICS
from ..inputs.folders import model_location
from ..inputs.io import read_json_or_empty, write_json_atomic, write_text_atomic
from ..inputs.outputs import Holding

SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"


def summary_markdown(rows: list[dict[str, Any]], model_name: str) -> str:
    header = "| Task | Split | Queries | " + " | ".join(label for _, label in CARD_METRICS) + " |"
    lines = [f"# Retrieval results: {model_name}", "", header, "|---|---|---|" + "---|" * len(CARD_METRICS)]
    for row in rows:
        values = " | ".join("-" if row.get(k) is None else f"{row[k]:.5f}" for k, _ in CARD_METRICS)
        lines.append(f"| {row.get('dataset_name', row.get('task'))} | {row['split']} | {row.get('queries') or '-'} | {values} |")
    lines += ["", "NDCG@10 is the main score. Computed by mteb (`retromae evaluate`)."]
    return "\n".join(lines) + "\n"


def write_summary(rows: list[dict[str, Any]], output_dir: Path, model_name: str, search: str, model: str) -> None:
    """Write summary.{json,md} of `model` (its `model_location`): the rows of earlier runs of the same model into
    this folder on other tasks, then `rows`; a row replaces the earlier one of its task, split and subset (as mteb
    replaces that task's result file). Another model's summary (replaced with `--overwrite`) is not kept. Each JSON
    row names its search."""
    earlier = read_json_or_empty(output_dir / SUMMARY_JSON)
    new = {_row_key(row) for row in rows}
    kept = [{"search": earlier.get("search"), **row} for row in earlier.get("results") or []
            if earlier.get("model_path") == model and isinstance(row, dict) and _row_key(row) not in new]
    rows = kept + [{**row, "search": search} for row in rows]
    write_json_atomic(output_dir / SUMMARY_JSON,
                      {"model": model_name, "model_path": model, "search": search, "results": rows})
    write_text_atomic(output_dir / SUMMARY_MD, summary_markdown(rows, model_name))


def _row_key(row: dict[str, Any]) -> tuple:
    return row.get("task"), row.get("split"), row.get("subset")


def results_holding(model: str | os.PathLike) -> Callable[[Path], Holding]:
    """`claim_output`'s owner of an evaluation folder: a summary of another model is not ours (every `retromae
    pretrain` export is named `encoder`, so default folders of two runs coincide); other files are left alone."""

    def holding(output_dir: Path) -> Holding:
        summary = output_dir / SUMMARY_JSON
        recorded = read_json_or_empty(summary).get("model_path") if summary.is_file() else model_location(model)
        if recorded == model_location(model):
            return None
        return f"{f'the results of {recorded}' if recorded else 'results of another model'} ({SUMMARY_JSON})", False

    return holding


__all__ = ["SUMMARY_JSON", "SUMMARY_MD", "results_holding", "summary_markdown", "write_summary"]
