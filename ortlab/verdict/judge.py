"""The one judgement of two runs from the same snapshot: did ORTModule train the same model as PyTorch?

Three kinds of evidence, each immune to the noise that fools a bare loss difference:
- the first step's gradients, every parameter, same state and batch, every dropout off (`gradients`);
- in parity mode, the loss curve against the spread of a PyTorch pair whose start differs by 1e-7 (a few AdamW
  steps can be chaotic: correct runs drift apart as far as that pair does);
- the state at the end, every parameter and buffer (`state`): whole-number buffers must be equal, float ones
  within the noise pair's spread.
A divergence comes with its causes where ortlab can name them: what the exporter warned about (hazards), inputs
ORT did not re-export for, buffers that differ, or the first divergent module and operator found by statistics.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

FILE = "verdict.json"  # in the ORTModule run's folder
AGREE, DIVERGED, NOT_JUDGED = "agree", "diverged", "not judged"
LOSS_NOISE_FACTOR = 10.0  # ORT's loss may be this many times further from PyTorch's than the noise pair is
LOSS_FLOOR = 1e-5  # ... plus this much, relative to the loss
LABELS = {"ortmodule": "ORT", "compile": "torch.compile"}  # whose gradient, in the headline


@dataclass
class Verdict:
    """`status`: agree, diverged or not judged; `headline`: the judgement in words; the evidence as plain data."""

    status: str
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

    def to_dict(self) -> dict[str, Any]:
        """The verdict as plain data (verdict.json)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Verdict:
        """The verdict `to_dict` wrote, read back (unknown keys ignored)."""
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    def lines(self) -> list[str]:
        """The headline, then one line per cause and note, as a summary prints them."""
        out = [self.headline]
        out += [f"  cause: {c['text']}" for c in self.causes]
        out += [f"  note: {n}" for n in self.notes]
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def judge(pytorch: Any, ortmodule: Any, gradients: dict[str, Any] | None = None, noise: Any = None,
          found: list[dict[str, Any]] | None = None) -> Verdict:
    """Judge an ORTModule run against the PyTorch run of the same snapshot (Runs). `gradients`: the first-step
    gradient check (GradientCheck.to_dict()); `noise`: the PyTorch run from a perturbed start (parity mode);
    `found`: causes named by looking further (what `ortlab check` finds, where statistics first differ). Returns
    the Verdict: agree, diverged or not judged, with the evidence and the causes."""
    from ortlab.verdict import state as states

    if ortmodule is None or ortmodule.status != "ok" or pytorch.status != "ok":
        which = ortmodule if ortmodule is not None and ortmodule.status != "ok" else pytorch
        return Verdict(NOT_JUDGED, f"not judged: the {which.backend} run ended {which.status}")
    evidence: list[str] = []  # what diverged, in words
    who = LABELS.get(ortmodule.backend, ortmodule.backend)
    losses = _losses(pytorch, ortmodule, noise, who)
    if losses.get("diverged"):
        evidence.append(losses["text"])
    grads = gradients
    if grads is not None and not grads["agree"]:
        evidence.append(_gradient_text(grads, who))
    pt_state, ort_state = states.read(pytorch.path), states.read(ortmodule.path)
    state = None
    if pt_state and ort_state:
        differ = states.differing(pt_state, ort_state, states.read(noise.path) if noise is not None else None)
        state = {"differ": differ[:10], "count": len(differ), "floats_judged": noise is not None}
        if differ:
            evidence.append("the state at the end differs: " + ", ".join(
                f"{d['kind']} {d['name']}" for d in differ[:3]) + (f" and {len(differ) - 3} more" if len(differ) > 3
                                                                   else ""))
    causes = _causes(ortmodule, state) + list(found or [])
    notes = []
    if grads is None:
        notes.append("first-step gradients not compared")
    if not losses.get("judged"):
        notes.append(losses.get("why", "losses not judged"))
    if evidence:
        headline = "DIVERGED: " + "; ".join(evidence)
        if grads is not None and grads.get("forward_agrees") and not grads["agree"]:
            headline += "; forward agrees"
        return Verdict(DIVERGED, headline, grads, losses, state, causes, notes)
    if grads is None and not losses.get("judged") and not (state and state["count"] == 0):
        return Verdict(NOT_JUDGED, "not judged: no evidence could be gathered", grads, losses, state, causes, notes)
    worst = f"worst gradient {grads['worst'][0]['relative']:.1e} relative" if grads and grads["worst"] else ""
    headline = "agree" + (f" ({worst})" if worst else "")
    if causes:  # hazards that did not change this burst's result
        places = "; ".join(dict.fromkeys(f"{c['file']}:{c['line']} ({c.get('hazard') or c['kind']})"
                                         if c.get("file") else c["text"] for c in causes))
        notes.append(f"export hazards seen, harmless in this burst: {places}")
        causes = []
    return Verdict(AGREE, headline, grads, losses, state, causes, notes)


def _gradient_text(grads: dict[str, Any], who: str) -> str:
    worst = grads["worst"][0]
    where = worst["module"] or worst["parameter"]
    if worst.get("note"):
        return f"{who}'s gradient of {worst['parameter']}: {worst['note']}"
    return (f"{who}'s gradient of {worst['parameter']} (module {where}) is {worst['relative']:.3g}x off PyTorch's "
            "(first step, dropout off)")


def _losses(pytorch: Any, ortmodule: Any, noise: Any, who: str) -> dict[str, Any]:
    """ORT's losses against PyTorch's: a non-finite loss where PyTorch's is finite always diverges; the curve is
    judged against the noise pair only in parity mode (dropout and ORT's compute optimizer make it meaningless
    otherwise)."""
    pt, ort = pytorch.losses, ortmodule.losses
    steps = min(len(pt), len(ort))
    for t in range(steps):
        if _finite(pt[t]) and not _finite(ort[t]):
            return {"judged": True, "diverged": True, "step": t,
                    "text": f"{who}'s loss is not finite at step {t}, PyTorch's is"}
    parity = bool(pytorch.meta.get("config", {}).get("parity")) and bool(ortmodule.meta.get("config", {}).get("parity"))
    if not parity:
        return {"judged": False, "why": "losses not judged: not in parity mode (dropout and ORT's compute optimizer "
                                        "make them differ)"}
    if noise is None or not noise.losses:
        return {"judged": False, "why": "losses not judged: no noise pair"}
    nz = noise.losses
    steps = min(steps, len(nz))
    worst, spread_so_far, rows = 0.0, 0.0, []
    for t in range(steps):
        spread_so_far = max(spread_so_far, abs(pt[t] - nz[t]))
        gap = abs(pt[t] - ort[t])
        allowed = LOSS_NOISE_FACTOR * spread_so_far + LOSS_FLOOR * max(abs(pt[t]), 1.0)
        rows.append((t, gap, allowed))
        worst = max(worst, gap / allowed)
    out = {"judged": True, "max_diff": max(g for _, g, _ in rows), "noise": spread_so_far,
           "ratio_to_allowed": worst}
    if worst > 1:
        t, gap, allowed = max(rows, key=lambda r: r[1] / r[2])
        out.update(diverged=True, step=t, text=f"losses differ by {gap:.3g} at step {t}, beyond the noise of a "
                                               f"perturbed PyTorch pair ({spread_so_far:.2g})")
    return out


def _finite(value: Any) -> bool:
    return value is not None and math.isfinite(value)


def _causes(ortmodule: Any, state: dict[str, Any] | None) -> list[dict[str, Any]]:
    causes = []
    for h in ortmodule.meta.get("ignored_inputs") or []:
        causes.append({**h, "kind": "input ORT did not re-export for"})
    for h in ortmodule.meta.get("hazards") or []:
        causes.append({**h, "kind": "export hazard", "hazard": h["kind"]})
    for d in (state or {}).get("differ", []):
        if d["kind"] == "buffer":
            causes.append({"kind": "buffer", "name": d["name"],
                           "text": f"buffer {d['name']} differs at the end (sum {d['pytorch_sum']:.6g} on PyTorch, "
                                   f"{d['ortmodule_sum']:.6g} on ORTModule): ORT's graph updates buffers that "
                                   "forward mutates differently (the export's own forward updates them once more)"})
    return causes
