"""DupMAE configuration."""

from typing import Literal

from .configuration_retromae import RetroMAEConfig, check_weight, strict_config
from .layers_dupmae import REPRESENTATIONS, OTActivation, Representation, check_representation

# DupMAE Table 4 (lower part, BERT-base) as config keywords: `DupMAEConfig(**TABLE4_REPRESENTATIONS["CLS:768"])`
TABLE4_REPRESENTATIONS: dict[str, dict] = {
    "CLS:768": {"representation": "cls", "dense_dim": 768},  # the [CLS] state itself, no projection, no sparse part
    "OT:768": {"representation": "ot", "doc_top_k": 768},  # top-768 entries of mu only
    "CLS:384+OT:384": {"representation": "hybrid", "dense_dim": 384, "doc_top_k": 384},  # the paper's default
    "CLS:384+OT:260": {"representation": "hybrid", "dense_dim": 384, "doc_top_k": 260},  # same memory as CLS:768*
}


@strict_config
class DupMAEConfig(RetroMAEConfig):
    r"""RetroMAE's [CLS] decoding plus DupMAE's ordinary-token (OT) decoding (Liu et al., 2023, "RetroMAE-2 / DupMAE").

    The RetroMAE fields configure the [CLS] decoder (the official DupMAE code uses `query_stream="embeddings"`).
    Loss = encoder_loss_weight * L_mlm + decoder_loss_weight * L_dec + bow_loss_weight * L_BoW, less the terms
    `cls_decoding` / `ot_decoding` switch off.

    Args:
        bow_loss_weight: w >= 0 (finite) of the BoW loss (paper eq. 9: 1; official code: 0.1 with ``"all_tokens"``).
        bow_normalization: the BoW target of a row with n ordinary tokens, unique set S: 1/|S| on each id of S
            (``"unique"``) or 1/n (``"all_tokens"``, the official code's: |S|/n, ~0.39 on packed 512-token text, times
            the "unique" loss, so the official w = 0.1 is ~0.039 under "unique").
        cls_decoding / ot_decoding: train [CLS] with RetroMAE's decoder / the ordinary-token states with the BoW
            objective (Table 4 ablations); at least one must be on.
        representation: what a text is represented by (paper §3.4): ``"hybrid"`` = [W h ; top-k(mu)] (default),
            ``"cls"`` = h itself ("CLS:768"), ``"ot"`` = top-k(mu) only ("OT:768").
        dense_dim: d' of W^cls h (eq. 10), in 1..hidden_size; equal to hidden_size with ``"cls"``. None (default):
            the paper's 384 for ``"hybrid"``, capped at hidden_size; hidden_size for ``"cls"``.
        dense_proj_seed: seed of the untrained W^cls (`initial_dense_projection`).
        doc_top_k: k, the entries of mu kept for a document (eq. 11), in 1..vocab_size. Table 4's 260 matches CLS:768's
            memory with 15-bit indices; int32 ids + float32 weights take 384*4 + 260*8 = 3,616 bytes vs 3,072.
        query_top_k: entries of mu kept for a query: None (the full mu, as eq. 12) or 1..vocab_size.
        ot_activation: ``"none"`` (mu, eq. 6-7) or ``"log1p_relu"`` (SPLADE's log(1 + relu(mu))); pre-training is
            unaffected.
        sparse_weight: lambda > 0 in eq. 12's score dense . dense + lambda * sum mu_q mu_d; the sparse part is
            scaled by sqrt(lambda).
        special_token_ids: ids in [0, vocab_size) excluded from mu when encoding raw text (set from
            `tokenizer.all_special_ids`); None excludes position 0 and the last real position (`[CLS] ... [SEP]`).
    """

    model_type = "dupmae"

    bow_loss_weight: float | int = 1.0
    bow_normalization: Literal["unique", "all_tokens"] = "unique"
    cls_decoding: bool = True
    ot_decoding: bool = True
    representation: Representation = "hybrid"
    dense_dim: int | None = None
    dense_proj_seed: int = 0
    doc_top_k: int = 384
    query_top_k: int | None = None
    ot_activation: OTActivation = "none"
    sparse_weight: float | int = 1.0
    special_token_ids: list[int] | None = None

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        if self.dense_dim is None:  # written out as a number, so a saved config keeps its d' whatever the default
            self.dense_dim = self.hidden_size if self.representation == "cls" else min(384, self.hidden_size)

    def validate_dupmae_fields(self) -> None:
        check_weight("bow_loss_weight", self.bow_loss_weight, " (paper: 1.0, official code: 0.1)")
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
            set_hint=lambda name, value: (f""": set it with {name}={value} (CLI: --method-options '{{"{name}": """
                                          f"""{value}}}', or method_options: {name} in a config)"""),
        )
        if self.special_token_ids is not None:
            bad = [i for i in self.special_token_ids if not 0 <= i < self.vocab_size]
            if bad:
                raise ValueError(f"special_token_ids {bad} lie outside [0, vocab_size={self.vocab_size})")


__all__ = ["REPRESENTATIONS", "TABLE4_REPRESENTATIONS", "DupMAEConfig"]
