"""RetroMAE configuration (Hub remote code: torch/transformers imports only, relative imports for our files)."""

from huggingface_hub.dataclasses import strict
from transformers import BertConfig

DECODINGS = ("enhanced", "basic")
QUERY_STREAMS = ("position", "embeddings")
DECODER_INITS = ("bert", "copy_last_layer")


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not supported; choose one of {', '.join(map(repr, allowed))}")


def _check_open_unit_interval(name: str, value: float) -> None:
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name}={value} must lie in the open interval (0, 1)")


@strict
class RetroMAEConfig(BertConfig):
    r"""BERT encoder plus a RetroMAE decoder (Xiao et al., 2022, "RetroMAE").

    Args:
        encoder_mask_ratio: share of ordinary tokens the collator masks in the encoder input (paper: 0.15-0.3).
        decoder_mask_ratio: share of positions hidden from each decoder row (enhanced decoding) or replaced by
            [MASK] in the decoder input (basic decoding). Paper: 0.5 (enhanced) / 0.7 (basic) are best.
        decoding: ``"enhanced"`` (paper §3.3, two-stream attention with a per-row visibility matrix, loss on every
            token) or ``"basic"`` (paper §3.2 / Table 6 ablation, masked input and self-attention, loss on masked
            tokens only).
        num_decoder_layers: transformer layers in the decoder; 1 for enhanced decoding (the paper's only setting),
            1-3 for basic decoding.
        query_stream: ``"position"`` builds the decoder queries as h + p_i (paper eq. 4, official v1 code);
            ``"embeddings"`` passes h through the full embedding module (adds token-type, LayerNorm, dropout; the
            BGE / DupMAE code).
        whole_word_mask: mask whole words (all word pieces together) in the encoder input.
        encoder_loss_weight / decoder_loss_weight: weights of the two loss terms (paper: plain sum).
        decoder_init: ``"bert"`` (fresh BERT initialisation, as the official code) or ``"copy_last_layer"`` (start
            the decoder from the encoder's last layer, as SimLM does).
        mask_token_id: id of the tokenizer's mask token; needed by basic decoding (set from the tokenizer).
        loss_chunk_size: rows per chunk of the fused vocabulary projection + cross-entropy (bounds logits memory).
    """

    model_type = "retromae"

    encoder_mask_ratio: float = 0.3
    decoder_mask_ratio: float = 0.5
    decoding: str = "enhanced"
    num_decoder_layers: int = 1
    query_stream: str = "position"
    whole_word_mask: bool = True
    encoder_loss_weight: float = 1.0
    decoder_loss_weight: float = 1.0
    decoder_init: str = "bert"
    mask_token_id: int | None = None
    loss_chunk_size: int = 4096

    def validate_retromae_fields(self) -> None:
        _check_open_unit_interval("encoder_mask_ratio", self.encoder_mask_ratio)
        _check_open_unit_interval("decoder_mask_ratio", self.decoder_mask_ratio)
        _check_choice("decoding", self.decoding, DECODINGS)
        _check_choice("query_stream", self.query_stream, QUERY_STREAMS)
        _check_choice("decoder_init", self.decoder_init, DECODER_INITS)
        if self.decoding == "enhanced" and self.num_decoder_layers != 1:
            raise ValueError(
                f"num_decoder_layers={self.num_decoder_layers} with decoding='enhanced': enhanced decoding works "
                "with exactly one decoder layer (RetroMAE §3.3, Table 6); use decoding='basic' for 1-3 layers"
            )
        if not 1 <= self.num_decoder_layers <= 3:
            raise ValueError(f"num_decoder_layers={self.num_decoder_layers} must be 1, 2 or 3")
        for name in ("encoder_loss_weight", "decoder_loss_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
        if self.loss_chunk_size < 1:
            raise ValueError(f"loss_chunk_size={self.loss_chunk_size} must be >= 1")


__all__ = ["RetroMAEConfig"]
