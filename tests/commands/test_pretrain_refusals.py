"""`pretrain` and `index` refuse, before any work, a flag that nothing of the run reads (HEAD accepted and ignored
each), and an export folder of the user's own files even with --overwrite-export."""

from __future__ import annotations

import pytest
from retromae.trainers import cli

from ..builders import pretrain_args, write_beir, write_lines

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
