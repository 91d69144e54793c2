"""Output files: the one home for checking an output path up front and replacing a file atomically.

Every file xtune writes (objects, headers, archives, model files, plots, cached agents and fingerprints)
goes through `write_atomic` or `replace_atomic`: the new content is written beside the target, made
durable, then renamed over it, so a reader sees the old file or the new one, never half of one. A rename
replaces whatever the name pointed at, so it is only ever done over a regular file or nothing: a device
node (`-o /dev/full`), a FIFO or a directory is refused, never turned into a regular file."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

from xtune.errors import InputError

PathLike = str | os.PathLike[str]


def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def check_input(path: PathLike, what: str = "input") -> Path:
    """The resolved `path` if it names an existing regular file, else InputError naming `what` and why.

    Called before the file is opened: opening a FIFO for reading blocks until a writer comes (fifo(7)),
    and a device or a directory is no model or log."""
    given = str(path)
    real = Path(os.path.realpath(path)) if given else Path()
    try:
        mode = os.stat(real).st_mode if given else None
    except FileNotFoundError:
        mode = None
    except OSError as e:
        raise InputError(f"cannot read the {what} {given}: {e.strerror}") from None
    if mode is None:
        raise InputError(f"{given}: no such {what}")
    if not stat.S_ISREG(mode):
        raise InputError(f"cannot read the {what} {given}: it is {_kind(mode)}, not a regular file")
    return real


def check_paths(
    outputs: Sequence[tuple[PathLike | None, str]],
    inputs: Sequence[tuple[PathLike | None, str]] = (),
    append: bool = False,
) -> None:
    """Every (path, what) of `outputs` can be written (`check_output`; `append`: they are logs appended
    to), no two of them are one file, and none is one of the `inputs`: the same file after resolving
    links and hard links (st_dev and st_ino), so a command never writes over what it reads. Absent
    entries (None) are skipped; a missing input is left to its reader to report."""
    seen: dict[tuple[int, int] | Path, str] = {}
    for path, what in inputs:
        found = _identity(Path(os.path.realpath(path))) if path is not None else None
        if found is not None:
            seen.setdefault(found, f"the {what} {path}")
    for path, what in outputs:
        if path is None:
            continue
        real = check_output(path, what, append)
        key: tuple[int, int] | Path = _identity(real) or real
        if key in seen:
            raise InputError(
                f"the {what} {path} is {seen[key]}: an output may not be an input or another output"
            )
        seen[key] = f"the {what} {path}"


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _writable(path: Path, st: os.stat_result) -> bool:
    """`path` may be written by this process by its mode bits, for root too: root passes access(2)'s
    permission checks (CAP_DAC_OVERRIDE, capabilities(7)), so a file or folder whose owner made it
    read-only (no write bit for anyone) is refused by its bits; access(2) still says no for a read-only
    mount, or for anyone else by the bits that apply to them."""
    if not os.access(path, os.W_OK):
        return False
    return os.geteuid() != 0 or bool(st.st_mode & 0o222)


def check_output(path: PathLike, what: str = "output", append: bool = False) -> Path:
    """The resolved `path` if a file can be written there, else InputError naming `what` and why.

    Called before the work that produces the file, so that a typo costs nothing: the folder must exist
    and be writable, and the name must be missing or a writable regular file (symlinks are followed).
    With `append` (a tuning log) an existing writable file is enough: nothing is created beside it."""
    given = str(path)
    if not given or given.endswith(os.sep):
        raise InputError(f"cannot write the {what} {given!r}: not a file name")
    real = Path(os.path.realpath(path))
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as e:
        raise InputError(f"cannot write the {what} {given}: {e.strerror}") from None
    if mode is not None and not stat.S_ISREG(mode):
        raise InputError(f"cannot write the {what} {given}: it is {_kind(mode)}, not a regular file")
    folder = real.parent
    if not folder.is_dir():
        raise InputError(f"cannot write the {what} {given}: no directory {folder}")
    if not (append and mode is not None) and not (
        os.access(folder, os.X_OK) and _writable(folder, os.stat(folder))
    ):
        raise InputError(f"cannot write the {what} {given}: the directory {folder} is not writable")
    if mode is not None and not _writable(real, os.stat(real)):
        raise InputError(f"cannot write the {what} {given}: the file is not writable")
    return real


def replace_atomic(partial: PathLike, path: PathLike, what: str = "output") -> None:
    """Rename the finished file `partial` (in the same folder) over `path`, a regular file or nothing."""
    real = check_output(path, what)
    try:
        os.replace(partial, real)
    except OSError as e:
        raise InputError(f"cannot write the {what} {path}: {e.strerror or e}") from None


def write_atomic(path: PathLike, data: bytes | str, what: str = "output", mode: int | None = None) -> None:
    """Write `data` to `path` atomically and durably (text as UTF-8), or raise InputError and leave no trace.

    `mode` defaults to the replaced file's permissions, else to 0o666 less the umask (as open() would)."""
    write_all_atomic([(path, data, what)], mode)


def write_all_atomic(files: Sequence[tuple[PathLike, bytes | str, str]], mode: int | None = None) -> None:
    """Write several (path, data, what) files: every one is written and made durable beside its target
    before the first is renamed over its target, so a failure while writing (a full disk) leaves all
    the old files as they were, never a new object with an old header."""
    partials: list[tuple[str, Path, str]] = []
    try:
        for path, data, what in files:
            real = check_output(path, what)
            partials.append((_write_partial(real, data, what, mode), real, what))
        for partial, real, what in partials:
            replace_atomic(partial, real, what)
    finally:
        for partial, _, _ in partials:
            if os.path.exists(partial):
                os.unlink(partial)


def _write_partial(real: Path, data: bytes | str, what: str, mode: int | None) -> str:
    """A durable copy of `data` under a private name in `real`'s folder, with `real`'s permissions."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    if mode is None:
        mode = stat.S_IMODE(os.stat(real).st_mode) if real.exists() else 0o666 & ~_umask()
    try:
        fd, partial = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".tmp", dir=real.parent)
    except OSError as e:
        raise InputError(f"cannot write the {what} {real}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(partial, mode)
    except OSError as e:
        os.unlink(partial)
        raise InputError(f"cannot write the {what} {real}: {e.strerror or e}") from None
    return partial


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
