"""`RetroMAETrainer`: the HF Trainer for every pre-training method of this package.

- logs each loss term (`*_loss`) averaged over the window and processes, and each cross-entropy term's top-1
  accuracy on logged steps; a callback's `pop_logs()` joins the next log entry (retrieval validation);
- masks in the training process (DataLoader workers only pad), one generator per process seeded from
  `(seed, process_index)`; an evaluation's from a second generator and a fork of torch's global RNG, re-seeded;
- checkpoints are atomic, full `save_pretrained` folders with the run record, the masking generator's state and a
  stream's position (`stream_loader`), so a resume continues exactly, as the same run (its run id); resuming reads
  safetensors, JSON and `weights_only` torch files only; rotation deletes this run's checkpoints only, and a run
  whose saves could replace another run's is refused (`run_folder`); under sharding the weights are gathered first;
- registers the callbacks a method needs, always logs the last step, applies the recipe's parameter groups and
  head warm-up (`recipe.py`);
- refuses on construction, in one line, what does not fit together: a model that is no pre-training model, bad
  training arguments, an untokenized dataset, a collator of another tokenizer (or mask id), a tokenizer or rows the
  model cannot embed.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
from pathlib import Path
from typing import Any

import datasets
import torch
from accelerate.utils import broadcast_object_list
from retromae.modeling.configuration_retromae import hides_whole_words
from safetensors.torch import load_file, save_file
from transformers import PreTrainedTokenizerBase, Trainer
from transformers.trainer_callback import TrainerState
from transformers.trainer_optimizer import is_optimizer_factory
from transformers.trainer_utils import SaveStrategy, TrainOutput

from ..data.collator import UNMASKED_KEY, PretrainingCollator, masking_generator
from ..data.dataset_checks import check_pretraining_inputs, check_same_tokenizer, check_tokenized, longest_sequence
from ..data.token_rows import array_rows
from ..export.cards import record_value
from ..inputs.io import write_json_atomic
from ..inputs.training_checks import check_training_arguments
from .atomic_checkpoints import AtomicCheckpoints
from .divergence import divergence_on_any_process
from .positions import check_model_and_tokenizer
from .processes import seed_processes_apart
from .recipe import (
    HeadWarmupCallback,
    RecipeArguments,
    add_contrastive_anchor,
    encoder_parameters,
    merge_pairs,
    parameter_groups,
)
from .resume import RESUME_FILE, new_run_id, record_settings, run_id_of, seeded_rng
from .run_folder import (
    FINAL_BUILD_NAME,
    RUN_INFO_NAME,
    TRAINER_STATE_NAME,
    check_replaceable,
    claim_checkpoints,
    finished_step,
    install_files,
    last_complete_checkpoint,
    list_checkpoints,
    resume_target,
)
from .schedules import LogLastStepCallback, logs_at_step, schedule_callbacks
from .sharding import full_state_dict, is_sharded
from .stream_loader import (
    ResumedPassEpoch,
    keep_stream_position,
    pass_ended,
    rank_stream_loader,
    save_stream_position,
    saved_stream_position,
    stream_pass_position,
)

logger = logging.getLogger(__name__)


_RUN_INFO_TRAINING_KEYS = (
    "learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps", "max_steps", "num_train_epochs",
    "warmup_steps", "weight_decay", "seed", "lr_scheduler_type",
)


class RetroMAETrainer(AtomicCheckpoints, Trainer):
    """Trainer for `*ForPretraining` models.

    Args:
        run_info: what the run was (method, base model, corpus, lengths); written to every checkpoint as
            `retromae_run.json` and used by the model card. Must not contain local paths.
        run_settings: what resuming restores (`resume.record_settings`), written to every checkpoint as
            `retromae_resume.json`; its `run_id` marks the checkpoints checkpoint rotation may delete (default: a
            fresh id and no settings; resuming, the checkpoint's, so the run goes on under its id).
        recipe: the continued-pre-training recipe (`recipe.RecipeArguments`); default: off.
        Other arguments as `transformers.Trainer`. A `PretrainingCollator` data collator is split: its `pad` runs
        in the DataLoader (so `trainer.data_collator` is that bound method), its `mask_batch` in `training_step`
        and `prediction_step`, drawing from the trainer's generators (its own `generator` is not used).
    """

    def __init__(self, *args, run_info: dict[str, Any] | None = None, run_settings: dict[str, Any] | None = None,
                 recipe: RecipeArguments | None = None, **kwargs):
        check_pretraining_inputs(kwargs.get("model", args[0] if args else None), kwargs.get("model_init"),
                                 kwargs.get("data_collator", args[2] if len(args) > 2 else None))
        if kwargs.get("data_collator") is None and len(args) < 3:  # Trainer's own would pad, and mask nothing
            raise ValueError("RetroMAETrainer needs data_collator=PretrainingCollator(tokenizer, mask_ratio=...) (or a "
                             "collator of your own that returns the model's labels)")
        training_args = kwargs.get("args", args[1] if len(args) > 1 else None)
        if training_args is not None:  # before the Trainer compares any of them
            check_training_arguments(training_args)  # as the command line checks its flags
        validation = next((c for c in kwargs.get("callbacks") or [] if callable(getattr(c, "evaluate_model", None))),
                          None)  # a `retrieval_validation.RetrievalValidationCallback` (a layer above: not imported)
        if validation is not None and kwargs.get("eval_dataset") is None:
            kwargs["eval_dataset"] = validation.data  # the evaluation set is the BEIR split (`evaluate`)
        self._keeps_stream_position = training_args is not None and keep_stream_position(
            training_args, kwargs.get("train_dataset"))
        self._stream_position: dict[str, Any] | None = None  # to resume from, once the loader exists
        self._rng_checkpoint: str | None = None  # whose RNG states the first step after a stream position loads
        self._resumed_at_pass_end = False  # the stream position resumed from ends its pass (`_init_training_state`)
        super().__init__(*args, **kwargs)
        seed_processes_apart(self.args.seed, self.args.process_index)
        self.accelerator.dataloader_config.use_stateful_dataloader |= self._keeps_stream_position
        self.validation = validation
        self.recipe = recipe or RecipeArguments()
        self.head_warmup = None
        if self.recipe.head_warmup_steps > 0:
            self.head_warmup = HeadWarmupCallback(  # FSDP2 keeps the requires_grad of its first forward
                encoder_parameters(self.model), self.recipe.head_warmup_steps,
                toggle_requires_grad=self.args.world_size == 1 and not self.is_fsdp_enabled)
            self.add_callback(self.head_warmup)
        self.run_info = dict(run_info or {})
        self._best_loaded = False  # the best checkpoint's weights replaced the last step's (load_best_model_at_end)
        self.run_settings = dict(run_settings or record_settings({}, new_run_id()))
        self._settings_given = run_settings is not None
        self.add_callback(LogLastStepCallback())
        self._loss_sums: dict[str, torch.Tensor] = {}
        self._loss_steps = 0
        self._accuracy_sums: dict[str, torch.Tensor] = {}  # over the logged step's forwards (NaN ones left out)
        self._accuracy_counts: dict[str, torch.Tensor] = {}
        collator = self.data_collator
        self.masking_collator = collator if isinstance(collator, PretrainingCollator) else None
        check_tokenized(self.train_dataset, "train_dataset")
        if validation is None:  # the validation's BEIR split is text by design
            check_tokenized(self.eval_dataset, "eval_dataset")
        tokenizer = self.processing_class if isinstance(self.processing_class, PreTrainedTokenizerBase) else None
        if tokenizer is not None and self.masking_collator is not None:
            check_same_tokenizer(self.masking_collator.tokenizer, tokenizer)
        if tokenizer is None:  # the collator's, which made the masks
            tokenizer = getattr(self.masking_collator, "tokenizer", None)
        if tokenizer is not None:
            self._check_model_fits(tokenizer)
        if self.masking_collator is not None:
            self.data_collator = self.masking_collator.pad  # workers pad; masks are drawn in this process
        self._train_masking = masking_generator(self.args.seed, self.args.process_index)
        self._eval_masking = masking_generator(self.args.seed, self.args.process_index, stream="eval")
        for callback in schedule_callbacks(self.model):
            self.add_callback(callback)

    def _check_model_fits(self, tokenizer: PreTrainedTokenizerBase) -> None:
        """Refuse a tokenizer with ids beyond the embedding rows and sequences beyond the position table with the
        command line's check (`positions.check_model_and_tokenizer`, on the longest sequence of the training data);
        warn when the tokenizer uses under half of the embedding rows (most likely another model's tokenizer)."""
        config = getattr(self.model, "config", None)
        if not hasattr(config, "vocab_size") or not hasattr(config, "max_position_embeddings"):
            return
        longest = longest_sequence(self.train_dataset)
        try:  # 8 is the command line's shortest --max-seq-length, no rule for the rows of a dataset
            check_model_and_tokenizer(self.model, tokenizer, max(longest or 0, 8),
                                      config._name_or_path or type(self.model).__name__)
        except ValueError as error:
            rows = f"; train_dataset's longest sequence: {longest} tokens" if longest is not None else ""
            raise ValueError(f"RetroMAETrainer (tokenizer {type(tokenizer).__name__}{rows}): {error}") from None
        if len(tokenizer) < config.vocab_size / 2:
            logger.warning("the tokenizer (%s) has %d tokens but the model has %d embedding rows: it is most likely "
                           "another model's, whose ids mean other words to this model; use the tokenizer that "
                           "belongs to the model", type(tokenizer).__name__, len(tokenizer), config.vocab_size)

    # ---- data ---------------------------------------------------------------------------------------------------

    def get_train_dataloader(self):
        """As the Trainer's, over numpy rows (`array_rows`; `train_dataset` stays as given); under DDP a stream is
        split by node instead (`stream_loader`): each process reads its own part, not the main process for all."""
        if isinstance(self.train_dataset, datasets.IterableDataset) and self.args.world_size > 1:
            loader = rank_stream_loader(self)
        else:
            given, self.train_dataset = self.train_dataset, array_rows(self.train_dataset)
            try:
                loader = super().get_train_dataloader()
            finally:
                self.train_dataset = given
        if self._stream_position is not None:  # a resumed stream continues at the checkpoint's position
            loader.load_state_dict(self._stream_position)
            self._stream_position = None
        return loader

    # ---- masking ------------------------------------------------------------------------------------------------

    def _mask_inputs(self, inputs: dict[str, Any], generator: torch.Generator) -> dict[str, Any]:
        """Masks a padded batch (one that still has `UNMASKED_KEY`); other batches pass unchanged."""
        if self.masking_collator is None or UNMASKED_KEY not in inputs:
            return inputs
        masked = self.masking_collator.mask_batch(inputs, generator)
        if hides_whole_words(self.model.config):
            masked["decoder_word_starts"] = inputs[UNMASKED_KEY].to(masked["input_ids"].device)
        return masked

    def training_step(self, model, inputs, num_items_in_batch=None):
        # Called once per consumed micro-batch, in order, and never for the batches a resume skips: the generator's
        # state at a checkpoint is exactly what the next batch needs, whatever the workers prefetched.
        if self._rng_checkpoint is not None:  # as after a replay: opening the loader drew from the global RNG
            checkpoint, self._rng_checkpoint = self._rng_checkpoint, None
            super()._load_rng_state(checkpoint)
        unwrapped = self.accelerator.unwrap_model(model)
        unwrapped.measure_accuracy = logs_at_step(self.args, self.state, self.state.global_step + 1)  # in progress
        try:
            loss = super().training_step(model, self._mask_inputs(inputs, self._train_masking), num_items_in_batch)
        finally:
            unwrapped.measure_accuracy = False
        if self.head_warmup is not None:
            self.head_warmup.drop_encoder_gradients()  # before clipping and the optimizer step
        return loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        return super().prediction_step(model, self._mask_inputs(inputs, self._eval_masking), prediction_loss_only,
                                       ignore_keys)

    def evaluation_loop(self, *args, **kwargs):
        self._eval_masking = masking_generator(self.args.seed, self.args.process_index, stream="eval")
        with seeded_rng(self._eval_masking.initial_seed(), self.args.device, self.args.n_gpu):  # decoder visibility
            return super().evaluation_loop(*args, **kwargs)

    # ---- retrieval validation as the Trainer's evaluation ----------------------------------------------------

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """With a `RetrievalValidationCallback` and no other `eval_dataset`: its retrieval metrics (`eval_ndcg@10`,
        ...), computed on the main process and given to every process, logged as their own entry; empty when the
        evaluation failed (warned). So `--eval-strategy steps` and `--metric-for-best-model ndcg@10` work as for any
        Trainer. Otherwise the Trainer's evaluation (the masked-LM losses of `eval_dataset`)."""
        if self.validation is None or eval_dataset is not None:
            return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        model = self.accelerator.unwrap_model(self.model)
        metrics = self.validation.evaluate_model(self.args, self.state, model, self.processing_class)
        if self.args.world_size > 1:  # every process compares the best metric and saves alike
            metrics = broadcast_object_list([metrics], from_process=0)[0]
        if metrics:
            self.log(dict(metrics))
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def _determine_best_metric(self, metrics: dict[str, float], trial) -> bool:
        if self.validation is not None and not metrics:  # a failed retrieval validation (warned) is no best
            return False
        if self.args.save_strategy != SaveStrategy.BEST and not self.control.should_save:
            # an evaluation between saves (--eval-steps below --save-steps): no checkpoint holds its weights, and
            # the Trainer would record it as best yet load an older checkpoint at the end
            return False
        return super()._determine_best_metric(metrics, trial)

    # ---- continued-pre-training recipe ------------------------------------------------------------------------

    def create_optimizer(self, model=None):
        """The Trainer's optimizer; with the recipe, its parameter groups carry the encoder's learning-rate factors
        (`recipe.parameter_groups`) and hold every parameter, including those frozen during the warm-up."""
        if not self.recipe.changes_optimizer or self.optimizer is not None:
            return super().create_optimizer(model)
        opt_model = self.model if model is None else model
        optimizer_cls, optimizer_kwargs = self.get_optimizer_cls_and_kwargs(self.args, opt_model)
        if is_optimizer_factory(optimizer_cls) or {"params", "model", "optimizer_dict"} & optimizer_kwargs.keys():
            raise ValueError(f"--optim {self.args.optim} builds its own parameter groups and cannot take the "
                             "continued-pre-training recipe's; use --optim adamw_torch")
        groups = parameter_groups(
            opt_model, self.recipe, self.accelerator.unwrap_model(self.model).config.num_hidden_layers,
            self.args.learning_rate, self.args.weight_decay, set(self.get_decay_parameter_names(opt_model)),
        )
        self.optimizer = optimizer_cls(groups, **optimizer_kwargs)
        return self.optimizer

    def _encoder_learning_rate(self, learning_rate: float) -> float:
        """The top encoder layer's rate in the step just logged (the Trainer's `learning_rate` is the full rate)."""
        if self.state.global_step <= self.recipe.head_warmup_steps:
            return 0.0
        num_layers = self.accelerator.unwrap_model(self.model).config.num_hidden_layers
        return learning_rate * self.recipe.top_layer_scale(num_layers)

    # ---- loss components --------------------------------------------------------------------------------------

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.recipe.contrastive_anchor_weight > 0 and "positive_input_ids" in inputs:  # recipe: B anchors + B
            outputs = model(**merge_pairs(inputs))  # positives in one pass, then the in-batch loss on their [CLS]
            if outputs.loss is not None:
                outputs = add_contrastive_anchor(outputs, inputs["input_ids"].shape[0],
                                                 self.recipe.contrastive_anchor_weight)
        else:
            outputs = model(**inputs)
        if model.training:
            for name, value in outputs.items():
                if name.endswith("_loss") and value is not None:
                    self._loss_sums[name] = self._loss_sums.get(name, 0.0) + value.detach().float()
                elif name.endswith("_accuracy") and value is not None:
                    measured = ~value.isnan()
                    self._accuracy_sums[name] = self._accuracy_sums.get(name, 0.0) + value.nan_to_num(0.0)
                    self._accuracy_counts[name] = self._accuracy_counts.get(name, 0) + measured.float()
            self._loss_steps += 1
        return (outputs.loss, outputs) if return_outputs else outputs.loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._loss_steps:  # same branch on every rank, so the collective below is safe
            for name, total in sorted(self._loss_sums.items()):
                mean = self.accelerator.reduce(total / self._loss_steps, reduction="mean")
                logs[name] = round(mean.item(), 4)
            for name, total in sorted(self._accuracy_sums.items()):
                count = self.accelerator.reduce(self._accuracy_counts[name], reduction="sum")
                if count > 0:
                    logs[name] = round((self.accelerator.reduce(total, reduction="sum") / count).item(), 4)
            self._loss_sums, self._loss_steps = {}, 0
            self._accuracy_sums, self._accuracy_counts = {}, {}
        if self.recipe.changes_optimizer and "learning_rate" in logs:
            logs["encoder_learning_rate"] = self._encoder_learning_rate(logs["learning_rate"])
        if any(isinstance(value, float) and not math.isfinite(value) for value in logs.values()):
            self._refuse_divergence()  # at once, not at the next save
        for callback in self.callback_handler.callbacks:  # e.g. RetrievalValidationCallback's metrics
            if callable(getattr(callback, "pop_logs", None)):
                logs.update(callback.pop_logs())
        super().log(logs, start_time)

    # ---- checkpoints --------------------------------------------------------------------------------------------

    def _save_run_files(self, folder: Path) -> None:
        """What a checkpoint or the final save holds beside the model: every process's masking-generator state and
        the run info (`retromae_run.json`)."""
        self._save_collator_state(str(folder))
        if self.args.should_save:
            write_json_atomic(folder / RUN_INFO_NAME, self.current_run_info())

    def _refuse_divergence(self) -> None:
        """Stop a run whose weights became NaN or infinite before it saves them (a checkpoint, the final model or
        its export), naming the last checkpoint saved before."""
        diverged = divergence_on_any_process(self.model, self.state.log_history)
        if diverged is None:
            return
        last = last_complete_checkpoint(self.args.output_dir)
        raise ValueError(
            f"pre-training diverged at step {self.state.global_step}: {diverged}; nothing was saved"
            f"{f' after {last.name}' if last else ''}. Lower --learning-rate (or raise --warmup-steps) and run again"
        )

    def save_pretraining_model(self, output_dir: str | os.PathLike) -> None:
        """The whole pre-training model (decoders included), tokenizer and run info, built in `FINAL_BUILD_NAME` and
        moved into the root, which also holds the checkpoints (`install_files`: a kill leaves no mix of two saves)."""
        self._refuse_divergence()
        root = Path(output_dir)
        with self._atomic_save(root / FINAL_BUILD_NAME) as build:
            self._save_model_files(build)
            self._save_run_files(build)
        if self.args.should_save:
            install_files(root / FINAL_BUILD_NAME, root)
        self.accelerator.wait_for_everyone()

    def _save_checkpoint(self, model, trial) -> None:
        self._refuse_divergence()
        super()._save_checkpoint(model, trial)

    def _check_replaceable(self, target: Path) -> None:
        check_replaceable(target, self.run_settings.get("run_id"))  # another run's checkpoint never

    def _save_checkpoint_files(self, folder: Path) -> None:
        self._save_run_files(folder)
        if self._keeps_stream_position and not self.args.save_only_model:
            save_stream_position(self.callback_handler.train_dataloader, folder, self.args.process_index)
        if self.args.should_save:
            write_json_atomic(folder / RESUME_FILE, {**self.run_settings, "world_size": self.args.world_size})

    def _save_model_files(self, folder: Path) -> None:
        """The model and tokenizer in `folder`, as `save_model` writes them. Sharded weights (FSDP, ZeRO-3) are
        gathered whole on every process (a collective) and written by the main one; the Trainer's own sharded saves
        write shards or nothing. ZeRO-1/2 weights are whole (its DeepSpeed save would write tied weights twice)."""
        if is_sharded(self.model):
            self._save(str(folder), state_dict=full_state_dict(self.model))
        elif self.is_deepspeed_enabled:
            self._save(str(folder))
        else:
            self.save_model(str(folder), _internal_call=True)

    def _rotate_checkpoints_in(self, run_dir: Path) -> None:
        """Keep at most `save_total_limit` checkpoints of this run (same `run_id`), the newest and the best
        (`state.best_model_checkpoint`) always, as the Trainer does; checkpoints that another run left in the folder
        are never deleted."""
        limit = self.args.save_total_limit
        if not limit or limit <= 0:
            return
        own = [p for p in list_checkpoints(run_dir) if run_id_of(p) == self.run_settings.get("run_id")]
        best = self.state.best_model_checkpoint
        deletable = [p for p in own[:-1] if best is None or p.resolve() != Path(best).resolve()]  # oldest first
        for checkpoint in deletable[: max(len(own) - limit, 0)]:  # the slice keeps the newest and the best
            logger.info("Deleting older checkpoint %s (save_total_limit=%d)", checkpoint, limit)
            shutil.rmtree(checkpoint, ignore_errors=True)

    def current_run_info(self) -> dict[str, Any]:
        training = {key: record_value(getattr(self.args, key)) for key in _RUN_INFO_TRAINING_KEYS}
        training["world_size"] = self.args.world_size
        training["warmup_steps"] = self.args.warmup_steps
        training.update(self.recipe.as_record())
        losses = [entry for entry in self.state.log_history if "loss" in entry]
        final = {k: v for k, v in losses[-1].items() if k == "loss" or k.endswith("_loss")} if losses else {}
        first = {k: v for k, v in losses[0].items() if k == "loss" or k.endswith("_loss")} if losses else {}
        record = {**self.run_info, "global_step": self.state.global_step}
        if self._best_loaded:  # the weights are the best checkpoint's, not the last step's
            metric = self.args.metric_for_best_model.removeprefix("eval_")
            record.update(weights_step=self.state.best_global_step, best_metric={metric: self.state.best_metric})
        return {**record, "training": training, "first_losses": first, "final_losses": final}

    def _load_best_model(self) -> None:
        """The Trainer's; the run record then names the step whose weights these are (`weights_step`)."""
        super()._load_best_model()
        self._best_loaded = True

    def _issue_warnings_after_load(self, load_result) -> None:
        """The Trainer's, without the tied weights a checkpoint does not store (they are not missing)."""
        tied = getattr(self.accelerator.unwrap_model(self.model), "all_tied_weights_keys", None) or {}
        missing = [key for key in load_result.missing_keys if key not in tied]
        super()._issue_warnings_after_load(load_result._replace(missing_keys=missing))

    def _load_rng_state(self, checkpoint):
        if self._rng_checkpoint is None:  # else loaded by the first training step
            super()._load_rng_state(checkpoint)

    def _collator_state_to_save(self) -> torch.Tensor | None:
        return self._train_masking.get_state() if self.masking_collator is not None else None

    def _collator_state_file(self, folder: str | os.PathLike) -> Path:
        return Path(folder) / f"collator_rng_{self.args.process_index}.safetensors"

    def _save_collator_state(self, folder: str) -> None:
        state = self._collator_state_to_save()
        if state is not None:
            os.makedirs(folder, exist_ok=True)
            save_file({"state": state}, str(self._collator_state_file(folder)))

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs):
        """As `Trainer.train`; the masks start from `(args.seed, process_index)`, or from the checkpoint's state. A
        checkpoint whose run is finished (`finished_step`) is loaded (weights and state) and nothing is trained."""
        resume_from_checkpoint = resume_target(self.args.output_dir, resume_from_checkpoint)
        if resume_from_checkpoint and finished_step(resume_from_checkpoint, self.args.max_steps) is not None:
            return self._load_finished_run(resume_from_checkpoint)
        self.accelerator.wait_for_everyone()  # after the command line's --overwrite-output-dir emptied the folder
        self.run_settings = claim_checkpoints(self.args, resume_from_checkpoint, self.run_settings, self._settings_given)
        self._train_masking = masking_generator(self.args.seed, self.args.process_index)
        if resume_from_checkpoint and self._keeps_stream_position:  # no replay: the Trainer skips no batch
            position = saved_stream_position(resume_from_checkpoint, self.args.process_index)
            self.args.ignore_data_skip |= position is not None
            self._resumed_at_pass_end = pass_ended(position)
            if self._resumed_at_pass_end:  # the next pass opens after the RNG states load, as in the unbroken run: {} drops
                position = {}  # the iterator that accelerate's stateful loader opened (drawing from the RNG) when built
            self._stream_position = position
            self._rng_checkpoint = resume_from_checkpoint if position else None
        if resume_from_checkpoint and self.masking_collator is not None:
            state_file = self._collator_state_file(resume_from_checkpoint)
            if state_file.is_file():
                self._train_masking.set_state(load_file(str(state_file))["state"])
            else:
                logger.warning("%s has no %s; masks after resuming will differ", resume_from_checkpoint, state_file.name)
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    def _init_training_state(self, max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint,
                             trial):
        """As the Trainer's; a resumed stream starts in its checkpoint's pass over the stream (`stream_pass_position`),
        so that `set_epoch` gives it the unbroken run's epoch (its shuffle, and the epoch its saved position is of)
        and a replay skips the batches read of that pass."""
        epochs_trained, steps_trained = super()._init_training_state(
            max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial)
        if resume_from_checkpoint is None or not isinstance(self.train_dataset, datasets.IterableDataset):
            return epochs_trained, steps_trained
        state_file = Path(resume_from_checkpoint) / TRAINER_STATE_NAME
        saved = TrainerState.load_from_json(str(state_file)) if state_file.is_file() else None
        if saved is None or saved.epoch is None:
            return epochs_trained, steps_trained
        # the checkpoint's max_steps, the one its epoch was counted in
        passes, batches = stream_pass_position(saved.epoch, saved.max_steps, self.args.gradient_accumulation_steps)
        if self._resumed_at_pass_end:
            return passes + 1, 0  # saved at the end of its pass: the run goes on with the next
        if self._keeps_stream_position and self.args.ignore_data_skip:  # no batch is skipped, so none counted
            self.add_callback(ResumedPassEpoch(passes, batches))
        return passes, 0 if self.args.ignore_data_skip else batches

    def _load_finished_run(self, checkpoint: str) -> TrainOutput:
        """Load a finished run's checkpoint (weights and trainer state) instead of training past its last step."""
        self._load_from_checkpoint(checkpoint)
        self.state = TrainerState.load_from_json(str(Path(checkpoint) / TRAINER_STATE_NAME))
        best = self.state.best_model_checkpoint
        if self.args.load_best_model_at_end and best is not None and Path(best).is_dir():
            self._load_best_model()  # as the run's own end did: its final save and export are the best's
        logger.warning("%s is the last step (%d) of its run: the run is finished, nothing to train", checkpoint,
                       self.state.global_step)
        return TrainOutput(self.state.global_step, 0.0, {})  # as Trainer reports a call that trained no step


__all__ = ["RetroMAETrainer"]
