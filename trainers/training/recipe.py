"""The continued-pre-training recipe: options of every method for starting from an already trained retriever.

A retriever such as all-MiniLM-L6-v2 ships no MLM head, so its head and every method's new parts (decoder,
BoW/OT parts) start random; trained jointly from step 0 they pull the encoder away from its optimum. The recipe is
linear probing before fine-tuning (Kumar et al., 2022, "Fine-Tuning can Distort Pretrained Features"):

1. head warm-up (`--head-warmup-steps N`): for optimizer steps 1..N the encoder gets no update. "Encoder" is every
   parameter under the base's prefix (`bert.*`; RoBERTa / XLM-R `roberta.*`; ModernBERT `model.*`), embeddings
   included, and therefore also the MLM output matrix (tied to the word
   embeddings). What trains: the MLM head's transform and output bias, and the method's own modules (`decoder.*`,
   ...). Frozen parameters get no gradient (`requires_grad=False` in a single process; under DDP and FSDP their
   gradients are dropped before clipping), and AdamW skips parameters without a gradient, weight decay included, so they stay
   bit-identical. The phase is derived from `state.global_step` at the start of every optimizer step, so a run
   resumed from any checkpoint, inside or after the warm-up, continues exactly.
2. joint training with a smaller encoder learning rate: the encoder's rate is `S = --encoder-lr-scale` times the
   peak rate, on the same schedule; the new parts keep the full rate. `D = --layer-lr-decay` adds layer-wise decay
   as in ELECTRA / BEiT, counting the head as level L+1: with L encoder layers, layer l (l = 0..L-1, the state-dict
   index: `bert.encoder.layer.l`, `roberta.encoder.layer.l`, ModernBERT's `model.layers.l`) gets S * D**(L - l)
   and the embeddings (`bert.embeddings.*`, `roberta.embeddings.*`, `model.embeddings.*`) get S * D**(L + 1). So
   the top layer gets S * D, each layer below D times less. Other encoder parameters (a pooler, ModernBERT's
   `model.final_norm`) get S.
3. contrastive anchoring (`--contrastive-anchor-weight W`): SentMAE's in-batch contrastive loss on the [CLS]
   embeddings (cosine, temperature 0.05, `modeling_sentmae.in_batch_contrastive_loss`) with span positives (two
   disjoint spans of each passage, `data.training_data.span_pair_training_data`) is added to any method's loss with
   weight W, so the embedding space keeps its geometry. As in SentMAE, anchors and positives both go through the
   method's own losses (one forward pass over 2B sequences) and the contrastive term reuses their [CLS] states.

The defaults (0, 1.0, 1.0, 0) change nothing: the paper-faithful optimizer of `transformers.Trainer`.
"""

from __future__ import annotations

import logging
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import try_to_load_from_cache
from retromae.modeling.backbones import BACKBONES, BertBackbone
from retromae.modeling.configuration_sentmae import SentMAEConfig
from retromae.modeling.modeling_sentmae import in_batch_contrastive_loss
from transformers import TrainerCallback

from ..data.pairs import POSITIVE_PREFIX
from ..inputs.checkpoints import weight_names

logger = logging.getLogger(__name__)

# the point chosen on held-out SciFact train queries (README, Results); a head warm-up scored 0.002 below it
SUGGESTED_RECIPE = "--encoder-lr-scale 0.1"
# DDP / torch.compile wrappers in front of a parameter name
_WRAPPERS = r"^(?:module\.|_orig_mod\.)*"


@dataclass(frozen=True)
class EncoderNames:
    """How a model's encoder parameters are named (also inside DDP / torch.compile wrappers): the base's prefix
    (`bert`, `roberta`, `model`) and the path of its layer list inside the encoder (`encoder.layer`, ModernBERT's
    `layers`)."""

    prefix: str = BertBackbone.prefix
    layers: str = "encoder.layer"

    @property
    def encoder(self) -> re.Pattern:
        return re.compile(_WRAPPERS + re.escape(self.prefix) + r"\.")

    @property
    def layer(self) -> re.Pattern:
        return re.compile(_WRAPPERS + re.escape(f"{self.prefix}.{self.layers}.") + r"(\d+)\.")

    @property
    def embeddings(self) -> re.Pattern:
        return re.compile(_WRAPPERS + re.escape(self.prefix) + r"\.embeddings\.")

    @classmethod
    def of(cls, model: torch.nn.Module) -> EncoderNames:
        """The names of a pre-training model (`PretrainingBase`: its `backbone`), also wrapped in DDP or
        torch.compile; BERT's for a model without a backbone."""
        while hasattr(model, "module") or hasattr(model, "_orig_mod"):
            model = getattr(model, "module", None) or model._orig_mod
        backbone = getattr(model, "backbone", None)
        if backbone is None:
            return cls()
        return cls(prefix=backbone.prefix, layers=backbone.layers_name)


BERT_NAMES = EncoderNames()


@dataclass
class RecipeArguments:
    """Continued pre-training of an existing retriever (see training/recipe.py). The defaults change nothing."""

    head_warmup_steps: int = field(
        default=0,
        metadata={"help": "continued pre-training: freeze the encoder (bert.* / roberta.* / model.*, embeddings and "
                  "the tied MLM output "
                  "matrix included) for the first N optimizer steps while the MLM head transform and the method's "
                  "new parts (decoder, BoW parts) learn; 0 = off (paper default)"},
    )
    encoder_lr_scale: float = field(
        default=1.0,
        metadata={"help": "after the warm-up the encoder learns at S x --learning-rate (same schedule); the new parts "
                  "keep the full rate; 1.0 = off"},
    )
    layer_lr_decay: float = field(
        default=1.0,
        metadata={"help": "layer-wise decay on top of --encoder-lr-scale S: of L layers, encoder layer l (0-based) "
                  "gets S*D^(L-l), the embeddings S*D^(L+1); 1.0 = off"},
    )

    contrastive_anchor_weight: float = field(
        default=0.0,
        metadata={"help": "add SentMAE's in-batch contrastive loss (cosine, temperature 0.05; positives: two spans "
                  "of each --corpus passage) with this weight to any method's loss, keeping the embedding space's "
                  "geometry; 0 = off"},
    )

    def __post_init__(self) -> None:
        if self.head_warmup_steps < 0:
            raise ValueError(f"--head-warmup-steps must be >= 0 (0 = off), got {self.head_warmup_steps}")
        if not self.encoder_lr_scale > 0:
            raise ValueError(f"--encoder-lr-scale must be > 0, got {self.encoder_lr_scale}; to keep the encoder "
                             "frozen for the whole run, set --head-warmup-steps to --max-steps")
        if not 0 < self.layer_lr_decay <= 1:
            raise ValueError(f"--layer-lr-decay must lie in (0, 1] (1 = off), got {self.layer_lr_decay}")
        if not self.contrastive_anchor_weight >= 0:
            raise ValueError(f"--contrastive-anchor-weight must be >= 0 (0 = off), got {self.contrastive_anchor_weight}")

    @property
    def active(self) -> bool:
        return self.changes_optimizer or self.contrastive_anchor_weight > 0

    @property
    def changes_optimizer(self) -> bool:
        return self.head_warmup_steps > 0 or self.encoder_lr_scale != 1.0 or self.layer_lr_decay != 1.0

    def as_record(self) -> dict[str, Any]:
        """The options as recorded in `retromae_run.json` (and the model card's training rows)."""
        return asdict(self)

    def lr_scale(self, name: str, num_layers: int, names: EncoderNames = BERT_NAMES) -> float:
        """The factor on the peak learning rate of parameter `name` (1.0 for everything outside the encoder, whose
        parameters are named as `names` says: `EncoderNames.of(model)`)."""
        if not names.encoder.match(name):
            return 1.0
        scale, decay = self.encoder_lr_scale, self.layer_lr_decay
        if layer := names.layer.match(name):
            return scale * decay ** (num_layers - int(layer.group(1)))
        if names.embeddings.match(name):
            return scale * decay ** (num_layers + 1)
        return scale

    def top_layer_scale(self, num_layers: int) -> float:
        """The factor of the top encoder layer (layer L - 1: S * D), whatever the family's names."""
        return self.encoder_lr_scale * self.layer_lr_decay


def encoder_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters the head warm-up freezes: the encoder's (`bert.*`, `roberta.*`, `model.*`; tied ones, e.g.
    the MLM output matrix, appear once)."""
    encoder = EncoderNames.of(model).encoder
    return [p for name, p in model.named_parameters() if encoder.match(name)]


def parameter_groups(model: torch.nn.Module, recipe: RecipeArguments, num_layers: int, learning_rate: float,
                     weight_decay: float, decay_names: set[str]) -> list[dict[str, Any]]:
    """Optimizer groups: one per (learning-rate factor, weight decay or not), the full-rate groups first (the
    Trainer logs the first group's rate as `learning_rate`). Every parameter is included, frozen or not."""
    groups: dict[tuple[float, bool], list[torch.nn.Parameter]] = {}
    names = EncoderNames.of(model)
    for name, param in model.named_parameters():
        key = (recipe.lr_scale(name, num_layers, names), name in decay_names)
        groups.setdefault(key, []).append(param)
    ordered = sorted(groups.items(), key=lambda item: (-item[0][0], not item[0][1]))
    return [
        {"params": params, "lr": learning_rate * scale, "weight_decay": weight_decay if decays else 0.0}
        for (scale, decays), params in ordered
    ]


class HeadWarmupCallback(TrainerCallback):
    """Freezes the encoder while `state.global_step < steps` (decided at the start of every optimizer step, so a
    resumed run is in the right phase) and logs when the warm-up ends.

    Args:
        encoder: the parameters to freeze (`encoder_parameters`). At the start of training they are looked up again,
            by name, in the model being trained: FSDP2 (`fully_shard`) replaces every parameter when it shards the
            model, after the trainer built this callback, and freezing the old ones would leave the encoder training.
        steps: the warm-up length in optimizer steps.
        toggle_requires_grad: freeze through `requires_grad` (single process: the backward pass skips the encoder).
            Under DDP and FSDP the set of parameters that need gradients must not change after wrapping, so the
            trainer drops their gradients instead (`drop_encoder_gradients`).
    """

    def __init__(self, encoder: list[torch.nn.Parameter], steps: int, toggle_requires_grad: bool):
        self.encoder = encoder
        self.steps = steps
        self.toggle_requires_grad = toggle_requires_grad
        self.frozen = False

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is not None:  # the parameters training updates (FSDP2 has replaced those of the unwrapped model)
            self.encoder = encoder_parameters(model)
        if state.global_step < self.steps and state.is_world_process_zero:
            logger.warning("Head warm-up: the encoder (tied MLM output matrix included) is frozen for optimizer "
                        "steps %d-%d; the MLM head transform and the method's new parts train",
                        state.global_step + 1, self.steps)
        if state.max_steps > 0 and self.steps >= state.max_steps and state.is_world_process_zero:
            logger.warning("--head-warmup-steps %d >= max steps %d: the encoder is not trained in this run",
                           self.steps, state.max_steps)
        self._set_phase(state.global_step)

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.steps and state.is_world_process_zero:  # once, also in a resumed run
            logger.warning("Head warm-up finished after %d steps: the encoder trains from step %d on",
                        self.steps, self.steps + 1)
        self._set_phase(state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        self._set_phase(self.steps)  # a model used after training (export, another train()) is not left frozen

    def _set_phase(self, global_step: int) -> None:
        self.frozen = global_step < self.steps
        if self.toggle_requires_grad:
            for param in self.encoder:
                param.requires_grad_(not self.frozen)

    def drop_encoder_gradients(self) -> None:
        """During the warm-up: no gradient on the encoder, so the optimizer skips it (weight decay included)."""
        if self.frozen:
            for param in self.encoder:
                param.grad = None


# the contrastive anchor is SentMAE's loss with its defaults (SimCSE's temperature)
ANCHOR_TEMPERATURE, ANCHOR_SIMILARITY = SentMAEConfig.temperature, SentMAEConfig.similarity


def merge_pairs(inputs: dict[str, Any]) -> dict[str, Any]:
    """A `ContrastiveCollator` batch (B anchors, B `positive_*` rows) as one batch of 2B rows, anchors first."""
    return {key: torch.cat([value, inputs[POSITIVE_PREFIX + key]]) if POSITIVE_PREFIX + key in inputs else value
            for key, value in inputs.items() if not key.startswith(POSITIVE_PREFIX)}


def add_contrastive_anchor(outputs, batch_size: int, weight: float):
    """Add the in-batch contrastive loss of the [CLS] embeddings of a merged batch (`merge_pairs`) to `outputs`."""
    embeddings = outputs.sentence_embedding  # (2B, H): anchors, then their positives
    contrastive = in_batch_contrastive_loss(embeddings[:batch_size], embeddings[batch_size:], ANCHOR_TEMPERATURE,
                                            ANCHOR_SIMILARITY)
    outputs["contrastive_loss"] = contrastive  # item assignment: a field that was None joins `outputs.items()`
    outputs["loss"] = outputs.loss + weight * contrastive
    outputs["sentence_embedding"] = embeddings[:batch_size]
    return outputs


def _local_folder(model_ref: str) -> Path | None:
    """The folder holding `model_ref`'s files: itself, or a Hub id's snapshot in the local cache (no download)."""
    if Path(model_ref).is_dir():
        return Path(model_ref)
    try:
        cached = try_to_load_from_cache(model_ref, "config.json")
    except ValueError:  # not a repo id
        return None
    return Path(cached).parent if isinstance(cached, str) else None


# the first layer of a trained MLM head, by family, under our names and a base checkpoint's own where they differ
# (ModernBertForMaskedLM's `head.dense.`; `Backbone.head_state` reads the same names)
MLM_HEAD_TRANSFORMS = tuple(dict.fromkeys(
    name for b in BACKBONES for name in (f"{b.head_name}.{b.head_dense}", *((b.head_dense,) if b.base_head_prefixes else ()))
))


def has_mlm_head(model_ref: str) -> bool | None:
    """Whether the checkpoint `model_ref` holds MLM-head weights (`MLM_HEAD_TRANSFORMS`: the head's transform of any
    supported family); None when that cannot be told without loading the weights (`.bin` files, a Hub id not in the
    local cache)."""
    folder = _local_folder(model_ref)
    if folder is None:
        return None
    names = weight_names(folder)
    return None if names is None else any(name.startswith(MLM_HEAD_TRANSFORMS) for name in names)


def suggest_recipe(model_ref: str, recipe: RecipeArguments) -> None:
    """Log one line suggesting the recipe when a run starts from a checkpoint without an MLM head (a trained
    retriever such as all-MiniLM-L6-v2) and no recipe option was given; the defaults stay those of the papers."""
    if recipe.active or has_mlm_head(model_ref) is not False:
        return
    logger.warning("%s has no MLM head (a trained retriever?): the head and the method's new parts start random "
                   "and, trained jointly from step 0, pull the encoder off its optimum; consider the "
                   "continued-pre-training recipe, e.g. %s, and compare the result with the base fine-tuned "
                   "alone", Path(model_ref).name, SUGGESTED_RECIPE)


__all__ = [
    "BERT_NAMES", "EncoderNames", "HeadWarmupCallback", "MLM_HEAD_TRANSFORMS", "RecipeArguments", "SUGGESTED_RECIPE", "add_contrastive_anchor", "encoder_parameters",
    "has_mlm_head", "merge_pairs", "parameter_groups", "suggest_recipe",
]
