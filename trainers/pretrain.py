"""`retromae pretrain`: parse the options, build the method's model and data, train, save, export.

The driver knows no method: the registry (`methods.py`) gives the model class, the config settings, the training
data and collator, and the exporter. Every option parses with `HfArgumentParser`; `--config FILE.yaml|json` supplies
values for any flag (flags on the command line win). Resuming (`--resume-from-checkpoint`) restores every setting of
the run from its checkpoint (`resume.py`).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import os
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from retromae.modeling.backbones import BACKBONES, DEFAULT_ENCODER_TYPE, SUPPORTED_ENCODER_TYPES, backbone_of
from sentence_transformers import SentenceTransformer
from transformers import (
    IntervalStrategy,
    PreTrainedConfig,
    TrainingArguments,
    set_seed,
)
from transformers.utils import is_flash_attn_2_available, is_flash_attn_3_available, is_kernels_available

from .core.arguments import (
    CommandParser,
    DefaultsHelpFormatter,
    config_argument,
    configure_logging,
    expand_home,
    merge_file_mappings,
    parse,
    split_config,
)
from .core.checkpoints import default_model_dir, load_tokenizer
from .core.errors import UserError
from .core.folders import (
    INTERRUPTED_HINT,
    TRAINER_CHECKPOINT,
    check_folder_option,
    check_model_folder,
    public_name,
    would_delete,
)
from .core.io import read_json_or_empty
from .core.lock import LOCK_NAME, folder_lock
from .core.versions import package_version
from .data import DataInputs
from .export import export_from_model
from .fast_paths import compile_layers, compile_loss, fast_path_wanted, pad_loss_vocab
from .methods import DEFAULT_METHOD, METHODS, Method, MethodArguments, get_method
from .positions import check_extension_length, check_model_and_tokenizer, extend_position_embeddings
from .recipe import RecipeArguments, suggest_recipe
from .resume import (
    check_given_options,
    check_text_unchanged,
    given_options,
    new_run_id,
    read_settings,
    record_settings,
)
from .trainer import (
    RESUME_LAST,
    RUN_INFO_NAME,
    RetroMAETrainer,
    check_no_checkpoint_collision,
    checkpoint_to_resume,
    clean_killed_saves,
    finished_step,
    last_complete_checkpoint,
    remove_previous_run,
    run_output_files,
)
from .validation import RetrievalValidationCallback, metric_names, plot_validation, validation_summary

logger = logging.getLogger("retromae")

DEFAULT_BASE_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
DEFAULT_CORPUS_NAME = "python-stdlib-docstrings"
# The embedded default run (`retromae pretrain` with no corpus): small enough for 2 CPU cores in < 10 minutes.
DEMO_DEFAULTS = {
    "max_steps": 200, "max_seq_length": 64, "per_device_train_batch_size": 8, "learning_rate": 5e-5,
    "logging_steps": 20, "save_steps": 100, "output_dir": "out/retromae-demo",
}

PRETRAIN_EXAMPLES = """examples:
  retromae pretrain                                          # the demo: MiniLM + built-in corpus, ~5 min on CPU
  retromae pretrain --model bert-base-uncased --corpus wiki.txt --output-dir out/retromae \\
                    --max-seq-length 512 --max-steps 100000 --per-device-train-batch-size 32 --bf16 true
  retromae pretrain --config configs/retromae-wiki-book.yaml --corpus wiki.txt   # a paper's preset
  retromae pretrain --method dupmae --method-options '{"bow_loss_weight": 0.1}' --corpus corpus.jsonl
  retromae pretrain --output-dir out/retromae --resume-from-checkpoint last       # continue after a stop
  retromae pretrain --corpus corpus.jsonl --encoder-lr-scale 0.1                  # continue a trained retriever
  retromae pretrain --model bert-base-uncased --from-scratch true --corpus wiki.txt \\
                    --config-overrides "num_hidden_layers=6,hidden_size=384"  # random init, a smaller BERT
"""


# ---- arguments ----------------------------------------------------------------------------------------------------


@dataclass
class ModelArguments:
    model: str | None = field(
        default=None,
        metadata={"help": "encoder checkpoint to start from: a local folder or Hub id of a BERT, RoBERTa, XLM-R or "
                  "ModernBERT base (the bare model or its masked-LM weights, e.g. BertForMaskedLM, "
                  "RobertaForMaskedLM), or a retromae pre-training checkpoint to continue (decoder included). "
                  "A `retromae` checkpoint also continues as SentMAE stage 2 (--method sentmae, decoder included). "
                  f"Default: the bundled all-MiniLM-L6-v2 ({DEFAULT_BASE_MODEL_NAME})."},
    )
    method: str = field(default=DEFAULT_METHOD, metadata={"help": "pre-training method (see `retromae methods`)"})
    tokenizer: str | None = field(default=None, metadata={"help": "tokenizer folder or id (default: the model's)"})
    base_model_name: str | None = field(
        default=None, metadata={"help": "Hub id of the base model, written to the model card (default: guessed)"}
    )
    extend_position_embeddings: int | None = field(
        default=None,
        metadata={"help": "grow a BERT / RoBERTa / XLM-R base's learned position table to N usable positions by "
                  "copying it (as BGE-M3 did), to pre-train at a longer --max-seq-length; not for ModernBERT "
                  "(rotary positions: it runs at its native length)"},
    )
    from_scratch: bool = field(
        default=False,
        metadata={"help": "initialise every weight randomly (seeded by --seed) with --model's architecture and "
                  "tokenizer, instead of loading its weights; --model may then be a folder with only config.json and "
                  "a tokenizer, or any Hub id of a supported family"},
    )
    config_overrides: str | None = field(
        default=None,
        metadata={"help": "with --from-scratch: change --model's config, e.g. "
                  "'num_hidden_layers=6,hidden_size=384,num_attention_heads=12,intermediate_size=1536' (the base's "
                  "own config keys, as transformers' run_mlm.py takes them; a mapping in a --config file)"},
    )
    attn_implementation: Literal[
        "auto", "eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention"
    ] = field(
        default="auto",
        metadata={"help": "the encoder's attention (auto: transformers' default, sdpa); the decoder keeps sdpa when "
                  "the choice cannot take its dense mask (flash, flex). flash and flex need a GPU"},
    )


@dataclass
class DataArguments:
    corpus: str | None = field(
        default=None,
        metadata={"help": "pre-training text: a .txt file (one passage per line or blank-line-separated blocks), a "
                  ".jsonl file with a `text` field (+ `title`), a BEIR folder, a `datasets` folder or Hub name, or a "
                  "folder of such files. Default: a small built-in corpus (Python standard-library docstrings)."},
    )
    corpus_name: str | None = field(default=None, metadata={"help": "corpus name for the model card (default: file name)"})
    text_format: Literal["auto", "lines", "blocks"] = field(
        default="auto", metadata={"help": "how a .txt corpus is split into passages"}
    )
    max_seq_length: int = field(default=256, metadata={"help": "tokens per sequence, [CLS]/[SEP] included"})
    packing: bool = field(default=False, metadata={"help": "concatenate passages into full-length blocks"})
    streaming: bool = field(default=False, metadata={"help": "stream the corpus (larger than memory); needs --max-steps"})
    pairs: str | None = field(
        default=None,
        metadata={"help": "--method sentmae with contrastive_loss_weight > 0: a .jsonl of "
                  "{\"anchor\": ..., \"positive\": ...} lines (e.g. NLI or query-passage pairs) used as positives "
                  "and as the text, instead of --corpus. "
                  "Without it the positives are two spans of each --corpus passage (coCondenser-style)."},
    )


@dataclass
class RunArguments:
    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "allow writing into an output folder that already holds a run"}
    )
    export_dir: str | None = field(
        default=None,
        metadata={"help": "where the final sentence-transformers encoder goes (default: OUTPUT_DIR/encoder, the run's "
                  "own, replaced by each run there). Another folder must be empty unless --overwrite-export is given; "
                  "one that is or holds the output folder, the corpus, the model or the working directory is refused"},
    )
    overwrite_export: bool = field(
        default=False,
        metadata={"help": "replace what a non-empty --export-dir holds (deleted once the new export is complete)"},
    )
    no_export: bool = field(default=False, metadata={"help": "skip the final export"})


@dataclass
class ValidationArguments:
    eval_beir_folder: str | None = field(
        default=None,
        metadata={"help": "score the model's own sentence representation ([CLS]; DupMAE: its hybrid, and its [CLS] "
                  "part as eval_cls_*) zero-shot on "
                  "this BEIR folder (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv) every --eval-steps steps (default: "
                  "--logging-steps) and at the last step; logs eval_ndcg@10, eval_mrr@10 and eval_recall@100 beside "
                  "the losses and plots them in OUTPUT_DIR/validation.png. Encoding batch: "
                  "--per-device-eval-batch-size. With --eval-strategy steps the Trainer's evaluations run it, so "
                  "--metric-for-best-model ndcg@10 --load-best-model-at-end make the final save and export the best "
                  "checkpoint's"},
    )
    eval_split: str = field(default="dev", metadata={"help": "--eval-beir-folder: the qrels split (qrels/SPLIT.tsv)"})
    eval_max_queries: int = field(
        default=1000,
        metadata={"help": "--eval-beir-folder: score the first N queries by sorted id (the same ones each time)"},
    )
    eval_coverage: bool = field(
        default=False,
        metadata={"help": "--eval-beir-folder: also log the input-token coverage@10/20/50/100 of [CLS] (as "
                  "`retromae coverage`) on the folder's first 1000 documents"},
    )


@dataclass
class PretrainingArguments(TrainingArguments):
    """`TrainingArguments` with defaults for pre-training (module level: the Trainer pickles it into checkpoints)."""

    output_dir: str | None = field(default="out/retromae", metadata={"help": "where checkpoints and the result go"})
    learning_rate: float = field(default=1e-4, metadata={"help": "peak learning rate (RetroMAE paper: 1e-4)"})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay"})
    warmup_steps: float = field(default=0.1, metadata={"help": "warm-up steps, or a fraction of the run if < 1"})
    per_device_train_batch_size: int = field(default=8, metadata={"help": "sequences per device per step"})
    logging_steps: float = field(default=50, metadata={"help": "log losses every N optimizer steps"})
    logging_first_step: bool = field(default=True, metadata={"help": "log the losses of the first step"})
    save_steps: float = field(default=500, metadata={"help": "checkpoint every N optimizer steps"})
    save_total_limit: int | None = field(default=3, metadata={"help": "keep at most N checkpoints"})
    remove_unused_columns: bool = field(default=False, metadata={"help": "keep False: the collator needs all columns"})
    ddp_find_unused_parameters: bool | None = field(default=False, metadata={"help": "DDP: every parameter is used"})
    resume_from_checkpoint: str | None = field(
        default=None, metadata={"help": "a checkpoint folder, or `last` for the newest complete one in OUTPUT_DIR"}
    )
    compile_layers: bool | None = field(
        default=None,
        metadata={"help": "compile each encoder and decoder layer with torch.compile (one compiled graph reused by "
                  "every layer of a stack; the mask samplers stay eager); default: on when training on CUDA, where "
                  "it was measured faster for every method; --torch-compile compiles the whole model instead"},
    )
    compile_loss: bool | None = field(
        default=None,
        metadata={"help": "compute the vocabulary losses' softmax and its gradient in one compiled kernel per chunk "
                  "of rows (the same losses within rounding); default: on when training on CUDA"},
    )
    pad_loss_vocab: bool = field(
        default=False,
        metadata={"help": "pad the vocabulary inside the vocabulary losses to a multiple of 64 (aligned matrix "
                  "products; the same losses within rounding); not yet timed on a GPU, so off by default"},
    )


@dataclass
class PretrainRun:
    """`retromae pretrain`'s parsed options, the checkpoint it resumes from (or None) and the settings it records
    in its checkpoints (`resume.record_settings`)."""

    model: ModelArguments
    method_settings: MethodArguments
    data: DataArguments
    run: RunArguments
    training: PretrainingArguments
    recipe: RecipeArguments
    resume: str | None
    settings: dict[str, Any]
    validation: ValidationArguments = field(default_factory=ValidationArguments)
    config_file: str | None = None


class RecordingParser(CommandParser):
    """A `CommandParser` that keeps the namespace of its last parse: every option as the run uses it, before the
    dataclasses convert it (what `resume.record_settings` records)."""

    namespace: dict[str, Any]

    def parse_known_args(self, args=None, namespace=None):
        parsed, remaining = super().parse_known_args(args, namespace)
        self.namespace = dict(vars(parsed))
        return parsed, remaining


class PretrainHelpFormatter(argparse.RawDescriptionHelpFormatter, DefaultsHelpFormatter):
    """The examples epilog as written, and each informative default."""


def pretrain_parser() -> RecordingParser:
    return RecordingParser(
        (ModelArguments, MethodArguments, DataArguments, RunArguments, PretrainingArguments, RecipeArguments,
         ValidationArguments),
        prog="retromae pretrain",
        description="Pre-train an encoder (BERT, RoBERTa, XLM-R, ModernBERT) for retrieval (RetroMAE and friends), then export it for "
        "sentence-transformers. With no arguments: a short demo run of all-MiniLM-L6-v2 on a built-in corpus. "
        "The options you usually need: --model, --corpus, --method, --output-dir, --max-steps, --max-seq-length, "
        "--per-device-train-batch-size; every transformers TrainingArguments option is accepted too. "
        "Resuming (--resume-from-checkpoint) restores every setting of the run from its checkpoint.",
        epilog=PRETRAIN_EXAMPLES,
        formatter_class=PretrainHelpFormatter,
    )


def pretrain_arguments(argv: list[str]) -> PretrainRun:
    """Parse `retromae pretrain`'s options: once for the options given (flags and `--config` file), which locate
    the checkpoint to resume, and once in full. Resuming, the checkpoint's recorded settings are the defaults and a
    given option may only repeat them (or be one that may change, `resume.MAY_CHANGE`). Nothing is written: the
    output folder is prepared by `pretrain` under its lock (`prepare_output_dir`)."""
    flags, file_values = split_config(argv)
    if {"-h", "--help"} & set(flags):  # the full parser prints the help (with --config) and exits
        parse(pretrain_parser(), argv)
    parser = pretrain_parser()
    merged = merge_file_mappings(parser, flags, file_values, log=False)
    given = {**expand_home(file_values), **given_options(parser, merged)}  # `~` as the full parse expands it
    demo = not {"corpus", "pairs"} & given.keys() and flags == argv  # no --config
    defaults = DEMO_DEFAULTS if demo else {}
    output_dir = given.get("output_dir", defaults.get("output_dir", _field_default(PretrainingArguments, "output_dir")))
    resume = resolve_resume(str(output_dir), given.get("resume_from_checkpoint"))
    recorded = read_settings(resume) if resume else None
    if recorded and recorded["settings"]:
        check_given_options(recorded, given, resume)
        defaults = recorded["settings"]
    elif resume:
        logger.warning("%s records no run settings (written by an older retromae): the flags given now apply", resume)
    parser = pretrain_parser()
    try:
        model, method_settings, data, run, training, recipe, validation = parse(parser, argv, defaults)
    except ValueError as error:  # TrainingArguments' own checks of --load-best-model-at-end, in one line
        if "load_best_model_at_end" not in str(error):
            raise
        if "strategy to match" in str(error):  # its message names the enums, not the flags to add
            raise UserError("--load-best-model-at-end keeps the saved checkpoint with the best validation: add "
                            "--eval-strategy steps --eval-steps N (--save-steps a multiple of N), --eval-beir-folder "
                            "FOLDER and --metric-for-best-model ndcg@10") from None
        raise UserError(" ".join(str(error).replace("_", "-").split())) from None
    check_validation_options(training, validation, model.method)
    check_from_scratch_options(model)
    check_extension_length(model.extend_position_embeddings, data.max_seq_length)
    settings = record_settings(parser.namespace, recorded["run_id"] if recorded else new_run_id())
    found = config_argument(argv)
    return PretrainRun(model, method_settings, data, run, training, recipe, resume, settings, validation,
                       found[2] if found else None)


def check_from_scratch_options(model: ModelArguments) -> None:
    """Refuse, in one line, options that need or contradict `--from-scratch`."""
    if model.config_overrides and not model.from_scratch:
        raise UserError("--config-overrides changes the architecture, which a checkpoint's weights fix: add "
                        "--from-scratch true to initialise the model randomly")
    if model.extend_position_embeddings and model.from_scratch:
        raise UserError("--extend-position-embeddings copies a trained position table; from scratch, size it with "
                        "--config-overrides max_position_embeddings=N")


def check_validation_options(training: PretrainingArguments, validation: ValidationArguments, method: str) -> None:
    """Refuse, in one line, validation options the run cannot honour: any without `--eval-beir-folder` (the
    Trainer would stop with a traceback, or they would be ignored), an `--eval-steps` below one, and best-model
    options: `--metric-for-best-model` (which `--load-best-model-at-end` defaults to `loss`) must name a retrieval
    validation metric, which needs the Trainer's evaluations (`--eval-strategy steps`); `--save-total-limit 1` would
    make the Trainer delete every other checkpoint in OUTPUT_DIR at the end, other runs' included."""
    if training.eval_steps is not None and training.eval_steps <= 0:
        raise UserError(f"--eval-steps {training.eval_steps}: give a positive number of optimizer steps (or a "
                        "fraction of the run below 1)")
    if not validation.eval_beir_folder and training.metric_for_best_model is None:
        defaults = ValidationArguments()
        stray = [flag for flag, used in (
            ("--eval-strategy", training.eval_strategy != "no"), ("--eval-on-start", training.eval_on_start),
            ("--eval-steps", training.eval_steps is not None),
            *((f"--{name.replace('_', '-')}", getattr(validation, name) != getattr(defaults, name))
              for name in ("eval_split", "eval_max_queries", "eval_coverage"))) if used]
        if stray:
            raise UserError(f"{', '.join(stray)} configure the validation, which needs --eval-beir-folder FOLDER (a "
                            "BEIR folder); add it, or drop them")
    metric = training.metric_for_best_model
    if metric is None:
        return
    flag = "--load-best-model-at-end" if training.load_best_model_at_end else f"--metric-for-best-model {metric}"
    if not validation.eval_beir_folder:
        raise UserError(f"{flag} selects the checkpoint with the best retrieval validation metric: add "
                        "--eval-beir-folder FOLDER (a BEIR folder) and --metric-for-best-model ndcg@10")
    known = METHODS.get(method)  # an unknown --method is refused when the model is built
    names = metric_names(validation.eval_coverage, known.metric_prefixes if known else ("",))
    if metric.removeprefix("eval_") not in names:
        raise UserError(f"--metric-for-best-model {metric}: the retrieval validation logs {', '.join(names)}; "
                        "choose one of them (e.g. ndcg@10)")
    if training.eval_strategy == "no":
        raise UserError(f"{flag} compares the Trainer's evaluations: add --eval-strategy steps (with --save-steps a "
                        "multiple of --eval-steps)")
    if training.save_total_limit == 1:
        raise UserError(f"{flag} keeps the best checkpoint beside the newest: use --save-total-limit 2 or more")


def _field_default(dataclass_type: type, name: str) -> Any:
    return next(f.default for f in dataclasses.fields(dataclass_type) if f.name == name)


def resolve_resume(output_dir: str, resume: str | None) -> str | None:
    """The checkpoint `--resume-from-checkpoint` names: `last` is the newest complete one in OUTPUT_DIR (refused
    when OUTPUT_DIR holds checkpoints of several runs, `trainer.checkpoint_to_resume`)."""
    if resume in RESUME_LAST:
        found = checkpoint_to_resume(output_dir)
        if found is None:
            raise UserError(f"--resume-from-checkpoint {resume}: no complete checkpoint in {output_dir}")
        return str(found)
    if resume and not (Path(resume) / "trainer_state.json").is_file():
        raise UserError(f"--resume-from-checkpoint {resume}: not a complete checkpoint folder (no trainer_state.json)")
    return resume


def prepare_output_dir(output_dir: str, run_args: RunArguments, resume: str | None, should_save: bool,
                       inputs: Mapping[str, str | None] | None = None) -> None:
    """Refuse to write into a folder with an earlier run unless asked (resuming that run is asked); with
    --overwrite-output-dir delete what the earlier run wrote there (`trainer.run_output_files`), nothing else, and
    refuse first when that would delete one of `inputs` (`run_inputs`). Build folders of saves a kill interrupted
    are removed in any case. The main process calls it holding the folder's lock (`core.lock`), whose file does not
    count as an earlier run's."""
    folder = Path(output_dir)
    if should_save:
        clean_killed_saves(folder)
    own_folder = resume is not None and folder.resolve() == Path(resume).resolve().parent
    if own_folder and run_args.overwrite_output_dir:
        raise UserError(f"--overwrite-output-dir would delete {resume}, which --resume-from-checkpoint continues; "
                        "drop one of the two")
    if own_folder or not (folder.is_dir() and any(not p.name.startswith(LOCK_NAME) for p in folder.iterdir())):
        return
    if not run_args.overwrite_output_dir:
        latest = last_complete_checkpoint(folder)
        done = finished_step(latest, 0) if latest else None  # 0: the checkpoint's own max_steps
        if done is not None:  # e.g. a second `make demo`: resuming would only re-export
            hint = f"that run finished at step {done} ({latest.name}); choose another --output-dir"
        elif latest:
            hint = f"resume with --resume-from-checkpoint last (newest: {latest.name})"
        else:
            hint = "choose another --output-dir"
        raise UserError(
            f"output folder {folder} already holds files from an earlier run; {hint}, or pass --overwrite-output-dir "
            "to start over (it deletes what a run writes there: model files, checkpoint-N/, encoder/; nothing else)"
        )
    check_overwrite_inputs(folder, inputs or {})  # on every process, before any deletes
    if should_save:
        removed = remove_previous_run(folder)
        logger.info("--overwrite-output-dir: removed %d file(s)/folder(s) of the earlier run in %s", len(removed), folder)


def run_inputs(run: PretrainRun) -> dict[str, str | None]:
    """What the run reads (description -> path, None when not given): neither its export nor
    --overwrite-output-dir may delete it."""
    return {"the corpus": run.data.corpus, "the pairs file": run.data.pairs, "the model": run.model.model,
            "the tokenizer": run.model.tokenizer, "the --eval-beir-folder": run.validation.eval_beir_folder,
            "the --config file": run.config_file}


def check_overwrite_inputs(folder: Path, inputs: Mapping[str, str | None]) -> None:
    """Refuse an --overwrite-output-dir that would delete one of `inputs`: one that is the output folder itself (a
    model saved there) or lies in one of the earlier run's files and folders that it removes."""
    itself = next(((what, Path(path)) for what, path in inputs.items()
                   if path and Path(path).exists() and Path(path).resolve() == folder.resolve()), None)
    hit = itself or next(filter(None, (would_delete(entry, inputs) for entry in run_output_files(folder))), None)
    if hit is not None:
        raise UserError(f"--overwrite-output-dir would delete {hit[0]} ({hit[1]}), which this run reads; choose "
                        f"another --output-dir, or copy it out of {folder} first")


def export_target(run: PretrainRun) -> tuple[Path | None, bool]:
    """Where the encoder is exported (None with --no-export) and whether a non-empty folder there may be replaced:
    the default OUTPUT_DIR/encoder is the run's own; another --export-dir only with --overwrite-export."""
    if run.run.no_export:
        return None, False
    own = Path(run.training.output_dir) / "encoder"
    target = Path(run.run.export_dir) if run.run.export_dir else own
    check_folder_option("--export-dir", target, writable=False)  # a symlink loop: before resolve() raises on it
    return target, run.run.overwrite_export or target.resolve() == own.resolve()


def check_export_target(target: Path, overwrite: bool, run: PretrainRun) -> None:
    """Refuse, before training, an export target the export would fail on or that it must not delete (an export
    replaces its whole folder): a file; even with `overwrite`, a folder that is or holds the output folder, one of
    its checkpoints, the working directory or an input (`run_inputs`); without it, any
    non-empty folder."""
    check_folder_option("--export-dir", target)
    output, resolved = Path(run.training.output_dir).resolve(), target.resolve()
    top = resolved.relative_to(output).parts[0] if output in resolved.parents else ""  # its entry in OUTPUT_DIR
    made = {"the output folder": output}  # by this run: may not exist yet, which `would_delete` skips
    if TRAINER_CHECKPOINT.match(top):
        made["a checkpoint of this run"] = output / top
    hit = would_delete(target, {"the working directory": Path.cwd()}) or next(
        ((what, path) for what, path in made.items() if resolved == path or resolved in path.parents), None
    ) or would_delete(target, run_inputs(run))
    if hit is not None and resolved == output / "encoder":  # the default: suggesting it again would not help
        raise UserError(f"the export into {target} (the default --export-dir) would delete {hit[0]} ({hit[1]}): "
                        "move it out of that folder, or pass another --export-dir (or --no-export)")
    if hit is not None:
        raise UserError(f"--export-dir {target} would delete {hit[0]} ({hit[1]}), even with --overwrite-export; "
                        f"choose another --export-dir, e.g. {output / 'encoder'} (the default)")
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        raise UserError(f"--export-dir {target} is not empty; pass --overwrite-export to replace what it holds, or "
                        "choose an empty or new --export-dir")


# ---- the model ----------------------------------------------------------------------------------------------------


# what a flash / flex --attn-implementation needs besides a GPU, for the error that refuses it
ATTENTION_REQUIREMENTS = {
    "flash_attention_2": ("flash-attn 2", "pip install flash-attn --no-build-isolation"),
    "flash_attention_3": ("FlashAttention 3 (flash_attn_interface)", "build it from flash-attention's hopper/ folder"),
}


def attn_implementation_for(choice: str, device_type: str) -> str | None:
    """`--attn-implementation` as `from_pretrained` takes it (None for auto), or a one-line `UserError` when it cannot
    run here: flash and flex need a GPU (flex has no CPU backward), flash its package (or `kernels`, which
    transformers falls back to)."""
    if choice in ("auto", "eager", "sdpa"):
        return None if choice == "auto" else choice
    if device_type == "cpu":
        raise UserError(f"--attn-implementation {choice} needs a GPU and this run is on the CPU; choose sdpa or eager")
    if choice in ATTENTION_REQUIREMENTS:
        installed = is_flash_attn_2_available if choice == "flash_attention_2" else is_flash_attn_3_available
        if not (installed() or is_kernels_available()):
            package, how = ATTENTION_REQUIREMENTS[choice]
            raise UserError(f"--attn-implementation {choice} needs {package}, which is not installed: {how}, or "
                            "choose sdpa")
    return choice


def load_pretraining_model(
    model_ref: str, method: Method, settings: dict[str, Any], attn_implementation: str | None = None
):
    """A pre-training checkpoint of the same method continues (decoder included), as does one of a method listed in
    `method.continues_from` (SentMAE stage 2 continues a stage-1 `retromae` checkpoint); a BERT, RoBERTa, XLM-R or
    ModernBERT checkpoint starts fresh (`from_encoder_checkpoint`); any other architecture is refused in one line
    (`unsupported_model_message`). `attn_implementation` (from
    `attn_implementation_for`; None: transformers' default) is the encoder's."""
    check_model_folder(model_ref, purpose="--model", tokenizer=False)  # e.g. a checkpoint of a run killed mid-save
    model_type = config_model_type(model_ref)
    ours = {m.model_class.config_class.model_type: m for m in METHODS.values()}
    if model_type in ours:
        if ours[model_type].name != method.name and model_type not in method.continues_from:
            raise UserError(
                f"{model_ref} is a {ours[model_type].name!r} pre-training checkpoint but --method is {method.name!r}; "
                f"continue it with --method {ours[model_type].name}, or export it first (`retromae export`) and "
                f"start {method.name!r} from the exported encoder"
            )
        config = method.model_class.config_class.from_pretrained(model_ref, **settings)
        model, info = method.model_class.from_pretrained(model_ref, config=config, output_loading_info=True,
                                                         attn_implementation=attn_implementation)
        model.after_encoder_checkpoint_loaded(set(info["missing_keys"]))  # e.g. a decoder grown by a layer
        return model
    if (model_type or DEFAULT_ENCODER_TYPE) not in SUPPORTED_ENCODER_TYPES:
        raise UserError(unsupported_model_message(model_ref, model_type))
    try:
        return method.model_class.from_encoder_checkpoint(
            model_ref, attn_implementation=attn_implementation, **settings
        )
    except ValueError as error:  # no encoder weights of the family: the --model the user gave
        raise UserError(str(error)) from None


def config_model_type(model_ref: str) -> str | None:
    """The `model_type` of `model_ref`'s config.json (None when it names none); one line when there is no config."""
    try:
        return PreTrainedConfig.get_config_dict(model_ref)[0].get("model_type")
    except OSError as error:
        raise UserError(f"cannot read a model config from {model_ref}: {error}") from None


def override_text(value: str) -> str:
    """`--config-overrides` as "key=value,...": as given, or from a mapping in a `--config` file (which reaches the
    parser as a JSON object)."""
    try:
        mapping = json.loads(value)
    except ValueError:
        return value
    if not isinstance(mapping, dict):
        return value
    return ",".join(f"{key}={str(item).lower() if isinstance(item, bool) else item}" for key, item in mapping.items())


def scratch_model(model_ref: str, method: Method, settings: dict[str, Any], attn_implementation: str | None,
                  options: ModelArguments, tokenizer):
    """`--from-scratch`: the method's model with `model_ref`'s architecture (and `--config-overrides`), every weight
    random. With `--tokenizer`, `vocab_size` and `pad_token_id` are the tokenizer's unless the overrides set them."""
    overrides = [override_text(options.config_overrides)] if options.config_overrides else []
    given = {item.partition("=")[0].strip() for item in ",".join(overrides).split(",")}
    if options.tokenizer:
        overrides += [f"{key}={value}" for key, value in (("vocab_size", len(tokenizer)),
                                                          ("pad_token_id", tokenizer.pad_token_id))
                      if key not in given and value is not None]
    model_type = config_model_type(model_ref) or DEFAULT_ENCODER_TYPE
    if model_type not in SUPPORTED_ENCODER_TYPES:
        families = ", ".join(backbone.display_name for backbone in BACKBONES)
        raise UserError(f"--from-scratch takes the architecture of a {families} config; --model {model_ref} is a "
                        f"{model_type!r} one (export a retromae checkpoint first to reuse its architecture)")
    try:
        model = method.model_class.from_encoder_config(
            model_ref, attn_implementation=attn_implementation, architecture_overrides=",".join(overrides) or None,
            **settings,
        )
    except ValueError as error:  # a bad override, or sizes the architecture cannot take
        raise UserError(f"--from-scratch with --model {model_ref}: {error}") from None
    except (KeyError, TypeError, RuntimeError, ArithmeticError) as error:  # e.g. hidden_act=<unknown>
        raise UserError(f"--from-scratch with --model {model_ref}: the architecture cannot be built with "
                        f"--config-overrides {options.config_overrides!r} ({type(error).__name__}: {error})") from None
    config = model.config
    logger.info("From scratch: a random %s encoder, %d layers, hidden size %d, vocabulary %d (%.1f M parameters with "
                "the method's heads), the architecture of %s", backbone_of(config).display_name,
                config.num_hidden_layers, config.hidden_size, config.vocab_size, model.num_parameters() / 1e6, model_ref)
    return model


def unsupported_model_message(model_ref: str, model_type: str | None) -> str:
    """The one line that refuses a `--model` of an architecture retromae does not pre-train."""
    families = ", ".join(backbone.display_name for backbone in BACKBONES)
    return (f"--model {model_ref} is a {model_type!r} checkpoint; retromae pre-trains {families} masked-LM "
            f"checkpoints (model_type {', '.join(SUPPORTED_ENCODER_TYPES)}) and its own pre-training checkpoints")


# the vocabulary the default `loss_chunk_size` (4096 rows) was sized for: BERT's, fp32 logits chunks of ~500 MB
LOSS_CHUNK_VOCAB = 30522


def scale_loss_chunk(settings: dict[str, Any], method: Method, model_ref: str) -> None:
    """Without a `loss_chunk_size` from the user, a vocabulary larger than BERT's (XLM-R: 250,002) gets a default
    chunk scaled down so that chunk x vocab_size (the fp32 logits of one chunk) stays that of 4096 x 30,522."""
    field_ = method.config_fields.get("loss_chunk_size")
    if field_ is None or "loss_chunk_size" in settings:
        return
    try:
        vocab_size = PreTrainedConfig.get_config_dict(model_ref)[0].get("vocab_size")
    except OSError:  # refused with its own message when the model is loaded
        return
    if not isinstance(vocab_size, int) or vocab_size <= LOSS_CHUNK_VOCAB:
        return
    chunk = max(1, field_.default * LOSS_CHUNK_VOCAB // vocab_size)
    settings["loss_chunk_size"] = chunk
    logger.info("loss_chunk_size %d (default %d scaled to the %d-token vocabulary: %d x %d logits per chunk; set it "
                "with --method-options '{\"loss_chunk_size\": N}')", chunk, field_.default, vocab_size, chunk,
                vocab_size)


def check_special_tokens(tokenizer, tokenizer_ref: str) -> None:
    """Refuse, in one line naming the folder, a tokenizer without the mask and pad tokens that masking and padding
    need (the collator would stop with a traceback), or one whose first token is not a special token: position 0
    is the sentence embedding, and an ordinary token there would be masked and trained as a word."""
    missing = [name for name in ("mask_token", "pad_token") if getattr(tokenizer, f"{name}_id", None) is None]
    if missing:
        raise UserError(f"the tokenizer in {tokenizer_ref} has no {' and no '.join(missing)}, which pre-training needs; "
                        f"set {' and '.join(missing)} in its tokenizer_config.json to a token of its vocabulary (BERT: "
                        "[MASK], [PAD]; RoBERTa: <mask>, <pad>), or pass --tokenizer with a tokenizer that has both")
    first = tokenizer("hello world", add_special_tokens=True)["input_ids"][0]
    if first not in tokenizer.all_special_ids:
        raise UserError(f"the tokenizer in {tokenizer_ref} starts a text with {tokenizer.convert_ids_to_tokens(first)!r}, "
                        "not a special token, but position 0 is the sentence embedding; declare the token its "
                        "template puts first as cls_token in tokenizer_config.json (BERT: [CLS]; RoBERTa: <s>), give "
                        "it a template that starts with one, or pass --tokenizer")


# ---- the run --------------------------------------------------------------------------------------------------------


def resume_hint(output_dir: str) -> str:
    """The line for a run stopped by Ctrl-C: the command that resumes it from its newest checkpoint (a checkpoint is
    installed only when complete), or that there is none yet."""
    newest = last_complete_checkpoint(output_dir)
    if newest is None:
        return f"interrupted before the first checkpoint of {output_dir}; nothing to resume: run the command again"
    return (f"interrupted after {newest.name}; resume with: retromae pretrain --output-dir "
            f"{shlex.quote(os.fspath(output_dir))} --resume-from-checkpoint last")


def pretrain(argv: list[str]) -> int:
    """`retromae pretrain ARGS`: train, save the pre-training model (decoder included), export the encoder. The main
    process holds the output folder's lock (`core.lock`) from preparing the folder to the end. A finished run
    resumed trains nothing: it writes only what is missing of its final save and export."""
    run = pretrain_arguments(argv)
    args = run.training
    INTERRUPTED_HINT.set(functools.partial(resume_hint, args.output_dir))  # what `cli.main` says after a Ctrl-C
    configure_logging(args.get_process_log_level())
    set_seed(args.seed)
    if args.dataloader_pin_memory and args.device.type == "cpu":
        args.dataloader_pin_memory = False  # pinning needs an accelerator; torch warns on every DataLoader
    if run.data.streaming and args.max_steps <= 0:
        raise UserError("--streaming needs --max-steps (a streamed corpus has no length)")
    finished = finished_step(run.resume, args.max_steps) if run.resume else None
    check_folder_option("--output-dir", args.output_dir, writable=finished is None)  # a finished run may write nothing
    recorded = read_settings(run.resume) if run.resume and finished is None else None
    if recorded:  # a finished run reads no text: it only writes what is missing of its save and export
        check_text_unchanged(recorded, run.resume)
    if run.resume and finished is None:
        check_no_checkpoint_collision(args.output_dir, run.resume, args.max_steps)
    export_dir, overwrite_export = export_target(run)
    # Decided on every process before any process writes (reading the data is a barrier), so all take the same path.
    write_export = export_dir is not None and not (finished is not None and (export_dir / "modules.json").is_file())
    save_final = finished is None or not final_save_done(args.output_dir, finished)
    if write_export:
        check_export_target(export_dir, overwrite_export, run)
    validation = validation_callback(run) if finished is None else None  # a bad folder is refused before training
    if finished is not None:  # nothing to train or evaluate: the Trainer would want an evaluation set
        args.eval_strategy = IntervalStrategy.NO

    # a finished run with nothing missing writes nothing: it may read a read-only folder, without the lock
    writes = finished is None or save_final or write_export
    with folder_lock(args.output_dir, enabled=args.should_save, required=writes) as lock:
        prepare_output_dir(args.output_dir, run.run, run.resume, lock is not None, inputs=run_inputs(run))
        trainer, tokenizer, seconds = train_model(run, validation)
        if save_final:
            trainer.save_pretraining_model(args.output_dir)
        if write_export and args.should_save:
            export_from_model(trainer.accelerator.unwrap_model(trainer.model), tokenizer, export_dir,
                              run_info=trainer.current_run_info(), overwrite=overwrite_export)
        if trainer.is_world_process_zero():
            if validation is not None:
                plot_validation(trainer.state.log_history, Path(args.output_dir) / "validation.png")
            print_summary(trainer, args.output_dir, str(export_dir) if export_dir else None, seconds,
                          finished_checkpoint=run.resume if finished is not None else None)
    return 0


def validation_callback(run: PretrainRun) -> RetrievalValidationCallback | None:
    """The retrieval validation `--eval-beir-folder` asks for (None without it); reads the folder, so a folder
    without the split, qrels, corpus or queries is refused here, in one line."""
    options = run.validation
    if not options.eval_beir_folder:  # "" on resume turns a recorded folder off
        return None
    return RetrievalValidationCallback(  # every --eval-steps (the Trainer's), else --logging-steps
        options.eval_beir_folder, split=options.eval_split, max_queries=options.eval_max_queries,
        max_seq_length=run.data.max_seq_length, coverage=options.eval_coverage,
    )


def train_model(run: PretrainRun, validation: RetrievalValidationCallback | None = None
                ) -> tuple[RetroMAETrainer, Any, float]:
    """Build the method's model and data and train (a finished run's checkpoint is loaded, not trained further),
    with `validation` among the trainer's callbacks when given; returns the trainer, the tokenizer and the seconds
    the training took."""
    args = run.training
    method = get_method(run.model.method)
    model_ref = run.model.model or default_model_dir()
    resumed_info = read_json_or_empty(Path(run.resume) / RUN_INFO_NAME) if run.resume else {}
    # A resumed run continues its checkpoint's own model and tokenizer (same shape whatever --model holds now).
    scratch = run.model.from_scratch and not run.resume  # a resumed run's checkpoint holds its weights
    check_model_folder(run.resume or model_ref, purpose="--model", tokenizer=False,  # before its tokenizer is read
                       weights=not scratch)
    tokenizer_ref = run.resume or run.model.tokenizer or model_ref
    tokenizer = load_tokenizer(tokenizer_ref, hint=" (pass a local folder, or --tokenizer)")
    check_special_tokens(tokenizer, tokenizer_ref)
    inputs = DataInputs(
        corpus=run.data.corpus, text_format=run.data.text_format, max_seq_length=run.data.max_seq_length,
        packing=run.data.packing, streaming=run.data.streaming, pairs=run.data.pairs,
        global_batch_size=args.per_device_train_batch_size * args.world_size,
        contrastive_anchor=run.recipe.contrastive_anchor_weight > 0,
    )
    settings = method.config_settings(run.method_settings, inputs, tokenizer)
    scale_loss_chunk(settings, method, run.resume or model_ref)
    attention = attn_implementation_for(run.model.attn_implementation, args.device.type)
    if scratch:
        set_seed(args.seed)  # the same initial weights on every process and in every run of the same --seed
        model = scratch_model(model_ref, method, settings, attention, run.model, tokenizer)
    else:
        model = load_pretraining_model(run.resume or model_ref, method, settings, attention)
    if not run.resume and not run.model.from_scratch and args.should_log:  # the main process only
        suggest_recipe(model_ref, run.recipe)
    if run.model.extend_position_embeddings and not run.resume:  # a resumed run's checkpoint has the grown table
        extend_position_embeddings(model, tokenizer, run.model.extend_position_embeddings)
    check_model_and_tokenizer(model, tokenizer, inputs.max_seq_length, run.resume or model_ref, scratch)
    if fast_path_wanted(args.compile_layers, args.device):
        compile_layers(model)
    if fast_path_wanted(args.compile_loss, args.device):
        compile_loss(model)
    if args.pad_loss_vocab:
        pad_loss_vocab(model)
    with args.main_process_first(desc="reading and tokenizing the training data"):
        data = method.training_data(model.config, tokenizer, inputs)
    if data.drop_last and not args.dataloader_drop_last:
        logger.info("In-batch negatives: dropping the last incomplete batch of each epoch (dataloader_drop_last)")
        args.dataloader_drop_last = True

    base_name = run.model.base_model_name or resumed_info.get("base_model") or (
        public_name(run.model.model) or DEFAULT_BASE_MODEL_NAME
    )
    corpus_name = (run.data.corpus_name or data.corpus_name or resumed_info.get("corpus")
                   or public_name(run.data.corpus) or DEFAULT_CORPUS_NAME)
    run_info = {
        "method": method.name, "base_model": base_name, "corpus": corpus_name,
        "max_seq_length": inputs.max_seq_length, "packing": inputs.packing, "retromae_version": package_version(),
    }
    if run.model.from_scratch:  # no base model, only its architecture
        overrides = run.model.config_overrides
        run_info.update(base_model=None, initialisation={
            "from_scratch": True, "architecture_of": public_name(run.model.model) or DEFAULT_BASE_MODEL_NAME,
            "config_overrides": override_text(overrides) if overrides else None})
    trainer = RetroMAETrainer(
        model=model, args=args, train_dataset=data.dataset, data_collator=data.collator,
        processing_class=tokenizer, run_info=run_info, run_settings=run.settings, recipe=run.recipe,
        callbacks=[validation] if validation is not None else None,
    )
    started = time.time()
    trainer.train(resume_from_checkpoint=run.resume)
    return trainer, tokenizer, time.time() - started


def final_save_done(output_dir: str, step: int) -> bool:
    """Whether OUTPUT_DIR holds the final save of step `step` (`config.json` is installed last)."""
    info = read_json_or_empty(Path(output_dir) / RUN_INFO_NAME)
    return (Path(output_dir) / "config.json").is_file() and info.get("global_step") == step


def best_summary(trainer: RetroMAETrainer) -> str | None:
    """The summary line of the best checkpoint (`--metric-for-best-model`), or None without that option."""
    state, args = trainer.state, trainer.args
    if args.metric_for_best_model is None:
        return None
    if state.best_global_step is None or state.best_metric is None:
        return ("  best checkpoint: none (no evaluation at a saved step succeeded); the final save is the last "
                "step's")
    name = args.metric_for_best_model.removeprefix("eval_")
    where = ("; the final save and export are its weights" if args.load_best_model_at_end
             else "; the final save is the last step's (--load-best-model-at-end loads the best)")
    return (f"  best checkpoint: step {state.best_global_step}, {name} {state.best_metric:.4f} "
            f"({state.best_model_checkpoint}){where}")


def start_description(info: dict[str, Any]) -> str:
    """The starting weights of a run record: its base model, or random ones with a base's architecture."""
    start = info.get("initialisation") or {}
    if not start.get("from_scratch"):
        return str(info.get("base_model") or "not recorded")
    overrides = f", changed by {start['config_overrides']}" if start.get("config_overrides") else ""
    return f"random weights (--seed), with the architecture of {start.get('architecture_of')}{overrides}"


def checkpoint_extras(method: str) -> str:
    """What a method's pre-training checkpoint holds besides the encoder: its decoder, or (BoW: none) its heads."""
    return "decoder" if "num_decoder_layers" in get_method(method).config_fields else "heads"


def print_summary(trainer: RetroMAETrainer, output_dir: str, export_dir: str | None, seconds: float,
                  finished_checkpoint: str | None = None) -> None:
    """Where everything is, the first and last losses and accuracies, and an example encoding;
    `finished_checkpoint`: the run had already finished there (nothing trained now)."""
    info = trainer.current_run_info()
    first, final = info.get("first_losses", {}), info.get("final_losses", {})
    losses = ", ".join(f"{k} {first.get(k, float('nan')):.3f} -> {v:.3f}" for k, v in sorted(final.items()))
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    window = f"step {logged[0]['step']} -> step {logged[-1]['step']}" if logged else "none logged"
    accuracies = ", ".join(f"{k} {logged[0].get(k, float('nan')):.3f} -> {v:.3f}"
                           for k, v in sorted(logged[-1].items()) if k.endswith("_accuracy")) if logged else ""
    lines = [
        "",
        f"retromae: {info['method']} pre-training had already finished at step {info['global_step']} "
        f"({finished_checkpoint}); nothing was trained" if finished_checkpoint else
        f"retromae: {info['method']} pre-training finished: {info['global_step']} steps in {seconds / 60:.1f} min",
        f"  started from: {start_description(info)}",
        f"  losses ({window}): {losses}",
        *([f"  top-1 accuracies ({window}): {accuracies}"] if accuracies else []),
        f"  pre-training checkpoint ({checkpoint_extras(info['method'])} included): {output_dir}",
    ]
    validated = [line for line in (validation_summary(trainer.state.log_history), best_summary(trainer)) if line]
    lines[-1:-1] = validated
    if export_dir:
        # our own export, just written; DupMAE's carries its hybrid module as remote code
        encoder = SentenceTransformer(export_dir, trust_remote_code=True)
        example = "Dense retrievers encode text into vectors."
        vector = encoder.encode_document([example])[0]
        lines += [
            f"  sentence-transformers encoder: {export_dir}",
            f"  example: encode_document([{example!r}]) -> shape {tuple(vector.shape)}, "
            f"first values {[round(float(x), 4) for x in vector[:4]]}",
        ]
    print("\n".join(lines), flush=True)


__all__ = [
    "DEFAULT_BASE_MODEL_NAME", "DEMO_DEFAULTS", "DataArguments", "ModelArguments", "PretrainRun", "PretrainingArguments",
    "RunArguments", "ValidationArguments", "attn_implementation_for", "best_summary", "check_validation_options",
    "check_export_target", "check_special_tokens",
    "check_model_and_tokenizer", "export_target", "scale_loss_chunk", "unsupported_model_message", "final_save_done", "load_pretraining_model", "prepare_output_dir",
    "pretrain", "pretrain_arguments", "pretrain_parser",
    "print_summary", "resolve_resume", "run_inputs", "train_model", "validation_callback",
]
