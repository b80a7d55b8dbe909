"""The first step's gradients of both backends, from the same state and batch, compared parameter by parameter:
the evidence that cannot be fooled by optimizer noise (a few AdamW steps can make correct runs drift apart,
and a forward can agree while ORT's backward is wrong).

Judged against exact arithmetic (ortlab.verdict.exact): when the other backend's gradients are not allclose to
PyTorch fp32's (the fast path), one float64 PyTorch step is the arbiter, and a parameter diverges only when the
other backend is measurably further from it than PyTorch fp32 is. A model that cannot run in float64 falls back
to the relative difference from PyTorch fp32, |g_ort - g_pt| / max(|g_pt|, FLOOR * |all gradients|), with a note.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortlab import _ort
from ortlab.runs.snapshot import kept

if TYPE_CHECKING:
    from ortlab.verdict.blockwise import Distances

FLOOR = 1e-4  # of the norm of all gradients: what a "zero" gradient is measured against (without float64)
AGREE = 1e-3  # without float64: the worst parameter's relative difference up to which the gradients agree
FLOAT64, ALLCLOSE, FP32 = "float64", "allclose", "pytorch fp32"  # what judged the gradients


@dataclass
class Step:
    """One forward and backward: the loss and every trained parameter's gradient (None: it got none)."""

    loss: float
    grads: dict[str, Any]


@dataclass
class GradientCheck:
    """The first step's gradients compared: one row per parameter, worst first. `judged_by`: float64 (each
    parameter's distance to a float64 step beside PyTorch fp32's), allclose (the fast path: no float64 step was
    needed) or pytorch fp32 (the model cannot run in float64: `notes` says why)."""

    rows: list[dict[str, Any]]
    loss_pytorch: float
    loss_ortmodule: float
    tolerance: float = AGREE
    fixes: list[str] = field(default_factory=list)
    judged_by: str = FP32
    loss_float64: float | None = None
    notes: list[str] = field(default_factory=list)
    members: list[dict] = field(default_factory=list)  # the fp32 ensemble's runs (ortlab.verdict.ensemble), if any
    float64: Any = field(default=None, repr=False)  # what the float64 step measured (blockwise.Distances), if any

    @property
    def worst(self) -> dict[str, Any] | None:
        return self.rows[0] if self.rows else None

    @property
    def agree(self) -> bool:
        if self.judged_by == FP32:
            return self.worst is None or self.worst["relative"] <= self.tolerance
        return not any(r.get("diverged") for r in self.rows)

    @property
    def forward_agrees(self) -> bool:
        if not math.isfinite(self.loss_ortmodule):
            return False
        if self.loss_float64 is not None:
            from ortlab.verdict.exact import judge_numbers

            return not judge_numbers([self.loss_ortmodule], [self.loss_pytorch], [self.loss_float64]).diverged
        scale = max(abs(self.loss_pytorch), 1.0)
        return abs(self.loss_ortmodule - self.loss_pytorch) <= 1e-4 * scale

    def table(self):
        import pandas as pd

        return pd.DataFrame(self.rows, columns=["parameter", "module", "relative", "difference", "pytorch_norm",
                                                "ortmodule_norm", "to_float64", "pytorch_to_float64", "allowed",
                                                "diverged", "note"])

    def to_dict(self) -> dict[str, Any]:
        from ortlab.verdict.exact import FACTOR

        out = {"agree": self.agree, "tolerance": self.tolerance, "judged_by": self.judged_by, "factor": FACTOR,
               "loss_pytorch": self.loss_pytorch, "loss_ortmodule": self.loss_ortmodule,
               "loss_float64": self.loss_float64, "forward_agrees": self.forward_agrees,
               "worst": self.rows[:5], "parameters": len(self.rows), "fixes": self.fixes, "notes": self.notes,
               "members": self.members, "garbage": sum(_garbage(r) for r in self.rows),
               "undecided": [r["parameter"] for r in self.rows if r.get("undecided")],
               "estimated": any(r.get("estimated") for r in self.rows)}
        if self.judged_by == FLOAT64:  # every parameter's two distances: what the Lab plots
            out["distances"] = [{k: r.get(k) for k in ("parameter", "to_float64", "pytorch_to_float64", "spread",
                                                       "allowed", "norm", "diverged")} for r in self.rows]
        return out


def compare(pytorch: Step, ortmodule: Step, tolerance: float = AGREE, fixes: list[str] | None = None,
            exact: Step | Distances | None = None, notes: list[str] | None = None,
            spread: dict[str, float] | None = None, members: list[dict[str, Any]] | None = None) -> GradientCheck:
    """Every parameter's gradient of both steps, worst first: judged against float64 when `exact` is given (the
    float64 step, or what a float64 step taken block by block measured of both: ortlab.verdict.blockwise), else
    against each other (allclose when every parameter is, else relative to PyTorch fp32's). `spread`: per
    parameter, the largest distance to float64 of the fp32 ensemble's `members`. A step's gradients may be
    summaries (ortlab.runs.sketch: a run recorded elsewhere): its distances are then estimates, and a parameter
    estimated within sketch.UNCERTAIN of what is allowed is undecided (neither diverged nor agreed)."""
    from ortlab.runs import sketch
    from ortlab.verdict import exact as ex

    measured = measured_against(exact, pytorch, ortmodule) if isinstance(exact, Step) else exact
    total = math.sqrt(sum(sketch.norm(g) ** 2 for g in pytorch.grads.values() if g is not None))
    scale = total if measured is None else measured.scale
    floor = FLOOR * total
    rows: list[dict[str, Any]] = []
    for name, g_pt in pytorch.grads.items():
        g_ort = ortmodule.grads.get(name)
        module = name.rpartition(".")[0]
        if g_pt is None and g_ort is None:
            continue
        if g_pt is None or g_ort is None:
            rows.append({"parameter": name, "module": module, "relative": math.inf, "difference": math.nan,
                         "pytorch_norm": None if g_pt is None else sketch.norm(g_pt),
                         "ortmodule_norm": None if g_ort is None else sketch.norm(g_ort), "diverged": True,
                         "note": f"only {'ORTModule' if g_pt is None else 'PyTorch'} gave it a gradient"})
            continue
        estimated = False
        if not sketch.finite(g_ort):
            note, diff = "not finite", math.inf
        else:
            diff, exact_here = sketch.distance(g_ort, g_pt, name)
            note, estimated = None, not exact_here
        pt_norm = sketch.norm(g_pt)
        reference = max(pt_norm, floor, 1e-30)
        row = {"parameter": name, "module": module, "relative": diff / reference, "difference": diff,
               "pytorch_norm": pt_norm, "ortmodule_norm": sketch.norm(g_ort), "note": note}
        if measured is not None and name in measured.norms:
            cand = measured.to.get(CANDIDATE, {}).get(name, math.inf)
            j = ex.decide(cand, measured.to.get(PYTORCH, {}).get(name, math.nan),
                          measured.norms[name], scale, spread=(spread or {}).get(name) if spread else None)
            row.update(to_float64=j.candidate, pytorch_to_float64=j.pytorch, allowed=j.allowed, norm=j.norm,
                       diverged=j.diverged or note is not None, **({"spread": j.spread} if spread else {}))
            if note is None and name in measured.estimated and _near(j.candidate, j.allowed):
                row.update(diverged=False, undecided=True, estimated=True)
            elif name in measured.estimated:
                row["estimated"] = True
        else:
            row["diverged"] = note is not None or not ex.within(diff, pt_norm)
            if estimated:
                row["estimated"] = True
        rows.append(row)
    if measured is not None:
        judged_by = FLOAT64
        rows = worst_first(rows, list(pytorch.grads))
    else:
        judged_by = ALLCLOSE if not any(r["diverged"] for r in rows) else FP32
        rows.sort(key=lambda r: -r["relative"])
    check = GradientCheck(rows, pytorch.loss, ortmodule.loss, tolerance, list(fixes or []), judged_by,
                          measured.loss if measured is not None else None, list(notes or []), list(members or []))
    check.float64 = measured
    return check


def _near(candidate: float, allowed: float) -> bool:
    """An estimated distance too near what is allowed for a summary to decide (ortlab.runs.sketch.UNCERTAIN)."""
    from ortlab.runs.sketch import UNCERTAIN

    return math.isfinite(candidate) and allowed > 0 and (1 - UNCERTAIN) * allowed <= candidate <= \
        (1 + UNCERTAIN) * allowed


PYTORCH, CANDIDATE = "pytorch", "candidate"  # the two fp32 steps a float64 step is measured against


def measured_against(exact: Step, pytorch: Step, other: Step) -> Distances:
    """A float64 step taken whole (a float64 copy of the model, or the float64 burst's first step) measured as a
    block-by-block one measures itself: norms, both steps' distances, and its gradients kept."""
    from ortlab.runs import sketch
    from ortlab.verdict.blockwise import Distances

    out = Distances(exact.loss, how="float64 step")
    for name, g64 in exact.grads.items():
        if g64 is None:
            continue
        g64 = g64.double()
        out.norms[name] = float(g64.norm())
        summarized = any(isinstance(s.grads.get(name), sketch.Summary) for s in (pytorch, other))
        reference = sketch.summarize(g64, name) if summarized else g64
        for label, s in ((PYTORCH, pytorch), (CANDIDATE, other)):
            g = s.grads.get(name)
            if g is not None:
                d, exact_here = sketch.distance(g, reference, name)
                out.to.setdefault(label, {})[name] = d
                if not exact_here:
                    out.estimated.add(name)
        out.kept[name] = g64
    return out


def allclose(pytorch: Step, other: Step) -> bool:
    """The fast path: every parameter's gradient of both steps equal up to rounding of the last bits (stops at the
    first that is not, so a check that needs float64 costs little here). Summaries: their estimated distance."""
    from ortlab.runs import sketch
    from ortlab.verdict import exact as ex

    for name, g_pt in pytorch.grads.items():
        g_other = other.grads.get(name)
        if (g_pt is None) != (g_other is None):
            return False
        if g_pt is None:
            continue
        if not sketch.finite(g_other) or not ex.within(sketch.distance(g_other, g_pt, name)[0], sketch.norm(g_pt)):
            return False
    return True


def worst_first(rows: list[dict[str, Any]], order: list[str]) -> list[dict[str, Any]]:
    """The diverged rows first, by how far past what is allowed they are; then the garbage ones (missing, not
    finite, absurd: it floods every gradient upstream of where it went wrong, so it locates nothing), the last in
    the model's order first (the nearest to where it went wrong); then the rest."""
    position = {name: i for i, name in enumerate(order)}

    def key(r: dict[str, Any]) -> tuple:
        if _garbage(r):
            return 1, -position.get(r["parameter"], 0)
        return (0 if r.get("diverged") else 2), -_excess(r)

    return sorted(rows, key=key)


def _excess(row: dict[str, Any]) -> float:
    """How far past what is allowed a row is (> 1: diverged); a missing or non-finite gradient first."""
    if row.get("to_float64") is None or not math.isfinite(row["to_float64"]):
        return math.inf
    return row["to_float64"] / row["allowed"] if row["allowed"] > 0 else (math.inf if row["to_float64"] else 0.0)


def describe(row: dict[str, Any], who: str = "ORT") -> str:
    """A gradient row in words: how many times fp32's noise it is off float64, in percent of the gradient; a
    gradient that is not finite, or off by more than a million times its norm, is said to be garbage."""
    from ortlab.verdict.ensemble import absurd
    from ortlab.verdict.exact import number, percent, times

    where = f" (module {row['module']}" + (f": {row['module_type']}" if row.get("module_type") else "") + (
        f" in {row['within']}" if row.get("within") else "") + ")" if row.get("module") else ""
    if row.get("note") == "not finite":
        return f"{who}'s gradient of {row['parameter']}{where} is not finite: garbage (first step, dropout off)"
    if row.get("note"):
        return f"{who}'s gradient of {row['parameter']}{where}: {row['note']}"
    if row.get("to_float64") is not None:
        noise = max(row["pytorch_to_float64"], row.get("spread") or 0.0)
        runs = "fp32's spread" if row.get("spread") is not None else "the PyTorch noise"
        pytorch = (f"PyTorch fp32 runs are up to {percent(noise, row['norm'])}" if row.get("spread") is not None
                   else f"PyTorch fp32 is {percent(noise, row['norm'])}")
        if absurd(row["to_float64"], row.get("allowed") or 0.0):
            return (f"{who}'s gradient of {row['parameter']}{where} is garbage: {number(row['to_float64'])} off "
                    f"float64, whose norm is {number(row['norm'])} ({pytorch} off; first step, dropout off)")
        return (f"{who}'s gradient of {row['parameter']}{where} is {times(row['to_float64'], noise)} {runs}: "
                f"{percent(row['to_float64'], row['norm'])} from float64, where {pytorch} (first step, dropout off)")
    return (f"{who}'s gradient of {row['parameter']}{where} differs from PyTorch fp32's by "
            f"{percent(row['relative'], 1.0)} (first step, dropout off)")


def step(workload: Any, batches: list[tuple[Any, Any]], runner: Any = None) -> Step:
    """One step's forward and backward (each of its micro-batches) of the workload's model through `runner` (the
    model itself when None, or an ORTModule over it; no optimizer step); the model's parameters, buffers and
    gradients are as before afterwards. Raises what the step raises; an ORTModule that fell back to PyTorch
    raises why it fell back."""
    model = workload.model
    with kept(model):
        for p in model.parameters():
            p.grad = None
        loss = workload.backward(model if runner is None else runner, batches)
        if runner is not None and runner is not model and _ort.is_ortmodule(runner) and \
                (fell_back := _ort.Wrap(runner, True).fallback()) is not None:
            raise fell_back
        # the gradients themselves, not copies: `kept` puts the model's own back, so these are the only ones
        return Step(loss, {n: None if p.grad is None else p.grad.detach()
                           for n, p in model.named_parameters() if p.requires_grad})


def first_step(workload: Any, fixes: tuple[str, ...] | list[str] = (), seed: int = 0, tolerance: float = AGREE,
               log: Path | None = None, runner: Any = None, batch: tuple[Any, Any] | None = None,
               exact: bool | Step = True, batches: list[tuple[Any, Any]] | None = None) -> GradientCheck:
    """The first step's gradients on PyTorch (the model as written) and on the other backend (with `fixes`
    applied), every dropout off, the same seeds, ORT's compute optimizer off (parity mode). `runner`: the other
    backend's module over the model (an ORTModule exported in parity mode, a compiled module); None: a fresh
    ORTModule (one export). `batch`: one batch's inputs and target; `batches`: the step's micro-batches (default:
    the workload's first step's). `exact`: where the two are not allclose, one float64 PyTorch step judges them
    (ortlab.verdict.exact); a Step: that float64 step, already taken (a float64 burst's first)."""
    from ortlab.common.capture import captured_output
    from ortlab.common.parity import parity
    from ortlab.compat import registry
    from ortlab.options import Options
    from ortlab.workload import to_device

    model = workload.model
    if batches is None:
        batches = [batch] if batch is not None else workload.micro_batches(workload.batch, 0)
    device = next((p.device for p in model.parameters()), None)
    if device is not None:
        batches = [to_device(b, device) for b in batches]
    model.train()
    with Options(enable_compute_optimizer=False).applied():
        with parity(model, True, seed):
            pt = step(workload, batches)
        with parity(model, True, seed), registry.applied(model, list(fixes)), \
                captured_output(log or Path("/dev/null")):
            ort = step(workload, batches, runner if runner is not None else _ort.new_ortmodule(model))
        return judged_steps(workload, batches, seed, fixes, pt, ort, exact, tolerance)


def judged_steps(workload: Any, batches: list[Any], seed: int, fixes: Any, pt: Step, other: Step,
                 exact: bool | Step = True, tolerance: float = AGREE) -> GradientCheck:
    """Two first steps (PyTorch fp32's and the other backend's, taken here or recorded by their runs:
    ortlab.verdict.record) judged: allclose, else against float64 (`exact`: the step, or True to take it here, block
    by block, from the workload's model's current state and `batches`) and, where they diverge, fp32's spread."""
    model = workload.model
    if not exact or allclose(pt, other):
        return typed(compare(pt, other, tolerance, list(fixes)), model)
    from ortlab.verdict import reference

    if isinstance(exact, Step):
        measured = measured_against(exact, pt, other)
    else:
        try:
            measured = float64_distances(workload, batches, seed, {PYTORCH: pt, CANDIDATE: other})
        except reference.NoFloat64 as e:
            return compare(pt, other, tolerance, list(fixes), notes=[f"{e}: the gradients are judged against "
                                                                     "PyTorch fp32's instead"])
    notes = [measured.note] if measured.note else []
    check = compare(pt, other, tolerance, list(fixes), measured, notes=notes)
    if not check.agree and not any(_garbage(r) for r in check.rows if r.get("diverged")):
        check = widened(workload, batches, seed, fixes, pt, other, measured, check, tolerance)
    return typed(check, model)


def float64_distances(workload: Any, batches: list[Any], seed: int, steps: dict[str, Step]) -> Distances:
    """The float64 step measured against fp32 `steps` (their distances to it, its norms), taken block by block
    (ortlab.verdict.blockwise: no float64 copy of the model); a model whose blocks cannot be replayed alone is
    taken whole on a float64 copy, with a note saying why. The float64 gradients a widening may need again (a
    parameter the candidate may be off beyond fp32's noise) are kept. Raises NoFloat64 when neither runs."""
    from ortlab.verdict import blockwise, reference
    from ortlab.verdict.exact import FACTOR, RELATIVE_FLOOR

    def suspect(name: str, distances: dict[str, float], norm: float) -> bool:
        allowed = FACTOR * distances.get(PYTORCH, 0.0) + RELATIVE_FLOOR * norm
        return not distances.get(CANDIDATE, math.inf) <= allowed  # nan: kept too

    try:
        return blockwise.measure(workload, batches, steps, seed, keep=suspect)
    except reference.NoFloat64 as alone:
        whole = reference.step(workload, batches, seed)  # NoFloat64 again: the model does not run in float64
        measured = measured_against(whole, steps[PYTORCH], steps[CANDIDATE])
        measured.note = f"the float64 step taken whole (a float64 copy of the model), not block by block: {alone}"
        return measured


def typed(check: GradientCheck, model: Any) -> GradientCheck:
    """Each row with its module's class and the class of the module holding it (`module_type`, `within`): a
    wrong gradient in `features.1.0.block.1.fc2` reads as a Conv2d in a SqueezeExcitation."""
    modules = dict(model.named_modules())
    for row in check.rows:
        path = row.get("module") or ""
        if path in modules:
            row["module_type"] = type(modules[path]).__name__
            parent = path.rpartition(".")[0]
            if path and parent in modules:
                row["within"] = type(modules[parent]).__name__
    return check


def widened(workload: Any, batches: list[Any], seed: int, fixes: Any, pt: Step, ort: Step, exact: Step | Distances,
            check: GradientCheck, tolerance: float = AGREE) -> GradientCheck:
    """The check again against fp32's spread (ortlab.verdict.ensemble): members added one at a time until the
    other backend is within FACTOR times their largest distance to float64, or none is left (the rows' distances
    are kept; only what is allowed changes). `exact`: the float64 step, or what it measured with the float64
    gradients of the parameters that may widen kept."""
    from ortlab.runs import sketch
    from ortlab.verdict import ensemble
    from ortlab.verdict import exact as ex

    measured = measured_against(exact, pt, ort) if isinstance(exact, Step) else exact
    scale = measured.scale
    spread: dict[str, float] = {}
    members: list[dict[str, Any]] = []
    rows = [dict(r) for r in check.rows]
    for what, member in ensemble.gradient_members(workload, batches, seed, fixes):
        members.append(what)
        for name, g in member.grads.items():
            g64 = measured.kept.get(name)
            if g is not None and g64 is not None:
                d = sketch.apart(g, g64)
                spread[name] = max(spread.get(name, 0.0), d if math.isfinite(d) else 0.0)
        del member
        for row in rows:
            if row.get("to_float64") is not None and row["parameter"] in spread:
                j = ex.decide(row["to_float64"], row["pytorch_to_float64"], row["norm"], scale,
                              spread=spread[row["parameter"]])
                row.update(allowed=j.allowed, spread=j.spread, diverged=j.diverged or row.get("note") is not None)
        if not any(r.get("diverged") for r in rows):
            break
    return replace(check, rows=worst_first(rows, list(pt.grads)), members=members)


def _garbage(row: dict[str, Any]) -> bool:
    """A diverged gradient no fp32 run explains: missing, not finite, or ABSURD times what is allowed off."""
    from ortlab.verdict.ensemble import absurd

    if not row.get("diverged"):
        return False
    return row.get("to_float64") is None or absurd(row["to_float64"], row.get("allowed") or 0.0)
