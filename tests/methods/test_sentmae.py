"""SentMAE (two-stage RetroMAE): config, contrastive loss, cross-process gather, span/pair data, stage 1 -> stage 2
through the CLI, and bad input."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from retromae.modeling.configuration_retromae import RetroMAEConfig
from retromae.modeling.configuration_sentmae import SentMAEConfig
from retromae.modeling.modeling_retromae import RetroMAEForPretraining
from retromae.modeling.modeling_sentmae import (
    SentMAEForPretraining,
    gather_across_processes,
    in_batch_contrastive_loss,
)
from retromae.trainers.cli import main
from retromae.trainers.data.pairs import ContrastiveCollator, cut_two_spans, read_pairs, tokenize_pairs
from retromae.trainers.data.tokenize import tokenize_corpus
from retromae.trainers.methods import METHODS, MethodArguments
from safetensors.torch import load_file

from ..builders import PAIRS, load_with_legacy_key, pretrain_args, tiny_bert_kwargs, write_jsonl

PASSAGES = [
    "Dense retrieval encodes queries and passages into vectors and ranks passages by inner product.",
    "The masked auto-encoder reconstructs the original sentence from its embedding and a masked copy.",
    "Whole word masking hides every piece of a word at once, which makes the reconstruction task harder.",
    "Sparse lexical representations weight vocabulary terms and are stored in inverted indexes for search.",
    "Pre-training on in-domain text often improves retrieval quality after fine-tuning on labelled pairs.",
    "A bi-encoder scores a query against millions of documents with one matrix product on an accelerator.",
]


def tiny_config(cls=SentMAEConfig, **kw):
    return cls(**tiny_bert_kwargs(), **kw)


def cli_args(model: Path, output: Path, *extra: str) -> list[str]:
    """The flags of a tiny run (2 steps, no checkpoint, no export) with its data in `extra`."""
    return pretrain_args(model, None, output, *extra,
                         defaults={"--max-steps": "2", "--save-steps": "100", "--no-export": "true"})


# ---- config ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"contrastive_loss_weight": -1.0}, "contrastive_loss_weight=-1.0"),
        ({"temperature": 0.0}, "temperature=0.0"),
        ({"similarity": "l2"}, "'similarity'"),  # a Literal field: "Field 'similarity' expected one of ..."
        ({"positives": "triples"}, "'positives'"),
    ],
)
def test_config_rejects_bad_values(kwargs, message):
    with pytest.raises(Exception) as info:  # noqa: B017 (strict dataclasses wrap the ValueError)
        tiny_config(**kwargs)
    assert message in str(info.value) + str(info.value.__cause__)


def test_config_defaults_and_inherits_retromae_fields():
    config = tiny_config()
    assert (config.model_type, config.contrastive_loss_weight, config.temperature, config.similarity,
            config.positives) == ("sentmae", 1.0, 0.05, "cos", "spans")
    assert (config.encoder_mask_ratio, config.decoder_mask_ratio, config.decoding) == (0.3, 0.5, "enhanced")


def test_legacy_contrastive_weight_key_loads_with_a_deprecation_warning(tmp_path, caplog):
    loaded = load_with_legacy_key(tiny_config(contrastive_loss_weight=0.25), tmp_path, "contrastive_weight",
                                  "contrastive_loss_weight", caplog)
    assert SentMAEForPretraining(loaded).loss_weights()["contrastive_loss"] == 0.25


# ---- contrastive loss -----------------------------------------------------------------------------------------------


def test_contrastive_loss_by_hand():
    anchors = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    positives = torch.tensor([[2.0, 0.0], [0.0, 3.0]])
    # dot, tau 1: scores [[2, 0], [0, 3]] -> mean(log(1 + e^-2), log(1 + e^-3))
    expected = (math.log1p(math.exp(-2)) + math.log1p(math.exp(-3))) / 2
    assert in_batch_contrastive_loss(anchors, positives, 1.0, "dot").item() == pytest.approx(expected, rel=1e-6)
    # cos, tau 0.5: scores [[1, 0], [0, 1]] / 0.5 -> log(1 + e^-2) for both rows
    assert in_batch_contrastive_loss(anchors, positives, 0.5, "cos").item() == pytest.approx(math.log1p(math.exp(-2)))


def test_contrastive_loss_needs_two_pairs():
    with pytest.raises(ValueError, match="raise the batch size"):
        in_batch_contrastive_loss(torch.ones(1, 4), torch.ones(1, 4), 0.05)


def test_gather_without_process_group_is_identity():
    local = torch.randn(3, 4)
    gathered, offset = gather_across_processes(local)
    assert gathered is local and offset == 0


GATHER_WORKER = """
import os, sys
import torch
import torch.multiprocessing as mp


def case():
    generator = torch.Generator().manual_seed(3)
    return torch.randn(5, 4, generator=generator), torch.randn(5, 4, generator=generator), [3, 2]


def worker(rank, out_dir):
    # LOCAL_RANK is 0 on both processes, as on two single-GPU nodes: the code must use the global rank
    os.environ["LOCAL_RANK"] = "0"
    from retromae.modeling.modeling_sentmae import gather_across_processes, in_batch_contrastive_loss

    torch.distributed.init_process_group("gloo", init_method=f"file://{out_dir}/init", rank=rank, world_size=2)
    try:
        full_anchors, full_positives, sizes = case()
        start = sum(sizes[:rank])
        anchors = full_anchors[start : start + sizes[rank]].clone().requires_grad_(True)
        positives = full_positives[start : start + sizes[rank]].clone().requires_grad_(True)
        gathered, offset = gather_across_processes(positives)
        loss = in_batch_contrastive_loss(anchors, positives, 0.1, "cos")
        loss.backward()
        torch.save({"gathered": gathered.detach(), "offset": offset, "loss": loss.detach(),
                    "anchor_grad": anchors.grad, "positive_grad": positives.grad}, f"{out_dir}/rank{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[1],), nprocs=2, join=True)
"""


@pytest.mark.long
def test_gather_across_two_gloo_processes_matches_one_process(tmp_path):
    """Two gloo processes with 3 and 2 rows: gathered rows come in global-rank order, and each process's gradients
    equal those of the single-process sum of the per-process losses (DDP's averaging turns the sum into the mean)."""
    import subprocess
    import sys

    script = tmp_path / "gather_worker.py"
    script.write_text(GATHER_WORKER)
    result = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    generator = torch.Generator().manual_seed(3)  # the worker's case()
    full_anchors, full_positives = torch.randn(5, 4, generator=generator), torch.randn(5, 4, generator=generator)
    anchors, positives = full_anchors.clone().requires_grad_(True), full_positives.clone().requires_grad_(True)
    a, p = torch.nn.functional.normalize(anchors, dim=-1), torch.nn.functional.normalize(positives, dim=-1)
    scores = a @ p.T / 0.1  # (5, 5): every anchor against every positive of both processes
    targets = torch.arange(5)  # anchor i's positive is row i of the gathered positives
    losses = [torch.nn.functional.cross_entropy(scores[:3], targets[:3]),
              torch.nn.functional.cross_entropy(scores[3:], targets[3:])]
    sum(losses).backward()
    for rank, (start, size) in enumerate([(0, 3), (3, 2)]):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert torch.equal(got["gathered"], full_positives), "all positives, in global-rank order"
        assert got["offset"] == start
        assert torch.allclose(got["loss"], losses[rank].detach(), atol=1e-6)
        assert torch.allclose(got["anchor_grad"], anchors.grad[start : start + size], atol=1e-6)
        assert torch.allclose(got["positive_grad"], positives.grad[start : start + size], atol=1e-6)


# ---- model ----------------------------------------------------------------------------------------------------------


def _batch(collator_positives: str, tokenizer, batch_size: int = 4, seed: int = 0) -> dict:
    import datasets

    if collator_positives == "pairs":
        rows = tokenize_pairs(datasets.Dataset.from_list(PAIRS), tokenizer, max_seq_length=32)
    else:
        rows = tokenize_corpus(datasets.Dataset.from_dict({"text": PASSAGES}), tokenizer, max_seq_length=32)
    collator = ContrastiveCollator(tokenizer, positives=collator_positives, generator=torch.Generator().manual_seed(seed))
    return collator(list(rows.select(range(batch_size))))


def test_forward_shapes_and_loss_components(tokenizer):
    torch.manual_seed(0)
    model = SentMAEForPretraining(tiny_config(contrastive_loss_weight=0.5))
    batch = _batch("spans", tokenizer)
    output = model(**batch)
    for name in ("loss", "encoder_mlm_loss", "decoder_loss", "contrastive_loss"):
        assert getattr(output, name).shape == () and torch.isfinite(getattr(output, name)), name
    assert output.sentence_embedding.shape == (4, 32), "(batch_size, hidden_size) of the anchors"
    total = output.encoder_mlm_loss + output.decoder_loss + 0.5 * output.contrastive_loss
    assert torch.allclose(output.loss, total)
    output.loss.backward()
    assert model.decoder.layers[0].attention.self.query.weight.grad is not None


def test_contrastive_loss_weight_zero_is_retromae(tokenizer):
    """Loss (1) of the paper: with contrastive_loss_weight 0 and no positives, SentMAE is RetroMAE (same weights, same
    decoder visibility draws)."""
    torch.manual_seed(0)
    retromae = RetroMAEForPretraining(tiny_config(RetroMAEConfig)).eval()
    sentmae = SentMAEForPretraining(tiny_config(contrastive_loss_weight=0.0)).eval()
    assert sentmae.load_state_dict(retromae.state_dict()).missing_keys == []
    batch = {k: v for k, v in _batch("spans", tokenizer).items() if not k.startswith("positive_")}
    torch.manual_seed(1)
    expected = retromae(**batch)
    torch.manual_seed(1)
    got = sentmae(**batch)
    assert got.contrastive_loss is None
    assert torch.allclose(got.loss, expected.loss) and torch.allclose(got.decoder_loss, expected.decoder_loss)


def test_batch_of_one_pair_is_refused(tokenizer):
    model = SentMAEForPretraining(tiny_config())
    with pytest.raises(ValueError, match=r"got 1: raise the batch size \(--per-device-train-batch-size 2"):
        model(**_batch("pairs", tokenizer, batch_size=1))


def test_contrastive_loss_weight_needs_positives(tokenizer):
    model = SentMAEForPretraining(tiny_config())
    batch = {k: v for k, v in _batch("spans", tokenizer).items() if not k.startswith("positive_")}
    with pytest.raises(ValueError, match="needs positives"):
        model(**batch)


def test_retromae_checkpoint_loads_into_sentmae_with_its_decoder(tmp_path):
    torch.manual_seed(0)
    stage1 = RetroMAEForPretraining(tiny_config(RetroMAEConfig))
    stage1.save_pretrained(tmp_path / "stage1")
    config = SentMAEConfig.from_pretrained(tmp_path / "stage1", contrastive_loss_weight=1.0)
    stage2, info = SentMAEForPretraining.from_pretrained(tmp_path / "stage1", config=config, output_loading_info=True)
    assert info["missing_keys"] == set() or not info["missing_keys"]
    assert not info["unexpected_keys"]
    for key, value in stage1.state_dict().items():
        assert torch.equal(value, stage2.state_dict()[key]), key


LOAD_ENCODER = """
import sys, torch
from transformers import AutoModel
model = AutoModel.from_pretrained(sys.argv[1], trust_remote_code=True)
assert type(model).__name__ == "SentMAEModel", type(model)
out = model(input_ids=torch.tensor([[101, 2023, 102]]))
print(tuple(out.pooler_output.shape))
"""


@pytest.mark.long
def test_checkpoint_loads_as_remote_code_without_retromae(run_without_retromae, tmp_path):
    SentMAEForPretraining(tiny_config()).save_pretrained(tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert config["model_type"] == "sentmae" and config["auto_map"]["AutoModel"] == "modeling_sentmae.SentMAEModel"
    env = os.environ | {"HF_MODULES_CACHE": str(tmp_path / "modules")}
    result = run_without_retromae(LOAD_ENCODER, [str(tmp_path / "ckpt")], cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "(1, 32)" in result.stdout


# ---- data -----------------------------------------------------------------------------------------------------------


def test_two_spans_are_disjoint_whole_word_runs():
    word_starts = [1, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1]  # 8 words over 12 tokens
    generator = torch.Generator().manual_seed(0)
    for draws in torch.rand(200, 6, generator=generator).tolist():
        (a0, a1), (b0, b1) = cut_two_spans(word_starts, draws)
        assert 0 <= a0 < a1 <= 12 and 0 <= b0 < b1 <= 12
        assert a1 <= b0 or b1 <= a0, "disjoint"
        for start, end in ((a0, a1), (b0, b1)):
            assert word_starts[start] == 1 and (end == 12 or word_starts[end] == 1), "whole words"
            assert sum(word_starts[start:end]) >= 1
    assert cut_two_spans([1, 0, 0], [0.5] * 6) == ((0, 3), (0, 3)), "one word: the same span twice"


def test_span_collator_cuts_both_spans_from_one_passage(tokenizer):
    import datasets

    rows = tokenize_corpus(datasets.Dataset.from_dict({"text": PASSAGES}), tokenizer, max_seq_length=32)
    collator = ContrastiveCollator(tokenizer, generator=torch.Generator().manual_seed(0))
    batch = collator(list(rows))
    assert batch["input_ids"].shape == batch["positive_input_ids"].shape and batch["input_ids"].shape[0] == 6
    for i, row in enumerate(rows):
        passage = row["input_ids"][1:-1]
        for prefix in ("", "positive_"):
            original = torch.where(batch[f"{prefix}encoder_labels"][i] != -100, batch[f"{prefix}encoder_labels"][i],
                                   batch[f"{prefix}input_ids"][i])
            tokens = original[batch[f"{prefix}attention_mask"][i].bool()].tolist()
            assert tokens[0] == tokenizer.cls_token_id and tokens[-1] == tokenizer.sep_token_id
            span = tokens[1:-1]
            assert any(passage[k : k + len(span)] == span for k in range(len(passage))), "a span of its own passage"
            assert (batch[f"{prefix}encoder_labels"][i] != -100).any(), "every sequence is masked"


def test_span_cuts_are_drawn_when_masking_not_when_padding(tokenizer):
    """Workers run only `pad` (deterministic); the spans and masks come from `mask_batch`'s generator."""
    import datasets

    rows = list(tokenize_corpus(datasets.Dataset.from_dict({"text": PASSAGES}), tokenizer, max_seq_length=32))
    collator = ContrastiveCollator(tokenizer)
    torch.manual_seed(0)
    padded = collator.pad(rows)
    torch.manual_seed(1)
    assert all(torch.equal(padded[key], value) for key, value in collator.pad(rows).items()), "pad draws nothing"
    first = collator.mask_batch(padded, torch.Generator().manual_seed(5))
    again = collator.mask_batch(padded, torch.Generator().manual_seed(5))
    other = collator.mask_batch(padded, torch.Generator().manual_seed(6))
    for key in first:
        assert torch.equal(first[key], again[key]), key
    assert not torch.equal(first["attention_mask"], other["attention_mask"]), "other spans for another state"
    standalone = ContrastiveCollator(tokenizer, generator=torch.Generator().manual_seed(5))(rows)
    assert all(torch.equal(first[key], standalone[key]) for key in first), "collator(features) = mask_batch(pad(.))"


def test_pair_collator(tokenizer):
    batch = _batch("pairs", tokenizer)
    first = torch.where(batch["positive_decoder_labels"][0] != -100, batch["positive_decoder_labels"][0], 0)
    assert tokenizer.decode(first[first != 0]) == "someone performs music."
    assert set(batch) == {f"{p}{k}" for p in ("", "positive_")
                          for k in ("input_ids", "attention_mask", "encoder_labels", "decoder_labels")}


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([PAIRS[0], {"anchor": "no positive here"}], "nli.jsonl:2: no 'positive' field"),
        ([PAIRS[0], "", {"anchor": "a", "positive": "  "}], "nli.jsonl:3: 'positive' is not a non-empty string"),
        (["{oops"], "nli.jsonl:1: not valid JSON"),
        (["[1, 2]"], "nli.jsonl:1: expected a JSON object"),
        ([""], "holds no pair"),
    ],
)
def test_bad_pair_files_name_file_and_line(tmp_path, lines, message):
    path = write_jsonl(tmp_path / "nli.jsonl", lines)
    with pytest.raises(ValueError) as info:
        read_pairs(path)
    assert message in str(info.value).replace(str(tmp_path) + os.sep, "")


# ---- CLI: stage 1 -> stage 2 ----------------------------------------------------------------------------------------


def _logged(out: Path) -> list[dict]:
    """The first and the last logged losses of a finished run."""
    info = json.loads((out / "retromae_run.json").read_text())
    assert info["first_losses"] and info["final_losses"]
    return [info["first_losses"], info["final_losses"]]


def test_stage2_continues_the_stage1_decoder(stage1_checkpoint, corpus, tmp_path):
    out = tmp_path / "stage2"
    # learning rate 0: the stage-2 weights stay those loaded, so they must be the stage-1 checkpoint's
    args = cli_args(stage1_checkpoint, out, "--method", "sentmae", "--corpus", str(corpus), "--learning-rate", "0")
    assert main(args) == 0
    before = load_file(str(stage1_checkpoint / "model.safetensors"))
    after = load_file(str(out / "model.safetensors"))
    assert any(k.startswith("decoder.") for k in before)
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before), "decoder and encoder carried over"
    assert json.loads((out / "config.json").read_text())["model_type"] == "sentmae"
    assert json.loads((out / "retromae_run.json").read_text())["method"] == "sentmae"
    assert all({"encoder_mlm_loss", "decoder_loss", "contrastive_loss"} <= e.keys() for e in _logged(out))


def test_stage2_with_pairs(stage1_checkpoint, pairs_file, tmp_path):
    out = tmp_path / "nli"
    assert main(cli_args(stage1_checkpoint, out, "--method", "sentmae", "--pairs", str(pairs_file))) == 0
    config = json.loads((out / "config.json").read_text())
    assert (config["positives"], config["contrastive_loss_weight"]) == ("pairs", 1.0)
    assert json.loads((out / "retromae_run.json").read_text())["corpus"] == "nli.jsonl"
    assert all("contrastive_loss" in e for e in _logged(out))
    # the stage-2 checkpoint exports like every CLS method: plain BERT + CLS pooling, card naming the method
    assert main(["export", str(out), str(tmp_path / "encoder")]) == 0
    card = (tmp_path / "encoder" / "README.md").read_text()
    assert "sentmae" in card and "Masked Autoencoders As The Unified Learners" in card
    assert json.loads((tmp_path / "encoder" / "config.json").read_text())["model_type"] == "bert"


def test_stage2_without_contrastive_loss_is_retromae_alone(stage1_checkpoint, corpus, tmp_path):
    out = tmp_path / "loss1"
    args = cli_args(stage1_checkpoint, out, "--method", "sentmae", "--corpus", str(corpus),
                    "--method-options", '{"contrastive_loss_weight": 0.0}')
    assert main(args) == 0
    assert all("contrastive_loss" not in e and "decoder_loss" in e for e in _logged(out))


def _other_method_checkpoint(folder: Path, method: str, tokenizer) -> Path:
    from retromae.trainers.methods import METHODS

    model_class = METHODS[method].model_class
    extra = {"dense_dim": 32} if method == "dupmae" else {}
    model_class(model_class.config_class(**tiny_bert_kwargs(), **extra)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("method", ["bow", "seed", "dupmae"])
def test_stage2_from_another_method_is_refused(method, corpus, tokenizer, tmp_path, capsys):
    checkpoint = _other_method_checkpoint(tmp_path / method, method, tokenizer)
    assert main(cli_args(checkpoint, tmp_path / "run", "--method", "sentmae", "--corpus", str(corpus))) == 2
    err = capsys.readouterr().err
    assert f"is a {method!r} pre-training checkpoint but --method is 'sentmae'" in err
    assert f"continue it with --method {method}" in err and "Traceback" not in err


NEW_DECODER_ADVICE = "SentMAE stage 2 starts without a trained RetroMAE decoder"


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--method", "sentmae", "--per-device-train-batch-size", "1"], "raise --per-device-train-batch-size to 2"),
        (["--method", "sentmae", "--packing", "true"], "drop --packing"),
        (["--method", "sentmae", "--method-options", '{"positives": "pairs"}'], 'positives="pairs" needs --pairs'),
        (["--method", "retromae", "--pairs", "PAIRS"], "--pairs feeds the in-batch contrastive loss"),
        (["--method", "sentmae", "--pairs", "BAD_PAIRS"], "bad.jsonl:2: no 'positive' field"),
    ],
)
def test_bad_stage2_input_gets_one_clear_line(tiny_bert, corpus, pairs_file, tmp_path, capsys, caplog, extra,
                                             expected):
    bad = write_jsonl(tmp_path / "bad.jsonl", [PAIRS[0], {"anchor": "lonely"}])
    extra = [str(pairs_file) if a == "PAIRS" else str(bad) if a == "BAD_PAIRS" else a for a in extra]
    corpus_args = [] if "--pairs" in extra else ["--corpus", str(corpus)]
    assert main(cli_args(tiny_bert, tmp_path / "run", *corpus_args, *extra)) == 2
    err = capsys.readouterr().err
    assert expected in err.replace(str(tmp_path) + os.sep, "") and "Traceback" not in err
    # HEAD: the advice about a new decoder came first, as if it were the problem
    assert not any(NEW_DECODER_ADVICE in record.getMessage() for record in caplog.records)


def test_stage2_from_an_encoder_advises_stage1_first(tiny_bert, corpus, tmp_path, caplog):
    assert main(cli_args(tiny_bert, tmp_path / "run", "--method", "sentmae", "--corpus", str(corpus))) == 0
    assert sum(NEW_DECODER_ADVICE in record.getMessage() for record in caplog.records) == 1


@pytest.mark.long
def test_stage2_two_process_ddp_on_cpu(run_cli_in_two_processes, stage1_checkpoint, corpus, tmp_path):

    out = tmp_path / "ddp"
    args = cli_args(stage1_checkpoint, out, "--method", "sentmae", "--corpus", str(corpus),
                    "--per-device-train-batch-size", "2")
    result = run_cli_in_two_processes(args, 29531)
    assert result.returncode == 0, result.stderr[-4000:]
    assert all("contrastive_loss" in e for e in _logged(out))
    assert json.loads((out / "retromae_run.json").read_text())["training"]["world_size"] == 2


def test_legacy_contrastive_weight_method_option_still_applies(caplog):
    tokenizer = SimpleNamespace(mask_token_id=103, all_special_ids=[0, 101, 102, 103])
    arguments = MethodArguments(method_options='{"contrastive_weight": 0}')
    settings = METHODS["sentmae"].config_settings(arguments, SimpleNamespace(pairs=None), tokenizer)
    assert settings["contrastive_loss_weight"] == 0.0 and "contrastive_weight" not in settings
    assert any("`contrastive_weight` is deprecated" in r.getMessage() for r in caplog.records)
