"""What corpus reading tells the user about several files (identical copies, globs, lists, a second path after
--corpus), notes beside the data (README, LICENSE), a DatasetDict without a train split, and the empty line that made
`--text-format auto` read a .txt as blocks (probe round 69: B-CORPUS-MULTI, B-CORPUS-MSGS)."""

from __future__ import annotations

import logging

import datasets
import pytest
from retromae.trainers.data.passages import numbered_passages
from retromae.trainers.data.reading import check_text_format_applies, read_corpus
from retromae.trainers.inputs.errors import UserError
from retromae.trainers.inputs.pretrain_options import pretrain_arguments

from ..builders import jsonl_text, texts_of, write_file

pytestmark = pytest.mark.usefixtures("datasets_cache")

READING = "retromae.trainers.data.reading"


def warnings_of(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]


@pytest.mark.parametrize("streaming", [False, True])
def test_identical_files_in_a_folder_are_named_and_read(tmp_path, caplog, streaming):
    """HEAD: a copy of a file (`part-1 (1).jsonl`) was read twice without a word."""
    records = jsonl_text({"text": "one"}, {"text": "two"})
    for name in ("a.jsonl", "sub/a copy.jsonl", "b.jsonl"):
        write_file(tmp_path / name, records)
    write_file(tmp_path / "c.jsonl", jsonl_text({"text": "six"}, {"text": "ten"}))  # same size, other bytes
    with caplog.at_level(logging.WARNING, logger=READING):
        assert len(texts_of(read_corpus(tmp_path, streaming=streaming))) == 8  # warned, not refused
    (message,) = [m for m in warnings_of(caplog) if "identical" in m]
    assert "a.jsonl and b.jsonl and sub/a copy.jsonl are identical files (same size and content)" in message
    assert "read 3 times" in message and "c.jsonl" not in message


@pytest.mark.parametrize("source", ["corpus/*.jsonl", "corpus/*", "a.jsonl,b.txt", "part-[12].txt", "part?.txt"])
def test_a_glob_or_a_list_is_named_as_one_path_only(tmp_path, monkeypatch, source):
    """HEAD: "does not exist; check the path" (`corpus/*` went to the Hub as a dataset name)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"does not exist: the corpus is one file or folder \(--corpus PATH\), and "
                                         r"globs and lists are not expanded; several files: put them in one folder, "
                                         r"which is read whole"):
        read_corpus(source)


@pytest.mark.parametrize("argv", [["--corpus", "a.jsonl", "b.txt"], ["--corpus=a.jsonl", "b.txt"],
                                  ["--max-steps", "1", "--corpus", "a.jsonl", "b.txt", "c.txt"]])
def test_a_second_path_after_corpus_says_it_takes_one(argv):
    """HEAD: "unknown option(s): b.txt"."""
    with pytest.raises(UserError, match=r"^--corpus takes one path, and b\.txt follows its path a\.jsonl; several "
                                        r"files: put them in one folder, which is read whole$"):
        pretrain_arguments(argv)


def test_a_second_value_after_another_flag_is_named_too():
    with pytest.raises(UserError, match=r"^--output-dir takes one value, and b follows its value a; quote a value "
                                        r"that holds spaces, or drop the others$"):
        pretrain_arguments(["--output-dir", "a", "b"])
    with pytest.raises(UserError, match=r"^--config takes one file, and demo-bow follows its file demo-retromae; merge "
                                        r"the files into one$"):
        pretrain_arguments(["--max-steps", "1", "--config", "demo-retromae", "demo-bow"])
    with pytest.raises(UserError, match=r"^unknown option\(s\): --no-such-flag x"):
        pretrain_arguments(["--no-such-flag", "x"])


def test_a_datasetdict_without_train_names_corpus_split(tmp_path):
    """HEAD: told to re-save the split with save_to_disk, not that --corpus-split picks it."""
    split = datasets.Dataset.from_dict({"text": ["a passage"]})
    datasets.DatasetDict({"validation": split, "test": split}).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(ValueError, match=r"without a 'train' split \(splits: \['test', 'validation'\]\); pick one "
                                         r"with --corpus-split <split> \(read_corpus\(\.\.\., split=\.\.\.\)\)$"):
        read_corpus(tmp_path / "saved")
    assert texts_of(read_corpus(tmp_path / "saved", split="validation")) == ["a passage"]


def test_notes_beside_the_data_are_skipped_with_one_warning(tmp_path, caplog):
    """HEAD: a folder with a README.md (every Hub dataset download has one) was refused, and a README.txt or
    LICENSE.txt was read as passages."""
    write_file(tmp_path / "data.jsonl", jsonl_text({"text": "a passage"}))
    for name in ("README.md", "README.txt", "LICENSE", "sub/notes.md", "dataset_infos.json"):
        write_file(tmp_path / name, "not a passage\n")
    with caplog.at_level(logging.WARNING, logger=READING):
        assert texts_of(read_corpus(tmp_path)) == ["a passage"]
    (message,) = warnings_of(caplog)
    assert "skipping LICENSE, README.md, README.txt, dataset_infos.json, sub/notes.md: notes beside the data" in message
    with pytest.raises(ValueError, match=r"--text-format lines splits \.txt files into passages, and .* holds none"):
        check_text_format_applies("lines", str(tmp_path))  # README.txt is not read


def test_other_files_in_a_folder_name_the_formats_once(tmp_path):
    """HEAD: "only .txt and .jsonl files are read ... (.parquet files ... are read too)"."""
    write_file(tmp_path / "a.jsonl", jsonl_text({"text": "a passage"}))
    write_file(tmp_path / "b.csv", "x,y\n")
    with pytest.raises(ValueError) as error:
        read_corpus(tmp_path)
    assert str(error.value).endswith(
        "holds files that are not a corpus format: b.csv; the files read are .txt, .jsonl and .parquet files (.txt "
        "and .jsonl also compressed as .gz/.bz2/.xz/.zst): move the others out of the folder, or convert them")
    assert "only" not in str(error.value)


def test_a_folder_of_notes_only_holds_no_corpus(tmp_path):
    write_file(tmp_path / "README.md", "# a dataset\n")
    with pytest.raises(ValueError, match=r"holds no corpus \(it holds README\.md\)"):
        read_corpus(tmp_path)


@pytest.mark.parametrize("name", ["corpus.md", "README.txt"])
def test_a_folder_whose_only_file_is_taken_for_a_note_says_how_to_read_it(name, tmp_path):
    """HEAD named the file but not that it was skipped (README.txt: a .txt, yet ".txt files" were asked for)."""
    write_file(tmp_path / name, "a passage of the corpus\n")
    with pytest.raises(ValueError, match=rf"; {name.replace('.', '[.]')} is skipped as notes \(README, LICENSE, \.md\): "
                                         r"if one is the corpus, rename it to \.txt \(for example corpus\.txt\)"):
        read_corpus(tmp_path)


def test_the_empty_line_that_made_auto_read_blocks_is_a_warning(tmp_path, caplog):
    """HEAD: an INFO line, which `retromae pretrain` does not show (it logs warnings)."""
    path = write_file(tmp_path / "c.txt", "one\ntwo\nthree\n\nfour\n")
    with caplog.at_level(logging.WARNING):
        assert texts_of(read_corpus(path)) == ["one two three", "four"]
        assert [text for _, text in numbered_passages(path)] == ["one two three", "four"]  # `retromae index`
    assert warnings_of(caplog) == [
        f"{path}: one passage per block of lines between empty lines (--text-format auto: line 4 is empty between "
        "text lines); --text-format lines reads one passage per line, --text-format blocks keeps the blocks without "
        "this warning"] * 2
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        read_corpus(path, text_format="blocks")
        read_corpus(write_file(tmp_path / "lines.txt", "one\ntwo\n"))
    assert warnings_of(caplog) == []


def test_a_folder_of_auto_blocks_files_gets_one_warning(tmp_path, caplog):
    for name in ("a.txt", "b.txt", "c.txt"):
        write_file(tmp_path / name, f"{name} one\n\n{name} two\n")
    with caplog.at_level(logging.WARNING, logger=READING):
        read_corpus(tmp_path)
    (message,) = warnings_of(caplog)
    assert f"{tmp_path / 'a.txt'}: one passage per block" in message and "line 2 is empty" in message
    assert "(and 2 more .txt file(s) read as blocks)" in message
