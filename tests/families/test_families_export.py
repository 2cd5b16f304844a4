"""`retromae export` (and the loaders around it) of checkpoints on RoBERTa, XLM-R and ModernBERT bases: a plain
sentence-transformers folder of the base's own `model_type`, loading without remote code, whose embeddings are the
checkpoint's [CLS] state (DupMAE: its hybrid representation)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from retromae.modeling.modeling_dupmae import DupMAEAnyEncoderModel, DupMAEForPretraining
from retromae.modeling.modeling_retromae import RetroMAEForPretraining
from retromae.trainers.export.publishing import validate_model_folder
from retromae.trainers.export.sentence_transformer import (
    build_dupmae_sentence_transformer,
    export_from_model,
    export_sentence_transformer,
    load_as_sentence_transformer,
)
from retromae.trainers.inputs.checkpoints import load_encoder, load_mlm_head, load_tokenizer, usable_positions
from retromae.trainers.inputs.sentence_models import load_sentence_transformer
from retromae.trainers.retrieval.hybrid_index import HybridIndex
from sentence_transformers import SentenceTransformer
from transformers import AutoModelForMaskedLM

from ..builders import write_beir

FAMILIES = {"roberta": "tiny_roberta", "xlm-roberta": "tiny_xlm_roberta", "modernbert": "tiny_modernbert"}
MODEL_CLASSES = {"roberta": "RobertaModel", "xlm-roberta": "XLMRobertaModel", "modernbert": "ModernBertModel"}
TEXTS = [
    "hello world",
    "Dense retrievers encode text into vectors.",
    "RetroMAE pre-trains the embedding with a masked auto-encoder " * 6,
]
family_param = pytest.mark.parametrize("family", list(FAMILIES))


def _base(request, family: str) -> Path:
    return request.getfixturevalue(FAMILIES[family])


def _save(model, tokenizer, folder: Path) -> Path:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _batch(tokenizer, max_length: int = 128):
    return tokenizer(TEXTS, padding=True, truncation=True, max_length=max_length, return_tensors="pt")


def _checkpoints(request, tmp_path_factory, name: str, build) -> dict:
    """family -> (`build(base)` on the tiny base, in eval mode, seeded alike; its saved checkpoint folder)."""
    out = {}
    for family in FAMILIES:
        base = _base(request, family)
        torch.manual_seed(0)
        model = build(base).eval()
        folder = _save(model, load_tokenizer(base), tmp_path_factory.mktemp(f"{name}-{family}") / "checkpoint-5")
        out[family] = (model, folder)
    return out


@pytest.fixture(scope="module")
def retromae_checkpoints(request, tmp_path_factory) -> dict[str, tuple[RetroMAEForPretraining, Path]]:
    """family -> (RetroMAEForPretraining on the tiny base, its saved checkpoint folder)."""
    return _checkpoints(request, tmp_path_factory, "retromae", RetroMAEForPretraining.from_encoder_checkpoint)


@pytest.fixture(scope="module")
def dupmae_checkpoints(request, tmp_path_factory) -> dict[str, tuple[DupMAEForPretraining, Path]]:
    return _checkpoints(request, tmp_path_factory, "dupmae", lambda base: DupMAEForPretraining.from_encoder_checkpoint(
        base, dense_dim=16, doc_top_k=20, query_top_k=40))


def _assert_plain_base_folder(folder: Path, family: str) -> None:
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == family and "auto_map" not in config
    assert config["architectures"] == [MODEL_CLASSES[family]]
    assert "encoder_type" not in config and "decoder_mask_ratio" not in config
    transformer_config = json.loads((folder / "sentence_bert_config.json").read_text())
    if family == "modernbert":  # ModernBertModel takes no add_pooling_layer
        assert "model_args" not in transformer_config and "model_kwargs" not in transformer_config
    else:
        assert transformer_config.get("model_args", transformer_config.get("model_kwargs")) == {
            "add_pooling_layer": False
        }
    assert (folder / "tokenizer.json").is_file() or (folder / "tokenizer_config.json").is_file()


@family_param
def test_cls_export_is_the_plain_base_and_embeds_the_cls_state(retromae_checkpoints, family, tmp_path, caplog):
    model, checkpoint = retromae_checkpoints[family]
    out = export_sentence_transformer(checkpoint, tmp_path / f"retromae-{family}")
    _assert_plain_base_folder(out, family)
    assert not list(out.glob("*.py"))
    card = (out / "README.md").read_text()  # the card names the base, not BERT
    assert f"`{MODEL_CLASSES[family]}` (`model_type: {family}`)" in card
    assert "not fine-tuned** BERT encoder" not in card and "`BertModel`" not in card
    st = SentenceTransformer(str(out), device="cpu")  # no trust_remote_code
    assert type(st[0].auto_model).__name__ == MODEL_CLASSES[family]
    assert getattr(st[0].auto_model, "pooler", None) is None
    assert st.similarity_fn_name == "dot" and st.max_seq_length == 128  # every usable position of the tiny base
    tokenizer = load_tokenizer(checkpoint)
    assert len(st.tokenizer) == len(tokenizer)
    got = st.encode(TEXTS, convert_to_tensor=True)
    with torch.no_grad():
        want = model(**_batch(tokenizer)).sentence_embedding  # the [CLS] / <s> state
    assert got.shape == want.shape == (3, 32)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@family_param
def test_cosine_export_normalises(retromae_checkpoints, family, tmp_path):
    model, checkpoint = retromae_checkpoints[family]
    out = export_sentence_transformer(checkpoint, tmp_path / "cos", similarity="cosine")
    st = SentenceTransformer(str(out), device="cpu")
    got = st.encode(TEXTS, convert_to_tensor=True)
    with torch.no_grad():
        want = model(**_batch(load_tokenizer(checkpoint))).sentence_embedding
    torch.testing.assert_close(got, torch.nn.functional.normalize(want, dim=-1), atol=1e-5, rtol=1e-5)


def test_export_from_model_equals_the_checkpoint_export(retromae_checkpoints, tmp_path):
    model, checkpoint = retromae_checkpoints["modernbert"]
    from_checkpoint = SentenceTransformer(str(export_sentence_transformer(checkpoint, tmp_path / "a")), device="cpu")
    out = export_from_model(model, load_tokenizer(checkpoint), tmp_path / "b")
    _assert_plain_base_folder(out, "modernbert")
    from_model = SentenceTransformer(str(out), device="cpu")
    torch.testing.assert_close(from_model.encode(TEXTS), from_checkpoint.encode(TEXTS), atol=1e-6, rtol=1e-6)


@family_param
def test_dupmae_export_equals_the_hybrid_embedding(dupmae_checkpoints, family, tmp_path):
    model, checkpoint = dupmae_checkpoints[family]
    out = export_sentence_transformer(checkpoint, tmp_path / f"dupmae-{family}")
    _assert_plain_base_folder(out, family)
    st = SentenceTransformer(str(out), device="cpu", trust_remote_code=True)  # the DupMAEPooling module
    assert [type(m).__name__ for m in st] == ["Transformer", "DupMAEPooling"]
    encoder = DupMAEAnyEncoderModel.from_pretrained(str(checkpoint)).eval()
    with torch.no_grad():
        output = encoder(**_batch(load_tokenizer(checkpoint)))
    for task, encode in (("document", st.encode_document), ("query", st.encode_query)):
        got = encode(TEXTS, convert_to_tensor=True)
        want = encoder.hybrid_embedding(output, task)
        assert got.shape == want.shape == (3, 16 + model.config.vocab_size)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # the sparse part is the trained MLM head's: a wrong transform (bias, activation, norm) would change it
    assert (st.encode_document(TEXTS[:1], convert_to_tensor=True)[0, 16:] != 0).sum() == 20


@family_param
def test_both_exports_pass_publish_and_the_hybrid_one_indexes(retromae_checkpoints, dupmae_checkpoints, family, tmp_path):
    """`retromae publish` validates, and `retromae index` / `search` serve, the exports of every family (before,
    only BERT exports were tested there)."""
    cls_folder = export_sentence_transformer(retromae_checkpoints[family][1], tmp_path / "cls")
    assert not validate_model_folder(cls_folder).needs_remote_code
    model, checkpoint = dupmae_checkpoints[family]
    hybrid_folder = export_sentence_transformer(checkpoint, tmp_path / "hybrid")
    report = validate_model_folder(hybrid_folder)
    assert report.needs_remote_code and report.embedding_dim == 16 + model.config.vocab_size
    st = SentenceTransformer(str(hybrid_folder), device="cpu", trust_remote_code=True)
    index = HybridIndex.build(st, TEXTS, ids=["a", "b", "c"], batch_size=2)
    queries = ["dense vectors", "a masked auto-encoder"]
    scores = st.similarity(st.encode_query(queries), st.encode_document(TEXTS))  # eq. 12 by dot product
    for hits, row in zip(index.search_texts(st, queries, top_n=3), scores, strict=True):
        torch.testing.assert_close(torch.tensor([score for _, score in hits]), row.sort(descending=True).values,
                                   atol=1e-4, rtol=1e-5)


def test_dupmae_encoder_folder_exports_with_overrides(dupmae_checkpoints, tmp_path):
    _, checkpoint = dupmae_checkpoints["roberta"]
    encoder = DupMAEAnyEncoderModel.from_pretrained(str(checkpoint)).eval()
    _save(encoder, load_tokenizer(checkpoint), tmp_path / "encoder")
    st = build_dupmae_sentence_transformer(tmp_path / "encoder", None, tmp_path / "out", doc_top_k=10)
    _assert_plain_base_folder(tmp_path / "out", "roberta")
    encoder.config.doc_top_k = 10
    with torch.no_grad():
        want = encoder.hybrid_embedding(encoder(**_batch(load_tokenizer(checkpoint))), "document")
    torch.testing.assert_close(st.encode_document(TEXTS, convert_to_tensor=True), want, atol=1e-5, rtol=1e-5)
    in_memory = build_dupmae_sentence_transformer(encoder, load_tokenizer(checkpoint), tmp_path / "mem")
    torch.testing.assert_close(in_memory.encode_document(TEXTS, convert_to_tensor=True), want, atol=1e-5, rtol=1e-5)


@family_param
def test_loaders_take_the_family(retromae_checkpoints, request, family):
    model, checkpoint = retromae_checkpoints[family]
    batch = _batch(load_tokenizer(checkpoint))
    encoder = load_encoder(checkpoint, purpose="coverage").eval()
    assert type(encoder).__name__.endswith(MODEL_CLASSES[family])
    head = load_mlm_head(checkpoint)
    with torch.no_grad():
        hidden = encoder(**batch).last_hidden_state
        torch.testing.assert_close(hidden, model.encode(batch["input_ids"], batch["attention_mask"]))
        torch.testing.assert_close(head(hidden), model.vocab_logits(hidden), atol=1e-5, rtol=1e-5)
    # a base masked-LM checkpoint: the base's own head
    base = _base(request, family)
    masked_lm = AutoModelForMaskedLM.from_pretrained(str(base)).eval()
    base_encoder = load_encoder(base).eval()
    with torch.no_grad():
        hidden = base_encoder(**batch).last_hidden_state
        torch.testing.assert_close(load_mlm_head(base)(hidden), masked_lm(**batch).logits, atol=1e-5, rtol=1e-5)


def test_usable_positions():
    assert usable_positions({"model_type": "xlm-roberta", "max_position_embeddings": 514, "pad_token_id": 1}) == 512
    assert usable_positions({"model_type": "retromae", "encoder_type": "roberta", "max_position_embeddings": 514,
                             "pad_token_id": 1}) == 512
    assert usable_positions({"model_type": "dupmae", "encoder_type": "modernbert",
                             "max_position_embeddings": 8192}) == 8192
    assert usable_positions({"model_type": "retromae", "max_position_embeddings": 512, "pad_token_id": 0}) == 512


def test_a_checkpoint_loads_for_finetuning_and_a_plain_export_for_evaluation(retromae_checkpoints, tmp_path):
    _, checkpoint = retromae_checkpoints["xlm-roberta"]
    model, info = load_as_sentence_transformer(checkpoint, work_dir=tmp_path / "work")
    assert info["kind"] == "retromae-checkpoint" and info["pretraining_method"] == "retromae"
    assert info["trust_remote_code"] is False
    exported = tmp_path / "work" / "pretrained-encoder"
    _assert_plain_base_folder(exported, "xlm-roberta")
    again = load_sentence_transformer(exported)
    torch.testing.assert_close(again.encode(TEXTS), model.encode(TEXTS))


@pytest.mark.parametrize("family", ["roberta", "modernbert"])
def test_finetune_smoke(retromae_checkpoints, family, tmp_path):
    from retromae.trainers.training.finetuning import finetune

    _, checkpoint = retromae_checkpoints[family]
    beir = write_beir(tmp_path / "toy")
    result = finetune(checkpoint, beir, tmp_path / "ft", stages=["in-batch"], max_steps=2,
                      per_device_train_batch_size=4, max_seq_length=32, disable_tqdm=True, model_name="my-org/ft")
    _assert_plain_base_folder(result.output_dir, family)
    st = SentenceTransformer(str(result.output_dir), device="cpu")
    assert st.encode(TEXTS).shape == (3, 32)
