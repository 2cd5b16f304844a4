"""What every pre-training model shares: a BERT encoder, its tied MLM head, masked-position MLM loss, and the
checkpoint format (remote code with `auto_map` for AutoConfig / AutoModel / AutoModelForPreTraining).

Hub remote code: torch/transformers only, relative imports for our own files.
"""

import logging
import os
from dataclasses import dataclass

import torch
from transformers import BertConfig, BertModel
from transformers.modeling_outputs import BaseModelOutputWithPoolingAndCrossAttentions
from transformers.models.bert.modeling_bert import BertOnlyMLMHead, BertPreTrainedModel
from transformers.utils import ModelOutput

from .layers_retromae import IGNORE_INDEX, linear_cross_entropy

logger = logging.getLogger(__name__)


@dataclass
class PretrainingOutput(ModelOutput):
    """Output of every `*ForPretraining` model.

    Args:
        loss: weighted sum of the components below that the method uses.
        encoder_mlm_loss: masked-language-model loss of the encoder (mean over masked tokens).
        decoder_loss: reconstruction loss of the decoder (mean over its target tokens).
        bow_loss: bag-of-words loss (DupMAE's OT decoding, BoW prediction).
        contrastive_loss: in-batch contrastive loss (two-stage SentMAE).
        sentence_embedding: `(batch_size, hidden_size)` last-layer [CLS] state of the (masked) encoder input.
    """

    loss: torch.Tensor | None = None
    encoder_mlm_loss: torch.Tensor | None = None
    decoder_loss: torch.Tensor | None = None
    bow_loss: torch.Tensor | None = None
    contrastive_loss: torch.Tensor | None = None
    sentence_embedding: torch.Tensor | None = None


class ClsEncoderModel(BertModel):
    """A plain `BertModel` (same parameter names, no pooler) whose `pooler_output` is the last-layer [CLS] state,
    the sentence embedding of the CLS-based methods. Loads a pre-training checkpoint by stripping the `bert.` prefix."""

    def __init__(self, config: BertConfig, add_pooling_layer: bool = False):
        super().__init__(config, add_pooling_layer=add_pooling_layer)

    def forward(self, *args, **kwargs) -> BaseModelOutputWithPoolingAndCrossAttentions:
        kwargs["return_dict"] = True
        output = super().forward(*args, **kwargs)
        output.pooler_output = output.last_hidden_state[:, 0]  # (batch_size, hidden_size)
        return output


class BertPretrainingBase(BertPreTrainedModel):
    """Encoder `bert` + MLM head `cls`, named as in `BertForMaskedLM` so BERT checkpoints load unchanged.

    Subclasses set `config_class` and `encoder_class`, build their heads in `__init__` before `self.post_init()`,
    and implement `forward`. `accepts_loss_kwargs = False`: the Trainer divides by gradient accumulation itself.
    """

    base_model_prefix = "bert"
    accepts_loss_kwargs = False
    supports_gradient_checkpointing = True
    _tied_weights_keys = {
        "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }
    encoder_class: type = ClsEncoderModel
    # state-dict prefixes of the method's own new modules (reported as missing when starting from plain BERT)
    head_prefixes: tuple[str, ...] = ()

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.cls = BertOnlyMLMHead(config)

    def get_output_embeddings(self):
        return self.cls.predictions.decoder

    def set_output_embeddings(self, new_embeddings):
        self.cls.predictions.decoder = new_embeddings
        self.cls.predictions.bias = new_embeddings.bias

    def encode(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Last-layer hidden states `(batch_size, seq_len, hidden_size)`."""
        return self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state

    def mlm_loss(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of the tied MLM head, evaluated only where `labels != -100`.

        Args:
            hidden: `(batch_size, seq_len, hidden_size)`.
            labels: `(batch_size, seq_len)`.
        """
        keep = labels.reshape(-1) != IGNORE_INDEX  # (B*L,)
        rows = hidden.reshape(-1, hidden.shape[-1])[keep]  # (n_labels, H)
        predictions = self.cls.predictions
        return linear_cross_entropy(
            predictions.transform(rows),
            predictions.decoder.weight,
            predictions.decoder.bias,
            labels.reshape(-1)[keep],
            chunk_size=getattr(self.config, "loss_chunk_size", 4096),
        )

    def vocab_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The tied MLM head applied to `hidden` `(..., hidden_size)` -> `(..., vocab_size)`."""
        return self.cls(hidden)

    # ---- checkpoint format ------------------------------------------------------------------------------------

    @classmethod
    def _class_ref(cls, klass: type) -> str:
        return f"{klass.__module__.rsplit('.', 1)[-1]}.{klass.__name__}"

    def save_pretrained(self, save_directory: str | os.PathLike, *args, **kwargs):
        """Save weights (safetensors), config with `auto_map` for the three Auto classes, and the modeling files."""
        cls = type(self)
        self.config.auto_map = {
            "AutoConfig": cls._class_ref(cls.config_class),
            "AutoModel": cls._class_ref(cls.encoder_class),
            "AutoModelForPreTraining": cls._class_ref(cls),
        }
        self.config.architectures = [cls.__name__]
        kwargs.pop("safe_serialization", None)  # safetensors only
        return super().save_pretrained(save_directory, *args, **kwargs)

    @classmethod
    def from_encoder_checkpoint(cls, model_name_or_path: str | os.PathLike, **config_overrides):
        """Start pre-training from any BERT checkpoint (BertModel, BertForMaskedLM or one of our checkpoints).

        The config keeps the checkpoint's architecture and takes the method's fields from `config_overrides`.
        Modules absent from the checkpoint are initialised as BERT does (normal(0, initializer_range), zero biases,
        unit LayerNorms); the MLM output matrix is always the tied word-embedding matrix. With
        `decoder_init="copy_last_layer"` a fresh decoder starts as a copy of the encoder's last layer.
        """
        base = BertConfig.from_pretrained(model_name_or_path).to_dict()
        fields = {k: v for k, v in base.items() if k not in {"model_type", "architectures", "auto_map", "transformers_version"}}
        config = cls.config_class(**{**fields, **config_overrides})
        model, info = cls.from_pretrained(model_name_or_path, config=config, output_loading_info=True)
        missing = set(info["missing_keys"])
        if any(k.startswith("bert.") for k in missing):
            raise ValueError(
                f"{model_name_or_path} is not a BERT checkpoint: encoder weights missing "
                f"({sorted(k for k in missing if k.startswith('bert.'))[:3]} ...)"
            )
        newly_initialised = sorted({k.split(".")[0] + "." + k.split(".")[1] for k in missing})
        if newly_initialised:
            logger.info("Initialised from scratch (absent from %s): %s", model_name_or_path, newly_initialised)
        model.after_encoder_checkpoint_loaded(missing)
        return model

    def after_encoder_checkpoint_loaded(self, missing_keys: set[str]) -> None:
        """With `config.decoder_init == "copy_last_layer"`, a decoder absent from the checkpoint (`decoder.layers.*`
        of BertLayers) starts as copies of the encoder's last layer (as SimLM does) instead of BERT init."""
        decoder_missing = any(k.startswith("decoder.") for k in missing_keys)
        if getattr(self.config, "decoder_init", "bert") == "copy_last_layer" and decoder_missing:
            for layer in self.decoder.layers:
                layer.load_state_dict(self.bert.encoder.layer[-1].state_dict())


__all__ = ["BertPretrainingBase", "ClsEncoderModel", "IGNORE_INDEX", "PretrainingOutput"]
