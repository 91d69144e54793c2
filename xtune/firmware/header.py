"""Text a model or a user chose, in: the same text made safe out, for a generated C header (`c_comment`)
and for a terminal (`printable`).

A model file names its tensors and nodes with any string; in a header comment, `*/` would end the
comment and let the rest of the name be compiled (C11 6.4.9: a comment ends at the first `*/`), and
`/*` inside one trips gcc's -Wcomment. On a terminal, control characters would be obeyed (ECMA-48 escape
sequences move the cursor, retitle the window, hide text). So such text is escaped wherever it goes."""

from __future__ import annotations

import re

# Between a '*' and a '/' (either order): the two characters that would open or close a comment.
_COMMENT_DELIMITER = re.compile(r"(?<=\*)(?=/)|(?<=/)(?=\*)")


def printable(text: str) -> str:
    """`text` with every character that is not printable (str.isprintable: controls, separators other
    than the space, unassigned code points) shown as \\xNN, \\uNNNN or \\UNNNNNNNN."""
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)


def c_comment(text: str) -> str:
    """`text` as it may stand inside a C block comment: printable ASCII only (anything else escaped as by
    `printable`, so a header stays ASCII and each comment line one line), with a backslash between any
    '*' and '/' next to each other, so that it neither ends the comment nor opens another."""
    ascii_only = "".join(ch if " " <= ch <= "~" else _escape(ch) for ch in text)
    return _COMMENT_DELIMITER.sub(r"\\", ascii_only)


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
