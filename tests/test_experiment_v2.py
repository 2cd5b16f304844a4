"""benchmarks/scifact_experiment_v2.py: the validation hold-out, the recipe grid, tokens seen, caching, and a --tiny
smoke run of the recipe selection (slow)."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import scifact_experiment_v2 as v2  # noqa: E402


def qids(path: Path) -> set[str]:
    return {line.split("\t")[0] for line in path.read_text(encoding="utf-8").splitlines()[1:]}


def test_holdout_is_a_fixed_share_of_train_queries_and_never_dev(shared_data, tmp_path):
    scifact = shared_data / "scifact"
    folder, split = v2.make_holdout(tmp_path, scifact, 0.2, 0)
    train, held = qids(folder / "qrels" / "train.tsv"), qids(folder / "qrels" / "dev.tsv")
    dev = qids(scifact / "qrels" / "dev.tsv")
    assert train | held == qids(scifact / "qrels" / "train.tsv") and not train & held
    assert (len(held), len(train)) == (122, 487) == (split["validation_queries"], split["train_queries"])  # 20% of 609
    queries = {json.loads(line)["_id"] for line in (folder / "queries.jsonl").read_text(encoding="utf-8").splitlines()}
    assert not (held | train | queries) & dev  # the dev queries are nowhere in the hold-out folder
    again, _ = v2.make_holdout(tmp_path / "again", scifact, 0.2, 0)
    assert qids(again / "qrels" / "dev.tsv") == held  # seeded: the same share every time


def test_grid_starts_with_no_recipe_and_flags_name_the_recipe_options():
    cfg = {**v2.PRESETS["cpu"], "warmup_grid": "0,0.2", "lr_scale_grid": "1.0,0.1"}
    points = v2.grid(cfg, 50)
    assert points[0] == v2.NO_RECIPE and len(points) == 4  # (0, 1.0) is not repeated
    assert {(p["head_warmup_steps"], p["encoder_lr_scale"]) for p in points} == {(0, 1.0), (0, 0.1), (10, 1.0),
                                                                                  (10, 0.1)}
    assert v2.recipe_flags(v2.NO_RECIPE) == []  # the control passes no recipe flag at all
    recipe = {**v2.NO_RECIPE, "head_warmup_steps": 10, "encoder_lr_scale": 0.1, "contrastive_anchor_weight": 0.5}
    assert v2.recipe_flags(recipe) == ["--head-warmup-steps", "10", "--encoder-lr-scale", "0.1",
                                       "--contrastive-anchor-weight", "0.5"]


def test_recipe_flags_parse_in_retromae_pretrain():
    from retromae.trainers.cli import _pretrain_parser

    parser = _pretrain_parser()
    known = {option for action in parser._actions for option in action.option_strings}
    missing = [flag for flag in v2.RECIPE_FLAGS.values() if flag not in known]
    if missing:
        pytest.skip(f"`retromae pretrain` has no {missing} yet (the recipe options of issue 14)")
    recipe = {"head_warmup_steps": 3, "encoder_lr_scale": 0.1, "layer_lr_decay": 0.9, "contrastive_anchor_weight": 0.1}
    parser.parse_args_into_dataclasses(args=[*v2.recipe_flags(recipe), "--corpus", "x.txt"])


def test_tokens_seen_replays_the_trainers_data_order(tiny_bert, tmp_path):
    """The real-token count is derived by replaying the Trainer's sampler; it is kept only when the padded count of
    the replay equals the Trainer's own count, which this run checks across an epoch boundary (12 x 4 > 37 rows)."""
    from retromae.trainers.cli import main

    rng = random.Random(1)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": str(i), "title": "t", "text": " ".join(
        rng.choice(["cell", "gene", "tumor", "protein"]) for _ in range(rng.randint(3, 90)))}) + "\n"
        for i in range(37)), encoding="utf-8")
    out = tmp_path / "pt"
    assert main(["pretrain", "--model", str(tiny_bert), "--corpus", str(corpus), "--max_seq_length", "64",
                 "--per_device_train_batch_size", "4", "--max_steps", "12", "--save_steps", "12", "--seed", "7",
                 "--include_num_input_tokens_seen", "true", "--no_export", "--report_to", "none",
                 "--output_dir", str(out)]) == 0
    lengths = v2.corpus_lengths(corpus, 64)
    assert len(set(lengths)) > 10  # rows of many lengths: padding differs from batch to batch
    record = v2.pretraining_record(out, lengths, {"batch_size": 4, "pretrain_seed": 7}, 12)
    replay = v2.trained_tokens(lengths, 12, 4, 7)
    assert record["tokens_padded_trainer"] == replay["padded"] and record["tokens_real"] == replay["real"]
    assert replay["real"] < replay["padded"] and record["steps"] == 12 and record["passes"] == round(48 / 37, 3)


def test_phases_are_reused_while_their_key_holds(tmp_path):
    calls = []
    phases = v2.Phases(tmp_path, "arm")
    assert phases.run("p", "k1", lambda: calls.append(1) or "a") == "a"
    assert v2.Phases(tmp_path, "arm").run("p", "k1", lambda: calls.append(2) or "b") == "a"  # read back from disk
    assert v2.Phases(tmp_path, "arm").run("p", "k2", lambda: calls.append(3) or "c") == "c"  # settings changed
    assert calls == [1, 3]


@pytest.mark.experiment
def test_tiny_selection_end_to_end(shared_data, tmp_path):
    """--tiny --phase select: pre-train (3 steps), fine-tune on the train share (in-batch, then mined negatives),
    score on the held-out share; then --report-only writes the table. Proves the plumbing, not the quality."""
    out = tmp_path / "v2"
    common = ["--tiny", "--seeds", "42", "--no-references", "--output-dir", str(out)]
    assert v2.main([*common, "--phase", "select", "--warmup-grid", "0", "--lr-scale-grid", "1.0"]) == 0
    selection = json.loads((out / "select" / "done.json").read_text(encoding="utf-8"))
    (point,) = selection["points"]
    assert selection["chosen"] == v2.NO_RECIPE and selection["split"]["validation_queries"] == 10  # 20% of 48
    assert 0 <= point["validation"]["ndcg_at_10"] <= 1 and point["pretraining"]["tokens_real"] > 0
    assert "Dev was not read" in selection["how"]
    assert v2.main([*common, "--report-only", "--warmup-grid", "0", "--lr-scale-grid", "1.0"]) == 0
    report = (out / "scifact_experiment_v2.md").read_text(encoding="utf-8")
    assert "prove nothing" in report and "held-out train queries" in report


def test_pretraining_resumes_and_is_shared_across_arms(tmp_path, monkeypatch):
    """An interrupted pre-training continues from its newest complete checkpoint (the same flags plus
    --resume-from-checkpoint last); one killed before its first checkpoint starts again in its own folder; a finished
    one with the same settings is reused by any arm (e.g. the selection's chosen point by the `retromae` arm)."""
    calls = []
    monkeypatch.setattr(v2.v1, "retromae_cli", lambda command, args, log_file: calls.append(args))
    cfg = {"save_steps": 25}
    args = ["--method", "retromae", "--max_steps", "10"]
    folder = tmp_path / "retromae" / f"pretrained-{v2.settings_hash(args)}"
    (folder / "checkpoint-4").mkdir(parents=True)
    (folder / "checkpoint-4" / "trainer_state.json").write_text("{}")
    assert v2.pretrain(tmp_path, tmp_path / "retromae", args, cfg, tmp_path / "log.txt") == folder
    assert calls[-1][: len(args)] == args and calls[-1][-2:] == ["--resume-from-checkpoint", "last"]
    assert v2.pretrain(tmp_path, tmp_path / "select", args, cfg, tmp_path / "log.txt") == folder  # reused
    assert len(calls) == 1
    other = ["--method", "bow", "--max_steps", "10"]
    (tmp_path / "bow" / f"pretrained-{v2.settings_hash(other)}").mkdir(parents=True)  # killed before a checkpoint
    v2.pretrain(tmp_path, tmp_path / "bow", other, cfg, tmp_path / "log.txt")
    assert "--overwrite_output_dir" in calls[-1] and "--resume-from-checkpoint" not in calls[-1]
