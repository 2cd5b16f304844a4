"""Which tasks `retromae evaluate` runs: MTEB's registered retrieval tasks by name (`--tasks`), an MTEB benchmark's
retrieval tasks (`--benchmark NAME`), and the language of local BEIR folders. Names are resolved without loading any
data (`find_tasks`, `benchmark_tasks`), so that a typo costs no download; the data is loaded afterwards
(`load_registered`, `load_benchmark_data`)."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


DEFAULT_LANGUAGE = "eng-Latn"


# the mteb task types a retromae model runs: a query, a corpus (or candidate documents) and relevance judgements
RETRIEVAL_TASK_TYPES = frozenset({"Retrieval", "Reranking", "InstructionRetrieval"})


# named first when an unknown benchmark is listed: the BEIR-style ones
SUGGESTED_BENCHMARKS = ("BEIR", "NanoBEIR")


class UnknownTaskError(ValueError):
    """A task name mteb does not know (`find_tasks`); `name` is the name given."""

    def __init__(self, name: str, message: str):
        super().__init__(message)
        self.name = name


def find_tasks(names: list[str]) -> list:
    """mteb's registered retrieval tasks by name, every name checked and no data loaded (a typo costs no download).

    Raises:
        UnknownTaskError: a name mteb does not know. ValueError: a task that is no retrieval task.
    """
    import mteb

    tasks = []
    for name in names:
        try:
            (task,) = mteb.get_tasks(tasks=[name])
        except (KeyError, ValueError) as error:
            raise UnknownTaskError(name, f"unknown MTEB task {name!r}: {str(error).strip(chr(34))}") from None
        if task.metadata.type not in RETRIEVAL_TASK_TYPES:
            raise ValueError(f"MTEB task {name} is a {task.metadata.type} task; retromae evaluates retrieval tasks")
        tasks.append(task)
    return tasks


def load_registered(tasks: list) -> None:
    """Load (download) the data of `find_tasks`' tasks; a failure is one line naming the task and --beir-folder."""
    for task in tasks:
        load_task_data(task, f"MTEB task {task.metadata.name}")


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


def benchmark_tasks(name: str) -> tuple[str, list]:
    """mteb's name of the benchmark `name` (`mteb.get_benchmark`) and its retrieval tasks (`RETRIEVAL_TASK_TYPES`),
    no data loaded (`load_benchmark_data`); tasks of other types (classification, clustering, STS, ...) are left
    out with a log line.

    Raises:
        ValueError: an unknown benchmark (one line listing known ones), or one without a retrieval task.
    """
    benchmark = _find_benchmark(name)
    tasks = [task for task in benchmark.tasks if task.metadata.type in RETRIEVAL_TASK_TYPES]
    skipped = sorted({task.metadata.type for task in benchmark.tasks} - RETRIEVAL_TASK_TYPES)
    if not tasks:
        raise ValueError(f"MTEB benchmark {benchmark.name} has no retrieval task (its tasks are "
                         f"{', '.join(skipped)}); retromae evaluates retrieval tasks")
    if skipped:
        logger.info("benchmark %s: %d of its %d tasks are not retrieval tasks (%s) and are left out", benchmark.name,
                    len(benchmark.tasks) - len(tasks), len(benchmark.tasks), ", ".join(skipped))
    return benchmark.name, tasks


def load_benchmark_data(benchmark: str, tasks: list) -> None:
    """Load (download) the data of the benchmark's `tasks`, then unload it again, so that a failure is clear before
    any encoding and the benchmark's data is never all in memory at once; mteb loads each task again (from the local
    cache) when it runs it."""
    for task in tasks:
        for part in task.tasks if task.is_aggregate else [task]:  # an aggregate (CQADupstack) runs its sub-tasks
            load_task_data(part, f"MTEB task {part.metadata.name} (benchmark {benchmark})")
            part.unload_data()


def load_task_data(task, what: str) -> None:
    try:
        task.load_data()
    except Exception as error:  # OfflineModeIsEnabled / ConnectionError / datasets errors
        raise ValueError(
            f"cannot load the data of {what} ({task.metadata.dataset['path']}): {error}. Registered "
            "tasks download their data from the Hugging Face Hub (HF_HUB_OFFLINE=1 or no network blocks that); "
            "evaluate a local copy in BEIR layout with --beir-folder instead"
        ) from None


__all__ = [
    "DEFAULT_LANGUAGE", "RETRIEVAL_TASK_TYPES", "UnknownTaskError", "benchmark_tasks", "find_tasks", "load_benchmark_data",
    "load_registered", "resolve_language",
]
