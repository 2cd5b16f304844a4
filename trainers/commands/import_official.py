"""`retromae import-official`: a checkpoint of the official RetroMAE code as our pre-training checkpoint."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..inputs.arguments import start_command
from ..inputs.errors import UserError
from ..inputs.official_checkpoints import (
    OFFICIAL_DECODER_MASK_RATIO,
    OFFICIAL_ENCODER_MASK_RATIO,
    import_official_checkpoint,
)
from ..inputs.outputs import claim_output, model_holding


@dataclass
class ImportOfficialArguments:
    # None by default, checked by the driver: argparse would report a missing positional before an unknown option
    checkpoint: str | None = field(default=None, metadata={"help": "a folder the official code (staoxiao/RetroMAE src/pretrain) saved: "
                                      "its output_dir or a checkpoint-N (config.json, model.safetensors, tokenizer)"})
    output_dir: str | None = field(default=None, metadata={"help": "where our RetroMAE pre-training checkpoint goes"})
    decoder: str | None = field(default=None, metadata={
        "help": "a .safetensors file with the official decoder layer (keys c_head.*, or c_head's own names), for a "
        "CHECKPOINT whose weights lack it: the official save keeps the encoder only"})
    encoder_mask_ratio: float = field(default=OFFICIAL_ENCODER_MASK_RATIO, metadata={
        "help": "the official run's --encoder_mlm_probability"})
    decoder_mask_ratio: float = field(default=OFFICIAL_DECODER_MASK_RATIO, metadata={
        "help": "the official run's --decoder_mlm_probability"})
    overwrite: bool = field(default=False, metadata={"help": "replace an existing, non-empty OUT"})


def import_official_command(argv: list[str]) -> int:
    """`retromae import-official CHECKPOINT OUT [--decoder FILE] [--encoder-mask-ratio R] [--decoder-mask-ratio R]
    [--overwrite]`."""
    (args,) = start_command(
        argv, ImportOfficialArguments, prog="retromae import-official",
        description="Convert a checkpoint of the official RetroMAE pre-training code (encoder, MLM head and decoder "
        "layer) into a retromae pre-training checkpoint that `retromae pretrain --model OUT` continues. "
        "Usage: retromae import-official CHECKPOINT OUT",
        positional=["checkpoint", "output_dir"],
    )
    if args.checkpoint is None or args.output_dir is None:
        raise UserError("give the official checkpoint and the output folder: retromae import-official CHECKPOINT OUT")
    out = Path(args.output_dir)
    inputs = {"the official checkpoint": args.checkpoint, "the decoder file": args.decoder}
    # before any reading: refuse early, in one line; --overwrite replaces a model folder, never a folder of other files
    claim_output(out, "OUT", args.overwrite, inputs=inputs, owner=model_holding)
    claim_output(out, "OUT", args.overwrite, kind="into", inputs=inputs, owner=model_holding)  # nor inside an input
    import_official_checkpoint(args.checkpoint, out, decoder_file=args.decoder, overwrite=args.overwrite,
                               encoder_mask_ratio=args.encoder_mask_ratio, decoder_mask_ratio=args.decoder_mask_ratio)
    print(f"retromae: imported {args.checkpoint} -> {out}; continue the run with: retromae pretrain --model {out} "
          "--method retromae ...", flush=True)
    return 0


__all__ = ["ImportOfficialArguments", "import_official_command"]
