"""ortlab's error classes: one base for bad input, so that every front end treats it the same way."""

import os
from collections.abc import Iterable


class OrtlabError(Exception):
    """Base of ortlab's own errors."""


class InputError(OrtlabError, ValueError):
    """Bad input: an argument, a value, or a file that is missing, unreadable or damaged. The message names the
    thing and what is allowed; the CLI prints it on one line and exits 2. Where the fix is typed differently on
    the command line (a flag where Python takes a keyword), `cli` is the same message in the CLI's words."""

    def __init__(self, *args, cli: str | None = None):
        super().__init__(*args)
        self.cli = cli

    @property
    def _render_traceback_(self):
        """How IPython shows this error in a notebook: one line, the class and the message, no frames of ortlab's
        (IPython calls `_render_traceback_()` when an exception has one). ORTLAB_TRACEBACK=1 shows the traceback."""
        if os.environ.get("ORTLAB_TRACEBACK"):
            raise AttributeError("_render_traceback_")  # hasattr() is False: IPython's usual traceback
        return lambda: [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self}".splitlines()[0] if str(self) else
                        type(self).__name__]


class OrtlabWarning(UserWarning):
    """Something the user should know about a result that is still given (the CLI prints it on one line)."""


def close_names(name: str, allowed: Iterable[str], cutoff: float = 0.6) -> list[str]:
    """Up to three of `allowed` that look like a mistyped `name` (difflib's ratio), best first."""
    import difflib

    return difflib.get_close_matches(name, list(allowed), n=3, cutoff=cutoff)


def did_you_mean(name: str, allowed: Iterable[str]) -> str:
    """"; did you mean a, b?" naming what `name` was probably meant to be, or "" when nothing is close: the tail of
    a bad-name message (an option, a backend), so every one suggests the same way."""
    close = close_names(name, allowed)
    return f"; did you mean {', '.join(close)}?" if close else ""
