"""The one error of the graphs views."""

from ortlab.errors import InputError


class GraphsError(InputError):
    """No stage files where they were looked for, or a stage, node, prefix or option that is not there."""
