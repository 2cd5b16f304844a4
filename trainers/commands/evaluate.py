"""`retromae evaluate`: MTEB retrieval evaluation of a model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..inputs.arguments import LIST_FLAG, start_command
from ..retrieval.mteb import (
    DEFAULT_LANGUAGE,
    default_output_dir,
    evaluate_folder,
    mteb_model_name,
    summary_markdown,
)


@dataclass
class EvaluateArguments:
    model: str = field(metadata={"help": "a sentence-transformers folder (or a plain BERT folder: CLS + dot assumed)"})
    beir_folder: list[str] = field(
        default_factory=list,
        metadata={"help": "local BEIR folder(s), `--beir-folder A --beir-folder B` or `--beir-folder A B`: "
                  "corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv", **LIST_FLAG},
    )
    tasks: str | None = field(
        default=None, metadata={"help": "registered MTEB retrieval tasks, comma-separated (downloads their data)"}
    )
    benchmark: str | None = field(
        default=None, metadata={"help": "an MTEB benchmark (mteb.get_benchmark), e.g. NanoBEIR or BEIR: its retrieval "
                                "tasks (downloads their data)"}
    )
    split: str = field(default="test", metadata={"help": "qrels split of the BEIR folders"})
    language: str = field(
        default=DEFAULT_LANGUAGE, metadata={"help": "language of the BEIR folders, as mteb writes it: ISO 639-3 "
                                            "language + ISO 15924 script (eng-Latn, deu-Latn, ...)"}
    )
    output_dir: str | None = field(
        default=None, metadata={"help": "where mteb's JSON and the summary go (default: eval-results/<model folder name>)"}
    )
    batch_size: int = field(default=64, metadata={"help": "encoding batch size"})
    search: Literal["exact", "faiss"] = field(
        default="exact", metadata={"help": "exact (brute force) or faiss (mteb's FaissSearchIndex, large corpora)"}
    )
    pooling: Literal["cls", "mean"] | None = field(
        default=None, metadata={"help": "pooling for a folder without modules.json, a pre-training checkpoint "
                                "included: cls + dot (default) or mean + cosine"}
    )
    on_missing: Literal["skip", "error"] = field(
        default="error", metadata={"help": "qrels naming unknown queries/documents: refuse, or drop them with a count"}
    )
    dataset_ids: str | None = field(
        default=None, metadata={"help": "Hub dataset ids for the card, one per BEIR folder, comma-separated"}
    )
    model_name: str | None = field(default=None, metadata={"help": "name in mteb's results (default: from the folder)"})
    update_card: bool = field(default=False, metadata={"help": "add the results to the model folder's model card"})
    overwrite: bool = field(default=False, metadata={"help": "replace another model's results in --output-dir"})
    progress: bool = field(default=True, metadata={"help": "show encoding progress bars (--no-progress: none)"})


def evaluate_command(argv: list[str]) -> int:
    """`retromae evaluate MODEL --beir-folder DIR [--split dev] [--language eng-Latn] [--tasks SciFact]
    [--benchmark NanoBEIR] [--output-dir OUT]`."""
    (args,) = start_command(
        argv, EvaluateArguments, prog="retromae evaluate",
        description="Evaluate a model with MTEB on local BEIR folders, registered retrieval tasks and/or the retrieval "
        "tasks of an MTEB benchmark; writes "
        "mteb's result JSON and a summary table (NDCG@10, MRR@10, Recall@100, Recall@1000).", positional=["model"],
        positive=("batch_size",),
    )
    output_dir = args.output_dir or str(default_output_dir(args.model))
    rows = evaluate_folder(
        args.model,
        beir_folders=args.beir_folder,
        tasks=[t.strip() for t in (args.tasks or "").split(",") if t.strip()],
        benchmark=args.benchmark,
        split=args.split,
        language=args.language,
        output_dir=output_dir,
        batch_size=args.batch_size,
        search=args.search,
        pooling=args.pooling,
        on_missing=args.on_missing,
        dataset_ids=[d.strip() for d in args.dataset_ids.split(",")] if args.dataset_ids else None,
        model_name=args.model_name,
        update_card=args.update_card,
        show_progress_bar=args.progress,
        overwrite=args.overwrite,
    )
    print(summary_markdown(rows, args.model_name or mteb_model_name(args.model)), end="", flush=True)
    print(f"retromae: mteb results and summary written to {output_dir}", flush=True)
    return 0


__all__ = ["evaluate_command"]
