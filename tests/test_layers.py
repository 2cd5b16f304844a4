"""The package's shape, read from its import statements: layers, no cycles, no private names across modules, no
function-local imports but of optional dependencies, and `modeling/` loadable as Hub remote code."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRAINERS = ROOT / "trainers"
MODELING = ROOT / "modeling"

# Each module of retromae.trainers and its layer: a module imports only from its own layer or lower ones.
LAYERS: dict[str, int] = {
    # 0: the bottom layer (arguments, errors, I/O, model folders, checkpoint loading, model cards)
    **{f"core.{path.stem}": 0 for path in (TRAINERS / "core").glob("*.py")},
    # 1: the parts the methods are made of (data, collators, the Trainer, exporters)
    "data": 1, "beir": 1, "contrastive_data": 1, "schedules": 1, "resume": 1, "recipe": 1, "trainer": 1,
    "export_cls": 1, "export_dupmae": 1, "positions": 1, "fast_paths": 1,
    # 2: the method registry, the one place that knows how the methods differ
    "methods": 2,
    # 3: the drivers, one per command
    "pretrain": 3, "export": 3, "finetune": 3, "evaluate": 3, "publish": 3, "hybrid_index": 3, "coverage": 3,
    "validation": 3,  # the retrieval validation of `pretrain` (it reuses coverage's diagnostic)
    # 4: command wiring, imported by nothing
    "cli": 4,
}
# Imported inside a function only: dependencies that are optional or slow to import and needed by one path.
OPTIONAL_IMPORTS = {"mteb", "matplotlib", "pydoc_data"}


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
                # `from .core import io` names the module core.io
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
