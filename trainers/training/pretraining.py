"""Pre-training a model from resolved options: load or build it, apply the fast paths, train, summarise the best
checkpoint (the driver, `commands/pretrain.py`, saves the final model and exports it)."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

from retromae.modeling.backbones import BACKBONES, DEFAULT_ENCODER_TYPE, SUPPORTED_ENCODER_TYPES, backbone_of
from transformers import (
    PreTrainedConfig,
    set_seed,
)
from transformers.utils import is_flash_attn_2_available, is_flash_attn_3_available, is_kernels_available

from ..data.collator import DataInputs
from ..data.reading import read_corpus
from ..data.tokenize import saved_token_rows, shuffle_stream, tokenize_corpus
from ..data.tokenized_record import recorded_packing, write_tokenized_record
from ..inputs.checkpoints import load_tokenizer
from ..inputs.folders import check_model_folder, public_name
from ..inputs.io import read_json_or_empty
from ..inputs.outputs import atomic_folder
from ..inputs.pretrain_options import DEFAULT_BASE_MODEL_NAME, DEFAULT_CORPUS_NAME, ModelArguments, PretrainRun
from ..inputs.versions import package_version
from ..methods import METHODS, Method, get_method
from .fast_paths import compile_layers, compile_loss, fast_path_wanted, pad_loss_vocab, set_loss_kernel
from .positions import check_model_and_tokenizer, extend_position_embeddings
from .recipe import suggest_recipe
from .retrieval_validation import RetrievalValidationCallback
from .run_folder import RUN_INFO_NAME, remove_previous_run
from .sharding import check_sharding, keep_loaded_names, start_deepspeed_comm, without_zero3_init
from .trainer import RetroMAETrainer

logger = logging.getLogger(__name__)

# what a flash / flex --attn-implementation needs besides a GPU, for the error that refuses it
ATTENTION_REQUIREMENTS = {
    "flash_attention_2": ("flash-attn 2", "pip install flash-attn --no-build-isolation"),
    "flash_attention_3": ("FlashAttention 3 (flash_attn_interface)", "build it from flash-attention's hopper/ folder"),
}


def attn_implementation_for(choice: str, device_type: str) -> str | None:
    """`--attn-implementation` as `from_pretrained` takes it (None for auto), or a one-line `ValueError` when it cannot
    run here: flash and flex need a GPU (flex has no CPU backward), flash its package (or `kernels`, which
    transformers falls back to)."""
    if choice in ("auto", "eager", "sdpa"):
        return None if choice == "auto" else choice
    if device_type == "cpu":
        raise ValueError(f"--attn-implementation {choice} needs a GPU and this run is on the CPU; choose sdpa or eager")
    if choice in ATTENTION_REQUIREMENTS:
        installed = is_flash_attn_2_available if choice == "flash_attention_2" else is_flash_attn_3_available
        if not (installed() or is_kernels_available()):
            package, how = ATTENTION_REQUIREMENTS[choice]
            raise ValueError(f"--attn-implementation {choice} needs {package}, which is not installed: {how}, or "
                             "choose sdpa")
    return choice


def _report_decoder_continued(model_ref: str, info: dict[str, Any], settings: dict[str, Any]) -> None:
    """Warn when continuing a checkpoint drops trained decoder parts (fewer decoder layers), and when
    `--decoder-init copy_last_layer` has no new layer to start (the checkpoint's decoder continues)."""
    dropped = sorted({".".join(k.split(".")[:3]) for k in info["unexpected_keys"] if k.startswith("decoder.")})
    if dropped:
        logger.warning("%s holds trained decoder parts that this run's decoder lacks (fewer --num-decoder-layers?); "
                       "they are dropped: %s", model_ref, dropped)
    new_layers = any(k.startswith("decoder.layers.") for k in info["missing_keys"])
    if settings.get("decoder_init") == "copy_last_layer" and not new_layers:
        logger.warning("--decoder-init copy_last_layer starts new decoder layers only; %s has a trained decoder, "
                       "which continues as it is", model_ref)


def load_pretraining_model(
    model_ref: str, method: Method, settings: dict[str, Any], attn_implementation: str | None = None
):
    """A pre-training checkpoint of the same method continues (decoder included), as does one of a method listed in
    `method.continues_from` (SentMAE stage 2 continues a stage-1 `retromae` checkpoint); a BERT, RoBERTa, XLM-R or
    ModernBERT checkpoint starts fresh (`from_encoder_checkpoint`); any other architecture is refused in one line
    (`unsupported_model_message`). `attn_implementation` (from
    `attn_implementation_for`; None: transformers' default) is the encoder's."""
    refuse_other_architecture(model_ref)
    check_model_folder(model_ref, purpose="--model", tokenizer=False)  # e.g. a checkpoint of a run killed mid-save
    model_type = config_model_type(model_ref)
    ours = {m.model_class.config_class.model_type: m for m in METHODS.values()}
    if model_type in ours:
        if ours[model_type].name != method.name and model_type not in method.continues_from:
            raise ValueError(
                f"{model_ref} is a {ours[model_type].name!r} pre-training checkpoint but --method is {method.name!r}; "
                f"continue it with --method {ours[model_type].name}, or export it first (`retromae export`) and "
                f"start {method.name!r} from the exported encoder"
            )
        config = method.model_class.config_class.from_pretrained(model_ref, **settings)
        model, info = method.model_class.from_pretrained(model_ref, config=config, output_loading_info=True,
                                                         attn_implementation=attn_implementation)
        model.after_encoder_checkpoint_loaded(set(info["missing_keys"]))  # e.g. a decoder grown by a layer
        _report_decoder_continued(model_ref, info, settings)
        return model
    if (model_type or DEFAULT_ENCODER_TYPE) not in SUPPORTED_ENCODER_TYPES:
        raise ValueError(unsupported_model_message(model_ref, model_type))
    try:
        return method.model_class.from_encoder_checkpoint(
            model_ref, attn_implementation=attn_implementation, **settings
        )
    except ValueError as error:  # no encoder weights of the family: the --model the user gave
        raise ValueError(str(error)) from None


def config_model_type(model_ref: str) -> str | None:
    """The `model_type` of `model_ref`'s config.json (None when it names none); one line when there is no config."""
    try:
        return PreTrainedConfig.get_config_dict(model_ref)[0].get("model_type")
    except OSError as error:
        raise ValueError(f"cannot read a model config from {model_ref}: {error}") from None


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
    given = {key.strip(): value.strip()
             for key, _, value in (item.partition("=") for item in ",".join(overrides).split(","))}
    if options.tokenizer:
        for key, value in (("vocab_size", len(tokenizer)), ("pad_token_id", tokenizer.pad_token_id)):
            if key not in given and value is not None:
                overrides.append(f"{key}={value}")
                given[key] = str(value)
    vocab = given.get("vocab_size", "")
    if vocab.isdigit() and int(vocab) < len(tokenizer):  # before the config, which would refuse the mask id first
        raise ValueError(f"--config-overrides vocab_size={vocab} is smaller than the tokenizer ({len(tokenizer)} "
                         "tokens); raise vocab_size in --config-overrides (or drop it)")
    model_type = config_model_type(model_ref) or DEFAULT_ENCODER_TYPE
    if model_type not in SUPPORTED_ENCODER_TYPES:
        families = ", ".join(backbone.display_name for backbone in BACKBONES)
        raise ValueError(f"--from-scratch takes the architecture of a {families} config; --model {model_ref} is a "
                         f"{model_type!r} one (export a retromae checkpoint first to reuse its architecture)")
    try:
        with without_zero3_init():  # the initial weights of an unsharded run; the engine partitions them
            model = method.model_class.from_encoder_config(
                model_ref, attn_implementation=attn_implementation,
                architecture_overrides=",".join(overrides) or None, **settings,
            )
    except ValueError as error:  # a bad override, or sizes the architecture cannot take
        raise ValueError(f"--from-scratch with --model {model_ref}: {error}") from None
    except (KeyError, TypeError, RuntimeError, ArithmeticError) as error:  # e.g. hidden_act=<unknown>
        raise ValueError(f"--from-scratch with --model {model_ref}: the architecture cannot be built with "
                         f"--config-overrides {options.config_overrides!r} ({type(error).__name__}: {error})") from None
    config = model.config
    logger.info("From scratch: a random %s encoder, %d layers, hidden size %d, vocabulary %d (%.1f M parameters with "
                "the method's heads), the architecture of %s", backbone_of(config).display_name,
                config.num_hidden_layers, config.hidden_size, config.vocab_size, model.num_parameters() / 1e6, model_ref)
    return model


def refuse_other_architecture(model_ref: str) -> None:
    """Refuse a local folder whose config.json names an architecture retromae does not pre-train, before its other
    files are checked: such a folder without weights is not a half-saved model of ours."""
    config = read_json_or_empty(Path(model_ref).expanduser() / "config.json")  # unreadable: check_model_folder says so
    model_type = config.get("model_type")
    if not config or model_type in {m.model_class.config_class.model_type for m in METHODS.values()}:
        return
    if (model_type or DEFAULT_ENCODER_TYPE) not in SUPPORTED_ENCODER_TYPES:
        raise ValueError(unsupported_model_message(model_ref, model_type))


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


def tokenizer_flag(run: PretrainRun, tokenizer_ref: str) -> str:
    """The flag that named the tokenizer folder `tokenizer_ref`, for its load errors."""
    if tokenizer_ref == run.resume:
        return "--resume-from-checkpoint"
    return "--tokenizer" if tokenizer_ref == run.model.tokenizer else "--model"


def _refuse_foreign_tokenizer(tokenizer, tokenizer_ref: str, model_ref: str) -> None:
    """Refuse a --tokenizer that uses under half of the model's embedding rows: most likely another model's, whose
    ids mean other words to these weights (the trainer only warns, for a model and tokenizer built in Python)."""
    rows = read_json_or_empty(Path(model_ref).expanduser() / "config.json").get("vocab_size")
    if isinstance(rows, int) and len(tokenizer) < rows / 2:
        raise ValueError(f"--tokenizer {tokenizer_ref} has {len(tokenizer)} tokens but --model {model_ref} has {rows} "
                         "embedding rows: most likely another model's tokenizer, whose ids mean other words to these "
                         "weights; drop --tokenizer to use the model's own, or pass --from-scratch true to train new "
                         "weights for this tokenizer")


def _check_special_tokens(tokenizer, tokenizer_ref: str) -> None:
    """Refuse, in one line naming the folder, a tokenizer without the mask and pad tokens that masking and padding
    need (the collator would stop with a traceback), or one whose first token is not a special token: position 0
    is the sentence embedding, and an ordinary token there would be masked and trained as a word."""
    missing = [name for name in ("mask_token", "pad_token") if getattr(tokenizer, f"{name}_id", None) is None]
    if missing:
        raise ValueError(f"the tokenizer in {tokenizer_ref} has no {' and no '.join(missing)}, which pre-training needs; "
                         f"set {' and '.join(missing)} in its tokenizer_config.json to a token of its vocabulary (BERT: "
                         "[MASK], [PAD]; RoBERTa: <mask>, <pad>), or pass --tokenizer with a tokenizer that has both")
    first = tokenizer("hello world", add_special_tokens=True)["input_ids"][0]
    if first not in tokenizer.all_special_ids:
        raise ValueError(f"the tokenizer in {tokenizer_ref} starts a text with {tokenizer.convert_ids_to_tokens(first)!r}, "
                         "not a special token, but position 0 is the sentence embedding; declare the token its "
                         "template puts first as cls_token in tokenizer_config.json (BERT: [CLS]; RoBERTa: <s>), give "
                         "it a template that starts with one, or pass --tokenizer")


def save_tokenized_corpus(run: PretrainRun, folder: Path, overwrite: bool) -> int:
    """Reads and tokenizes `run`'s corpus as its training would (its tokenizer, --max-seq-length, --packing,
    --tokenize-workers) and saves it as a `datasets` folder at `folder`, atomically, with the record of its tokenizer,
    length and packing (`write_tokenized_record`) that training from it checks; returns its sequences.

    Raises:
        ValueError: --streaming or --pairs (a saved corpus is a whole `Dataset` of one text).
    """
    data = run.data
    for flag, given in (("--streaming", data.streaming), ("--pairs", data.pairs)):
        if given:
            raise ValueError(f"--save-tokenized writes one tokenized corpus from --corpus; drop {flag}")
    if saved_token_rows(data.corpus, data.text_column) is not None:
        raise ValueError(f"--corpus {data.corpus} is already tokenized: train from it as it is (drop "
                         "--save-tokenized), or give the text to tokenize again")
    tokenizer_ref = run.model.tokenizer or run.model_ref
    tokenizer = load_tokenizer(tokenizer_ref, purpose=tokenizer_flag(run, tokenizer_ref))
    _check_special_tokens(tokenizer, tokenizer_ref)
    texts = read_corpus(data.corpus, text_format=data.text_format, text_column=data.text_column,
                        config=data.corpus_config, split=data.corpus_split, revision=data.corpus_revision)
    tokenized = tokenize_corpus(texts, tokenizer, max_seq_length=data.max_seq_length, packing=data.packing,
                                num_proc=data.tokenize_workers)
    with atomic_folder(folder, overwrite=overwrite) as build:
        tokenized.save_to_disk(str(build))
        write_tokenized_record(build, tokenizer, max_seq_length=data.max_seq_length, packing=data.packing)
    return len(tokenized)


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


class HeldLogs:
    """Holds back the log records reaching the root logger's handlers inside the `with` block, until `release`
    replays them in order (never, if the run stops before)."""

    def __init__(self) -> None:
        self.records: list[logging.LogRecord] = []
        self.handlers: list[logging.Handler] = []

    def _hold(self, record: logging.LogRecord) -> bool:
        if not any(record is held for held in self.records):  # once, whichever handler sees it first
            self.records.append(record)
        return False

    def __enter__(self) -> HeldLogs:
        self.handlers = list(logging.getLogger().handlers)
        for handler in self.handlers:
            handler.addFilter(self._hold)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for handler in self.handlers:
            handler.removeFilter(self._hold)

    def release(self) -> None:
        for record in self.records:
            logging.getLogger(record.name).handle(record)
        self.records = []


def _build_model(run: PretrainRun, method: Method, settings: dict[str, Any], tokenizer: Any, max_seq_length: int):
    """The model `run` trains: loaded (or built, `--from-scratch`), its positions grown, checked against the
    tokenizer, with the fast paths `run`'s TrainingArguments ask for."""
    args, model_ref, scratch = run.training, run.model_ref, run.builds_from_scratch
    attention = attn_implementation_for(run.model.attn_implementation, args.device.type)
    if scratch:
        set_seed(args.seed)  # the same initial weights on every process and in every run of the same --seed
        model = scratch_model(model_ref, method, settings, attention, run.model, tokenizer)
    else:
        model = load_pretraining_model(run.resume or model_ref, method, settings, attention)
    keep_loaded_names(model)  # ZeRO-3 only
    if not run.resume and not run.model.from_scratch and args.should_log:  # the main process only
        suggest_recipe(model_ref, run.recipe)
    if run.model.extend_position_embeddings and not run.resume:  # a resumed run's checkpoint has the grown table
        extend_position_embeddings(model, tokenizer, run.model.extend_position_embeddings)
    check_model_and_tokenizer(model, tokenizer, max_seq_length, run.resume or model_ref, scratch)
    if fast_path_wanted(args.compile_layers, args.device):
        compile_layers(model)
    set_loss_kernel(model, args.loss_kernel)
    chunked = args.loss_kernel == "chunked"  # the kernel the next two paths tune
    if chunked and fast_path_wanted(args.compile_loss, args.device):
        compile_loss(model)
    if chunked and fast_path_wanted(args.pad_loss_vocab, args.device):
        pad_loss_vocab(model)
    return model


def train_model(run: PretrainRun, validation: RetrievalValidationCallback | None = None, *,
                replace_earlier_run: bool = False) -> tuple[RetroMAETrainer, Any, float]:
    """Build the method's model and data and train (a finished run's checkpoint is loaded, not trained further),
    with `validation` among the trainer's callbacks when given; returns the trainer, the tokenizer and the seconds
    the training took. `replace_earlier_run`: delete the earlier run in --output-dir (`remove_previous_run`) once
    the model and data are built, before training."""
    args = run.training
    check_sharding(args, validation=validation is not None, head_warmup=run.recipe.head_warmup_steps > 0,
                   recipe_groups=run.recipe.changes_optimizer,  # before any weight is read
                   grow_positions=bool(run.model.extend_position_embeddings) and not run.resume)
    start_deepspeed_comm(args)  # before from_pretrained partitions the model (ZeRO-3)
    method = get_method(run.model.method)
    model_ref, scratch = run.model_ref, run.builds_from_scratch
    resumed_info = read_json_or_empty(Path(run.resume) / RUN_INFO_NAME) if run.resume else {}
    # A resumed run continues its checkpoint's own model and tokenizer (same shape whatever --model holds now).
    if not run.resume and not scratch:  # --from-scratch names the architectures it takes itself
        refuse_other_architecture(model_ref)
    check_model_folder(run.resume or model_ref, purpose="--resume-from-checkpoint" if run.resume else "--model",
                       tokenizer=False, weights=not scratch)  # before its tokenizer is read
    tokenizer_ref = run.resume or run.model.tokenizer or model_ref
    tokenizer = load_tokenizer(tokenizer_ref, purpose=tokenizer_flag(run, tokenizer_ref))
    _check_special_tokens(tokenizer, tokenizer_ref)
    if run.model.tokenizer and not run.resume and not scratch:
        _refuse_foreign_tokenizer(tokenizer, run.model.tokenizer, model_ref)
    inputs = DataInputs(
        corpus=run.data.corpus, text_format=run.data.text_format, max_seq_length=run.data.max_seq_length,
        packing=run.data.packing, streaming=run.data.streaming, pairs=run.data.pairs,
        global_batch_size=args.per_device_train_batch_size * args.world_size, drop_last=args.dataloader_drop_last,
        text_column=run.data.text_column, corpus_config=run.data.corpus_config, corpus_split=run.data.corpus_split,
        corpus_revision=run.data.corpus_revision,
        contrastive_anchor=run.recipe.contrastive_anchor_weight > 0, tokenize_workers=run.data.tokenize_workers,
    )
    if inputs.tokenize_workers is not None and inputs.tokenize_workers < 1:
        raise ValueError(f"--tokenize-workers {inputs.tokenize_workers}: give 1 or more processes")
    if run.data.shuffle_buffer < 0:
        raise ValueError(f"--shuffle-buffer {run.data.shuffle_buffer}: give a number of sequences, 0 to keep the file "
                         "order")
    if args.loss_kernel == "cce_filtered" and args.device.type != "cuda":
        raise ValueError("--loss-kernel cce_filtered filters in cut-cross-entropy's CUDA kernels only; on "
                         f"{args.device.type}, use --loss-kernel cce (exact) or chunked")
    settings = method.config_settings(run.method_settings, inputs, tokenizer)
    scale_loss_chunk(settings, method, run.resume or model_ref)
    with HeldLogs() as model_advice:  # printed once the data checks below pass: a refusal comes alone
        model = _build_model(run, method, settings, tokenizer, inputs.max_seq_length)
    with args.main_process_first(desc="reading and tokenizing the training data"):
        data = method.training_data(model.config, tokenizer, inputs)
    model_advice.release()
    # a stream is read through a seeded shuffle buffer (a Dataset is shuffled by the Trainer's sampler)
    data = dataclasses.replace(data, dataset=shuffle_stream(
        data.dataset, run.data.shuffle_buffer, args.data_seed if args.data_seed is not None else args.seed))
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
        "max_seq_length": inputs.max_seq_length, "packing": inputs.packing or recorded_packing(inputs.corpus),
        "retromae_version": package_version(),
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
    if replace_earlier_run:
        remove_previous_run(args.output_dir)
    started = time.time()
    trainer.train(resume_from_checkpoint=run.resume)
    return trainer, tokenizer, time.time() - started


def final_save_done(output_dir: str, step: int) -> bool:
    """Whether OUTPUT_DIR holds the final save of step `step` (`config.json` is installed last)."""
    info = read_json_or_empty(Path(output_dir) / RUN_INFO_NAME)
    return (Path(output_dir) / "config.json").is_file() and info.get("global_step") == step


def best_summary(trainer: RetroMAETrainer, exported: bool) -> str | None:
    """The summary line of the best checkpoint (`--metric-for-best-model`), or None without that option; `exported`:
    the run wrote an export."""
    state, args = trainer.state, trainer.args
    if args.metric_for_best_model is None:
        return None
    if state.best_global_step is None or state.best_metric is None:
        return ("  best checkpoint: none (no evaluation at a saved step succeeded); the final save is the last "
                "step's")
    name = args.metric_for_best_model.removeprefix("eval_")
    where = (f"; the final save{' and export are' if exported else ' is'} its weights" if args.load_best_model_at_end
             else "; the final save is the last step's (--load-best-model-at-end loads the best)")
    return (f"  best checkpoint: step {state.best_global_step}, {name} {state.best_metric:.4f} "
            f"({state.best_model_checkpoint}){where}")


def checkpoint_extras(method: str) -> str:
    """What a method's pre-training checkpoint holds besides the encoder: its decoder, or (BoW: none) its heads."""
    return "decoder" if "num_decoder_layers" in get_method(method).config_fields else "heads"


__all__ = [
    "attn_implementation_for", "best_summary", "scale_loss_chunk", "unsupported_model_message",
    "final_save_done", "load_pretraining_model", "train_model", "validation_callback"
]
