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
    from ortlab.options import Options
    from ortlab.run import Run


class Driver(Protocol):
    """Bursts and evidence for the verdict on two runs of one model and snapshot."""

    @property
    def shell_options(self) -> Options | None:
        """The options every burst starts from (a config's own options win)."""
        ...

    def evidence_burst(self, config: BurstConfig) -> Run:
        """A burst of `config` that is evidence only (a noise pair, localizing statistics): not kept among the
        runs the user made; InputError for a backend that does not run here."""
        ...

    def check(self, fixes: Any = "auto", options: Options | dict | None = None) -> CheckReport:
        """`ortlab check` of the model with these options: what blocks ORTModule and the fixes that remove it."""
        ...

    def gradient_evidence(self, config: BurstConfig, fixes: tuple[str, ...], burst: bool = False) -> dict[str, Any]:
        """The first step's gradients on PyTorch and on `config`'s backend, judged against float64 where they are
        not allclose (GradientCheck.to_dict()); with `burst`, also the burst in float64 ("float64")."""
        ...

    def ensemble_evidence(self, config: BurstConfig, fixes: tuple[str, ...], hints: dict[str, Any] | None = None
                          ) -> dict[str, Any]:
        """fp32 runs of `config`'s steps whose rounding differs from PyTorch's (ortlab.verdict.ensemble;
        `hints`: where they start and stop): their losses and end states."""
        ...

    def localization(self, config: BurstConfig, fixes: tuple[str, ...], progress: Callable | None = None,
                     folder: str | None = None, known: dict[str, Any] | None = None, origin: str = ""
                     ) -> dict[str, Any]:
        """The smallest module whose ORTModule run alone reproduces the first step's gradient divergence
        (Localization.to_dict(); ortlab.verdict.localize), its repro written into `folder` when given."""
        ...
