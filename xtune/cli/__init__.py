"""The command line: argv in, library calls and a table or one JSON object out; errors: one line, exit 2.

The commands live by what they serve: `boards` (targets, boards, deploy), `tune`, `kernels` (bench, build,
best, report, model), `networks` (tasks, --model builds and benches), `progress` (bars and printers),
`parser` (every flag), `common` (argparse types, defaults, JSON, warnings).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import warnings
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import TYPE_CHECKING

from xtune.cli.common import Command, Handler, one_line
from xtune.errors import XtuneError

if TYPE_CHECKING:
    from xtune.cli.parser import build_parser

__all__ = ["build_parser", "main"]


def __getattr__(name: str) -> object:
    """`build_parser`, imported on first use: the parser imports numpy, which `main` does inside its
    Ctrl-C handling."""
    if name == "build_parser":
        from xtune.cli.parser import build_parser

        return build_parser
    raise AttributeError(f"module 'xtune.cli' has no attribute '{name}'")


def _show_warning(message: Warning | str, category: type[Warning], *_: object, **__: object) -> None:
    """Every warning as one line (Python's default format adds the source line that raised it)."""
    print(f"xtune: warning: {one_line(str(message))}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    with warnings.catch_warnings(), _terminate_as_interrupt():  # restored on return: main() may run in a
        warnings.simplefilter("default")  # caller's process; each warning once per run (a fresh registry)
        warnings.showwarning = _show_warning
        try:
            with _signals_held():
                from xtune.cli.parser import build_parser  # numpy and the options' defaults
            args = build_parser().parse_args(argv)
            command: Command = args.handler
            with _signals_held():
                handler: Handler = command.resolve()  # its module and first libraries (Command.loads)
        except KeyboardInterrupt:
            print("xtune: interrupted", file=sys.stderr)
            return 130
        return _run(handler, args)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held back (pthread_sigmask(3)) for the block, then delivered: numpy's import
    turns a KeyboardInterrupt raised inside it into an ImportError with its own traceback (it imports its
    C modules through PyCapsule_Import), so Ctrl-C during the imports is taken right after them."""
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (kill, a service manager stopping xtune) handled as Ctrl-C is: the run stops where it is,
    its compile pool is shut down (no leaked semaphores for multiprocessing's resource tracker to warn
    about), every finished measurement stays in the log, exit status 130. Only from the main thread,
    where Python runs signal handlers; the caller's handler is restored on return."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(handler: Handler, args: argparse.Namespace) -> int:
    try:
        return handler(args)
    except XtuneError as err:
        print(f"xtune: error: {one_line(str(err))}", file=sys.stderr)
        return 2
    except MemoryError:
        print(
            "xtune: error: out of memory (a workload's tensors are bounded, see README.md; "
            "their sum may still exceed this machine's)",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print("xtune: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`xtune report log | head`): not an error of ours. Point stdout at
        # /dev/null so that the interpreter's final flush does not raise again (Python docs, "SIGPIPE").
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
