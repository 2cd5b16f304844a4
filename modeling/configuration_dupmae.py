"""DupMAE configuration (Hub remote code: torch/transformers imports only, relative imports for our files)."""

from typing import Literal

from huggingface_hub.dataclasses import strict

from .configuration_retromae import RetroMAEConfig
from .layers_dupmae import REPRESENTATIONS, OTActivation, Representation, check_representation

# Table 4 (lower part) of the DupMAE paper for BERT-base (hidden_size 768, |V| 30522), as config values.
# Pass one of them as keyword arguments: `DupMAEConfig(**TABLE4_REPRESENTATIONS["CLS:384+OT:260"], ...)`.
TABLE4_REPRESENTATIONS: dict[str, dict] = {
    "CLS:768": {"representation": "cls", "dense_dim": 768},  # the [CLS] state itself, no projection, no sparse part
    "OT:768": {"representation": "ot", "doc_top_k": 768},  # top-768 entries of mu only
    "CLS:384+OT:384": {"representation": "hybrid", "dense_dim": 384, "doc_top_k": 384},  # the paper's default
    "CLS:384+OT:260": {"representation": "hybrid", "dense_dim": 384, "doc_top_k": 260},  # same memory as CLS:768*
}


@strict
class DupMAEConfig(RetroMAEConfig):
    r"""RetroMAE's [CLS] decoding plus DupMAE's ordinary-token (OT) decoding (Liu et al., 2023, "RetroMAE-2 /
    DupMAE: Duplex Masked Auto-Encoder for Pre-Training Retrieval-Oriented Language Models").

    All RetroMAE fields apply to the [CLS] decoder (`decoding`, `decoder_mask_ratio`, `query_stream` ...; the default
    query stream is the paper's h + p_i, the official DupMAE code passes h through the embedding module:
    `query_stream="embeddings"`).

    Pre-training loss = encoder_loss_weight * L_mlm + decoder_loss_weight * L_dec + bow_loss_weight * L_BoW
    (terms switched off by `cls_decoding` / `ot_decoding` are left out).

    Args:
        bow_loss_weight: weight w of the OT-decoding bag-of-words loss. Paper eq. 9 is a plain sum (w = 1, our
            default); the official code (staoxiao/RetroMAE `--bow_loss_weight`) uses 0.1 together with
            ``bow_normalization="all_tokens"``. Must be >= 0.
        bow_normalization: the bag-of-words target of a row whose n ordinary tokens hold the unique set S.
            ``"unique"`` (default): 1/|S| on each id of S, so the row's loss is the mean of -log p(x) over the
            unique tokens. ``"all_tokens"`` (the official code's `bag_word_weight`): 1/n on each id of S, n counting
            repeats, so the loss is the sum of -log p(x) over S divided by n, i.e. |S|/n times the "unique" loss
            (|S|/n is about 0.39 on packed 512-token text). The same bow_loss_weight therefore weighs the BoW
            term less under "all_tokens": the official setting is w = 0.1 with "all_tokens", about 0.039 with
            "unique".
        cls_decoding: train the [CLS] embedding with RetroMAE's decoder (Table 4 ablation "CLS decoding").
        ot_decoding: train the ordinary-token states with the bag-of-words objective (Table 4 ablation "OT
            decoding"). At least one of the two must be on.
        representation: what the encoder (`DupMAEModel`, the sentence-transformers module) represents a text by
            (paper §3.4, Table 4): ``"hybrid"`` = [W h ; top-k(mu)] (paper default), ``"cls"`` = the [CLS] state
            h itself (no projection, no sparse part; "CLS:768"), ``"ot"`` = top-k(mu) only ("OT:768").
        dense_dim: d', the size of the projected [CLS] embedding W^cls h (paper eq. 10; default 384). Allowed
            1..hidden_size: the projection is a *reduction*; a d' > d map has rank <= d, so it adds memory and
            inner-product cost without adding information. With ``representation="cls"`` there is no projection
            and dense_dim must equal hidden_size.
        dense_proj_seed: seed of the projection W^cls before it is fine-tuned (a random Johnson-Lindenstrauss map,
            `initial_dense_projection`). The encoder and the sentence-transformers export both draw it from this
            seed, never from the global RNG, so they give the same dense vectors (default 0).
        doc_top_k: k, the entries of mu kept for a document (paper eq. 11; default 384). Allowed 1..vocab_size.
            260 is the paper's "same memory as a 768-d vector" setting (Table 4) -- that equality assumes ~15-bit
            packed indices; our index stores int32 ids + float32 weights (8 bytes per entry).
        query_top_k: entries of mu kept for a query; None (default) keeps the full mu, as eq. 12 does
            (the score only reads the query at the document's top-k ids). Allowed None or 1..vocab_size.
        ot_activation: the values of mu a representation uses: ``"none"`` (default) = the max-pooled logits as in
            eq. 6-7; ``"log1p_relu"`` = SPLADE's saturation log(1 + relu(mu)). Pre-training is unaffected.
        sparse_weight: lambda, the weight of the sparse term in eq. 12's score: dense . dense + lambda * sum mu_q mu_d
            (default 1.0, the paper). The sparse part of each embedding is scaled by sqrt(lambda). Must be > 0.
        special_token_ids: ids of the tokenizer's special tokens ([CLS], [SEP], [PAD], [MASK], <s>, </s> ...),
            excluded from mu when encoding raw text (`DupMAEModel`). Set it from `tokenizer.all_special_ids`. When
            absent (None), the encoder falls back to excluding position 0 and the last real position of every row
            (the BERT/RoBERTa single-sequence layout `[CLS] ... [SEP]`). Pre-training does not need it: the collator's
            labels already mark the ordinary tokens.

    \* Table 4's "CLS:384+OT:260" matches CLS:768's memory with packed 15-bit indices (384*32 + 260*(32+15) bits ~
    768*32 bits); with int32 ids it costs 384*4 + 260*8 = 3,616 bytes vs 3,072.
    """

    model_type = "dupmae"

    bow_loss_weight: float | int = 1.0
    bow_normalization: Literal["unique", "all_tokens"] = "unique"
    cls_decoding: bool = True
    ot_decoding: bool = True
    representation: Representation = "hybrid"
    dense_dim: int = 384
    dense_proj_seed: int = 0
    doc_top_k: int = 384
    query_top_k: int | None = None
    ot_activation: OTActivation = "none"
    sparse_weight: float | int = 1.0
    special_token_ids: list[int] | None = None

    def validate_dupmae_fields(self) -> None:
        if self.bow_loss_weight < 0:
            raise ValueError(f"bow_loss_weight={self.bow_loss_weight} must be >= 0 (paper: 1.0, official code: 0.1)")
        if not (self.cls_decoding or self.ot_decoding):
            raise ValueError("cls_decoding=False and ot_decoding=False: at least one decoding task must be on")
        check_representation(
            self.representation,
            self.hidden_size,
            self.vocab_size,
            self.dense_dim,
            self.doc_top_k,
            self.query_top_k,
            self.ot_activation,
            self.sparse_weight,
            dense_dim_hint=(
                f""": set it with --method-options '{{"dense_dim": {self.hidden_size}}}' """
                "(or method_options: dense_dim in a config)"
            ),
        )
        if self.special_token_ids is not None:
            bad = [i for i in self.special_token_ids if not 0 <= i < self.vocab_size]
            if bad:
                raise ValueError(f"special_token_ids {bad} lie outside [0, vocab_size={self.vocab_size})")


__all__ = ["REPRESENTATIONS", "TABLE4_REPRESENTATIONS", "DupMAEConfig"]
