"""ortlab's error classes: one base for bad input, so that every front end treats it the same way."""


class OrtlabError(Exception):
    """Base of ortlab's own errors."""


class InputError(OrtlabError, ValueError):
    """Bad input: an argument, a value, or a file that is missing, unreadable or damaged. The message names the
    thing and what is allowed; the CLI prints it on one line and exits 2. Where the fix is typed differently on
    the command line (a flag where Python takes a keyword), `cli` is the same message in the CLI's words."""

    def __init__(self, *args, cli: str | None = None):
        super().__init__(*args)
        self.cli = cli


class OrtlabWarning(UserWarning):
    """Something the user should know about a result that is still given (the CLI prints it on one line)."""
