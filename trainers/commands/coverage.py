"""`retromae coverage`: input-token coverage of sentence embeddings."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..data.reading import read_corpus
from ..inputs.arguments import LIST_FLAG, start_command
from ..inputs.checkpoints import default_model_dir
from ..retrieval.coverage import (
    COVERAGE_JSON,
    COVERAGE_PNG,
    DEFAULT_KS,
    DEFAULT_MAX_SEQ_LENGTH,
    MIN_SEQ_LENGTH,
    PROJECTIONS,
    run_coverage,
)


@dataclass
class CoverageArguments:
    model: list[str] = field(
        default_factory=list,
        metadata={"help": "one or more models, `--model A --model B` or `--model A B`: our checkpoints, exported "
                  "encoders or any BERT folder / Hub id (default: the bundled all-MiniLM-L6-v2)", **LIST_FLAG},
    )
    corpus: str | None = field(default=None, metadata={"help": "texts to probe (same formats as `retromae pretrain`)"})
    max_texts: int = field(default=1000, metadata={"help": "use the first N passages of the corpus"})
    max_seq_length: int | None = field(
        default=None, metadata={"help": f"tokens per text, {MIN_SEQ_LENGTH} or more (default: {DEFAULT_MAX_SEQ_LENGTH}, "
                                "capped at the model's position limit)"}
    )
    batch_size: int = field(default=32, metadata={"help": "texts per forward pass"})
    output_dir: str = field(default="out/coverage", metadata={"help": "where coverage.json and coverage.png go"})
    projection: str = field(
        default="embeddings",
        metadata={"help": "embeddings: h·Eᵀ (Algorithm 1, any model); lm_head: the checkpoint's trained MLM head "
                  "(the paper's figures; needs a pre-training or masked-LM checkpoint)", "choices": list(PROJECTIONS)},
    )
    progress: bool = field(default=True, metadata={"help": "show a progress bar per model (--no-progress: none)"})
    overwrite: bool = field(
        default=False, metadata={"help": "replace a coverage.json / coverage.png in --output-dir that holds other "
                                 "models' results or was not written by `retromae coverage`"}
    )


def _first_texts(corpus: str | None, max_texts: int) -> Iterator[str]:
    """The first `max_texts` passages of `corpus`, read only when iterated: `run_coverage` checks every model and
    the output folder first."""
    passages = read_corpus(corpus)
    yield from passages.select(range(min(max_texts, len(passages))))["text"]


def coverage_command(argv: list[str]) -> int:
    """`retromae coverage`: the BoW paper's input-token coverage (Algorithm 1) for one or more models."""
    (args,) = start_command(
        argv, CoverageArguments, prog="retromae coverage",
        description="Share of the top-k tokens of h·Eᵀ (h: the [CLS] embedding, E: the word embeddings) that occur "
        "in the input, for k = 10/20/50/100 (bow-prediction paper, Algorithm 1). Rises when retrieval-oriented "
        "pre-training worked. Writes coverage.json and coverage.png.",
        positive=("max_texts", "batch_size"),
    )
    models = args.model or [default_model_dir()]
    results = run_coverage(models, _first_texts(args.corpus, args.max_texts), output_dir=args.output_dir,
                           overwrite=args.overwrite, max_seq_length=args.max_seq_length, batch_size=args.batch_size,
                           projection=args.projection, show_progress_bar=args.progress)
    width = max(len(m) for m in results)
    print(f"{'model':{width}s}  " + "  ".join(f"cov@{k:<4d}" for k in DEFAULT_KS))
    for name, by_k in results.items():
        print(f"{name:{width}s}  " + "  ".join(f"{by_k[k]:8.4f}" for k in DEFAULT_KS))
    plot = f" and {COVERAGE_PNG}" if (Path(args.output_dir) / COVERAGE_PNG).is_file() else ""  # not without matplotlib
    print(f"retromae: wrote {Path(args.output_dir) / COVERAGE_JSON}{plot}", flush=True)
    return 0
