"""`retromae publish`: offline validation (each missing piece is a clear error, a folder that would not load is
refused) and the upload call, mocked at our call site."""

from __future__ import annotations

import json
import shutil
from unittest import mock

import pytest
import torch
from huggingface_hub import HfApi
from retromae.trainers.export import build_dupmae_sentence_transformer, load_as_sentence_transformer
from retromae.trainers.finetune import save_finetuned_model
from retromae.trainers.publish import PublishError, publish, publish_command, validate_model_folder

from .builders import save_headless_bert, tiny_bert_kwargs

INFO = {"model_name": "tiny-retriever", "stages": [], "pooling": "cls", "similarity": "dot"}


@pytest.fixture(scope="module")
def cls_folder(tmp_path_factory, tokenizer):
    """A valid fine-tuned CLS model folder (tiny BERT), written by `save_finetuned_model`."""
    root = tmp_path_factory.mktemp("publish")
    model, _ = load_as_sentence_transformer(save_headless_bert(root / "bert", tokenizer))
    return save_finetuned_model(model, root / "model", INFO)


@pytest.fixture(scope="module")
def hybrid_folder(tmp_path_factory, tokenizer):
    from retromae.modeling.configuration_dupmae import DupMAEConfig
    from retromae.modeling.modeling_dupmae import DupMAEForPretraining

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("publish-hybrid")
    build_dupmae_sentence_transformer(DupMAEForPretraining(DupMAEConfig(**tiny_bert_kwargs(), dense_dim=16,
                                                                        doc_top_k=8)),
                                      tokenizer, root / "dup", max_seq_length=32)
    return root / "dup"


@pytest.fixture
def copy_of(tmp_path):
    count = iter(range(100))

    def make(folder):
        target = tmp_path / str(next(count)) / folder.name
        shutil.copytree(folder, target)
        return target

    return make


def test_valid_folders_pass(cls_folder, hybrid_folder):
    report = validate_model_folder(cls_folder)
    assert not report.needs_remote_code and report.embedding_dim == 32
    assert report.card_metadata["library_name"] == "sentence-transformers"
    hybrid = validate_model_folder(hybrid_folder)
    assert hybrid.needs_remote_code and hybrid.remote_code_files == ["st_dupmae.py", "layers_dupmae.py"]
    assert hybrid.embedding_dim == 16 + 30522


def test_upload_is_called_after_validation(cls_folder):
    with mock.patch.object(HfApi, "create_repo") as create_repo, \
            mock.patch.object(HfApi, "upload_folder", return_value=mock.Mock(commit_url="https://hf.co/c/1")) as upload:
        assert publish_command([str(cls_folder), "my-org/tiny-retriever", "--private"]) == 0
    create_repo.assert_called_once_with("my-org/tiny-retriever", repo_type="model", private=True, exist_ok=True)
    upload.assert_called_once()
    kwargs = upload.call_args.kwargs
    assert kwargs["repo_id"] == "my-org/tiny-retriever" and kwargs["folder_path"] == str(cls_folder)
    assert kwargs["repo_type"] == "model" and ".*" in kwargs["ignore_patterns"]


def test_dry_run_and_bad_repo_id_upload_nothing(cls_folder):
    with mock.patch.object(HfApi, "upload_folder") as upload, mock.patch.object(HfApi, "create_repo"):
        _, commit = publish(cls_folder, "my-org/x", dry_run=True)
        assert commit is None
        with pytest.raises(PublishError, match="owner/name"):
            publish(cls_folder, "no-owner")
    upload.assert_not_called()


def _break(folder, what):
    if what == "modules.json":
        (folder / "modules.json").unlink()
    elif what == "weights":
        (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    elif what == "no weights":
        (folder / "model.safetensors").unlink()
    elif what == "config":
        (folder / "config.json").unlink()
    elif what == "tokenizer":
        (folder / "tokenizer.json").unlink()
    elif what == "card":
        (folder / "README.md").unlink()
    elif what == "card yaml":
        text = (folder / "README.md").read_text()
        (folder / "README.md").write_text(text.replace("library_name:", "library_name: [unclosed", 1))
    elif what == "card path":
        with open(folder / "README.md", "a") as f:
            f.write(f"\nTrained from {folder.resolve().parent}/bert\n")
    elif what == "module folder":
        shutil.rmtree(folder / "1_Pooling")


@pytest.mark.parametrize(
    ("what", "message"),
    [
        ("modules.json", "has no modules.json: it is not a sentence-transformers folder"),
        ("weights", r"pickle weights \(pytorch_model.bin\); publish safetensors only"),
        ("no weights", "has no model.safetensors"),
        ("config", "has no config.json"),
        ("tokenizer", "has no tokenizer files"),
        ("card", r"no model card \(README.md\)"),
        ("card yaml", "README.md metadata does not parse"),
        ("card path", "README.md contains a local path"),
        ("module folder", "names module folder '1_Pooling', which does not exist"),
    ],
)
def test_each_missing_piece_is_a_clear_error(cls_folder, copy_of, what, message):
    folder = copy_of(cls_folder)
    _break(folder, what)
    with (mock.patch.object(HfApi, "upload_folder") as upload, mock.patch.object(HfApi, "create_repo"),
          pytest.raises(PublishError, match=message)):
        publish(folder, "my-org/x")
    upload.assert_not_called()


def test_remote_code_files_must_sit_at_the_root(hybrid_folder, copy_of):
    folder = copy_of(hybrid_folder)
    (folder / "layers_dupmae.py").unlink()  # imported by st_dupmae.py with `from .layers_dupmae import ...`
    with pytest.raises(PublishError, match="remote code file layers_dupmae.py is missing from the folder root"):
        validate_model_folder(folder)
    folder = copy_of(hybrid_folder)
    modules = json.loads((folder / "modules.json").read_text())
    modules[1]["type"] = "retromae.modeling.st_dupmae.DupMAEPooling"
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(PublishError, match="a class of an installed package"):
        validate_model_folder(folder)


def test_a_folder_that_would_not_load_is_refused(cls_folder, copy_of):
    folder = copy_of(cls_folder)
    pooling = folder / "1_Pooling" / "config.json"
    config = json.loads(pooling.read_text())
    config["pooling_mode"] = "no-such-pooling"
    pooling.write_text(json.dumps(config))
    assert validate_model_folder(folder, load=False)  # every file is there ...
    with (mock.patch.object(HfApi, "upload_folder") as upload,
          pytest.raises(PublishError, match=r"does not load with SentenceTransformer\('model'\)")):
        publish(folder, "my-org/x")  # ... but sentence-transformers cannot build it
    upload.assert_not_called()
    broken = copy_of(cls_folder)
    (broken / "modules.json").write_text('[{"idx": 0, "name": "0", "path": "", "type": ')
    with pytest.raises(PublishError, match="modules.json is not valid JSON"):
        validate_model_folder(broken)


# ---- local paths in the metadata, half-saved tokenizers ------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("base_model", "out/encoder", "base_model"),  # the README's `finetune --model out/encoder`, run from tmp_path
        ("datasets", ["data/train.jsonl"], r"datasets\[0\]"),
        ("base_model", "../models/encoder", "base_model"),
        ("model-index", [{"name": "x", "results": [{"task": {"type": "retrieval"},
                                                    "dataset": {"type": "/data/beir/scifact", "name": "scifact"},
                                                    "metrics": [{"type": "ndcg_at_10", "value": 0.5}]}]}],
         r"model-index\[0\].results\[0\].dataset.type"),
    ],
)
def test_local_paths_in_any_metadata_field_are_refused(cls_folder, copy_of, tmp_path, monkeypatch, field, value,
                                                       named):
    """HEAD looked only for this folder's absolute path and the home folder in the text."""
    import yaml

    monkeypatch.chdir(tmp_path)
    (tmp_path / "out" / "encoder").mkdir(parents=True)
    folder = copy_of(cls_folder)
    text = (folder / "README.md").read_text()
    _, front, body = text.split("---", 2)
    metadata = yaml.safe_load(front)
    metadata[field] = value
    (folder / "README.md").write_text(f"---\n{yaml.safe_dump(metadata)}---{body}")
    with pytest.raises(PublishError, match=rf"metadata field '{named}' is a local path"):
        publish(folder, "my-org/x", dry_run=True)


def test_hub_ids_in_metadata_pass(cls_folder, copy_of):
    import yaml

    folder = copy_of(cls_folder)
    _, front, body = (folder / "README.md").read_text().split("---", 2)
    metadata = {**yaml.safe_load(front), "base_model": "sentence-transformers/all-MiniLM-L6-v2",
                "datasets": ["BeIR/scifact"]}
    (folder / "README.md").write_text(f"---\n{yaml.safe_dump(metadata)}---{body}")
    assert validate_model_folder(folder, load=False)


def test_tokenizer_saved_from_a_half_written_checkpoint_is_refused(cls_folder, copy_of, tmp_path):
    """A checkpoint killed mid-save has tokenizer_config.json but no tokenizer.json; transformers loads a 5-token
    tokenizer from it, and an export saves that one with all files present. HEAD's `--dry-run` called it valid."""
    from transformers import AutoTokenizer

    folder = copy_of(cls_folder)
    half = tmp_path / "half"
    half.mkdir()
    (half / "tokenizer_config.json").write_text((folder / "tokenizer_config.json").read_text())
    degenerate = AutoTokenizer.from_pretrained(str(half))
    assert len(degenerate) == 5
    degenerate.save_pretrained(folder)
    with pytest.raises(PublishError, match=r"maps every word of a test sentence to \[UNK\].*tokenizer is incomplete"):
        publish(folder, "my-org/x", dry_run=True)
