"""A preset's placeholder corpus or pairs path (`./CHANGE-ME/...`) is refused in one line naming the flag to pass,
and only `retromae pretrain`'s --help lists the presets (probe round 69: B-PRESET-PLACEHOLDER, B-HELP-GAPS)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from retromae.trainers.cli import main
from retromae.trainers.inputs.errors import UserError
from retromae.trainers.inputs.pretrain_options import pretrain_arguments

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
PLACEHOLDER = "./CHANGE-ME/"
WITH_PLACEHOLDER = [p for p in sorted(CONFIGS.glob("*.yaml")) if PLACEHOLDER in p.read_text(encoding="utf-8")]


def test_the_paper_presets_have_placeholders():
    assert {p.stem for p in WITH_PLACEHOLDER} >= {"retromae-wiki-book", "sentmae-stage1-wiki-book", "sentmae-stage2-nli"}


@pytest.mark.parametrize("preset", WITH_PLACEHOLDER, ids=lambda p: p.stem)
def test_a_preset_placeholder_is_refused_naming_the_flag(preset):
    """HEAD: "corpus path './CHANGE-ME/...' does not exist", after the preset's --fp16 true was refused on the CPU."""
    values = yaml.safe_load(preset.read_text(encoding="utf-8"))
    name, fix = ("pairs", "pairs file\\b.*: pass --pairs FILE") if "pairs" in values else ("corpus", "corpus.*: pass "
                                                                                          "--corpus PATH")
    with pytest.raises(UserError, match=rf"^the preset {preset.stem} has no real {fix}$") as error:
        pretrain_arguments(["--config", preset.stem])
    assert f"({name}: {values[name]} is a placeholder)" in str(error.value)


def test_a_flag_replaces_the_placeholder(tmp_path):
    run = pretrain_arguments(["--config", "retromae-wiki-book", "--corpus", str(tmp_path / "c.txt"), "--fp16", "false",
                              "--output-dir", str(tmp_path / "out")])
    assert run.data.corpus == str(tmp_path / "c.txt")
    run = pretrain_arguments(["--config", "configs/sentmae-stage2-nli.yaml", "--pairs=p.jsonl", "--fp16", "false",
                              "--output-dir", str(tmp_path / "out")])
    assert run.data.pairs == "p.jsonl"


def test_a_placeholder_in_a_copy_of_a_preset_names_the_file(tmp_path):
    copy = tmp_path / "mine.yaml"
    copy.write_text("corpus: ./CHANGE-ME/wikipedia-bookcorpus\n", encoding="utf-8")
    with pytest.raises(UserError, match=rf"^{copy}: corpus: \./CHANGE-ME/wikipedia-bookcorpus is a placeholder; pass "
                                        r"--corpus PATH, or set your own corpus in the file$"):
        pretrain_arguments(["--config", str(copy)])


def help_text(command: str, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", ["publish", "export", "finetune"])
def test_only_pretrain_help_lists_the_presets(command, capsys):
    """HEAD: publish and export listed the 15 pre-training presets under --config."""
    out = help_text(command, capsys)
    assert "--config FILE " in out and "retromae-wiki-book" not in out and "preset" not in out


def test_pretrain_help_names_every_corpus_format(capsys):
    """HEAD: --corpus left out .parquet and the compressed files, which are read."""
    out = " ".join(help_text("pretrain", capsys).split())
    assert "a .parquet file with a `text` column (.txt and .jsonl also compressed: .gz, .bz2, .xz, .zst)" in out
    assert "--config FILE_OR_PRESET" in out and "Or a bundled preset by name: bow-msmarco," in out
