"""Corpora at scale: tokenising processes (`--tokenize-workers`), a pre-tokenised `datasets` folder as `--corpus`,
the seeded shuffle buffer of a stream (`--shuffle-buffer`) and the per-rank split of a stream under DDP."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
import retromae.trainers.data.training_data as training_data_module
import torch
from retromae.modeling.configuration_retromae import RetroMAEConfig
from retromae.trainers.cli import main
from retromae.trainers.data.collator import DataInputs
from retromae.trainers.data.reading import read_corpus
from retromae.trainers.data.tokenize import load_tokenized_corpus, rank_stream, shuffle_stream, tokenize_corpus
from retromae.trainers.data.training_data import corpus_training_data
from retromae.trainers.inputs.pretrain_options import pretrain_arguments
from safetensors.torch import load_file

from ..builders import SENTENCES, pretrain_args, write_lines

pytestmark = pytest.mark.usefixtures("datasets_cache")


def numbered(count: int) -> list[str]:
    return [f"passage number {i} of the corpus" for i in range(count)]


def rows(dataset) -> list[tuple[int, ...]]:
    return [tuple(row["input_ids"]) for row in dataset]


def text_stream(passages: list[str], shards: int = 1) -> datasets.IterableDataset:
    """A streamed corpus of ``shards`` shards (as many files), in file order."""
    return datasets.Dataset.from_dict({"text": passages}).to_iterable_dataset(num_shards=shards)


@pytest.fixture(scope="module")
def stream(tokenizer) -> datasets.IterableDataset:
    """A tokenized stream of 60 distinct passages, one shard."""
    return tokenize_corpus(text_stream(numbered(60)), tokenizer, max_seq_length=32)


# ---- shuffle buffer -------------------------------------------------------------------------------------------------


def test_the_shuffle_buffer_is_seeded(stream):
    in_file_order = rows(stream)
    assert rows(shuffle_stream(stream, 0, seed=1)) == in_file_order, "buffer 0 keeps the file order"
    first, again, other = (rows(shuffle_stream(stream, 16, seed=seed)) for seed in (1, 1, 2))
    assert first == again, "the same seed, the same order"
    assert first != other, "another seed, another order"
    assert first != in_file_order
    assert sorted(first) == sorted(in_file_order) == sorted(other), "every row once"


def test_the_shuffle_order_changes_per_epoch(stream):
    shuffled = shuffle_stream(stream, 16, seed=1)
    epoch_0 = rows(shuffled)
    shuffled.set_epoch(1)
    epoch_1 = rows(shuffled)
    assert epoch_0 != epoch_1 and sorted(epoch_0) == sorted(epoch_1)
    shuffled.set_epoch(0)
    assert rows(shuffled) == epoch_0


def test_a_dataset_is_left_to_the_sampler_and_a_negative_buffer_refused(tokenizer):
    dataset = tokenize_corpus(numbered(5), tokenizer, max_seq_length=32)
    assert shuffle_stream(dataset, 16, seed=1) is dataset
    with pytest.raises(ValueError, match="--shuffle-buffer -1"):
        shuffle_stream(dataset, -1, seed=1)


def test_the_shuffle_flags_parse(tiny_bert, corpus, tmp_path):
    run = pretrain_arguments(pretrain_args(tiny_bert, corpus, tmp_path / "o", "--streaming", "true",
                                           "--shuffle-buffer", "0", "--tokenize-workers", "2")[1:])
    assert (run.data.shuffle_buffer, run.data.tokenize_workers) == (0, 2)
    default = pretrain_arguments(pretrain_args(tiny_bert, corpus, tmp_path / "o")[1:])
    assert (default.data.shuffle_buffer, default.data.tokenize_workers) == (10_000, None)


# ---- DDP: each rank its own part ------------------------------------------------------------------------------------


@pytest.mark.parametrize("shards", [1, 2, 3, 4], ids=["one-shard", "two-shards", "three-shards", "four-shards"])
@pytest.mark.parametrize("buffer", [0, 16], ids=["file-order", "shuffled"])
def test_two_ranks_read_disjoint_parts_that_make_the_whole_stream(tokenizer, shards, buffer):
    # 2 or 4 shards: whole shards each; 1 or 3: every other row
    tokenized = tokenize_corpus(text_stream(numbered(60), shards), tokenizer, max_seq_length=32)
    everything = rows(tokenized)
    stream = shuffle_stream(tokenized, buffer, seed=3)
    parts = [rows(rank_stream(stream, rank, 2)) for rank in (0, 1)]
    assert parts[0] and parts[1]
    assert not set(parts[0]) & set(parts[1]), "disjoint"
    assert sorted(parts[0] + parts[1]) == sorted(everything), "together the whole stream"
    assert rows(rank_stream(stream, 0, 1)) == rows(stream), "one process reads everything"


def test_a_streamed_run_on_two_processes(run_cli_in_two_processes, tiny_bert, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(2):
        write_lines(corpus / f"part-{i}.txt", SENTENCES[i::2] * 3)
    out = tmp_path / "ddp"
    args = pretrain_args(tiny_bert, corpus, out, "--streaming", "true", "--shuffle-buffer", "8", "--max-steps", "3",
                         "--save-steps", "3", "--no-export", "true", "--log-level", "info")
    result = run_cli_in_two_processes(args, 29541)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "process 0 reads its own part of the stream (1 of its 2 shards)" in result.stderr, "not dispatched by rank 0"
    state = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3


# ---- tokenising processes -------------------------------------------------------------------------------------------


def test_tokenize_workers_reach_tokenize_corpus(tokenizer, corpus, monkeypatch):
    seen = []

    def recording(*args, **kwargs):
        seen.append(kwargs.get("num_proc"))
        return tokenize_corpus(*args, **kwargs)

    monkeypatch.setattr(training_data_module, "tokenize_corpus", recording)
    for workers in (None, 1, 3):
        corpus_training_data(RetroMAEConfig(), tokenizer, DataInputs(corpus=str(corpus), max_seq_length=32,
                                                                     tokenize_workers=workers))
    assert seen == [None, 1, 3]


def test_tokenize_corpus_refuses_no_process(tokenizer):
    with pytest.raises(ValueError, match="num_proc=0"):
        tokenize_corpus(numbered(3), tokenizer, max_seq_length=32, num_proc=0)


def test_tokenize_workers_below_one_are_refused(tiny_bert, corpus, tmp_path, capsys):
    assert main(pretrain_args(tiny_bert, corpus, tmp_path / "o", "--tokenize-workers", "0")) != 0
    assert "--tokenize-workers 0" in capsys.readouterr().err


# ---- a pre-tokenised corpus -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tokenizer, corpus):
    """`corpus` tokenized (packed, 32 tokens) and saved with save_to_disk: tokenise once, train many times."""
    folder = tmp_path_factory.mktemp("tokenized") / "corpus"
    tokenize_corpus(read_corpus(corpus), tokenizer, max_seq_length=32, packing=True).save_to_disk(str(folder))
    return folder


def test_a_saved_tokenized_corpus_is_read_as_saved(tokenizer, corpus, saved):
    from_text = corpus_training_data(RetroMAEConfig(), tokenizer, DataInputs(corpus=str(corpus), max_seq_length=32,
                                                                             packing=True)).dataset
    from_folder = corpus_training_data(RetroMAEConfig(), tokenizer, DataInputs(corpus=str(saved),
                                                                               max_seq_length=32)).dataset
    assert from_folder.column_names == ["input_ids", "word_starts"]
    assert from_folder.to_list() == from_text.to_list()
    streamed = load_tokenized_corpus(str(saved), tokenizer, max_seq_length=32, streaming=True)
    assert isinstance(streamed, datasets.IterableDataset) and list(streamed) == from_text.to_list()
    assert load_tokenized_corpus(str(corpus), tokenizer, max_seq_length=32) is None, "text is read_corpus's"


def test_a_run_from_the_saved_folder_trains_as_the_run_from_the_text(tiny_bert, corpus, saved, tmp_path):
    losses = {}
    for name, source, packing in (("text", corpus, ["--packing", "true"]), ("folder", saved, [])):  # saved packed
        out = tmp_path / name
        assert main(pretrain_args(tiny_bert, source, out, *packing, "--no-export", "true")) == 0
        state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
        losses[name] = [(entry["step"], entry["loss"]) for entry in state["log_history"] if "loss" in entry]
    assert len(losses["text"]) == 4 and losses["folder"] == losses["text"]


def test_a_saved_corpus_longer_than_max_seq_length_is_refused(tokenizer, saved):
    with pytest.raises(ValueError, match=r"rows of up to 32 tokens, but --max-seq-length is 16") as refused:
        load_tokenized_corpus(str(saved), tokenizer, max_seq_length=16)
    assert str(saved) in str(refused.value) and "\n" not in str(refused.value)


def test_a_saved_corpus_of_another_tokenizer_is_refused(tokenizer, tmp_path):
    folder = tmp_path / "other"
    datasets.Dataset.from_dict({"input_ids": [[101, 2000, 102], [101, 40000, 102]]}).save_to_disk(str(folder))
    with pytest.raises(ValueError, match=rf"holds token id 40000, but the tokenizer .* has ids 0 to "
                                        rf"{len(tokenizer) - 1}") as refused:
        load_tokenized_corpus(str(folder), tokenizer, max_seq_length=32)
    assert str(folder) in str(refused.value) and "\n" not in str(refused.value)


def test_a_saved_corpus_without_word_starts_masks_tokens(tokenizer, tmp_path):
    folder = tmp_path / "ids"
    datasets.Dataset.from_dict({"input_ids": [[101, 2000, 102]], "other": [1]}).save_to_disk(str(folder))
    loaded = load_tokenized_corpus(str(folder), tokenizer, max_seq_length=32)
    assert loaded.column_names == ["input_ids"] and loaded[0]["input_ids"] == [101, 2000, 102]


def resumed_like_unbroken(tiny_bert, corpus, tmp_path, *flags: str) -> tuple[list, list]:
    """Trains 4 steps, and again from the first run's checkpoint-2; returns both runs' losses after step 2, after
    checking that their final weights agree."""
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    stream = ("--streaming", "true", "--no-export", "true", *flags)
    assert main(pretrain_args(tiny_bert, corpus, full, *stream)) == 0
    assert main(pretrain_args(tiny_bert, corpus, resumed, *stream,
                              "--resume-from-checkpoint", str(full / "checkpoint-2"))) == 0
    a, b = load_file(str(full / "model.safetensors")), load_file(str(resumed / "model.safetensors"))
    logged = [json.loads((folder / "checkpoint-4" / "trainer_state.json").read_text())["log_history"]
              for folder in (full, resumed)]
    losses = [[(e["step"], e["loss"]) for e in history if "loss" in e and e["step"] > 2] for history in logged]
    same_weights = a.keys() == b.keys() and all(a[key].allclose(b[key], atol=1e-6) for key in a)
    return losses, same_weights


def test_a_replayed_shuffled_stream_continues_exactly(tiny_bert, corpus, tmp_path):
    """`--stream-resume replay` replays the same seeded shuffle and skips the batches trained: the same weights."""
    losses, same_weights = resumed_like_unbroken(tiny_bert, corpus, tmp_path, "--shuffle-buffer", "16",
                                                 "--stream-resume", "replay")
    assert losses[0] and losses[0] == losses[1] and same_weights


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_resumed_stream_continues_at_its_saved_position_without_replay(tiny_bert, corpus, tmp_path, monkeypatch,
                                                                         workers):
    """By default a streamed checkpoint holds the stream's position, and the resumed run starts there: the Trainer
    skips no batch (HEAD replayed the stream through `skip_first_batches`), and in file order (no shuffle buffer)
    it trains on the unbroken run's rows: the same losses and weights, with or without DataLoader workers."""
    import transformers.trainer

    def no_replay(*args, **kwargs):
        raise AssertionError("the resumed run replayed the stream")

    monkeypatch.setattr(transformers.trainer, "skip_first_batches", no_replay)
    losses, same_weights = resumed_like_unbroken(tiny_bert, corpus, tmp_path, "--shuffle-buffer", "0",
                                                 "--dataloader-num-workers", workers)
    assert (tmp_path / "full" / "checkpoint-2" / "stream_state_0.pt").is_file()
    assert losses[0] and losses[0] == losses[1] and same_weights


def test_a_resumed_shuffled_stream_continues_without_replay(tiny_bert, corpus, tmp_path, monkeypatch):
    """With a shuffle buffer, the resumed run also starts at the saved position (the buffer's rows are not saved, so
    its rows differ from the unbroken run's, as `--stream-resume`'s help says) and trains to the end."""
    import transformers.trainer

    monkeypatch.setattr(transformers.trainer, "skip_first_batches", lambda *a, **k: pytest.fail("replayed"))
    losses, _ = resumed_like_unbroken(tiny_bert, corpus, tmp_path, "--shuffle-buffer", "16")
    assert [step for step, _ in losses[1]] == [3, 4]


def logged_losses(run: Path, step: int, field: str = "loss") -> list[tuple[int, float]]:
    """(step, `field`) of every step logged in `run`'s checkpoint-`step`."""
    history = json.loads((run / f"checkpoint-{step}" / "trainer_state.json").read_text())["log_history"]
    return [(entry["step"], entry[field]) for entry in history if "loss" in entry]


@pytest.mark.parametrize("flags", [("--shuffle-buffer", "0"), ("--shuffle-buffer", "8", "--stream-resume", "replay")],
                         ids=["saved-position", "replay"])
def test_a_stream_resumed_after_its_first_pass_trains_as_the_unbroken_run(tiny_bert, tmp_path, flags):
    """10 rows at batch 4 are 3 batches a pass. Resumed at the end of the first pass (checkpoint-3) or inside the
    second (checkpoint-5), a run trains on the unbroken run's rows: the same loss at every step, the same weights.
    HEAD resumed the stream in its first pass (`set_epoch(0)`): the saved position, of epoch 1, was ignored and the
    stream read from its start; a replay skipped the checkpoint's batches in the first pass; a position at the end of
    a pass broke the DataLoader."""
    corpus = write_lines(tmp_path / "corpus.txt", numbered(10))
    stream = ("--streaming", "true", "--no-export", "true", "--max-steps", "7", "--save-steps", "1",
              "--save-total-limit", "8", *flags)
    full = tmp_path / "full"
    assert main(pretrain_args(tiny_bert, corpus, full, *stream)) == 0
    unbroken = load_file(str(full / "model.safetensors"))
    for checkpoint in (3, 5):
        resumed = tmp_path / f"resumed-{checkpoint}"
        assert main(pretrain_args(tiny_bert, corpus, resumed, *stream, "--resume-from-checkpoint",
                                  str(full / f"checkpoint-{checkpoint}"))) == 0
        assert logged_losses(resumed, 7) == logged_losses(full, 7), f"from checkpoint-{checkpoint}"
        assert logged_losses(resumed, 7, "epoch") == logged_losses(full, 7, "epoch"), f"from checkpoint-{checkpoint}"
        weights = load_file(str(resumed / "model.safetensors"))
        assert weights.keys() == unbroken.keys()
        assert all(torch.equal(weights[key], unbroken[key]) for key in unbroken), f"from checkpoint-{checkpoint}"


def test_save_tokenized_writes_a_corpus_any_run_trains_from(tiny_bert, corpus, tokenizer, tmp_path, capsys):
    """`pretrain --save-tokenized FOLDER` tokenizes once and trains nothing; `--corpus FOLDER` then trains from the
    saved ids; an existing folder is replaced only with --overwrite-output-dir."""
    folder = tmp_path / "ids"
    save = ("--save-tokenized", str(folder), "--packing", "true")
    assert main(pretrain_args(tiny_bert, corpus, tmp_path / "unused", *save)) == 0
    assert not (tmp_path / "unused").exists() and f"in {folder}" in capsys.readouterr().out
    saved = datasets.load_from_disk(str(folder))
    expected = tokenize_corpus(read_corpus(corpus), tokenizer, max_seq_length=32, packing=True)
    assert saved["input_ids"] == expected["input_ids"]
    assert main(pretrain_args(tiny_bert, folder, tmp_path / "run", "--no-export", "true", "--max-steps", "2")) == 0
    # --packing cannot apply to rows saved unpacked (HEAD: ignored, and the run record said packing: true)
    plain = tmp_path / "plain-ids"
    assert main(pretrain_args(tiny_bert, corpus, tmp_path / "unused", "--save-tokenized", str(plain))) == 0
    assert main(pretrain_args(tiny_bert, plain, tmp_path / "run2", "--no-export", "true", "--max-steps", "2",
                              "--packing", "true")) == 2
    assert "--packing applies while a corpus is tokenized" in capsys.readouterr().err
    # HEAD: "dataset ... has no 'text' column (columns: ['input_ids', 'word_starts'])"
    assert main(pretrain_args(tiny_bert, folder, tmp_path / "unused", "--save-tokenized", str(tmp_path / "ids2"))) == 2
    assert f"--corpus {folder} is already tokenized: train from it as it is" in capsys.readouterr().err
    assert main(pretrain_args(tiny_bert, corpus, tmp_path / "unused", *save)) == 2
    assert "--overwrite-output-dir" in capsys.readouterr().err
    assert main(pretrain_args(tiny_bert, corpus, tmp_path / "unused", *save, "--overwrite-output-dir", "true")) == 0
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "notes.txt").write_text("the user's")  # HEAD deleted it with --overwrite-output-dir
    notes = ("--save-tokenized", str(tmp_path / "notes"), "--overwrite-output-dir", "true")
    assert main(pretrain_args(tiny_bert, corpus, tmp_path / "unused", *notes)) == 2
    assert "holds no saved dataset (no state.json or dataset_info.json), which --overwrite-output-dir does not " \
        "replace" in capsys.readouterr().err
    assert (tmp_path / "notes" / "notes.txt").read_text() == "the user's"


@pytest.mark.parametrize("damage", ["arrow file missing", "state.json cut short"])
def test_a_damaged_saved_corpus_names_the_folder_in_one_line(tokenizer, tmp_path, damage):
    """HEAD: `datasets.load_from_disk`'s FileNotFoundError or JSON error, as a traceback."""
    saved = tmp_path / "ids"
    datasets.Dataset.from_dict({"input_ids": [[101, 2000, 102]] * 4}).save_to_disk(str(saved))
    if damage == "arrow file missing":
        next(saved.glob("*.arrow")).unlink()
    else:
        (saved / "state.json").write_text('{"_data_files": [')
    with pytest.raises(ValueError, match=rf"--corpus {saved}: this `save_to_disk` folder cannot be loaded .*save it"):
        load_tokenized_corpus(str(saved), tokenizer, max_seq_length=32)
