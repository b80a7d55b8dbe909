"""The way from the floors below up to the verdict. `Session.judge`, `gradient_check` and `localize`
(ortlab.engine.session) are the verdict's procedure run on the session, and `check` (ortlab.compat.check) judges its
ORTModule training step's gradients as the verdict judges a first step; the verdict (ortlab.verdict.procedure)
stands floors above both. So neither names it: they ask `verdicts()` here, which imports the procedure's module
(PROCEDURE) when first asked, typed as the `Verdicts` Protocol it must satisfy; mypy holds the module to it
(tests/test_types.py), as it holds the registries' references. A leaf: it imports nothing of ortlab."""

from __future__ import annotations

import importlib
from typing import Any, Protocol, cast

PROCEDURE = "ortlab.verdict.procedure"  # the module that answers the Session's verdict methods and check's judgement


class Verdicts(Protocol):
    """What the Session's verdict methods call, each with the session as the verdict's Driver."""

    def judge(self, session: Any, pytorch: Any, other: Any) -> Any:
        """The Verdict on `other` against `pytorch`, two runs of `session` (Session.judge)."""
        ...

    def judge_distributed(self, session: Any, run: Any) -> Any:
        """The Verdict on a distributed run against one process of the same global batch (Session.burst)."""
        ...

    def reference_ahead(self, config: Any, float64: str) -> list[tuple[str, dict[str, Any]]]:
        """The tasks (and their arguments) that make a distributed parity burst's one-process reference while its
        ranks run, in order (the first always, each further one while the ranks still run; Session.burst)."""
        ...

    def gradient_check(self, session: Any, options: Any = None, fixes: Any = (), parity: bool = True, seed: int = 0
                       ) -> dict[str, Any]:
        """The first batch's gradients judged (Session.gradient_check)."""
        ...

    def step_gradients(self, workload: Any, fixes: Any, log: Any, runner: Any, batch: Any) -> Any:
        """One training step's gradients through `runner` beside PyTorch's, judged (a GradientCheck: agree,
        worst, forward_agrees): check's judgement of its ORTModule step."""
        ...

    def gradient_words(self, row: dict[str, Any]) -> str:
        """A gradient row of that judgement in words."""
        ...

    def localize_module(self, session: Any, options: Any = None, fixes: Any = (), seed: int = 0,
                        progress: Any = None, repro: Any = None, known: dict[str, Any] | None = None,
                        origin: str = "", backend: str = "ortmodule", compile: dict[str, Any] | None = None) -> Any:
        """The smallest module that reproduces the gradient divergence on the backend (Session.localize)."""
        ...


def verdicts() -> Verdicts:
    """The verdict's procedure (its module imported on first use: it imports torch)."""
    return cast(Verdicts, importlib.import_module(PROCEDURE))
