"""`retromae finetune` refuses, in one line, flags that no stage of the run reads and training-data lines with
fields it does not know (HEAD accepted both and ignored them)."""

from __future__ import annotations

import pytest
from retromae.trainers import cli
from retromae.trainers.data.training_groups import read_training_jsonl

from ..builders import write_jsonl
from . import test_finetune
from .test_bad_input import one_line_error
from .test_finetune import FAST, _no_training

tiny_beir = test_finetune.tiny_beir  # the fixture, for the tests here


def _finetune(model, data, out, *flags) -> int:
    return cli.main(["finetune", str(model), str(data), "--output-dir", str(out), *FAST, *flags])


@pytest.mark.parametrize("flags, flag", [
    (["--negatives-file", "NEG"], "--negatives-file"),
    (["--mine-range-min", "5"], "--mine-range-min"),
    (["--mine-range-max", "50"], "--mine-range-max"),
    (["--mine-sampling", "top"], "--mine-sampling"),
    (["--mine-range-min", "50", "--mine-range-max", "10"], "--mine-range-min"),
    (["--num-negatives", "3"], "--num-negatives"),
    (["--corpus", "NEG"], "--corpus"),
])
def test_negative_options_without_a_stage_that_reads_them_are_refused(flags, flag, spread_cls_bert, tiny_beir,
                                                                        tmp_path, monkeypatch, capsys):
    _no_training(monkeypatch)
    negatives = write_jsonl(tmp_path / "neg.jsonl", [{"query": "q", "positive": "p", "negatives": ["n"]}])
    flags = [str(negatives) if value == "NEG" else value for value in flags]
    assert _finetune(spread_cls_bert, tiny_beir, tmp_path / "out", "--stages", "in-batch", *flags) == 2
    assert one_line_error(capsys, "finetune").endswith(
        f"error: {flag} is read by the hard-negatives and distill stages only (they use negatives): add one of them "
        "to --stages, or drop the flag")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.work").exists()


def test_a_config_file_setting_counts_as_given_and_a_default_does_not(spread_cls_bert, tiny_beir, tmp_path,
                                                                        monkeypatch, capsys):
    _no_training(monkeypatch)
    config = tmp_path / "ft.yaml"
    config.write_text("mine_sampling: top\n")
    assert _finetune(spread_cls_bert, tiny_beir, tmp_path / "out", "--stages", "in-batch", "--config", str(config)) == 2
    assert "error: --mine-sampling is read by the hard-negatives and distill stages" in one_line_error(capsys, "finetune")
    # the default value given as a flag is still given
    assert _finetune(spread_cls_bert, tiny_beir, tmp_path / "out", "--stages", "in-batch", "--mine-sampling",
                     "random") == 2
    assert "error: --mine-sampling is read by" in one_line_error(capsys, "finetune")


@pytest.mark.parametrize("flags, flag", [
    (["--mine-sampling", "top"], "--mine-sampling"),
    (["--mine-range-min", "50", "--mine-range-max", "10"], "--mine-range-min"),
    (["--corpus", "NEG"], "--corpus"),
])
def test_mining_options_with_a_negatives_file_are_refused(flags, flag, spread_cls_bert, tiny_beir, tmp_path,
                                                           monkeypatch, capsys):
    """--negatives-file replaces mining: HEAD ignored the mining options (and checked no rank range) then."""
    _no_training(monkeypatch)
    negatives = write_jsonl(tmp_path / "neg.jsonl", [{"query": "q", "positive": "p", "negatives": ["n"]}])
    flags = [str(negatives) if value == "NEG" else value for value in flags]
    assert _finetune(spread_cls_bert, tiny_beir, tmp_path / "out", "--negatives-file", str(negatives), *flags) == 2
    assert one_line_error(capsys, "finetune").endswith(
        f"error: {flag} configures mining, which --negatives-file replaces: drop {flag} or --negatives-file")


def test_eval_split_without_eval_data_is_refused(spread_cls_bert, tiny_beir, tmp_path, monkeypatch, capsys):
    _no_training(monkeypatch)
    assert _finetune(spread_cls_bert, tiny_beir, tmp_path / "out", "--eval-split", "test") == 2
    assert one_line_error(capsys, "finetune").endswith(
        "error: --eval-split names a qrels split of --eval-data: pass --eval-data FOLDER, or drop --eval-split")


@pytest.mark.parametrize("flags, message", [
    (["--label-smoothing-factor", "0.2"], "--label-smoothing-factor 0.2: retromae's losses"),  # HEAD: ignored
    (["--push-to-hub", "true"], "--push-to-hub true: retromae does not upload from inside training"),  # HEAD: uploaded
    (["--neftune-noise-alpha", "5"], "--neftune-noise-alpha 5.0: NEFTune"),  # HEAD: an AttributeError traceback
    (["--eval-strategy", "steps"], "--eval-strategy steps: retromae finetune evaluates once"),  # HEAD: a traceback
])
def test_trainer_options_the_stages_cannot_honour_are_refused(flags, message, spread_cls_bert, tiny_beir, tmp_path,
                                                               monkeypatch, capsys):
    _no_training(monkeypatch)
    assert _finetune(spread_cls_bert, tiny_beir, tmp_path / "out", *flags) == 2
    assert message in one_line_error(capsys, "finetune")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.work").exists()


GOOD = [{"query": f"q{i}", "positive": f"p{i}"} for i in range(10)]


@pytest.mark.parametrize("lines, line, unknown", [
    ([{"query": "q0", "positive": "p0", "neg": ["n0 a", "n0 b"]}, *GOOD[1:]], 1, "'neg'"),
    ([{"query": f"q{i}", "pos": [f"p{i}"], "neg": [f"n{i}"]} for i in range(10)], 1, "'neg', 'pos'"),
    ([*GOOD[:4], {"query": "q x", "pos": "p"}, *GOOD[4:]], 5, "'pos'"),
])
def test_training_lines_with_unknown_fields_are_refused(lines, line, unknown, spread_cls_bert, tmp_path,
                                                        monkeypatch, capsys):
    """HEAD ignored such fields: the user's negatives were dropped (then mined), a FlagEmbedding file was "all 10
    queries are blank or lack a positive", a stray line was one of "dropped 1 queries without positives"."""
    _no_training(monkeypatch)
    train = write_jsonl(tmp_path / "train.jsonl", lines)
    assert _finetune(spread_cls_bert, train, tmp_path / "out") == 2
    error = one_line_error(capsys, "finetune")
    assert error.endswith(
        f"error: {train}:{line}: unknown field(s) {unknown}; a line holds 'query', 'positive' and optionally "
        "'negatives' (with ids: 'query_id', 'positive_ids', 'negative_ids'); FlagEmbedding's 'pos'/'neg' are "
        "'positive'/'negatives' here: rename or drop the unknown fields"), error


def test_every_documented_training_field_is_still_read(tmp_path):
    """The fields of the module docstring, the dataset-style columns, and what mining writes (`negative_ids`...);
    and the check that refuses the others (which HEAD ignored)."""
    path = write_jsonl(tmp_path / "train.jsonl", [
        {"query_id": "q1", "query": "a", "positive_id": "d1", "positive": "p", "negative_ids": ["d2"], "negatives": ["n"]},
        {"query": "b", "positives": ["p1", "p2"], "positive_ids": ["d3", "d4"], "negative": "n0", "negative_1": "n1"},
        {"anchor": "c", "document": "p"},
        {"question": "d", "answer": "p"},
    ])
    groups = read_training_jsonl(path)
    assert [(g.query, [t for _, t in g.positives], [t for _, t in g.negatives]) for g in groups] == [
        ("a", ["p"], ["n"]), ("b", ["p1", "p2"], ["n0", "n1"]), ("c", ["p"], []), ("d", ["p"], [])]
    write_jsonl(path, [{"query": "q", "positive": "p", "negative_x": "n"}])
    with pytest.raises(ValueError, match=r"train\.jsonl:1: unknown field\(s\) 'negative_x'; "):
        read_training_jsonl(path)
