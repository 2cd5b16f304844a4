"""Input-token coverage (the BoW-prediction paper, Algorithm 1): hand-checked values, loading, JSON + PNG output."""

from __future__ import annotations

import json

import pytest
import torch
from retromae.modeling.configuration_bow import BoWConfig
from retromae.modeling.modeling_bow import BoWForPretraining
from retromae.trainers.inputs.checkpoints import CheckpointError, load_encoder, load_mlm_head
from retromae.trainers.retrieval.coverage import coverage_at_k, input_token_coverage, plot_coverage, run_coverage
from transformers import BertConfig, BertModel

from ..builders import tiny_bert_kwargs

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital and most populous city of France.",
    "Photosynthesis converts light energy into chemical energy in plants.",
    "Dense retrieval encodes queries and passages into vectors.",
]


def test_coverage_at_k_by_hand():
    scores = torch.tensor([[0.9, 0.1, 0.8, 0.3, 0.5, 0.0]])  # ranking: 0, 2, 4, 3, 1, 5
    in_input = torch.tensor([[True, False, False, True, False, True]])  # input tokens {0, 3, 5}
    # top-1 {0}: 1/1; top-2 {0,2}: 1/2; top-4 {0,2,4,3}: 2/4; top-6: all 3 input tokens / 6
    assert coverage_at_k(scores, in_input, (1, 2, 4, 6)).tolist() == [[1.0, 0.5, 0.5, 0.5]]


def test_tiny_model_matches_a_direct_computation(tokenizer):
    torch.manual_seed(0)
    model = BertModel(BertConfig(**tiny_bert_kwargs()), add_pooling_layer=False).eval()
    got = input_token_coverage(model, tokenizer, TEXTS[:2], ks=(5, 50), batch_size=1)
    expected = {5: 0.0, 50: 0.0}
    for text in TEXTS[:2]:
        encoded = tokenizer(text, return_tensors="pt")
        ids = encoded["input_ids"][0].tolist()
        inputs = set(ids) - set(tokenizer.all_special_ids)  # non-special input tokens
        with torch.no_grad():
            h = model(**encoded).last_hidden_state[0, 0]  # [CLS] of the unmasked text
        ranking = (h @ model.embeddings.word_embeddings.weight.T).argsort(descending=True).tolist()  # h . E^T
        for k in expected:
            expected[k] += len(set(ranking[:k]) & inputs) / k / 2
    assert got == pytest.approx(expected, abs=1e-9)


def test_minilm_run_coverage_writes_json_and_png(minilm_dir, tokenizer, tmp_path):
    results = run_coverage([str(minilm_dir)], TEXTS + [""], tokenizer, tmp_path / "out", ks=(10, 20, 50), batch_size=2)
    coverage = results[str(minilm_dir)]
    assert list(coverage) == [10, 20, 50]
    assert all(0.0 <= v <= 1.0 for v in coverage.values())
    saved = json.loads((tmp_path / "out" / "coverage.json").read_text())
    assert saved["ks"] == [10, 20, 50] and saved["num_texts"] == 5 and saved["denominator"] == "k"
    assert saved["coverage"][str(minilm_dir)] == {str(k): v for k, v in coverage.items()}
    assert (tmp_path / "out" / "coverage.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["coverage.json", "coverage.png"]  # no temp files


def test_pretraining_checkpoint_loads_its_encoder_by_prefix(tokenizer, tmp_path):
    torch.manual_seed(0)
    model = BoWForPretraining(BoWConfig(**tiny_bert_kwargs())).eval()
    model.save_pretrained(tmp_path / "bow")
    tokenizer.save_pretrained(tmp_path / "bow")
    encoder = load_encoder(tmp_path / "bow")
    assert isinstance(encoder, BertModel) and encoder.pooler is None
    assert torch.equal(encoder.encoder.layer[-1].output.dense.weight, model.bert.encoder.layer[-1].output.dense.weight)
    from_dir = input_token_coverage(tmp_path / "bow", None, TEXTS, ks=(10, 100))  # tokenizer from the checkpoint
    from_module = input_token_coverage(model, tokenizer, TEXTS, ks=(10, 100))  # uses model.bert
    assert from_dir == pytest.approx(from_module, abs=1e-9)


def test_lm_head_projection_uses_the_trained_head(tokenizer, tmp_path):
    """projection="lm_head" scores h through the checkpoint's own MLM head (by hand: model.vocab_logits path)."""
    torch.manual_seed(0)
    model = BoWForPretraining(BoWConfig(**tiny_bert_kwargs())).eval()
    with torch.no_grad():  # a head bias that favours the texts' tokens: lm_head coverage > 0, bare Eᵀ's stays ~0
        model.cls.predictions.bias[tokenizer(TEXTS[0])["input_ids"][1:-1]] = 20.0
    model.save_pretrained(tmp_path / "bow")
    tokenizer.save_pretrained(tmp_path / "bow")
    ks = (1, 5, 10)
    batch = tokenizer(TEXTS, padding=True, return_special_tokens_mask=True, return_tensors="pt")
    ordinary = batch["attention_mask"].bool() & ~batch["special_tokens_mask"].bool()
    in_input = torch.zeros(len(TEXTS), model.config.vocab_size, dtype=torch.bool)
    for row, (ids, keep) in enumerate(zip(batch["input_ids"], ordinary, strict=True)):
        in_input[row, ids[keep]] = True
    with torch.no_grad():
        h = model.bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state[:, 0]
        expected = coverage_at_k(model.cls(h), in_input, ks).mean(0).tolist()
    from_dir = input_token_coverage(tmp_path / "bow", None, TEXTS, ks=ks, projection="lm_head")
    from_module = input_token_coverage(model, tokenizer, TEXTS, ks=ks, projection="lm_head")
    bare = input_token_coverage(tmp_path / "bow", None, TEXTS, ks=ks, projection="embeddings")
    assert list(from_dir.values()) == pytest.approx(expected, abs=1e-6)
    assert from_module == pytest.approx(from_dir, abs=1e-6)
    assert from_dir[1] > 0.2 and from_dir[1] > bare[1]


def test_lm_head_projection_needs_a_head(minilm_dir, tokenizer):
    with pytest.raises(CheckpointError, match=r"no trained MLM head.*use --projection embeddings \(projection='embeddings' in Python\)"):
        input_token_coverage(minilm_dir, tokenizer, TEXTS, ks=(10,), projection="lm_head")
    with pytest.raises(CheckpointError, match=r"no trained MLM head"):
        load_mlm_head(minilm_dir)
    with pytest.raises(ValueError, match="projection="):
        input_token_coverage(minilm_dir, tokenizer, TEXTS, ks=(10,), projection="mlm")


def test_checkpoint_without_encoder_weights_is_refused(tmp_path):
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", **tiny_bert_kwargs()}))
    save_file({"something.else": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="lacks encoder weights"):
        load_encoder(tmp_path)


def test_invalid_arguments(tokenizer):
    model = BertModel(BertConfig(**tiny_bert_kwargs()), add_pooling_layer=False)
    with pytest.raises(ValueError, match="k=0"):
        input_token_coverage(model, tokenizer, TEXTS, ks=(0, 10))
    with pytest.raises(ValueError, match="no texts"):
        input_token_coverage(model, tokenizer, [])
    with pytest.raises(ValueError, match="non-special"):
        input_token_coverage(model, tokenizer, ["", ""])
    with pytest.raises(ValueError, match="twice"):
        run_coverage(["a", "a"], TEXTS)


def test_plot_writes_a_png_creating_the_folder(tmp_path):
    path = plot_coverage({"bert": {10: 0.05, 20: 0.04}, "bow": {10: 0.6, 20: 0.45}}, tmp_path / "sub" / "c.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


# ---- CLI: repeated --model, progress bar, incomplete folders -------------------------------


def test_cli_measures_every_repeated_model_and_shows_progress(minilm_dir, tokenizer, tmp_path, capsys):
    """The README's `coverage --model A --model B`: HEAD measured B alone and showed no progress bar."""
    from retromae.trainers.commands.coverage import coverage_command

    tiny = tmp_path / "tiny"
    torch.manual_seed(0)
    BertModel(BertConfig(**tiny_bert_kwargs()), add_pooling_layer=False).save_pretrained(tiny)
    tokenizer.save_pretrained(tiny)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(t for t in TEXTS if t) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    assert coverage_command(["--model", str(minilm_dir), "--model", str(tiny), "--corpus", str(corpus),
                             "--max-seq-length", "32", "--output-dir", str(out)]) == 0
    saved = json.loads((out / "coverage.json").read_text())
    assert list(saved["coverage"]) == [str(minilm_dir), str(tiny)]
    assert "batch" in capsys.readouterr().err  # tqdm's bar, one per model
    with pytest.raises(ValueError, match="--max-seq-length is given 2 times"):
        coverage_command(["--max-seq-length", "32", "--max-seq-length", "64"])


def test_folder_killed_mid_save_is_refused(tokenizer, tmp_path):
    """Weights + tokenizer_config.json without tokenizer.json: HEAD measured it with a 5-token tokenizer."""
    torch.manual_seed(0)
    model = BoWForPretraining(BoWConfig(**tiny_bert_kwargs())).eval()
    model.save_pretrained(tmp_path / "checkpoint-2")
    tokenizer.save_pretrained(tmp_path / "checkpoint-2")
    (tmp_path / "checkpoint-2" / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match=r"coverage: model folder .*checkpoint-2 is incomplete, it has no tokenizer"):
        input_token_coverage(tmp_path / "checkpoint-2", None, TEXTS, ks=(10,))


# ---- --max-seq-length beyond the model's positions, an output folder that is a file ------------------------------


def test_default_length_is_capped_at_the_positions_and_a_longer_one_refused(tiny_bert, tmp_path, caplog):
    """tiny_bert has 128 positions; HEAD's default 256 failed inside torch (RuntimeError) on a long text."""
    import logging

    from retromae.trainers.commands.coverage import coverage_command

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(" ".join(TEXTS * 20) + "\n" + TEXTS[0] + "\n", encoding="utf-8")  # one text of ~400 tokens
    with caplog.at_level(logging.INFO, logger="retromae.trainers.retrieval.coverage"):
        assert coverage_command(["--model", str(tiny_bert), "--corpus", str(corpus), "--no-progress",
                                 "--output-dir", str(tmp_path / "out")]) == 0
    assert "max_seq_length 128" in caplog.text and "capped at its position limit" in caplog.text
    with pytest.raises(ValueError, match=r"--max-seq-length 256: give 3 to 128 for .*tiny-bert"):
        coverage_command(["--model", str(tiny_bert), "--corpus", str(corpus), "--max-seq-length", "256",
                          "--no-progress", "--output-dir", str(tmp_path / "out2")])


def test_output_dir_that_is_a_file_is_refused_before_loading(tmp_path):
    """HEAD: a FileExistsError traceback after every model was measured."""
    from retromae.trainers.commands.coverage import coverage_command

    (tmp_path / "out.txt").write_text("notes")
    with pytest.raises(ValueError, match=r"--output-dir .*out\.txt is a file, not a folder"):
        coverage_command(["--model", str(tmp_path / "not-loaded"), "--corpus", str(tmp_path / "not-read.txt"),
                          "--output-dir", str(tmp_path / "out.txt")])
    with pytest.raises(ValueError, match="is a file, not a folder"):
        run_coverage([str(tmp_path / "not-loaded")], TEXTS, output_dir=tmp_path / "out.txt" / "sub")


# ---- results of other models in --output-dir, the shortest --max-seq-length, every model checked first ----------


def _no_loading(*args, **kwargs):
    raise AssertionError("a model was loaded")


def test_results_not_ours_or_of_other_models_are_kept_without_overwrite(tiny_bert, minilm_dir, tmp_path,
                                                                        monkeypatch):
    """HEAD replaced a user's coverage.json (and another set of models' results) silently, and had no --overwrite."""
    from retromae.trainers.commands.coverage import coverage_command
    from retromae.trainers.retrieval import coverage
    from retromae.trainers.retrieval.coverage import check_coverage_run

    out = tmp_path / "out"
    out.mkdir()
    (out / "coverage.json").write_text('{"my": "results"}')
    monkeypatch.setattr(coverage, "_encoder", _no_loading)  # refused before any model loads
    with pytest.raises(ValueError, match=r"out holds a coverage\.json that `retromae coverage` did not "
                       r"write; choose another --output-dir, or pass --overwrite \(Python: overwrite=True\) to replace it$"):
        coverage_command(["--model", str(tiny_bert), "--corpus", str(tmp_path / "not-read.txt"),
                          "--output-dir", str(out)])
    assert json.loads((out / "coverage.json").read_text()) == {"my": "results"}
    monkeypatch.undo()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    assert coverage_command(["--model", str(tiny_bert), "--corpus", str(corpus), "--no-progress",
                             "--output-dir", str(out), "--overwrite"]) == 0
    assert json.loads((out / "coverage.json").read_text())["model_paths"] == [str(tiny_bert.resolve())]
    monkeypatch.chdir(tiny_bert.parent)  # the same model by another name: its own results, replaced
    run_coverage([tiny_bert.name], TEXTS, output_dir=out, ks=(10,))
    assert list(json.loads((out / "coverage.json").read_text())["coverage"]) == [tiny_bert.name]
    monkeypatch.setattr(coverage, "_encoder", _no_loading)
    with pytest.raises(ValueError, match=r"holds the coverage of .*tiny-bert.*; choose another --output-dir, or "
                       r"pass --overwrite \(Python: overwrite=True\) to replace it$"):
        run_coverage([str(minilm_dir), tiny_bert.name], TEXTS, output_dir=out)  # a superset is other models, too
    older = {**json.loads((out / "coverage.json").read_text()), "coverage": {"a-model": {"10": 0.5}}}
    del older["model_paths"]  # written before coverage.json recorded its models: the names given then decide
    (out / "coverage.json").write_text(json.dumps(older))
    with pytest.raises(ValueError, match=r"holds the coverage of a-model; choose another --output-dir"):
        run_coverage([tiny_bert.name], TEXTS, output_dir=out)
    check_coverage_run(["a-model"], out)
    (out / "coverage.json").unlink()
    with pytest.raises(ValueError, match=r"coverage\.png that .*did not write.*pass --overwrite "
                                          r"\(Python: overwrite=True\) to replace it$"):
        run_coverage([tiny_bert.name], TEXTS, output_dir=out)


def test_shortest_max_seq_length_is_3(tiny_bert):
    """HEAD advertised "give 2 to 128", but 2 tokens are [CLS] [SEP]: every text failed as having no token."""
    coverage = input_token_coverage(tiny_bert, None, TEXTS, ks=(1,), max_seq_length=3)  # [CLS] token [SEP]
    assert 0.0 <= coverage[1] <= 1.0
    with pytest.raises(ValueError, match=r"--max-seq-length 2: give 3 to 128 for "):
        input_token_coverage(tiny_bert, None, TEXTS, ks=(1,), max_seq_length=2)


def test_every_model_is_checked_before_any_is_scored(tiny_bert, tmp_path, monkeypatch):
    """HEAD found a missing or half-saved second --model only after scoring the first."""
    from retromae.trainers.retrieval import coverage

    monkeypatch.setattr(coverage, "_encoder", _no_loading)  # HEAD: loaded and scored the first model
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "config.json").write_text(json.dumps({"model_type": "bert", **tiny_bert_kwargs()}))
    for second, problem in (("missing", "does not exist"), ("half", "is incomplete, it has no model.safetensors")):
        with pytest.raises(ValueError, match=rf"coverage --model: model folder .*{second} {problem}"):
            run_coverage([str(tiny_bert), str(tmp_path / second)], TEXTS, output_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()
