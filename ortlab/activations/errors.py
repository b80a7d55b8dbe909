"""The errors of the activation-statistics views. Bad input is an `ActivationsError`, an InputError: the CLI
prints it on one line and exits 2. A burst that these tools ran themselves and that failed is a
`FailedBurstError`."""

from __future__ import annotations

from ortlab.errors import InputError, OrtlabError


class ActivationsError(InputError):
    """Bad input to compare, merge, noise_floor or bisect (a tolerance, a source, a folder): the message names
    it and what is allowed."""


class StatsError(ActivationsError):
    """Bad arguments of the "stats" collector, or a burst in which it could record nothing."""


class StatsFileError(ActivationsError):
    """A file or folder that holds no statistics ortlab can read; the message names it and why."""


class DumpError(ActivationsError):
    """One file of an ORT StatisticsSubscriber folder that cannot be read, and where: `line` is 1-based, 0
    when the whole file is the problem. read_dump lists them in `table.attrs["errors"]` and reads the rest."""

    def __init__(self, file: str, line: int, message: str):
        super().__init__(f"{file}:{line}: {message}" if line else f"{file}: {message}")
        self.file, self.line, self.message = file, line, message


class FailedBurstError(OrtlabError, RuntimeError):
    """A burst that bisect or the noise floor ran itself ended other than ok; the message names it and why."""
