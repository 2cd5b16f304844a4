"""`retromae publish`: offline validation (each missing piece is a clear error, a folder that would not load is
refused, no local path in the card), the upload call mocked at our call site, and the Hub's failures (no network,
not logged in, no write access, unknown repo, timeout) as one line each."""

from __future__ import annotations

import json
import logging
import re
import shutil
import socket
from unittest import mock

import httpx2
import huggingface_hub
import pytest
import torch
from huggingface_hub import HfApi
from huggingface_hub.errors import HfHubHTTPError, LocalTokenNotFoundError
from huggingface_hub.utils import hf_raise_for_status
from retromae.trainers import cli
from retromae.trainers.commands.publish import publish_command
from retromae.trainers.export import publishing as publish_module
from retromae.trainers.export.cards import find_local_paths, render_finetuned_card, render_pretrained_card
from retromae.trainers.export.publishing import publish, validate_model_folder
from retromae.trainers.export.sentence_transformer import (
    build_dupmae_sentence_transformer,
    load_as_sentence_transformer,
)
from retromae.trainers.inputs.errors import yaml_error_message
from retromae.trainers.methods import METHODS
from retromae.trainers.training.finetuning import save_finetuned_model

from ..builders import save_headless_bert, tiny_bert_kwargs

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


def test_valid_folders_pass(cls_folder, hybrid_folder, caplog):
    report = validate_model_folder(cls_folder)
    assert not report.needs_remote_code and report.embedding_dim == 32
    assert report.card_metadata["library_name"] == "sentence-transformers"
    assert "custom_code" not in report.card_metadata["tags"]
    with caplog.at_level(logging.WARNING, logger="retromae"):
        hybrid = validate_model_folder(hybrid_folder)
    assert hybrid.needs_remote_code and hybrid.remote_code_files == ["st_dupmae.py", "layers_dupmae.py"]
    assert hybrid.embedding_dim == 16 + 30522
    assert "custom_code" in hybrid.card_metadata["tags"]  # our export tags its own remote code: no warning
    assert not caplog.records


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
        with pytest.raises(ValueError, match="owner/name"):
            publish(cls_folder, "no-owner")
        for repo_id, reason in [("my-org/my--model", "the name 'my--model' contains '--'"),
                                ("my-org/model.git", "ends with '.git'"),
                                ("my-org/-model", "the name '-model' starts with '-'")]:  # HEAD accepted these
            with pytest.raises(ValueError, match=rf"repo id '{re.escape(repo_id)}' is not one the Hub accepts: "
                               rf".*{re.escape(reason)}"):
                publish(cls_folder, repo_id, dry_run=True)
    upload.assert_not_called()



@pytest.mark.parametrize(("repo", "reason"), [
    (["--repo-id", "-bad/name"], "the owner '-bad' starts with '-'; start and end it with a letter or digit"),
    (["--repo-id", "owner/na..me"], "the name 'na..me' contains '..', which the Hub refuses; use a single '.'"),
    (["--repo-id", "owner/my model"], "the name 'my model' contains ' '; use letters, digits, '-', '_' and '.'"),
], ids=["leading-dash", "double-dot", "space"])
def test_a_repo_id_the_hub_refuses_is_one_line_naming_what_is_wrong(repo, reason, cls_folder, capsys):
    """HEAD: argparse's `expected one argument` for `-bad/name` (it reads as an option), and `must look like
    'owner/name'` for `owner/na..me`, which does."""
    assert cli.main(["publish", str(cls_folder), *repo, "--dry-run"]) == 2
    assert capsys.readouterr().err == (f"retromae publish: error: repo id {repo[1]!r} is not one the Hub accepts: "
                                       f"{reason}\n")

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
    elif what == "card unclosed":  # HEAD: "metadata has no library_name"
        head, _, body = (folder / "README.md").read_text().partition("\n---\n")
        (folder / "README.md").write_text(head + "\n" + body)
    elif what == "model_type":  # HEAD: the last line of transformers' error, which names nothing
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "model_type": "bertx"}))


@pytest.mark.parametrize(
    ("what", "message"),
    [
        ("modules.json", "has no modules.json: it is not a sentence-transformers folder"),
        ("weights", r"pickle weights \(pytorch_model.bin\); publish safetensors only"),
        ("no weights", "has no model.safetensors"),
        ("config", "has no config.json"),
        ("tokenizer", "has no tokenizer files"),
        ("card", r"no model card \(README.md\)"),
        ("card yaml", r"README.md:\d+:\d+: not valid YAML: expected ',' or '\]', but got ':'"),
        ("card path", r"README.md line \d+ contains a local path of this machine"),
        ("module folder", "names module folder '1_Pooling', which does not exist"),
        ("card unclosed", "README.md: the metadata block opened by '---' on line 1 is never closed"),
        ("model_type", r"config.json: model_type 'bertx' is not one transformers .* knows and the config has no "
                       "auto_map"),
    ],
)
def test_each_missing_piece_is_a_clear_error(cls_folder, copy_of, what, message):
    folder = copy_of(cls_folder)
    _break(folder, what)
    with (mock.patch.object(HfApi, "upload_folder") as upload, mock.patch.object(HfApi, "create_repo"),
          pytest.raises(ValueError, match=message)):
        publish(folder, "my-org/x")
    upload.assert_not_called()


@pytest.mark.parametrize("flags", [["--pooling", "mean"], ["--similarity", "cosine"]])
def test_an_export_with_normalize_and_no_normalize_folder_passes(tmp_path, tokenizer, flags):
    """Normalize saves no files: `retromae export` writes no 2_Normalize/ folder, and the Hub never holds an empty one.
    HEAD refused every such export ("names module folder '2_Normalize', which does not exist")."""
    from retromae.modeling.configuration_retromae import RetroMAEConfig
    from retromae.modeling.modeling_retromae import RetroMAEForPretraining

    torch.manual_seed(0)
    checkpoint = tmp_path / "ckpt"
    RetroMAEForPretraining(RetroMAEConfig(**tiny_bert_kwargs())).save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    assert cli.main(["export", str(checkpoint), str(tmp_path / "enc"), *flags]) == 0
    assert not (tmp_path / "enc" / "2_Normalize").exists()
    report = validate_model_folder(tmp_path / "enc")
    assert report.modules[-1] == "sentence_transformers.models.Normalize" and report.embedding_dim == 32
    modules = json.loads((tmp_path / "enc" / "modules.json").read_text())
    modules[1]["path"] = "1_Missing"  # a module with files still needs its folder
    (tmp_path / "enc" / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match="names module folder '1_Missing', which does not exist"):
        validate_model_folder(tmp_path / "enc")


def test_remote_code_files_must_sit_at_the_root(hybrid_folder, copy_of):
    folder = copy_of(hybrid_folder)
    (folder / "layers_dupmae.py").unlink()  # imported by st_dupmae.py with `from .layers_dupmae import ...`
    with pytest.raises(ValueError, match="remote code file layers_dupmae.py is missing from the folder root"):
        validate_model_folder(folder)
    folder = copy_of(hybrid_folder)
    modules = json.loads((folder / "modules.json").read_text())
    modules[1]["type"] = "retromae.modeling.st_dupmae.DupMAEPooling"
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match="a class of an installed package"):
        validate_model_folder(folder)


def test_a_folder_that_would_not_load_is_refused(cls_folder, copy_of):
    folder = copy_of(cls_folder)
    pooling = folder / "1_Pooling" / "config.json"
    config = json.loads(pooling.read_text())
    config["pooling_mode"] = "no-such-pooling"
    pooling.write_text(json.dumps(config))
    assert validate_model_folder(folder, load=False)  # every file is there ...
    with (mock.patch.object(HfApi, "upload_folder") as upload,
          pytest.raises(ValueError, match=r"does not load with SentenceTransformer\('model'\)")):
        publish(folder, "my-org/x")  # ... but sentence-transformers cannot build it
    upload.assert_not_called()
    broken = copy_of(cls_folder)
    (broken / "modules.json").write_text('[{"idx": 0, "name": "0", "path": "", "type": ')
    with pytest.raises(ValueError, match="modules.json is not valid JSON"):
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
    with pytest.raises(ValueError, match=rf"metadata field '{named}' is a local path"):
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
    with pytest.raises(ValueError, match=r"maps every word of a test sentence to \[UNK\].*tokenizer is incomplete"):
        publish(folder, "my-org/x", dry_run=True)


# ---- local paths in the card text, card YAML errors, Hub failures (issue 31) ----------------------------------------


def _append_to_card(folder, text: str) -> int:
    """Append `text` as the card's last line; returns its line number."""
    with open(folder / "README.md", "a", encoding="utf-8") as card:
        card.write(f"\n{text}\n")
    return len((folder / "README.md").read_text(encoding="utf-8").splitlines())


@pytest.mark.parametrize("path", ["/tmp/retromae-run/corpus.jsonl", "/work/data/msmarco", "/home/someone/bert",
                                  "~/data/corpus.jsonl", r"C:\Users\me\corpus.jsonl", "file:///srv/corpus.jsonl"])
def test_a_local_path_anywhere_in_the_card_text_is_refused(cls_folder, copy_of, capsys, path):
    """HEAD refused only this folder's own path, its parent and $HOME: `--dry-run` passed a card naming
    /tmp/.../corpus.jsonl. The error names the line, the path and the fix."""
    folder = copy_of(cls_folder)
    line = _append_to_card(folder, f"| Pre-training corpus | {path} |")
    with mock.patch.object(HfApi, "upload_folder") as upload:
        assert cli.main(["publish", str(folder), "my-org/x", "--dry-run"]) == 2
    upload.assert_not_called()
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"README.md line {line} contains a local path of this machine ({path})" in err
    assert "edit README.md" in err and "--corpus-name" in err


def test_urls_hub_ids_and_slashes_in_prose_are_not_local_paths(cls_folder, copy_of):
    folder = copy_of(cls_folder)
    for text in ["See https://huggingface.co/BeIR/scifact and [the docs](/docs/hub/model-cards).",
                 "Base: google-bert/bert-base-uncased; data and/or labels; 512 tokens/s; I/O bound.",
                 "Score $s = q^T d / \\sqrt{h}$, (a+b)/2/3 and 1/2; `<cache>/results/x`.",
                 'Load it: SentenceTransformer("/path/to/model"). Relative: ./out/model, ../models/x.']:
        _append_to_card(folder, text)
    assert validate_model_folder(folder, load=False)


def test_find_local_paths_gives_lines_and_paths():
    text = "---\nlibrary_name: x\n---\nTrained on /tmp/a/corpus.jsonl.\nhttps://hf.co/a/b\nthen ~/x and D:\\d\\e"
    assert find_local_paths(text) == [(4, "/tmp/a/corpus.jsonl"), (6, "~/x"), (6, "D:\\d\\e")]


def test_our_card_writers_write_public_names_only():
    """HEAD wrote a local --model-name / --dataset-ids / base model / training-data path into the cards verbatim
    (heading, usage code, model-index)."""
    method = METHODS["retromae"]
    pretrained = render_pretrained_card(
        method, method.model_class.config_class().to_dict(),
        {"base_model": "/tmp/x/bert", "corpus": "/tmp/x/corpus.jsonl"}, model_name="/tmp/x/retromae-bert",
        folder_name="out", embedding_dim=32, num_layers=2, max_seq_length=32,
    )
    assert find_local_paths(pretrained) == [] and "# retromae-bert" in pretrained and "corpus.jsonl" in pretrained
    info = {**INFO, "model_name": "/tmp/x/my-model", "base_model": "/tmp/x/bert",
            "train_data": {"name": "/tmp/x/train.jsonl", "split": "train", "queries": 3},
            "eval_results": [{"task": "LocalBEIR-scifact", "dataset_id": "/tmp/x/scifact", "split": "test",
                              "dataset_name": "/tmp/x/scifact (local BEIR)", "queries": 3, "ndcg_at_10": 0.5}]}
    finetuned = render_finetuned_card(info, METHODS)
    assert find_local_paths(finetuned) == [], find_local_paths(finetuned)
    assert "# my-model" in finetuned and "`train.jsonl`" in finetuned and "| scifact (local BEIR) |" in finetuned


def test_the_finetuned_card_claims_num_train_epochs_only_when_no_max_steps_stopped_the_run():
    def card(**hyperparameters) -> str:
        return render_finetuned_card({**INFO, "hyperparameters": {"learning_rate": 2e-5, **hyperparameters}}, METHODS)

    assert "num_train_epochs" not in card(max_steps=50, num_train_epochs=3)  # HEAD: a row of 3 epochs
    assert "num_train_epochs" in card(max_steps=-1, num_train_epochs=3)


@pytest.mark.parametrize(
    ("front", "message"),
    [
        ("library_name: sentence-transformers\ntags: [a, b\nlicense: mit\n",
         r"README.md:4:8: not valid YAML: expected ',' or '\]', but got ':' \(in a flow sequence started on line 3\)"),
        ("library_name: sentence-transformers\n  license: mit\n", "README.md:3:10: not valid YAML: mapping values"),
        ("- a list\n- not a mapping\n", "README.md metadata does not parse: repo card metadata block should be a dict"),
    ],
    ids=["unclosed-bracket", "bad-indent", "not-a-mapping"],
)
def test_a_card_yaml_error_names_the_line_and_the_reason(cls_folder, copy_of, capsys, front, message):
    """HEAD printed `retromae publish: error: ^` (the last line of PyYAML's message)."""
    folder = copy_of(cls_folder)
    body = (folder / "README.md").read_text(encoding="utf-8").split("---", 2)[2]
    (folder / "README.md").write_text(f"---\n{front}---{body}", encoding="utf-8")
    assert cli.main(["publish", str(folder), "my-org/x", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(message, err), err


def test_yaml_error_message_counts_lines_from_the_first_parsed_line():
    import yaml

    with pytest.raises(yaml.YAMLError) as caught:
        yaml.safe_load("a: 1\nb: 'unclosed\n")
    assert yaml_error_message("run.yaml", caught.value) == (
        "run.yaml:3:1: not valid YAML: found unexpected end of stream (in a quoted scalar started on line 2)")
    assert yaml_error_message("README.md", caught.value, first_line=2).startswith("README.md:4:1: not valid YAML")


def _http_error(status: int, url: str, **headers: str) -> Exception:
    """What huggingface_hub raises for this answer of the Hub (its own `hf_raise_for_status`)."""
    response = httpx2.Response(status, headers=headers, request=httpx2.Request("POST", url))
    with pytest.raises(HfHubHTTPError) as caught:
        hf_raise_for_status(response)
    return caught.value


@pytest.fixture
def valid(monkeypatch):
    """Skip the folder validation: these tests are about the Hub calls."""
    monkeypatch.setattr(publish_module, "validate_model_folder",
                        lambda folder, exclude=(): publish_module.ValidationReport(
                            folder, needs_remote_code=False, listing=publish_module.UploadListing({}, [])))


@pytest.mark.parametrize(
    ("method", "error", "message"),
    [
        ("create_repo", lambda: _http_error(401, "https://huggingface.co/api/repos/create"),
         "could not create the repository my-org/x: you are not logged in or your token is invalid; "
         "run `hf auth login`"),
        ("create_repo", lambda: _http_error(403, "https://huggingface.co/api/repos/create",
                                            **{"X-Error-Message": "You don't have the rights to create a model"}),
         "your token may not write to my-org/x (the Hub says: You don't have the rights to create a model); check "
         "the owner in the repo id"),
        ("upload_folder", lambda: _http_error(404, "https://huggingface.co/api/models/my-org/x/preupload/main",
                                              **{"X-Error-Code": "RepoNotFound"}),
         "could not upload the folder to my-org/x: the Hub does not know the repository or you may not access it; "
         "check the spelling of the repo id"),
        ("create_repo", lambda: httpx2.ReadTimeout("The read operation timed out"),
         "did not answer in time (ReadTimeout); check the network connection"),
        ("upload_folder", lambda: httpx2.ConnectError("[Errno -3] Temporary failure in name resolution"),
         "cannot reach the Hub (https://huggingface.co): [Errno -3] Temporary failure in name resolution; check the "
         "network connection"),
        ("create_repo", lambda: LocalTokenNotFoundError("Token is required"),
         "you are not logged in; run `hf auth login`"),
        ("upload_folder", lambda: _http_error(503, "https://huggingface.co/api/models/my-org/x/preupload/main"),
         "could not upload the folder to my-org/x: the Hub answered HTTP 503; run the command again later"),
    ],
    ids=["401-not-logged-in", "403-no-write-access", "repo-not-found", "timeout", "no-network", "no-token", "503"],
)
def test_hub_failures_are_one_line_with_the_fix(valid, monkeypatch, capsys, method, error, message):
    """HEAD printed httpx's traceback (71 lines without network)."""
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "https://huggingface.co")
    monkeypatch.setattr(HfApi, "create_repo", mock.Mock())
    monkeypatch.setattr(HfApi, method, mock.Mock(side_effect=error()))
    assert cli.main(["publish", "folder", "my-org/x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("retromae publish: error: ") and message in err, err


def test_no_network_and_offline_mode_are_one_line(valid, monkeypatch, capsys):
    """The real `HfApi.create_repo`: against an endpoint nothing listens on, then with HF_HUB_OFFLINE set."""
    with socket.socket() as free:  # a port that was just free: connecting to it is refused
        free.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{free.getsockname()[1]}"
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    assert cli.main(["publish", "folder", "my-org/x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"could not create the repository my-org/x: cannot reach the Hub ({endpoint})" in err
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert cli.main(["publish", "folder", "my-org/x"]) == 2
    assert "HF_HUB_OFFLINE is set; unset it to upload" in capsys.readouterr().err


def test_a_json_file_recording_a_local_path_is_refused(cls_folder, copy_of, tmp_path):
    """E.g. an evaluation's summary.json written into the folder, unless --exclude leaves it out of the upload."""
    folder = copy_of(cls_folder)
    (folder / "eval").mkdir()
    (folder / "eval" / "summary.json").write_text(json.dumps({"rows": [{"model_path": str(tmp_path / "ftok")}]}))
    with pytest.raises(ValueError, match=rf"eval/summary.json records a local path of this machine \({tmp_path}/ftok\)"
                                         r" and would be uploaded; remove that file \(or the field\), or leave it out "
                                         r"with --exclude eval/summary.json"):
        validate_model_folder(folder, load=False)
    validate_model_folder(folder, load=False, exclude=["eval/"])  # not uploaded: not scanned
    (folder / "eval" / "summary.json").write_text(json.dumps({"rows": [{"model": "org/name", "ndcg": 0.5}]}))
    validate_model_folder(folder, load=False)
