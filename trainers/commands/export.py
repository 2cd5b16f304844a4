"""`retromae export`: a checkpoint's encoder as a sentence-transformers model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..export.sentence_transformer import export_sentence_transformer
from ..inputs.arguments import start_command
from ..inputs.checkpoints import (
    needs_remote_code,
)


@dataclass
class ExportArguments:
    checkpoint: str = field(metadata={"help": "a `retromae pretrain` output folder or one of its checkpoint-N folders"})
    output_dir: str = field(metadata={"help": "where the sentence-transformers model goes"})
    overwrite: bool = field(default=False, metadata={"help": "replace an existing output folder"})
    model_name: str | None = field(default=None, metadata={"help": "model name for the model card, e.g. my-org/retromae-bert"})
    pooling: Literal["cls", "mean"] = field(default="cls", metadata={
        "help": "cls: the methods' [CLS] representation; mean: mean pooling, e.g. to keep the head of a base such as "
        "all-MiniLM-L6-v2 whose pre-training you continued (CLS methods only)"})
    similarity: Literal["dot", "cosine"] | None = field(default=None, metadata={
        "help": "dot or cosine (adds Normalize; bge-style bases use cls + cosine); default cosine for mean pooling "
        "and for SentMAE trained with its cosine loss, else dot"})


def export_command(argv: list[str]) -> int:
    """`retromae export CHECKPOINT OUTPUT_DIR [--overwrite] [--model-name NAME] [--pooling P] [--similarity S]`."""
    (args,) = start_command(
        argv, ExportArguments, prog="retromae export",
        description="Export the encoder of a pre-training checkpoint as a sentence-transformers model "
        "(CLS pooling, dot product by default; cosine for SentMAE's cosine loss) with a model card. "
        "Usage: retromae export CHECKPOINT OUTPUT_DIR",
        positional=["checkpoint", "output_dir"],
    )
    out = export_sentence_transformer(args.checkpoint, args.output_dir, overwrite=args.overwrite,
                                      model_name=args.model_name, pooling=args.pooling, similarity=args.similarity)
    remote = ", trust_remote_code=True" if needs_remote_code(out) else ""
    print(f"retromae: exported {args.checkpoint} -> {out} (load with SentenceTransformer({str(out)!r}{remote}))",
          flush=True)
    return 0


__all__ = ["ExportArguments", "export_command"]
