"""`retromae evaluate`: MTEB retrieval evaluation of a sentence-transformers folder, on local BEIR folders and on
MTEB's registered tasks.

The scoring is mteb's own (`mteb.evaluate`): a local BEIR folder becomes an `AbsTaskRetrieval` subclass whose
`load_data` fills mteb's `RetrievalSplitData` from our reader (`make_local_task`), so a number printed here is the
number mteb computes for the same model and data (tests/commands/test_evaluate.py pins that equality on SciFact dev with
all-MiniLM-L6-v2, and checks mteb's NDCG@10 against an independent computation). The model is scored with its own
pooling and similarity (modules.json; `similarity_fn_name`), queries through `encode_query` and documents through
`encode_document` (mteb 2.26 picks these for sentence-transformers >= 5).

Search: exact by default (mteb's brute-force search over the whole corpus, in chunks). ``--search faiss`` indexes
the corpus in mteb's `FaissSearchIndex` (flat inner-product index; cosine models are normalised) for large corpora of
dense models; it returns the same ranking up to float ties. The DupMAE hybrid model (dense + |V|-wide sparse part)
is searched exactly, with the corpus encoded in chunks sized to bound memory (~512 MiB per chunk); a |V|-wide faiss
index would be impractical (a flat index of |V|-wide vectors holds the whole corpus densely).

Outputs under ``--output-dir``::

    mteb/results/<model>/<revision>/<Task>.json   mteb's result JSON (mteb.ResultCache layout)
    summary.json, summary.md                      NDCG@10 (main), MRR@10, Recall@100, Recall@1000 per task and split;
                                                  summary.json names the model (a folder holding another model's
                                                  summary is refused without --overwrite); a later run of the same
                                                  model on other tasks adds its rows (`summaries.write_summary`); a
                                                  BEIR folder's row records its path (`beir_folder`)

``--update-card`` adds the results to the model folder's card (folders written by `retromae finetune`).
Registered tasks (``--tasks SciFact,NFCorpus``) and benchmarks (``--benchmark NanoBEIR``: `mteb.get_benchmark`,
only its retrieval tasks) download their data from the Hub; offline that fails with a clear error: evaluate a local
BEIR copy with ``--beir-folder`` (and ``--language`` when it is not English, `eng-Latn`) instead.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import logging
import os
import tempfile
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

import datasets
from datasets import Dataset
from sentence_transformers import SentenceTransformer

from ..export.cards import CARD_METRICS, FINETUNE_RUN_INFO_FILE, write_finetuned_card
from ..export.sentence_transformer import load_as_sentence_transformer
from ..inputs.folders import check_dataset_ids, check_model_folder, is_local_path, model_location
from ..inputs.io import read_json_or_empty
from ..inputs.outputs import check_folder_option, claim_output
from ..inputs.parameters import check_bool_options, check_path, list_parameter
from ..methods import METHODS, hybrid_method_of
from .beir import ON_MISSING, RetrievalData, RetrievalDataError, drop_blank_queries, read_beir
from .benchmarks import (
    DEFAULT_LANGUAGE,
    UnknownTaskError,
    benchmark_tasks,
    find_tasks,
    load_benchmark_data,
    load_registered,
    resolve_language,
)
from .summaries import (
    drop_replaced_results,
    model_digest,
    results_holding,
    summary_folders,
    summary_markdown,
    write_summary,
)

logger = logging.getLogger(__name__)
HYBRID_CHUNK_BYTES = 1 << 29  # corpus embeddings encoded and scored per chunk, for |V|-wide hybrid embeddings
METRIC_DECIMALS = 5  # the rows' metrics, as mteb rounds its NDCG and recall (not its MRR)


def make_local_task(data: RetrievalData, dataset_id: str | None = None, *, label: str | None = None,
                    task_name: str | None = None, language: str = DEFAULT_LANGUAGE,
                    folder: str | os.PathLike | None = None):
    """An mteb retrieval task (an `AbsTaskRetrieval` instance) over one split of local BEIR data.

    Args:
        data: corpus, queries and qrels (`retromae.trainers.retrieval.beir.read_beir`).
        dataset_id: the dataset's Hub id, which the task's metadata and the model card's model-index name; default
            `local/<label>`, which the model-index leaves out (`cards._eval_results`).
        label: what the summary calls the folder; default its name.
        task_name: mteb's task name (and result file name), unique within one evaluation; default
            `LocalBEIR-<name>`.
        language: the data's language as mteb writes it (ISO 639-3 language + ISO 15924 script, `eng-Latn`); it is
            recorded in mteb's result JSON (`languages`) and checked by `resolve_language`.
        folder: the BEIR folder read, recorded (as an absolute path) in the summary row (`beir_folder`).
    """
    from mteb.abstasks.retrieval import AbsTaskRetrieval
    from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData
    from mteb.abstasks.task_metadata import TaskMetadata

    label = label or data.name
    metadata = TaskMetadata(
        name=task_name or f"LocalBEIR-{data.name}",
        description=f"Local BEIR folder {label} ({data.split} split), read by retromae",
        reference=None,
        dataset={"path": dataset_id or f"local/{label}", "revision": "local"},
        type="Retrieval",
        category="t2t",
        modalities=["text"],
        eval_splits=[data.split],
        eval_langs=[resolve_language(language)],
        main_score="ndcg_at_10",
        date=None,
        domains=None,
        task_subtypes=None,
        license=None,
        annotations_creators=None,
        dialect=None,
        sample_creation=None,
        bibtex_citation=None,
    )

    def load_data(self, num_proc=None, **kwargs):
        if self.data_loaded:
            return
        corpus = Dataset.from_dict({
            "id": list(data.corpus),
            "title": [doc.get("title", "") for doc in data.corpus.values()],
            "text": [doc["text"] for doc in data.corpus.values()],
        })
        queries = Dataset.from_dict({"id": list(data.queries), "text": list(data.queries.values())})
        self.dataset = {"default": {data.split: RetrievalSplitData(
            corpus=corpus, queries=queries, relevant_docs=data.qrels, top_ranked=None
        )}}
        self.data_loaded = True

    task_class = type("LocalBEIRRetrieval", (AbsTaskRetrieval,), {"metadata": metadata, "load_data": load_data})
    task = task_class()
    task.retromae_queries = len(data.queries)
    task.retromae_label = label
    task.retromae_folder = str(_folder_path(folder)) if folder is not None else None
    return task


def _folder_path(folder: str | os.PathLike) -> Path:
    """A BEIR folder as the summary records it: absolute, links resolved (one folder, one path)."""
    return Path(folder).expanduser().resolve()


def local_task_names(folders: list[str | os.PathLike], known: Iterable[str | os.PathLike] = ()
                     ) -> list[tuple[str, str]]:
    """`(label, task name)` per BEIR folder: its name and `LocalBEIR-<name>`; where folders share a name, with each
    other or with a folder `known` (the summary's earlier rows, `summary_folders`), the last path parts that tell
    them apart (`other/beir`) and `LocalBEIR-<name>-<hash of the path>`, since mteb writes `<task name>.json` and
    results are matched to tasks by name. The same folder twice is refused."""
    paths = [_folder_path(folder) for folder in folders]
    everyone = list(dict.fromkeys([*paths, *(Path(path) for path in known)]))
    parts = {path: path.relative_to(path.anchor).parts for path in everyone}
    for folder, path in zip(folders, paths, strict=True):
        if paths.count(path) > 1:
            raise ValueError(f"--beir-folder names {folder} twice ({path}); give each folder once")
    names = []
    for path in paths:
        twins = [p for p in everyone if p.name == path.name]
        if len(twins) == 1:
            names.append((path.name, f"LocalBEIR-{path.name}"))
            continue
        depth = next(n for n in range(2, max(len(parts[p]) for p in twins) + 1)
                     if len({parts[p][-n:] for p in twins}) == len(twins))
        digest = hashlib.sha1(str(path).encode("utf-8")).hexdigest()[:8]
        names.append(("/".join(parts[path][-depth:]), f"LocalBEIR-{path.name}-{digest}"))
    return names


def _mteb_model(model: SentenceTransformer, search: str):
    hybrid = hybrid_method_of(model) is not None
    if search == "exact" and not hybrid:
        return model  # exactly what `mteb.evaluate(model, ...)` wraps itself
    from mteb.models import SentenceTransformerEncoderWrapper
    from mteb.models.search_wrappers import SearchEncoderWrapper

    encoder = SentenceTransformerEncoderWrapper(model)
    if search == "faiss":
        if hybrid:
            raise ValueError("--search faiss is for dense models; the hybrid (dense + sparse) model is searched exactly")
        from mteb.models.search_encoder_index.search_indexes.faiss_search_index import FaissSearchIndex

        return SearchEncoderWrapper(encoder, index_backend=FaissSearchIndex(encoder))
    chunk = max(256, HYBRID_CHUNK_BYTES // (4 * model.get_embedding_dimension()))
    return SearchEncoderWrapper(encoder, corpus_chunk_size=chunk)


@contextlib.contextmanager
def _quiet_mteb(show_progress_bar: bool) -> Iterator[None]:
    """Silences what mteb prints that tells our users nothing: its calls of sentence-transformers' renamed
    `get_sentence_embedding_dimension` (a FutureWarning each), and its `datasets.map` progress bars unless progress
    is asked for."""
    bars_were_on = datasets.is_progress_bar_enabled()
    if not show_progress_bar:
        datasets.disable_progress_bars()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*get_sentence_embedding_dimension", category=FutureWarning)
            yield
    finally:
        if bars_were_on:
            datasets.enable_progress_bars()


def evaluate_model(
    model: SentenceTransformer,
    tasks: list,
    output_dir: str | os.PathLike,
    *,
    model_name: str,
    batch_size: int = 64,
    search: Literal["exact", "faiss"] = "exact",
    show_progress_bar: bool = False,
) -> list[dict[str, Any]]:
    """Run mteb on `tasks`, write its result JSON under `output_dir/mteb` and return one summary row per task/split.

    Returns:
        Rows `{"task", "dataset_id", "dataset_name", "beir_folder", "split", "subset", "queries", "ndcg_at_10",
        "mrr_at_10", "recall_at_100", "recall_at_1000", "main_score", "mteb_file"}`; `beir_folder` is a local task's
        folder (absolute), None for a registered task; `mteb_file` the task's result JSON, relative to `output_dir`.
    """
    import mteb

    if search not in {"exact", "faiss"}:
        raise ValueError(f"search={search!r} must be 'exact' or 'faiss'")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    model.model_card_data.model_name = model_name  # mteb's result folder name (else "no_model_name_available")
    cache = mteb.ResultCache(output_dir / "mteb")
    with _quiet_mteb(show_progress_bar):
        result = mteb.evaluate(
            _mteb_model(model, search),
            tasks,
            cache=cache,
            encode_kwargs={"batch_size": batch_size, "show_progress_bar": show_progress_bar},
            show_progress_bar=show_progress_bar,
            overwrite_strategy="always",
        )
    by_name = {task.metadata.name: task for task in tasks}
    rows = []
    for task_result in result.task_results:
        task = by_name[task_result.task_name]
        result_file = _result_file(cache, result, task_result.task_name, output_dir)
        for split, entries in task_result.scores.items():
            for entry in entries:
                rows.append({
                    "task": task_result.task_name,
                    # an aggregate (CQADupstackRetrieval) has no dataset of its own: its name instead
                    "dataset_id": task.metadata.name if task.is_aggregate else task.metadata.dataset["path"],
                    "dataset_name": _dataset_name(task),
                    "beir_folder": getattr(task, "retromae_folder", None),
                    "split": split,
                    "subset": entry.get("hf_subset", "default"),
                    "queries": _query_count(task, entry.get("hf_subset", "default"), split),
                    **{key: round(value, METRIC_DECIMALS) if isinstance(value := entry.get(key), float) else value
                       for key, _ in CARD_METRICS},
                    "main_score": entry.get("main_score"),
                    "mteb_file": result_file,
                })
    return rows


def _result_file(cache, result, task_name: str, output_dir: Path) -> str | None:
    """Where mteb saved a task's result JSON, relative to `output_dir`; None if it is not there."""
    path = cache.get_task_result_path(task_name, result.model_name, result.model_revision or "no_revision_available",
                                      experiment_name=result.experiment_name)
    return path.relative_to(output_dir).as_posix() if path.is_file() else None


def _dataset_name(task) -> str:
    label = getattr(task, "retromae_label", None)
    return f"{label} (local BEIR)" if label else f"MTEB {task.metadata.name}"


def _query_count(task, subset: str, split: str) -> int | None:
    if hasattr(task, "retromae_queries"):
        return task.retromae_queries
    try:
        return len(task.dataset[subset][split]["queries"])
    except (AttributeError, KeyError, TypeError):
        return None


def card_run_info_file(model_dir: str | os.PathLike) -> Path:
    """The run record of a folder written by `retromae finetune` (whose card `--update-card` may rewrite); any other
    folder or a Hub id is refused."""
    info_file = Path(model_dir) / FINETUNE_RUN_INFO_FILE
    if not info_file.is_file():
        raise ValueError(
            f"--update-card needs a folder written by `retromae finetune` ({FINETUNE_RUN_INFO_FILE} not found in "
            f"{Path(model_dir).name}); its README.md is left as it is"
        )
    return info_file


def update_model_card(model_dir: str | os.PathLike, rows: list[dict[str, Any]]) -> None:
    """Merge `rows` into the folder's `retromae_finetune.json` (same dataset + split replaced) and re-render the
    card. Only for folders written by `retromae finetune` (a foreign README is never overwritten)."""
    model_dir = Path(model_dir)
    info_file = card_run_info_file(model_dir)
    info = read_json_or_empty(info_file)
    keep = [r for r in info.get("eval_results") or []
            if (r["dataset_id"], r["split"]) not in {(n["dataset_id"], n["split"]) for n in rows}]
    info["eval_results"] = keep + [
        {k: row.get(k) for k in ("task", "dataset_id", "dataset_name", "split", "queries",
                                 *(key for key, _ in CARD_METRICS))} for row in rows
    ]
    write_finetuned_card(model_dir, info, METHODS)
    logger.info("model card of %s updated with %d result(s)", model_dir.name, len(rows))


def evaluate_folder(
    model: str | os.PathLike,
    *,
    beir_folders: list[str | os.PathLike] | None = None,
    tasks: list[str] | None = None,
    benchmark: str | None = None,
    split: str = "test",
    language: str = DEFAULT_LANGUAGE,
    output_dir: str | os.PathLike,
    batch_size: int = 64,
    search: Literal["exact", "faiss"] = "exact",
    pooling: str | None = None,
    on_missing: str = "error",
    dataset_ids: list[str] | None = None,
    model_name: str | None = None,
    update_card: bool = False,
    show_progress_bar: bool = False,
    overwrite: bool = False,
) -> list[dict[str, Any]]:
    """Load a model folder and evaluate it on local BEIR folders, registered MTEB tasks and/or the retrieval tasks of
    an MTEB benchmark (`benchmark_tasks`; see the module doc). `language` is the BEIR folders' (mteb's `eng-Latn`
    form); a registered task knows its own.

    Returns:
        This evaluation's summary rows; `output_dir/summary.{json,md}` holds them after earlier runs' rows of this
        model on other tasks (`write_summary`). Queries with blank text are dropped with a count
        (`drop_blank_queries`).

    Raises:
        ValueError: among others, `output_dir` holds another model's summary and `overwrite` is False.
    """
    beir_folders = list_parameter("evaluate_folder", "beir_folders", beir_folders, paths=True)
    tasks = list_parameter("evaluate_folder", "tasks", tasks)
    dataset_ids = list_parameter("evaluate_folder", "dataset_ids", dataset_ids) or None
    if not beir_folders and not tasks and not benchmark:
        raise ValueError("nothing to evaluate on: pass --beir-folder DIR, --tasks NAME[,NAME] and/or --benchmark NAME")
    if beir_folders:
        resolve_language(language)
    if dataset_ids and len(dataset_ids) != len(beir_folders):
        raise ValueError(f"--dataset-ids has {len(dataset_ids)} entries for {len(beir_folders)} BEIR folders")
    check_dataset_ids("--dataset-ids", dataset_ids)
    if on_missing not in ON_MISSING:
        raise ValueError(f"--on-missing must be one of {ON_MISSING}")
    check_folder_option("--output-dir", output_dir)
    digest = model_digest(model, pooling)  # the same folder with other weights, modules or pooling: another model
    claim_output(Path(output_dir), "--output-dir", overwrite, kind="into", owner=results_holding(model, digest),
                 inputs={"the --model folder": model})
    check_model_folder(model, purpose="evaluate --model")  # before reading the data: a half-saved folder is refused
    if update_card:
        card_run_info_file(model)
    output_dir = Path(output_dir)
    # a folder named like one of the summary's earlier rows gets a row of its own (its path tells them apart)
    names = local_task_names(beir_folders, summary_folders(output_dir, model_location(model), digest))
    registered = find_tasks(tasks)  # every name, the benchmark's too, before any download: a typo costs none
    benchmark_name, from_benchmark = benchmark_tasks(benchmark) if benchmark else ("", [])
    chosen = {name for _, name in names} | {task.metadata.name for task in registered}
    from_benchmark = [task for task in from_benchmark if task.metadata.name not in chosen]  # mteb: one task per name
    mteb_tasks = [
        _local_task(folder, label, task_name, split=split, on_missing=on_missing, language=language,
                    dataset_id=dataset_ids[i] if dataset_ids else None)
        for i, (folder, (label, task_name)) in enumerate(zip(beir_folders, names, strict=True))
    ]
    load_registered(registered)
    load_benchmark_data(benchmark_name, from_benchmark)
    mteb_tasks += registered + from_benchmark
    name = model_name or mteb_model_name(model)
    # a pre-training checkpoint is exported first, into a folder of its own that goes afterwards
    with tempfile.TemporaryDirectory(prefix="retromae-evaluate-") as work_dir:
        encoder, _ = load_as_sentence_transformer(model, pooling=pooling, work_dir=work_dir)
        drop_replaced_results(output_dir, name, search, model_location(model), digest)
        rows = evaluate_model(encoder, mteb_tasks, output_dir, model_name=name, batch_size=batch_size,
                              search=search, show_progress_bar=show_progress_bar)
    write_summary(rows, output_dir, name, search, model_location(model), digest)
    if update_card:
        update_model_card(model, rows)
    return rows


def _local_task(folder: str | os.PathLike, label: str, task_name: str, *, split: str, on_missing: str,
                language: str, dataset_id: str | None):
    """The mteb task of one BEIR folder (`make_local_task`), its files read here: a bad line is one `ValueError`."""
    try:
        data = drop_blank_queries(read_beir(folder, split=split, on_missing=on_missing))
    except RetrievalDataError as error:
        raise ValueError(str(error)) from None
    logger.info("evaluation data %s", data.summary())
    return make_local_task(data, dataset_id, label=label, task_name=task_name, language=language, folder=folder)


EVALUATE_OPTIONS = ("pooling", "on_missing", "dataset_ids", "model_name", "show_progress_bar", "overwrite",
                    "benchmark", "language")


def evaluate(
    model: str | os.PathLike,
    data: str | os.PathLike | list[str | os.PathLike],
    output_dir: str | os.PathLike | None = None,
    *,
    split: str = "test",
    batch_size: int = 64,
    search: Literal["exact", "faiss"] = "exact",
    update_card: bool = False,
    **options: Any,
) -> list[dict[str, Any]]:
    """Evaluate a model on retrieval data with mteb (`retromae evaluate`).

    Args:
        model: a sentence-transformers folder, a `retromae pretrain` checkpoint, a plain BERT folder or a Hub id.
        data: one or more local BEIR folders (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv) and/or names of MTEB's
            registered retrieval tasks (e.g. "SciFact"; their data is downloaded). An existing folder, or anything that
            looks like a path (`is_local_path`), is BEIR data; anything else a task name.
        output_dir: where mteb's result JSON and summary.{json,md} go (default: eval-results/<model folder name>).
        split: the qrels split of the BEIR folders.
        batch_size: encoding batch size.
        search: "exact" (brute force) or "faiss" (dense models on large corpora).
        update_card: add the results to the model folder's card (folders written by `retromae finetune`).
        **options: `pooling`, `on_missing`, `dataset_ids`, `model_name`, `show_progress_bar`, `overwrite`,
            `benchmark` (an MTEB benchmark's retrieval tasks, e.g. "NanoBEIR"; `data` may then be `[]`) and
            `language` (the BEIR folders', default "eng-Latn") of `evaluate_folder`; another name, or a batch size
            below 1, raises `ValueError`. `data` and `dataset_ids` take one str as one item.

    Raises:
        TypeError: a path that is no str or `os.PathLike`, a bool option that is not True or False, a list item of
            another type (each message names the parameter).

    Returns:
        One row per task and split: `task`, `dataset_id`, `dataset_name`, `beir_folder` (a BEIR folder's absolute
        path; None for an MTEB task), `split`, `queries`, `ndcg_at_10`, `mrr_at_10`, `recall_at_100`,
        `recall_at_1000`, `main_score`.
    """
    unknown = sorted(set(options) - set(EVALUATE_OPTIONS))
    if unknown:
        named = ("output_dir", "split", "batch_size", "search", "update_card", *EVALUATE_OPTIONS)
        close = difflib.get_close_matches(unknown[0], named, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise ValueError(f"retromae.evaluate: unknown option {', '.join(unknown)}; {hint}the options are "
                         f"{', '.join(named)}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"retromae.evaluate: batch_size={batch_size!r}; give a whole number >= 1")
    where = "retromae.evaluate"
    check_path(where, "model", model, "give a model folder or a Hub id (a str or os.PathLike)")
    if output_dir is not None:
        check_path(where, "output_dir", output_dir)
    check_bool_options(where, evaluate_folder, {**options, "update_card": update_card})
    if "dataset_ids" in options:
        options["dataset_ids"] = list_parameter(where, "dataset_ids", options["dataset_ids"]) or None
    sources = list_parameter(where, "data", data, paths=True)
    is_folder = [Path(source).is_dir() or is_local_path(source) for source in sources]  # a missing one is named
    beir_folders = [source for source, folder in zip(sources, is_folder, strict=True) if folder]
    tasks = [os.fspath(source) for source, folder in zip(sources, is_folder, strict=True) if not folder]
    output_dir = output_dir or default_output_dir(model)
    try:
        return evaluate_folder(model, beir_folders=beir_folders, tasks=tasks, split=split, output_dir=output_dir,
                               batch_size=batch_size, search=search, update_card=update_card, **options)
    except UnknownTaskError as error:  # a name here is a folder or a task: a typo of either is neither
        raise ValueError(f"retromae.evaluate: {error.name!r} is no folder in {Path.cwd()} and {error}") from None


def default_output_dir(model: str | os.PathLike) -> Path:
    """`eval-results/<model folder name>` (a Hub id's last part): two copies of one fine-tune (same --model-name)
    get a folder each."""
    return Path("eval-results") / model_location(model).split("/")[-1]


def mteb_model_name(model: str | os.PathLike) -> str:
    path = Path(model)
    if path.exists():
        name = read_json_or_empty(path / FINETUNE_RUN_INFO_FILE).get("model_name")
        if name:
            return name if "/" in name else f"local/{name}"
        return f"local/{path.resolve().name}"
    return str(model)


__all__ = [
    "card_run_info_file", "default_output_dir", "evaluate", "evaluate_folder", "evaluate_model",
    "local_task_names", "make_local_task", "results_holding", "summary_markdown", "update_model_card",
]
