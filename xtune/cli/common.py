"""Shared pieces of the command line: argparse types and flag ranges, option defaults, JSON, warnings."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import math
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

Handler = Callable[[argparse.Namespace], int]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Command:
    """A subcommand's handler by module and function name, imported only when the command runs: building the
    parser (`--help`, `--version`, a mistyped flag) then loads none of the commands' libraries."""

    module: str  # e.g. "xtune.cli.tune"
    function: str  # e.g. "cmd_tune", a Handler
    # The libraries the handler imports first thing (xgboost, scipy, paramiko, onnx behind them), loaded by
    # `resolve` so that `main` imports them with Ctrl-C held, as it imports the parser: a KeyboardInterrupt
    # inside an extension module's initialization can leave CPython to end the process by SIGINT after
    # xtune's own "interrupted" line, and numpy's import turns one into an ImportError.
    loads: tuple[str, ...] = ()

    def resolve(self) -> Handler:
        for name in self.loads:
            importlib.import_module(name)
        handler: Handler = getattr(importlib.import_module(self.module), self.function)
        return handler


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


# Flag ranges: what the agent protocol's u32 fields carry (xtune/agent_src/PROTOCOL.md: repeat <= MAX_REPEAT,
# timeout_ms >= 1) and what numpy and xgboost take as seeds and thread counts. A flag outside its range is
# one usage line and exit 2 here, not a ValueError from deep inside a run.
U32 = 2**32 - 1


def _int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an ASCII decimal integer in [low, high]."""

    def parse(text: str) -> int:
        digits = text[1:] if text.startswith("-") else text
        if not (digits.isascii() and digits.isdigit()) or len(digits) > 20:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer in {low}..{high}")
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} is outside {low}..{high}")
        return value

    return parse


def _float_in(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a finite number in [low, high] (no nan, no inf)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(f"{text} is outside {low:g}..{high:g}")
        return value

    return parse


def one_line(text: str) -> str:
    """A message as one terminal line: whitespace runs (newlines too) as one space, then what a terminal
    would obey (escape sequences, other controls) shown escaped, as names from a model may hold them."""
    from xtune.firmware.header import printable

    return printable(" ".join(text.split()))


def _emit_json(obj: object) -> None:
    sys.stdout.write(json.dumps(obj, indent=None, sort_keys=False) + "\n")


@contextlib.contextmanager
def _warnings_unless_error() -> Iterator[None]:
    """Warnings raised in the block are shown (one line each, see `_show_warning`) only if it ends
    well: when it raises, the error line alone says what went wrong (a log whose every line is unreadable
    is one error, not a warning per line and then an error)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def _defaults(options: type) -> dict[str, Any]:
    """The field defaults of an options dataclass (TuneOptions, MeasureOptions, TrainOptions): the one home
    of every default the CLI offers, so a flag left out means what the library means."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(options):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out
