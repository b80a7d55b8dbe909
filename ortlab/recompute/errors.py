"""The recompute package's error."""

from ortlab.errors import InputError


class PlanError(InputError):
    """A plan id, dimension or run that cannot be used as asked; the message lists what is allowed."""
