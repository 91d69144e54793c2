"""The one root error type of xtune and its few kinds; the CLI turns any of them into one line and exit 2."""


class XtuneError(Exception):
    """Root of every error xtune raises on purpose."""


class InputError(XtuneError):
    """A user's mistake: unknown name, bad shape, malformed option or file."""


class CompileError(XtuneError):
    """LLVM refused or crashed on a module."""


class LinkError(XtuneError):
    """An object cannot become a flat image or artifact (undefined symbol, relocation, writable data)."""


class BoardError(XtuneError):
    """A board cannot be reached, refused us, or its agent misbehaved."""
