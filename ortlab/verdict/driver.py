"""What the verdict's procedure asks of whoever holds the model (ortlab.verdict.procedure, repro): the bursts and
the evidence, each one call. A Session drives them in its worker or in this process; ortlab.verdict.folders answers
them for two run folders made elsewhere, from their records and a session here. The procedure knows no more of
either than this."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ortlab.compat.report import CheckReport
    from ortlab.engine.config import BurstConfig
    from ortlab.engine.types import Float64
    from ortlab.options import Options
    from ortlab.runs.run import Run


class Driver(Protocol):
    """Bursts and evidence for the verdict on two runs of one model and snapshot."""

    @property
    def shell_options(self) -> Options | None:
        """The options every burst starts from (a config's own options win)."""
        ...

    @property
    def float64(self) -> Float64 | str:
        """Whether the verdict runs its float64 burst (ortlab.verdict.cost)."""
        ...

    def evidence_burst(self, config: BurstConfig) -> Run:
        """A burst of `config` that is evidence only (a noise pair, localizing statistics): not kept among the
        runs the user made; InputError for a backend that does not run here."""
        ...

    def check(self, fixes: Any = "auto", options: Options | dict | None = None) -> CheckReport:
        """`ortlab check` of the model with these options: what blocks ORTModule and the fixes that remove it."""
        ...

    def evidence(self, task: str, config: BurstConfig, what: str, progress: Callable | None = None,
                 **kwargs: Any) -> dict[str, Any]:
        """What `task` computes where the model is (ortlab.verdict.tasks: the gradient check, fp32's spread, the
        localization, each named "module:function"), for `config`, with `kwargs`: its plain-data answer. `what`
        names it while it runs; `progress(count, row)` for each step it reports."""
        ...
