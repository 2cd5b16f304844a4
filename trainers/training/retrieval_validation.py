"""Retrieval validation during pre-training: zero-shot NDCG@10, MRR@10 and Recall@100 of the model's own sentence
representation on a BEIR folder, logged beside the loss terms every `eval_steps`.

`RetrievalValidationCallback` is a `TrainerCallback` for a `RetroMAETrainer` (`retromae pretrain --eval-beir-folder`
adds it). At the end of every `eval_steps`-th optimizer step (and the last one) it encodes the first `max_queries`
queries (by sorted id), then the corpus once, batch by batch, with the model in eval mode; each document batch is
scored against the queries at once (exact dot-product search in torch, a running top 100: memory does not grow with
the corpus). It scores the ranking and asks the Trainer to log that step: `RetroMAETrainer.log` merges what
`pop_logs()` returns into the step's log entry, so the metrics (`eval_ndcg@10`, `eval_mrr@10`, `eval_recall@100`,
with `eval_coverage@k` when asked) reach the progress bar, `trainer_state.json`'s `log_history` and every
`report_to` integration like the loss terms do. Why not `on_log`: the Trainer appends a copy of the logs to
`log_history`, and calls the integrations, before later callbacks see them.

With `--eval-strategy steps` (or `epoch`) the Trainer's own evaluations run it instead (`RetroMAETrainer.evaluate`
returns the `eval_*` metrics and logs them as an entry of their own, as the Trainer does), so
`--metric-for-best-model ndcg@10 --load-best-model-at-end` selects the best checkpoint as for any Trainer.

The representation is what the sentence-transformers export encodes (`sentence_vectors`, computed by the method's
`Method.sentence_vectors` from the states of the encoder, `model.base_model`: `bert`, `roberta` or `model`): the
last-layer [CLS] state, unit-normalised for a model trained with cosine similarity (SentMAE's default); for DupMAE
its hybrid [W h ; sparse mu] (with the config's fixed projection W, as before fine-tuning), and its [CLS] part as
`eval_cls_*` (the method's `metric_prefixes`).

The evaluation leaves the training untouched: it runs under `torch.no_grad` with every module in eval mode (no
dropout), restores each module's own train/eval mode afterwards, draws nothing from the masking generators and
restores torch's global RNG states (CPU and CUDA) in case anything drew. Only the main process evaluates (the other
processes wait at the next step's gradient sync; not for FSDP / ZeRO-3, whose sharded forward needs every process);
every process logs the step, so the Trainer's logging collectives stay in step. An evaluation that fails is logged
as a warning and the training goes on.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import TrainerCallback

from ..inputs.extras import plotting_available
from ..methods import sentence_vectors_of
from ..retrieval.beir import RetrievalDataError, drop_blank_queries, read_beir
from ..retrieval.coverage import DEFAULT_KS, input_token_coverage
from ..retrieval.metrics import METRICS, RunningTopK, retrieval_metrics

logger = logging.getLogger(__name__)
PREFIX = "eval_"  # as the Trainer names evaluation metrics (`metric_for_best_model` adds it)
COVERAGE_TEXTS = 1000  # documents (first by sorted id) the coverage diagnostic is measured on


@dataclass(frozen=True)
class ValidationSet:
    """A BEIR split ready to score: documents and queries in sorted-id order, relevance by document index.

    Args:
        name: the folder's name and split, for messages.
        doc_ids, doc_texts: the corpus (`retrieval.beir.doc_text`: title + text).
        query_ids, query_texts: the queries kept (the first `max_queries` by sorted id that have a relevant document).
        qrels: per query, document index -> relevance (> 0).
    """

    name: str
    doc_ids: list[str]
    doc_texts: list[str]
    query_ids: list[str]
    query_texts: list[str]
    qrels: list[dict[int, int]]


def load_validation_set(folder: str | os.PathLike, split: str = "dev", max_queries: int = 1000) -> ValidationSet:
    """Read `folder` (corpus.jsonl, queries.jsonl, qrels/<split>.tsv) for validation.

    Raises:
        ValueError: one line naming `--eval-beir-folder`, the missing or malformed file and the fix; or
            `max_queries` < 1. Qrels naming unknown ids are dropped with a warning.
    """
    if max_queries < 1:
        raise ValueError(f"--eval-max-queries {max_queries}: give a positive number of queries (e.g. 1000)")
    try:
        data = drop_blank_queries(read_beir(folder, split=split, on_missing="skip"))  # as `evaluate` scores
    except RetrievalDataError as error:
        raise ValueError(f"--eval-beir-folder {folder} (--eval-split {split}): {error}") from None
    doc_ids = sorted(data.corpus)
    index = {doc_id: i for i, doc_id in enumerate(doc_ids)}
    query_ids = sorted(data.queries)[:max_queries]
    return ValidationSet(
        name=f"{data.name} ({split})", doc_ids=doc_ids, doc_texts=[data.doc_text(d) for d in doc_ids],
        query_ids=query_ids, query_texts=[data.queries[q] for q in query_ids],
        qrels=[{index[d]: rel for d, rel in data.qrels[q].items()} for q in query_ids],
    )


def _encoder(model: nn.Module) -> nn.Module:
    """The encoder of a `*ForPretraining` model (`base_model`: `bert`, `roberta` or `model`), or the model itself."""
    return getattr(model, "base_model", model)


def sentence_vectors(model: nn.Module, batch: dict[str, torch.Tensor], task: str) -> dict[str, torch.Tensor]:
    """The model's representations of a tokenized batch, float32 `(batch_size, dim)` by metric-name prefix, as its
    method computes them (`Method.sentence_vectors`): "" its own (what the export encodes: [CLS], unit-normalised
    for a model trained with cosine similarity; DupMAE's hybrid), "cls_" DupMAE's [CLS] part. `task`: "query" or
    "document" (DupMAE's top-k differ)."""
    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
    hidden = _encoder(model)(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, L, H)
    return sentence_vectors_of(model.config.model_type)(model, hidden, batch, task)


def _batches(model: nn.Module, tokenizer, texts: Sequence[str], max_seq_length: int, batch_size: int,
             desc: str | None = None) -> Iterator[tuple[int, dict[str, torch.Tensor]]]:
    """(index of the batch's first text, its tokenized batch on the model's device); a progress bar named `desc`."""
    device = next(model.parameters()).device
    for start in tqdm(range(0, len(texts), batch_size), desc=desc, unit="batch", disable=desc is None, leave=False):
        batch = tokenizer(list(texts[start : start + batch_size]), truncation=True, max_length=max_seq_length,
                          padding=True, return_tensors="pt")
        yield start, {key: batch[key].to(device) for key in ("input_ids", "attention_mask")}


@contextmanager
def evaluation_mode(model: nn.Module) -> Iterator[None]:
    """Every module in eval mode under `torch.no_grad`; afterwards each module's own mode and torch's global RNG
    states (CPU, every CUDA device) are restored, so the training continues as if nothing had run."""
    modes = [(module, module.training) for module in model.modules()]
    cpu_state = torch.random.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for module, training in modes:
            module.training = training
        torch.random.set_rng_state(cpu_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)


def evaluate_retrieval(model: nn.Module, tokenizer, data: ValidationSet, max_seq_length: int, batch_size: int = 32,
                       coverage: bool = False, show_progress_bar: bool = False) -> dict[str, float]:
    """Score `model` zero-shot on `data`: `{"ndcg@10", "mrr@10", "recall@100"}` of its own representation (DupMAE:
    also `cls_` + each for its [CLS] part; + `coverage@k` for `retrieval.metrics.DEFAULT_KS` on the first
    `COVERAGE_TEXTS` documents when `coverage`). The queries are encoded first, then the corpus once, batch by
    batch, each batch scored at once: memory is bounded by the queries' vectors, whatever the corpus size."""
    with evaluation_mode(model):
        batches = _batches(model, tokenizer, data.query_texts, max_seq_length, batch_size)
        parts = [sentence_vectors(model, batch, "query") for _, batch in batches]
        queries = {name: torch.cat([part[name] for part in parts]) for name in parts[0]}  # name -> (Q, dim)
        tops = {name: RunningTopK(len(data.query_ids), device=vectors.device) for name, vectors in queries.items()}
        desc = f"validation: encoding {data.name}" if show_progress_bar else None
        for start, batch in _batches(model, tokenizer, data.doc_texts, max_seq_length, batch_size, desc):
            for name, vectors in sentence_vectors(model, batch, "document").items():
                tops[name].add(queries[name] @ vectors.T, start)
        metrics = {prefix + metric: value for prefix, top in tops.items()
                   for metric, value in retrieval_metrics(top.ranking(), data.qrels).items()}
        if coverage:
            values = input_token_coverage(model, tokenizer, data.doc_texts[:COVERAGE_TEXTS], ks=DEFAULT_KS,
                                          batch_size=batch_size, max_seq_length=max_seq_length)
            metrics.update({f"coverage@{k}": value for k, value in values.items()})
    return metrics


class RetrievalValidationCallback(TrainerCallback):
    """Score the model on a BEIR split every `eval_steps` optimizer steps and at the last step; see the module doc.

    Add it to a `RetroMAETrainer` (`trainer.add_callback(...)` or `callbacks=[...]`): its `log` merges `pop_logs()`
    into the step's log entry. The folder is read here, so a bad one is refused before training.

    Args:
        folder: a BEIR folder (corpus.jsonl, queries.jsonl, qrels/<split>.tsv).
        split: the qrels split.
        max_queries: score the first N queries by sorted id (the same ones at every evaluation).
        max_seq_length: truncation length of queries and documents (the run's training length).
        eval_steps: evaluate every N optimizer steps; None: the Trainer's `eval_steps` (a ratio < 1 is of the run),
            else its `logging_steps`.
        batch_size: texts per forward pass; None: `args.per_device_eval_batch_size`.
        coverage: also log the input-token coverage diagnostic (`retrieval/coverage.py`) as `eval_coverage@k`.
        tokenizer: None: the Trainer's `processing_class`.

    Raises:
        ValueError: a folder without the split, qrels, corpus or queries, or a malformed file (one line).
    """

    def __init__(self, folder: str | os.PathLike, split: str = "dev", max_queries: int = 1000,
                 max_seq_length: int = 256, eval_steps: int | None = None, batch_size: int | None = None,
                 coverage: bool = False, tokenizer=None):
        if eval_steps is not None and eval_steps < 1:
            raise ValueError(f"--eval-steps {eval_steps}: give a positive number of optimizer steps")
        self.data = load_validation_set(folder, split, max_queries)
        self.max_seq_length, self.eval_steps, self.batch_size = max_seq_length, eval_steps, batch_size
        self.coverage, self.tokenizer = coverage, tokenizer
        self._pending: dict[str, float] = {}

    def _every(self, args, state) -> int:
        """`eval_steps`, else the Trainer's (`state` holds it with a ratio resolved), else its `logging_steps`."""
        return int(self.eval_steps or (state.eval_steps if args.eval_steps else state.logging_steps) or 1)

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        if args.eval_strategy != "no":  # the Trainer's own evaluations run it (`RetroMAETrainer.evaluate`)
            return control
        last = state.global_step >= state.max_steps > 0
        if state.global_step % self._every(args, state) and not last:
            return control
        control.should_log = True  # on every process: the Trainer's logging gathers across processes
        self._pending = self.evaluate_model(args, state, model, processing_class)
        return control

    def evaluate_model(self, args, state, model: nn.Module, processing_class=None) -> dict[str, float]:
        """The metrics (`eval_` + name -> value) of `model` now, on the main process; empty on the others and when
        the evaluation failed (warned)."""
        if not state.is_world_process_zero:
            return {}
        return self._evaluate(args, state, model, self.tokenizer or processing_class)

    def _evaluate(self, args, state, model: nn.Module, tokenizer) -> dict[str, float]:
        try:
            metrics = evaluate_retrieval(
                model, tokenizer, self.data, self.max_seq_length, self.batch_size or args.per_device_eval_batch_size,
                coverage=self.coverage, show_progress_bar=not args.disable_tqdm,
            )
        except Exception as error:  # a failed evaluation must not end the run
            logger.warning("retrieval validation on %s failed at step %d (%s: %s); training continues",
                           self.data.name, state.global_step, type(error).__name__, error)
            return {}
        return {PREFIX + name: round(value, 4) for name, value in metrics.items()}

    def pop_logs(self) -> dict[str, float]:
        """The metrics of the last evaluation not logged yet (`eval_` + name -> value); empty when none."""
        pending, self._pending = self._pending, {}
        return pending


def validation_summary(log_history: Sequence[dict[str, Any]]) -> str | None:
    """The summary line of the last evaluation logged in `log_history`, or None when there is none."""
    last = next((entry for entry in reversed(log_history) if PREFIX + METRICS[0] in entry), None)
    if last is None:
        return None
    values = ", ".join(f"{key.removeprefix(PREFIX)} {value:.4f}" for key, value in last.items()
                       if key.startswith(PREFIX) and "@" in key)
    return f"  retrieval validation (step {last['step']}): {values}"


def plot_validation(log_history: Sequence[dict[str, Any]], path: str | os.PathLike) -> Path | None:
    """Each logged validation metric, loss term and accuracy against the step, one panel each, saved to `path`
    (PNG); None (nothing written) without matplotlib (the `plots` extra; a log line says so) or when no evaluation
    was logged."""
    if not plotting_available(Path(path).name):
        return None
    keys = {key for entry in log_history for key in entry}
    metrics = sorted(key for key in keys if key.startswith(PREFIX) and "@" in key)
    if not metrics:
        return None
    # the training logs' terms; `train_loss` is the run's mean, logged once at the end
    losses = sorted(key for key in keys if key == "loss" or (key.endswith("_loss") and key != "train_loss"))
    names = [*metrics, *losses, *sorted(key for key in keys if key.endswith("_accuracy"))]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(3, len(names))
    rows = math.ceil(len(names) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4 * columns, 3 * rows), squeeze=False)
    for axis, name in zip(axes.flat, names, strict=False):
        points = [(entry["step"], entry[name]) for entry in log_history if name in entry and "step" in entry]
        axis.plot(*zip(*points, strict=True), marker="o" if len(points) < 30 else None)
        axis.set_title(name.removeprefix(PREFIX))
        axis.set_xlabel("step")
    for axis in list(axes.flat)[len(names):]:
        axis.axis("off")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return Path(path)


__all__ = [
    "RetrievalValidationCallback", "ValidationSet", "evaluate_retrieval", "load_validation_set", "plot_validation",
    "sentence_vectors", "validation_summary"
]
