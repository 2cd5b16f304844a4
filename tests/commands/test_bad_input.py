"""Bad input is refused in one line that names the file, line, field or flag and the fix (issue 31, items 5-10):
a corpus the tokenizer cannot read, training flags that would train nothing or forever, unreadable files in a corpus
folder, a broken --config file, half-written weights, a model folder without a tokenizer."""

from __future__ import annotations

import argparse
import json
import logging
import shutil
from pathlib import Path

import datasets
import pytest
import torch
from retromae.trainers import cli
from retromae.trainers.data.reading import read_corpus
from retromae.trainers.data.tokenize import tokenize_corpus
from retromae.trainers.inputs.training_checks import check_training_arguments
from retromae.trainers.retrieval.coverage import input_token_coverage
from retromae.trainers.training import finetuning as finetune_module
from transformers import TrainingArguments

from ..builders import pretrain_args, save_headless_bert, write_beir, write_lines

EMOJI = ["😀 🎉 🚀 🙂", "🙃 😎 🤖", "🎈 🎁 🎂 🍰 🍕"]


pytestmark = pytest.mark.usefixtures("datasets_cache")


def one_line_error(capsys, command: str) -> str:
    """The error line of a command that exited with status 2: its last line of stderr (progress bars come before)."""
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"retromae {command}: error: "), err
    return err


# ---- item 5: a corpus the tokenizer cannot read -------------------------------------------------------------------


def test_pretrain_refuses_a_corpus_of_unknown_tokens(tiny_bert, tmp_path, capsys):
    """Every emoji is [UNK] for the MiniLM tokenizer, and [UNK] is never masked: the run would report loss 0."""
    corpus = write_lines(tmp_path / "emoji.txt", EMOJI * 4)
    assert cli.main(pretrain_args(tiny_bert, corpus, tmp_path / "run")) == 2
    err = one_line_error(capsys, "pretrain")
    assert "100% of the text tokens of" in err and "emoji.txt are [UNK] (all 12 sequences)" in err
    assert "--tokenizer" in err and not (tmp_path / "run" / "checkpoint-2").exists()


def test_a_corpus_with_some_unknown_tokens_is_trained_with_a_warning(tokenizer, caplog):
    corpus = datasets.Dataset.from_dict({"text": ["hello world 😀"] * 3})  # 1 [UNK] of 3 text tokens
    with caplog.at_level(logging.WARNING, logger="retromae.trainers.data.tokenize"):
        assert len(tokenize_corpus(corpus, tokenizer, max_seq_length=16)) == 3
    assert any("33% of the text tokens of the corpus are [UNK]" in r.getMessage() for r in caplog.records)


def test_a_large_corpus_is_measured_on_a_sample(tokenizer, tmp_path):
    path = write_lines(tmp_path / "big.txt", [f"{EMOJI[i % 3]} {i}" for i in range(2500)])
    with pytest.raises(ValueError, match=r"of .*big\.txt are \[UNK\] \(a sample of 1000 of 2500 sequences\)"):
        tokenize_corpus(read_corpus(path), tokenizer, max_seq_length=16)


def test_coverage_warns_on_text_of_unknown_tokens(tiny_bert, caplog):
    with caplog.at_level(logging.WARNING, logger="retromae.trainers.retrieval.coverage"):
        input_token_coverage(tiny_bert, None, EMOJI, ks=(1,), device="cpu")
    assert any("100% of the text tokens of the 3 texts are [UNK]" in r.getMessage() for r in caplog.records)


# ---- item 6: training flags ----------------------------------------------------------------------------------------

BAD_TRAINING_FLAGS = [
    (["--max-steps", "-5"], "--max-steps -5: give a positive number of optimizer steps, or leave it unset (-1"),
    (["--max-steps", "0"], "--max-steps 0: give a positive number"),
    (["--per-device-train-batch-size", "0"], "--per-device-train-batch-size 0: give a positive integer"),
    (["--gradient-accumulation-steps", "0"], "--gradient-accumulation-steps 0: give a positive integer"),
    (["--learning-rate", "-0.001"], "--learning-rate -0.001: give a finite learning rate >= 0"),
    (["--learning-rate", "inf"], "--learning-rate inf: give a finite learning rate >= 0"),  # trained all-NaN weights
    (["--learning-rate", "nan"], "--learning-rate nan: give a finite learning rate >= 0"),
    (["--fp16", "true", "--bf16", "true"], "--fp16 and --bf16 are both true; keep one"),
    (["--max-steps", "-1", "--num-train-epochs", "0"], "--num-train-epochs 0.0: give a positive number of epochs"),
    (["--logging-steps", "0"], "--logging-steps 0: give a positive number of optimizer steps"),
    # HEAD: accepted, and a run saved no checkpoint at all
    (["--save-strategy", "steps", "--save-steps", "0"], "--save-steps 0: give a positive number of optimizer steps"),
    (["--warmup-steps", "-1"], "--warmup-steps -1.0: give a finite number of steps >= 0"),
    # HEAD: a traceback deep in the Trainer (NaN to int, numpy's seed range, the DataLoader's workers)
    (["--warmup-steps", "nan"], "--warmup-steps nan: give a finite number of steps >= 0"),
    (["--max-steps", "-1", "--num-train-epochs", "nan"], "--num-train-epochs nan: give a positive number of epochs"),
    (["--seed", "-1"], "--seed -1: give an integer from 0 to 4294967295"),
    (["--dataloader-num-workers", "-1"], "--dataloader-num-workers -1: give 0"),
    # HEAD: accepted; clipping silently off, or a divergence blamed on the learning rate
    (["--max-grad-norm", "nan"], "--max-grad-norm nan: give a finite number >= 0 (0 turns gradient clipping off)"),
    (["--weight-decay", "nan"], "--weight-decay nan: give a finite number >= 0"),
    # HEAD: accepted, and transformers kept every checkpoint
    (["--save-total-limit", "0"], "--save-total-limit 0: give the number of newest checkpoints to keep, at least 1"),
]


@pytest.mark.parametrize(("flags", "message"), BAD_TRAINING_FLAGS)
@pytest.mark.parametrize("command", ["pretrain", "finetune"])
def test_training_flags_that_train_nothing_or_forever_are_refused(command, flags, message, tmp_path, capsys):
    """Refused while parsing, before a model or a corpus (neither exists here) is read."""
    first = ["--corpus", str(tmp_path / "missing.txt")] if command == "pretrain" else ["model", "data"]
    assert cli.main([command, *first, "--output-dir", str(tmp_path / "out"), *flags]) == 2
    assert message in one_line_error(capsys, command)


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.is_bf16_supported(), reason="this GPU supports bf16")
def test_bf16_without_support_is_one_line(tmp_path, capsys):
    assert cli.main(["pretrain", "--corpus", str(tmp_path / "missing.txt"), "--bf16", "true"]) == 2
    err = one_line_error(capsys, "pretrain")
    assert "--bf16 true needs a GPU with bf16 support" in err and "--use-cpu true" in err and "--fp16 true" in err


def test_no_export_with_an_export_option_is_refused(tmp_path, capsys):
    """HEAD: --export-dir was silently ignored and nothing exported."""
    for flags in (["--export-dir", str(tmp_path / "e")], ["--overwrite-export", "true"]):
        assert cli.main(["pretrain", "--corpus", str(tmp_path / "missing.txt"), "--no-export", "true", *flags]) == 2
        assert f"{flags[0]} sets an export that --no-export true skips" in one_line_error(capsys, "pretrain")


def test_what_transformers_accepts_passes(tmp_path):
    check_training_arguments(TrainingArguments(output_dir=str(tmp_path), max_steps=-1))  # -1: not set, train epochs
    check_training_arguments(argparse.Namespace(bf16=True, use_cpu=True))  # torch runs bf16 on any CPU
    check_training_arguments(argparse.Namespace(bf16_full_eval=True, use_cpu=True))


@pytest.mark.parametrize("command", ["pretrain", "finetune"])
@pytest.mark.parametrize("flags", [["--fp16", "true"], ["--fp16", "true", "--use-cpu", "true"],
                                   ["--fp16-full-eval", "true", "--use-cpu", "true"]])
def test_fp16_on_the_cpu_is_one_line(command, flags, tmp_path, capsys, monkeypatch):
    """HEAD trained in fp32 without a word (losses equal to an fp32 run bit for bit), also from the paper presets."""
    if not flags.count("--use-cpu"):
        monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    first = ["--corpus", str(tmp_path / "missing.txt")] if command == "pretrain" else ["model", "data"]
    assert cli.main([command, *first, "--output-dir", str(tmp_path / "out"), *flags]) == 2
    err = one_line_error(capsys, command)
    assert f"{flags[0]} true needs a GPU: on the CPU the Trainer would train in fp32" in err, err


def test_finetune_python_api_checks_the_training_options(tmp_path):
    """A Python caller is told the argument as it gave it (HEAD: the flag, --max-steps 0)."""
    with pytest.raises(ValueError, match="^max_steps=0: give a positive number"):
        finetune_module.finetune("model", "data", tmp_path / "out", max_steps=0)


# ---- item 7: a corpus folder with files it cannot read -------------------------------------------------------------


def test_a_corpus_folder_with_unreadable_files_is_refused(tmp_path, caplog):
    write_lines(tmp_path / "a.jsonl", ['{"text": "a passage"}'])
    (tmp_path / "sub").mkdir()
    write_lines(tmp_path / "sub" / "b.txt", ["another passage"])
    for name in ("notes.csv", "dump.json", "sub/weights.bin"):
        (tmp_path / name).write_bytes(b"x")
    with pytest.raises(ValueError, match=r"not a corpus format: dump\.json, notes\.csv, sub/weights\.bin; the "
                                          r"files read are \.txt, \.jsonl and \.parquet files .*: move the others out"):
        read_corpus(tmp_path)
    for name in ("notes.csv", "dump.json", "sub/weights.bin"):
        (tmp_path / name).unlink()
    with caplog.at_level(logging.INFO, logger="retromae.trainers.data.reading"):
        assert len(read_corpus(tmp_path)) == 2
    assert any("Reading 2 corpus file(s)" in r.getMessage() and "a.jsonl, sub/b.txt" in r.getMessage()
               for r in caplog.records)


# ---- item 8: a broken --config file --------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "text", "expected"), [
    ("bad.yaml", "max_steps: 3\nsave_steps: [1, 2\nseed: 1\n",
     "bad.yaml:3:5: not valid YAML: expected ',' or ']', but got ':' "
     "(in a flow sequence started on line 2)"),
    ("bad.json", '{"max_steps": 3,\n "seed": }\n', "bad.json:2:10: not valid JSON: Expecting value"),
])
def test_a_config_file_syntax_error_names_file_line_and_reason(name, text, expected, tmp_path, capsys):
    config = tmp_path / name
    config.write_text(text, encoding="utf-8")
    assert cli.main(["pretrain", "--config", str(config)]) == 2
    assert one_line_error(capsys, "pretrain").endswith(f"{tmp_path}/{expected}; fix the file")


@pytest.mark.parametrize(("text", "expected"), [
    ("max_steps: 2.7\n", "c.yaml: max_steps: 2.7 is not a whole number; fix the file"),
    ("per_device_train_batch_size: 2.5\n", "c.yaml: per_device_train_batch_size: 2.5 is not a whole number"),
    ("max_steps: [1, 2]\n", "c.yaml: max_steps: a list, but --max-steps takes one value"),
    ("method_options: [1, 2]\n", "c.yaml: method_options: a list, but --method-options takes one value"),
    ("lr_scheduler_type: bogus\n", "c.yaml: lr_scheduler_type: 'bogus' is not one of linear, cosine"),
    ("max_steps: 1\nmax_steps: 2\n", "c.yaml:2:1: not valid YAML: 'max_steps' is set twice; keep one"),
])
def test_a_config_value_of_the_wrong_kind_names_file_and_setting(text, expected, tmp_path, capsys):
    """argparse converts only string defaults: HEAD passed 2.7 or a list on, to a traceback inside the Trainer or
    torch's sampler after the model and corpus had loaded; a key set twice kept its last value silently."""
    config = tmp_path / "c.yaml"
    config.write_text(text, encoding="utf-8")
    assert cli.main(["pretrain", "--config", str(config), "--output-dir", str(tmp_path / "out")]) == 2
    assert f"{tmp_path}/{expected}" in one_line_error(capsys, "pretrain")
    assert not (tmp_path / "out").exists()


def test_typed_config_values_parse_as_their_flags_do(tmp_path):
    """The conversion changes nothing a flag would give: a YAML number, bool or string equals the flag's text."""
    from retromae.trainers.inputs.arguments import parse
    from retromae.trainers.inputs.pretrain_options import pretrain_parser

    config = tmp_path / "c.yaml"
    config.write_text("max_steps: 7\nlearning_rate: 2e-5\nfp16: false\nwarmup_steps: 0.1\nseed: 3\n"
                      "decoder_mask_ratio: 0.4\nlr_scheduler_type: cosine\n", encoding="utf-8")
    from_file = parse(pretrain_parser(), ["--config", str(config)])
    from_flags = parse(pretrain_parser(), ["--max-steps", "7", "--learning-rate", "2e-5", "--fp16", "false",
                                           "--warmup-steps", "0.1", "--seed", "3", "--decoder-mask-ratio", "0.4",
                                           "--lr-scheduler-type", "cosine"])
    for a, b in zip(from_file, from_flags, strict=True):
        assert {k: v for k, v in vars(a).items() if k != "distributed_state"} == \
               {k: v for k, v in vars(b).items() if k != "distributed_state"}


def test_a_json_config_with_a_key_twice_is_refused(tmp_path, capsys):
    config = tmp_path / "c.json"
    config.write_text('{"max_steps": 1, "max_steps": 2}', encoding="utf-8")
    assert cli.main(["pretrain", "--config", str(config)]) == 2
    assert one_line_error(capsys, "pretrain").endswith(f"{config}: 'max_steps' set twice; keep one")


def test_a_setting_given_by_its_flag_and_in_method_options_is_refused(tiny_bert, corpus, tmp_path, capsys):
    """HEAD kept method_options' value silently, also against a flag on the command line (README: flags win)."""
    config = tmp_path / "c.yaml"
    config.write_text("method_options:\n  decoder_mask_ratio: 0.7\n", encoding="utf-8")
    for extra in (["--config", str(config)], ["--method-options", '{"decoder_mask_ratio": 0.7}']):
        assert cli.main(pretrain_args(tiny_bert, corpus, tmp_path / "out", "--decoder-mask-ratio", "0.2",
                                      *extra)) == 2
        assert "decoder_mask_ratio set both by --decoder-mask-ratio and in method_options; set it once" in \
            one_line_error(capsys, "pretrain")
    assert not (tmp_path / "out").exists()


# ---- item 9: half-written weights ----------------------------------------------------------------------------------


def truncate_weights(folder: Path) -> Path:
    """`folder` with its model.safetensors short of its last 100 bytes (a save killed mid-write)."""
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    return folder


@pytest.mark.parametrize("command", ["export", "pretrain", "evaluate"])
def test_truncated_weights_are_refused_in_one_line(command, stage1_checkpoint, corpus, tmp_path, capsys):
    """export reads a pre-training checkpoint (a tiny one-step run), pretrain --model and evaluate any BERT folder."""
    truncated_model = truncate_weights(shutil.copytree(stage1_checkpoint, tmp_path / "model"))
    argv = {
        "export": ["export", str(truncated_model), str(tmp_path / "out")],
        "pretrain": pretrain_args(truncated_model, corpus, tmp_path / "out"),
        "evaluate": ["evaluate", str(truncated_model), "--beir-folder", str(write_beir(tmp_path / "beir")),
                     "--output-dir", str(tmp_path / "out")],
    }[command]
    assert cli.main(argv) == 2
    err = one_line_error(capsys, command)
    assert f"weights file {truncated_model / 'model.safetensors'} is incomplete: it has " in err
    assert "bytes, its header describes" in err and "save it again (or download it again)" in err


def test_an_unreadable_safetensors_header_is_refused(tmp_path, tokenizer):
    from retromae.trainers.inputs.folders import check_model_folder

    folder = save_headless_bert(tmp_path / "model", tokenizer)
    (folder / "model.safetensors").write_bytes((10).to_bytes(8, "little") + b"not json!!")
    with pytest.raises(ValueError, match="header is not readable safetensors JSON"):
        check_model_folder(folder, purpose="export")
    (folder / "model.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(ValueError, match="it has 2 bytes, fewer than its header needs"):
        check_model_folder(folder, purpose="export")


# ---- item 10: a model folder without a tokenizer -------------------------------------------------------------------


def test_a_model_folder_without_a_tokenizer_is_refused(tiny_bert, corpus, tmp_path, capsys):
    """transformers would make up a 5-token tokenizer (every word [UNK]) and masking would fail deep inside."""
    folder = tmp_path / "no-tokenizer"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_bert / name, folder / name)
    assert cli.main(pretrain_args(folder, corpus, tmp_path / "out")) == 2
    err = one_line_error(capsys, "pretrain")
    assert f"{folder} has no tokenizer files" in err and "copy the model's tokenizer files into it" in err
    assert "--tokenizer" in err


@pytest.mark.parametrize("token", ["mask_token", "pad_token"])
def test_a_tokenizer_without_a_mask_or_pad_token_is_refused(tiny_roberta, corpus, tmp_path, capsys, token):
    folder = Path(shutil.copytree(tiny_roberta, tmp_path / "model"))
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    del settings[token]
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    assert cli.main(pretrain_args(folder, corpus, tmp_path / "out", "--max-steps", "1")) == 2
    err = one_line_error(capsys, "pretrain")
    assert f"the tokenizer in {folder} has no {token}, which pre-training needs" in err, err


@pytest.mark.parametrize("case", ["undeclared", "no template"])
def test_a_tokenizer_whose_first_token_is_not_special_is_refused(tiny_roberta, corpus, tmp_path, capsys, case):
    """HEAD trained on: an undeclared <s> at position 0 (the sentence embedding) was masked and predicted as a
    word; with no template the first word's state became the embedding."""
    folder = Path(shutil.copytree(tiny_roberta, tmp_path / "model"))
    if case == "undeclared":
        settings = json.loads((folder / "tokenizer_config.json").read_text())
        settings.update(cls_token=None, bos_token=None)
        (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    else:
        tokenizer = json.loads((folder / "tokenizer.json").read_text())
        tokenizer["post_processor"] = None
        (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    assert cli.main(pretrain_args(folder, corpus, tmp_path / "out", "--max-steps", "1")) == 2
    err = one_line_error(capsys, "pretrain")
    first = "'<s>'" if case == "undeclared" else "'"
    assert f"the tokenizer in {folder} starts a text with {first}" in err and "not a special token" in err, err
    assert not (tmp_path / "out").exists()


def test_a_tokenizer_with_another_pad_id_than_a_roberta_model_is_refused(tiny_roberta, corpus, tmp_path, capsys):
    """The Trainer sets config.pad_token_id to the tokenizer's: HEAD saved a RoBERTa whose positions, counted from
    the pad id, were shifted (every vector changed at learning rate 0), or failed in the export with a traceback."""
    folder = Path(shutil.copytree(tiny_roberta, tmp_path / "model"))
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings["pad_token"] = settings["unk_token"]
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    assert cli.main(pretrain_args(folder, corpus, tmp_path / "out", "--max-steps", "1")) == 2
    err = one_line_error(capsys, "pretrain")
    assert "the tokenizer's pad token id 3 differs from pad_token_id 1 of the model" in err, err


# ---- a model or tokenizer that is not there --------------------------------------------------------------------------


def test_a_missing_model_or_tokenizer_is_one_line(corpus, tmp_path, capsys):
    """A Hub id that cannot be read (offline here) and a tokenizer path that does not exist: one line each."""
    assert cli.main(["coverage", "--model", "no-such-model", "--corpus", str(corpus),
                     "--output-dir", str(tmp_path / "cov")]) == 2
    assert "coverage: cannot read a model config from no-such-model" in one_line_error(capsys, "coverage")
    missing = tmp_path / "no-tokenizer"
    assert cli.main(["pretrain", "--corpus", str(corpus), "--output-dir", str(tmp_path / "out"),
                     "--tokenizer", str(missing)]) == 2
    assert f"--tokenizer: tokenizer folder {missing} does not exist" in one_line_error(capsys, "pretrain")


@pytest.mark.parametrize("given", ["file", "empty folder"])
def test_a_tokenizer_that_is_a_file_or_an_empty_folder_is_named_under_its_flag(given, tiny_bert, corpus, tmp_path,
                                                                                capsys):
    """HEAD: "cannot load a tokenizer from X: It looks like the config file at 'X' is not a valid JSON file. (pass a
    local folder, or --tokenizer)", and for an empty folder transformers' "Couldn't instantiate the backend
    tokenizer from one of:"; both advised the flag that had been given."""
    tokenizer = corpus if given == "file" else tmp_path / "tokenizer"
    if given != "file":
        tokenizer.mkdir()
    assert cli.main(pretrain_args(tiny_bert, corpus, tmp_path / "out", "--tokenizer", str(tokenizer))) == 2
    err = one_line_error(capsys, "pretrain")
    expected = ("is a file; give the folder that holds the tokenizer's files" if given == "file" else
                "has no tokenizer files (e.g. tokenizer.json or vocab.txt); copy the model's tokenizer files into it")
    assert f"--tokenizer: {tokenizer} {expected}" in err, err
    assert not err.endswith("--tokenizer)"), err


def test_a_tokenizer_of_another_model_is_refused_before_training(tiny_bert, corpus, tmp_path, capsys):
    """HEAD warned mid-log (300 tokens for 30,522 embedding rows), then trained and exported with it."""
    from ..builders import tiny_bpe_tokenizer

    tokenizer = tmp_path / "small-tokenizer"
    tiny_bpe_tokenizer("roberta").save_pretrained(tokenizer)
    capsys.readouterr()
    assert cli.main(pretrain_args(tiny_bert, corpus, tmp_path / "out", "--tokenizer", str(tokenizer))) == 2
    err = one_line_error(capsys, "pretrain")
    assert f"--tokenizer {tokenizer} has 300 tokens but --model {tiny_bert} has 30522 embedding rows" in err, err
    assert "drop --tokenizer to use the model's own, or pass --from-scratch true" in err
    assert not (tmp_path / "out").exists()


# ---- a checkpoint that cannot continue its run exactly -------------------------------------------------------------


def fake_checkpoint(folder: Path) -> Path:
    """The files `resolve_resume` reads of a Trainer checkpoint in the plain format (no weights: it reads none)."""
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text("{}")
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        torch.save({"state": 1}, folder / name)
    return folder


@pytest.mark.parametrize(("damage", "message"), [
    (lambda c: (c / "scheduler.pt").unlink(), "scheduler.pt is missing"),  # HEAD: the schedule restarted, silently
    (lambda c: (c / "optimizer.pt").write_bytes((c / "optimizer.pt").read_bytes()[:100]), "optimizer.pt is damaged"),
    (lambda c: (c / "rng_state.pth").write_text("garbage"), "rng_state.pth is damaged"),  # HEAD: torch's traceback
])
def test_a_checkpoint_with_missing_or_damaged_state_is_refused(tmp_path, damage, message):
    from retromae.trainers.inputs.pretrain_options import resolve_resume

    checkpoint = fake_checkpoint(tmp_path / "run" / "checkpoint-2")
    assert resolve_resume(str(tmp_path / "run"), "last") == str(checkpoint)  # intact: accepted
    damage(checkpoint)
    with pytest.raises(ValueError, match=rf"{message}, so checkpoint-2 cannot continue its run exactly; .*--model"):
        resolve_resume(str(tmp_path / "run"), "last")
    with pytest.raises(ValueError, match="nowhere/checkpoint-9: no such folder; give a checkpoint-N folder, or 'last'"):
        resolve_resume(str(tmp_path / "run"), "nowhere/checkpoint-9")


def test_an_output_dir_that_is_a_file_is_named_as_the_output_dir(tiny_bert, tmp_path, capsys):
    """HEAD: "--export-dir .../encoder: ... is a file", a flag the user never gave (the default export lies in it)."""
    corpus, output = write_lines(tmp_path / "c.txt", ["a short passage of text"] * 8), tmp_path / "out"
    output.write_text("notes")
    assert cli.main(pretrain_args(tiny_bert, corpus, output)) == 2
    assert f"--output-dir {output}: {output} is a file, not a folder" in one_line_error(capsys, "pretrain")
    assert output.read_text() == "notes"


def test_a_config_that_does_not_fit_the_weights_is_one_line_in_pretrain(tiny_bert, tmp_path, capsys):
    """HEAD: transformers' "You set `ignore_mismatched_sizes` to `False`" as a traceback."""
    model = shutil.copytree(tiny_bert, tmp_path / "model")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "hidden_size": 2 * config["hidden_size"]}))
    corpus = write_lines(tmp_path / "c.txt", ["a short passage of text"] * 8)
    assert cli.main(pretrain_args(model, corpus, tmp_path / "out")) == 2
    assert f"{model}: its weights have other shapes than its config.json gives" in one_line_error(capsys, "pretrain")


def widened(folder: Path, target: Path) -> Path:
    """A copy of the model `folder` whose config.json gives twice the hidden size its weights have."""
    model = shutil.copytree(folder, target)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "hidden_size": 2 * config["hidden_size"]}))
    return model


def test_a_config_that_does_not_fit_the_weights_is_one_line_in_coverage(spread_cls_bert, tmp_path, capsys):
    """HEAD: a traceback ending in transformers' "You set `ignore_mismatched_sizes` to `False`"."""
    model = widened(spread_cls_bert, tmp_path / "model")
    corpus = write_lines(tmp_path / "c.txt", ["a short passage of text"] * 4)
    assert cli.main(["coverage", "--model", str(model), "--corpus", str(corpus), "--output-dir", str(tmp_path / "o"),
                     "--no-progress"]) == 2
    line = one_line_error(capsys, "coverage")
    assert f"{model}: its weights have other shapes than its config.json gives, e.g. " in line, line
    assert "(ckpt: torch.Size([32" in line and "vs model:torch.Size([64" in line, line


@pytest.mark.parametrize("layout", ["plain", "sentence-transformers"])
def test_a_config_that_does_not_fit_the_weights_names_the_folder_for_finetune_and_evaluate(layout, spread_cls_bert,
                                                                                          tmp_path):
    """`load_sentence_transformer` (finetune's, evaluate's and search's --model), for a folder without and with
    modules.json. HEAD: "cannot load the model folder ... (RuntimeError: You set `ignore_mismatched_sizes` to
    `False`, thus raising an error. For details look at the above report!)", whatever the verbosity hid."""
    from retromae.trainers.inputs.sentence_models import load_sentence_transformer
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    source = spread_cls_bert
    if layout == "sentence-transformers":
        transformer = Transformer(str(spread_cls_bert))
        source = tmp_path / "st"
        SentenceTransformer(modules=[transformer, Pooling(32, pooling_mode="cls")]).save(str(source))
    model = widened(source, tmp_path / "model")
    with pytest.raises(ValueError, match=r"model: its weights have other shapes than its config.json gives, e\.g\. "
                                         r".*\(ckpt: torch\.Size\(\[32.* vs model:torch\.Size\(\[64"):
        load_sentence_transformer(model, device="cpu")


def test_a_corpus_smaller_than_one_batch_is_warned_of(tiny_bert, tmp_path, caplog, capsys):
    """HEAD: --per-device-train-batch-size 100 on 8 passages trained batches of 8 without a word."""
    corpus = write_lines(tmp_path / "c.txt", [f"passage {i} of a short corpus" for i in range(8)])
    with caplog.at_level(logging.WARNING, logger="retromae"):
        assert cli.main(pretrain_args(tiny_bert, corpus, tmp_path / "out", "--per-device-train-batch-size", "100",
                                      "--max-steps", "1", "--no-export", "true")) == 0
    assert "the corpus holds 8 sequences, fewer than a global batch of 100" in caplog.text
    # with --dataloader-drop-last no step would train (HEAD: exit 0 after 0 steps, the untrained model saved)
    out = tmp_path / "dropped"
    assert cli.main(pretrain_args(tiny_bert, corpus, out, "--per-device-train-batch-size", "100", "--max-steps", "1",
                                  "--no-export", "true", "--dataloader-drop-last", "true")) == 2
    assert "--dataloader-drop-last drops every batch of 100" in capsys.readouterr().err
    assert not (out / "config.json").exists()


@pytest.mark.parametrize("command", ["pretrain", "finetune"])
def test_torchrun_on_a_cpu_machine_without_use_cpu_is_one_line(command, tmp_path, capsys, monkeypatch):
    """HEAD: each process trained alone, the second stopped at the first one's folder lock, torchrun printed a
    traceback."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    first = ["--corpus", str(tmp_path / "missing.txt")] if command == "pretrain" else ["model", "data"]
    assert cli.main([command, *first, "--output-dir", str(tmp_path / "out")]) == 2
    assert "started with 2 processes (torchrun) on a machine without a GPU; add --use-cpu true" in one_line_error(
        capsys, command)


def test_a_refusal_every_torchrun_process_meets_is_printed_once(run_cli_in_two_processes, tmp_path):
    """HEAD: each process printed it (and with another run's folder lock held, the second process told the user to
    resume a folder the other run was still writing: probe 77 B-004)."""
    result = run_cli_in_two_processes(["pretrain", "--corpus", str(tmp_path / "missing.txt"), "--output-dir",
                                       str(tmp_path / "out")], 29591)  # no --use-cpu, on a machine without a GPU
    assert result.returncode != 0
    assert result.stderr.count("retromae pretrain: error: ") == 1, result.stderr[-3000:]
