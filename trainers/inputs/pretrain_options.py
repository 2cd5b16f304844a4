"""`retromae pretrain`'s options: the argument groups, the parser, and the checks that resolve them once (resume,
output folder, export target)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from retromae.modeling.vocab_losses import LOSS_KERNELS
from transformers import TrainingArguments

from ..data.reading import check_text_format_applies
from ..methods import DEFAULT_METHOD, METHODS, MethodArguments
from ..retrieval.metrics import metric_names
from ..training.positions import check_extension_length
from ..training.recipe import RecipeArguments
from ..training.resume import (
    check_given_options,
    given_options,
    new_run_id,
    read_settings,
    record_settings,
)
from ..training.run_folder import (
    RESUME_LAST,
    checkpoint_to_resume,
    resume_state_problem,
)
from .arguments import CommandParser, DefaultsHelpFormatter, expand_home, parse
from .checkpoints import default_model_dir
from .config_files import config_argument, merge_file_mappings, split_config
from .errors import UserError
from .folders import TRAINER_CHECKPOINT
from .outputs import check_folder_option, claim_output, model_holding

logger = logging.getLogger(__name__)

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
                  ".jsonl file with a `text` field (+ `title`) or a .parquet file with a `text` column (.txt and .jsonl "
                  "also compressed: .gz, .bz2, .xz, .zst), a BEIR folder, a `datasets` folder or Hub name, or a folder "
                  "of such files. Default: a small built-in corpus (Python standard-library docstrings)."},
    )
    corpus_name: str | None = field(default=None, metadata={"help": "corpus name for the model card (default: file name)"})
    text_format: Literal["auto", "lines", "blocks"] = field(
        default="auto", metadata={"help": "how a .txt corpus is split into passages"}
    )
    text_column: str = field(
        default="text",
        metadata={"help": "the passage field of a .jsonl or .parquet corpus (a string `title` is prepended) or the "
                  "passage column of a `datasets` folder or Hub dataset"},
    )
    corpus_config: str | None = field(default=None, metadata={"help": "a Hub --corpus's configuration (subset)"})
    corpus_split: str | None = field(
        default=None, metadata={"help": "the split of a Hub --corpus (default: train) or of a saved DatasetDict"}
    )
    corpus_revision: str | None = field(
        default=None, metadata={"help": "a Hub --corpus's revision (branch, tag or commit)"}
    )
    max_seq_length: int = field(default=256, metadata={"help": "tokens per sequence, [CLS]/[SEP] included"})
    packing: bool = field(default=False, metadata={"help": "concatenate passages into full-length blocks"})
    streaming: bool = field(default=False, metadata={"help": "stream the corpus (larger than memory); needs --max-steps"})
    shuffle_buffer: int = field(
        default=10_000,
        metadata={"help": "--streaming: sequences in the shuffle buffer, seeded by --data-seed (else --seed) and "
                  "reshuffled every epoch; 0 reads the stream in file order"},
    )
    tokenize_workers: int | None = field(
        default=None,
        metadata={"help": "processes that tokenize a corpus of more than 10,000 passages (default: min(4, CPUs); 1: "
                  "this process only)"},
    )
    save_tokenized: str | None = field(
        default=None,
        metadata={"help": "tokenize the corpus once (with --packing, packed) into this folder and stop, without "
                  "training; any later run of any method trains from it with --corpus FOLDER. An existing folder is "
                  "replaced only with --overwrite-output-dir"},
    )
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
    stream_resume: str = field(
        default="state",
        metadata={"help": "--streaming: where a resumed run continues. `state`: at the stream position saved in the "
                  "checkpoint, reading nothing twice (the rows in the shuffle buffer at the checkpoint are skipped "
                  "for that epoch, so with --shuffle-buffer > 0 the rows after it differ from an unbroken run's; "
                  "one process only, needs torchdata); `replay`: reads and skips the stream up to the checkpoint "
                  "(the unbroken run's rows)", "choices": ["state", "replay"]},
    )
    pad_loss_vocab: bool | None = field(
        default=None,
        metadata={"help": "pad the vocabulary inside the vocabulary losses to a multiple of 64 (aligned matrix "
                  "products; the same losses within rounding); default: on when training on CUDA"},
    )
    loss_kernel: str = field(
        default="chunked",
        metadata={"help": "the vocabulary losses' kernel. `chunked`: ours, logits in chunks of rows; `cce`: the "
                  "cut-cross-entropy package (pip install cut-cross-entropy; logits never stored, its Triton kernels "
                  "on CUDA); `cce_filtered`: cce whose backward skips softmax entries below bf16 resolution / 32 "
                  "(CUDA only; not exact)", "choices": list(LOSS_KERNELS)},
    )


@dataclass
class PretrainRun:
    """`retromae pretrain`'s parsed options, the checkpoint it resumes from (or None) and the settings it records
    in its checkpoints (`training.resume.record_settings`)."""

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

    @property
    def model_ref(self) -> str:
        """--model, or the embedded default model's folder."""
        return self.model.model or default_model_dir()

    @property
    def builds_from_scratch(self) -> bool:
        """Whether the weights are initialised here: --from-scratch, not resumed (a checkpoint holds its weights)."""
        return self.model.from_scratch and not self.resume


class RecordingParser(CommandParser):
    """A `CommandParser` that keeps the namespace of its last parse: every option as the run uses it, before the
    dataclasses convert it (what `training.resume.record_settings` records)."""

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
        prog="retromae pretrain", presets=True,
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
    given option may only repeat them (or be one that may change, `training.resume.MAY_CHANGE`). Nothing is written:
    the output folder is prepared by `pretrain` under its lock (`prepare_output_dir`)."""
    flags, file_values = split_config(argv)
    if {"-h", "--help"} & set(flags):  # the full parser prints the help (with --config) and exits
        parse(pretrain_parser(), argv)
    parser = pretrain_parser()
    merged = merge_file_mappings(parser, flags, file_values, log=False)
    given = {**expand_home(file_values), **given_options(parser, merged)}  # `~` as the full parse expands it
    demo = not {"corpus", "pairs"} & given.keys() and flags == argv  # no --config
    defaults = DEMO_DEFAULTS if demo else {}
    output_dir = given.get("output_dir", defaults.get("output_dir", _field_default(PretrainingArguments, "output_dir")))
    if given.get("no_export") and (given.get("export_dir") or given.get("overwrite_export")):
        flag = "--export-dir" if given.get("export_dir") else "--overwrite-export"
        raise UserError(f"{flag} sets an export that --no-export true skips; drop one of them")
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
    _check_options_read(given, data, run)
    _check_validation_options(training, validation, model.method, set(given))
    _check_from_scratch_options(model)
    _check_loss_kernel(training)
    check_extension_length(model.extend_position_embeddings, data.max_seq_length)
    settings = record_settings(parser.namespace, recorded["run_id"] if recorded else new_run_id())
    found = config_argument(argv)
    return PretrainRun(model, method_settings, data, run, training, recipe, resume, settings, validation,
                       found[2] if found else None)


def _check_loss_kernel(training: PretrainingArguments) -> None:
    """Refuse, in one line, the chunked kernel's flags with another `--loss-kernel`, and a cce kernel without its
    package."""
    if training.loss_kernel == "chunked":
        return
    for flag in ("compile_loss", "pad_loss_vocab"):
        if getattr(training, flag):
            raise UserError(f"--{flag.replace('_', '-')} tunes the chunked loss kernel; drop it with --loss-kernel "
                            f"{training.loss_kernel}")
    if importlib.util.find_spec("cut_cross_entropy") is None:
        raise UserError(f"--loss-kernel {training.loss_kernel} needs the cut-cross-entropy package: pip install "
                        "cut-cross-entropy (or use --loss-kernel chunked)")


def _check_from_scratch_options(model: ModelArguments) -> None:
    """Refuse, in one line, options that need or contradict `--from-scratch`."""
    if model.config_overrides and not model.from_scratch:
        raise UserError("--config-overrides changes the architecture, which a checkpoint's weights fix: add "
                        "--from-scratch true to initialise the model randomly")
    if model.extend_position_embeddings and model.from_scratch:
        raise UserError("--extend-position-embeddings copies a trained position table; from scratch, size it with "
                        "--config-overrides max_position_embeddings=N")


def _check_validation_options(training: PretrainingArguments, validation: ValidationArguments, method: str,
                              given: set[str]) -> None:
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
            *((f"--{name.replace('_', '-')}", name in given or getattr(validation, name) != getattr(defaults, name))
              for name in ("eval_split", "eval_max_queries", "eval_coverage"))) if used]
        if stray:
            verb = "configures" if len(stray) == 1 else "configure"
            raise UserError(f"{', '.join(stray)} {verb} the validation, which needs --eval-beir-folder FOLDER (a "
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
    when OUTPUT_DIR holds checkpoints of several runs, `training.run_folder.checkpoint_to_resume`)."""
    if resume in RESUME_LAST:
        found = checkpoint_to_resume(output_dir)
        if found is None:
            raise UserError(f"--resume-from-checkpoint {resume}: no complete checkpoint in {output_dir}")
        resume = str(found)
    elif resume and not Path(resume).is_dir():
        raise UserError(f"--resume-from-checkpoint {resume}: no such folder; give a checkpoint-N folder, or 'last' "
                        "for the newest in --output-dir")
    elif resume and not (Path(resume) / "trainer_state.json").is_file():
        raise UserError(f"--resume-from-checkpoint {resume}: not a complete checkpoint folder (no trainer_state.json)")
    problem = resume and resume_state_problem(Path(resume))
    if problem:
        raise UserError(problem)
    return resume


def run_inputs(run: PretrainRun) -> dict[str, str | None]:
    """What the run reads (description -> path, None when not given): neither its export nor
    --overwrite-output-dir may delete it."""
    return {"the corpus": run.data.corpus, "the pairs file": run.data.pairs, "the model": run.model.model,
            "the tokenizer": run.model.tokenizer, "the --eval-beir-folder": run.validation.eval_beir_folder,
            "the --config file": run.config_file}


def export_target(run: PretrainRun) -> tuple[Path | None, bool]:
    """Where the encoder is exported (None with --no-export) and whether a non-empty folder there may be replaced:
    the default OUTPUT_DIR/encoder is the run's own; another --export-dir only with --overwrite-export."""
    if run.run.no_export:
        return None, False
    own = Path(run.training.output_dir) / "encoder"
    target = Path(run.run.export_dir) if run.run.export_dir else own
    check_folder_option("--export-dir", target, writable=False)  # a symlink loop: before resolve() raises on it
    return target, run.run.overwrite_export or target.resolve() == own.resolve()


def _check_options_read(given: dict[str, Any], data: DataArguments, run: RunArguments) -> None:
    """Refuse a given option that nothing of this run reads (it would be accepted and ignored)."""
    for name in ("shuffle_buffer", "stream_resume"):
        if name in given and not data.streaming:
            raise UserError(f"--{name.replace('_', '-')} applies to a streamed corpus: add --streaming true, or drop "
                            "it")
    if given.get("overwrite_export") and not run.export_dir:
        raise UserError("--overwrite-export applies to an --export-dir of your own: the default (OUTPUT_DIR/encoder) "
                        "is the run's and each run there replaces it; drop the flag, or name the --export-dir")
    if "text_format" in given:  # not a resumed run's recorded value, which the user cannot drop
        check_text_format_applies(data.text_format, data.corpus)


def check_export_target(target: Path, overwrite: bool, run: PretrainRun) -> None:
    """`claim_output` for the export folder, before training: the export replaces its whole folder, so besides the
    run's inputs it may not delete the working directory, the output folder or one of its checkpoints (which may
    not exist yet)."""
    output, resolved = Path(run.training.output_dir).resolve(), target.resolve()
    top = resolved.relative_to(output).parts[0] if output in resolved.parents else ""  # its entry in OUTPUT_DIR
    made = {"the output folder": output}
    if TRAINER_CHECKPOINT.match(top):
        made["a checkpoint of this run"] = output / top
    default = resolved == output / "encoder"  # suggesting it again would not help
    flag = "the default --export-dir" if default else "--export-dir"
    fix = ("move it out of that folder, or pass another --export-dir (or --no-export)" if default else
           f"choose another --export-dir, e.g. {output / 'encoder'} (the default)")
    claim_output(target, flag, overwrite, inputs=run_inputs(run), planned=made, overwrite_flag="--overwrite-export",
                 fix=fix, owner=model_holding)


__all__ = [
    "DEFAULT_BASE_MODEL_NAME", "DEMO_DEFAULTS", "DataArguments", "ModelArguments", "PretrainRun",
    "PretrainingArguments", "RunArguments", "ValidationArguments", "check_export_target", "export_target",
    "pretrain_arguments", "pretrain_parser", "resolve_resume", "run_inputs"
]
