"""The package's stage order: every import in xtune/ (at any depth, `TYPE_CHECKING` blocks and imports
inside functions included) read with `ast`, and no import cycle, and no module importing a later stage.

STAGES is the order, written once here and explained in docs/design.md, "Stages": a module may import its
own stage and the stages above it in the list. Python runs a package's __init__ before any of its
modules; only explicit import statements are edges here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "xtune"

# Earliest first. A stage is a list of module prefixes (a module belongs to its longest matching prefix).
STAGES: tuple[tuple[str, ...], ...] = (
    ("xtune.version", "xtune.errors", "xtune.files", "xtune.target"),  # foundations
    ("xtune.graph",),  # the network IR: pure data
    ("xtune.schedule",),
    ("xtune.codegen",),
    ("xtune.ops",),  # the operator families
    ("xtune.boards",),
    ("xtune.tuning",),
    ("xtune.transfer",),
    ("xtune.frontend",),
    ("xtune.firmware",),
    ("xtune.cli",),
    ("xtune",),  # xtune/__init__.py: the library API
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, known: set[str], here: str | None = None) -> set[str]:
    """The modules of `known` that `path` (module `here`) imports: `import a.b`, `from a import b` (b a
    module or a name of a), relative imports resolved, wherever the statement stands."""
    here = here or module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return {name for name in found if name in known}


def stage_of(module: str) -> int:
    best, index = -1, -1
    for i, prefixes in enumerate(STAGES):
        for prefix in prefixes:
            matches = module == prefix or module.startswith(prefix + ".")
            if matches and len(prefix) > best:
                best, index = len(prefix), i
    if index < 0:
        raise AssertionError(f"{module} belongs to no stage: add it to STAGES and to docs/design.md")
    return index


def graph() -> dict[str, set[str]]:
    known = set(modules())
    return {name: imports(path, known) - {name} for name, path in modules().items()}


def test_every_module_has_a_stage() -> None:
    for name in modules():
        stage_of(name)


def test_no_import_runs_against_the_stage_order() -> None:
    against = sorted(
        f"{a} (stage {stage_of(a)}) imports {b} (stage {stage_of(b)})"
        for a, deps in graph().items()
        for b in deps
        if stage_of(b) > stage_of(a)
    )
    assert against == []


def test_no_import_cycle() -> None:
    edges = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(edges[node]):
            if state.get(dep) == 1:
                cycles.append([*path[path.index(dep) :], dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[node] = 2

    for start in sorted(edges):
        if start not in state:
            visit(start, [start])
    assert [" -> ".join(c) for c in cycles] == []


def test_the_checks_see_type_checking_and_function_level_imports(tmp_path: Path) -> None:
    """The reader finds the imports that matter most here: inside `if TYPE_CHECKING:` and functions."""
    source = tmp_path / "xtune_probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from xtune.cli import main\n"
        "def f() -> None:\n    import xtune.firmware.build\n"
        "    from xtune.tuning import task_scheduler\n"
        "    from . import cli\n",
        encoding="utf-8",
    )
    known = {"xtune.cli", "xtune.firmware.build", "xtune.tuning", "xtune.tuning.task_scheduler"}
    assert imports(source, known, here="xtune.probe") == known - {"xtune.tuning"}


@pytest.mark.parametrize("module", ["xtune.graph", "xtune.version"])
def test_foundations_import_nothing_of_later_stages(module: str) -> None:
    """The network IR is pure data (no onnx), the version a constant."""
    path = modules()[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(name == "onnx" or name.startswith("onnx.") for name in names)
    assert all(stage_of(dep) <= stage_of(module) for dep in imports(path, set(modules())))
