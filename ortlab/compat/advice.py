"""Which fixes to name: a fix is named on a blocker only when exporting again with it removed that blocker, a fix
already applied is never named again, and a blocker no fix removes says so, with what a person can do instead.
`ortlab check`, a failed burst's hint and the Lab's check table all read this one verified list."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ortlab.compat import registry
from ortlab.compat.blockers import (
    BAKED_INPUT,
    BUFFER_UPDATE,
    EXPORT_FAILED,
    FROZEN_FLOW,
    INVALID_TYPE,
    NO_GRADIENT,
    NO_GRADIENT_KERNEL,
    NO_KERNEL,
    ORT_FAILED,
    UNSUPPORTED_OP,
    UNSUPPORTED_OUTPUT,
    WRONG_GRADIENT,
    Blocker,
)

REMEDIES = {
    UNSUPPORTED_OP: "no ortlab fix: write this line with operators the exporter converts, or register an exporter "
                    "symbolic for it (torch.onnx.register_custom_op_symbolic)",
    EXPORT_FAILED: "the exporter could not trace the model: see the message; data-dependent Python in forward "
                   "is the usual cause",
    UNSUPPORTED_OUTPUT: "return only tensors (in tuples, lists, dicts or ModelOutputs) from forward, or keep this "
                        "output out of the module ORTModule wraps",
    INVALID_TYPE: "no ortlab fix: cast the input to a type ORT accepts for this operator before it",
    NO_KERNEL: "no ortlab fix: ORT 1.19.2 has no CPU kernel for it; write it with other operators",
    NO_GRADIENT: "no ortlab fix: ORT 1.19.2 cannot build its gradient; write it with operators that have one, or "
                 "keep this module out of ORTModule",
    NO_GRADIENT_KERNEL: "no ortlab fix: ORT 1.19.2 has no CPU kernel for its gradient; write it with other "
                        "operators",
    ORT_FAILED: "no ortlab fix known for this failure: write the named line with other operators, or keep its "
                "module out of ORTModule",
    WRONG_GRADIENT: "no ortlab fix known for this pattern: `ortlab burst --backend both --collect stats` and "
                    "`ortlab diff` find the first operator whose gradient differs",
    BAKED_INPUT: "keep the argument the same in every step, or pass it as a tensor the model computes with",
    FROZEN_FLOW: "no ortlab fix: write the branch with tensors (torch.where), keep values as tensors instead of "
                 ".item()/int(), or move the decision out of the model's forward",
    BUFFER_UPDATE: "update the buffers outside the model's forward",
}
PARAMETER_REMEDY = ("no ortlab fix: change the parameters outside the model's forward (for Embedding's max_norm: "
                    "renormalize the weight's rows with torch.no_grad() after each optimizer step) or drop max_norm")
ROUNDS = 3  # exports with more fixes: a fix can uncover a blocker another fix removes


def recommend(blockers: list[Blocker], model: Any, applied: tuple[str, ...] | list[str] = ()) -> list[str]:
    """Attach to each blocker the fixes that claim to remove it, other than those `applied` or already tried on it
    (or the remedy in words where none is left); the fixes, in registry order. Unverified: `verified` exports
    again with them."""
    chosen: list[str] = []
    for b in blockers:
        b.fixes = [f for f in registry.for_blocker(b, model) if f not in applied and f not in b.tried]
        _annotate(b)
        chosen += [f for f in b.fixes if f not in chosen]
    return [f for f in registry.FIXES if f in chosen]


def _annotate(b: Blocker) -> None:
    """Whether ORT has what is missing on CUDA, and the remedy when no fix is named."""
    from ortlab.compat.known import known

    found = known(b.op)
    b.cuda = found.cuda if found else b.cuda
    if b.fixes:
        b.remedy = None
        return
    remedy = (f"no ortlab fix: {found.alternative}" if found else PARAMETER_REMEDY
              if (b.kind, b.op) == (BUFFER_UPDATE, "parameters") else b.remedy or REMEDIES.get(b.kind))
    if b.tried and remedy:
        tried = ", ".join(b.tried)
        remedy = (f"no ortlab fix removes it ({tried} tried: still there when exported again with "
                  f"{'it' if len(b.tried) == 1 else 'them'}); " + remedy.removeprefix("no ortlab fix: "))
    b.remedy = remedy


def confirm(before: list[Blocker], after: list[Blocker]) -> list[str]:
    """Drop from each blocker of `before` the fixes it still has in `after` (exported with them): they are tried,
    not named; the fixes left named on some blocker, in registry order."""
    left = {b.key for b in after}
    kept: list[str] = []
    for b in before:
        if b.fixes and b.key in left:
            b.tried = [*b.tried, *(f for f in b.fixes if f not in b.tried)]
            b.fixes = []
            _annotate(b)
        kept += b.fixes
    return [f for f in registry.FIXES if f in kept]


def verified(model: Any, inputs: Any, found: Any, opset: int = 17, log: Path | None = None,
             applied: tuple[str, ...] | list[str] = ()) -> tuple[list[str], Any, list[Blocker]]:
    """The fixes that remove what `found` (check.find's result, with the fixes `applied` in effect) holds, each
    verified by exporting again (`check.find`) with it: (the fixes, in registry order; what find sees with them;
    every blocker met, those the fixes uncovered after the first). Blockers keep only the fixes that removed
    them and name the ones tried."""
    from ortlab.compat.check import find

    chosen: list[str] = []
    seen = list(found.blockers)
    for _ in range(ROUNDS):
        names = recommend(found.blockers, model, [*applied, *chosen])
        if not names:
            break
        with registry.applied(model, [*chosen, *names]):
            after = find(model, inputs, opset, log)
        kept = confirm(found.blockers, after.blockers)
        if not kept:
            break  # nothing removed: what `found` holds stands
        if kept != names:  # what is left is what the fixes that work leave
            with registry.applied(model, [*chosen, *kept]):
                after = find(model, inputs, opset, log)
        chosen = [f for f in registry.FIXES if f in chosen or f in kept]
        tried = {b.key: b.tried for b in found.blockers if b.tried}
        for b in after.blockers:
            b.tried = tried.get(b.key, b.tried)
        seen += [b for b in after.blockers if b.key not in {x.key for x in seen}]
        found = after
    recommend(found.blockers, model, [*applied, *chosen])  # what is left: named fixes are tried ones' remedies
    for b in found.blockers:
        if b.fixes:  # named but not verified (the rounds ran out): not named
            b.fixes = []
            _annotate(b)
    return chosen, found, seen
