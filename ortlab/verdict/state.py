"""The model's state at the end of a burst, summarized per parameter and buffer (final_state.json): enough to name
the tensors two runs disagree on, small enough to keep with every run. Buffers matter most: ORTModule can
train with equal losses while a buffer that forward mutates is updated differently (or not at all).

Whole-number tensors (counters, num_batches_tracked) must be equal. Float tensors are judged against a float64
PyTorch run of the same steps (ortlab.verdict.exact), together per kind (parameters, float buffers): each tensor's
summary (sum, norm) off float64's, relative to it, as one vector per backend, the other backend's against FACTOR
times PyTorch fp32's. Together, not one by one: after a few AdamW steps the end state is chaotic (a gradient at
rounding level flips an update's sign), and the ratio of two such random errors is heavy-tailed. Measured on
torchvision ResNet-18 after 3 steps with pytorch-buffers (2026-11-25): per tensor ORT's error over PyTorch fp32's
has median 0.98, but 16% of the parameters and 18% of the float buffers exceed 3x (the worst 28x and 67x); taken
together the ratio is 0.91 (parameters) and 0.63 (buffers). A parameter's own evidence without chaos is its first
step's gradient (ortlab.verdict.gradients). Where one PyTorch fp32 run does not settle it, the fp32 ensemble's end
states widen what is allowed (ortlab.verdict.ensemble), and a kind whose spread is a large share of its tensors
(chaotic) is no evidence. Without a float64 run, float tensors are judged together per kind against the spread
of a PyTorch pair from a perturbed start (`against_noise`), and where a kind diverges, the tensors beyond it
are named."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

# written by the engine as a burst ends (ortlab.runs.evidence); named here for the verdict's readers
from ortlab.runs.evidence import FROZEN, summarize  # noqa: F401
from ortlab.runs.evidence import STATE_FILE as FILE
from ortlab.runs.evidence import write_state as write  # noqa: F401
from ortlab.runs.files import read_json

NOISE_FACTOR = 10.0  # a float tensor differs when it is this many times further off than the noise pair
FLOOR = 1e-6  # ... and further than this (relative), whatever the noise


def read(run_dir: Path) -> dict[str, dict[str, Any]] | None:
    return read_json(Path(run_dir) / FILE, strict=False)


def distance(a: dict[str, Any], b: dict[str, Any]) -> float:
    """How far two summaries of one tensor are apart, relative to its size (0 for equal; inf for non-finite)."""
    values = (a["sum"], b["sum"], a["sumsq"], b["sumsq"])
    if not all(math.isfinite(v) for v in values):
        return 0.0 if values[0::2] == values[1::2] else math.inf
    scale = math.sqrt(max(a["sumsq"], b["sumsq"]) * max(a["numel"], 1)) or 1.0
    return max(abs(a["sum"] - b["sum"]) / scale,
               abs(a["sumsq"] - b["sumsq"]) / (max(a["sumsq"], b["sumsq"]) or 1.0))


def whole(entry: dict[str, Any]) -> bool:
    """A tensor that must match exactly: a whole-number one (a counter, num_batches_tracked), or a frozen
    parameter (requires_grad off: a LoRA model's base), which no backend may change: judged with the trained
    ones, thousands of them would widen what the trained ones are allowed."""
    return entry["kind"] == FROZEN or not entry["dtype"].startswith(("float", "bfloat", "complex"))


def close(reference: dict[str, dict[str, Any]], other: dict[str, dict[str, Any]]) -> bool:
    """Whether `other`'s end state equals `reference`'s up to rounding of the last bits, entry by entry where both
    have it (whole numbers exactly): the verdict's fast path, which needs no float64 run."""
    from ortlab.verdict.exact import close_numbers

    for name, entry in reference.items():
        if name not in other:
            continue
        if whole(entry):
            if distance(entry, other[name]) > 0:
                return False
        elif not close_numbers(vector(other[name]), vector(entry)):
            return False
    return True


def differing(pytorch: dict, other: dict, noise: dict | None = None, exact: dict | None = None,
              members: list[dict] | None = None) -> list[dict[str, Any]]:
    """The tensors whose end states differ: whole-number ones when not equal; float ones where their kind diverges
    together and, of those, each one further off than allowed (or the worst): against a float64 run (`exact`,
    `judged`; the ensemble's `members` when they ran), else against the noise pair (PyTorch from a perturbed start,
    `against_noise`). Float tensors are not judged without either."""
    out = []
    for name, pt in pytorch.items():
        ort = other.get(name)
        if ort is None:
            continue
        gap = distance(pt, ort)
        if whole(pt):
            if gap > 0:
                out.append(_row(name, pt, ort, gap, None))
            continue
    if exact is None and noise is not None:
        for r in _beyond(against_noise(pytorch, other, noise)):
            out.append(_row(r["name"], pytorch[r["name"]], other[r["name"]], r["gap"], r["spread"]))
    if exact is not None:
        for r in _beyond(judged(pytorch, other, exact, members)):
            pt, ort = pytorch[r["name"]], other[r["name"]]
            out.append({**_row(r["name"], pt, ort, distance(pt, ort), None),
                        "to_float64": r["to_float64"], "pytorch_to_float64": r["pytorch_to_float64"]})
    return sorted(out, key=lambda r: (r["kind"] != "buffer", -r["distance"]))


def _beyond(groups: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The tensors to name of each kind that diverged together: those further off than each alone is allowed,
    worst first, or the worst one."""
    out = []
    for group in groups.values():
        if group["diverged"]:
            rows = sorted(group["rows"], key=lambda r: -r["excess"])
            out += [r for r in rows if r["excess"] > 1] or rows[:1]
    return out


def judged(pytorch: dict, other: dict, exact: dict, members: list[dict] | None = None) -> dict[str, dict[str, Any]]:
    """Per kind of float tensor ("parameter", "buffer"): both backends' relative distances to float64, together
    (`to_float64`, `pytorch_to_float64`, `allowed`, `tensors`, `diverged`) and per tensor (`rows`); with the
    ensemble's end states (`members`), its largest distance (`spread`), and whether that spread makes the kind
    chaotic (`chaotic`: beyond what is allowed is then `no_evidence`, not `diverged`)."""
    from ortlab.verdict.ensemble import chaotic, no_evidence
    from ortlab.verdict.exact import FACTOR, RELATIVE_FLOOR

    groups: dict[str, dict[str, Any]] = {}
    for name, e in exact.items():
        if whole(e) or name not in pytorch or name not in other:
            continue
        v64, vo, vp = vector(e), vector(other[name]), vector(pytorch[name])
        norm = math.hypot(*v64) or 1.0
        to64 = math.hypot(vo[0] - v64[0], vo[1] - v64[1]) / norm
        pt64 = math.hypot(vp[0] - v64[0], vp[1] - v64[1]) / norm
        group = groups.setdefault(e["kind"], {"rows": []})
        group["rows"].append({"name": name, "to_float64": to64, "pytorch_to_float64": pt64,
                              "excess": to64 / (FACTOR * pt64 + RELATIVE_FLOOR) if math.isfinite(to64) else math.inf})
    for group in groups.values():
        rows = group["rows"]
        a = math.sqrt(sum(r["to_float64"] ** 2 for r in rows))
        b = math.sqrt(sum(r["pytorch_to_float64"] ** 2 for r in rows))
        spread = [_together(m, exact, [r["name"] for r in rows]) for m in members or []]
        spread = [s for s in spread if math.isfinite(s)]
        noise = max([b, *spread])
        allowed = FACTOR * noise + RELATIVE_FLOOR * math.sqrt(len(rows))
        beyond = not math.isfinite(a) or a > allowed
        excused = beyond and no_evidence(a, noise, math.sqrt(len(rows)))  # relative: each tensor's norm is 1
        group.update(to_float64=a, pytorch_to_float64=b, allowed=allowed, tensors=len(rows),
                     diverged=beyond and not excused, members=len(spread), chaotic=chaotic(noise, math.sqrt(len(rows))),
                     no_evidence=excused, **({"spread": max(spread)} if spread else {}))
    return groups


def against_noise(pytorch: dict, other: dict, noise: dict) -> dict[str, dict[str, Any]]:
    """Without a float64 run: per kind of float tensor, the other backend's distance from PyTorch's end state and
    the noise pair's (PyTorch from a perturbed start), each tensor's relative to its size, together (`gap`,
    `spread`, `allowed`, `tensors`, `diverged`: the gap beyond NOISE_FACTOR times the spread and the floor) and per
    tensor (`rows`, with each one's `excess` over what it alone would be allowed). Together, as float64's
    judgement takes them: after a few AdamW steps one tensor's end state is chaotic, and of 148 in GPT-2 small one
    is 10 times the pair's spread by chance (measured 2026-11-28; ORT's end state agrees with PyTorch's to 1e-6 of
    the loss)."""
    groups: dict[str, dict[str, Any]] = {}
    for name, pt in pytorch.items():
        ort, nz = other.get(name), noise.get(name)
        if ort is None or nz is None or whole(pt):
            continue
        gap, spread = distance(pt, ort), distance(pt, nz)
        groups.setdefault(pt["kind"], {"rows": []})["rows"].append(
            {"name": name, "gap": gap, "spread": spread,
             "excess": gap / max(NOISE_FACTOR * spread, FLOOR) if math.isfinite(gap) else math.inf})
    for group in groups.values():
        rows = group["rows"]
        a = math.sqrt(sum(r["gap"] ** 2 for r in rows))
        b = math.sqrt(sum(r["spread"] ** 2 for r in rows if math.isfinite(r["spread"])))
        allowed = NOISE_FACTOR * b + FLOOR * math.sqrt(len(rows))
        group.update(gap=a, spread=b, allowed=allowed, tensors=len(rows),
                     diverged=not math.isfinite(a) or a > allowed)
    return groups


def _together(member: dict, exact: dict, names: list[str]) -> float:
    """A member's relative distance to float64 over the tensors `names`, together (as `judged` takes them)."""
    total = 0.0
    for name in names:
        if name not in member:
            continue
        v64, vm = vector(exact[name]), vector(member[name])
        norm = math.hypot(*v64) or 1.0
        total += (math.hypot(vm[0] - v64[0], vm[1] - v64[1]) / norm) ** 2
    return math.sqrt(total)


def vector(entry: dict[str, Any]) -> list[float]:
    """A tensor's summary as numbers to judge: its sum and its norm."""
    return [entry["sum"], math.sqrt(max(entry["sumsq"], 0.0)) if math.isfinite(entry["sumsq"]) else entry["sumsq"]]


def _row(name: str, pt: dict, ort: dict, gap: float, spread: float | None) -> dict[str, Any]:
    return {"name": name, "kind": pt["kind"], "dtype": pt["dtype"], "module_type": pt.get("module_type"),
            "whole": whole(pt), "distance": gap, "noise": spread, "pytorch_sum": pt["sum"], "ortmodule_sum": ort["sum"]}
