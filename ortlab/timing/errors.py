"""The time collector's and the time tables' bad input."""

from ortlab.errors import InputError


class TimeError(InputError):
    """Bad settings of the "time" collector, or a run without time data."""
