"""`pretrain` and `index` refuse, before any work, a flag that nothing of the run reads (HEAD accepted and ignored
each), and an export folder of the user's own files even with --overwrite-export; a corpus title that is not a string
is refused naming its line, as a text is."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from retromae.trainers import cli
from retromae.trainers.data.passages import CorpusError
from retromae.trainers.data.reading import read_corpus
from retromae.trainers.inputs import pretrain_options
from retromae.trainers.inputs.pretrain_options import pretrain_arguments

from ..builders import pretrain_args, texts_of, write_beir, write_lines

pytestmark = pytest.mark.usefixtures("datasets_cache")


def error_line(capsys, command: str) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"retromae {command}: error: "), lines
    return lines[0]


@pytest.mark.parametrize(("flags", "message"), [
    (["--shuffle-buffer", "100"], "--shuffle-buffer applies to a streamed corpus: add --streaming true, or drop it"),
    (["--stream-resume", "replay"], "--stream-resume applies to a streamed corpus: add --streaming true, or drop it"),
    (["--overwrite-export", "true"], "--overwrite-export applies to an --export-dir of your own: the default "
                                     "(OUTPUT_DIR/encoder) is the run's and each run there replaces it"),
    (["--text-format", "blocks"], "--text-format blocks splits .txt files into passages, and --corpus {jsonl} holds "
                                  "none; drop --text-format"),
    (["--label-smoothing-factor", "0.1"], "do not smooth labels, so the option would be ignored; drop it"),
    (["--push-to-hub", "true"], "upload its result with `retromae publish --folder FOLDER --repo-id OWNER/NAME`"),
])
def test_a_flag_the_run_does_not_read_is_refused(tiny_bert, tmp_path, capsys, flags, message):
    jsonl = write_lines(tmp_path / "c.jsonl", ['{"text": "dense retrieval ranks passages"}'] * 8)
    out = tmp_path / "run"
    assert cli.main(pretrain_args(tiny_bert, jsonl, out, *flags)) == 2
    assert message.format(jsonl=jsonl) in error_line(capsys, "pretrain")
    assert not out.exists()


def test_the_flags_are_taken_where_they_apply(tiny_bert, corpus, tmp_path):
    """--text-format on a .txt corpus and --shuffle-buffer on a streamed one train as before."""
    assert cli.main(pretrain_args(tiny_bert, corpus, tmp_path / "a", "--text-format", "lines", "--max-steps", "1",
                                  "--no-export", "true")) == 0
    assert cli.main(pretrain_args(tiny_bert, corpus, tmp_path / "b", "--streaming", "true", "--shuffle-buffer", "4",
                                  "--max-steps", "1", "--no-export", "true")) == 0


def test_an_export_dir_of_the_users_files_is_kept_even_with_overwrite_export(tiny_bert, corpus, tmp_path, capsys):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "notes.txt").write_text("the user's")
    assert cli.main(pretrain_args(tiny_bert, corpus, tmp_path / "run", "--export-dir", str(notes),
                                  "--overwrite-export", "true")) == 2
    assert (f"--export-dir {notes} holds no model (no modules.json or config.json), which --overwrite-export does "
            "not replace") in error_line(capsys, "pretrain")
    assert (notes / "notes.txt").read_text() == "the user's" and not (tmp_path / "run").exists()


def test_index_refuses_a_text_format_for_a_beir_folder(tmp_path, capsys):
    beir = write_beir(tmp_path / "beir")
    assert cli.main(["index", "--model", str(tmp_path / "no-model"), "--corpus", str(beir), "--output-dir",
                     str(tmp_path / "index"), "--text-format", "blocks"]) == 2
    assert f"--text-format blocks splits .txt files into passages, and --corpus {beir} holds none" in error_line(
        capsys, "index")


TITLE_LINES = {  # a title of another JSON type on every line (the json builder reads a number column), or on one
    "every_line": ['{"title": 3, "text": "passage 3"}', '{"title": 4, "text": "passage 4"}'],
    "one_line": ['{"title": "T", "text": "passage 1"}', '{"title": 3, "text": "passage 3"}'],
}


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("name", sorted(TITLE_LINES))
def test_a_title_that_is_not_a_string_is_refused_naming_its_line(tiny_bert, tmp_path, capsys, name, streaming):
    lines = TITLE_LINES[name]
    jsonl = write_lines(tmp_path / "c.jsonl", ['{"title": null, "text": "a null title is no title"}', *lines * 4])
    flags = ["--streaming", "true", "--max-steps", "1"] if streaming else []
    assert cli.main(pretrain_args(tiny_bert, jsonl, tmp_path / "run", *flags)) == 2
    line = 2 if name == "every_line" else 3
    err = capsys.readouterr().err.strip().splitlines()[-1]  # the builder's progress bars come before
    assert err == (f'retromae pretrain: error: {jsonl}:{line}: the "title" field must be a string or null, found 3 '
                   '(JSON number); write the title in quotes, e.g. {"title": "...", "text": "..."}, or drop it')


@pytest.mark.parametrize("streaming", [False, True])
def test_a_parquet_title_column_that_is_not_strings_is_refused(tmp_path, streaming):
    """A null title is no title (a column of nulls too); numbers were dropped silently."""
    nulls = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"title": pa.array([None, None], pa.null()), "text": ["one", "two"]}), nulls)
    assert texts_of(read_corpus(nulls, streaming=streaming)) == ["one", "two"]
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"title": [3, 4], "text": ["passage 3", "passage 4"]}), path)
    with pytest.raises(CorpusError, match=rf"dataset '{path}': the 'title' column holds int64, not strings; save each "
                                          r"title as a string \(or null\), or drop the column"):
        texts_of(read_corpus(path, streaming=streaming))


def test_text_format_is_taken_for_txt_files_behind_a_folder_link(tiny_bert, tmp_path):
    """The corpus reader follows a link to a folder of .txt files (`_files_below`), so --text-format applies."""
    books = tmp_path / "books"
    books.mkdir()
    write_lines(books / "a.txt", ["dense retrieval ranks passages"] * 8)
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "books").symlink_to(books, target_is_directory=True)
    run = pretrain_arguments(pretrain_args(tiny_bert, tmp_path / "corpus", tmp_path / "run", "--text-format",
                                           "lines")[1:])
    assert run.data.text_format == "lines"


@pytest.mark.parametrize("stray", ["README.txt", ".notes.txt"])
def test_text_format_is_refused_for_txt_files_the_reader_skips(tiny_bert, tmp_path, capsys, stray):
    """A BEIR folder is read as its corpus.jsonl alone, and hidden files are skipped: a .txt file there is not
    read, so --text-format would be ignored."""
    beir = write_beir(tmp_path / "beir")
    write_lines(beir / stray, ["not part of the corpus"])
    assert cli.main(pretrain_args(tiny_bert, beir, tmp_path / "run", "--text-format", "lines")) == 2
    assert f"--text-format lines splits .txt files into passages, and --corpus {beir} holds none" in error_line(
        capsys, "pretrain")


def test_index_refuses_a_text_format_for_a_corpus_jsonl_folder_without_queries(tmp_path, capsys):
    """index reads a folder with a corpus.jsonl as BEIR (that file alone) even without queries or qrels."""
    folder = tmp_path / "docs"
    folder.mkdir()
    write_lines(folder / "corpus.jsonl", ['{"_id": "d1", "text": "dense retrieval"}'])
    write_lines(folder / "notes.txt", ["not indexed"])
    assert cli.main(["index", "--model", str(tmp_path / "no-model"), "--corpus", str(folder), "--output-dir",
                     str(tmp_path / "index"), "--text-format", "blocks"]) == 2
    assert f"--text-format blocks splits .txt files into passages, and --corpus {folder} holds none" in error_line(
        capsys, "index")


def test_a_resumed_run_is_not_refused_a_text_format_it_recorded(tiny_bert, tmp_path, monkeypatch):
    """A checkpoint of a run that took --text-format for a .jsonl corpus (before it was refused) resumes: the flag
    is refused only where it is given."""
    jsonl = write_lines(tmp_path / "c.jsonl", ['{"text": "dense retrieval ranks passages"}'] * 8)
    out = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.setattr(pretrain_options, "check_text_format_applies", lambda *args: None)
        assert cli.main(pretrain_args(tiny_bert, jsonl, out, "--text-format", "blocks", "--max-steps", "1",
                                      "--save-steps", "1", "--no-export", "true")) == 0
    run = pretrain_arguments(pretrain_args(tiny_bert, jsonl, out, "--resume-from-checkpoint", "last",
                                           "--max-steps", "1", "--save-steps", "1", "--no-export", "true")[1:])
    assert run.resume and run.data.text_format == "blocks"
