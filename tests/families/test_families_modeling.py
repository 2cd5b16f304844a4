"""Every method on RoBERTa, XLM-R and ModernBERT bases: the base's own encoder, MLM head and positions; the decoders'
positions; checkpoints that load as remote code without our package."""

import dataclasses

import pytest
import torch
from retromae.modeling.backbones import BACKBONES, Backbone, BertBackbone, DecoderEmbeddings, ModernBertBackbone
from retromae.modeling.modeling_bow import BoWForPretraining
from retromae.modeling.modeling_dupmae import DupMAEForPretraining
from retromae.modeling.modeling_retromae import RetroMAEForPretraining
from retromae.modeling.modeling_seed import SEEDEncoderForPretraining
from retromae.modeling.modeling_sentmae import SentMAEForPretraining
from transformers import AutoModelForMaskedLM, AutoTokenizer

from ..builders import load_in_fresh_process, save_tiny_masked_lm, tiny_bpe_tokenizer

FAMILIES = ("tiny_roberta", "tiny_xlm_roberta", "tiny_modernbert")
# (class, method options): every method, both RetroMAE decodings and query streams
METHODS = {
    "enhanced": (RetroMAEForPretraining, {}),
    "enhanced-reference": (RetroMAEForPretraining, {"decoder_visibility": "reference", "decoder_targets": "reference"}),
    "enhanced-embeddings": (RetroMAEForPretraining, {"query_stream": "embeddings"}),
    "basic": (RetroMAEForPretraining, {"decoding": "basic", "num_decoder_layers": 2}),
    "dupmae": (DupMAEForPretraining, {"dense_dim": 16, "doc_top_k": 40, "query_top_k": 40}),
    "bow": (BoWForPretraining, {}),
    "seed": (SEEDEncoderForPretraining, {}),
    "sentmae": (SentMAEForPretraining, {"contrastive_loss_weight": 0.0}),
}
TEXTS = ["the cat sat on the mat and looked at the dog", "a short line", "retrieval needs a good sentence embedding"]


def test_a_family_declares_the_whole_backbone_interface():
    """A family that leaves out part of `Backbone` is refused where it is defined, naming what it lacks; ModernBERT,
    whose layout is not BERT's, inherits nothing from BertBackbone."""
    with pytest.raises(TypeError, match=r"backbone Partial does not declare \['head_norm', 'position_ids'\]"):
        type("Partial", (Backbone,), {
            **{name: getattr(BertBackbone, name) for name in Backbone.__annotations__ if name != "head_norm"},
            **{name: getattr(BertBackbone, name) for name in Backbone.family_methods if name != "position_ids"},
        })
    assert all(issubclass(backbone, Backbone) for backbone in BACKBONES)
    assert not issubclass(ModernBertBackbone, BertBackbone)


def family_batch(folder, seed: int = 0) -> dict[str, torch.Tensor]:
    """The collator's keys for `TEXTS` under the folder's tokenizer: about a third of the ordinary tokens masked."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    encoded = tokenizer(TEXTS, padding=True, return_tensors="pt", return_special_tokens_mask=True)
    ids, attention = encoded["input_ids"], encoded["attention_mask"]
    ordinary = (encoded["special_tokens_mask"] == 0) & attention.bool()
    generator = torch.Generator().manual_seed(seed)
    masked_positions = ordinary & (torch.rand(ids.shape, generator=generator) < 0.35)
    masked_positions[:, 1] = True  # every row has a label
    word_starts = torch.zeros_like(ids)
    for row in range(len(TEXTS)):
        previous = None
        for col, word in enumerate(encoded.word_ids(row)):
            word_starts[row, col] = int(word is not None and word != previous)
            previous = word
    return {
        "input_ids": ids.masked_fill(masked_positions, tokenizer.mask_token_id),
        "attention_mask": attention,
        "encoder_labels": ids.masked_fill(~masked_positions, -100),
        "decoder_labels": ids.masked_fill(~ordinary, -100),
        "decoder_word_starts": word_starts,
    }


def method_model(klass, folder, options: dict):
    tokenizer = AutoTokenizer.from_pretrained(folder)
    has_mask_id = "mask_token_id" in {f.name for f in dataclasses.fields(klass.config_class)}
    extra = {"mask_token_id": tokenizer.mask_token_id} if has_mask_id else {}
    torch.manual_seed(0)
    return klass.from_encoder_checkpoint(folder, **extra, **options).eval()


def batch_for(klass, batch: dict) -> dict:
    names = ("input_ids", "attention_mask", "encoder_labels", "decoder_labels", *klass.method_input_names)
    return {k: v for k, v in batch.items() if k in names}


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("family", FAMILIES)
def test_encoder_mlm_loss_equals_the_bases_own_masked_lm(family, method, request):
    folder = request.getfixturevalue(family)
    klass, options = METHODS[method]
    model = method_model(klass, folder, options)
    batch = family_batch(folder)
    base = AutoModelForMaskedLM.from_pretrained(folder).eval()
    with torch.no_grad():
        expected = base(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                        labels=batch["encoder_labels"]).loss
    out = model(**batch_for(klass, batch))
    assert torch.allclose(out.encoder_mlm_loss, expected, atol=1e-5), (out.encoder_mlm_loss, expected)
    assert torch.isfinite(out.loss)
    out.loss.backward()  # every term reaches the encoder
    assert model.backbone.word_embeddings(model.base_model).weight.grad.abs().sum() > 0


@pytest.mark.parametrize("family, prefix, head", [
    ("tiny_roberta", "roberta.", "lm_head."), ("tiny_xlm_roberta", "roberta.", "lm_head."),
    ("tiny_modernbert", "model.", "lm_head."),
])
def test_the_encoder_and_head_keep_the_bases_names_and_weights(family, prefix, head, request):
    folder = request.getfixturevalue(family)
    model = method_model(RetroMAEForPretraining, folder, {})
    base = AutoModelForMaskedLM.from_pretrained(folder)
    ours = model.state_dict()
    for name, value in base.state_dict().items():
        if name.startswith(prefix):
            assert torch.equal(ours[name], value), name
    head_keys = [k for k in ours if k.startswith(head)]
    assert head_keys and not any(k.startswith("cls.") or k.startswith("bert.") for k in ours)
    base_head = {k: v for k, v in base.state_dict().items() if not k.startswith(prefix)}
    renamed = {k if k.startswith("lm_head.") else f"lm_head.{k}": v for k, v in base_head.items()}
    for name, value in renamed.items():
        assert torch.equal(ours[name], value), name
    # the MLM output matrix is tied to the word embeddings, as in the base
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


@pytest.mark.parametrize("family", FAMILIES)
def test_a_headless_base_gets_a_new_head_tied_as_the_base_ties_it(family, tmp_path):
    name = family.removeprefix("tiny_").replace("_", "-")
    folder = save_tiny_masked_lm(tmp_path / name, name, tiny_bpe_tokenizer(name), headless=True)
    model = method_model(DupMAEForPretraining, folder, METHODS["dupmae"][1])
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    out = model(**batch_for(DupMAEForPretraining, family_batch(folder)))
    assert torch.isfinite(out.loss)


def test_roberta_decoder_positions_carry_the_padding_offset(tiny_roberta):
    model = method_model(RetroMAEForPretraining, tiny_roberta, {})
    embeddings = model.base_model.embeddings
    assert model.decoder.position_embeddings is None  # the encoder's table serves the decoder
    first = embeddings.padding_idx + 1
    expected = embeddings.position_embeddings.weight[first : first + 7]
    assert torch.equal(model.decoder_embeddings().positions(7)[0], expected)
    # the position e(x_i) + p_i of the content stream uses is the one the encoder gives that token
    ids = family_batch(tiny_roberta)["input_ids"][:1]
    assert torch.equal(model.decoder_embeddings().tokens(ids), embeddings(input_ids=ids))


def test_modernbert_decoder_learns_its_own_positions_and_reconstruction_depends_on_them(tiny_modernbert):
    model = method_model(RetroMAEForPretraining, tiny_modernbert, {})
    table = model.decoder.position_embeddings
    assert table is not None and table.num_embeddings == model.config.max_position_embeddings
    assert "decoder.position_embeddings.weight" in model.state_dict()
    batch = batch_for(RetroMAEForPretraining, family_batch(tiny_modernbert))
    with torch.no_grad():
        torch.manual_seed(1)
        before = model(**batch).decoder_loss
        table.weight.copy_(table.weight.roll(3, dims=0))  # same vectors, other positions
        torch.manual_seed(1)
        after = model(**batch).decoder_loss
    assert not torch.isclose(before, after)
    # the query of row i is h + p_i: rows differ only by their position
    h = torch.randn(1, model.config.hidden_size)
    query = h[:, None, :] + model.decoder_embeddings().positions(5)
    assert torch.allclose(query[0, 2] - query[0, 1], table.weight[2] - table.weight[1], atol=1e-6)


def test_seed_decoder_on_modernbert_orders_the_window_by_position(tiny_modernbert):
    model = method_model(SEEDEncoderForPretraining, tiny_modernbert, {})
    assert model.decoder.position_embeddings is not None
    batch = batch_for(SEEDEncoderForPretraining, family_batch(tiny_modernbert))
    with torch.no_grad():
        before = model(**batch).decoder_loss
        model.decoder.position_embeddings.weight.mul_(0)
        after = model(**batch).decoder_loss
    assert not torch.isclose(before, after)


def test_copy_last_layer_is_refused_for_modernbert_and_works_for_roberta(tiny_modernbert, tiny_roberta):
    with pytest.raises(ValueError, match="decoder_init='copy_last_layer' copies a BERT-layout layer"):
        method_model(RetroMAEForPretraining, tiny_modernbert, {"decoder_init": "copy_last_layer"})
    model = method_model(RetroMAEForPretraining, tiny_roberta, {"decoder_init": "copy_last_layer"})
    last = model.base_model.encoder.layer[-1].state_dict()
    for name, value in model.decoder.layers[0].state_dict().items():
        assert torch.equal(value, last[name]), name


@pytest.mark.parametrize("family, method", [
    ("tiny_modernbert", "dupmae"),
    # a fresh interpreter each (8 s): the rest run in `make smoke`
    *(pytest.param(*case, marks=pytest.mark.long) for case in [
        ("tiny_roberta", "enhanced"), ("tiny_xlm_roberta", "bow"), ("tiny_modernbert", "enhanced"),
        ("tiny_roberta", "seed")]),
])
def test_checkpoints_load_as_remote_code_without_our_package(family, method, request, tmp_path, run_without_retromae):
    folder = request.getfixturevalue(family)
    klass, options = METHODS[method]
    model = method_model(klass, folder, options)
    batch = batch_for(klass, family_batch(folder))
    _, report = load_in_fresh_process(run_without_retromae, model, batch, tmp_path)
    assert report["classes"][2] == klass.__name__
    assert report["classes"][1] == klass.any_encoder_class.__name__
    assert report["tied"]
    with torch.no_grad():
        torch.manual_seed(0)
        out = model(**batch)
    assert torch.allclose(torch.tensor(report["cls"]), out.sentence_embedding, atol=1e-5)
    for name, value in report["losses"].items():
        assert abs(getattr(out, name).item() - value) < 1e-5, name


def test_decoder_embeddings_on_bert_are_the_encoders_module(tiny_bert):
    """BERT keeps exactly the calls it had: the encoder's table at positions 0.. and its embedding module."""
    model = RetroMAEForPretraining.from_encoder_checkpoint(tiny_bert).eval()
    embeddings = model.decoder_embeddings()
    assert isinstance(embeddings, DecoderEmbeddings) and embeddings.own_positions is None
    table = model.bert.embeddings.position_embeddings.weight
    assert torch.equal(embeddings.positions(6)[0], table[:6])
