"""benchmarks/scifact_experiment_v2.py: the validation hold-out, the recipe grid, tokens seen, caching, and a --tiny
smoke run of the recipe selection (slow)."""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import shutil
from pathlib import Path
from types import ModuleType

import pytest

from ..builders import benchmark_script, fake_clock


@pytest.fixture(scope="module")
def v2() -> ModuleType:
    return benchmark_script("scifact_experiment_v2")


def qids(path: Path) -> set[str]:
    return {line.split("\t")[0] for line in path.read_text(encoding="utf-8").splitlines()[1:]}


def test_holdout_is_a_fixed_share_of_train_queries_and_never_dev(v2, shared_data, tmp_path):
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


def test_run_metrics_score_a_ranked_run_as_mteb_does(v2):
    """BM25 and the hybrid's lambda grid are runs, not models: ranked from a score matrix and scored by mteb's scorer,
    unrounded (NDCG@10 and MRR@10 by hand: q1's positive at rank 4; q2's at ranks 2 and 3 of 4)."""
    import torch

    qrels = {"q1": {"d1": 1}, "q2": {"d2": 1, "d3": 1}}
    scores = torch.tensor([[0.1, 0.9, 0.5, 0.3], [0.0, 0.8, 0.1, 0.9]])
    run = v2.common.ranked_run(scores, ["q1", "q2"], ["d1", "d2", "d3", "d4"], depth=4)
    assert list(run["q2"]) == ["d4", "d2", "d3", "d1"]
    metrics = v2.common.run_metrics(run, qrels)
    ndcg_q2 = (1 / math.log2(3) + 1 / math.log2(4)) / (1 + 1 / math.log2(3))
    assert metrics["ndcg_at_10"] == pytest.approx((1 / math.log2(5) + ndcg_q2) / 2, abs=1e-12)
    assert metrics["mrr_at_10"] == pytest.approx((1 / 4 + 1 / 2) / 2)
    assert (metrics["recall_at_100"], metrics["queries"]) == (1.0, 2)


def test_grid_starts_with_no_recipe_and_flags_name_the_recipe_options(v2):
    cfg = {**v2.PRESETS["cpu"], "warmup_grid": "0,0.2", "lr_scale_grid": "1.0,0.1"}
    points = v2.grid(cfg, 50)
    assert points[0] == v2.NO_RECIPE and len(points) == 4  # (0, 1.0) is not repeated
    assert {(p["head_warmup_steps"], p["encoder_lr_scale"]) for p in points} == {(0, 1.0), (0, 0.1), (10, 1.0),
                                                                                  (10, 0.1)}
    assert v2.recipe_flags(v2.NO_RECIPE) == []  # the control passes no recipe flag at all
    recipe = {**v2.NO_RECIPE, "head_warmup_steps": 10, "encoder_lr_scale": 0.1, "contrastive_anchor_weight": 0.5}
    assert v2.recipe_flags(recipe) == ["--head-warmup-steps", "10", "--encoder-lr-scale", "0.1",
                                       "--contrastive-anchor-weight", "0.5"]


def test_recipe_flags_are_options_of_retromae_pretrain(v2, capsys):
    """Every recipe flag the experiment passes is a `retromae pretrain` option that takes a value (its --help)."""
    from retromae.trainers.cli import main

    with pytest.raises(SystemExit) as done:
        main(["pretrain", "--help"])
    assert done.value.code == 0
    usage = capsys.readouterr().out
    recipe = {"head_warmup_steps": 3, "encoder_lr_scale": 0.1, "layer_lr_decay": 0.9, "contrastive_anchor_weight": 0.1}
    flags = v2.recipe_flags(recipe)[::2]
    assert sorted(flags) == sorted(v2.RECIPE_FLAGS.values())  # a non-neutral value passes every flag
    assert [flag for flag in flags if not re.search(rf"{re.escape(flag)} [A-Z_]+\b", usage)] == []


def test_tokens_seen_replays_the_trainers_data_order(v2, tiny_bert, tmp_path):
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


def test_phases_are_reused_while_their_key_holds(v2, tmp_path):
    calls = []
    phases = v2.Phases(tmp_path, "arm")
    assert phases.run("p", "k1", lambda: calls.append(1) or "a") == "a"
    assert v2.Phases(tmp_path, "arm").run("p", "k1", lambda: calls.append(2) or "b") == "a"  # read back from disk
    assert v2.Phases(tmp_path, "arm").run("p", "k2", lambda: calls.append(3) or "c") == "c"  # settings changed
    assert calls == [1, 3]


def test_a_phase_whose_folder_is_gone_runs_again(v2, tmp_path):
    folder = tmp_path / "made"
    folder.mkdir()
    (folder / "done").write_text("ok")
    calls = []
    needs = lambda result: Path(result) / "done"  # noqa: E731
    phases = v2.Phases(tmp_path / "ledger", "arm")
    assert phases.run("p", "k", lambda: calls.append(1) or str(folder), needs=needs) == str(folder)
    assert phases.run("p", "k", lambda: calls.append(2) or str(folder), needs=needs) == str(folder)  # still there
    (folder / "done").unlink()
    phases.run("p", "k", lambda: calls.append(3) or str(folder), needs=needs)
    assert calls == [1, 3]


def test_the_ledger_keeps_scored_seeds_without_their_checkpoints(v2, tmp_path, monkeypatch):
    """A run after the out/ folder was lost: a scored seed needs neither the pre-training nor its fine-tuned model; an
    unscored seed makes the pre-training again in the same place, and the ledger notes its weights' digest, whether
    they are the first run's, and which weights each seed started from."""
    made, tuned = [], []
    weights = {"bytes": b"w1"}

    def make() -> Path:
        folder = tmp_path / "out" / "pretrained-k"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.safetensors").write_bytes(weights["bytes"])
        (folder / v2.PRETRAIN_DONE).write_text("ok\n")
        made.append(folder)
        return folder

    def finetune(start, data, output, cfg, seed, logf):
        tuned.append((start, seed))
        output.mkdir(parents=True, exist_ok=True)
        (output / ".finetune_done").write_text("ok\n")
        return {"in-batch": {"steps": 1}}

    monkeypatch.setattr(v2, "finetune", finetune)
    monkeypatch.setattr(v2.common, "evaluate", lambda model, data, out, cfg, tag: {"ndcg_at_10": 0.5})
    cfg = {"eval_max_seq_length": 8, "ft_lr": 1e-5}
    ledger = tmp_path / "ledger"

    def score(seed: int) -> dict:
        phases = v2.Phases(ledger, "arm")
        start = v2.Artifact(phases, "pretrain", "key", make, v2.PRETRAIN_DONE)
        return v2.finetune_and_evaluate(phases, start, tmp_path, tmp_path / "out" / "arm", "arm", cfg, seed)

    assert score(42)["ndcg_at_10"] == 0.5 and len(made) == 1
    for path in sorted((tmp_path / "out").rglob("*"), reverse=True):  # the out/ folder is lost
        path.rmdir() if path.is_dir() else path.unlink()
    assert score(42) == {"ndcg_at_10": 0.5, "finetune_stages": {"in-batch": {"steps": 1}},
                         "hardware": v2.common.hardware_summary()} and len(made) == 1  # and where it was fine-tuned
    score(43)  # needs the checkpoint: made again, identical
    weights["bytes"] = b"w2"
    (made[-1] / v2.PRETRAIN_DONE).unlink()
    score(44)  # made again, different weights
    assert [seed for _, seed in tuned] == [42, 43, 44] and len(made) == 3
    done = v2.read_json(ledger / "arm.phases.json")
    first, second = (hashlib.sha256(w).hexdigest()[:16] for w in (b"w1", b"w2"))
    assert [(r["identical"], r["digest"]) for r in done["pretrain"]["remade"]] == [(True, first), (False, second)]
    assert {r["hardware"] for r in done["pretrain"]["remade"]} == {v2.common.hardware_summary()}  # which machine
    # which weights each seed was fine-tuned from
    assert [done[f"finetune_arm_s{s}"]["start_weights"] for s in (42, 43, 44)] == [first, first, second]


def test_a_ledger_holds_in_another_checkout(v2, tmp_path, monkeypatch):
    """The ledger names its folders relative to the repository: a copy of the repository elsewhere (another machine,
    a lent GPU) reuses the pre-training it carries instead of making it again, and derives the same fine-tuning key."""
    made = []

    def make() -> Path:
        folder = v2.ROOT / "out" / "pretrained-k"
        folder.mkdir(parents=True)
        (folder / v2.PRETRAIN_DONE).write_text("ok\n")
        made.append(folder)
        return folder

    def ft_key() -> str:
        start = v2.Artifact(v2.Phases(tmp_path / "ledger", "arm"), "pretrain", "key", make, v2.PRETRAIN_DONE)
        start.get()
        return v2.settings_hash([str(start.path)])

    def checkout(folder: Path) -> None:  # the script's and the ledger's (`common`) repository root
        monkeypatch.setattr(v2, "ROOT", folder)
        monkeypatch.setattr(v2.common, "ROOT", folder)

    checkout(tmp_path / "first")
    first = ft_key()
    assert v2.read_json(tmp_path / "ledger" / "arm.phases.json")["pretrain"]["result"] == "out/pretrained-k"
    shutil.copytree(tmp_path / "first", tmp_path / "second")
    checkout(tmp_path / "second")
    assert ft_key() == first and len(made) == 1  # found in the copy, not made again
    assert "remade" not in v2.read_json(tmp_path / "ledger" / "arm.phases.json")["pretrain"]


def test_a_phase_run_inside_another_keeps_its_own_seconds(v2, tmp_path, monkeypatch):
    """A fine-tune that first has to make its pre-training again: the fine-tune's seconds leave the pre-training
    out, so an arm's phases add up to its wall time instead of counting the pre-training twice."""
    work = fake_clock(monkeypatch)  # each reading one second after the last
    phases = v2.Phases(tmp_path, "arm")
    phases.run("finetune", "k", lambda: work(2, "") + phases.run("pretrain", "k", lambda: work(10, "ckpt")))
    # the fine-tune's clock ran from 0 to 15, the pre-training's inside it from 3 to 14
    assert phases.seconds() == {"finetune": 4.0, "pretrain": 11.0}
    phases.run("evaluate", "k", lambda: work(1, "scores"))
    assert phases.seconds()["evaluate"] == 2.0  # the nested seconds do not leak into the next phase


def test_settings_keys_do_not_depend_on_where_the_repo_lies(v2):
    here = [str(v2.ROOT / "out" / "x"), str(v2.common.DATA / "scifact"), str(v2.common.base_model_path())]
    assert v2.settings_hash(here) == v2.settings_hash(["<repo>/out/x", "<data>/scifact", "<base>"])


def test_report_only_shows_the_seeds_an_unfinished_arm_has_scored(v2, tmp_path):
    """An arm without its done marker is reported from its ledger: the seeds both fine-tuned and evaluated, labelled
    as fewer than planned; the unfinished selection lists its scored points and chooses nothing."""
    def scored(variant: str, seed: int, ndcg: float) -> dict:
        metrics = {"ndcg_at_10": ndcg, "mrr_at_10": ndcg - 0.05, "recall_at_100": 0.9}
        return {f"finetune_{variant}_s{seed}": {"key": "k", "seconds": 100.0, "result": {"in-batch": {"steps": 4}}},
                f"evaluate_{variant}_s{seed}": {"key": "k", "seconds": 10.0, "result": metrics}}

    ledger = tmp_path / "ledger"
    ledger.mkdir()
    unevaluated = {"finetune_none_s44": {"key": "k", "seconds": 50.0, "result": {}}}
    v2.write_json(ledger / "none.phases.json", {**scored("none", 42, 0.6), **scored("none", 43, 0.62), **unevaluated})
    v2.write_json(ledger / "dupmae.phases.json", scored("dupmae_hybrid", 42, 0.5))
    cfg = dict(v2.PRESETS["cpu"], seed_list=[42, 43, 44])
    no_recipe, first_recipe = v2.grid(cfg, 100)[:2]
    v2.write_json(ledger / "select.phases.json", scored(v2.point_name(first_recipe), 42, 0.64))

    records = {arm: v2.partial_record(ledger, arm, None) for arm in ("none", "dupmae")}
    assert v2.partial_record(ledger, "bow", None) is None
    none, hybrid = v2.build_rows(records, {}, seeds=3)
    assert none["label"] == "none (base, CLS) (2 of 3 seeds so far)" and set(none["seeds"]) == {"42", "43"}
    assert none["ndcg_at_10"] == pytest.approx(0.61) and none["ndcg_at_10_std"] == pytest.approx(0.02 ** 0.5 / 10)
    assert hybrid["arm"] == "dupmae_hybrid" and hybrid["ndcg_at_10_std"] is None
    selection = v2.partial_selection(ledger, cfg, 100)
    assert selection["chosen"] is None and [p["recipe"] for p in selection["points"]] == [first_recipe]
    assert no_recipe not in [p["recipe"] for p in selection["points"]]
    rows = v2.build_rows(records, {}, 3)
    assert "1 of 4 grid points scored" in v2.markdown(rows, v2.paired(rows), selection, cfg, {
        "command": "c", "hardware": "h", "preset": "cpu", "steps": 100, "passes": 0.5, "sequences": 9, "wall_s": 1.0},
        None)


def test_report_only_prefers_the_ledger_over_a_marker_of_fewer_seeds(v2, tmp_path):
    """A --seeds 43 run writes a done marker holding seed 43 only; the report must still show seeds 42 and 43."""
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    metrics = {"ndcg_at_10": 0.6, "mrr_at_10": 0.55, "recall_at_100": 0.9}
    v2.write_json(ledger / "none.phases.json", {
        f"{phase}_none_s{seed}": {"key": "k", "seconds": 1.0, "result": metrics if phase == "evaluate" else {}}
        for seed in (42, 43) for phase in ("finetune", "evaluate")})
    assert v2.reported_record(ledger, "none", None)["partial"]  # no marker: the ledger
    one_seed = {"arm": "none", "variants": {"none": {"43": metrics}}}
    v2.write_json(ledger / "none.done.json", one_seed)
    assert set(v2.reported_record(ledger, "none", None)["variants"]["none"]) == {"42", "43"}
    both = {**one_seed, "variants": {"none": {"42": metrics, "43": metrics}}}
    v2.write_json(ledger / "none.done.json", both)
    assert v2.reported_record(ledger, "none", None) == both  # a marker as complete as the ledger is kept


def test_a_reused_pretraining_counts_with_its_training_time_in_both_reports(v2, tmp_path):
    """run_arm's marker and the ledger-built record give an arm the same seconds: a pre-training found in another
    folder (1.8 s to find) counts with the 800 s it trained."""
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    record = {"steps": 324, "train_seconds": 800.0}
    v2.write_json(ledger / "retromae.phases.json", {
        "pretrain": {"key": "k", "seconds": 1.8, "result": "<out>"},
        "pretraining_record": {"key": "k", "seconds": 0.0, "result": record},
        "finetune_retromae_s42": {"key": "k", "seconds": 100.0, "result": {}},
        "evaluate_retromae_s42": {"key": "k", "seconds": 10.0, "result": {"ndcg_at_10": 0.6}}})
    assert v2.partial_record(ledger, "retromae", None)["wall_s"] == pytest.approx(910.0)
    assert v2.arm_wall_s({"pretrain": 900.0, "finetune": 100.0}, {"train_seconds": 800.0}) == pytest.approx(1000.0)


@pytest.mark.experiment
def test_tiny_selection_end_to_end(v2, shared_data, tmp_path):
    """--tiny --phase select: pre-train (3 steps), fine-tune on the train share (in-batch, then mined negatives),
    score on the held-out share; then --report-only writes the table. Proves the plumbing, not the quality."""
    out = tmp_path / "v2"
    common = ["--tiny", "--seeds", "42", "--no-references", "--output-dir", str(out)]
    assert v2.main([*common, "--phase", "select", "--warmup-grid", "0", "--lr-scale-grid", "1.0"]) == 0
    selection = json.loads((out / "scifact_experiment_v2_ledger" / "select.done.json").read_text(encoding="utf-8"))
    (point,) = selection["points"]
    assert selection["chosen"] == v2.NO_RECIPE and selection["split"]["validation_queries"] == 10  # 20% of 48
    assert 0 <= point["validation"]["ndcg_at_10"] <= 1 and point["pretraining"]["tokens_real"] > 0
    assert "Dev was not read" in selection["how"]
    assert v2.main([*common, "--report-only", "--warmup-grid", "0", "--lr-scale-grid", "1.0"]) == 0
    report = (out / "scifact_experiment_v2.md").read_text(encoding="utf-8")
    assert "prove nothing" in report and "held-out train queries" in report


def test_pretraining_resumes_and_is_shared_across_arms(v2, tmp_path, monkeypatch):
    """An interrupted pre-training continues from its newest complete checkpoint (the same flags plus
    --resume-from-checkpoint last); one killed before its first checkpoint starts again in its own folder; a finished
    one with the same settings is reused by any arm (e.g. the selection's chosen point by the `retromae` arm)."""
    calls = []
    monkeypatch.setattr(v2.common, "retromae_cli", lambda command, args, log_file: calls.append(args))
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


def test_shipped_head_export_puts_the_pretrained_encoder_under_mean_pooling_and_cosine(v2, stage1_checkpoint,
                                                                                        tmp_path):
    """The `retromae_meanpool` variant starts from the pre-trained encoder with the base's own head: the CLS export's
    token states, averaged over the real tokens and normalized, scored by cosine."""
    import torch
    from retromae.trainers.export.sentence_transformer import load_as_sentence_transformer
    from sentence_transformers import SentenceTransformer

    target = v2.shipped_head_export(stage1_checkpoint, tmp_path / "export-meanpool")
    mean_model = SentenceTransformer(str(target), device="cpu")
    cls_model, _ = load_as_sentence_transformer(stage1_checkpoint, work_dir=tmp_path / "cls", device="cpu")
    assert mean_model.similarity_fn_name == "cosine" and cls_model.similarity_fn_name == "dot"
    texts = ["a short one", "a somewhat longer text about proteins and cells"]
    tokens = cls_model.tokenize(texts)
    with torch.no_grad():
        states = cls_model[0](dict(tokens))["token_embeddings"]
    mask = tokens["attention_mask"].unsqueeze(-1).float()
    expected = torch.nn.functional.normalize((states * mask).sum(1) / mask.sum(1), dim=-1)
    got = mean_model.encode(texts, convert_to_tensor=True)
    assert torch.allclose(got, expected, atol=1e-5)
    assert not torch.allclose(got, torch.nn.functional.normalize(states[:, 0], dim=-1), atol=1e-3)


def test_the_selection_is_reused_whatever_seeds_the_arms_run(v2, tmp_path):
    cfg = dict(v2.PRESETS["cpu"], seed_list=[42, 43, 44], device="cpu")
    key = v2.selection_settings_key(tmp_path, 324, cfg)
    assert v2.selection_settings_key(tmp_path, 324, {**cfg, "seeds": "42", "seed_list": [42]}) == key
    assert v2.selection_settings_key(tmp_path, 324, {**cfg, "holdout": 0.3}) != key
    assert v2.selection_settings_key(tmp_path, 162, cfg) != key


def test_the_determinism_benchmark_tells_equal_bits_from_a_small_difference(tmp_path):
    """benchmarks/pretrain_determinism.py: a run is compared with the reference by its digest and by the largest
    parameter difference, which must see a change in the last bit of one weight."""
    import torch
    from safetensors.torch import save_file

    script = benchmark_script("pretrain_determinism")
    weights = {"a": torch.randn(4, 3), "b": torch.zeros(2)}
    nudged = {**weights, "b": torch.tensor([0.0, torch.finfo(torch.float32).tiny])}
    for name, tensors in (("reference", weights), ("same", weights), ("nudged", nudged)):
        (tmp_path / name).mkdir()
        save_file(tensors, tmp_path / name / "model.safetensors")
    runs = {name: {"env": {}, **script.compare(tmp_path / name, tmp_path / "reference")}
            for name in ("reference", "same", "nudged")}
    assert runs["same"] == runs["reference"] and runs["same"]["max_abs_difference"] == 0
    assert runs["nudged"]["digest"] != runs["reference"]["digest"] and runs["nudged"]["max_abs_difference"] > 0
    table = script.render({"runs": runs, "steps": 1, "environment": {"hardware": "here"}})
    assert [line.split(" | ")[3] for line in table.splitlines()[2:5]] == ["yes", "yes", "no"]



def test_paired_differences_use_only_the_seeds_both_sides_have(v2):
    """The paired table subtracts seed by seed; a seed that one side lacks is left out, not averaged in."""
    def row(arm, **ndcg):
        return {"arm": arm, "label": v2.LABELS[arm], "seeds": {s[1:]: {"ndcg_at_10": v} for s, v in ndcg.items()}}

    rows = [row("none", s42=0.60, s43=0.62, s44=0.61), row("bow", s42=0.61, s43=0.60),
            row("retromae", s42=0.64, s43=0.64, s44=0.64), row("retromae_control", s44=0.50), row("bm25")]
    got = {(p["arm"], p["reference"]): p for p in v2.paired(rows)}
    assert set(got) == {("bow", "none"), ("retromae", "none"), ("retromae_control", "none"),
                        ("retromae", "retromae_control")}
    bow = got[("bow", "none")]
    assert bow["ndcg_at_10_diff"] == pytest.approx({"42": 0.01, "43": -0.02})
    assert bow["mean"] == pytest.approx(-0.005) and bow["std"] == pytest.approx(0.0212132, abs=1e-6)
    assert got[("retromae", "retromae_control")]["ndcg_at_10_diff"] == pytest.approx({"44": 0.14})
    assert got[("retromae", "retromae_control")]["std"] is None
    table = "\n".join(v2.paired_lines(v2.paired(rows), [42, 43, 44]))
    assert "| BoW + recipe − none (base, CLS) | +0.0100 | -0.0200 | - | -0.0050 ± 0.0212 |" in table


def test_rows_name_their_hardware_and_gpu_seeds_stay_out_of_the_cpu_time_estimate(v2):
    """A variant fine-tuned on a lent GPU: its rows say so, and its timings are left out of the CPU extrapolation."""
    gpu, cpu = "x86_64, 16 CPU cores, CUDA NVIDIA H200", "x86_64 (AVX512), 2 CPU cores, no GPU"

    def seed(seconds: float, hardware: str) -> dict:
        stages = {"in-batch": {"steps": 10, "seconds": seconds},
                  "hard-negatives": {"steps": 10, "seconds": 2 * seconds}}
        return {"ndcg_at_10": 0.5, "mrr_at_10": 0.4, "recall_at_100": 0.9, "finetune_stages": stages,
                "hardware": hardware}

    record = {"pretraining": {"seconds_per_step": 2.0}, "wall_s": 1.0,
              "phases": {"finetune_none_s42": 100.0, "evaluate_none_s42": 10.0,
                         "finetune_none_h200_s42": 4.0, "evaluate_none_h200_s42": 1.0},
              "variants": {"none": {"42": seed(20.0, cpu)}, "none_h200": {"42": seed(1.0, gpu)}}}
    estimate = v2.extrapolate({"none": record}, dict(v2.PRESETS["cpu"]), 100, 100, 160)
    assert estimate["finetune_seconds_per_step"] == {"in-batch": 2.0, "hard-negatives": 4.0}
    assert estimate["evaluation_seconds"] == 10.0 and estimate["finetune_rest_seconds"] == 40.0
    rows = v2.build_rows({"none": record}, {}, 1)
    assert [r["hardware"] for r in rows] == [[cpu], [gpu]]
    assert [r["label"] for r in rows] == ["none (base, CLS)", "none (base, CLS) [NVIDIA H200]"]
    assert v2.hardware_lines(rows)[1].startswith(f"Fine-tuned and scored on: none (base, CLS): {cpu}; "
                                                 f"none (base, CLS) [NVIDIA H200]: {gpu}.")
    pairs = v2.paired(rows)
    assert [(p["arm"], p["reference"]) for p in pairs] == [("none_h200", "none")]
    # a pre-trained variant is paired with the base fine-tuned on its own machine
    gpu_dupmae = {**rows[1], "arm": "dupmae_cls", "hardware": [gpu]}
    cpu_bow = {**rows[0], "arm": "bow"}
    pairs = {p["arm"]: p["reference"] for p in v2.paired([*rows, gpu_dupmae, cpu_bow])}
    assert pairs == {"dupmae_cls": "none_h200", "bow": "none", "none_h200": "none"}
