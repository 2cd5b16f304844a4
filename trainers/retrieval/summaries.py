"""The summary files of `retromae evaluate` (`summary.json`, `summary.md` in its `--output-dir`): one row per task,
split and subset with NDCG@10, MRR@10, Recall@100 and Recall@1000. A folder holds the results of one model, its
weights and modules as they were (`results_holding`, `model_digest`); a later evaluation of the same model on other
tasks adds its rows to the earlier ones (`write_summary`)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..export.cards import CARD_METRICS
from ..inputs.folders import model_location
from ..inputs.io import file_sha256, read_json_or_empty, write_json_atomic, write_text_atomic
from ..inputs.outputs import Holding

SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"
WEIGHT_SUFFIXES = (".safetensors", ".bin")
# what mteb writes beside a model revision's result files (`ResultCache.save_to_cache`, `mteb.evaluate`)
MTEB_RECORDS = frozenset({"model_meta.json", "run_settings.jsonl"})
# what, besides the weights, decides a model's vectors: its modules, their settings (pooling, normalisation, a Dense
# layer) and prompts; not its card or run record, which `--update-card` rewrites
MODULE_FILES = frozenset({"modules.json", "config.json", "sentence_bert_config.json",
                          "config_sentence_transformers.json"})


def model_digest(model: str | os.PathLike, pooling: str | None = None) -> str | None:
    """sha256 over the weight files and module settings (`MODULE_FILES`) of a local model folder, by relative path
    (Trainer checkpoints, hidden folders and the collator's RNG states left out), and the `pooling` a plain folder is
    read with; None for a Hub id."""
    folder = Path(model).expanduser()
    if not folder.is_dir():
        return None
    digest = hashlib.sha256(f"pooling={pooling or ''}\n".encode())
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if ((path.suffix in WEIGHT_SUFFIXES or path.name in MODULE_FILES) and path.is_file()
                and not path.name.startswith("collator_rng")
                and not any(part.startswith((".", "checkpoint-")) for part in relative.parts[:-1])):
            digest.update(f"{relative.as_posix()}\0{file_sha256(path)}\n".encode())
    return digest.hexdigest()


def summary_markdown(rows: list[dict[str, Any]], model_name: str) -> str:
    header = "| Task | Split | Queries | " + " | ".join(label for _, label in CARD_METRICS) + " |"
    lines = [f"# Retrieval results: {model_name}", "", header, "|---|---|---|" + "---|" * len(CARD_METRICS)]
    for row in rows:
        values = " | ".join("-" if row.get(k) is None else f"{row[k]:.5f}" for k, _ in CARD_METRICS)
        lines.append(f"| {row.get('dataset_name', row.get('task'))} | {row['split']} | {row.get('queries') or '-'} | {values} |")
    lines += ["", "NDCG@10 is the main score. Computed by mteb (`retromae evaluate`)."]
    return "\n".join(lines) + "\n"


def write_summary(rows: list[dict[str, Any]], output_dir: Path, model_name: str, search: str, model: str,
                  digest: str | None) -> None:
    """Write summary.{json,md} of `model` (its `model_location`) with `digest` (its `model_digest`): the rows of
    earlier runs of the same model into this folder on other tasks, then `rows`; a row replaces the earlier one of
    its task, split and subset (as mteb replaces that task's result file), and a local task's row the earlier one of
    its BEIR folder (`beir_folder`), split and subset. Another model's summary, or one of another digest (replaced
    with `--overwrite`), is not kept, nor the mteb result files of the rows dropped. Each JSON row names its
    search."""
    earlier = read_json_or_empty(output_dir / SUMMARY_JSON)
    new = {key for row in rows for key in _row_keys(row)}
    kept = [{"search": earlier.get("search"), **row} for row in _kept_rows(earlier, model, digest)
            if not new.intersection(_row_keys(row))]
    rows = kept + [{**row, "search": search} for row in rows]
    write_json_atomic(output_dir / SUMMARY_JSON, {"model": model_name, "model_path": model, "model_digest": digest,
                                                  "search": search, "results": rows})
    write_text_atomic(output_dir / SUMMARY_MD, summary_markdown(rows, model_name))
    _remove_result_files(output_dir, earlier.get("results") or [], rows)


def drop_replaced_results(output_dir: Path, model_name: str, search: str, model: str, digest: str | None) -> None:
    """Before `model` (its `model_location`) with `digest` is evaluated into `output_dir`: the summary without the
    rows `write_summary` will not keep (another model's, other weights') and without their result files, so that an
    evaluation that fails midway leaves no row naming a file mteb has since rewritten for another model."""
    earlier = read_json_or_empty(output_dir / SUMMARY_JSON)
    if len(_kept_rows(earlier, model, digest)) < len(earlier.get("results") or []):
        write_summary([], output_dir, model_name, search, model, digest)


def _remove_result_files(output_dir: Path, earlier: list, rows: list[dict[str, Any]]) -> None:
    """Delete the mteb result JSON (`mteb_file`) of each earlier row the summary no longer holds (another model's, or a
    task scored again under another name), so that no file under mteb/ outlives its row; a revision folder left with
    only mteb's own records (`MTEB_RECORDS`) goes too, and its model folder when that is left empty."""
    results = (output_dir / "mteb").resolve()
    held = {_row_file(row) for row in rows}
    for name in {_row_file(row) for row in earlier} - held - {None}:
        path = (output_dir / name).resolve()
        if path.suffix != ".json" or not path.is_relative_to(results) or not path.is_file():
            continue
        path.unlink()
        revision = path.parent
        if {child.name for child in revision.iterdir()} <= MTEB_RECORDS:
            for record in MTEB_RECORDS:
                (revision / record).unlink(missing_ok=True)
            revision.rmdir()
            if not any(revision.parent.iterdir()):
                revision.parent.rmdir()


def _row_file(row: Any) -> str | None:
    """A summary row's `mteb_file`; None for a row without one (or a hand-edited one that holds no path)."""
    name = row.get("mteb_file") if isinstance(row, dict) else None
    return name if isinstance(name, str) else None


def _row_keys(row: dict[str, Any]) -> list[tuple]:
    """What a row scores: its task, and a local task's folder (a folder scored again under another task name when a
    folder of the same name joined it, `local_task_names`)."""
    keys = [("task", row.get("task"), row.get("split"), row.get("subset"))]
    if row.get("beir_folder"):
        keys.append(("folder", row["beir_folder"], row.get("split"), row.get("subset")))
    return keys


def _kept_rows(earlier: dict[str, Any], model: str, digest: str | None) -> list[dict[str, Any]]:
    """The rows of an earlier summary that a new evaluation of `model` with `digest` keeps: all when the summary is
    of the same model folder and digest (or recorded before the digest), else none."""
    same = earlier.get("model_path") == model and earlier.get("model_digest") in (digest, None)
    return [row for row in earlier.get("results") or [] if same and isinstance(row, dict)]


def summary_folders(output_dir: Path, model: str, digest: str | None) -> list[str]:
    """The BEIR folders (`beir_folder`) of the rows of `output_dir`'s summary that an evaluation of `model` (its
    `model_location`) with `digest` keeps (`write_summary`)."""
    rows = _kept_rows(read_json_or_empty(output_dir / SUMMARY_JSON), model, digest)
    return [row["beir_folder"] for row in rows if isinstance(row.get("beir_folder"), str)]


def results_holding(model: str | os.PathLike, digest: str | None) -> Callable[[Path], Holding]:
    """`claim_output`'s owner of an evaluation folder: a summary of another model is not ours (every `retromae
    pretrain` export is named `encoder`, so default folders of two runs coincide), nor one of the same folder when
    its weights or modules (`digest`, its `model_digest`) have changed since, nor a summary.md without summary.json;
    other files are left alone."""

    def holding(output_dir: Path) -> Holding:
        summary = output_dir / SUMMARY_JSON
        if not summary.is_file():
            return (f"a {SUMMARY_MD} that evaluate did not write", False) if (output_dir / SUMMARY_MD).exists() else None
        earlier = read_json_or_empty(summary)
        recorded = earlier.get("model_path")
        if recorded != model_location(model):
            return f"{f'the results of {recorded}' if recorded else 'results of another model'} ({SUMMARY_JSON})", False
        if earlier.get("model_digest") not in (digest, None):
            return (f"the results of {recorded} as it was before its weights or modules changed ({SUMMARY_JSON})",
                    False)
        return None

    return holding


__all__ = ["SUMMARY_JSON", "SUMMARY_MD", "drop_replaced_results", "model_digest", "results_holding", "summary_folders",
           "summary_markdown", "write_summary"]
