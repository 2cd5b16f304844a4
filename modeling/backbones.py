"""The seam between the methods and the encoder: one adapter per base family (BERT, RoBERTa / XLM-R, ModernBERT)
that builds the base's encoder and MLM head under the base's own names and hands the methods the encoder's states,
its token and position embeddings, the MLM head as (transform, weight, bias) and its last layer. The method config
carries the base's own fields, so the base's model class is built from it and follows its `_attn_implementation`.
"""

import importlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn
from transformers import BertModel, ModernBertForMaskedLM, ModernBertModel, RobertaModel, XLMRobertaModel
from transformers.activations import gelu
from transformers.models.bert.modeling_bert import BertOnlyMLMHead
from transformers.models.modernbert.modeling_modernbert import ModernBertPredictionHead
from transformers.models.roberta.modeling_roberta import RobertaLMHead
from transformers.models.xlm_roberta.modeling_xlm_roberta import XLMRobertaLMHead

# (transform, output weight, output bias): the MLM head in the form the fused losses take
HeadParts = tuple[Callable[[torch.Tensor], torch.Tensor], torch.Tensor, torch.Tensor]


def encoder_type_of(config) -> str:
    """The base family of a method config; "bert" for configs written before the field existed."""
    return getattr(config, "encoder_type", None) or "bert"


def encoder_type_of_config(config: dict) -> str:
    """The base family of a config.json dict: a base's own `model_type`, else `encoder_type` ("bert" when absent)."""
    model_type = config.get("model_type")
    if model_type in SUPPORTED_ENCODER_TYPES:
        return model_type
    return config.get("encoder_type") or "bert"


def is_zero3_parameter(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is a parameter partitioned by DeepSpeed ZeRO-3 (which tags each one with a `ds_id`)."""
    return hasattr(tensor, "ds_id") and hasattr(tensor, "ds_tensor")


@contextmanager
def whole_for_editing(*modules: nn.Module) -> Iterator[None]:
    """Inside the block every parameter of `modules` is whole, and what the main process writes into them is kept.
    Under DeepSpeed ZeRO-3 (a model built inside `deepspeed.zero.Init` holds empty placeholders) that is a collective
    (`GatheredParameters`, modifier rank 0: broadcast and partitioned again on exit), so every process enters it;
    otherwise nothing happens."""
    params = [param for module in modules for param in module.parameters()]
    if not any(is_zero3_parameter(param) for param in params):
        yield
        return
    # only a ZeRO-3 model gets here, so DeepSpeed is installed; not an import statement, which transformers would
    # require of every Hub user loading this code by repo id (`check_imports` reads every file's imports)
    deepspeed = importlib.import_module("deepspeed")
    with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
        yield


class Backbone:
    """The interface of a base family's adapter. A family declares every attribute and method below itself (or
    subclasses a family whose layout it shares, as RoBERTa does BERT's): a subclass missing one is a `TypeError`
    when it is defined. The methods implemented here read only the declared attributes."""

    display_name: str
    model_types: tuple[str, ...]
    prefix: str  # attribute and state-dict prefix of the encoder in the pre-training model
    head_name: str  # attribute and state-dict prefix of the MLM head
    model_class: type
    word_embeddings_name: str  # inside the encoder
    layers_name: str  # the encoder's list of layers
    has_pooler: bool  # the plain model has a pooler (exports pass add_pooling_layer=False)
    has_position_table: bool  # False: the decoders learn their own positions (`DecoderEmbeddings`)
    takes_token_type_ids: bool
    # the MLM head's state-dict names (`build_head`); `head_bias`: the head's own bias, tied to the output layer's
    head_dense: str
    head_norm: str
    head_decoder: str
    head_bias: str | None
    # where a base masked-LM checkpoint's head lies if not under `{head_name}.` (`load_base_head`); quiet in reports
    base_head_prefixes: tuple[str, ...]

    # what each family implements (the stubs below say what each returns)
    family_methods = ("prepare_config", "load_base_head", "head_options", "build_encoder", "build_head", "head_parts",
                      "tied_weights_keys", "set_output_embeddings", "output_embeddings", "position_offset",
                      "position_ids")

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        missing = [name for name in Backbone.__annotations__ if not hasattr(cls, name)]
        missing += [name for name in Backbone.family_methods if getattr(cls, name).__func__ is getattr(Backbone, name).__func__]
        if missing:
            raise TypeError(f"backbone {cls.__name__} does not declare {missing} (see Backbone)")

    @classmethod
    def prepare_config(cls, config) -> None:
        """Derived fields the base's model reads and its own config class computes."""
        raise NotImplementedError

    @classmethod
    def load_base_head(cls, head: nn.Module, model_name_or_path) -> bool:
        """Loads the base checkpoint's MLM head into `head` where our names differ from the base's; False when
        the names match (the head loaded with the encoder) or the checkpoint has none."""
        raise NotImplementedError

    @classmethod
    def head_options(cls, config: Mapping) -> dict:
        """The MLM-head transform's options from a config dict, as `DupMAEPooling` takes them."""
        raise NotImplementedError

    @classmethod
    def build_encoder(cls, config) -> nn.Module:
        raise NotImplementedError

    @classmethod
    def build_head(cls, config) -> nn.Module:
        raise NotImplementedError

    @classmethod
    def head_parts(cls, head: nn.Module) -> HeadParts:
        raise NotImplementedError

    @classmethod
    def tied_weights_keys(cls, encoder_prefix: str) -> dict[str, str]:
        """The head's output layer tied to the word embeddings (`encoder_prefix`: "<prefix>." or "" in the encoder)."""
        raise NotImplementedError

    @classmethod
    def set_output_embeddings(cls, head: nn.Module, new_embeddings: nn.Module) -> None:
        raise NotImplementedError

    @classmethod
    def output_embeddings(cls, head: nn.Module) -> nn.Module:
        raise NotImplementedError

    @classmethod
    def position_offset(cls, pad_token_id: int | None) -> int:
        """Rows of the position table before the first token's (0: row i is position i)."""
        raise NotImplementedError

    @classmethod
    def position_ids(cls, encoder: nn.Module, seq_len: int) -> torch.Tensor:
        """`(1, seq_len)` the position-table rows of positions 0 .. seq_len - 1 of an unpadded input."""
        raise NotImplementedError

    @classmethod
    def head_state(cls, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        """The state dict of `build_head`'s module from a checkpoint's weights (`{head_name}.*`, else
        `base_head_prefixes`), tied weight and biases filled in; None when the weights hold no trained head."""
        head_prefix = f"{cls.head_name}."
        weights = {k[len(head_prefix):]: v for k, v in state_dict.items() if k.startswith(head_prefix)}
        if not weights and cls.base_head_prefixes:
            weights = {k: v for k, v in state_dict.items() if k.startswith(cls.base_head_prefixes)}
        if f"{cls.head_dense}weight" not in weights:
            return None
        decoder_weight, decoder_bias = f"{cls.head_decoder}weight", f"{cls.head_decoder}bias"
        if decoder_weight not in weights:
            embeddings = f"{cls.word_embeddings_name}.weight"
            found = next((state_dict[k] for k in (f"{cls.prefix}.{embeddings}", embeddings) if k in state_dict), None)
            if found is None:
                return None
            weights[decoder_weight] = found
        if cls.head_bias is not None:
            bias = weights.get(cls.head_bias, weights.get(decoder_bias))
            if bias is None:
                return None
            weights.setdefault(cls.head_bias, bias)
            weights.setdefault(decoder_bias, bias)
        return weights

    @classmethod
    def word_embeddings(cls, encoder: nn.Module) -> nn.Embedding:
        return encoder.get_submodule(cls.word_embeddings_name)

    @classmethod
    def encode(cls, encoder: nn.Module, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        """Last-layer states `(batch_size, seq_len, hidden_size)`."""
        extra = {"token_type_ids": token_type_ids} if cls.takes_token_type_ids else {}
        return encoder(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state

    @classmethod
    def last_layer(cls, encoder: nn.Module) -> nn.Module:
        return encoder.get_submodule(cls.layers_name)[-1]


class BertBackbone(Backbone):
    """BERT: encoder `bert`, head `cls` (`BertForMaskedLM`'s names); absolute learned positions from 0."""

    display_name = "BERT"
    model_types: tuple[str, ...] = ("bert",)
    prefix = "bert"
    head_name = "cls"
    model_class: type = BertModel
    word_embeddings_name = "embeddings.word_embeddings"
    layers_name = "encoder.layer"
    has_pooler = True
    has_position_table = True
    takes_token_type_ids = True
    head_dense = "predictions.transform.dense."
    head_norm = "predictions.transform.LayerNorm."
    head_decoder = "predictions.decoder."
    head_bias: str | None = "predictions.bias"
    base_head_prefixes: tuple[str, ...] = ()

    @classmethod
    def prepare_config(cls, config) -> None:
        return None  # BERT's config computes nothing its model needs

    @classmethod
    def load_base_head(cls, head: nn.Module, model_name_or_path) -> bool:
        return False  # the head loads with the encoder, under the same names

    @classmethod
    def head_options(cls, config: Mapping) -> dict:
        return {"hidden_act": config.get("hidden_act", "gelu"), "layer_norm_eps": config.get("layer_norm_eps", 1e-12)}

    @classmethod
    def build_encoder(cls, config) -> nn.Module:
        return cls.model_class(config, add_pooling_layer=False)

    @classmethod
    def build_head(cls, config) -> nn.Module:
        return BertOnlyMLMHead(config)

    @classmethod
    def head_parts(cls, head: nn.Module) -> HeadParts:
        predictions = head.predictions
        return predictions.transform, predictions.decoder.weight, predictions.decoder.bias

    @classmethod
    def tied_weights_keys(cls, encoder_prefix: str) -> dict[str, str]:
        return {
            "cls.predictions.decoder.weight": f"{encoder_prefix}{cls.word_embeddings_name}.weight",
            "cls.predictions.decoder.bias": "cls.predictions.bias",
        }

    @classmethod
    def set_output_embeddings(cls, head: nn.Module, new_embeddings: nn.Module) -> None:
        head.predictions.decoder = new_embeddings
        head.predictions.bias = new_embeddings.bias

    @classmethod
    def output_embeddings(cls, head: nn.Module) -> nn.Module:
        return head.predictions.decoder


    @classmethod
    def position_offset(cls, pad_token_id: int | None) -> int:
        return 0

    @classmethod
    def position_ids(cls, encoder: nn.Module, seq_len: int) -> torch.Tensor:
        return encoder.embeddings.position_ids[:, :seq_len]


class RobertaBackbone(BertBackbone):
    """RoBERTa: encoder `roberta`, head `lm_head` (`RobertaForMaskedLM`'s names); positions from padding_idx + 1."""

    display_name = "RoBERTa"
    model_types = ("roberta",)
    prefix = "roberta"
    head_name = "lm_head"
    model_class = RobertaModel
    head_class: type = RobertaLMHead
    head_dense = "dense."
    head_norm = "layer_norm."
    head_decoder = "decoder."
    head_bias = "bias"

    @classmethod
    def head_options(cls, config: Mapping) -> dict:
        return {"hidden_act": "gelu", "layer_norm_eps": config.get("layer_norm_eps", 1e-12)}  # RobertaLMHead: GELU

    @classmethod
    def build_head(cls, config) -> nn.Module:
        return cls.head_class(config)

    @classmethod
    def head_parts(cls, head: nn.Module) -> HeadParts:
        def transform(hidden: torch.Tensor) -> torch.Tensor:  # RobertaLMHead.forward up to the output layer
            return head.layer_norm(gelu(head.dense(hidden)))

        return transform, head.decoder.weight, head.decoder.bias

    @classmethod
    def tied_weights_keys(cls, encoder_prefix: str) -> dict[str, str]:
        return {
            "lm_head.decoder.weight": f"{encoder_prefix}{cls.word_embeddings_name}.weight",
            "lm_head.decoder.bias": "lm_head.bias",
        }

    @classmethod
    def set_output_embeddings(cls, head: nn.Module, new_embeddings: nn.Module) -> None:
        head.decoder = new_embeddings
        head.bias = new_embeddings.bias

    @classmethod
    def output_embeddings(cls, head: nn.Module) -> nn.Module:
        return head.decoder

    @classmethod
    def position_offset(cls, pad_token_id: int | None) -> int:
        return (pad_token_id or 0) + 1  # rows 0 .. padding_idx belong to no position

    @classmethod
    def position_ids(cls, encoder: nn.Module, seq_len: int) -> torch.Tensor:
        first = cls.position_offset(encoder.embeddings.padding_idx)
        return torch.arange(first, first + seq_len, device=encoder.embeddings.position_ids.device)[None, :]


class XLMRobertaBackbone(RobertaBackbone):
    """XLM-R: RoBERTa's layout and names under `XLMRoberta*` classes."""

    display_name = "XLM-R"
    model_types = ("xlm-roberta",)
    model_class = XLMRobertaModel
    head_class = XLMRobertaLMHead


class ModernBertLMHead(nn.Module):
    """`ModernBertForMaskedLM`'s `head` and `decoder` under one name, `lm_head` (`decoder` is the methods' own)."""

    def __init__(self, config):
        super().__init__()
        self.head = ModernBertPredictionHead(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=config.decoder_bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.head(hidden))


class ModernBertBackbone(Backbone):
    """ModernBERT: encoder `model`, head `lm_head` (its `head` + `decoder`). Rotary positions inside attention and
    no position table: the decoders learn their own (`has_position_table` False, see `DecoderEmbeddings`)."""

    display_name = "ModernBERT"
    model_types = ("modernbert",)
    prefix = "model"
    head_name = "lm_head"
    model_class = ModernBertModel
    word_embeddings_name = "embeddings.tok_embeddings"
    layers_name = "layers"
    has_pooler = False
    has_position_table = False
    takes_token_type_ids = False
    head_dense = "head.dense."
    head_norm = "head.norm."
    head_decoder = "decoder."
    head_bias = None
    base_head_prefixes = ("head.", "decoder.weight", "decoder.bias")  # not `decoder.`: the methods' decoders

    @classmethod
    def load_base_head(cls, head: nn.Module, model_name_or_path) -> bool:
        base, info = ModernBertForMaskedLM.from_pretrained(model_name_or_path, output_loading_info=True)
        if any(k.startswith(cls.base_head_prefixes) for k in info["missing_keys"]):
            return False
        with whole_for_editing(base, head):
            state = cls.head_state(base.state_dict())
            state[f"{cls.head_decoder}weight"] = head.decoder.weight  # tied to the word embeddings, loaded with them
            head.load_state_dict(state)
        return True

    @classmethod
    def head_options(cls, config: Mapping) -> dict:
        return {
            "hidden_act": config.get("classifier_activation", "gelu"),
            "layer_norm_eps": config.get("norm_eps", 1e-5),
            "head_dense_bias": bool(config.get("classifier_bias", False)),
            "head_norm_bias": bool(config.get("norm_bias", False)),
        }

    @classmethod
    def prepare_config(cls, config) -> None:
        # a property of ModernBertConfig (half the local window) that ModernBertModel reads
        if getattr(config, "sliding_window", None) is None:
            config.sliding_window = config.local_attention // 2

    @classmethod
    def build_encoder(cls, config) -> nn.Module:
        cls.prepare_config(config)
        return ModernBertModel(config)

    @classmethod
    def build_head(cls, config) -> nn.Module:
        return ModernBertLMHead(config)

    @classmethod
    def head_parts(cls, head: nn.Module) -> HeadParts:
        bias = head.decoder.bias
        if bias is None:  # decoder_bias=False: the fused losses take a bias
            bias = torch.zeros(head.decoder.out_features, device=head.decoder.weight.device, dtype=head.decoder.weight.dtype)
        return head.head, head.decoder.weight, bias

    @classmethod
    def tied_weights_keys(cls, encoder_prefix: str) -> dict[str, str]:
        return {"lm_head.decoder.weight": f"{encoder_prefix}{cls.word_embeddings_name}.weight"}

    @classmethod
    def set_output_embeddings(cls, head: nn.Module, new_embeddings: nn.Module) -> None:
        head.decoder = new_embeddings

    @classmethod
    def output_embeddings(cls, head: nn.Module) -> nn.Module:
        return head.decoder

    @classmethod
    def position_offset(cls, pad_token_id: int | None) -> int:
        return 0

    @classmethod
    def position_ids(cls, encoder: nn.Module, seq_len: int) -> torch.Tensor:
        return torch.arange(seq_len, device=cls.word_embeddings(encoder).weight.device)[None, :]


BACKBONES: tuple[type[Backbone], ...] = (BertBackbone, RobertaBackbone, XLMRobertaBackbone, ModernBertBackbone)
SUPPORTED_ENCODER_TYPES: tuple[str, ...] = tuple(t for backbone in BACKBONES for t in backbone.model_types)
# the base a config means when it names none (method configs written before the other families)
DEFAULT_ENCODER_TYPE = BertBackbone.model_types[0]


def backbone_for(encoder_type: str) -> type[Backbone]:
    """The adapter of a base `model_type`; a `ValueError` that lists the supported ones for any other."""
    for backbone in BACKBONES:
        if encoder_type in backbone.model_types:
            return backbone
    raise ValueError(
        f"model_type {encoder_type!r} is not a supported encoder; retromae pre-trains "
        f"{', '.join(SUPPORTED_ENCODER_TYPES)} masked-LM checkpoints"
    )


def backbone_of(config) -> type[Backbone]:
    return backbone_for(encoder_type_of(config))


class DecoderEmbeddings:
    """What the decoders take from the encoder's embeddings (paper eq. 4-5: h + p_i, e(x_i) + p_i), for any family.

    BERT / RoBERTa / XLM-R: the encoder's embedding module and position table, at the base's position ids.
    ModernBERT has no table: `own_positions` is one the decoder learns, added to the embedding module's output.
    """

    def __init__(self, backbone: type[Backbone], encoder: nn.Module, own_positions: nn.Embedding | None = None):
        self.backbone = backbone
        self.encoder = encoder
        self.module = encoder.embeddings
        self.own_positions = own_positions

    def positions(self, seq_len: int) -> torch.Tensor:
        """p_0 .. p_{L-1}, `(1, seq_len, hidden_size)`."""
        table = self.module.position_embeddings if self.own_positions is None else self.own_positions
        return table(self.backbone.position_ids(self.encoder, seq_len))

    def query(self, rows: torch.Tensor) -> torch.Tensor:
        """`rows` `(B, L, H)` through the embedding module as input embeddings, with p_i."""
        embedded = self.module(inputs_embeds=rows)
        return embedded if self.own_positions is None else embedded + self.positions(rows.shape[1])

    def tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """e(x_i) + p_i `(B, L, H)`."""
        embedded = self.module(input_ids=input_ids)
        return embedded if self.own_positions is None else embedded + self.positions(input_ids.shape[1])


def decoder_position_table(config) -> nn.Embedding | None:
    """The decoder's own position table for a base without one (ModernBERT), else None."""
    if backbone_of(config).has_position_table:
        return None
    return nn.Embedding(config.max_position_embeddings, config.hidden_size)


__all__ = [
    "DEFAULT_ENCODER_TYPE",
    "BACKBONES",
    "Backbone",
    "BertBackbone",
    "DecoderEmbeddings",
    "ModernBertBackbone",
    "ModernBertLMHead",
    "RobertaBackbone",
    "SUPPORTED_ENCODER_TYPES",
    "XLMRobertaBackbone",
    "backbone_for",
    "backbone_of",
    "decoder_position_table",
    "encoder_type_of",
    "encoder_type_of_config",
    "is_zero3_parameter",
    "whole_for_editing",
]
