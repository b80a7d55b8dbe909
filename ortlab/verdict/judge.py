"""The one judgement of two runs from the same snapshot: did ORTModule (or torch.compile) train the same model as
PyTorch?

Exact arithmetic is the arbiter (ortlab.verdict.exact): PyTorch fp32 is not exact either, so the other backend
diverges only where it is measurably further from the same computation in float64 PyTorch than PyTorch fp32 is.
The evidence:
- the first step's gradients, every parameter, same state and batch, every dropout off (`gradients`);
- in parity mode, the loss curve and the state at the end (`state`) against a float64 PyTorch burst of the same
  steps, and where one PyTorch fp32 run does not settle it, against fp32's spread (`ensemble`): a chaotic run's
  losses are no evidence; whole-number buffers must be equal. Where the model cannot run in float64, the curve
  and float tensors are judged, as before, against a PyTorch pair whose start differs by 1e-7 (with a note).
Allclose to PyTorch fp32 is the fast path: no float64 run is needed then.
A divergence comes with its causes (`causes`): one headline, ranked by evidence (a measured difference beats an
export hazard), the rest grouped by kind and module type; hazards the evidence does not point to are notes.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from ortlab.common.enums import StrEnum
from ortlab.engine.backends import label
from ortlab.runs.run import Run, RunStatus, write_json

FILE = "verdict.json"  # in the other backend's run folder
NOT_WRITTEN = "not written to"  # a note: the verdict could not be written to the run's folder


class VerdictStatus(StrEnum):
    """What a verdict says (verdict.json's `status`); the tuner, the recommendation and the widgets compare
    through it."""

    AGREE = "agree"
    DIVERGED = "diverged"
    NOT_JUDGED = "not judged"


AGREE, DIVERGED, NOT_JUDGED = VerdictStatus.AGREE, VerdictStatus.DIVERGED, VerdictStatus.NOT_JUDGED
LOSS_NOISE_FACTOR = 10.0  # without float64: the loss may be this many times further from PyTorch's than the noise pair
LOSS_FLOOR = 1e-5  # ... plus this much, relative to the loss


@dataclass
class Verdict:
    """`status`: agree, diverged or not judged; `headline`: the judgement in words; the evidence as plain data."""

    status: VerdictStatus
    headline: str
    gradients: dict[str, Any] | None = None
    losses: dict[str, Any] | None = None
    state: dict[str, Any] | None = None
    causes: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def diverged(self) -> bool:
        """Whether the two backends train different models."""
        return self.status == DIVERGED

    def __post_init__(self) -> None:
        self.status = VerdictStatus(self.status)  # read back from verdict.json: the plain string

    def to_dict(self) -> dict[str, Any]:
        """The verdict as plain data (verdict.json)."""
        return {**asdict(self), "status": str(self.status)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Verdict:
        """The verdict `to_dict` wrote, read back (unknown keys ignored)."""
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    def lines(self) -> list[str]:
        """The headline, then one line per cause and note, as a summary prints them."""
        out = [self.headline]
        out += [f"  {'cause' if i == 0 else 'also'}: {c['text']}" for i, c in enumerate(self.causes)]
        out += [f"  note: {n}" for n in self.notes]
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def judge(pytorch: Any, ortmodule: Any, gradients: dict[str, Any] | None = None, noise: Any = None,
          found: list[dict[str, Any]] | None = None, float64: dict[str, Any] | None = None,
          ensemble: dict[str, Any] | None = None) -> Verdict:
    """Judge the other backend's run (ORTModule, torch.compile) against the PyTorch run of the same snapshot (Runs).
    `gradients`: the first-step gradient check (GradientCheck.to_dict()); `float64`: the same burst in float64
    PyTorch ({"losses", "state"}, or {"error"} when the model cannot run in it; parity mode); `noise`: a PyTorch
    run from a perturbed start (judges losses and float tensors only without float64); `found`: causes named by
    looking further (what `ortlab check` finds, where statistics first differ); `ensemble`: fp32 runs of the same
    steps whose rounding differs ({"members": [{"losses", "state", "how"}]}, ortlab.verdict.ensemble), which widen
    what the losses and float tensors are allowed. Returns the Verdict: agree,
    diverged or not judged, with the evidence (every number: each backend's distance to float64, the factor) and
    the causes."""
    from ortlab.verdict import causes as cs
    from ortlab.verdict import ensemble as en
    from ortlab.verdict import state as states

    if ortmodule is None or ortmodule.status != RunStatus.OK or pytorch.status != RunStatus.OK:
        which = ortmodule if ortmodule is not None and ortmodule.status != RunStatus.OK else pytorch
        return Verdict(NOT_JUDGED, f"not judged: the {which.backend} run ended {which.status}")
    evidence: list[str] = []  # what diverged, in words
    notes: list[str] = []
    who = label(ortmodule.backend)  # whose gradient, in the headline
    exact = float64 if float64 and not float64.get("error") else None
    if float64 and float64.get("error"):
        notes.append(f"{float64['error']}; the losses and end state are judged against a perturbed PyTorch pair "
                     "instead (fp32's spread, not float64)")
    members = [m for m in (ensemble or {}).get("members") or []] if exact else []
    if ensemble and ensemble.get("error"):
        notes.append(f"the fp32 ensemble could not run ({ensemble['error']}): one PyTorch fp32 run is the yardstick")
    losses = _losses(pytorch, ortmodule, noise, who, exact, members)
    if losses.get("diverged"):
        evidence.append(losses["text"])
    grads = gradients
    if grads is not None and grads.get("agree") is False:  # None: not compared (skipped, with its reason)
        evidence.append(_gradient_text(grads, who))
    pt_state, ort_state = states.read(pytorch.path), states.read(ortmodule.path)
    state: dict[str, Any] | None = None
    differ: list[dict[str, Any]] = []
    if pt_state and ort_state:
        differ = states.differing(pt_state, ort_state, states.read(noise.path) if noise is not None else None,
                                  exact["state"] if exact else None, [m["state"] for m in members])
        state = {"differ": differ[:20], "count": len(differ), "floats_judged": noise is not None or exact is not None,
                 "judged_by": "float64" if exact else ("noise pair" if noise is not None else "whole numbers only")}
        if exact:  # per kind, both backends' distances to float64 together (relative, per tensor)
            state["float64"] = {kind: {k: v for k, v in group.items() if k != "rows"} for kind, group in
                                states.judged(pt_state, ort_state, exact["state"], [m["state"] for m in members]
                                              ).items()}
            notes += [en.state_note(kind, group, who) for kind, group in state["float64"].items()
                      if group.get("no_evidence")]
        if differ:
            evidence.append(cs.state_text(differ))
    applied = list((ortmodule.meta.get("fixes") or {}).get("applied") or [])
    measured = {"losses": bool(losses.get("diverged")), "gradients": bool(grads and grads.get("agree") is False),
                "state": bool(state and state["count"])}
    causes, harmless = cs.causes(ortmodule, state and {**state, "differ": differ}, applied, measured, found or [],
                                 grads)
    if grads is None:
        notes.append("first-step gradients not compared")
    elif grads.get("error") and not grads.get("skipped"):  # skipped: the headline says why
        notes.append(f"first-step gradients not compared: {grads['error']}")
    notes += list((grads or {}).get("notes") or [])
    if grads and grads.get("estimated"):
        notes.append("first-step gradients judged from the runs' summaries (a count sketch a parameter: distances "
                     "estimated to about 1%; burst with --evidence full to keep them whole)")
    if grads and grads.get("undecided") and evidence:
        notes.append(f"the summaries cannot decide for {len(grads['undecided'])} more parameter"
                     f"{'s' if len(grads['undecided']) > 1 else ''} (e.g. {grads['undecided'][0]})")
    if grads and grads.get("members") and (grads.get("worst") or [{}])[0].get("spread") is not None:
        notes.append(en.gradient_note(grads, who))
    if not losses.get("judged"):
        notes.append(losses.get("why", "losses not judged"))
    elif losses.get("note"):
        notes.append(losses["note"])
    notes += en.formula_notes(applied, who, bool(members or (grads or {}).get("members")))
    if harmless:
        notes.append(harmless)
    if evidence:
        headline = "DIVERGED: " + "; ".join(evidence)
        if grads is not None and grads.get("forward_agrees") and grads.get("agree") is False:
            headline += "; forward agrees"
        return Verdict(DIVERGED, headline, grads, losses, state, causes, notes)
    if (grads is None or grads.get("skipped")) and not losses.get("judged") and not (state and state["count"] == 0):
        return Verdict(NOT_JUDGED, "not judged: no evidence could be gathered", grads, losses, state, [], notes)
    if grads is not None and grads.get("skipped"):  # the main evidence was not seen: never "agree" on it
        return Verdict(NOT_JUDGED, _partial_headline(grads, losses, state), grads, losses, state, [], notes)
    if grads is not None and grads.get("undecided"):  # summaries too near the line: said, not guessed
        return Verdict(NOT_JUDGED, _undecided_headline(grads), grads, losses, state, [], notes)
    if grads is None:
        return Verdict(AGREE, "agree on " + " and ".join(_judged_parts(losses, state)) + " (first-step gradients "
                       "not compared)", grads, losses, state, [], notes)
    return Verdict(AGREE, "agree" + _agree_detail(grads, losses), grads, losses, state, [], notes)


def _judged_parts(losses: dict[str, Any], state: dict[str, Any] | None) -> list[str]:
    """What agreed, in words: the losses and the end state as far as they were judged."""
    parts = []
    if losses.get("judged"):
        parts.append(f"the losses ({losses.get('judged_by') or 'judged'})")
    if state is not None:
        parts.append(f"the end state ({state.get('judged_by')})")
    return parts or ["nothing"]


def _undecided_headline(grads: dict[str, Any]) -> str:
    """Summaries that cannot decide: which parameters, and how to judge them whole."""
    from ortlab.runs.sketch import UNCERTAIN

    names = grads["undecided"]
    return (f"not judged: the first step's gradient summaries cannot decide for {len(names)} parameter"
            f"{'s' if len(names) > 1 else ''} ({', '.join(names[:3])}{'...' if len(names) > 3 else ''}): estimated "
            f"within {UNCERTAIN:.0%} of what fp32's noise allows; burst both runs with --evidence full to judge their "
            "gradients whole")


def _partial_headline(grads: dict[str, Any], losses: dict[str, Any], state: dict[str, Any] | None) -> str:
    """A verdict whose first-step gradients were not compared: what was not judged and why, then what was."""
    why = grads.get("error") or "no reason given"
    seen = _judged_parts(losses, state)
    return (f"not judged: the first step's gradients, the main evidence, were not compared ({why}); "
            + ("nothing else was judged" if seen == ["nothing"] else
               f"what was judged agrees: {' and '.join(seen)}"))


def evidence(verdict: dict[str, Any]) -> str | None:
    """A verdict's numbers in one line (`ortlab runs`): the worst gradient's and the loss curve's distances to float64,
    the other backend's and PyTorch fp32's, and the factor allowed between them."""
    parts = []
    grads = verdict.get("gradients") or {}
    worst = (grads.get("worst") or [{}])[0]
    if worst.get("to_float64") is not None:
        parts.append(f"grad {worst['parameter']}: {worst['to_float64']:.2g} vs PyTorch "
                     f"{worst['pytorch_to_float64']:.2g} from fp64")
    elif grads.get("judged_by"):
        parts.append(f"gradients {grads['judged_by']}")
    losses = verdict.get("losses") or {}
    if losses.get("judged_by") == "float64":
        parts.append(f"loss: {losses['to_float64']:.2g} vs PyTorch {losses['pytorch_to_float64']:.2g} from fp64")
    elif losses.get("judged_by"):
        parts.append(f"loss {losses['judged_by']}")
    factor = grads.get("factor") or losses.get("factor")
    if parts and factor:
        parts.append(f"factor {factor:g}")
    return "; ".join(parts) or None


def loss_note(verdict: dict[str, Any] | None) -> str:
    """What a loss difference printed beside a verdict means (`max |loss difference|`): "" when it speaks for
    itself; when training is chaotic, that it is no evidence, with fp32's own spread."""
    from ortlab.verdict.exact import percent

    losses = (verdict or {}).get("losses") or {}
    if losses.get("chaotic"):
        noise = max([losses["pytorch_to_float64"], *(losses.get("members") or [])])
        runs = "PyTorch fp32 runs of this start end up to" if losses.get("members") else "PyTorch fp32 ends"
        return (f" (no evidence: training is chaotic here, {runs} {percent(noise, losses['norm'])} of the loss from "
                "float64; see the verdict)")
    if losses.get("judged_by") == "float64" and losses.get("members") and not losses.get("diverged"):
        return " (within the spread of PyTorch fp32 runs of this start; see the verdict)"
    return ""


def _agree_detail(grads: dict[str, Any] | None, losses: dict[str, Any]) -> str:
    """The closest call, in the headline of an agreement."""
    from ortlab.verdict.exact import times

    if grads and grads.get("worst") and not grads.get("skipped"):
        worst = grads["worst"][0]
        if worst.get("to_float64") is not None:
            if worst.get("spread") is not None:
                noise = max(worst["pytorch_to_float64"], worst["spread"])
                return f" (worst gradient {times(worst['to_float64'], noise)} fp32's spread from float64)"
            return (f" (worst gradient {times(worst['to_float64'], worst['pytorch_to_float64'])} the PyTorch noise "
                    "from float64)")
        return f" (worst gradient {worst['relative']:.1e} relative)"
    return ""


def _gradient_text(grads: dict[str, Any], who: str) -> str:
    """The worst gradient in words, and how many more are garbage (not finite, or absurdly off)."""
    from ortlab.verdict.gradients import _garbage, describe

    text = describe(grads["worst"][0], who)
    more = (grads.get("garbage") or 0) - _garbage(grads["worst"][0])
    if more > 0:
        example = next((r["parameter"] for r in grads["worst"][1:] if _garbage(r)), None)
        text += (f"; {more} {'more ' if _garbage(grads['worst'][0]) else ''}gradient{'s' if more > 1 else ''} "
                 f"{'are' if more > 1 else 'is'} garbage (not finite, or off by over a million times the noise)"
                 + (f", e.g. {example}" if example else ""))
    return text


def _losses(pytorch: Any, other: Any, noise: Any, who: str, exact: dict[str, Any] | None,
            members: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The other backend's losses against PyTorch's: a non-finite loss where PyTorch's is finite always diverges;
    the curve is judged only in parity mode (dropout and ORT's compute optimizer make it meaningless otherwise):
    allclose, else against the float64 burst's curve (and the ensemble's `members`: ortlab.verdict.ensemble), else
    against the noise pair. Beyond what fp32's spread allows where that spread is chaotic: no evidence."""
    from ortlab.verdict import ensemble as en
    from ortlab.verdict import exact as ex

    pt, ort = pytorch.losses, other.losses
    steps = min(len(pt), len(ort))
    for t in range(steps):
        if _finite(pt[t]) and not _finite(ort[t]):
            return {"judged": True, "diverged": True, "step": t,
                    "text": f"{who}'s loss is not finite at step {t}, PyTorch's is"}
    parity = bool(pytorch.meta.get("config", {}).get("parity")) and bool(other.meta.get("config", {}).get("parity"))
    if not parity:
        return {"judged": False, "why": "losses not judged: not in parity mode (dropout and ORT's compute optimizer "
                                        "make them differ)"}
    pt, ort = pt[:steps], ort[:steps]
    max_diff = max((abs(a - b) for a, b in zip(pt, ort, strict=True)), default=0.0)
    if steps and ex.close_numbers(ort, pt):
        return {"judged": True, "judged_by": "allclose", "max_diff": max_diff}
    if exact is not None and len(exact.get("losses") or []) >= steps:
        ref = exact["losses"][:steps]
        spread = en.losses_spread(members, ref)
        j = ex.judge_numbers(ort, pt, ref, spread=max(spread) if spread else None)
        fp32 = max([j.pytorch, *spread])
        wild = en.chaotic(fp32, j.norm)
        out = {"judged": True, "judged_by": "float64", "factor": ex.FACTOR, "float64": ref, "max_diff": max_diff,
               "to_float64": j.candidate, "pytorch_to_float64": j.pytorch, "allowed": j.allowed, "norm": j.norm,
               "members": spread, "chaotic": wild, "beyond": j.diverged}
        runs = (f"{1 + len(spread)} PyTorch fp32 runs of this start end up to" if spread else "PyTorch fp32 ends")
        share = f"{runs} {ex.percent(fp32, j.norm)} of the loss from float64 ({who}: {ex.percent(j.candidate, j.norm)})"
        if j.diverged and en.no_evidence(j.candidate, fp32, j.norm):
            out.update(judged=False, no_evidence=True,
                       why=f"losses no evidence: training is chaotic here: {share}, more than fp32 can tell from "
                           "rounding; the verdict rests on the first step's gradients and the end state's whole "
                           "numbers")
        elif j.diverged:
            noise = "fp32's spread" if spread else "the PyTorch noise"
            out.update(diverged=True, text=f"{who}'s losses over {steps} steps are {ex.times(j.candidate, fp32)} "
                                           f"{noise} from float64 ({ex.percent(j.candidate, j.norm)} of the loss, "
                                           f"where {runs.replace(' end up to', ' are at most').replace(' ends', ' is')}"
                                           f" {ex.percent(fp32, j.norm)})")
        elif wild:
            out["note"] = (f"losses no evidence: training is chaotic here: {share}, so the loss curves may differ "
                           f"that much (max |loss difference| {ex.number(max_diff)})")
        elif spread:
            out["note"] = f"losses within fp32's spread: {share}"
        return out
    if noise is None or not noise.losses:
        return {"judged": False, "why": "losses not judged: no float64 run and no noise pair"}
    return _noise_losses(pt, ort, noise.losses, steps)


def _noise_losses(pt: list[float], ort: list[float], nz: list[float], steps: int) -> dict[str, Any]:
    """Without float64: the loss may be LOSS_NOISE_FACTOR times as far from PyTorch's as the noise pair is."""
    steps = min(steps, len(nz))
    worst, spread_so_far, rows = 0.0, 0.0, []
    for t in range(steps):
        spread_so_far = max(spread_so_far, abs(pt[t] - nz[t]))
        gap = abs(pt[t] - ort[t])
        allowed = LOSS_NOISE_FACTOR * spread_so_far + LOSS_FLOOR * max(abs(pt[t]), 1.0)
        rows.append((t, gap, allowed))
        worst = max(worst, gap / allowed)
    out = {"judged": True, "judged_by": "noise pair", "max_diff": max(g for _, g, _ in rows),
           "noise": spread_so_far, "ratio_to_allowed": worst}
    if worst > 1:
        t, gap, allowed = max(rows, key=lambda r: r[1] / r[2])
        out.update(diverged=True, step=t, text=f"losses differ by {gap:.3g} at step {t}, "
                                               f"{gap / max(spread_so_far, 1e-30):.0f}x the spread of a perturbed "
                                               "PyTorch pair")
    return out


def _finite(value: Any) -> bool:
    return value is not None and math.isfinite(value)


def written(verdict: Verdict, run: Run) -> Verdict:
    """The verdict written to the other run's folder (verdict.json); a folder that cannot take it gets a note."""
    try:
        write_json(run.path / FILE, verdict.to_dict())
    except OSError as e:  # a read-only folder (one copied from another machine), a full disk: still the verdict
        with contextlib.suppress(OSError):
            (run.path / f".{FILE}.{os.getpid()}.tmp").unlink(missing_ok=True)
        verdict.notes.append(f"{NOT_WRITTEN} {run.path / FILE}: {e.strerror or e}")
    return verdict
