"""`retromae finetune`: training data readers and their bad input, model loading, the distillation loss, mining, the
three stages end to end (CLS and DupMAE hybrid), and the output folder with its card."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from pathlib import Path

import pytest
import torch
from retromae.modeling.configuration_dupmae import DupMAEConfig
from retromae.modeling.modeling_dupmae import DupMAEForPretraining
from retromae.trainers.commands.finetune import finetune_command
from retromae.trainers.data.training_groups import (
    TrainingGroup,
    clean_groups,
    groups_to_dataset,
    groups_to_distillation_dataset,
    load_training_groups,
    read_training_jsonl,
)
from retromae.trainers.export.sentence_transformer import (
    build_dupmae_sentence_transformer,
    load_as_sentence_transformer,
)
from retromae.trainers.inputs.checkpoints import CheckpointError
from retromae.trainers.retrieval import mining as mining_module
from retromae.trainers.retrieval.beir import RetrievalDataError
from retromae.trainers.retrieval.mining import mine_negatives
from retromae.trainers.training import finetuning as finetune_module
from retromae.trainers.training.finetune_losses import DistillationLoss, contrastive_loss
from retromae.trainers.training.finetuning import StageTrainer, finetune
from sentence_transformers import SentenceTransformer

from ..builders import SENTENCES, tiny_bert_kwargs, write_beir, write_jsonl

FAST = ["--max-steps", "2", "--per-device-train-batch-size", "4", "--max-seq-length", "32", "--disable-tqdm", "true",
        "--logging-steps", "1"]


@pytest.fixture(scope="module")
def pretraining_checkpoint(spread_cls_bert, tmp_path_factory, tokenizer):
    """A `retromae pretrain`-style checkpoint (RetroMAEForPretraining, decoder included)."""
    from retromae.modeling.modeling_retromae import RetroMAEForPretraining

    folder = tmp_path_factory.mktemp("ckpt") / "retromae-tiny"
    RetroMAEForPretraining.from_encoder_checkpoint(str(spread_cls_bert)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_beir(tmp_path_factory):
    return write_beir(tmp_path_factory.mktemp("data") / "toy")


# ---- training data -------------------------------------------------------------------------------------------------


def test_negatives_equal_to_a_positive_are_dropped_with_a_count(tmp_path, caplog):
    path = write_jsonl(tmp_path / "train.jsonl", [
        {"query": "q one", "positive": "doc a", "negatives": ["doc a", "doc b", " doc a "]},
        {"query": "q one", "positive": "doc c", "negatives": ["doc c", "doc d"]},  # doc c is also q one's positive
        {"query": "q two", "positive": ["doc e", "doc f"], "negatives": ["doc f", "doc a"]},
    ])
    with caplog.at_level(logging.WARNING):
        groups, report = clean_groups(read_training_jsonl(path))
    # q one: "doc a" (twice, once with spaces) and "doc c" are its positives -> 3 dropped; q two: "doc f" -> 1
    assert report["negatives_equal_to_a_positive"] == 4
    assert [[t for _, t in g.negatives] for g in groups] == [["doc b"], ["doc d"], ["doc a"]]
    assert "dropped 4 negatives equal to a positive" in caplog.text


def test_queries_without_positives_are_counted_and_none_left_is_an_error(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", [
        {"query": "q one", "positive": "doc a"},
        {"query": "q two", "positive": ""},
        {"query": "q three", "positive": []},
    ])
    groups, report = clean_groups(read_training_jsonl(path))
    assert len(groups) == 1 and report["queries_without_positives"] == 2
    empty = write_jsonl(tmp_path / "empty.jsonl", [{"query": "q", "positive": ""}])
    with pytest.raises(RetrievalDataError, match="all 1 queries are blank or lack a positive"):
        clean_groups(read_training_jsonl(empty))


def test_jsonl_errors_name_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"query": "q", "positive": "p"}\n{"positive": "p"}\n', encoding="utf-8")
    with pytest.raises(RetrievalDataError, match=r"bad\.jsonl:2: needs a string field 'query'"):
        read_training_jsonl(path)
    path.write_text('{"query": "q", "positive": "p"}\nnot json\n', encoding="utf-8")
    with pytest.raises(RetrievalDataError, match=r"\.jsonl:2: not valid JSON"):
        read_training_jsonl(path)
    # HEAD dropped such negatives silently and mined others instead
    path.write_text('{"query": "q", "positive": "p", "negative_1": "n", "negative_2": 5}\n', encoding="utf-8")
    with pytest.raises(RetrievalDataError, match=r"bad\.jsonl:1: field 'negative_2' must be a string, got 5"):
        read_training_jsonl(path)
    path.write_text('{"query": "q", "positive": "p", "negative_1": "n", "negative_2": null, "negative_ids": ["d"]}\n',
                    encoding="utf-8")
    assert read_training_jsonl(path)[0].negatives == [("d", "n")]


def test_beir_training_data_with_unknown_qrels(tmp_path):
    folder = write_beir(tmp_path / "toy", extra_qrels=["q3\tmissing-doc\t1"])
    with pytest.raises(RetrievalDataError, match=r"1 document id\(s\) missing from corpus.jsonl \(1 lines"):
        load_training_groups(folder, split="train")
    groups, data = load_training_groups(folder, split="train", on_missing="skip")
    assert len(groups) == 12 and data.report["qrels_lines_with_unknown_document"] == 1
    (folder / "corpus.jsonl").unlink()
    with pytest.raises(RetrievalDataError, match="training data folder toy is neither a BEIR folder"):
        load_training_groups(folder)


def test_datasets_folder_with_anchor_positive_negative_columns(tmp_path):
    from datasets import Dataset

    Dataset.from_dict({"anchor": ["q a", "q b"], "positive": ["doc a", "doc b"], "negative": ["doc x", "doc b"]}
                      ).save_to_disk(str(tmp_path / "pairs"))
    groups, beir = load_training_groups(tmp_path / "pairs")
    assert beir is None and [g.query for g in groups] == ["q a", "q b"]
    groups, report = clean_groups(groups)
    assert [[t for _, t in g.negatives] for g in groups] == [["doc x"], []]
    assert report["negatives_equal_to_a_positive"] == 1
    with pytest.raises(RetrievalDataError, match="does not exist"):
        load_training_groups(tmp_path / "missing.jsonl")


def test_a_name_that_is_neither_here_nor_on_the_hub_says_both(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'my-pairs' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(RetrievalDataError, match=r"training data 'my-pairs' is no file or folder here, and loading it "
                                                 r"as a Hub dataset \(split 'train'\) failed: Couldn't reach"):
        load_training_groups("my-pairs", split="train")


def test_dataset_rows_have_fixed_negative_columns():
    groups = [
        TrainingGroup("q1", "query 1", [("a", "doc a"), ("b", "doc b")], [(f"n{i}", f"neg {i}") for i in range(5)]),
        TrainingGroup("q2", "query 2", [("c", "doc c")], [("n9", "neg 9")]),  # too few negatives for k=2
    ]
    dataset, report = groups_to_dataset(groups, num_negatives=2, seed=0)
    assert dataset.column_names == ["query", "positive", "negative_1", "negative_2"]
    assert dataset["positive"] == ["doc a", "doc b"] and report == {"examples_with_too_few_negatives": 1}
    pairs, _ = groups_to_dataset(groups, num_negatives=0)
    assert pairs.column_names == ["query", "positive"] and len(pairs) == 3


def test_distillation_rows_need_teacher_scores():
    groups = [TrainingGroup("q1", "query 1", [("a", "doc a")], [("n1", "neg 1")]),
              TrainingGroup("q2", "query 2", [("c", "doc c")], [("n2", "neg 2")])]
    scores = {"q1": {"a": 3.0, "n1": 1.0}, "q2": {"c": 2.0}}
    with pytest.raises(RetrievalDataError, match=r"1 training examples have .* without a teacher score.*\('q2', 'n2'\)"):
        groups_to_distillation_dataset(groups, scores, num_negatives=1)
    dataset, report = groups_to_distillation_dataset(groups, scores, num_negatives=1, on_missing="skip")
    assert dataset["label"] == [[3.0, 1.0]] and report == {"examples_without_teacher_scores": 1}


# ---- model loading -------------------------------------------------------------------------------------------------


def test_folder_without_modules_json_loads_as_cls_with_a_warning(spread_cls_bert, tokenizer, caplog):
    from transformers import BertModel

    with caplog.at_level(logging.WARNING, logger="retromae"):
        model, info = load_as_sentence_transformer(spread_cls_bert)
    assert "no modules.json" in caplog.text and "assuming CLS pooling and the dot product" in caplog.text
    assert "MEAN pooling" in caplog.text and "wrong (lower) BEIR numbers" in caplog.text
    assert info["kind"] == "transformers" and model.similarity_fn_name == "dot"
    bert = BertModel.from_pretrained(spread_cls_bert, add_pooling_layer=False).eval()
    batch = tokenizer(["dense retrieval"], return_tensors="pt")
    with torch.no_grad():
        cls = bert(**batch).last_hidden_state[:, 0]
    assert torch.allclose(model.encode_document(["dense retrieval"], convert_to_tensor=True), cls, atol=1e-5)
    mean_model, _ = load_as_sentence_transformer(spread_cls_bert, pooling="mean")
    assert mean_model.similarity_fn_name == "cosine"
    # the modules `retromae export --pooling mean` writes (HEAD had no Normalize): unit vectors, saved as such
    assert [type(m).__name__ for m in mean_model] == ["Transformer", "Pooling", "Normalize"]
    norms = mean_model.encode_document(["dense retrieval", "a sparse index"], convert_to_tensor=True).norm(dim=-1)
    assert torch.allclose(norms, torch.ones(2), atol=1e-5)


def test_pooling_flag_is_refused_for_sentence_transformers_folders(minilm_dir):
    with pytest.raises(CheckpointError, match="keeps its own pooling"):
        load_as_sentence_transformer(minilm_dir, pooling="cls")


def test_contrastive_loss_follows_the_model_similarity(spread_cls_bert, minilm_dir):
    from sentence_transformers.util import cos_sim, dot_score

    dot_model, _ = load_as_sentence_transformer(spread_cls_bert)
    loss = contrastive_loss(dot_model, None, gather_across_devices=True)
    assert loss.similarity_fct is dot_score and loss.scale == 1.0 and loss.gather_across_devices
    cosine_model = SentenceTransformer(str(minilm_dir), device="cpu")
    loss = contrastive_loss(cosine_model, None, gather_across_devices=False)
    assert loss.similarity_fct is cos_sim and loss.scale == 20.0 and not loss.gather_across_devices


# ---- the distillation loss -----------------------------------------------------------------------------------------


def test_distillation_loss_is_kl_batchmean(spread_cls_bert):
    model, _ = load_as_sentence_transformer(spread_cls_bert)
    loss = DistillationLoss(model, distill_loss_weight=2.0)
    query = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    positive = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    negative = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    teacher = torch.tensor([[1.0, 2.0], [2.0, 0.0]])
    parts = loss.compute_loss_from_embeddings([query, positive, negative], teacher)
    # student dot scores: row 0 [2, 0], row 1 [1, 1] (uniform); the teacher prefers the negative in row 0
    p_t = torch.softmax(teacher, dim=1)
    log_p_s = torch.log_softmax(torch.tensor([[2.0, 0.0], [1.0, 1.0]]), dim=1)
    kl_batchmean = (p_t * (p_t.log() - log_p_s)).sum() / 2  # summed over the group, divided by the batch size 2
    assert set(parts) == {"distill_loss"} and kl_batchmean.item() > 0.1
    assert parts["distill_loss"].item() == pytest.approx(2.0 * kl_batchmean.item(), rel=1e-5)
    with_contrastive = DistillationLoss(model, contrastive_loss_weight=0.5).compute_loss_from_embeddings(
        [query, positive, negative], teacher
    )
    assert set(with_contrastive) == {"distill_loss", "contrastive_loss"}
    with pytest.raises(ValueError, match="distill_loss_weight"):
        DistillationLoss(model, distill_loss_weight=0.0)


# ---- the command ---------------------------------------------------------------------------------------------------


def test_finetune_from_a_pretraining_checkpoint_mines_and_writes_a_model(pretraining_checkpoint, tiny_beir, tmp_path):
    out = tmp_path / "finetuned"
    code = finetune_command([
        str(pretraining_checkpoint), str(tiny_beir), "--output-dir", str(out), "--num-negatives", "2",
        "--mine-range-min", "1", "--mine-range-max", "8", "--model-name", "my-org/retromae-toy", *FAST,
    ])
    assert code == 0
    model = SentenceTransformer(str(out))
    assert model.similarity_fn_name == "dot" and model.get_embedding_dimension() == 32
    info = json.loads((out / "retromae_finetune.json").read_text())
    assert [s["stage"] for s in info["stages"]] == ["in-batch", "hard-negatives"]
    assert info["starting_point"] == "retromae-checkpoint" and info["pretraining_method"] == "retromae"
    assert info["stages"][1]["negatives"].startswith("mined with the previous-stage model (ranks 1-8")

    with open(out.parent / "finetuned.work" / "hard_negatives.jsonl") as f:
        mined = [json.loads(line) for line in f]
    assert len(mined) == 12
    for record in mined:
        assert len(record["negative_ids"]) == 2 and not set(record["negative_ids"]) & set(record["positive_ids"])

    card = (out / "README.md").read_text()
    assert str(tmp_path) not in card and "/tmp" not in card
    assert "base_model" not in card.split("---")[1]  # a local starting point is not a Hub id
    assert "RetroMAE (`retromae`" in card and "| `hard-negatives` |" in card and "Not evaluated yet" in card
    assert "my-org/retromae-toy" in card


def test_python_api_takes_the_settings_by_name(spread_cls_bert, tiny_beir, tmp_path):
    result = finetune(spread_cls_bert, tiny_beir, tmp_path / "api", stages=["in-batch"], max_steps=2,
                      per_device_train_batch_size=4, max_seq_length=32, disable_tqdm=True, model_name="my-org/api")
    assert result.output_dir == tmp_path / "api" and (result.output_dir / "modules.json").is_file()
    assert [s["stage"] for s in result.info["stages"]] == ["in-batch"] and result.info["stages"][0]["steps"] == 2
    assert result.info["model_name"] == "my-org/api" and result.info["hyperparameters"]["max_seq_length"] == 32
    with pytest.raises(ValueError, match=r"unknown fine-tuning option\(s\) max_step;"):
        finetune(spread_cls_bert, tiny_beir, tmp_path / "typo", max_step=2)


def test_negatives_file_reuse_and_distillation(spread_cls_bert, tiny_beir, tmp_path):
    negatives = write_jsonl(tmp_path / "negatives.jsonl", [
        {"query_id": f"q{q}", "query": "ignored", "positive_ids": [f"d{q}"], "positive": "x",
         "negative_ids": [f"d{q + 1}", f"d{q + 2}"], "negatives": ["n1", "n2"]} for q in range(12)
    ])
    scores = tmp_path / "teacher.tsv"
    scores.write_text("".join(f"q{q}\td{q + k}\t{5.0 - k}\n" for q in range(12) for k in range(3)), encoding="utf-8")
    out = tmp_path / "distilled"
    assert finetune_command([
        str(spread_cls_bert), str(tiny_beir), "--output-dir", str(out), "--stages", "hard-negatives,distill",
        "--num-negatives", "2", "--negatives-file", str(negatives), "--teacher-scores", str(scores),
        "--contrastive-loss-weight", "0.1", *FAST,
    ]) == 0
    info = json.loads((out / "retromae_finetune.json").read_text())
    distill = info["stages"][1]
    assert distill["stage"] == "distill" and distill["examples"] == 12
    assert distill["loss"] == "KL(batchmean) to cross-encoder scores x 1 + in-batch contrastive x 0.1"
    assert info["stages"][0]["negatives"] == "file negatives.jsonl"
    assert info["hyperparameters"]["contrastive_loss_weight"] == 0.1

    partial = tmp_path / "partial.tsv"
    partial.write_text("q0\td0\t1.0\n", encoding="utf-8")
    with pytest.raises(ValueError, match="without a teacher score"):
        finetune_command([
            str(spread_cls_bert), str(tiny_beir), "--output-dir", str(tmp_path / "x"), "--stages", "distill",
            "--num-negatives", "2", "--negatives-file", str(negatives), "--teacher-scores", str(partial), *FAST,
        ])


def test_negatives_read_before_training_are_built_and_reported_once(spread_cls_bert, tiny_beir, tmp_path, caplog):
    """HEAD read a negatives file and built its datasets twice (before training, to check them, and at the stage),
    so each warning about them was logged twice; and it refused a blank negative with its id ("'negative_ids' has 2
    ids for 1 texts"): the reader dropped blank texts before pairing them with their ids."""
    records = [{"query_id": f"q{q}", "query": "ignored", "positive_ids": [f"d{q}"], "positive": "x",
                "negative_ids": [f"d{q + 1}", f"d{q + 2}"], "negatives": ["n1", "n2"]} for q in range(12)]
    records[0].update(negative_ids=["d1"], negatives=["n1"])  # too few for --num-negatives 2: skipped, with a warning
    records[1]["negatives"] = ["n1", "  "]  # a blank negative: dropped, with a count
    negatives = write_jsonl(tmp_path / "negatives.jsonl", records)
    scores = tmp_path / "teacher.tsv"
    scores.write_text("".join(f"q{q}\td{q + k}\t{5.0 - k}\n" for q in range(3, 12) for k in range(3)),
                      encoding="utf-8")  # q2 has none: skipped with --on-missing skip
    with caplog.at_level(logging.WARNING):
        assert finetune_command([
            str(spread_cls_bert), str(tiny_beir), "--output-dir", str(tmp_path / "out"), "--stages",
            "hard-negatives,distill", "--num-negatives", "2", "--negatives-file", str(negatives), "--teacher-scores",
            str(scores), "--on-missing", "skip", *FAST,
        ]) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for expected in ("fewer than 2 negatives", "dropped 1 blank", "without a teacher score"):
        assert sum(expected in w for w in warnings) == 1, (expected, warnings)
    info = json.loads((tmp_path / "out" / "retromae_finetune.json").read_text())
    assert [s["examples"] for s in info["stages"]] == [10, 9]
    assert sum(info["train_data"]["dropped"].values()) == 1


class _FixedVectors:
    """A stand-in for a SentenceTransformer: one fixed vector per text."""

    def __init__(self, vectors: dict[str, list[float]], similarity_fn_name: str):
        self.vectors, self.similarity_fn_name = vectors, similarity_fn_name

    def encode_document(self, texts, normalize_embeddings=False, **kwargs):
        vectors = torch.tensor([self.vectors[t] for t in texts])
        return torch.nn.functional.normalize(vectors, dim=-1) if normalize_embeddings else vectors

    encode_query = encode_document


def test_mining_ranks_by_the_models_own_similarity():
    # query . long = 3 but cosine 0.71; query . near = 1 but cosine 0.995; far: 0.5 and 0.64
    vectors = {"q": [1.0, 0.0], "pos": [1.0, 0.0], "long": [3.0, 3.0], "near": [1.0, 0.1], "far": [0.5, -0.6]}
    corpus = {"d0": "pos", "d1": "long", "d2": "near", "d3": "far", "d4": "long"}  # d4: a duplicate text
    group = TrainingGroup("q0", "q", [("d0", "pos")])
    top = dict(num_negatives=2, range_min=0, range_max=3, sampling="top")
    by_dot = mine_negatives(_FixedVectors(vectors, "dot"), [group], corpus, **top)
    assert by_dot.groups[0].negatives == [("d1", "long"), ("d2", "near")]
    by_cosine = mine_negatives(_FixedVectors(vectors, "cosine"), [group], corpus, **top)
    assert by_cosine.groups[0].negatives == [("d2", "near"), ("d1", "long")]
    skip_first = mine_negatives(_FixedVectors(vectors, "dot"), [group], corpus, **{**top, "range_min": 1})
    assert skip_first.groups[0].negatives == [("d2", "near"), ("d3", "far")]
    drawn = [mine_negatives(_FixedVectors(vectors, "dot"), [group], corpus, num_negatives=2, range_min=0,
                            range_max=3, seed=seed).groups[0].negatives for seed in range(20)]
    assert all(d == sorted(d, key=["long", "near", "far"].index) for d in ([t for _, t in n] for n in drawn))
    assert len({tuple(d) for d in drawn}) == 3  # every pair of the three candidates, each in rank order
    too_few = mine_negatives(_FixedVectors(vectors, "dot"), [group], corpus,
                             **{**top, "range_min": 2, "range_max": 4})
    assert too_few.groups[0].negatives == []


def test_mining_scores_the_corpus_chunk_by_chunk_alike(monkeypatch):
    torch.manual_seed(0)
    texts = [f"t{i}" for i in range(23)]
    vectors = {t: torch.randn(4).tolist() for t in texts}
    groups = [TrainingGroup(f"q{i}", texts[i], [(f"d{i + 1}", texts[i + 1])]) for i in range(5)]
    corpus = {f"d{i}": t for i, t in enumerate(texts)}
    whole = mine_negatives(_FixedVectors(vectors, "dot"), groups, corpus, num_negatives=4, range_min=2, range_max=9)
    monkeypatch.setattr(mining_module, "MINING_CHUNK_BYTES", 4 * 4 * 3)  # 3 documents a chunk, 4 queries a block
    chunked = mine_negatives(_FixedVectors(vectors, "dot"), groups, corpus, num_negatives=4, range_min=2, range_max=9)
    assert chunked.groups == whole.groups and all(len(g.negatives) == 4 for g in whole.groups)


def test_mining_reports_the_ranks_it_used_when_the_pool_is_smaller(caplog):
    vectors = {"q": [1.0, 0.0], "pos": [1.0, 0.0], "a": [0.9, 0.1], "b": [0.5, 0.5], "c": [0.1, 0.9]}
    corpus = {"d0": "pos", "d1": "a", "d2": "b", "d3": "c", "d4": "a"}  # 4 distinct texts
    group = TrainingGroup("q0", "q", [("d0", "pos")])
    with caplog.at_level(logging.INFO, logger=mining_module.__name__):
        mined = mining_module.mine_negatives(_FixedVectors(vectors, "dot"), [group], corpus,
                                                       num_negatives=2, range_min=0, range_max=100, sampling="top")
    assert (mined.range_min, mined.range_max, mined.ranks) == (0, 4, "ranks 0-4, top")
    assert mined.groups[0].negatives == [("d1", "a"), ("d2", "b")]
    assert "(ranks 0-4, top)" in caplog.text


def test_the_record_and_card_give_the_mining_ranks_used(spread_cls_bert, tiny_beir, tmp_path):
    """A corpus of 30 documents lowers --mine-range-max 100 to 30; HEAD recorded "ranks 1-100"."""
    out = tmp_path / "out"
    assert finetune_command([str(spread_cls_bert), str(tiny_beir), "--output-dir", str(out), "--stages",
                             "hard-negatives", "--num-negatives", "2", "--mine-range-min", "1", *FAST]) == 0
    info = json.loads((out / "retromae_finetune.json").read_text())
    assert info["stages"][0]["negatives"] == "mined with the starting model (ranks 1-30, random)"
    assert "(ranks 1-30, random)" in (out / "README.md").read_text()


@pytest.mark.parametrize("flags, named", [
    (["--fsdp", "full_shard auto_wrap"], "--fsdp"),
    (["--deepspeed", '{"zero_optimization": {"stage": 2}}'], "--deepspeed"),
])
def test_sharding_flags_are_refused_before_training(spread_cls_bert, tiny_beir, tmp_path, monkeypatch, flags, named):
    """sentence-transformers' TrainingArguments accept --fsdp and --deepspeed; HEAD passed them on untested (on the
    CPU --fsdp trained plain DDP or stopped in a traceback). Refused in one line naming DDP under torchrun."""
    from retromae.trainers.inputs.errors import UserError

    if named == "--deepspeed" and importlib.util.find_spec("deepspeed") is None:
        pytest.skip("transformers refuses --deepspeed itself without the deepspeed package")
    monkeypatch.setattr(finetune_module, "StageTrainer", None)  # nothing may train
    with pytest.raises(UserError) as refused:
        finetune_command([str(spread_cls_bert), str(tiny_beir), "--output-dir", str(tmp_path / "out"), *FAST, *flags])
    message = str(refused.value)
    assert named in message and "torchrun" in message and "DDP" in message and "\n" not in message, message
    assert not (tmp_path / "out").exists()



@pytest.mark.parametrize("option, named", [
    ({"fsdp": "full_shard auto_wrap"}, "--fsdp"), ({"neftune_noise_alpha": 5.0}, "--neftune-noise-alpha"),
    ({"eval_strategy": "steps"}, "--eval-strategy steps"),
])
def test_the_python_api_refuses_the_trainer_options_the_command_line_refuses(spread_cls_bert, tiny_beir, tmp_path,
                                                                             monkeypatch, option, named):
    """HEAD checked them on the command line only: `finetune(..., neftune_noise_alpha=5)` stopped in a traceback."""
    monkeypatch.setattr(finetune_module, "StageTrainer", None)  # nothing may train
    with pytest.raises(ValueError, match=named):
        finetune(spread_cls_bert, tiny_beir, tmp_path / "out", max_steps=2, **option)
    assert not (tmp_path / "out").exists()

def test_refuses_to_overwrite_and_validates_stages(spread_cls_bert, tiny_beir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    # HEAD deleted a folder of the user's own files with --overwrite
    for overwrite in ([], ["--overwrite"]):
        with pytest.raises(ValueError, match=r"--output-dir .*out holds no model \(no modules.json or config.json\), "
                                            r"which --overwrite does not replace; choose a new or empty folder"):
            finetune_command([str(spread_cls_bert), str(tiny_beir), "--output-dir", str(out), *FAST, *overwrite])
    assert (out / "keep.txt").is_file() and not (tmp_path / "out.work").exists()
    with pytest.raises(ValueError, match="needs cross-encoder scores"):
        finetune_command([str(spread_cls_bert), str(tiny_beir), "--output-dir", str(tmp_path / "a"),
                          "--stages", "in-batch,distill"])
    with pytest.raises(ValueError, match="in the order"):
        finetune_command([str(spread_cls_bert), str(tiny_beir), "--output-dir", str(tmp_path / "a"),
                          "--stages", "hard-negatives,in-batch"])



def test_resuming_a_finished_finetune_says_so_and_trains_nothing(spread_cls_bert, tiny_beir, tmp_path, monkeypatch,
                                                                  capsys):
    """HEAD told the same command plus `--resume-from-checkpoint last` to pass --overwrite, which trains again;
    `pretrain` says its run finished. Other settings are named (HEAD: "pass --overwrite", which discards the model)."""
    out = tmp_path / "out"
    args = [str(spread_cls_bert), str(tiny_beir), "--output-dir", str(out), "--stages", "in-batch", *FAST]
    assert finetune_command(args) == 0
    written = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    capsys.readouterr()
    monkeypatch.setattr(finetune_module, "StageTrainer", None)  # nothing may train
    assert finetune_command([*args, "--resume-from-checkpoint", "last"]) == 0
    assert capsys.readouterr().out == (f"retromae: this fine-tuning had already finished (stages: in-batch); its "
                                       f"model is {out}; nothing was trained\n")
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == written
    with pytest.raises(ValueError, match=r"used other settings \(--learning-rate 2e-05 -> 0.001\)"):
        finetune_command([*args, "--learning-rate", "1e-3", "--resume-from-checkpoint", "last"])
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == written

def test_a_second_run_into_a_work_folder_in_use_is_refused_before_it_trains(spread_cls_bert, tiny_beir, tmp_path):
    """HEAD trained both runs into the same checkpoints, and refused the second only at its end."""
    from retromae.trainers.training.lock import folder_lock

    with folder_lock(tmp_path / "out.work"), pytest.raises(ValueError, match=r"out.work"):
        finetune_command([str(spread_cls_bert), str(tiny_beir), "--output-dir", str(tmp_path / "out"), *FAST])
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.work").exists()


@pytest.mark.parametrize("case", ["pool too small", "positives unscored", "some positives unscored"])
def test_what_a_later_stage_cannot_use_is_refused_before_the_first_trains(spread_cls_bert, tiny_beir, tmp_path, case):
    """HEAD trained the in-batch stage and mined first, then refused."""
    docs = sum(1 for line in (tiny_beir / "corpus.jsonl").read_text().splitlines() if line.strip())
    qrels = [line.split("\t") for line in (tiny_beir / "qrels" / "train.tsv").read_text().splitlines()[1:]]
    teacher = tmp_path / "teacher.tsv"
    scored = [] if case == "positives unscored" else qrels[1:]
    teacher.write_text("".join(f"{query}\t{doc}\t1.0\n" for query, doc, _ in scored) + "unknown\tdoc\t1.0\n")
    flags = {"pool too small": ["--stages", "in-batch,hard-negatives", "--num-negatives", str(docs),
                                "--mine-range-min", "1", "--mine-range-max", str(10 * docs)],
             "positives unscored": ["--stages", "in-batch,distill", "--teacher-scores", str(teacher)],
             "some positives unscored": ["--stages", "in-batch,distill", "--teacher-scores", str(teacher)]}[case]
    message = {"pool too small": rf"ranks the {docs} documents of the corpus and takes negatives from ranks \[1, "
                                 rf"{docs}\): at most {docs - 1} per query, fewer than --num-negatives {docs}",
               "positives unscored": r"scores no positive of (\d+) of the \1 training queries .*check that its query "
                                     r"and document ids",
               "some positives unscored": r"scores no positive of 1 of the \d+ training queries \(e.g. query "
                                          rf"'{qrels[0][0]}'.*pass --on-missing skip"}[case]
    with pytest.raises(ValueError, match=message):
        finetune_command([str(spread_cls_bert), str(tiny_beir), "--output-dir", str(tmp_path / "out"), *FAST, *flags])
    assert not (tmp_path / "out.work").exists()


def test_hybrid_dupmae_model_trains_its_dense_projection(tokenizer, tiny_beir, tmp_path):
    from safetensors.torch import load_file

    torch.manual_seed(0)
    build_dupmae_sentence_transformer(
        DupMAEForPretraining(DupMAEConfig(**tiny_bert_kwargs(), dense_dim=16, doc_top_k=8)), tokenizer,
        tmp_path / "dup", max_seq_length=32,
    )
    out = tmp_path / "dup-ft"
    assert finetune_command([str(tmp_path / "dup"), str(tiny_beir), "--output-dir", str(out),
                             "--stages", "in-batch", "--learning-rate", "1e-3", *FAST]) == 0
    before = load_file(tmp_path / "dup" / "1_DupMAEPooling" / "model.safetensors")
    after = load_file(out / "1_DupMAEPooling" / "model.safetensors")
    assert (before["dense_proj.weight"] - after["dense_proj.weight"]).abs().max() > 1e-4
    assert (out / "st_dupmae.py").is_file() and (out / "layers_dupmae.py").is_file()
    modules = json.loads((out / "modules.json").read_text())
    assert modules[1]["type"] == "st_dupmae.DupMAEPooling"
    model = SentenceTransformer(str(out), trust_remote_code=True)
    assert model.get_embedding_dimension() == 16 + 30522
    info = json.loads((out / "retromae_finetune.json").read_text())
    assert info["trust_remote_code"] and info["pooling"].startswith("DupMAE hybrid")
    assert "trust_remote_code=True" in (out / "README.md").read_text()


DDP_SCRIPT = """
import json, os, sys, torch, torch.distributed as dist
from types import SimpleNamespace
from retromae.trainers.training.finetuning import contrastive_loss
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
queries, docs = torch.randn(8, 4), torch.randn(8, 4)  # the global batch, identical on every rank
loss_fn = contrastive_loss(SimpleNamespace(similarity_fn_name="dot"), None, gather_across_devices=True)
local = slice(rank * 4, rank * 4 + 4)  # this rank's 4 queries and their positives
q, d = queries[local].clone().requires_grad_(), docs[local].clone().requires_grad_()
loss = loss_fn.compute_loss_from_embeddings([q, d], None)
loss.backward()


class Linear(torch.nn.Sequential):  # a stand-in SentenceTransformer for GradCache: the embedding of x is W x
    similarity_fn_name = "dot"

    def forward(self, features):
        return {"sentence_embedding": self[0](features["x"])}


torch.manual_seed(1)
model = Linear(torch.nn.Linear(4, 4))  # the same weights on every rank
cached = contrastive_loss(model, None, gather_across_devices=True, mini_batch_size=3)
cached_loss = cached([{"x": queries[local]}, {"x": docs[local]}], None)
cached_loss.backward()
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump({"loss": loss.item(), "grad": d.grad.abs().sum().item(), "cached_loss": cached_loss.item(),
               "cached_grad": model[0].weight.grad.abs().sum().item()}, f)
dist.barrier()
dist.destroy_process_group()  # exiting with a live gloo group can abort a rank at teardown (SIGABRT)
"""


@pytest.mark.long
def test_ddp_contrastive_loss_uses_the_global_batch(tmp_path):
    """Under DDP (2 processes, gloo) each rank's in-batch negatives are all 8 documents of the global batch, with its
    own queries at the global-rank offset: the mean of the ranks' losses equals the single-process loss over the
    whole batch, with and without GradCache mini-batches."""
    import os
    import socket
    import subprocess
    import sys
    from types import SimpleNamespace

    with socket.socket() as sock:  # a free port for the rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
         str(script), str(tmp_path)], capture_output=True, text=True, env=env, timeout=240,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    torch.manual_seed(0)
    queries, docs = torch.randn(8, 4), torch.randn(8, 4)
    single = contrastive_loss(SimpleNamespace(similarity_fn_name="dot"), None, gather_across_devices=False)
    expected = single.compute_loss_from_embeddings([queries, docs], None).item()
    assert (ranks[0]["loss"] + ranks[1]["loss"]) / 2 == pytest.approx(expected, rel=1e-5)
    assert ranks[0]["loss"] != pytest.approx(ranks[1]["loss"])  # different local queries
    assert all(r["grad"] > 0 for r in ranks)
    # --mini-batch-size (GradCache) gathers alike: the script's linear stand-in, W x, over the whole batch here
    torch.manual_seed(1)
    weight_map = torch.nn.Linear(4, 4)
    with torch.no_grad():
        expected = single.compute_loss_from_embeddings([weight_map(queries), weight_map(docs)], None).item()
    assert (ranks[0]["cached_loss"] + ranks[1]["cached_loss"]) / 2 == pytest.approx(expected, rel=1e-5)
    assert all(r["cached_grad"] > 0 for r in ranks)


# ---- incomplete folders and local base models ---------------------------------------------


def test_model_folder_killed_mid_save_is_refused(spread_cls_bert, tmp_path):
    """Weights + tokenizer_config.json but no tokenizer.json: HEAD loaded a 5-token tokenizer (all words [UNK])."""
    import shutil

    broken = tmp_path / "checkpoint-3"
    shutil.copytree(spread_cls_bert, broken)
    (broken / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match=r"--model: model folder .*checkpoint-3 is incomplete, it has no tokenizer"):
        load_as_sentence_transformer(broken)


@pytest.mark.parametrize("case", ["train-data", "working-directory", "teacher-scores", "work-dir-inside"])
def test_an_output_folder_over_an_input_is_refused_even_with_overwrite(case, spread_cls_bert, tiny_beir, tmp_path,
                                                                       monkeypatch):
    """HEAD deleted the training data (`--output-dir DATA --overwrite`) or the working directory and exited 0; a work
    folder inside the output folder trained every stage, then the save was refused."""
    import shutil

    data = tmp_path / "project" / "data"
    shutil.copytree(tiny_beir, data)
    (data / "teacher.tsv").write_text("q1\td1\t1.0\n")
    monkeypatch.chdir(tmp_path / "project")
    out, extra, match = {
        "train-data": (data, [], "would delete --train-data"),
        "working-directory": (tmp_path / "project", [], "would delete the working directory"),
        "teacher-scores": (data, ["--stages", "in-batch,distill", "--teacher-scores", str(data / "teacher.tsv")],
                           "would delete --train-data"),
        "work-dir-inside": (tmp_path / "out", ["--work-dir", str(tmp_path / "out" / "work")], "is inside --output-dir"),
    }[case]
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(ValueError, match=match):
        finetune_command([str(spread_cls_bert), str(data), "--output-dir", str(out), "--overwrite", *extra, *FAST])
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def _no_training(monkeypatch):
    class Refuse:
        def __init__(self, *args, **kwargs):
            pytest.fail("trained before the input was checked")

    monkeypatch.setattr(finetune_module, "StageTrainer", Refuse)


def test_inputs_of_later_stages_are_checked_before_anything_trains(spread_cls_bert, tiny_beir, tmp_path, monkeypatch):
    """HEAD refused these after one or two stages had trained (a missing --negatives-file as a traceback), trained an
    inf teacher score into all-NaN weights, ignored --teacher-scores without the distill stage, trained a loss of 0
    with a batch of 1, and restarted from step 0 for a resume value other than `last`."""
    _no_training(monkeypatch)
    for value, score in (("inf", "inf"), ("nan", "nan")):
        (tmp_path / f"{value}.tsv").write_text(f"query-id\tcorpus-id\tscore\nq1\td1\t{score}\n")
    cases = [
        (["--negatives-file", "missing.jsonl"], "--negatives-file missing.jsonl: no such file"),
        (["--stages", "in-batch,distill", "--teacher-scores", "typo.tsv"], "--teacher-scores typo.tsv: no such file"),
        (["--stages", "distill", "--teacher-scores", str(tmp_path / "inf.tsv")], r"inf.tsv:2: score 'inf' is not a"),
        (["--stages", "distill", "--teacher-scores", str(tmp_path / "nan.tsv")], r"nan.tsv:2: score 'nan' is not a"),
        (["--teacher-scores", str(tmp_path / "inf.tsv")], "read by the distill stage only"),
        (["--eval-data", str(tiny_beir), "--eval-split", "test"], r"missing qrels/test.tsv.*splits present: "),
        (["--mine-range-min", "-5"], "--mine-range-min -5: give the number of top ranks to skip"),
        (["--mine-range-min", "5", "--mine-range-max", "6"], r"the rank range \[5, 6\).*fewer than --num-negatives"),
        (["--per-device-train-batch-size", "1"], "--per-device-train-batch-size 1 has no negative"),
        (["--resume-from-checkpoint", "latest"], "--resume-from-checkpoint latest: .* pass `last`"),
        (["--resume-from-checkpoint", str(tmp_path / "checkpoint-5")], "pass `last`"),
    ]
    for flags, match in cases:
        with pytest.raises(ValueError, match=match):
            finetune_command([str(spread_cls_bert), str(tiny_beir), "--output-dir", str(tmp_path / "out"),
                              "--max-steps", "2", *flags])
        assert not (tmp_path / "out").exists() and not (tmp_path / "out.work").exists(), flags


def test_nonsense_options_and_unsafe_work_folders_are_refused_before_anything_trains(spread_cls_bert, tiny_beir,
                                                                                     tmp_path, monkeypatch):
    """HEAD trained a hard-negatives stage with no negatives (--num-negatives 0 and a negatives file), failed with a
    traceback for -1, for a teacher-score file that is not UTF-8, and only after two stages for a distillation
    weight of 0; it fed untruncated texts for --max-seq-length 1 and overwrote or deleted the files of a --work-dir
    that no run made."""
    _no_training(monkeypatch)
    negatives = write_jsonl(tmp_path / "neg.jsonl", [{"query_id": "q1", "query": "q", "positive": "p",
                                                      "negatives": ["n1", "n2"]}])
    (tmp_path / "latin.tsv").write_bytes("query-id\tcorpus-id\tscore\nq1\td\xe9\t1.0\n".encode("latin-1"))
    (tmp_path / "scores.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1.0\n")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the user's")
    foreign = write_jsonl(tmp_path / "foreign.jsonl", [{"query_id": "zz", "query": "q", "positive": "p",
                                                        "negatives": ["n1"]}])
    (tmp_path / "bad.jsonl").write_text('{"query_id": "q1", "query": "q", "positive": "p"}\n{not json\n')
    (tmp_path / "corpus.jsonl").write_text('{"_id": "d1", "text": "t"}\n{not json\n')
    bad_eval = write_beir(tmp_path / "eval", extra_qrels=["qX\td1\t1"])
    cases = [  # the later stages' inputs are read before the first stage trains
        (["--negatives-file", str(negatives)], "no training example has 7 negatives"),
        (["--negatives-file", str(foreign)], "has no negatives for any training query"),
        (["--negatives-file", str(tmp_path / "bad.jsonl")], "bad.jsonl:2: "),
        (["--corpus", str(tmp_path / "corpus.jsonl")], "corpus.jsonl:2: "),
        (["--corpus", str(tiny_beir)], "is a folder, not a file \\(a BEIR folder's corpus is"),
        (["--eval-data", str(bad_eval)], r"names 1 query id\(s\) missing from queries.jsonl"),
        (["--negatives-file", str(negatives), "--num-negatives", "0"], "--num-negatives 0: the hard-negatives stage"),
        (["--negatives-file", str(negatives), "--num-negatives", "-1"], "--num-negatives -1: "),
        (["--stages", "hard-negatives", "--num-negatives", "0"], "--num-negatives 0: the hard-negatives stage"),
        (["--stages", "in-batch,distill", "--teacher-scores", str(tmp_path / "latin.tsv")],
         "latin.tsv:2: bytes that are not valid UTF-8"),
        (["--stages", "in-batch,distill", "--teacher-scores", str(tmp_path / "scores.tsv"),
          "--distill-loss-weight", "0"], "--distill-loss-weight 0.0: give a weight > 0"),
        (["--max-seq-length", "2"], "--max-seq-length 2: give 3 to"),
        (["--work-dir", str(tmp_path / "mine")], r"holds files no `retromae finetune` run made \(notes.txt\)"),
    ]
    for flags, match in cases:
        with pytest.raises(ValueError, match=match):
            finetune_command([str(spread_cls_bert), str(tiny_beir), "--output-dir", str(tmp_path / "out"),
                              "--max-steps", "2", *flags])
        assert not (tmp_path / "out").exists() and not (tmp_path / "out.work").exists(), flags


def test_a_refused_length_leaves_no_work_folder_after_exporting_a_checkpoint(pretraining_checkpoint, tiny_beir,
                                                                            tmp_path):
    """HEAD left OUT.work/pretrained-encoder behind when the length was refused after the checkpoint's export."""
    with pytest.raises(ValueError, match="--max-seq-length 2: give 3 to"):
        finetune_command([str(pretraining_checkpoint), str(tiny_beir), "--output-dir", str(tmp_path / "out"),
                          "--max-seq-length", "2"])
    assert not (tmp_path / "out.work").exists()


def test_overwrite_keeps_the_config_file_in_the_output_folder(spread_cls_bert, tiny_beir, tmp_path, monkeypatch):
    """HEAD deleted a --config file that lay in the output folder it replaced with --overwrite."""
    from retromae.trainers.cli import main

    _no_training(monkeypatch)
    (tmp_path / "out").mkdir()
    config = tmp_path / "out" / "ft.yaml"
    config.write_text(f"model: {spread_cls_bert}\ntrain_data: {tiny_beir}\n")
    assert main(["finetune", "--config", str(config), "--output-dir", str(tmp_path / "out"), "--overwrite"]) == 2
    assert config.is_file()


def test_blank_queries_and_documents_are_dropped_with_a_count(tmp_path):
    """HEAD trained blank queries and blank BEIR documents at loss 0 with no word."""
    groups = [TrainingGroup("q1", "  ", [("d1", "doc")]), TrainingGroup("q2", "query", [("d2", " "), ("d3", "doc")],
                                                                        [("d4", ""), ("d5", "other")])]
    kept, report = clean_groups(groups)
    assert [(g.query_id, g.positives, g.negatives) for g in kept] == [("q2", [("d3", "doc")], [("d5", "other")])]
    assert report == {"blank_queries": 1, "blank_positive_documents": 1, "blank_negative_documents": 1,
                      "negatives_equal_to_a_positive": 0}
    with pytest.raises(RetrievalDataError, match="are blank or lack a positive"):
        clean_groups([TrainingGroup("q1", "", [("d1", "doc")])])


def test_a_diverged_stage_is_refused_and_nothing_is_written(spread_cls_bert, tiny_beir, tmp_path):
    """HEAD saved an all-NaN model and exited 0 (the Trainer leaves NaN losses out of the mean it reports)."""
    with pytest.raises(ValueError, match=r"stage in-batch diverged: \d+ weight tensor\(s\) are NaN or infinite"):
        finetune_command([str(spread_cls_bert), str(tiny_beir), "--output-dir", str(tmp_path / "out"), *FAST[2:],
                          "--max-steps", "6", "--stages", "in-batch", "--learning-rate", "1e12"])
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.work" / "stage-in-batch" / "model").exists()


def test_a_config_file_may_hold_the_model_and_the_training_data(spread_cls_bert, tiny_beir, tmp_path, monkeypatch):
    """HEAD said `the following arguments are required: --model, --train_data` for a config file holding both."""
    _no_training(monkeypatch)
    config = tmp_path / "ft.yaml"
    config.write_text(f"model: {spread_cls_bert}\ntrain_data: {tiny_beir}\nteacher_scores: t.tsv\n")
    with pytest.raises(ValueError, match="--teacher-scores t.tsv: no such file"):  # parsed: the run's own check
        finetune_command(["--config", str(config), "--output-dir", str(tmp_path / "out")])


def test_a_run_killed_in_its_first_stage_resumes_only_with_its_own_settings(spread_cls_bert, tiny_beir, tmp_path,
                                                                          monkeypatch):
    """HEAD wrote the settings only when a stage finished, so a run killed in stage 1 was continued by a command
    with other settings (another learning rate), whose record then claimed them."""
    args = ["--stages", "in-batch", "--max-steps", "4", "--save-strategy", "steps", "--save-steps", "1",
            "--per-device-train-batch-size", "4", "--max-seq-length", "32", "--disable-tqdm", "true"]
    killing, _ = _kill_at("in-batch", 2)
    monkeypatch.setattr(finetune_module, "StageTrainer", killing)
    out = tmp_path / "out"
    with pytest.raises(_Killed):
        finetune_command([str(spread_cls_bert), str(tiny_beir), "--output-dir", str(out), *args])
    # the same command again keeps the stage's checkpoint (HEAD deleted it without a word and started over)
    with pytest.raises(ValueError, match=r"holds the checkpoints of stage-in-batch .*resume-from-checkpoint"):
        finetune_command([str(spread_cls_bert), str(tiny_beir), "--output-dir", str(out), *args])
    assert (tmp_path / "out.work" / "stage-in-batch" / "checkpoint-2").is_dir()
    with pytest.raises(ValueError, match=r"used other settings \(--learning-rate 2e-05 -> 0\.001\)"):
        finetune_command([str(spread_cls_bert), str(tiny_beir), "--output-dir", str(out), *args,
                          "--learning-rate", "1e-3", "--resume-from-checkpoint", "last"])
    resuming, trained = _kill_at("none", -1)
    monkeypatch.setattr(finetune_module, "StageTrainer", resuming)
    monkeypatch.chdir(tmp_path)  # the same folders, spelt relative to it (HEAD refused that as other settings)
    assert finetune_command([str(spread_cls_bert), os.path.relpath(tiny_beir), "--output-dir", "out", *args,
                             "--resume-from-checkpoint", "last"]) == 0
    assert [(stage, Path(resumed).resolve()) for stage, resumed in trained] == [
        ("stage-in-batch", tmp_path / "out.work" / "stage-in-batch" / "checkpoint-2")]


def test_local_starting_model_is_not_written_as_a_hub_id(spread_cls_bert, tiny_beir, tmp_path, monkeypatch):
    """The README's `finetune --model out/encoder`: HEAD wrote `base_model: out/encoder` and a Hub link to it."""
    import shutil

    from huggingface_hub import ModelCard

    monkeypatch.chdir(tmp_path)
    shutil.copytree(spread_cls_bert, tmp_path / "out" / "encoder")
    assert finetune_command(["out/encoder", str(tiny_beir), "--output-dir", "out/ft", "--stages", "in-batch",
                             *FAST]) == 0
    info = json.loads((tmp_path / "out" / "ft" / "retromae_finetune.json").read_text())
    assert info["base_model"] is None
    card = (tmp_path / "out" / "ft" / "README.md").read_text()
    assert "base_model" not in ModelCard(card).data.to_dict()
    assert "out/encoder" not in card and "a local model (no Hub id recorded)" in card

    with pytest.raises(ValueError, match="--base-model-name 'out/encoder/' is not a Hub id"):
        finetune_command(["out/encoder", str(tiny_beir), "--output-dir", "out/x", "--base-model-name", "out/encoder/"])
    with pytest.raises(ValueError, match="--model-name 'my model' cannot name a Hub repository: the name 'my model' "
                                         "contains ' '"):
        finetune_command(["out/encoder", str(tiny_beir), "--output-dir", "out/x", "--model-name", "my model"])
    assert not (tmp_path / "out" / "x").exists()


def test_hub_id_of_a_local_model(tmp_path):
    from retromae.trainers.inputs.folders import hub_id_of_model

    assert hub_id_of_model("my-org/encoder") == "my-org/encoder"  # not a folder here: a Hub id
    plain = tmp_path / "encoder"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"model_type": "bert", "_name_or_path": str(tmp_path)}))
    assert hub_id_of_model(plain) is None  # a local `_name_or_path` is no Hub id
    named = tmp_path / "named"
    named.mkdir()
    (named / "README.md").write_text("---\nmodel_name: my-org/retromae-scifact\nbase_model: bert-base-uncased\n---\n")
    assert hub_id_of_model(named) == "my-org/retromae-scifact"  # its own id, not its base's
    transformer_origin = tmp_path / "st"  # a sentence-transformers folder: config.json names its transformer's base
    transformer_origin.mkdir()
    (transformer_origin / "modules.json").write_text("[]")
    (transformer_origin / "config.json").write_text(json.dumps({"_name_or_path": "nreimers/MiniLM-L6-H384-uncased"}))
    assert hub_id_of_model(transformer_origin) is None
    snapshot = tmp_path / "hub" / "models--BAAI--bge-small-en" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    assert hub_id_of_model(snapshot) == "BAAI/bge-small-en"


class _Killed(Exception):
    """Stands for a kill in the middle of a stage."""


def _kill_at(stage: str, step: int):
    """A stage trainer that stops when `stage` is about to train step `step + 1` (its checkpoint-`step`
    saved), and records which stages trained."""
    trained = []

    class Trainer(StageTrainer):
        def train(self, *args, **kwargs):
            trained.append((Path(self.args.output_dir).name, kwargs.get("resume_from_checkpoint")))
            return super().train(*args, **kwargs)

        def training_step(self, *args, **kwargs):
            if self.args.output_dir.endswith(f"stage-{stage}") and self.state.global_step == step:
                raise _Killed
            return super().training_step(*args, **kwargs)

    return Trainer, trained


@pytest.mark.parametrize("kind", ["cls", "dupmae-hybrid"])
def test_a_killed_finetune_resumes_after_its_finished_stages_and_from_its_checkpoint(
    kind, spread_cls_bert, tokenizer, tiny_beir, tmp_path, monkeypatch, caplog
):
    """Killed in stage 2 after checkpoint-2: `--resume-from-checkpoint last` skips stage 1 (its saved model), reuses
    the mined negatives, continues stage 2 from checkpoint-2 and ends with the weights of an uninterrupted run; also
    for the DupMAE hybrid model, whose pooling module is remote code."""
    start = spread_cls_bert
    if kind == "dupmae-hybrid":
        torch.manual_seed(0)
        start = tmp_path / "dup"
        build_dupmae_sentence_transformer(
            DupMAEForPretraining(DupMAEConfig(**tiny_bert_kwargs(), dense_dim=16, doc_top_k=8)), tokenizer, start,
            max_seq_length=32,
        )
    args = ["--stages", "in-batch,hard-negatives", "--num-negatives", "2", "--mine-range-min", "1",
            "--mine-range-max", "8", "--max-steps", "4", "--save-strategy", "steps", "--save-steps", "1",
            "--per-device-train-batch-size", "4", "--max-seq-length", "32", "--disable-tqdm", "true", "--seed", "3"]
    assert finetune_command([str(start), str(tiny_beir), "--output-dir", str(tmp_path / "whole"), *args]) == 0

    out = tmp_path / "killed"
    killing, trained = _kill_at("hard-negatives", 2)
    monkeypatch.setattr(finetune_module, "StageTrainer", killing)
    with pytest.raises(_Killed):
        finetune_command([str(start), str(tiny_beir), "--output-dir", str(out), *args])
    assert not out.exists() and [name for name, _ in trained] == ["stage-in-batch", "stage-hard-negatives"]
    work = out.parent / "killed.work"  # a finished stage keeps its model, not its Trainer checkpoints (HEAD: all)
    assert sorted(p.name for p in (work / "stage-in-batch").iterdir()) == ["model"]
    assert (work / "stage-hard-negatives" / "checkpoint-2").is_dir()

    resuming, trained = _kill_at("none", -1)
    monkeypatch.setattr(finetune_module, "StageTrainer", resuming)
    monkeypatch.setattr(finetune_module, "mine_negatives", lambda *a, **k: pytest.fail("mined again"))
    assert finetune_command([str(start), str(tiny_beir), "--output-dir", str(out), *args,
                             "--resume-from-checkpoint", "last"]) == 0
    assert trained == [("stage-hard-negatives", str(out.parent / "killed.work" / "stage-hard-negatives" / "checkpoint-2"))]
    whole = SentenceTransformer(str(tmp_path / "whole"), trust_remote_code=True)
    resumed = SentenceTransformer(str(out), trust_remote_code=True)
    for (name, expected), (_, got) in zip(whole.state_dict().items(), resumed.state_dict().items(), strict=True):
        assert torch.allclose(expected, got, atol=1e-6), name
    info = json.loads((out / "retromae_finetune.json").read_text())
    assert [s["stage"] for s in info["stages"]] == ["in-batch", "hard-negatives"]
    assert info["stages"][1]["negatives"].startswith("mined with the previous-stage model")
    # the Trainer's mean loss of the resumed stage covers steps 3-4 only, and the record says so
    assert info["stages"][1]["train_loss_from_step"] == 3 and "train_loss_from_step" not in info["stages"][0]
    assert "(steps 3-4, resumed)" in (out / "README.md").read_text()

    # other settings are refused; without the flag a run starts over, saying so
    with pytest.raises(ValueError, match="used other settings"):
        finetune_command([str(start), str(tiny_beir), "--output-dir", str(tmp_path / "killed2"),
                          "--work-dir", str(out.parent / "killed.work"), *args, "--learning-rate", "1e-3",
                          "--resume-from-checkpoint", "last"])
    monkeypatch.undo()
    # without either flag the finished stages are kept, and the run is refused before anything loads (HEAD: warned,
    # then deleted them)
    with pytest.raises(ValueError, match=r"holds 2 finished stage\(s\).*--resume-from-checkpoint last.*--overwrite"):
        finetune_command([str(start), str(tiny_beir), "--output-dir", str(tmp_path / "killed3"),
                          "--work-dir", str(out.parent / "killed.work"), *args])
    assert (out.parent / "killed.work" / "stage-hard-negatives" / "model").is_dir()
    with caplog.at_level(logging.WARNING, logger="retromae.trainers.training.finetuning"):
        assert finetune_command([str(start), str(tiny_beir), "--output-dir", str(out), "--overwrite",
                                 *args]) == 0
    assert "finished stage(s) of an earlier run; starting over" in caplog.text


def test_a_negatives_file_short_of_the_training_queries_is_said(tmp_path, caplog):
    """Lines for queries the training data lacks, and training queries the file lacks, are warned about (HEAD: the
    first unsaid, the second at INFO, which the command line does not show)."""
    groups = [TrainingGroup(f"q{i}", f"query {i}", [(f"d{i}", f"doc {i}")], []) for i in range(3)]
    negatives = write_jsonl(tmp_path / "neg.jsonl", [
        {"query_id": "q0", "query": "query 0", "positive": "doc 0", "negatives": ["n1"]},
        {"query_id": "q9", "query": "query 9", "positive": "doc 9", "negatives": ["n2"]},
    ])
    with caplog.at_level(logging.WARNING, logger="retromae.trainers.training.finetuning"):
        result = finetune_module._negatives_from_file(str(negatives), groups)
    assert [len(g.negatives) for g in result] == [1, 0, 0]
    assert "1 of its queries are not in the training data (e.g. q9)" in caplog.text
    assert "negatives for 1 of 3 training queries read from neg.jsonl" in caplog.text



def test_negative_ids_the_corpus_lacks_are_said(tmp_path, caplog):
    """A file mined from another corpus names ids this corpus lacks (HEAD: not a word); negatives given as text only
    (their ids derived from it) and ids of this corpus are not counted."""
    groups = [TrainingGroup(f"q{i}", f"query {i}", [(f"d{i}", f"doc {i}")], []) for i in range(2)]
    negatives = write_jsonl(tmp_path / "neg.jsonl", [
        {"query_id": "q0", "query": "query 0", "positive": "doc 0", "negatives": ["doc 1", "other"],
         "negative_ids": ["d1", "nope"]},
        {"query_id": "q1", "query": "query 1", "positive": "doc 1", "negatives": ["text only"]},
    ])
    corpus = {"d0": {}, "d1": {}}
    with caplog.at_level(logging.WARNING, logger="retromae.trainers.training.finetuning"):
        finetune_module._negatives_from_file(str(negatives), groups, corpus)
    assert "1 of its negative ids are not in the training data's corpus (e.g. nope)" in caplog.text

@pytest.mark.parametrize("hybrid", [False, True], ids=["cls", "dupmae-hybrid"])
def test_dataloader_workers_and_mini_batches_through_the_cli(hybrid, spread_cls_bert, tokenizer, tiny_beir, tmp_path):
    """DataLoader workers (they tokenise; benchmarks/from_scratch.py uses them on a GPU) change no bit of the weights.
    `--mini-batch-size` trains both stages with GradCache and says so in the record."""
    start = spread_cls_bert
    if hybrid:
        torch.manual_seed(0)
        start = tmp_path / "dup"
        build_dupmae_sentence_transformer(
            DupMAEForPretraining(DupMAEConfig(**tiny_bert_kwargs(), dense_dim=16, doc_top_k=8)), tokenizer, start,
            max_seq_length=32,
        )
    weights, records = {}, {}
    for name, flags in {"plain": [], "workers": ["--dataloader-num-workers", "2"],
                        "mini": ["--mini-batch-size", "3"]}.items():
        out = tmp_path / name
        assert finetune_command([str(start), str(tiny_beir), "--output-dir", str(out), "--num-negatives", "2",
                                 "--mine-range-min", "1", "--mine-range-max", "8", *flags, *FAST]) == 0
        weights[name] = _safetensors_in(out)
        records[name] = json.loads((out / "retromae_finetune.json").read_text())
    before = _safetensors_in(start)
    assert weights["plain"].keys() == weights["workers"].keys() >= before.keys()
    assert any(not torch.equal(weights["plain"][k], before[k]) for k in before)
    assert all(torch.equal(weights["plain"][k], weights["workers"][k]) for k in weights["plain"])
    assert [s["loss"] for s in records["mini"]["stages"]] == [
        s["loss"].replace("(MultipleNegativesRankingLoss)", "(CachedMultipleNegativesRankingLoss, mini-batches of 3)")
        for s in records["plain"]["stages"]]
    assert records["mini"]["hyperparameters"]["mini_batch_size"] == 3


def test_mini_batches_give_the_full_batch_loss_and_gradients(spread_cls_bert):
    model, _ = load_as_sentence_transformer(spread_cls_bert)
    model.eval()  # no dropout: its masks would differ between whole columns and mini-batches
    features = [model.preprocess(texts) for texts in (SENTENCES[:4], SENTENCES[4:], SENTENCES[2:6][::-1])]
    results = []
    for mini_batch_size in (None, 2):
        model.zero_grad()
        torch.manual_seed(0)
        loss = contrastive_loss(model, None, gather_across_devices=False, mini_batch_size=mini_batch_size)
        value = loss(features, None)
        value.backward()
        results.append((value.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (full, full_grads), (cached, cached_grads) = results
    assert type(loss).__name__ == "CachedMultipleNegativesRankingLoss" and cached == pytest.approx(full, rel=1e-5)
    assert full_grads.keys() == cached_grads.keys() and len(full_grads) > 10
    scale = max(grad.abs().max() for grad in full_grads.values())  # float32 sums in another order (the key biases'
    for name, grad in full_grads.items():  # true gradient is 0: they hold only rounding)
        assert (cached_grads[name] - grad).abs().max() <= 1e-5 * scale, name


def test_mini_batches_are_refused_for_the_distill_stage_and_below_one(spread_cls_bert, tiny_beir, tmp_path):
    with pytest.raises(ValueError, match="--mini-batch-size applies to the in-batch and hard-negatives stages"):
        finetune_command([str(spread_cls_bert), str(tiny_beir), "--output-dir", str(tmp_path / "a"), "--stages",
                          "distill", "--teacher-scores", "t.tsv", "--mini-batch-size", "2"])
    with pytest.raises(ValueError, match="--mini-batch-size 0: give a positive number"):
        finetune_command([str(spread_cls_bert), str(tiny_beir), "--output-dir", str(tmp_path / "a"),
                          "--mini-batch-size", "0"])
    assert not (tmp_path / "a").exists()


def _safetensors_in(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {f"{f.relative_to(folder).parent}/{k}": v for f in sorted(folder.rglob("*.safetensors"))
            for k, v in load_file(f).items()}


def test_a_checkpoint_save_cut_short_leaves_no_checkpoint_and_a_kill_leftover_is_cleaned(
    spread_cls_bert, tiny_beir, tmp_path, monkeypatch
):
    """Ctrl-C while a stage writes checkpoint-2 leaves checkpoint-1 only (HEAD: a checkpoint-2 without its trainer
    state); the build folder a SIGKILL would leave is removed when the run resumes."""
    from transformers import Trainer

    out, saves = tmp_path / "ft", []
    save_rng_state = Trainer._save_rng_state

    def interrupted_at_second_save(self, output_dir):
        saves.append(output_dir)
        if len(saves) == 2:
            raise KeyboardInterrupt
        save_rng_state(self, output_dir)

    args = [str(spread_cls_bert), str(tiny_beir), "--output-dir", str(out), "--max-steps", "3", "--save-strategy",
            "steps", "--save-steps", "1", *FAST[2:]]
    monkeypatch.setattr(Trainer, "_save_rng_state", interrupted_at_second_save)
    with pytest.raises(KeyboardInterrupt):
        finetune_command(args)
    monkeypatch.undo()
    stage = tmp_path / "ft.work" / "stage-in-batch"
    assert sorted(p.name for p in stage.iterdir()) == ["checkpoint-1"]
    assert (stage / "checkpoint-1" / "trainer_state.json").is_file()

    killed_build = stage / ".checkpoint-2.tmp-999999-0123abcd"  # what a SIGKILL mid-save leaves (pid long gone)
    killed_build.mkdir()
    (killed_build / "model.safetensors").write_bytes(b"half")
    assert finetune_command([*args, "--resume-from-checkpoint", "last"]) == 0
    assert not killed_build.exists()
    assert json.loads((out / "retromae_finetune.json").read_text())["stages"][0]["train_loss_from_step"] == 2
