"""Which tasks `retromae evaluate --benchmark NAME` runs: an MTEB benchmark's retrieval tasks, and the language of
local BEIR folders."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


DEFAULT_LANGUAGE = "eng-Latn"


# the mteb task types a retromae model runs: a query, a corpus (or candidate documents) and relevance judgements
RETRIEVAL_TASK_TYPES = frozenset({"Retrieval", "Reranking", "InstructionRetrieval"})


# named first when an unknown benchmark is listed: the BEIR-style ones
SUGGESTED_BENCHMARKS = ("BEIR", "NanoBEIR")


def resolve_language(language: str) -> str:
    """`language` when mteb knows it as an `eng-Latn`-style code (ISO 639-3 language, ISO 15924 script)."""
    from mteb.languages.check_language_code import check_language_code

    try:
        if not isinstance(language, str) or language.count("-") != 1:
            raise ValueError
        check_language_code(language)
    except ValueError:
        raise ValueError(f"--language {language!r} is not an mteb language code: give an ISO 639-3 language and an "
                         "ISO 15924 script, e.g. eng-Latn, deu-Latn, fra-Latn, zho-Hans") from None
    return language


def _find_benchmark(name: str):
    """`mteb.get_benchmark(name)`, also when only the case differs (`nanobeir`); an unknown name is one line that
    lists a few known ones (`mteb.get_benchmarks()`), the BEIR-style retrieval benchmarks first."""
    import mteb

    try:
        return mteb.get_benchmark(name)
    except (KeyError, ValueError) as error:
        benchmarks = mteb.get_benchmarks()
        same = [b for b in benchmarks if b.name.lower() == name.strip().lower()]
        if len(same) == 1:
            return same[0]
        retrieval = [b.name for b in benchmarks
                     if b.tasks and all(t.metadata.type in RETRIEVAL_TASK_TYPES for t in b.tasks)]
        known = list(dict.fromkeys([n for n in SUGGESTED_BENCHMARKS if n in retrieval] + retrieval))[:6]
        hint = str(error).strip("'\"")
        hint = hint[hint.find("Did you mean"):] + " " if "Did you mean" in hint else ""
        raise ValueError(f"unknown MTEB benchmark {name!r}; {hint}retrieval benchmarks include: {', '.join(known)}; "
                         f"all {len(benchmarks)} names: python -c \"import mteb; print([b.name for b in "
                         "mteb.get_benchmarks()])\"") from None


def benchmark_tasks(name: str) -> list:
    """The retrieval tasks (`RETRIEVAL_TASK_TYPES`) of mteb's benchmark `name` (`mteb.get_benchmark`); tasks of
    other types (classification, clustering, STS, ...) are left out with a log line. Each task's data is loaded (and
    downloaded) here, then unloaded again, so that a failure is clear before any encoding and the benchmark's data
    is never all in memory at once; mteb loads each task again (from the local cache) when it runs it."""
    benchmark = _find_benchmark(name)
    tasks = [task for task in benchmark.tasks if task.metadata.type in RETRIEVAL_TASK_TYPES]
    skipped = sorted({task.metadata.type for task in benchmark.tasks} - RETRIEVAL_TASK_TYPES)
    if not tasks:
        raise ValueError(f"MTEB benchmark {benchmark.name} has no retrieval task (its tasks are "
                         f"{', '.join(skipped)}); retromae evaluates retrieval tasks")
    if skipped:
        logger.info("benchmark %s: %d of its %d tasks are not retrieval tasks (%s) and are left out", benchmark.name,
                    len(benchmark.tasks) - len(tasks), len(benchmark.tasks), ", ".join(skipped))
    for task in tasks:
        for part in task.tasks if task.is_aggregate else [task]:  # an aggregate (CQADupstack) runs its sub-tasks
            load_task_data(part, f"MTEB task {part.metadata.name} (benchmark {benchmark.name})")
            part.unload_data()
    return tasks


def load_task_data(task, what: str) -> None:
    try:
        task.load_data()
    except Exception as error:  # OfflineModeIsEnabled / ConnectionError / datasets errors
        raise ValueError(
            f"cannot load the data of {what} ({task.metadata.dataset['path']}): {error}. Registered "
            "tasks download their data from the Hugging Face Hub (HF_HUB_OFFLINE=1 or no network blocks that); "
            "evaluate a local copy in BEIR layout with --beir-folder instead"
        ) from None


__all__ = ["DEFAULT_LANGUAGE", "RETRIEVAL_TASK_TYPES", "benchmark_tasks", "resolve_language"]
