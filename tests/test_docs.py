"""docs/design.md's module list against the package: every module under xtune/ named there once, with one
line, no line naming a module that is gone, and the stages in the order of tests/test_imports.py; and no
module path cited anywhere on the page that does not exist."""

from __future__ import annotations

import re
from pathlib import Path

from .test_imports import PACKAGE, STAGES, module_name, modules, stage_of

DESIGN = PACKAGE.parent / "docs" / "design.md"
SECTION = "## Modules, by stage"
ENTRY = re.compile(r"^- `(xtune/[\w/]+\.py)` — \S")


def listed(text: str) -> list[str]:
    """The module paths the section names, in its order: one `- `path` — what in → what out` line each."""
    start = text.index(SECTION) + len(SECTION)
    end = text.find("\n## ", start)
    section = text[start : end if end >= 0 else len(text)]
    return [m.group(1) for line in section.splitlines() if (m := ENTRY.match(line))]


def named() -> list[str]:
    return listed(DESIGN.read_text(encoding="utf-8"))


def as_module(path: str) -> str:
    return module_name(PACKAGE.parent / path)


def test_every_module_is_named_once() -> None:
    paths = named()
    on_disk = {str(p.relative_to(PACKAGE.parent)) for p in modules().values()}
    assert sorted(on_disk - set(paths)) == [], "modules missing from docs/design.md"
    assert sorted(set(paths) - on_disk) == [], "docs/design.md names modules that do not exist"
    assert sorted(p for p in set(paths) if paths.count(p) > 1) == []


def test_the_list_follows_the_stage_order() -> None:
    paths = named()
    stages = [stage_of(as_module(p)) for p in paths]
    out_of_order = [p for p, a, b in zip(paths[1:], stages, stages[1:], strict=False) if b < a]
    assert out_of_order == []
    assert sorted(set(stages)) == list(range(len(STAGES)))  # every stage has its group


def test_the_reader_sees_a_missing_or_stale_line() -> None:
    """The check can fail: a module left out, or a line for a module that is gone, changes what it reads."""
    text = DESIGN.read_text(encoding="utf-8")
    first = named()[0]
    without = "\n".join(line for line in text.splitlines() if not line.startswith(f"- `{first}`"))
    assert first not in listed(without)
    stale = text.replace(SECTION + "\n", SECTION + "\n\n- `xtune/gone.py` — nothing → nothing\n", 1)
    assert "xtune/gone.py" in listed(stale)
    assert Path(PACKAGE / first.removeprefix("xtune/")).exists()


def test_every_module_path_the_page_cites_exists() -> None:
    """Prose elsewhere on the page ("`firmware/build.py` writes one LLVM module") names modules too."""
    text = DESIGN.read_text(encoding="utf-8")
    stages = "|".join(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    cited = set(re.findall(r"\bxtune/[\w/]+\.py\b", text))
    cited |= {f"xtune/{p}" for p in re.findall(rf"(?<![\w/])((?:{stages})/[\w/]+\.py)\b", text)}
    assert sorted(p for p in cited if not (PACKAGE.parent / p).exists()) == []
