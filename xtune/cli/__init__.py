"""The command line: argv in, library calls and a table or one JSON object out; errors: one line, exit 2.

The commands live by what they serve: `boards` (targets, boards, deploy), `tune`, `kernels` (bench, build,
best, report, model), `networks` (tasks, --model builds and benches), `progress` (bars and printers),
`parser` (every flag), `common` (argparse types, defaults, JSON, warnings).
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence

from xtune.cli.common import Handler
from xtune.cli.parser import build_parser
from xtune.errors import XtuneError

__all__ = ["build_parser", "main"]


def _show_warning(message: Warning | str, category: type[Warning], *_: object, **__: object) -> None:
    """Every warning as one line (Python's default format adds the source line that raised it)."""
    text = " ".join(str(message).split())
    print(f"xtune: warning: {text}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    with warnings.catch_warnings():  # restored on return: main() may run in a caller's process
        warnings.simplefilter("default")  # each warning once per run (and a fresh registry per call)
        warnings.showwarning = _show_warning
        args = build_parser().parse_args(argv)
        handler: Handler = args.handler
        return _run(handler, args)


def _run(handler: Handler, args: argparse.Namespace) -> int:
    try:
        return handler(args)
    except XtuneError as err:
        print(f"xtune: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    except MemoryError:
        print("xtune: error: out of memory (a workload's tensors are bounded, see README.md; "
              "their sum may still exceed this machine's)", file=sys.stderr)  # fmt: skip
        return 2
    except KeyboardInterrupt:
        print("xtune: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`xtune report log | head`): not an error of ours. Point stdout at
        # /dev/null so that the interpreter's final flush does not raise again (Python docs, "SIGPIPE").
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
