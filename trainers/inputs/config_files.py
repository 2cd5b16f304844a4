"""`--config` files and presets: YAML/JSON option files merged under the command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from .errors import UserError, yaml_error_message

logger = logging.getLogger(__name__)

# The presets ship inside the package: `configs/` sits beside `trainers/` both in the source tree and in an
# installed `retromae` package (pyproject.toml maps it to `retromae.configs`).
PRESETS_DIR = Path(__file__).resolve().parents[2] / "configs"
# A preset's corpus or pairs path starts with this: the user's own goes there (setting -> what it is, the flag to pass)
PLACEHOLDER = "./CHANGE-ME/"
PLACEHOLDER_FIXES = {"corpus": ("corpus", "--corpus PATH"), "pairs": ("pairs file", "--pairs FILE")}


def add_config_option(parser) -> None:
    """List `--config` in --help (it is read by `split_config` before argparse sees the rest); the bundled presets
    only for a parser made with `presets=True` (`retromae pretrain`'s: they are pre-training settings)."""
    if not any("--config" in action.option_strings for action in parser._actions):
        takes_presets = getattr(parser, "presets", False)
        presets = f" Or a bundled preset by name: {', '.join(preset_names())}" if takes_presets else ""
        parser.add_argument(
            "--config", metavar="FILE_OR_PRESET" if presets else "FILE", default=argparse.SUPPRESS,
            help=f"YAML/JSON file of settings (option names with underscores); flags on the command line win.{presets}",
        )


def refuse_placeholders(path: str, file_values: Mapping[str, Any], values: Mapping[str, Any]) -> None:
    """Refuse a `--config` file's placeholder path (`PLACEHOLDER`: a preset's corpus or pairs) that no flag replaced
    (`values`: the options as parsed), naming the flag to pass; read as a path it failed as a generic "does not
    exist"."""
    for name, value in file_values.items():
        if not (isinstance(value, str) and value.startswith(PLACEHOLDER) and values.get(name) == value):
            continue
        what, fix = PLACEHOLDER_FIXES.get(name, (name, f"--{name.replace('_', '-')} VALUE"))
        if _config_file(path).resolve().parent == PRESETS_DIR:
            raise UserError(f"the preset {Path(path).stem} has no real {what} ({name}: {value} is a placeholder): "
                            f"pass {fix}")
        raise UserError(f"{path}: {name}: {value} is a placeholder; pass {fix}, or set your own {name} in the file")


def config_argument(argv: list[str]) -> tuple[int, int, str] | None:
    """Where `--config FILE` (or `--config=FILE`) is in argv: `(index, tokens, FILE)` (`~` expanded: argparse never
    sees it), None without one; `--config` given twice is refused (`UserError`)."""
    flags = [arg.partition("=")[0] for arg in argv]
    cut = next((flag for flag in flags if len(flag) >= 5 and "--config".startswith(flag) and flag != "--config"), None)
    if cut:  # argparse would take it for --config, which this reading would miss
        raise UserError(f"{cut}: write --config in full")
    found = [i for i, flag in enumerate(flags) if flag == "--config"]
    if not found:
        return None
    if len(found) > 1:
        raise UserError(f"--config is given {len(found)} times; give it once (merge the files into one)")
    at = found[0]
    _, equals, path = argv[at].partition("=")
    if not equals:
        path = argv[at + 1] if at + 1 < len(argv) else ""
    if not path:
        raise UserError("--config needs a file name")
    return at, 1 if equals else 2, os.path.expanduser(path)


def split_config(argv: list[str]) -> tuple[list[str], dict[str, Any]]:
    """argv without `--config FILE` (see `config_argument`), and the file's values."""
    found = config_argument(argv)
    if found is None:
        return argv, {}
    at, width, path = found
    return argv[:at] + argv[at + width :], read_config_file(path)


def merge_file_mappings(parser: argparse.ArgumentParser, argv: list[str], file_values: Mapping[str, Any], *,
                        log: bool = True) -> list[str]:
    """argv where a flag that a `--config` file also sets as a mapping (`method_options:`, `config_overrides:`) holds
    both: the flag's keys replace the file's one by one and the file's other keys stay (flags override the file).
    The flag keeps its form: a JSON object, or `key=value,...`; one that is neither is left to its option's check.
    `log`: say what each merged flag now holds (a warning: logging is not set up yet when options are parsed)."""
    owner = {option: action.dest for action in parser._actions for option in action.option_strings}
    merged = list(argv)
    for at, arg in enumerate(argv):
        flag, equals, value = arg.partition("=")
        from_file = _json_object(file_values.get(owner.get(flag, "")))
        if from_file is None or not (equals or at + 1 < len(argv)):
            continue
        value = value if equals else argv[at + 1]
        combined = _merge_mapping_text(from_file, value)
        if combined is None:
            continue
        if log:
            logger.warning("%s merged into the --config file's %s (the flag's keys win): %s", flag,
                           owner[flag], combined)
        merged[at if equals else at + 1] = f"{flag}={combined}" if equals else combined
    return merged


def _json_object(text: Any) -> dict[str, Any] | None:
    """`text` as a dict when it is the JSON text of an object (how `read_config_file` passes a mapping), else None."""
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _merge_mapping_text(base: dict[str, Any], text: str) -> str | None:
    """`base` updated by `text` (a JSON object or `key=value,...`), in `text`'s form; None when `text` is neither."""
    if text.lstrip().startswith("{"):
        given = _json_object(text)
        return None if given is None else json.dumps({**base, **given})
    pairs = [item.partition("=") for item in text.split(",") if item.strip()]
    if not pairs or not all(sep for _, sep, _ in pairs):
        return None
    combined = {**base, **{key.strip(): value.strip() for key, _, value in pairs}}
    return ",".join(f"{key}={str(value).lower() if isinstance(value, bool) else value}"
                    for key, value in combined.items())


def preset_names(suffix: str = ".yaml") -> list[str]:
    """The bundled presets of one kind: `--config` files (.yaml), or DeepSpeed / FSDP configs (.json)."""
    return sorted(path.stem for path in PRESETS_DIR.glob(f"*{suffix}"))


def bundled_preset(path: str, suffix: str) -> Path | None:
    """The bundled preset `path` names by name (`retromae-wiki-book`) or by the README's path
    (`configs/retromae-wiki-book.yaml`, for installs without the source tree); None when it names none."""
    file = Path(path)
    preset = PRESETS_DIR / f"{file.stem}{suffix}"
    if file.parent in {Path("."), Path("configs")} and file.suffix in {"", suffix} and preset.is_file():
        return preset
    return None


# TrainingArguments options that read a JSON file, and take a bundled JSON preset by name
JSON_PRESET_OPTIONS = ("deepspeed", "fsdp_config")


def json_preset_path(value: Any, flag: str) -> Any:
    """`value` of a JSON-file option (`JSON_PRESET_OPTIONS`) with a bundled preset's name (`deepspeed-zero3`) or
    README path (`configs/deepspeed-zero3.json`) replaced by the installed file; a file, JSON text or a mapping as
    given. Refused (`UserError`): a name that is none of these (listing the presets of the flag's kind), another
    flag's preset, a file that is not one JSON object, a DeepSpeed config without a well-formed ZeRO section
    (`check_zero_section`)."""
    if not isinstance(value, str) or not value:
        return value
    kind = "fsdp" if "fsdp" in flag else "deepspeed"  # a preset's name starts with its flag's kind
    if value.lstrip().startswith("{"):  # JSON text
        if kind == "deepspeed":
            check_zero_section(_json_config(value, f"{flag} {value}"), f"{flag} {value}")
        return value
    if Path(value).expanduser().is_file():
        loaded = _json_config(Path(value).expanduser(), f"{flag} {Path(value).expanduser()}")
        if kind == "deepspeed":
            check_zero_section(loaded, f"{flag} {value}")
        return value
    preset = bundled_preset(value, ".json")
    if preset is not None and preset.stem.startswith(kind):
        return str(preset)
    other = f" ({value} is a preset of the other flag)" if preset is not None else ""
    names = [name for name in preset_names(".json") if name.startswith(kind)]
    raise UserError(f"{flag} {value}: no such file and no {kind} preset of that name{other}; give a JSON "
                    f"file, or one of {', '.join(names)}")


def _json_config(source: Path | str, where: str) -> dict[str, Any]:
    """The JSON object of a file (a Path) or of JSON text; `where` (the flag and value) starts the refusal."""
    try:
        loaded = json.loads(source.read_text(encoding="utf-8") if isinstance(source, Path) else source)
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise UserError(f"{where}: not a JSON {'file' if isinstance(source, Path) else 'object'} "
                        f"({' '.join(str(error).split())}); give a JSON config such as the bundled presets") from None
    if not isinstance(loaded, dict):
        raise UserError(f"{where}: holds a JSON {type(loaded).__name__}, not an object of config keys")
    return loaded


def check_zero_section(config: dict[str, Any], where: str) -> None:
    """Refuse a DeepSpeed config without a "zero_optimization" object or with a stage that is not 0-3: transformers
    and accelerate read it while the TrainingArguments are built, with a message that names no file, or a traceback
    on every process."""
    section = config.get("zero_optimization")
    if section is None:
        raise UserError(f'{where}: no "zero_optimization" section; add "zero_optimization": {{"stage": 2}} (or 3), '
                        "as the bundled presets deepspeed-zero2 and deepspeed-zero3 do")
    if not isinstance(section, dict):
        raise UserError(f'{where}: "zero_optimization" is {json.dumps(section)}, not an object; write '
                        '"zero_optimization": {"stage": 2} (or 3)')
    stage = section.get("stage", 0)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise UserError(f'{where}: "zero_optimization": {{"stage": {json.dumps(stage)}}}; the ZeRO stage is 0, 1, 2 '
                        "or 3")


def with_json_presets(parser: argparse.ArgumentParser, argv: list[str], file_values: dict[str, Any]
                      ) -> tuple[list[str], dict[str, Any]]:
    """argv and the `--config` file's values with each JSON-file option's preset name made a path
    (`json_preset_path`), before TrainingArguments reads the file."""
    owner = {option: action for action in parser._actions for option in action.option_strings
             if action.dest in JSON_PRESET_OPTIONS}
    argv = list(argv)
    for at, arg in enumerate(argv):
        flag, equals, value = arg.partition("=")
        if flag not in owner or not (equals or at + 1 < len(argv)):
            continue
        if equals:
            argv[at] = f"{flag}={json_preset_path(value, flag)}"
        else:
            argv[at + 1] = json_preset_path(argv[at + 1], flag)
    file_values = {name: json_preset_path(value, f"--config {name}:") if name in JSON_PRESET_OPTIONS else value
                   for name, value in file_values.items()}
    return argv, file_values


def _config_file(path: str) -> Path:
    """The file `--config` names: a file, else a bundled preset (`bundled_preset`)."""
    file = Path(path)
    if file.is_file():
        return file
    preset = bundled_preset(path, ".yaml")
    if preset is not None:
        return preset
    raise UserError(f"config file {path} not found; bundled presets: {', '.join(preset_names())}")


class _UniqueKeyLoader(yaml.SafeLoader):
    """`yaml.safe_load`, refusing a key set twice in one mapping (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"{key!r} is set twice; keep one",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _unique_keys(pairs: list[tuple[str, Any]], path: str) -> dict[str, Any]:
    twice = sorted(key for key, count in Counter(key for key, _ in pairs).items() if count > 1)
    if twice:
        raise UserError(f"{path}: {', '.join(map(repr, twice))} set twice; keep one")
    return dict(pairs)


def read_config_file(path: str) -> dict[str, Any]:
    """The settings of a `--config` file; a mapping value (e.g. `method_options`) becomes the JSON text its flag takes."""
    file = _config_file(path)
    text = file.read_text(encoding="utf-8")
    is_yaml = file.suffix in {".yaml", ".yml"}
    try:
        values = (yaml.load(text, Loader=_UniqueKeyLoader) or {}) if is_yaml else json.loads(
            text, object_pairs_hook=lambda pairs: _unique_keys(pairs, path))
    except json.JSONDecodeError as error:
        raise UserError(f"{path}:{error.lineno}:{error.colno}: not valid JSON: {error.msg}; fix the file") from None
    except yaml.YAMLError as error:
        raise UserError(f"{yaml_error_message(path, error)}; fix the file") from None
    if not isinstance(values, dict):
        raise UserError(f"{path} must hold a mapping of setting names to values")
    return {key: json.dumps(value) if isinstance(value, dict) else value for key, value in values.items()}


__all__ = ["PRESETS_DIR", "config_argument", "merge_file_mappings", "preset_names", "read_config_file",
           "refuse_placeholders", "split_config"]
