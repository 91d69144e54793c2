"""The one root error type of xtune and its few kinds; the CLI turns any of them into one line and exit 2."""

from __future__ import annotations

from enum import Enum


class XtuneError(Exception):
    """Root of every error xtune raises on purpose."""


class XtuneWarning(UserWarning):
    """Root of xtune's warnings; the CLI prints each as one "xtune: warning:" line on stderr."""


class InputError(XtuneError):
    """A user's mistake: unknown name, bad shape, malformed option or file."""


class CompileError(XtuneError):
    """LLVM refused or crashed on a module."""


class LinkError(XtuneError):
    """An object cannot become a flat image or artifact (undefined symbol, relocation, writable data)."""


class BoardFault(Enum):
    """Why a board failed: what the retry and stop decisions look at, never the message text."""

    AUTHENTICATION = "authentication"  # our key was refused, or is encrypted without ssh-agent
    HOST_KEY = "host key"  # unknown or changed host key: only the user can decide to trust it
    REFUSED = "refused"  # the TCP connection was refused or the host is unreachable
    LOST = "lost"  # an established connection or agent channel dropped
    TIMEOUT = "timeout"  # no TCP connect, SSH banner or reply in time
    AGENT_GONE = "agent gone"  # the agent cannot be started or speaks another protocol: redeploy
    AGENT = "agent"  # the agent refused or garbled one request; the session is restarted
    COST_MODEL = "cost model"  # llvm-mca cannot cost the kernel's code: no retry would help


# Faults that go away by themselves (a reboot, a network blip, a busy board): retried, a bounded number
# of times (docs/boards.md, "Faults"). The others need the user: the run stops at once.
TRANSIENT_FAULTS = frozenset({BoardFault.REFUSED, BoardFault.LOST, BoardFault.TIMEOUT, BoardFault.AGENT})


class BoardError(XtuneError):
    """A board cannot be reached, refused us, or its agent misbehaved; `kind` says which.

    `transient` is True when retrying may help; a retry loop that gave up re-raises with it False
    (`gave_up`), and a run stops on any BoardError that is not transient."""

    def __init__(self, message: str, kind: BoardFault = BoardFault.AGENT, transient: bool | None = None):
        super().__init__(message)
        self.kind = kind
        self.transient = kind in TRANSIENT_FAULTS if transient is None else transient

    def gave_up(self, suffix: str) -> BoardError:
        """The same fault after the retries ran out: no longer transient."""
        return BoardError(f"{self}{suffix}", self.kind, transient=False)
