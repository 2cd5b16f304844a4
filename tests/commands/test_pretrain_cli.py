"""`retromae pretrain` / `retromae export` end to end on a tiny BERT: checkpoints, exact resume, DDP, bad input."""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import pytest
import torch
from retromae.modeling.configuration_retromae import RetroMAEConfig
from retromae.modeling.modeling_retromae import RetroMAEForPretraining
from retromae.trainers.cli import main
from retromae.trainers.data.training_data import corpus_training_data
from retromae.trainers.export.cards import Paper
from retromae.trainers.inputs.arguments import parse
from retromae.trainers.inputs.pretrain_options import pretrain_parser
from retromae.trainers.methods import METHODS, Method, get_method
from retromae.trainers.training.pretraining import load_pretraining_model
from safetensors.torch import load_file
from transformers import BertConfig, BertForMaskedLM

# absolute, not relative: transformers copies this module as remote code (SixthForPretraining) and would look for
# a relative import as a file beside it
from tests.builders import SENTENCES, pretrain_args, tiny_bert_kwargs, write_jsonl, write_lines


def test_pretrain_export_and_load(tiny_bert, corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(pretrain_args(tiny_bert, corpus, out)) == 0
    summary = capsys.readouterr().out
    assert "pre-training finished: 4 steps" in summary and "encoder_mlm_loss" in summary
    assert f"  started from: {tiny_bert.name}\n" in summary
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    logged = [entry for entry in state["log_history"] if "loss" in entry]
    assert logged and all({"encoder_mlm_loss", "decoder_loss"} <= entry.keys() for entry in logged)
    for checkpoint in ("checkpoint-2", "checkpoint-4"):
        weights = load_file(str(out / checkpoint / "model.safetensors"))
        assert any(k.startswith("decoder.") for k in weights), "checkpoints keep the decoder"
        run_info = json.loads((out / checkpoint / "retromae_run.json").read_text())
        assert run_info["method"] == "retromae" and run_info["global_step"] == int(checkpoint.split("-")[1])
        assert str(tmp_path) not in json.dumps(run_info), "no local paths in run info"
    # the final save is the folder one uploads: no file of it holds a local path (HEAD: training_args.bin did)
    assert [p.name for p in out.iterdir() if p.is_file() and str(tmp_path).encode() in p.read_bytes()] == []
    assert (out / "checkpoint-4" / "training_args.bin").is_file() and not (out / "training_args.bin").exists()
    from transformers import AutoModel

    encoder = AutoModel.from_pretrained(out / "checkpoint-4", trust_remote_code=True)
    assert type(encoder).__name__ == "RetroMAEModel"

    exported = tmp_path / "encoder"
    assert main(["export", str(out / "checkpoint-4"), str(exported)]) == 0
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(exported))
    batch = model.tokenize(SENTENCES[:2])
    with torch.no_grad():
        expected = encoder.eval()(**{k: batch[k] for k in ("input_ids", "attention_mask")}).pooler_output
    assert torch.allclose(model.encode(SENTENCES[:2], convert_to_tensor=True), expected, atol=1e-5)
    assert (out / "encoder" / "modules.json").is_file(), "pretrain exports its final encoder"


def _training_table(card: Path) -> str:
    """The card's "Training hyperparameters" table."""
    return card.read_text().split("### Training hyperparameters")[1].split("###")[0]


def test_pretrain_card_and_export_card_show_the_same_plain_training_arguments(tiny_bert, corpus, tmp_path):
    """HEAD's pretrain card said `SchedulerType.LINEAR` (export's: `linear`), and both claimed num_train_epochs 3
    for a run that --max-steps stopped."""
    out = tmp_path / "run"
    assert main(pretrain_args(tiny_bert, corpus, out)) == 0
    assert main(["export", str(out / "checkpoint-4"), str(tmp_path / "exported")]) == 0
    own, exported = _training_table(out / "encoder" / "README.md"), _training_table(tmp_path / "exported" / "README.md")
    assert own == exported
    assert "| `lr_scheduler_type` | linear |" in own and "| `max_steps` | 4 |" in own
    assert "num_train_epochs" not in own


def test_resume_continues_exactly(tiny_bert, corpus, tmp_path):
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    assert main(pretrain_args(tiny_bert, corpus, full, "--no-export", "true")) == 0
    args = pretrain_args(tiny_bert, corpus, resumed, "--no-export", "true",
                         "--resume-from-checkpoint", str(full / "checkpoint-2"))
    assert main(args) == 0
    a, b = load_file(str(full / "model.safetensors")), load_file(str(resumed / "model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.allclose(a[key], b[key], atol=1e-6), key
    untrained = load_file(str(full / "checkpoint-2" / "model.safetensors"))
    assert not torch.equal(untrained["decoder.layers.0.output.dense.weight"], a["decoder.layers.0.output.dense.weight"])


def test_existing_output_dir_is_refused_unless_asked(tiny_bert, corpus, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(pretrain_args(tiny_bert, corpus, out)) == 2
    assert "--overwrite-output-dir" in capsys.readouterr().err
    assert main(pretrain_args(tiny_bert, corpus, out, "--overwrite-output-dir", "true")) == 0
    assert (out / "notes.txt").read_text() == "mine", "only what a run writes is replaced"
    assert (out / "encoder" / "modules.json").is_file() and (out / "checkpoint-4").is_dir()


def test_overwrite_leaves_nothing_of_the_previous_run(tiny_bert, corpus, tmp_path):
    """After --overwrite-output-dir, nothing the earlier run wrote at the root remains for `export` to pick up."""
    out = tmp_path / "run"
    assert main(pretrain_args(tiny_bert, corpus, out, "--method", "dupmae", "--method-options",
                              '{"dense_dim": 16}', "--max-steps", "4")) == 0
    (out / "notes.txt").write_text("mine")
    (out / "model-00002-of-00002.safetensors").write_text("a shard of an older save")
    assert main(pretrain_args(tiny_bert, corpus, out, "--overwrite-output-dir", "true", "--no-export", "true",
                              "--max-steps", "2", "--save-steps", "100")) == 0
    left = sorted(p.name for p in out.iterdir())
    assert "encoder" not in left and not [name for name in left if name.startswith(".")], left
    assert [name for name in left if name.startswith("checkpoint-")] == ["checkpoint-2"], "the new run's only"
    assert json.loads((out / "checkpoint-2" / "retromae_run.json").read_text())["method"] == "retromae"
    assert "model-00002-of-00002.safetensors" not in left and not [n for n in left if "dupmae" in n], left
    assert (out / "notes.txt").read_text() == "mine"
    assert json.loads((out / "config.json").read_text())["model_type"] == "retromae"
    assert json.loads((out / "retromae_run.json").read_text())["global_step"] == 2


def test_config_file_sets_values_and_flags_win(tiny_bert, corpus, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        f"model: {tiny_bert}\ncorpus: {corpus}\noutput_dir: {tmp_path / 'cfg-run'}\nmax_seq_length: 32\n"
        "max_steps: 3\nsave_steps: 100\ndecoding: basic\nnum_decoder_layers: 2\ndecoder_mask_ratio: 0.7\n"
        "per_device_train_batch_size: 2\nno_export: true\nuse_cpu: true\n"
    )
    assert main(["pretrain", "--config", str(config), "--max-steps", "2"]) == 0
    saved = json.loads((tmp_path / "cfg-run" / "config.json").read_text())
    assert (saved["decoding"], saved["num_decoder_layers"], saved["decoder_mask_ratio"]) == ("basic", 2, 0.7)
    assert json.loads((tmp_path / "cfg-run" / "retromae_run.json").read_text())["global_step"] == 2


def test_config_equals_file_runs_and_config_twice_is_refused(tiny_bert, corpus, tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(f"model: {tiny_bert}\ncorpus: {corpus}\noutput_dir: {tmp_path / 'cfg-run'}\nmax_seq_length: 32\n"
                      "max_steps: 1\nper_device_train_batch_size: 2\nno_export: true\nuse_cpu: true\n")
    assert main(["pretrain", "--config", str(config), "--config", "demo-bow"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("--config is given 2 times; give it once (merge the files into one)") and "\n" not in err, err
    assert main(["pretrain", f"--config={config}"]) == 0
    assert json.loads((tmp_path / "cfg-run" / "retromae_run.json").read_text())["global_step"] == 1


def test_method_options_flag_keeps_the_config_files_other_keys(tiny_bert, corpus, tmp_path, caplog):
    """Flags override the file key by key: the preset's bow_loss_weight and bow_normalization stay."""
    out = tmp_path / "run"
    args = pretrain_args(tiny_bert, corpus, out, "--config", "demo-dupmae", "--method-options", '{"dense_dim": 16}',
                         "--max-steps", "1", "--no-export", "true")
    assert main(args) == 0
    saved = json.loads((out / "config.json").read_text())
    assert (saved["dense_dim"], saved["bow_loss_weight"], saved["bow_normalization"]) == (16, 0.1, "all_tokens")
    assert any("--method-options merged into the --config file's method_options" in r.getMessage()
               for r in caplog.records)


def test_config_overrides_flag_merges_with_the_files_mapping(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("config_overrides:\n  num_hidden_layers: 1\n  hidden_size: 64\n  use_cache: false\n")
    model, *_ = parse(pretrain_parser(), ["--config", str(config), "--config-overrides", "hidden_size=32,vocab_size=99"])
    assert model.config_overrides == "num_hidden_layers=1,hidden_size=32,use_cache=false,vocab_size=99"


def test_a_max_seq_length_at_the_position_limit_not_a_multiple_of_8_trains(tiny_bert, tmp_path):
    """L = 36 = max_position_embeddings: the collator pads a full row to 36, not 40 (past the position table)."""
    long_lines = write_jsonl(tmp_path / "long.jsonl", [{"text": " ".join(SENTENCES)}] * 8)
    args = pretrain_args(tiny_bert, long_lines, tmp_path / "run", "--from-scratch", "true", "--config-overrides",
                         "max_position_embeddings=36", "--max-seq-length", "36", "--max-steps", "1", "--no-export", "true")
    assert main(args) == 0


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--encoder-mask-ratio", "1.5"], "encoder_mask_ratio=1.5"),
        (["--decoder-mask-ratio", "0"], "decoder_mask_ratio=0"),
        (["--max-seq-length", "1000"], "position limit"),
        (["--method-options", '{"no_such_field": 1}'], "no_such_field"),
        (["--method-options", "{oops"], "not valid JSON"),
        (["--streaming", "true", "--max-steps", "-1"], "--streaming needs --max-steps"),
        (["--method", "nope"], "unknown method"),
        (["--resume-from-checkpoint", "last"], "no complete checkpoint"),
    ],
)
def test_bad_arguments_get_one_clear_line(tiny_bert, corpus, tmp_path, capsys, extra, expected):
    assert main(pretrain_args(tiny_bert, corpus, tmp_path / "run", *extra)) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").glob("checkpoint-*"))


def test_tokenizer_larger_than_embedding_matrix(tokenizer, corpus, tmp_path, capsys):
    small = tmp_path / "small-vocab"
    BertForMaskedLM(BertConfig(**tiny_bert_kwargs(vocab_size=1000))).save_pretrained(small)
    tokenizer.save_pretrained(small)
    assert main(pretrain_args(small, corpus, tmp_path / "run")) == 2
    assert "30522 tokens but the model" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "expected"),
    [("", "empty"), ('{"text": "fine"}\nnot json\n', "corpus.jsonl:2"), ('{"title": "t"}\n', "corpus.jsonl:1")],
)
def test_bad_corpus_names_file_and_line(tiny_bert, tmp_path, capsys, content, expected):
    path = tmp_path / ("corpus.jsonl" if content.startswith("{") else "empty.txt")
    path.write_text(content)
    assert main(pretrain_args(tiny_bert, path, tmp_path / "run")) == 2
    err = capsys.readouterr().err
    assert expected in err.replace(str(tmp_path) + os.sep, "") and "Traceback" not in err


def test_export_refuses_a_folder_that_is_not_a_checkpoint(tiny_bert, tmp_path, capsys):
    assert main(["export", str(tiny_bert), str(tmp_path / "out")]) == 2
    assert "not a retromae checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "retromae.trainers.cli", *args]


@pytest.mark.slow
def test_two_process_ddp_on_cpu(run_cli_in_two_processes, tiny_bert, corpus, tmp_path):
    out = tmp_path / "ddp"
    args = pretrain_args(tiny_bert, corpus, out, "--max-steps", "3", "--save-steps", "3")
    result = run_cli_in_two_processes(args, 29517)
    assert result.returncode == 0, result.stderr[-4000:]
    state = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    logged = [entry for entry in state["log_history"] if "loss" in entry]
    assert all("decoder_loss" in entry for entry in logged)
    run_info = json.loads((out / "retromae_run.json").read_text())
    assert run_info["training"]["world_size"] == 2
    assert (out / "checkpoint-3" / "collator_rng_0.safetensors").is_file()
    assert (out / "checkpoint-3" / "collator_rng_1.safetensors").is_file()
    assert (out / "encoder" / "modules.json").is_file()


def test_continuing_a_checkpoint_keeps_its_decoder(tiny_bert, corpus, tmp_path):
    first = tmp_path / "stage1"
    assert main(pretrain_args(tiny_bert, corpus, first, "--no-export", "true", "--max-steps", "2")) == 0
    model = load_pretraining_model(str(first), get_method("retromae"), {})
    saved = load_file(str(first / "model.safetensors"))
    assert torch.equal(model.decoder.layers[0].output.dense.weight, saved["decoder.layers.0.output.dense.weight"])
    second = tmp_path / "stage2"
    assert main(pretrain_args(first, corpus, second, "--no-export", "true", "--max-steps", "2")) == 0
    assert json.loads((second / "retromae_run.json").read_text())["base_model"] == "stage1"


def test_a_checkpoint_continued_with_more_decoder_layers_keeps_its_trained_one(tiny_bert, corpus, tmp_path, caplog):
    """HEAD ignored --decoder-init copy_last_layer when continuing a checkpoint, and started the new layer from
    BERT init without a word. Now the new layer alone is copied and a warning names it."""
    first = tmp_path / "stage1"
    assert main(pretrain_args(tiny_bert, corpus, first, "--no-export", "true", "--decoding", "basic")) == 0
    saved = load_file(str(first / "model.safetensors"))
    model = load_pretraining_model(str(first), get_method("retromae"),
                                   {"decoding": "basic", "num_decoder_layers": 2, "decoder_init": "copy_last_layer"})
    assert "these parts start as copies of the encoder's last layer: ['decoder.layers.1']" in caplog.text
    for name, value in model.decoder.layers[0].state_dict().items():
        assert torch.equal(value, saved[f"decoder.layers.0.{name}"]), name
    for name, value in model.decoder.layers[1].state_dict().items():
        assert torch.equal(value, saved[f"bert.encoder.layer.1.{name}"]), name


def test_coverage_command_writes_json_and_plot(tiny_bert, corpus, tmp_path, capsys):
    out = tmp_path / "coverage"
    assert main(["coverage", "--model", str(tiny_bert), "--corpus", str(corpus), "--max-texts", "8",
                 "--max-seq-length", "32", "--output-dir", str(out)]) == 0
    results = json.loads((out / "coverage.json").read_text())
    (by_k,) = results["coverage"].values()
    assert set(by_k) == {"10", "20", "50", "100"}
    assert all(0.0 <= float(v) <= 1.0 for v in by_k.values())
    assert (out / "coverage.png").stat().st_size > 1000
    assert "cov@10" in capsys.readouterr().out
    assert results["projection"] == "embeddings"
    assert main(["coverage", "--model", str(tiny_bert), "--corpus", str(corpus), "--max-texts", "8",
                 "--max-seq-length", "32", "--output-dir", str(out), "--projection", "lm_head"]) == 0
    assert json.loads((out / "coverage.json").read_text())["projection"] == "lm_head"  # the BertForMaskedLM head


def test_dupmae_pretrain_export_index_search(tiny_bert, corpus, tmp_path, capsys):
    run, encoder, index = tmp_path / "dupmae", tmp_path / "dupmae-st", tmp_path / "index"
    options = '{"dense_dim": 16, "doc_top_k": 24}'
    assert main(pretrain_args(tiny_bert, corpus, run, "--method", "dupmae", "--method-options", options,
                              "--no-export", "true", "--max-steps", "2")) == 0
    state = json.loads((run / "checkpoint-2" / "trainer_state.json").read_text())
    assert all("bow_loss" in e for e in state["log_history"] if "loss" in e)
    assert main(["export", str(run), str(encoder)]) == 0
    docs = write_jsonl(tmp_path / "corpus.jsonl",
                       [{"_id": f"d{i}", "title": "", "text": t} for i, t in enumerate(SENTENCES)])
    assert main(["index", "--model", str(encoder), "--corpus", str(docs), "--output-dir", str(index)]) == 0
    results = tmp_path / "results.jsonl"
    assert main(["search", "--index", str(index), "--model", str(encoder), "--query", SENTENCES[3],
                 "inverted indexes", "--top-n", "3", "--output", str(results)]) == 0
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert [len(r["results"]) for r in lines] == [3, 3]
    assert all(hit["id"].startswith("d") for r in lines for hit in r["results"])
    assert main(["search", "--index", str(index), "--model", str(encoder)]) == 2
    assert "no query given" in capsys.readouterr().err
    blank = write_lines(tmp_path / "blank.txt", ["", "  "])  # HEAD: "no query given", although a file was
    assert main(["search", "--index", str(index), "--model", str(encoder), "--queries", str(blank)]) == 2
    assert f"--queries {blank} holds no query; give one per line" in capsys.readouterr().err


def test_integer_values_for_float_settings_are_accepted(tiny_bert, corpus, tmp_path):
    out = tmp_path / "run"
    assert main(pretrain_args(tiny_bert, corpus, out, "--method-options", '{"decoder_loss_weight": 2}',
                              "--no-export", "true", "--max-steps", "1")) == 0
    assert json.loads((out / "config.json").read_text())["decoder_loss_weight"] == 2.0


def test_sentmae_with_cosine_exports_cosine_similarity(tiny_bert, corpus, tmp_path):
    run, exported = tmp_path / "sentmae", tmp_path / "sentmae-st"
    assert main(pretrain_args(tiny_bert, corpus, run, "--method", "sentmae", "--no-export", "true",
                              "--max-steps", "1")) == 0
    assert main(["export", str(run), str(exported)]) == 0
    settings = json.loads((exported / "config_sentence_transformers.json").read_text())
    assert settings["similarity_fn_name"] == "cosine"
    assert "| Similarity | cosine |" in (exported / "README.md").read_text()


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_pretrains_exports_and_exits_0(method, tiny_bert, corpus, tmp_path, capsys):
    """End to end through the CLI, export and summary included (DupMAE's summary once exited 2)."""
    out = tmp_path / method
    args = pretrain_args(tiny_bert, corpus, out, "--method", method,
                         "--max-steps", "2", "--save-steps", "100")
    assert main(args) == 0, capsys.readouterr().err[-2000:]
    summary = capsys.readouterr().out
    assert f"retromae: {method} pre-training finished: 2 steps" in summary
    assert f"sentence-transformers encoder: {out / 'encoder'}" in summary and "example: encode_document" in summary


def test_summary_of_a_run_shorter_than_the_logging_interval(tiny_bert, corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(pretrain_args(tiny_bert, corpus, out, "--max-steps", "3", "--logging-steps", "50",
                              "--no-export", "true")) == 0
    assert "losses (step 1 -> step 3):" in capsys.readouterr().out
    info = json.loads((out / "retromae_run.json").read_text())
    state = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())
    assert [e["step"] for e in state["log_history"] if "loss" in e] == [1, 3]
    assert info["first_losses"] != info["final_losses"]


def test_no_pin_memory_warning_on_cpu(tiny_bert, corpus, tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(pretrain_args(tiny_bert, corpus, tmp_path / "run", "--max-steps", "1", "--no-export", "true")) == 0
    assert not [w for w in caught if "pin_memory" in str(w.message)]


def test_help_lists_config(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["pretrain", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--config FILE_OR_PRESET" in out and "retromae-wiki-book" in out


@pytest.mark.parametrize("method", ["retromae", "dupmae"])
def test_reference_sampling_runs_through_the_cli(method, tiny_bert, corpus, tmp_path, capsys):
    """The official code's sampling needs the batch's word starts: the Trainer passes them to the decoder."""
    options = json.dumps({"decoder_visibility": "reference", "decoder_targets": "reference",
                          **({"dense_dim": 16} if method == "dupmae" else {})})
    args = pretrain_args(tiny_bert, corpus, tmp_path / method, "--method", method, "--method-options", options,
                         "--max-steps", "2", "--no-export", "true")
    assert main(args) == 0, capsys.readouterr().err[-2000:]
    assert f"{method} pre-training finished: 2 steps" in capsys.readouterr().out


class SixthConfig(RetroMAEConfig):
    model_type = "sixth_method"


class SixthForPretraining(RetroMAEForPretraining):
    config_class = SixthConfig


def test_a_sixth_method_runs_through_the_registry_alone(tiny_bert, corpus, tmp_path, monkeypatch, capsys):
    """A method added to the registry only (model class, data builder, settings the data decide, exporter) trains,
    saves and exports through `retromae pretrain`: the driver has no per-method branch."""
    built = []

    def sixth_training_data(config, tokenizer, inputs):
        built.append((config.model_type, inputs.corpus))
        return corpus_training_data(config, tokenizer, inputs)

    def sixth_data_settings(inputs, requested):
        return {"decoder_loss_weight": 0.25}

    exported = []

    def sixth_exporter(request, build_dir):
        exported.append(request.method.name)
        METHODS["retromae"].exporter(request, build_dir)

    paper = Paper(bibtex="@misc{sixth,\n  url = {https://example.org/sixth}\n}", url="https://example.org/sixth")
    sixth = Method("sixth", SixthForPretraining, paper, "Sixth: a test method", exporter=sixth_exporter,
                   training_data=sixth_training_data, data_settings=sixth_data_settings)
    monkeypatch.setitem(METHODS, "sixth", sixth)
    out = tmp_path / "sixth"
    assert main(pretrain_args(tiny_bert, corpus, out, "--method", "sixth", "--max-steps", "2",
                              "--save-steps", "100", "--decoding", "basic")) == 0, capsys.readouterr().err[-2000:]
    assert built == [("sixth_method", str(corpus))] and exported == ["sixth"]
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["decoder_loss_weight"], config["decoding"]) == ("sixth_method", 0.25, "basic")
    assert json.loads((out / "retromae_run.json").read_text())["method"] == "sixth"
    assert "retromae: sixth pre-training finished: 2 steps" in capsys.readouterr().out
    assert (out / "encoder" / "modules.json").is_file()
