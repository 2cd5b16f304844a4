"""DupMAE: config, OT decoding (chunked mu, BoW loss), ablations, encoder + remote code, sentence-transformers export."""

from __future__ import annotations

import json
import math
import os
import textwrap

import pytest
import torch
import torch.nn.functional as F
from huggingface_hub.errors import StrictDataclassError
from retromae.modeling.configuration_dupmae import TABLE4_REPRESENTATIONS, DupMAEConfig
from retromae.modeling.layers_dupmae import ordinary_token_mask, ot_vector, sparsify_top_k, token_max_logits
from retromae.modeling.modeling_dupmae import DupMAEForPretraining, DupMAEModel, ot_bag_of_words_targets
from retromae.modeling.st_dupmae import DupMAEPooling, decode, save_sentence_transformer
from retromae.modeling.vocab_losses import bag_of_words_loss, bag_of_words_targets

from ..builders import tiny_bert_kwargs

TEXTS = [
    "Dense retrievers encode text into vectors.",
    "Bananas are yellow and bananas are sweet.",
    "RetroMAE pre-trains encoders with a masked auto-encoder.",
]
QUERIES = ["what do dense retrievers do?", "which fruit is yellow"]


def tiny_config(tokenizer=None, **overrides) -> DupMAEConfig:
    kwargs = dict(dense_dim=16, doc_top_k=8)
    if tokenizer is not None:
        kwargs["special_token_ids"] = tokenizer.all_special_ids
    kwargs.update(overrides)
    return DupMAEConfig(**tiny_bert_kwargs(), **kwargs)


def make_batch(tokenizer, texts=TEXTS, mask_every: int = 4, seed: int = 0) -> dict[str, torch.Tensor]:
    """A collator-shaped batch: every `mask_every`-th ordinary token masked for the encoder."""
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    ids, attention = enc["input_ids"], enc["attention_mask"]
    special = torch.isin(ids, torch.tensor(tokenizer.all_special_ids))
    ordinary = attention.bool() & ~special
    decoder_labels = ids.masked_fill(~ordinary, -100)
    positions = torch.arange(ids.shape[1])[None, :].expand_as(ids)
    masked = ordinary & (positions % mask_every == 1)
    encoder_labels = ids.masked_fill(~masked, -100)
    input_ids = ids.masked_fill(masked, tokenizer.mask_token_id)
    return dict(
        input_ids=input_ids, attention_mask=attention, encoder_labels=encoder_labels, decoder_labels=decoder_labels
    )


# ---- config ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(dense_dim=0), "dense_dim"),
        (dict(dense_dim=33), "dense_dim"),  # > hidden_size 32: no d' > d
        (dict(doc_top_k=0), "doc_top_k"),
        (dict(doc_top_k=30523), "doc_top_k"),  # > vocab_size
        (dict(query_top_k=0), "query_top_k"),
        (dict(query_top_k=40000), "query_top_k"),
        (dict(bow_loss_weight=-0.1), "bow_loss_weight"),
        (dict(cls_decoding=False, ot_decoding=False), "cls_decoding"),
        (dict(representation="mean"), "representation"),
        (dict(representation="cls", dense_dim=16), "representation='cls'"),
        (dict(special_token_ids=[101, 40000]), "special_token_ids"),
        (dict(ot_activation="relu"), "ot_activation"),
        (dict(sparse_weight=0.0), "sparse_weight"),
    ],
)
def test_config_rejects_bad_values(overrides, field):
    with pytest.raises((ValueError, StrictDataclassError), match=field):
        tiny_config(**overrides)


def test_dense_dim_error_names_the_flag_that_sets_it():
    with pytest.raises((ValueError, StrictDataclassError)) as error:
        tiny_config(dense_dim=384)  # the paper's d' on a model with hidden_size 32
    assert """--method-options '{"dense_dim": 32}'""" in str(error.value)
    with pytest.raises((ValueError, StrictDataclassError)) as error:  # HEAD: no hint for doc_top_k
        tiny_config(doc_top_k=40000)  # on a vocabulary of 30,522
    assert """--method-options '{"doc_top_k": 30522}'""" in str(error.value)


@pytest.mark.parametrize(("hidden_size", "representation", "dense_dim"), [
    (768, "hybrid", 384), (384, "hybrid", 384), (32, "hybrid", 32), (32, "cls", 32), (384, "cls", 384),
])
def test_the_default_dense_dim_fits_the_base(hidden_size, representation, dense_dim):
    """HEAD: 384 whatever the base, so a base narrower than 384 (or "cls" on one other than 384 wide) was refused
    until the user set dense_dim. The resolved value is saved, so the config reloads with it."""
    config = DupMAEConfig(**{**tiny_bert_kwargs(), "hidden_size": hidden_size, "num_attention_heads": 4,
                             "representation": representation})
    assert config.dense_dim == dense_dim
    assert DupMAEConfig.from_dict(config.to_dict()).dense_dim == dense_dim


def test_config_defaults_and_table4_presets():
    config = DupMAEConfig()  # bert-base sizes
    assert (config.bow_loss_weight, config.dense_dim, config.doc_top_k, config.query_top_k) == (1.0, 384, 384, None)
    assert config.cls_decoding and config.ot_decoding and config.representation == "hybrid"
    for preset in TABLE4_REPRESENTATIONS.values():
        DupMAEConfig(**preset)  # all valid at hidden_size 768, |V| 30522
    round_trip = DupMAEConfig.from_dict(tiny_config(special_token_ids=[0, 101]).to_dict())
    assert round_trip.special_token_ids == [0, 101] and round_trip.model_type == "dupmae"


# ---- OT decoding -----------------------------------------------------------------------------------------------------


def test_bow_loss_hand_checkable():
    # softmax(mu) = [1/2, 1/4, 1/8, 1/8]; the row's ordinary tokens are 0, 1, 0 (-100 = special / padding)
    mu = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125]]))
    labels = torch.tensor([[-100, 0, 1, 0, -100]])
    targets = bag_of_words_targets(labels, 4)
    assert torch.equal(targets, torch.tensor([[0.5, 0.5, 0.0, 0.0]]))  # set {0, 1}, repeats count once
    # -(log 1/2 + log 1/4) / 2 = (ln 2 + 2 ln 2) / 2 = 1.5 ln 2
    assert bag_of_words_loss(mu, targets).item() == pytest.approx(1.5 * math.log(2), abs=1e-6)


def naive_mu(hidden, weight, bias, keep):
    logits = hidden @ weight.T + bias  # (B, L, V) materialised
    mu = logits.masked_fill(~keep[:, :, None], float("-inf")).max(dim=1).values
    return torch.where(keep.any(1)[:, None], mu, torch.zeros_like(mu))


@pytest.mark.parametrize("chunk_size", [1, 7, 4096])
def test_chunked_mu_equals_naive_with_equal_gradients(chunk_size):
    torch.manual_seed(0)
    B, L, H, V = 3, 9, 8, 50
    keep = torch.rand(B, L) > 0.3
    keep[2] = False  # a row without ordinary tokens: mu = 0, no gradient
    leaves = [
        torch.randn(B, L, H, dtype=torch.float64),
        torch.randn(V, H, dtype=torch.float64),
        torch.randn(V, dtype=torch.float64),
    ]
    grad_mu = torch.randn(B, V, dtype=torch.float64)
    results = []
    for fn in (naive_mu, lambda h, w, b, k: token_max_logits(h, w, b, k, chunk_size=chunk_size)):
        inputs = [x.clone().requires_grad_() for x in leaves]
        mu = fn(*inputs, keep)
        (mu * grad_mu).sum().backward()
        results.append((mu.detach(), [x.grad for x in inputs]))
    (mu_naive, grads_naive), (mu_chunked, grads_chunked) = results
    torch.testing.assert_close(mu_chunked, mu_naive, rtol=1e-12, atol=1e-12)  # float64 throughout
    assert torch.equal(mu_chunked[2], torch.zeros(V, dtype=torch.float64))
    for g_chunked, g_naive in zip(grads_chunked, grads_naive, strict=True):
        torch.testing.assert_close(g_chunked, g_naive)
    with torch.no_grad():  # the inference path (no arg-max bookkeeping) gives the same mu
        torch.testing.assert_close(token_max_logits(*leaves, keep, chunk_size=chunk_size), mu_naive)


def test_ot_vector_packs_kept_positions_without_changing_mu_or_gradients():
    """ot_vector packs the kept positions to the front before the head; mu and every gradient equal the head run on
    all positions followed by a masked max (rows with different kept counts, one with none)."""
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertOnlyMLMHead

    torch.manual_seed(0)
    head = BertOnlyMLMHead(BertConfig(hidden_size=8, vocab_size=50)).double()
    B, L = 4, 11
    keep = torch.rand(B, L) > 0.4
    keep[1] = False
    keep[2, :] = False
    keep[2, -1] = True  # the only kept position is the last one
    hidden = torch.randn(B, L, 8, dtype=torch.float64)
    grad_mu = torch.randn(B, 50, dtype=torch.float64)
    results = []
    for fn in (lambda h: naive_mu(head.predictions.transform(h), head.predictions.decoder.weight,
                                  head.predictions.decoder.bias, keep),
               lambda h: ot_vector(h, keep, head.predictions.transform, head.predictions.decoder.weight,
                                   head.predictions.decoder.bias, chunk_size=5)):
        head.zero_grad()
        h = hidden.clone().requires_grad_()
        mu = fn(h)
        (mu * grad_mu).sum().backward()
        results.append((mu.detach(), h.grad, [(n, p.grad.clone()) for n, p in head.named_parameters() if p.grad is not None]))
    (mu_a, gh_a, gp_a), (mu_b, gh_b, gp_b) = results
    torch.testing.assert_close(mu_b, mu_a)
    torch.testing.assert_close(gh_b, gh_a)
    assert [n for n, _ in gp_b] == [n for n, _ in gp_a] and len(gp_a) >= 5  # transform + decoder
    for (_, a), (_, b) in zip(gp_a, gp_b, strict=True):
        torch.testing.assert_close(b, a)


def test_bow_normalizations_hand_checkable():
    # softmax(mu) = [1/2, 1/4, 1/8, 1/8]; the row's ordinary tokens are 0, 1, 0: n = 3, unique set S = {0, 1}
    mu = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125]]))
    labels = torch.tensor([[-100, 0, 1, 0, -100]])
    unique = ot_bag_of_words_targets(labels, 4, "unique")
    official = ot_bag_of_words_targets(labels, 4, "all_tokens")
    assert torch.equal(unique, torch.tensor([[0.5, 0.5, 0.0, 0.0]]))  # 1/|S| on each id of S
    torch.testing.assert_close(official, torch.tensor([[1 / 3, 1 / 3, 0.0, 0.0]]))  # 1/n, repeats overwrite
    # "unique": (ln 2 + 2 ln 2) / 2 = 1.5 ln 2;  "all_tokens": (ln 2 + 2 ln 2) / 3 = ln 2
    assert bag_of_words_loss(mu, unique).item() == pytest.approx(1.5 * math.log(2), abs=1e-6)
    assert bag_of_words_loss(mu, official).item() == pytest.approx(math.log(2), abs=1e-6)
    with pytest.raises((ValueError, StrictDataclassError), match="bow_normalization"):
        tiny_config(bow_normalization="tokens")


@pytest.mark.parametrize("normalization", ["unique", "all_tokens"])
def test_pretraining_bow_loss_matches_naive_computation(tokenizer, normalization):
    torch.manual_seed(0)
    model = DupMAEForPretraining(tiny_config(tokenizer, loss_chunk_size=8, bow_normalization=normalization)).eval()
    batch = make_batch(tokenizer)
    out = model(**batch)
    hidden = model.bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    keep = (batch["decoder_labels"] != -100) & (batch["encoder_labels"] == -100)  # unmasked ordinary tokens
    logits = model.cls(hidden)  # (B, L, V)
    mu = logits.masked_fill(~keep[:, :, None], float("-inf")).max(1).values
    expected = []
    for row, labels in zip(mu, batch["decoder_labels"], strict=True):
        ordinary = labels[labels != -100]
        bag = ordinary.unique()
        # "unique": mean over the unique ordinary tokens; "all_tokens": their sum over n, repeats counted in n
        norm = len(bag) if normalization == "unique" else len(ordinary)
        expected.append(-F.log_softmax(row, -1)[bag].sum() / norm)
    assert out.bow_loss.item() == pytest.approx(torch.stack(expected).mean().item(), abs=1e-5)
    total = out.encoder_mlm_loss + out.decoder_loss + out.bow_loss
    assert out.loss.item() == pytest.approx(total.item(), abs=1e-5)


@pytest.mark.parametrize(
    "cls_decoding, ot_decoding", [(True, False), (False, True), (True, True)], ids=["cls-only", "ot-only", "both"]
)
def test_ablation_configs_train(tokenizer, cls_decoding, ot_decoding):
    torch.manual_seed(0)
    config = tiny_config(tokenizer, cls_decoding=cls_decoding, ot_decoding=ot_decoding, bow_loss_weight=0.1)
    model = DupMAEForPretraining(config)
    assert (model.decoder is not None) == cls_decoding
    out = model(**make_batch(tokenizer))
    assert (out.decoder_loss is not None) == cls_decoding and (out.bow_loss is not None) == ot_decoding
    expected = out.encoder_mlm_loss
    if cls_decoding:
        expected = expected + out.decoder_loss
    if ot_decoding:
        expected = expected + 0.1 * out.bow_loss
    assert out.loss.item() == pytest.approx(expected.item(), abs=1e-5)
    assert out.sentence_embedding.shape == (len(TEXTS), 32)
    out.loss.backward()
    assert model.bert.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    unused = [n for n, p in model.named_parameters() if p.grad is None]
    assert unused == []  # nothing built that the loss does not use (DDP-safe)


# ---- special tokens --------------------------------------------------------------------------------------------------


def test_specials_excluded_by_tokenizer_ids(tokenizer):
    enc = tokenizer(TEXTS, padding=True, return_tensors="pt")
    ids, attention = enc["input_ids"], enc["attention_mask"]
    keep = ordinary_token_mask(ids, attention, tokenizer.all_special_ids)
    specials = {tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id}
    expected = torch.tensor(
        [
            [bool(a) and int(i) not in specials for i, a in zip(r, m, strict=True)]
            for r, m in zip(ids, attention, strict=True)
        ]
    )
    assert torch.equal(keep, expected)
    # BERT layout: the fallback (no ids) gives the same positions
    assert torch.equal(ordinary_token_mask(ids, attention, None), expected)
    # and the encoder's mu pools exactly over them
    torch.manual_seed(0)
    model = DupMAEModel(tiny_config(tokenizer)).eval()
    with torch.no_grad():
        out = model(**enc)
        naive = model.cls(out.last_hidden_state).masked_fill(~expected[:, :, None], float("-inf")).max(1).values
    torch.testing.assert_close(out.ot_embedding, naive)


def test_specials_excluded_roberta_layout():
    # RoBERTa ids: <s>=0, <pad>=1, </s>=2, <mask>=50264; ordinary ids include 101/102 (BERT's [CLS]/[SEP] ids)
    ids = torch.tensor([[0, 101, 713, 102, 2, 1], [0, 9, 2, 1, 1, 1], [0, 2, 1, 1, 1, 1]])
    attention = (ids != 1).long()
    expected = torch.tensor(
        [
            [False, True, True, True, False, False],
            [False, True, False, False, False, False],
            [False, False, False, False, False, False],  # empty text: no ordinary token
        ]
    )
    assert torch.equal(ordinary_token_mask(ids, attention, [0, 1, 2, 3, 50264]), expected)
    assert torch.equal(ordinary_token_mask(ids, attention, None), expected)  # <s> ... </s> is the same layout
    # BERT's ids would be wrong here: they would drop the ordinary tokens 101 and 102
    assert not torch.equal(ordinary_token_mask(ids, attention, [0, 100, 101, 102, 103]), expected)


# ---- encoder ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("representation", ["hybrid", "cls", "ot"])
def test_encoder_representations(tokenizer, representation):
    torch.manual_seed(0)
    dense_dim = 32 if representation == "cls" else 16
    model = DupMAEModel(tiny_config(tokenizer, representation=representation, dense_dim=dense_dim)).eval()
    enc = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**enc)
    assert out.pooler_output.shape == (3, 32)
    assert torch.equal(out.pooler_output, out.last_hidden_state[:, 0])
    assert (out.dense_embedding is None) == (representation == "ot")
    assert (out.ot_embedding is None) == (representation == "cls")
    if representation == "hybrid":
        assert out.dense_embedding.shape == (3, 16) and out.ot_embedding.shape == (3, 30522)
        doc = model.hybrid_embedding(out, "document")
        assert doc.shape == (3, 16 + 30522) and int((doc[:, 16:] != 0).sum(1).max()) == 8
        assert torch.equal(model.hybrid_embedding(out, "query")[:, 16:], out.ot_embedding)  # full mu for queries
    if representation == "cls":
        assert torch.equal(out.dense_embedding, out.pooler_output)


REMOTE_LOAD = textwrap.dedent(
    """
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForPreTraining
    ids = torch.tensor({ids})
    attention = torch.tensor({attention})
    model = AutoModel.from_pretrained(".", trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
    assert type(model).__name__ == "DupMAEModel", type(model)
    assert type(AutoModelForPreTraining.from_pretrained(".", trust_remote_code=True)).__name__ == "DupMAEForPretraining"
    assert AutoConfig.from_pretrained(".", trust_remote_code=True).model_type == "dupmae"
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=attention)
    torch.save({{"pooler": out.pooler_output, "ot": out.ot_embedding, "dense": out.dense_embedding}}, "out.pt")
    """
)


@pytest.fixture
def run_fresh_python(run_without_retromae):
    return lambda code, cwd, tmp_path: _run_fresh_python(run_without_retromae, code, cwd, tmp_path)


def _run_fresh_python(run_without_retromae, code: str, cwd, tmp_path) -> None:
    """Run `code` in a fresh interpreter where retromae is not importable (a user's machine)."""
    guard = "try:\n    import retromae\n    raise SystemExit('retromae is importable')\nexcept ImportError:\n    pass\n"
    env = dict(os.environ, HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1")
    result = run_without_retromae(guard + code, [], cwd=cwd, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.long
def test_pretraining_checkpoint_loads_as_automodel_remote_code(run_fresh_python, tokenizer, tmp_path):
    torch.manual_seed(0)
    model = DupMAEForPretraining(tiny_config(tokenizer))
    checkpoint = tmp_path / "ckpt"
    model.save_pretrained(checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["auto_map"]["AutoModel"] == "modeling_dupmae.DupMAEModel"
    assert (
        config["special_token_ids"] == sorted(tokenizer.all_special_ids)
        or config["special_token_ids"] == tokenizer.all_special_ids
    )
    enc = tokenizer(TEXTS, padding=True, return_tensors="pt")
    code = REMOTE_LOAD.format(ids=enc["input_ids"].tolist(), attention=enc["attention_mask"].tolist())
    run_fresh_python(code, checkpoint, tmp_path)
    remote = torch.load(checkpoint / "out.pt")

    encoder, info = DupMAEModel.from_pretrained(checkpoint, output_loading_info=True)
    assert info["missing_keys"] == {"dense_proj.weight", "dense_proj.bias"}  # learnt in fine-tuning
    assert info["unexpected_keys"] and all(k.startswith("decoder.") for k in info["unexpected_keys"])
    encoder.eval()
    with torch.no_grad():
        local = encoder(**enc)
        hidden = model.eval().bert(**enc).last_hidden_state
    torch.testing.assert_close(remote["pooler"], local.pooler_output)
    torch.testing.assert_close(remote["pooler"], hidden[:, 0])  # the pre-training model's own [CLS] state
    torch.testing.assert_close(remote["ot"], local.ot_embedding)
    assert remote["dense"].shape == (3, 16)
    # the fresh projection is a function of the config (dense_proj_seed), not of either process's global RNG
    torch.testing.assert_close(remote["dense"], local.dense_embedding)


def test_automodel_and_export_give_the_same_dense_vectors(run_fresh_python, tokenizer, tmp_path):
    from retromae.trainers.export.dupmae import load_dupmae_sentence_transformer
    from retromae.trainers.export.sentence_transformer import export_sentence_transformer

    torch.manual_seed(0)
    checkpoint = tmp_path / "ckpt"
    DupMAEForPretraining(tiny_config(tokenizer)).save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    enc = tokenizer(TEXTS, padding=True, return_tensors="pt")
    run_fresh_python(  # AutoModel(trust_remote_code) on the checkpoint, in a process whose global RNG differs
        "import torch\ntorch.manual_seed(1234)\n"
        + REMOTE_LOAD.format(ids=enc["input_ids"].tolist(), attention=enc["attention_mask"].tolist()),
        checkpoint,
        tmp_path,
    )
    automodel_dense = torch.load(checkpoint / "out.pt")["dense"]
    torch.manual_seed(99)
    exported = load_dupmae_sentence_transformer(export_sentence_transformer(checkpoint, tmp_path / "st"))
    export_dense = exported.encode_document(TEXTS, convert_to_tensor=True)[:, :16]  # [dense (16) ; sparse]
    torch.testing.assert_close(export_dense, automodel_dense, atol=1e-5, rtol=1e-5)
    assert automodel_dense.abs().sum() > 0
    other_seed = DupMAEModel(tiny_config(tokenizer, dense_proj_seed=1))
    assert not torch.equal(other_seed.dense_proj.weight, DupMAEModel(tiny_config(tokenizer)).dense_proj.weight)


# ---- sentence-transformers export ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(tokenizer, tmp_path_factory):
    """A fine-tuned-like DupMAEModel (trained dense_proj stand-in) and its sentence-transformers export."""
    from retromae.trainers.export.sentence_transformer import build_dupmae_sentence_transformer

    torch.manual_seed(0)
    encoder = DupMAEModel(tiny_config(tokenizer)).eval()
    out = tmp_path_factory.mktemp("export") / "dupmae-st"
    model = build_dupmae_sentence_transformer(encoder, tokenizer, out, max_seq_length=64)
    return encoder, model, out


def test_export_layout(exported):
    _, model, out = exported
    modules = json.loads((out / "modules.json").read_text())
    assert modules[1]["type"] == "st_dupmae.DupMAEPooling"
    assert (out / "st_dupmae.py").is_file() and (out / "layers_dupmae.py").is_file()
    assert json.loads((out / "config.json").read_text())["model_type"] == "bert"
    assert "auto_map" not in json.loads((out / "config.json").read_text())
    pooling_config = json.loads((out / "1_DupMAEPooling" / "config.json").read_text())
    assert {"hidden_size", "vocab_size", "dense_dim", "doc_top_k", "query_top_k", "special_token_ids"} <= set(
        pooling_config
    )
    assert (out / "1_DupMAEPooling" / "model.safetensors").is_file()
    assert model.similarity_fn_name == "dot"
    assert model.get_embedding_dimension() == 16 + 30522
    from transformers import BertModel

    _, info = BertModel.from_pretrained(out, add_pooling_layer=False, output_loading_info=True)
    assert not any(info.values())  # plain BERT weights, nothing missing or unexpected


def test_export_similarity_equals_eq12(exported, tokenizer):
    encoder, model, _ = exported
    q = model.encode_query(QUERIES, convert_to_tensor=True)
    d = model.encode_document(TEXTS, convert_to_tensor=True)
    scores = model.similarity(q, d)  # (2, 3), dot product of the concatenations
    with torch.no_grad():
        qo = encoder(**tokenizer(QUERIES, padding=True, return_tensors="pt"))
        do = encoder(**tokenizer(TEXTS, padding=True, return_tensors="pt"))
    top_k = do.ot_embedding.topk(8, dim=-1).indices  # I_d, the document's top-k ids
    expected = torch.empty(2, 3)
    for i in range(2):
        for j in range(3):
            dense = qo.dense_embedding[i] @ do.dense_embedding[j]
            sparse = (qo.ot_embedding[i, top_k[j]] * do.ot_embedding[j, top_k[j]]).sum()
            expected[i, j] = dense + sparse  # eq. 12
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=1e-6)
    # documents keep exactly k entries, queries the full mu
    assert int((d[:, 16:] != 0).sum(1).max()) == 8
    assert int((q[:, 16:] != 0).sum(1).min()) > 8


def test_saturated_weighted_export_equals_weighted_eq12(exported, tokenizer, tmp_path):
    """ot_activation="log1p_relu" + sparse_weight=lambda: score = dense + lambda * sum over I_d of sat(mu_q) sat(mu_d),
    with I_d the top-k of the saturated document vector, in the export and in `DupMAEModel` alike."""
    from retromae.trainers.export.sentence_transformer import build_dupmae_sentence_transformer

    encoder, _, _ = exported
    model = build_dupmae_sentence_transformer(
        encoder, tokenizer, tmp_path / "sat", max_seq_length=64, ot_activation="log1p_relu", sparse_weight=0.25
    )
    q = model.encode_query(QUERIES, convert_to_tensor=True)
    d = model.encode_document(TEXTS, convert_to_tensor=True)
    with torch.no_grad():
        qo = encoder(**tokenizer(QUERIES, padding=True, return_tensors="pt"))
        do = encoder(**tokenizer(TEXTS, padding=True, return_tensors="pt"))
    assert do.ot_embedding.min() < 0  # the raw mu has negative entries for saturation to zero
    sat_q, sat_d = torch.log1p(qo.ot_embedding.relu()), torch.log1p(do.ot_embedding.relu())
    top_k = sat_d.topk(8, dim=-1).indices
    expected = qo.dense_embedding @ do.dense_embedding.T + 0.25 * torch.stack(
        [(sat_q[:, top_k[j]] * sat_d[j, top_k[j]]).sum(-1) for j in range(len(TEXTS))], dim=1
    )
    torch.testing.assert_close(model.similarity(q, d), expected, atol=1e-5, rtol=1e-6)
    assert "log1p_relu" in (tmp_path / "sat" / "README.md").read_text()  # the card states the representation
    twin = DupMAEModel(tiny_config(tokenizer, ot_activation="log1p_relu", sparse_weight=0.25)).eval()
    twin.load_state_dict(encoder.state_dict())
    with torch.no_grad():
        out = twin(**tokenizer(TEXTS, padding=True, return_tensors="pt"))
    torch.testing.assert_close(twin.hybrid_embedding(out, "document"), d, atol=1e-5, rtol=1e-6)


def test_encode_without_task_is_document_and_query_top_k(exported):
    _, model, _ = exported
    torch.testing.assert_close(
        model.encode(TEXTS, convert_to_tensor=True), model.encode_document(TEXTS, convert_to_tensor=True)
    )
    pooling = model[1]
    pooling.query_top_k = 5
    try:
        q = model.encode_query(QUERIES, convert_to_tensor=True)
        assert int((q[:, 16:] != 0).sum(1).max()) == 5
    finally:
        pooling.query_top_k = None


def test_task_in_features_selects_query_top_k(exported):
    """Training losses call the model without `task=`; the column's task then sits in features["task"]."""
    _, model, _ = exported
    pooling = model[1]
    pooling.query_top_k = 5
    try:
        with torch.no_grad():
            features = model.preprocess(QUERIES)
            as_keyword = model(dict(features), task="query")["sentence_embedding"]
            from_features = model({**features, "task": "query"})["sentence_embedding"]
            as_document = model({**features, "task": "document"})["sentence_embedding"]
        torch.testing.assert_close(from_features, as_keyword)
        assert int((from_features[:, 16:] != 0).sum(1).max()) == 5
        assert int((as_document[:, 16:] != 0).sum(1).max()) > 5
    finally:
        pooling.query_top_k = None


def test_decode_lists_top_ot_tokens(exported, tokenizer):
    _, model, _ = exported
    pairs = decode(model, TEXTS[0], top_k=5)
    mu = model.encode_query([TEXTS[0]], output_value="ot_embedding")[0]
    values, indices = mu.topk(5)
    assert [t for t, _ in pairs] == tokenizer.convert_ids_to_tokens(indices.tolist())
    assert [w for _, w in pairs] == pytest.approx(values.tolist())
    embedding = model.encode_query([TEXTS[0]], convert_to_tensor=True)[0]  # (16 + V,) concatenation works too
    assert [t for t, _ in decode(model, embedding, top_k=5)] == [t for t, _ in pairs]
    with pytest.raises(ValueError, match="empty"):
        decode(model, "  ")
    with pytest.raises(ValueError, match="top_k"):
        decode(model, TEXTS[0], top_k=0)


def test_pooling_rejects_bad_top_k():
    for kwargs in (dict(doc_top_k=0), dict(doc_top_k=101), dict(query_top_k=0), dict(dense_dim=33)):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            DupMAEPooling(hidden_size=32, vocab_size=100, **{"dense_dim": 16, "doc_top_k": 8, **kwargs})
    with pytest.raises(ValueError, match="task"):
        DupMAEPooling(hidden_size=32, vocab_size=100, dense_dim=16, doc_top_k=8).top_k_for("classification")


ST_REMOTE_LOAD = textwrap.dedent(
    """
    import importlib
    import torch
    from sentence_transformers import SentenceTransformer
    model = SentenceTransformer("{out}", trust_remote_code=True, device="cpu")
    assert type(model[1]).__module__.startswith("transformers_modules."), type(model[1]).__module__
    q = model.encode_query({queries}, convert_to_tensor=True)
    d = model.encode_document({texts}, convert_to_tensor=True)
    model.save("{plain}")  # sentence-transformers' own save (the module puts its code at the root too)
    plain = SentenceTransformer("{plain}", trust_remote_code=True, device="cpu")
    code = importlib.import_module(type(model[1]).__module__)  # st_dupmae as loaded from the model folder
    code.save_sentence_transformer(model, "{resaved}")
    again = SentenceTransformer("{resaved}", trust_remote_code=True, device="cpu")
    d2 = again.encode_document({texts}, convert_to_tensor=True)
    d3 = plain.encode_document({texts}, convert_to_tensor=True)
    torch.save({{"scores": model.similarity(q, d), "d": d, "d2": d2, "d3": d3}}, "{result}")
    """
)


def test_export_loads_in_fresh_process_and_resave_loads(run_fresh_python, exported, tmp_path):
    _, model, out = exported
    plain, resaved, result = tmp_path / "plain", tmp_path / "resaved", tmp_path / "result.pt"
    code = ST_REMOTE_LOAD.format(out=out, queries=QUERIES, texts=TEXTS, plain=plain, resaved=resaved, result=result)
    run_fresh_python(code, tmp_path, tmp_path)
    remote = torch.load(result)
    expected = model.similarity(
        model.encode_query(QUERIES, convert_to_tensor=True), model.encode_document(TEXTS, convert_to_tensor=True)
    )
    torch.testing.assert_close(remote["scores"], expected, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(remote["d2"], remote["d"])
    torch.testing.assert_close(remote["d3"], remote["d"])
    for folder in (resaved, plain):
        assert (folder / "st_dupmae.py").is_file() and (folder / "layers_dupmae.py").is_file()
        assert json.loads((folder / "modules.json").read_text())[1]["type"] == "st_dupmae.DupMAEPooling"
    assert (plain / "1_DupMAEPooling" / "st_dupmae.py").is_file()  # sentence-transformers' copy of the code


def test_pooling_save_puts_its_code_at_the_root_of_a_sentence_transformer_folder_only(exported, tmp_path):
    """Where sentence-transformers loads it from (HEAD wrote it nowhere: a re-saved model did not load, probe 78
    B-004); a module saved outside a SentenceTransformer folder writes into its own folder only."""
    _, model, _ = exported
    (tmp_path / "1_DupMAEPooling").mkdir()  # sentence-transformers creates the module's folder
    model[1].save(str(tmp_path / "1_DupMAEPooling"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1_DupMAEPooling"]
    (tmp_path / "config_sentence_transformers.json").write_text("{}")  # inside a SentenceTransformer folder
    model[1].save(str(tmp_path / "1_DupMAEPooling"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1_DupMAEPooling", "config_sentence_transformers.json",
                                                          "layers_dupmae.py", "st_dupmae.py"]
    assert {"config.json", "model.safetensors"} <= {p.name for p in (tmp_path / "1_DupMAEPooling").iterdir()}


def test_save_sentence_transformer_puts_the_code_at_the_root(exported, tmp_path):
    _, model, _ = exported
    out = save_sentence_transformer(model, tmp_path / "st")
    assert (out / "st_dupmae.py").is_file() and (out / "layers_dupmae.py").is_file()
    assert json.loads((out / "modules.json").read_text())[1]["type"] == "st_dupmae.DupMAEPooling"


@pytest.mark.parametrize(
    "settings",
    [dict(dense_dim=33), dict(representation="cls", dense_dim=16), dict(doc_top_k=0), dict(query_top_k=40000),
     dict(sparse_weight=0.0)],
)
def test_config_and_pooling_share_one_validation(settings):
    """The encoder's config and the sentence-transformers module check the representation with one function: the
    same message (the config adds the flag that sets dense_dim)."""
    fields = {"dense_dim": 16, "doc_top_k": 8, **settings}
    with pytest.raises(ValueError) as from_pooling:
        DupMAEPooling(hidden_size=32, vocab_size=30522, **fields)
    with pytest.raises(StrictDataclassError) as from_config:
        tiny_config(**fields)
    assert str(from_config.value.__cause__).startswith(str(from_pooling.value))


def test_sparsify_top_k_keeps_largest():
    mu = torch.tensor([[0.1, -2.0, 3.0, 0.5], [1.0, 2.0, 3.0, 4.0]])
    assert torch.equal(sparsify_top_k(mu, 2), torch.tensor([[0.0, 0.0, 3.0, 0.5], [0.0, 0.0, 3.0, 4.0]]))
    assert sparsify_top_k(mu, None) is mu


def test_export_of_pretraining_checkpoint_folder(tokenizer, tmp_path):
    from retromae.trainers.export.dupmae import load_dupmae_sentence_transformer
    from retromae.trainers.export.sentence_transformer import (
        build_dupmae_sentence_transformer,
        export_sentence_transformer,
    )

    torch.manual_seed(0)
    checkpoint = tmp_path / "ckpt"
    DupMAEForPretraining(tiny_config(tokenizer)).save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    out = export_sentence_transformer(checkpoint, tmp_path / "st")  # the generic exporter dispatches to ours
    assert json.loads((out / "modules.json").read_text())[1]["type"] == "st_dupmae.DupMAEPooling"
    card = " ".join((out / "README.md").read_text().split())
    assert "## DupMAE representation" in card and "the [CLS] state projected to 16 dimensions, concatenated" in card
    model = load_dupmae_sentence_transformer(out)
    assert model.encode_document(TEXTS).shape == (3, 16 + 30522)
    # a Table 4 setting at export time: OT only with k = 20
    ot_only = build_dupmae_sentence_transformer(
        checkpoint, tokenizer, tmp_path / "ot", representation="ot", doc_top_k=20
    )
    d = ot_only.encode_document(TEXTS, convert_to_tensor=True)
    assert d.shape == (3, 30522) and int((d != 0).sum(1).max()) == 20
    with pytest.raises(ValueError, match="already exists"):  # the export refuses to overwrite a model folder
        build_dupmae_sentence_transformer(checkpoint, tokenizer, tmp_path / "ot")


def test_pooling_is_trainable_in_sentence_transformers(exported):
    _, model, _ = exported
    model.train()
    try:
        queries = model(model.preprocess(QUERIES[:2]), task="query")["sentence_embedding"]
        documents = model(model.preprocess(TEXTS[:2]), task="document")["sentence_embedding"]
        loss = F.cross_entropy(queries @ documents.T, torch.arange(2))  # in-batch negatives, eq. 13
        loss.backward()
        pooling = model[1]
        for parameter in (pooling.dense_proj.weight, pooling.decoder_weight, pooling.transform.dense.weight):
            assert parameter.grad is not None and parameter.grad.abs().sum() > 0
        assert model[0].auto_model.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()


@pytest.mark.parametrize(("overrides", "summary", "section"), [
    ({"representation": "cls", "dense_dim": 32}, "| DupMAE cls: the [CLS] state itself (32 dimensions",
     "the 32-dimensional [CLS] state itself, without projection or sparse part"),
    ({"representation": "ot"}, "| DupMAE ot: max-pooled ordinary-token vocabulary weights (30522 dimensions, top-8",
     "the 30522-dimensional ordinary-token vector mu"),
])
def test_the_export_card_describes_the_representation_exported(tokenizer, tmp_path, overrides, summary, section):
    """HEAD described the hybrid whatever the representation: "[CLS] projected to 32 dimensions ⊕ ... (0
    dimensions" for "cls" (probe 79 B-004)."""
    from retromae.trainers.export.sentence_transformer import export_sentence_transformer

    checkpoint = tmp_path / "ckpt"
    DupMAEForPretraining(tiny_config(tokenizer, **overrides)).save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    card = " ".join((export_sentence_transformer(checkpoint, tmp_path / "st") / "README.md").read_text().split())
    assert summary in card and section in card and "projected to 0" not in card and "⊕" not in card
