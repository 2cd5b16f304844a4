"""Loading a checkpoint or an export with transformers: a BERT-only encoder class refuses a checkpoint on another base
(it would load none of its weights), and the export card's transformers snippet gives the export's vectors (the
export has no pooler: `pooler_output` would be a random pooler's), and so does a fine-tuned model's card."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from retromae import RetroMAEModel
from retromae.modeling.configuration_retromae import RetroMAEConfig
from retromae.modeling.modeling_retromae import RetroMAEAnyEncoderModel, RetroMAEForPretraining
from retromae.trainers.export.cards import saved_layout
from retromae.trainers.export.sentence_transformer import export_sentence_transformer
from retromae.trainers.inputs.checkpoints import load_tokenizer
from retromae.trainers.training.finetuning import finetune
from sentence_transformers import SentenceTransformer, models
from transformers import AutoModel

from ..builders import tiny_bert_kwargs, write_beir
from .test_export import RUN_INFO, _save_checkpoint

SENTENCE = "how do dense retrievers work?"  # the card snippet's sentence
FAMILY_FIXTURES = {"roberta": "tiny_roberta", "modernbert": "tiny_modernbert"}


@pytest.fixture(scope="module")
def checkpoints(request, tmp_path_factory, tokenizer) -> dict[str, Path]:
    """family -> a tiny RetroMAE pre-training checkpoint on that base (seed 0)."""
    root = tmp_path_factory.mktemp("loading")
    torch.manual_seed(0)
    folders = {"bert": _save_checkpoint(RetroMAEForPretraining(RetroMAEConfig(**tiny_bert_kwargs())), tokenizer,
                                        root / "bert", RUN_INFO)}
    for family, fixture in FAMILY_FIXTURES.items():
        base = request.getfixturevalue(fixture)
        torch.manual_seed(0)
        model = RetroMAEForPretraining.from_encoder_checkpoint(base)
        folders[family] = _save_checkpoint(model, load_tokenizer(base), root / family, RUN_INFO)
    return folders


def test_the_bert_encoder_class_refuses_a_checkpoint_on_another_base(checkpoints, tmp_path):
    checkpoint = checkpoints["roberta"]
    with pytest.raises(ValueError, match=re.escape(
            f"{checkpoint} is a RoBERTa checkpoint and RetroMAEModel is a BERT encoder that would load none of its "
            f"weights; load it with AutoModel.from_pretrained('{checkpoint}', trust_remote_code=True)")):
        RetroMAEModel.from_pretrained(str(checkpoint))
    remote = AutoModel.from_pretrained(str(checkpoint), trust_remote_code=True)  # the checkpoint's own code
    assert type(remote).__name__ == RetroMAEAnyEncoderModel.__name__
    export = export_sentence_transformer(checkpoint, tmp_path / "export")  # a plain RobertaModel folder
    with pytest.raises(ValueError, match=re.escape(f"load it with AutoModel.from_pretrained('{export}')")):
        RetroMAEModel.from_pretrained(str(export))
    assert isinstance(RetroMAEModel.from_pretrained(str(checkpoints["bert"])), RetroMAEModel)


def _card_snippet(folder: Path, repo_id: str) -> str:
    """The card's transformers code block, loading `folder` instead of `repo_id`."""
    card = (folder / "README.md").read_text()
    code = re.search(r"With transformers alone.*?```python\n(.*?)```", card, re.DOTALL)
    assert code is not None, "the card has no transformers snippet"
    return code.group(1).replace(f'"{repo_id}"', repr(str(folder)))


@pytest.mark.parametrize(("family", "flags"), [
    ("bert", {}), ("bert", {"pooling": "mean"}), ("bert", {"similarity": "cosine"}), ("roberta", {}),
    ("modernbert", {}),
], ids=["bert-cls-dot", "bert-mean-cosine", "bert-cls-cosine", "roberta", "modernbert"])
def test_the_card_transformers_snippet_gives_the_export_vectors(checkpoints, tmp_path, family, flags):
    export = export_sentence_transformer(checkpoints[family], tmp_path / "export", model_name="me/tiny", **flags)
    namespace: dict = {}
    exec(_card_snippet(export, "me/tiny"), namespace)  # noqa: S102 - the card's own code, run as a user would
    expected = SentenceTransformer(str(export), device="cpu").encode([SENTENCE], convert_to_tensor=True)
    torch.testing.assert_close(namespace["embeddings"], expected, atol=1e-5, rtol=1e-4)
    if family != "modernbert":  # the snippet's add_pooling_layer=False: no weight is missing (no random pooler)
        _, info = AutoModel.from_pretrained(str(export), add_pooling_layer=False, output_loading_info=True)
        assert not info["missing_keys"]


@pytest.mark.parametrize("start", ["spread_cls_bert", "minilm_dir"], ids=["cls-dot-no-pooler", "mean-cosine"])
def test_the_finetuned_card_transformers_snippet_gives_the_model_vectors(request, start, tmp_path):
    beir = write_beir(tmp_path / "toy")
    out = finetune(request.getfixturevalue(start), beir, tmp_path / "tuned", stages=["in-batch"], max_steps=1,
                   per_device_train_batch_size=4, max_seq_length=32, disable_tqdm=True, model_name="me/tuned").output_dir
    namespace: dict = {}
    exec(_card_snippet(out, "me/tuned"), namespace)  # noqa: S102 - the card's own code, run as a user would
    expected = SentenceTransformer(str(out), device="cpu").encode([SENTENCE], convert_to_tensor=True)
    torch.testing.assert_close(namespace["embeddings"], expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(("start", "release"), [("spread_cls_bert", "5.4"), ("minilm_dir", "6.0")],
                         ids=["cls-dot", "mean-cosine-normalize"])
def test_the_finetuned_card_states_the_release_its_modules_need(request, start, release, tmp_path):
    """sentence-transformers 5.4 loads the saved module paths, 6.0 also its Normalize (`sentence_transformers_needed`).
    HEAD: every card said "Requires sentence-transformers >= 6 and transformers >= 5", though a model without
    Normalize loads on 5.7 with transformers 4.57 and gives the same vectors (probe 78 B-002)."""
    out = finetune(request.getfixturevalue(start), write_beir(tmp_path / "toy"), tmp_path / "tuned", stages=["in-batch"],
                   max_steps=1, per_device_train_batch_size=4, max_seq_length=32, disable_tqdm=True).output_dir
    text = " ".join((out / "README.md").read_text().split())
    assert f"Requires sentence-transformers >= {release}." in text and "and transformers >= 5" not in text


def test_a_finetuned_card_has_no_transformers_snippet_where_prompts_change_the_input(spread_cls_bert, tmp_path):
    out = finetune(spread_cls_bert, write_beir(tmp_path / "toy"), tmp_path / "tuned", stages=["in-batch"],
                   max_steps=1, per_device_train_batch_size=4, max_seq_length=32, disable_tqdm=True,
                   prompts='{"query": "query: "}').output_dir
    card = (out / "README.md").read_text()
    assert "encode_query" in card and "With transformers alone" not in card


@pytest.mark.parametrize("extra", ["none", "dense", "prompts"])
def test_the_snippet_is_offered_only_for_a_model_it_reproduces(spread_cls_bert, tmp_path, extra):
    """A Dense layer after pooling, or prompts the model kept from its starting point (no --prompts of the run),
    change the vectors: HEAD's card still showed the snippet, which gave other vectors (32 dimensions for 16)."""
    transformer = models.Transformer(str(spread_cls_bert), model_kwargs={"add_pooling_layer": False})
    modules = [transformer, models.Pooling(32, "cls")]
    if extra == "dense":
        modules.append(models.Dense(32, 16))
    model = SentenceTransformer(modules=modules, device="cpu",
                                prompts={"query": "query: "} if extra == "prompts" else None)
    model.save(str(tmp_path / "model"))
    layout = saved_layout(tmp_path / "model")
    assert layout is None if extra != "none" else layout == {"normalize": False, "pooler_kwarg": ""}
