"""The tune package's error."""

from ortlab.errors import InputError


class TuneError(InputError):
    """A goal, budget, option or model that `ortlab tune` cannot use as asked; the message says what is allowed."""
