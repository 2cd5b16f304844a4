"""`retromae export`: a checkpoint's encoder as a sentence-transformers model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..export.parts import export_part
from ..export.sentence_transformer import export_sentence_transformer
from ..inputs.arguments import start_command
from ..inputs.checkpoints import (
    needs_remote_code,
)
from ..inputs.errors import UserError


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
        "and for SentMAE trained with its cosine contrastive loss (contrastive_loss_weight > 0, similarity cos), "
        "else dot"})
    format: Literal["hybrid", "dense", "sparse"] = field(default="hybrid", metadata={
        "help": "DupMAE only: hybrid (dense + sparse in one model, remote code), dense (its [CLS] part: "
        "SentenceTransformer) or sparse (its ordinary-token part, approximated: SparseEncoder); the last two load "
        "without remote code"})


def export_command(argv: list[str]) -> int:
    """`retromae export CHECKPOINT OUTPUT_DIR [--overwrite] [--model-name NAME] [--pooling P] [--similarity S]
    [--format F]`."""
    (args,) = start_command(
        argv, ExportArguments, prog="retromae export",
        description="Export the encoder of a pre-training checkpoint as a sentence-transformers model "
        "(CLS pooling, dot product by default; cosine for SentMAE's cosine loss) with a model card. "
        "Usage: retromae export CHECKPOINT OUTPUT_DIR",
        positional=["checkpoint", "output_dir"],
    )
    if args.format == "hybrid":
        out = export_sentence_transformer(args.checkpoint, args.output_dir, overwrite=args.overwrite,
                                          model_name=args.model_name, pooling=args.pooling, similarity=args.similarity)
    else:
        _check_format_flags(args)
        out = export_part(args.checkpoint, args.output_dir, args.format, overwrite=args.overwrite,
                                   model_name=args.model_name)
    remote = ", trust_remote_code=True" if needs_remote_code(out) else ""
    model_class = "SparseEncoder" if args.format == "sparse" else "SentenceTransformer"
    print(f"retromae: exported {args.checkpoint} -> {out} (load with {model_class}({str(out)!r}{remote}))",
          flush=True)
    return 0


def _check_format_flags(args: ExportArguments) -> None:
    """--format dense/sparse builds DupMAE's own parts: --pooling / --similarity have nothing to change there."""
    if (args.pooling, args.similarity) != ("cls", None):
        raise UserError(f"--format {args.format} exports DupMAE's own [CLS] / ordinary-token parts; leave out "
                        "--pooling and --similarity")


__all__ = ["ExportArguments", "export_command"]
