"""The repository stands alone: no file points at notes outside it, and no merge left its markers."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OUTSIDE = re.compile(r"\.\./shared|MEASURED\.md|shared/DESIGN")
MARKER = re.compile(r"^(<<<<<<< |>>>>>>> |=======$)", re.MULTILINE)


def tracked_text_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    files = []
    for name in out.decode().split("\0"):
        path = ROOT / name
        if name and path.is_file() and not path.is_symlink() and path.suffix not in {".gz", ".png"}:
            files.append(path)
    return files


def test_no_file_cites_notes_outside_the_repository() -> None:
    """Facts the code and docs rest on are in docs/ (docs/notes.md), where a user can read them."""
    this = Path(__file__).resolve()
    citing = [
        str(p.relative_to(ROOT))
        for p in tracked_text_files()
        if p != this and OUTSIDE.search(p.read_text(encoding="utf-8", errors="replace"))
    ]
    assert citing == []


def test_no_file_holds_merge_conflict_markers() -> None:
    marked = [
        str(p.relative_to(ROOT))
        for p in tracked_text_files()
        if MARKER.search(p.read_text(encoding="utf-8", errors="replace"))
    ]
    assert marked == []
