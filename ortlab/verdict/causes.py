"""Why two backends diverged, as a user can act on it: one headline cause, then the rest, grouped by kind and
module type ("... in 20 BatchNorm2d modules"), ranked by evidence (a measured difference beats an export hazard).

An export hazard is a cause only when the measured evidence points to it: the graph froze Python (a branch, a
number) and the losses or the trained weights differ later. Hazards raised inside torch's own modules (the
batch-size check inside F.batch_norm) or that the evidence does not point to are one note, never advice to
rewrite code. Source lines are the user's: ortlab's own files are never named (ortlab.compat.hazards).
"""

from __future__ import annotations

from typing import Any

from ortlab.compat.hazards import SHOWN, harmless_note
from ortlab.compat.hazards import examples as _examples
from ortlab.compat.hazards import grouped as _grouped
from ortlab.compat.hazards import place as _place
from ortlab.engine.backends import has, label
from ortlab.verdict.state import FROZEN

BATCH_NORM = ("running_mean", "running_var", "num_batches_tracked")
BUFFER_FIX = "pytorch-buffers"


def state_text(differ: list[dict[str, Any]]) -> str:
    """The end state's evidence in words, grouped: whole-number buffers, float buffers, parameters."""
    groups: dict[str, list[str]] = {}
    for d in differ:
        kind = ("frozen parameters" if d["kind"] == FROZEN else "whole-number buffers" if d.get("whole") else
                "buffers" if d["kind"] == "buffer" else "parameters")
        groups.setdefault(kind, []).append(d["name"])
    parts = [f"{len(names)} {kind if len(names) > 1 else kind[:-1]} ({_examples(names)})" for kind, names in
             groups.items()]
    return "the state at the end differs: " + ", ".join(parts)


def causes(run: Any, state: dict[str, Any] | None, applied: list[str], measured: dict[str, bool],
           found: list[dict[str, Any]], gradients: dict[str, Any] | None) -> tuple[list[dict[str, Any]], str | None]:
    """(the causes, headline first; a note naming the harmless hazards, or None)."""
    backend = run.backend
    differ = (state or {}).get("differ", [])
    buffers = _buffer_causes([d for d in differ if d["kind"] == "buffer"], backend, applied, measured)
    inputs = [{**h, "kind": "input ORT did not re-export for"} for h in run.meta.get("ignored_inputs") or []]
    frozen = measured["losses"] or any(d["kind"] in ("parameter", FROZEN) for d in differ)
    pointed: list[dict[str, Any]] = []
    harmless: list[dict[str, Any]] = []
    for h in run.meta.get("hazards") or []:
        benign = h.get("in_torch") or h["kind"].startswith("in-place update")
        (pointed if frozen and not benign else harmless).append(h)
    checked = [c for c in found if c.get("kind") != "localized" and not (
        buffers and (c.get("blocker") or {}).get("kind") == "buffer update")]
    located = [c for c in found if c.get("kind") == "localized"]
    ranked = (inputs + checked + buffers + _hazard_causes(pointed)) if measured["losses"] else (
        checked + buffers + inputs + _hazard_causes(pointed))
    out = ranked + located
    if not (measured["losses"] or measured["gradients"] or measured["state"]):
        out, harmless = [], harmless + pointed
    return out, harmless_note(harmless)


def _buffer_causes(rows: list[dict[str, Any]], backend: str, applied: list[str], measured: dict[str, bool]
                   ) -> list[dict[str, Any]]:
    """One cause for BatchNorm's running statistics, one per module type for other buffers."""
    who = label(backend)
    weights_same = not measured["gradients"] and not measured["losses"]
    fix = has(backend, "compat") and BUFFER_FIX not in applied
    out = []
    norm = [r for r in rows if r["name"].rpartition(".")[2] in BATCH_NORM]
    if norm:
        modules = list(dict.fromkeys(r["name"].rpartition(".")[0] for r in norm))
        types = sorted({r.get("module_type") or "BatchNorm" for r in norm})
        counted = [r for r in norm if r["name"].endswith("num_batches_tracked")]
        what = ("counts " + _count(sum(r["ortmodule_sum"] for r in counted) / len(counted)) + " where PyTorch counts "
                + _count(sum(r["pytorch_sum"] for r in counted) / len(counted)) + " and ") if counted else ""
        stats = [{"mean": "mean", "var": "variance"}[r["name"].rpartition(".")[2].removeprefix("running_")]
                 for r in norm if not r["name"].endswith("num_batches_tracked")]
        updates = (f"updates the running {' and '.join(dict.fromkeys(sorted(stats)))} differently" if stats
                   else "updates the running statistics the same")
        text = (f"BatchNorm running statistics in {len(modules)} {'/'.join(types)} "
                f"module{'s' if len(modules) > 1 else ''} ({_examples(modules)}): {who} {what}{updates}")
        if weights_same:
            text += "; weights train the same"
        text += f"; fix: {BUFFER_FIX}" if fix else (f" although {BUFFER_FIX} is applied" if BUFFER_FIX in applied
                                                    else "")
        out.append({"kind": "buffer", "names": [r["name"] for r in norm], "modules": modules, "text": text,
                    **({"fixes": [BUFFER_FIX]} if fix else {})})
    others: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r not in norm:
            others.setdefault(r.get("module_type") or "", []).append(r)
    for module_type, group in others.items():
        modules = list(dict.fromkeys(r["name"].rpartition(".")[0] or "(root)" for r in group))
        kind = f" {module_type}" if module_type else ""
        sums = "; ".join(f"`{r['name']}` sums to {r['pytorch_sum']:.6g} on PyTorch, {r['ortmodule_sum']:.6g} on "
                         f"{who}" for r in group[:SHOWN])
        text = (f"buffers that forward mutates differ in {len(modules)}{kind} module{'s' if len(modules) > 1 else ''}"
                f": {sums}" + (f" and {len(group) - SHOWN} more" if len(group) > SHOWN else ""))
        text += f"; fix: {BUFFER_FIX}" if fix else (f" although {BUFFER_FIX} is applied" if BUFFER_FIX in applied
                                                    else "")
        out.append({"kind": "buffer", "names": [r["name"] for r in group], "modules": modules, "text": text,
                    **({"fixes": [BUFFER_FIX]} if fix else {})})
    return out


def _hazard_causes(hazards: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One cause per hazard kind and line (the place the user rewrites), with its advice."""
    out = []
    for (kind, _), group in _grouped(hazards, lambda h: (h["kind"], _place(h))).items():
        h = group[0]
        where = (_place(h) or "the export") + (f" (module {h['module']})" if h.get("file") and h.get("module") else "")
        step = f" at step {h['step']}" if h.get("step") is not None else ""
        out.append({**h, "kind": "export hazard", "hazard": kind,
                    "text": f"export hazard at {where}{step}: {kind}; {h['advice']}"})
    return out


def _count(value: float) -> str:
    n = f"{value:.3g}"
    return f"{n} batch" if n == "1" else f"{n} batches"
