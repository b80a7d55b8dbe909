"""The way from the floors below up to the verdict. `Session.judge`, `gradient_check` and `localize`
(ortlab.engine.session) are the verdict's procedure run on the session, and `check` (ortlab.compat.check) judges its
ORTModule training step's gradients as the verdict judges a first step; the verdict (ortlab.verdict.procedure)
stands floors above both. So neither names it: the package (`ortlab/__init__.py`, which Python runs before any of its
modules) registers the procedure here as it loads, and they ask for it when they need it. A leaf: it imports
nothing of ortlab."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class Verdicts(Protocol):
    """What the Session's verdict methods call, each with the session as the verdict's Driver."""

    def judge(self, session: Any, pytorch: Any, other: Any) -> Any:
        """The Verdict on `other` against `pytorch`, two runs of `session` (Session.judge)."""
        ...

    def judge_distributed(self, session: Any, run: Any) -> Any:
        """The Verdict on a distributed run against one process of the same global batch (Session.burst)."""
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


_provider: Callable[[], Verdicts] | None = None


def serve(provider: Callable[[], Verdicts]) -> None:
    """Register what answers the Session's verdict methods (called once, by the package as it loads)."""
    global _provider
    _provider = provider


def verdicts() -> Verdicts:
    """The registered procedure (loaded on first use)."""
    if _provider is None:  # only where ortlab's package did not load: a broken install
        raise RuntimeError("no verdict procedure is registered: import ortlab (its package registers it)")
    return _provider()
