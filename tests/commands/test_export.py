"""Export of a pre-training checkpoint as a sentence-transformers model (trainers/export/sentence_transformer.py)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from retromae.modeling.configuration_retromae import RetroMAEConfig
from retromae.modeling.modeling_retromae import RetroMAEForPretraining
from retromae.trainers import cli
from retromae.trainers.commands.export import export_command
from retromae.trainers.export import cls as export_cls
from retromae.trainers.export.cards import read_papers, render_pretrained_card, sentence_transformers_needed
from retromae.trainers.export.cls import write_cls_encoder
from retromae.trainers.export.dupmae import write_dupmae_export
from retromae.trainers.export.sentence_transformer import export_from_model, export_sentence_transformer
from retromae.trainers.inputs.checkpoints import weight_names
from retromae.trainers.inputs.folders import public_name
from retromae.trainers.methods import METHODS, get_method
from retromae.trainers.training.pretraining import load_pretraining_model
from safetensors.torch import load_file
from sentence_transformers import SentenceTransformer
from transformers import BertConfig, BertModel

from ..builders import dead_pid, tiny_bert_kwargs

MAX_SEQ_LENGTH = 64
RUN_INFO = {
    "method": "retromae",
    "base_model": "sentence-transformers/all-MiniLM-L6-v2",
    "corpus": "scifact-corpus",
    "max_seq_length": MAX_SEQ_LENGTH,
    "packing": False,
    "global_step": 500,
    "training": {
        "learning_rate": 1e-4,
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 2,
        "world_size": 1,
        "max_steps": 500,
        "warmup_ratio": 0.1,
        "weight_decay": 0.01,
        "seed": 42,
        "lr_scheduler_type": "linear",
    },
    "final_losses": {"loss": 12.3, "encoder_mlm_loss": 5.1, "decoder_loss": 7.2},
    "retromae_version": "0.1.0",
}
TEXTS = [
    "hi",
    "Dense retrievers encode text into vectors.",
    "RetroMAE pre-trains the [CLS] embedding with a masked auto-encoder " * 12,  # > MAX_SEQ_LENGTH tokens: truncated
]


def _save_checkpoint(model, tokenizer, folder: Path, run_info: dict | None) -> Path:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if run_info is not None:
        (folder / "retromae_run.json").write_text(json.dumps(run_info))
    return folder


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, tokenizer):
    """A tiny RetroMAE pre-training model (non-default hyperparameters) and its checkpoint folder."""
    torch.manual_seed(0)
    config = RetroMAEConfig(**tiny_bert_kwargs(), encoder_mask_ratio=0.25, decoder_mask_ratio=0.6)
    model = RetroMAEForPretraining(config).eval()
    checkpoint = _save_checkpoint(model, tokenizer, tmp_path_factory.mktemp("run") / "checkpoint-500", RUN_INFO)
    return model, checkpoint


@pytest.fixture(scope="module")
def exported(pretrained, tmp_path_factory) -> Path:
    _, checkpoint = pretrained
    out = tmp_path_factory.mktemp("export") / "retromae-tiny"
    assert export_sentence_transformer(checkpoint, out) == out
    return out


@pytest.fixture(scope="module")
def st_model(exported) -> SentenceTransformer:
    return SentenceTransformer(str(exported), device="cpu")  # trust_remote_code defaults to False


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_embeddings_equal_pretraining_cls_state(pretrained, st_model, tokenizer):
    model, _ = pretrained
    got = st_model.encode(TEXTS, convert_to_tensor=True)  # (3, 32)
    batch = tokenizer(TEXTS, padding=True, truncation=True, max_length=MAX_SEQ_LENGTH, return_tensors="pt")
    with torch.no_grad():
        want = model.bert(**batch).last_hidden_state[:, 0]  # (3, 32)
    assert got.shape == want.shape == (3, 32)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    queries = st_model.encode_query(TEXTS[:1], convert_to_tensor=True)  # empty prompt: same as encode
    torch.testing.assert_close(queries, want[:1], atol=1e-5, rtol=1e-5)


def test_sentence_transformer_layout(exported, st_model):
    assert st_model.similarity_fn_name == "dot"
    assert st_model.prompts == {"query": "", "document": ""}
    assert st_model.max_seq_length == MAX_SEQ_LENGTH
    assert [type(m).__name__ for m in st_model] == ["Transformer", "Pooling"]  # no Normalize
    assert st_model[1].pooling_mode == "cls"
    assert st_model[0].auto_model.pooler is None  # model_args add_pooling_layer=False honoured
    modules = json.loads((exported / "modules.json").read_text())
    assert [m["type"] for m in modules] == [
        "sentence_transformers.models.Transformer",
        "sentence_transformers.models.Pooling",
    ]
    assert not list(exported.glob("*.py")) and not list(exported.glob("*.bin"))


def test_loads_as_plain_bert_without_remote_code(exported):
    config = json.loads((exported / "config.json").read_text())
    assert config["model_type"] == "bert" and "auto_map" not in config
    assert "decoder_mask_ratio" not in config
    model, info = BertModel.from_pretrained(str(exported), add_pooling_layer=False, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]


def test_model_card(exported, pretrained):
    card = ModelCard.load(exported / "README.md")
    assert card.data.library_name == "sentence-transformers"
    assert card.data.pipeline_tag == "sentence-similarity"
    assert card.data.base_model == "sentence-transformers/all-MiniLM-L6-v2"
    assert card.data.license == "apache-2.0" and card.data.language == "en"
    assert {"retromae", "sentence-transformers", "feature-extraction"} <= set(card.data.tags)
    text = card.text
    assert "RetroMAE" in text and "https://arxiv.org/abs/2205.12035" in text
    assert "hf upload <your-org>/retromae-all-MiniLM-L6-v2 ./retromae-tiny ." in text
    assert "huggingface-cli" not in text
    assert "@inproceedings{xiao2022retromae" in text
    assert "fine-tune" in text.lower() and "encode_query" in text and "encode_document" in text
    assert "| `encoder_mask_ratio` | 0.25 |" in text and "| `decoder_mask_ratio` | 0.6 |" in text
    assert "| `decoding` | enhanced |" in text and "transformers_version" not in text
    assert "| `effective_batch_size` | 16 |" in text  # 8 per device x 2 accumulation x 1 process
    assert "| `decoder_loss` | 7.2000 |" in text and "scifact-corpus" in text
    assert "not recorded" not in text


def test_card_claims_num_train_epochs_only_when_no_max_steps_stopped_the_run():
    config = RetroMAEConfig(**tiny_bert_kwargs()).to_dict()

    def rows(**training) -> str:
        run_info = {**RUN_INFO, "training": {"learning_rate": 1e-4, **training}}
        return render_pretrained_card(get_method("retromae"), config, run_info, model_name="m", folder_name="m",
                                      embedding_dim=32, num_layers=2, max_seq_length=MAX_SEQ_LENGTH)

    assert "num_train_epochs" not in rows(max_steps=300, num_train_epochs=3.0)  # HEAD: `| num_train_epochs | 3 |`
    assert "| `num_train_epochs` | 3 |" in rows(max_steps=-1, num_train_epochs=3.0)


@pytest.mark.parametrize(("types", "release"), [
    ([], "5.0"),  # no modules.json: encode_query / encode_document, which the cards use, came in 5.0
    (["sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling"], "5.0"),  # legacy paths
    (["sentence_transformers.base.modules.transformer.Transformer",
      "sentence_transformers.sentence_transformer.modules.pooling.Pooling"], "5.4"),
    (["sentence_transformers.base.modules.transformer.Transformer", "st_dupmae.DupMAEPooling"], "5.4"),
    (["sentence_transformers.base.modules.transformer.Transformer",
      "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling"], "5.4"),
    (["sentence_transformers.models.Transformer", "sentence_transformers.base.modules.normalize.Normalize"], "6.0"),
], ids=["none", "legacy", "base", "remote-code", "sparse", "normalize"])
def test_the_release_a_folder_needs_is_the_latest_its_module_paths_need(tmp_path, types, release):
    """Releases 5.3 and older have no `sentence_transformers.base` and 5.4-5.7 no `base.modules.normalize`: the
    folders sentence-transformers 6.2 saves failed to load there with ModuleNotFoundError (checked by hand)."""
    if types:
        (tmp_path / "modules.json").write_text(json.dumps([{"idx": i, "type": t} for i, t in enumerate(types)]))
    assert sentence_transformers_needed(tmp_path) == release


def test_no_local_paths_in_output(exported, pretrained):
    _, checkpoint = pretrained
    readme = (exported / "README.md").read_text()
    for path in (str(exported), str(exported.parent), str(checkpoint), "/home", "/work", "/tmp"):
        assert path not in readme, path
    for file in exported.rglob("*.json"):
        text = file.read_text()
        assert str(exported.parent) not in text and str(checkpoint.parent) not in text, file


def test_missing_run_info_is_not_recorded(tmp_path, tokenizer):
    model = RetroMAEForPretraining(RetroMAEConfig(**tiny_bert_kwargs()))
    checkpoint = _save_checkpoint(model, tokenizer, tmp_path / "hand-made", run_info=None)
    out = export_sentence_transformer(checkpoint, tmp_path / "out", model_name="my-org/tiny-retromae")
    card = ModelCard.load(out / "README.md")
    assert card.data.base_model is None and card.data.model_name == "my-org/tiny-retromae"
    assert "Not recorded (the checkpoint has no `retromae_run.json`)" in card.text
    assert "hf upload my-org/tiny-retromae ./out ." in card.text
    sbert = json.loads((out / "sentence_bert_config.json").read_text())
    assert sbert["max_seq_length"] == 128  # min(512, max_position_embeddings=128)


def test_refuses_to_overwrite_then_replaces_a_model_only(pretrained, tmp_path):
    """--overwrite replaces an earlier export; a folder of the user's own files is kept even with it (HEAD deleted
    them)."""
    _, checkpoint = pretrained
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    for overwrite in (False, True):
        with pytest.raises(ValueError, match=r"out holds no model \(no modules.json or config.json\), which "
                                             "--overwrite does not replace; choose a new or empty folder"):
            export_sentence_transformer(checkpoint, out, overwrite=overwrite)
    assert (out / "keep.txt").read_text() == "user data" and not (out / "modules.json").exists()

    (out / "keep.txt").unlink()
    export_sentence_transformer(checkpoint, out)
    (out / "stale.txt").write_text("from the earlier export")
    with pytest.raises(ValueError, match=r"not empty; choose another output folder, or pass --overwrite \(Python: overwrite=True\)"):
        export_sentence_transformer(checkpoint, out)
    export_sentence_transformer(checkpoint, out, overwrite=True)
    assert not (out / "stale.txt").exists() and (out / "modules.json").is_file()
    assert _leftovers(tmp_path) == []


def test_an_export_into_a_training_checkpoint_is_refused_even_with_overwrite(pretrained, tmp_path):
    """HEAD replaced `RUN/checkpoint-2` (optimizer, trainer state, resume record) with `export RUN RUN/checkpoint-2
    --overwrite`, so the run could no longer resume."""
    _, checkpoint = pretrained
    training = tmp_path / "run" / "checkpoint-2"
    training.mkdir(parents=True)
    (training / "optimizer.pt").write_bytes(b"state")
    for target in (training, training / "encoder"):
        with pytest.raises(ValueError, match="lies in the training checkpoint .*checkpoint-2, which resuming"):
            export_sentence_transformer(checkpoint, target, overwrite=True)
    assert (training / "optimizer.pt").read_bytes() == b"state"


def test_empty_output_folder_is_used(pretrained, tmp_path):
    _, checkpoint = pretrained
    (tmp_path / "out").mkdir()
    export_sentence_transformer(checkpoint, tmp_path / "out")
    assert (tmp_path / "out" / "model.safetensors").is_file()


@pytest.mark.parametrize("overwrite", [False, True])
def test_failure_midway_leaves_nothing(pretrained, tmp_path, monkeypatch, overwrite):
    _, checkpoint = pretrained
    out = tmp_path / "out"
    if overwrite:
        out.mkdir()
        (out / "modules.json").write_text("[]")  # a previous export

    def fail(*args, **kwargs):  # weights, tokenizer and ST configs are already written when the card fails
        raise RuntimeError("disk full")

    monkeypatch.setattr(export_cls, "render_pretrained_card", fail)
    with pytest.raises(RuntimeError, match="disk full"):
        export_sentence_transformer(checkpoint, out, overwrite=overwrite)
    assert _leftovers(tmp_path) == []
    if overwrite:
        assert [p.name for p in out.iterdir()] == ["modules.json"]
    else:
        assert not out.exists()


def test_not_a_checkpoint(tmp_path, tokenizer, pretrained):
    bert_dir = tmp_path / "plain-bert"
    BertModel(BertConfig(**tiny_bert_kwargs()), add_pooling_layer=False).save_pretrained(bert_dir)
    (tmp_path / "empty").mkdir()
    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text(json.dumps({"model_type": "retromae"}))
    no_tokenizer = tmp_path / "no-tokenizer"
    RetroMAEForPretraining(RetroMAEConfig(**tiny_bert_kwargs())).save_pretrained(no_tokenizer)
    cases = {
        bert_dir: r"plain-bert is not a retromae checkpoint: config.json model_type 'bert'; export expects the output of "
        r"`retromae pretrain` \(a checkpoint-N folder or the output dir\)",
        tmp_path / "empty": r"empty is not a retromae checkpoint: no config.json",
        tmp_path / "missing": r"missing does not exist",
        no_weights: r"export: model folder .*no-weights is incomplete, it has no model.safetensors",
        no_tokenizer: r"export: .*no-tokenizer has no tokenizer \(the model was saved without one\); save it into",
    }
    for source, message in cases.items():
        with pytest.raises(ValueError, match=message):
            export_sentence_transformer(source, tmp_path / "out")
        assert not (tmp_path / "out").exists()
    _, checkpoint = pretrained
    with pytest.raises(ValueError, match="replacing it would delete the checkpoint "):
        export_sentence_transformer(checkpoint, checkpoint.parent, overwrite=True)


def test_an_output_below_a_file_and_a_config_that_does_not_fit_the_weights_get_one_line(pretrained, tmp_path, capsys):
    """HEAD: a FileExistsError traceback, and torch's size-mismatch line without the checkpoint or the cause."""
    from retromae.trainers.cli import main

    _, checkpoint = pretrained
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["export", str(checkpoint), str(tmp_path / "notes.txt" / "enc")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path / 'notes.txt'} is a file, not a folder; choose a folder" in err, err
    edited = Path(shutil.copytree(checkpoint, tmp_path / "edited"))
    config = json.loads((edited / "config.json").read_text())
    (edited / "config.json").write_text(json.dumps({**config, "intermediate_size": 38}))
    assert main(["export", str(edited), str(tmp_path / "enc")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(
        r"edited: the checkpoint's encoder weights do not match its config.json: 6 weight\(s\) have another shape, "
        r"e.g. encoder.layer.0.intermediate.dense.weight is \[37, 32\] where config.json gives \[38, 32\]", err), err
    assert not (tmp_path / "enc").exists() and not _leftovers(tmp_path)


def test_an_export_over_the_working_directory_is_refused_even_with_overwrite(pretrained, tmp_path, monkeypatch):
    """HEAD replaced a folder holding the working directory (its files gone, exit 0), and `.` was a traceback."""
    _, checkpoint = pretrained
    work = tmp_path / "project" / "work"
    work.mkdir(parents=True)
    (work / "notes.txt").write_text("mine")
    monkeypatch.chdir(work)
    for target in (tmp_path / "project", Path(".")):
        with pytest.raises(ValueError, match="replacing it would delete the working directory"):
            export_sentence_transformer(checkpoint, target, overwrite=True)
    assert (work / "notes.txt").read_text() == "mine"


def test_export_from_model_matches_checkpoint_export(pretrained, exported, tokenizer, tmp_path):
    model, _ = pretrained
    out = export_from_model(model, tokenizer, tmp_path / "retromae-tiny", RUN_INFO)
    a, b = load_file(out / "model.safetensors"), load_file(exported / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for name in ("README.md", "modules.json", "sentence_bert_config.json", "1_Pooling/config.json", "config.json"):
        assert (out / name).read_text() == (exported / name).read_text(), name
    with pytest.raises(ValueError, match="retromae \\*ForPretraining model"):
        export_from_model(BertModel(BertConfig(**tiny_bert_kwargs())), tokenizer, tmp_path / "x")


def test_each_method_names_its_exporter():
    assert {"retromae", "bow", "seed", "sentmae", "dupmae"} <= set(METHODS)
    assert all(get_method(name).exporter is write_cls_encoder for name in ("retromae", "bow", "seed", "sentmae"))
    assert get_method("dupmae").exporter is write_dupmae_export


def test_each_method_names_what_its_export_encodes():
    """A hybrid export holds the method's own module and logs a metric per part; a CLS one neither."""
    for method in METHODS.values():
        assert (method.representation == "hybrid") == (method.pooling_module is not None), method.name
        assert method.metric_prefixes[0] == "" and (len(method.metric_prefixes) > 1) == (method.representation == "hybrid")
    dupmae = get_method("dupmae")
    assert dupmae.metric_prefixes == ("", "cls_") and dupmae.pooling_label == "DupMAE hybrid"
    # the encoder class follows the base: BERT's plain names, or the base's own model under its prefix
    assert dupmae.encoder_class_for({"model_type": "dupmae"}) is dupmae.model_class.encoder_class  # no encoder_type
    assert dupmae.encoder_class_for({"model_type": "bert"}) is dupmae.model_class.encoder_class
    assert dupmae.encoder_class_for({"model_type": "dupmae", "encoder_type": "roberta"}) is (
        dupmae.model_class.any_encoder_class)


@pytest.mark.parametrize(("name", "problem"), [
    ("my model with spaces", "the name 'my model with spaces' contains ' '; use letters, digits"),
    ("org/-tiny", "the name '-tiny' starts with '-'"),
    ("a/b/c", "it has more than one '/'; give NAME or OWNER/NAME"),
])
def test_a_model_name_no_hub_repository_can_have_is_refused(pretrained, tmp_path, capsys, name, problem):
    """HEAD wrote `SentenceTransformer("<your-org>/my model with spaces")` into the card, and publish passed it."""
    _, checkpoint = pretrained
    assert cli.main(["export", str(checkpoint), str(tmp_path / "out"), "--model-name", name]) == 2
    assert f"--model-name {name!r} cannot name a Hub repository: {problem}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_python_export_refuses_the_model_names_the_command_line_refuses(pretrained, tmp_path):
    """HEAD: export_sentence_transformer(model_name="/abs/path") wrote a card naming `path`, where
    `retromae export --model-name /abs/path` is refused (the check lived in the command only)."""
    _, checkpoint = pretrained
    with pytest.raises(ValueError, match=r"--model-name '/abs/path' cannot name a Hub repository: it has more than "
                                         r"one '/'; give NAME or OWNER/NAME"):
        export_sentence_transformer(checkpoint, tmp_path / "out", model_name="/abs/path")
    with pytest.raises(TypeError, match=r"export_sentence_transformer: model_name=5 is not a str; give NAME or "
                                        r"OWNER/NAME, or None"):
        export_sentence_transformer(checkpoint, tmp_path / "out", model_name=5)
    assert not (tmp_path / "out").exists()


def test_export_command(pretrained, tmp_path, capsys):
    _, checkpoint = pretrained
    assert export_command([str(checkpoint), str(tmp_path / "out"), "--model-name", "my-org/tiny"]) == 0
    assert (tmp_path / "out" / "modules.json").is_file()
    assert ModelCard.load(tmp_path / "out" / "README.md").data.model_name == "my-org/tiny"
    assert "retromae: exported" in capsys.readouterr().out


@pytest.mark.parametrize(("flags", "pooling", "normalized"), [
    (["--pooling", "mean"], "mean", True),  # all-MiniLM-L6-v2's head: mean pooling, Normalize, cosine
    (["--similarity", "cosine"], "cls", True),  # bge's head: CLS, Normalize, cosine
    (["--pooling", "mean", "--similarity", "dot"], "mean", False),
])
def test_export_keeps_the_head_of_the_base(pretrained, tokenizer, tmp_path, flags, pooling, normalized):
    """After continued pre-training of a trained retriever the user keeps the base's head: the export's embedding is
    the pooled (and normalized) last-layer state the flags name, the similarity follows, the card says so."""
    model, checkpoint = pretrained
    out = tmp_path / "out"
    assert export_command([str(checkpoint), str(out), *flags]) == 0
    st = SentenceTransformer(str(out), device="cpu")
    got = st.encode(TEXTS, convert_to_tensor=True)
    batch = tokenizer(TEXTS, padding=True, truncation=True, max_length=MAX_SEQ_LENGTH, return_tensors="pt")
    with torch.no_grad():
        states = model.bert(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    want = states[:, 0] if pooling == "cls" else (states * mask).sum(1) / mask.sum(1)
    if normalized:
        want = torch.nn.functional.normalize(want, dim=-1)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    similarity = "cosine" if normalized else "dot"
    assert st.similarity_fn_name == similarity and st[1].pooling_mode == pooling
    assert [type(m).__name__ for m in st] == ["Transformer", "Pooling"] + ["Normalize"] * normalized
    card = ModelCard.load(out / "README.md").text
    assert ("relevance is the cosine similarity" in card) == normalized
    assert ("| Sentence embedding | mean of the last-layer token states" in card) == (pooling == "mean")
    assert ("Why mean pooling" in card) == (pooling == "mean")


def test_head_flags_are_refused_for_dupmae(tokenizer, tmp_path, capsys):
    from retromae.modeling.configuration_dupmae import DupMAEConfig
    from retromae.modeling.modeling_dupmae import DupMAEForPretraining
    from retromae.trainers.cli import main

    checkpoint = _save_checkpoint(DupMAEForPretraining(DupMAEConfig(**tiny_bert_kwargs(), dense_dim=16)), tokenizer,
                                  tmp_path / "dupmae", RUN_INFO)
    assert main(["export", str(checkpoint), str(tmp_path / "out"), "--pooling", "mean"]) == 2
    assert not (tmp_path / "out").exists()
    assert "--pooling and --similarity apply to the CLS methods; dupmae's export" in capsys.readouterr().err
    assert main(["export", str(checkpoint), str(tmp_path / "out")]) == 0  # HEAD left out trust_remote_code
    assert f"SentenceTransformer({str(tmp_path / 'out')!r}, trust_remote_code=True)" in capsys.readouterr().out


def test_a_pretraining_checkpoint_loads_with_the_pooling_asked_for(pretrained, tmp_path):
    """`finetune/evaluate --model CHECKPOINT --pooling mean`: the checkpoint is exported with mean pooling + cosine
    (before, the export was CLS and --pooling was refused as if the user had given a sentence-transformers folder)."""
    from retromae.trainers.export.sentence_transformer import load_as_sentence_transformer

    _, checkpoint = pretrained
    model, info = load_as_sentence_transformer(checkpoint, pooling="mean", work_dir=tmp_path, device="cpu")
    assert info["kind"] == "retromae-checkpoint" and model[1].pooling_mode == "mean"
    assert model.similarity_fn_name == "cosine"
    default, _ = load_as_sentence_transformer(checkpoint, work_dir=tmp_path / "cls", device="cpu")
    assert default[1].pooling_mode == "cls" and default.similarity_fn_name == "dot"



def test_a_maximum_length_the_positions_cannot_hold_is_refused(spread_cls_bert, tmp_path):
    """`finetune --max-seq-length 0` trained with no length limit and failed inside torch on the first long text."""
    from retromae.trainers.export.sentence_transformer import load_as_sentence_transformer

    for length in (0, 1, 2, 129):  # [CLS] and [SEP] take 2 of the tiny BERT's 128 positions
        with pytest.raises(ValueError, match=rf"--max-seq-length {length}: give 3 to 128 \(tokens per text"):
            load_as_sentence_transformer(spread_cls_bert, max_seq_length=length, device="cpu")
    model, _ = load_as_sentence_transformer(spread_cls_bert, max_seq_length=128, device="cpu")
    assert model.max_seq_length == 128

def test_sharded_checkpoint(pretrained, exported, tokenizer, tmp_path):
    model, _ = pretrained
    checkpoint = tmp_path / "sharded"
    model.save_pretrained(checkpoint, max_shard_size="1MB")
    tokenizer.save_pretrained(checkpoint)
    (checkpoint / "retromae_run.json").write_text(json.dumps(RUN_INFO))
    assert (checkpoint / "model.safetensors.index.json").is_file() and not (checkpoint / "model.safetensors").exists()
    out = export_sentence_transformer(checkpoint, tmp_path / "out")
    a, b = load_file(out / "model.safetensors"), load_file(exported / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---- incomplete checkpoints and killed exports -----------------------------------------------------


def _killed_mid_save(pretrained, folder: Path) -> Path:
    """What a kill during the Trainer's save leaves: weights and tokenizer_config.json, no tokenizer.json."""
    import shutil

    _, checkpoint = pretrained
    shutil.copytree(checkpoint, folder)
    (folder / "tokenizer.json").unlink()
    return folder


def test_checkpoint_killed_mid_save_is_refused(pretrained, tmp_path):
    """On HEAD the export loaded a 5-token tokenizer (every word [UNK]) and wrote a folder that looked valid."""
    from transformers import AutoTokenizer

    broken = _killed_mid_save(pretrained, tmp_path / "checkpoint-500")
    assert len(AutoTokenizer.from_pretrained(str(broken))) == 5  # what transformers silently loads from it
    with pytest.raises(ValueError, match=r"export: model folder .*checkpoint-500 is incomplete, it has no "
                                          r"tokenizer.json .*killed mid-save"):
        export_sentence_transformer(broken, tmp_path / "out")
    assert not (tmp_path / "out").exists()

    # a Trainer checkpoint whose optimizer was written but whose trainer_state.json (written last) was not
    _, checkpoint = pretrained
    unfinished = tmp_path / "run" / "checkpoint-7"
    import shutil

    shutil.copytree(checkpoint, unfinished)
    (unfinished / "optimizer.pt").write_bytes(b"partial")
    with pytest.raises(ValueError, match=r"no trainer_state.json \(the Trainer writes it last"):
        export_sentence_transformer(unfinished, tmp_path / "out")


def test_a_model_saved_without_its_tokenizer_is_told_how_to_add_it(pretrained, tokenizer, tmp_path, capsys):
    """`save_pretrained` of the model alone, then `retromae export`: HEAD blamed "a run killed mid-save". The folder
    never had a tokenizer: the one line says so and how to add it, and the export works once it is added."""
    model, _ = pretrained
    folder = tmp_path / "my-model"
    model.save_pretrained(folder)
    expected = (rf"^export: {re.escape(str(folder))} has no tokenizer \(the model was saved without one\); save it "
                rf"into the folder with tokenizer.save_pretrained\('{re.escape(str(folder))}'\), then run again$")
    with pytest.raises(ValueError, match=expected):
        export_sentence_transformer(folder, tmp_path / "out")
    from retromae.trainers.cli import main

    assert main(["export", str(folder), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no tokenizer" in err and "killed mid-save" not in err, err
    assert not (tmp_path / "out").exists()
    tokenizer.save_pretrained(folder)
    export_sentence_transformer(folder, tmp_path / "out")
    assert (tmp_path / "out" / "modules.json").is_file()


def test_pretrain_model_refuses_an_incomplete_folder(pretrained, tmp_path):
    """`retromae pretrain --model` goes through `load_pretraining_model`; on HEAD it loaded the folder."""
    broken = _killed_mid_save(pretrained, tmp_path / "checkpoint-500")
    with pytest.raises(ValueError, match=r"--model: model folder .*is incomplete, it has no tokenizer.json"):
        load_pretraining_model(str(broken), get_method("retromae"), {})


def test_killed_export_leaves_no_folder_and_the_next_one_cleans_up(pretrained, tmp_path):
    """SIGKILL an export half-way through writing: the target never appears, and the next export removes the
    temporary folder the killed one left (HEAD left it forever)."""
    import subprocess
    import sys

    _, checkpoint = pretrained
    out = tmp_path / "retromae-tiny"
    script = (
        "import dataclasses, os, signal, sys\n"
        "from retromae.trainers import methods\nfrom retromae.trainers.export import sentence_transformer as export\n"
        "def killed(request, build_dir):\n"
        "    (build_dir / 'config.json').write_text('{}')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "methods.METHODS['retromae'] = dataclasses.replace(methods.METHODS['retromae'], exporter=killed)\n"
        "export.export_sentence_transformer(sys.argv[1], sys.argv[2])\n"
    )
    result = subprocess.run([sys.executable, "-c", script, str(checkpoint), str(out)], capture_output=True, timeout=120)
    assert result.returncode == -9
    leftovers = [p.name for p in tmp_path.iterdir()]
    assert not out.exists() and len(leftovers) == 1 and leftovers[0].startswith(".retromae-tiny.tmp-")

    assert export_sentence_transformer(checkpoint, out) == out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["retromae-tiny"]


def test_a_swap_killed_between_its_renames_is_restored(pretrained, tmp_path):
    """A kill between `target -> .old` and `.tmp -> target` leaves no target: the next write puts it back."""
    _, checkpoint = pretrained
    out = export_sentence_transformer(checkpoint, tmp_path / "retromae-tiny")
    before = (out / "model.safetensors").read_bytes()
    pid = dead_pid()
    out.rename(tmp_path / f".retromae-tiny.old-{pid}-0123abcd")
    (tmp_path / f".retromae-tiny.tmp-{pid}-4567cdef").mkdir()
    with pytest.raises(ValueError, match="already exists and is not empty"):  # restored, so not overwritten
        export_sentence_transformer(checkpoint, out)
    assert (out / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["retromae-tiny"]


def test_a_model_that_is_a_file_or_has_a_mistyped_config_gets_one_line(tiny_bert, tmp_path):
    """HEAD: "model folder ... does not exist" for a file, and transformers' "Field 'hidden_size' expected int"
    naming no file."""
    from retromae.trainers.inputs.checkpoints import CheckpointError
    from retromae.trainers.inputs.sentence_models import load_sentence_transformer

    file = tmp_path / "corpus.txt"
    file.write_text("text\n")
    with pytest.raises(CheckpointError, match=r"--model .*corpus.txt is a file; give the model's folder"):
        load_sentence_transformer(file)
    model = Path(shutil.copytree(tiny_bert, tmp_path / "m"))
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "hidden_size": "big"}))
    with pytest.raises(CheckpointError, match=r"cannot load the model folder .*m \(.*'hidden_size' expected int.*\); "
                                              r"fix .*m/config.json or save the model again"):
        load_sentence_transformer(model)


def test_overwrite_never_replaces_a_runs_folder_nor_exports_an_unknown_pooling(pretrained, tmp_path):
    """HEAD replaced a pre-training run's output folder, checkpoints included, with `overwrite=True`; wrote
    `similarity="l2"` (loaded back as cosine); raised a bare KeyError for `pooling="max"`."""
    _, checkpoint = pretrained
    run = tmp_path / "run"
    shutil.copytree(checkpoint, run / "checkpoint-2")
    (run / "checkpoint-2" / "optimizer.pt").write_bytes(b"state")  # what makes it a Trainer checkpoint
    with pytest.raises(ValueError, match=r"output folder .*run: replacing it would delete the training checkpoint "
                                          r"checkpoint-2 \(.*\), even with --overwrite; choose another folder"):
        export_sentence_transformer(checkpoint, run, overwrite=True)
    assert (run / "checkpoint-2" / "optimizer.pt").is_file()
    for option, message in [({"pooling": "max"}, "pooling 'max': give one of cls, mean"),
                            ({"similarity": "l2"}, "similarity 'l2': give one of dot, cosine")]:
        with pytest.raises(ValueError, match=message):
            export_sentence_transformer(checkpoint, tmp_path / "out", **option)
    assert not (tmp_path / "out").exists()


def test_check_model_folder_layouts(pretrained, tmp_path, minilm_dir):
    from retromae.trainers.inputs.folders import check_model_folder

    check_model_folder("sentence-transformers/all-MiniLM-L6-v2", purpose="x")  # a Hub id: not checked here
    check_model_folder(minilm_dir, purpose="x")  # a sentence-transformers folder (Transformer at the root)
    _, checkpoint = pretrained
    check_model_folder(checkpoint, purpose="x")
    with pytest.raises(ValueError, match=r"does not exist"):
        check_model_folder(tmp_path / "nope", purpose="x")
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_text("{}")
    (sharded / "vocab.txt").write_text("[PAD]\n")
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "model-00001.safetensors"}}))
    with pytest.raises(ValueError, match=r"no model-00001.safetensors \(listed in model.safetensors"):
        check_model_folder(sharded, purpose="x")


def test_relative_paths_in_run_info_are_not_written_to_the_card(pretrained, tokenizer, tmp_path, monkeypatch):
    """A corpus `data/corpus.jsonl` or base model `out/encoder` looks like `owner/name`: HEAD wrote both as they
    were, the base model as `base_model:` metadata with a link to a Hub page that does not exist."""
    model, _ = pretrained
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out" / "encoder").mkdir(parents=True)
    run_info = {**RUN_INFO, "corpus": "data/my_corpus.jsonl", "base_model": "out/encoder"}
    out = export_from_model(model, tokenizer, tmp_path / "export", run_info)
    card = ModelCard.load(out / "README.md")
    assert card.data.base_model is None
    assert "data/my_corpus.jsonl" not in card.text and "my_corpus.jsonl" in card.text
    assert "out/encoder" not in card.text


def test_public_name_resolves_an_existing_path_and_never_shows_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert public_name(".") == tmp_path.name  # the run-info name of `--model .` / `--corpus .`
    assert public_name("no/such/corpus.jsonl") == "corpus.jsonl"
    assert public_name("owner/name") == "owner/name"


def test_every_method_cites_a_complete_entry_of_papers_bib():
    papers = read_papers()
    assert len(papers) == len(METHODS) == len({m.paper for m in METHODS.values()})
    for method in METHODS.values():
        entry = method.paper.bibtex
        assert method.paper in papers.values() and entry.startswith("@") and entry.endswith("\n}")
        assert f"url = {{{method.paper.url}}}" in entry and method.paper.url.startswith("https://arxiv.org/abs/")
        assert "title = {" in entry and "year = {" in entry


def test_weight_names_reads_names_without_weights(tmp_path):
    model = BertModel(BertConfig(**tiny_bert_kwargs()), add_pooling_layer=False)
    model.save_pretrained(tmp_path / "single")
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    expected = sorted(model.state_dict())
    assert sorted(weight_names(tmp_path / "single")) == expected == sorted(weight_names(tmp_path / "sharded"))
    assert weight_names(tmp_path) is None  # no safetensors weights
