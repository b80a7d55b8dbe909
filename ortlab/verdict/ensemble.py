"""fp32's own spread: a few PyTorch fp32 runs whose rounding differs from the burst's, spent only where one PyTorch
fp32 run does not settle the verdict (the candidate is further from float64 than FACTOR times it).

One PyTorch fp32 run is one sample of fp32's error, and a lucky one can be far closer to float64 than another:
- the first step's gradients are not chaotic, but ill-posed where a ReLU or a max sits at a tie: torchvision
  MNASNet 0.5 (batch 2, 64x64, its default start) has PyTorch fp32's gradient of `layers.11.0.layers.0.weight`
  0.013% from float64, and 4 of 8 starts moved by one ulp put it 12% away, where ORT's lands; ResNet-18 from
  another start (seed 1) has ORT's gradient of `layer4.0.conv1.weight` 2.9% off where PyTorch's is 6e-4%: no
  start one ulp away reaches that tie, 2 of 6 moved by 16 ulps land on ORT's value (2026-11-27). So the gradient
  check adds members one at a time (PyTorch running the fixes' formulas, then starts moved by 1, 1, 4, 4, 16, 16,
  64, 64 ulps: GRADIENT_MEMBERS) until the candidate is within FACTOR times their largest distance: the spread
  widens only as far as it must (a start moved by 16 ulps is itself 6x PyTorch's rounding off float64 there).
- a few optimizer steps amplify rounding: ResNet-18's three AdamW steps end 0.11% of the loss from float64 in
  PyTorch fp32, and up to 0.46% in runs whose rounding differs. A start moved by one ulp alone is not such a run:
  it keeps PyTorch's kernels and so its rounding at every step (on a small BatchNorm CNN at lr 0.1 over 20 steps
  such runs stay within 4e-3% of the loss from float64, where ORT, whose kernels sum in another order, is at
  0.031%). So each burst member starts one ulp away (or where the gradient check's member crossed ORT's tie) and
  its every step's gradient carries noise of fp32's own first-step error per parameter (PyTorch fp32's distance
  to float64, per element): another summation order at every step (the same model: 3e-3% to 0.012%). Up to
  BURST_MEMBERS of them, stopping once the candidate is within their spread; the first runs the fixes' formulas.

Where the spread itself is a large share of what is judged (CHAOS), training is chaotic: fp32 cannot tell a
difference of that size from rounding, so a candidate beyond FACTOR times it (up to CHAOS_FACTOR times) is "no
evidence", not a divergence, and the verdict rests on the first step's gradients and the end state's whole
numbers (which rounding cannot move).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from typing import Any

GRADIENT_MEMBERS = (1, 1, 4, 4, 16, 16, 64, 64)  # the extra first steps (one forward and backward in fp32 each),
# in order, by how many ulps each moves the start: a tie ORT's rounding crosses can be further than one ulp away
BURST_MEMBERS = 3  # extra fp32 runs of the burst's steps
CHAOS = 1e-2  # the spread over the norm of what is judged (the loss curve; a tensor's summary) above which
# training is chaotic: measured 15-26% (MNASNet 0.5, 3 steps), 0.46% (ResNet-18), 0.04% (small BatchNorm CNN)
CHAOS_FACTOR = 10.0  # ... but a candidate this many times beyond that spread is a divergence all the same (fp32 runs
# of one start were at most 25x apart from each other in their distance to float64: MNASNet 0.5, 2026-11-27)
ABSURD = 1e6  # a candidate this many times what is allowed off float64 is garbage, which no fp32 run explains
# (ORT's wrong squeeze-and-excitation gradients: 1e34 and NaN; MNASNet's tie, which fp32 runs reach: 900x)


# --------------------------------------------------------------------------- the members (where the model is)


def gradient_members(workload: Any, batches: list[Any], seed: int = 0, fixes: tuple[str, ...] | list[str] = ()
                     ) -> Iterator[tuple[dict[str, Any], Any]]:
    """(what it is: {"how", "seed", "ulps", "formulas"}, its gradients.Step): PyTorch fp32's first step with the
    module-kind fixes' formulas (when any is applied), then from starts moved by GRADIENT_MEMBERS ulps, one at a
    time (a member is computed when asked for)."""
    from ortlab.verdict import reference

    rewriting = reference.rewriting(fixes)
    if rewriting:
        yield ({"how": f"PyTorch fp32 with the formulas of {', '.join(rewriting)}", "seed": None, "ulps": 0,
                "formulas": rewriting}, _step(workload, batches, seed, None, fixes))
    for k, ulps in enumerate(GRADIENT_MEMBERS[len(rewriting) > 0:], 1):
        moved = "one ulp" if ulps == 1 else f"{ulps} ulps"
        yield ({"how": f"PyTorch fp32 from the start moved by {moved} (seed {k})", "seed": k, "ulps": ulps,
                "formulas": []}, _step(workload, batches, seed, k, (), ulps))


def _step(workload: Any, batches: list[Any], seed: int, nudge: int | None, fixes: Any, ulps: int = 1) -> Any:
    from ortlab.common.parity import parity
    from ortlab.verdict import reference
    from ortlab.verdict.gradients import Step

    model = copy.deepcopy(workload.model)
    model.train()
    if nudge is not None:
        reference.nudged(model, nudge, ulps)
    for p in model.parameters():
        p.grad = None
    with parity(model, True, seed), reference.formulas(model, fixes):
        loss = workload.backward(model, batches)
    return Step(loss, {n: None if p.grad is None else p.grad.detach()
                       for n, p in model.named_parameters() if p.requires_grad})


def burst_members(workload: Any, feed: Any, initial: Any, optimizer: str, lr: float, steps: int, seed: int = 0,
                  fixes: tuple[str, ...] | list[str] = (), hints: dict[str, Any] | None = None) -> dict[str, Any]:
    """Up to BURST_MEMBERS fp32 runs of the burst's steps whose rounding differs from PyTorch's at every step
    (ortlab.verdict.reference.replay): {"members": [{"losses", "state", "how"}], "jitter": the largest noise
    size per element}. The noise per parameter is fp32's own first-step error per element: PyTorch fp32's gradient
    against float64's on the first batch. `hints` (from the verdict, all optional): "rounding", that error per
    parameter as the gradient check measured it (else measured here: one float64 and one fp32 step); "start"
    ({"seed", "ulps"}), the first member's start, the one the gradient check found on the other backend's side of
    a tie (its first step takes the same branch); "target" (`settled`), what, once within the members' spread,
    needs no more of them (more would only widen it)."""
    from ortlab.verdict import reference

    hints = hints or {}
    initial.restore(workload.model)
    jitter = _noise(workload, feed, seed, hints.get("rounding"))
    rewriting = reference.rewriting(fixes)
    start = hints.get("start") or {}
    members = []
    for k in range(1, BURST_MEMBERS + 1):
        formulas = tuple(rewriting) if k == 1 else ()
        nudge, ulps = (start["seed"], start["ulps"]) if k == 1 and start.get("seed") else (k, 1)
        run, _ = reference.replay(workload, feed, initial, optimizer, lr, steps, seed, float64=False, nudge=nudge,
                                  jitter=jitter, fixes=formulas, ulps=ulps)
        how = (f"start moved by {'one ulp' if ulps == 1 else f'{ulps} ulps'} (seed {nudge}), fp32's rounding noise "
               "at every step" + (f", the formulas of {', '.join(formulas)}" if formulas else ""))
        members.append({**run, "how": how})
        if hints.get("target") and settled(hints["target"], members):
            break
    initial.restore(workload.model)
    return {"members": members, "jitter": max(jitter.values(), default=0.0)}


def _noise(workload: Any, feed: Any, seed: int, rounding: dict[str, float] | None) -> dict[str, float]:
    """Per parameter, fp32's own first-step error per element (RMS): `rounding`'s distances over the square root
    of the parameter's size, or measured (one float64 step, block by block, and one fp32 step on the first
    batch)."""
    from ortlab.verdict import gradients

    sizes = {n: p.numel() for n, p in workload.model.named_parameters() if p.requires_grad}
    if rounding:
        return {n: d / math.sqrt(sizes[n]) for n, d in rounding.items()
                if n in sizes and sizes[n] and d is not None and math.isfinite(d)}
    import torch

    from ortlab.workload import to_device

    device = next((p.device for p in workload.model.parameters()), torch.device("cpu"))
    batches = [to_device(b, device) for b in workload.micro_batches(feed.batch, 0)]
    fp32 = _step(workload, batches, seed, None, ())
    measured = gradients.float64_distances(workload, batches, seed, {gradients.PYTORCH: fp32,
                                                                     gradients.CANDIDATE: fp32})
    out = {}
    for name, d in measured.to.get(gradients.PYTORCH, {}).items():
        g = fp32.grads.get(name)
        if g is not None and g.numel():
            size = d / math.sqrt(g.numel())
            out[name] = size if math.isfinite(size) else 0.0
    return out


# --------------------------------------------------------------------------- what they say (where the verdict is)


def wanted(verdict: Any) -> bool:
    """Whether the members could change the verdict: the losses or the end state's float tensors were judged
    against float64 with one PyTorch fp32 run and are beyond what it allows."""
    losses = verdict.losses or {}
    groups = ((verdict.state or {}).get("float64") or {}).values()
    return bool((losses.get("judged_by") == "float64" and losses.get("beyond") and not losses.get("members")) or any(
        g.get("diverged") and g.get("members", 0) == 0 for g in groups))


def settled(target: dict[str, Any], members: list[dict[str, Any]]) -> bool:
    """Whether what sent for the members is within FACTOR times their spread so far: `target` {"losses",
    "reference", "float64"} (the loss curves: the other backend's, PyTorch fp32's, float64's) and, when the end
    state sent for them, "state" {"reference", "other", "float64"} (the summaries ortlab.verdict.state judges)."""
    from ortlab.verdict import state
    from ortlab.verdict.exact import judge_numbers

    exact = target["float64"]
    spread = losses_spread(members, exact)
    if not spread or judge_numbers(target["losses"], target["reference"], exact, spread=max(spread)).diverged:
        return False
    states = target.get("state")
    return not states or not any(g["diverged"] for g in state.judged(
        states["reference"], states["other"], states["float64"], [m["state"] for m in members]).values())


def losses_spread(members: list[dict[str, Any]] | None, exact: list[float]) -> list[float]:
    """Each member's loss curve's distance to float64's (over the steps both have)."""
    from ortlab.verdict.exact import distance_numbers

    steps = len(exact)
    return [distance_numbers(m["losses"][:steps], exact) for m in members or [] if len(m["losses"]) >= steps]


def chaotic(noise: float, norm: float) -> bool:
    """Whether fp32's spread is a large share of what it is judged on (CHAOS)."""
    return math.isfinite(noise) and norm > 0 and noise > CHAOS * norm


def no_evidence(candidate: float, noise: float, norm: float) -> bool:
    """A candidate beyond what fp32's spread allows that chaos still explains: the spread chaotic, the candidate
    finite and within CHAOS_FACTOR times it."""
    return chaotic(noise, norm) and math.isfinite(candidate) and candidate <= CHAOS_FACTOR * noise


def absurd(distance: float, allowed: float) -> bool:
    """Garbage: not finite, or ABSURD times what fp32's noise allows (FACTOR times it and the floors) off float64."""
    return not math.isfinite(distance) or distance > ABSURD * max(allowed, 1e-30)


def gradient_note(grads: dict[str, Any], who: str) -> str:
    """The first step's gradients judged against the ensemble, in words: whether it found fp32's own error larger
    than one PyTorch run showed (an ill-posed gradient), or confirmed it."""
    from ortlab.verdict.exact import FACTOR, percent

    worst = grads["worst"][0]
    norm, members, pytorch = worst["norm"], grads["members"], worst["pytorch_to_float64"]
    fp32 = max(pytorch, worst["spread"])
    runs = f"{len(members)} more fp32 run{'s' if len(members) > 1 else ''} ({_kinds(members)})"
    if fp32 > FACTOR * pytorch:
        return (f"first-step gradients: one PyTorch fp32 run was no yardstick here: {runs} put fp32's own error of "
                f"{worst['parameter']} at up to {percent(fp32, norm)} (PyTorch's burst: {percent(pytorch, norm)}, "
                f"{who}: {percent(worst['to_float64'], norm)}): the gradient jumps where a ReLU or a max sits at a tie "
                "that rounding can cross")
    return (f"first-step gradients: {runs} confirm fp32's own error of {worst['parameter']} is at most "
            f"{percent(fp32, norm)} ({who}: {percent(worst['to_float64'], norm)})")


def state_note(kind: str, group: dict[str, Any], who: str) -> str:
    """A kind of float tensor whose end state is no evidence (chaotic), in words."""
    from ortlab.verdict.exact import percent

    fp32 = max(group["pytorch_to_float64"], group.get("spread") or 0.0)
    norm = math.sqrt(group["tensors"])
    return (f"the end state's float {kind}s are no evidence: training is chaotic here, PyTorch fp32 runs of this "
            f"start end {percent(fp32, norm)} from float64 per tensor ({who}: {percent(group['to_float64'], norm)})")


def formula_notes(applied: list[str], who: str, spent: bool) -> list[str]:
    """Which formula each side ran, when a fix rewrote the model's arithmetic for the other backend."""
    from ortlab.verdict import reference

    rewriting = reference.rewriting(applied)
    if not rewriting:
        return []
    names = ", ".join(f"`{f}`" for f in rewriting)
    plural = "es" if len(rewriting) > 1 else ""
    return [f"formulas: PyTorch ran the model as written, {who} the formulas of the fix{plural} {names} (the same "
            f"function): both are judged against float64 of the model as written"
            + (", and fp32's spread includes PyTorch running those formulas" if spent else "")]


def _kinds(members: list[dict[str, Any]]) -> str:
    """"one with the fixes' formulas, 6 from starts moved by 1 to 16 ulps"."""
    formulas = [m for m in members if m.get("formulas")]
    ulps = [m["ulps"] for m in members if m.get("ulps")]
    sizes = "one ulp" if max(ulps, default=1) == 1 else f"1 to {max(ulps)} ulps"
    starts = f"{len(ulps)} from starts moved by {sizes}" if len(ulps) > 1 else f"one from a start moved by {sizes}"
    parts = (["one with the fixes' formulas"] if formulas else []) + ([starts] if ulps else [])
    return ", ".join(parts)


def hints(grads: dict[str, Any] | None, verdict: Any, pytorch: Any, other: Any, exact: dict[str, Any]
          ) -> dict[str, Any]:
    """What the burst's members can start from (`burst_members`): the gradient check's rounding per parameter and
    the start it ended on, and what to stop at (the loss curves; the end states when they sent for the members)."""
    from ortlab.verdict import state

    out: dict[str, Any] = {"start": start(grads)}
    rows = (grads or {}).get("distances") or []
    if rows:
        out["rounding"] = {r["parameter"]: r["pytorch_to_float64"] for r in rows}
    losses = verdict.losses or {}
    if losses.get("judged_by") == "float64":
        steps = len(losses["float64"])
        out["target"] = {"losses": other.losses[:steps], "reference": pytorch.losses[:steps],
                         "float64": losses["float64"]}
        if any(g.get("diverged") for g in ((verdict.state or {}).get("float64") or {}).values()):
            out["target"]["state"] = {"reference": state.read(pytorch.path), "other": state.read(other.path),
                                      "float64": exact["state"]}
    return out


def start(grads: dict[str, Any] | None) -> dict[str, Any] | None:
    """The start the gradient check's ensemble ended on, when it moved one and that brought the other backend within
    fp32's spread: the burst's members then begin there ({"seed", "ulps"})."""
    members = (grads or {}).get("members") or []
    if not members or not (grads or {}).get("agree") or not members[-1].get("seed"):
        return None
    return {"seed": members[-1]["seed"], "ulps": members[-1]["ulps"]}
