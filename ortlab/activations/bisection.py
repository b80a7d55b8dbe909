"""Which ORTModule option causes a divergence: re-run short ORTModule bursts (up to the divergence's step)
with one option toggled at a time, and report the toggles that make the divergence disappear."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ortlab.activations.diff import compare
from ortlab.activations.errors import FailedBurstError, StatsFileError
from ortlab.activations.results import Divergence
from ortlab.runs.run import RunStatus

# Not an ORT option: parity mode (dropout 0, compute optimizer off, deterministic algorithms) in both runs.
PARITY = "parity"


def default_candidates(options) -> dict[str, Any]:
    """The toggles worth trying from `options`: each option that changes ORT's graph or its execution,
    flipped. (ORT 1.19.2 has no switch for cast propagation: it is always on at level 1.)"""
    flip: dict[str, Any] = {
        "enable_compute_optimizer": not options["enable_compute_optimizer"],
        "enable_embedding_sparse_optimizer": not options["enable_embedding_sparse_optimizer"],
        "enable_label_sparse_optimizer": not options["enable_label_sparse_optimizer"],
        "memory_opt_level": 0 if options["memory_opt_level"] else 1,
        "enable_mem_efficient_grad_mgmt": not options["enable_mem_efficient_grad_mgmt"],
        "deepcopy_before_model_export": not options["deepcopy_before_model_export"],
        "onnx_opset_version": 15 if options["onnx_opset_version"] != 15 else 17,
        "enable_custom_autograd": not options["enable_custom_autograd"],
    }
    if options["memory_opt_config"]:
        flip["memory_opt_config"] = ""
    return flip


@dataclass
class BisectResult:
    """`rows`: one per toggle: the option, its value, the run, where it first diverged (or None) and whether
    the divergence disappeared. `fixes`: the toggles that make it disappear."""

    reference: str
    baseline: str
    divergence: Divergence | None
    rows: Any  # DataFrame
    fixes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        if self.divergence is None:
            return f"{self.reference} vs {self.baseline}: no divergence to bisect"
        lines = [f"divergence: {self.divergence}",
                 f"toggled one at a time (ORTModule bursts of {self.divergence.step + 1} steps):",
                 self.rows.drop(columns=["run"]).to_string(index=False, max_colwidth=70)]
        lines.append("disappears with: " + ", ".join(self.fixes) if self.fixes else
                     "no single option makes it disappear: look at the model code at that module")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"BisectResult({self.baseline!r}, fixes={self.fixes})"


def bisect(model: Any = None, model_kwargs: dict | None = None, *, steps: int = 10, options: Any = None,
           divergence: Divergence | None = None, candidates: Any = None, parity: bool = True,
           tolerances: Any = None, collect: dict | None = None, session: Any = None, out: str = "runs",
           in_process: bool = False, **burst_kwargs: Any) -> BisectResult:
    """Find the first divergence between PyTorch and ORTModule (or take `divergence`), then toggle one option
    at a time. `candidates`: option names (toggled from `options`), a dict of option -> value, or None for
    default_candidates; "parity" also tries parity mode when `parity` is off. Returns a BisectResult: which option
    (or parity) makes the difference."""
    from ortlab.engine import Session
    from ortlab.options import Options

    options = Options(options)
    toggles = _toggles(candidates, options, parity)  # checked before any burst runs
    collect = collect or {"stats": {}}
    own = session is None
    session = session or Session(model, model_kwargs or {}, out=out, in_process=in_process)
    try:
        common = dict(parity=parity, collect=collect, progress=False, **burst_kwargs)
        reference = session.burst("pytorch", steps, options, **common)
        baseline = session.burst("ortmodule", steps, options, **common)
        _check(reference)
        _check(baseline)
        found = divergence or compare(reference, baseline, tolerances).first
        if found is None:
            import pandas as pd

            return BisectResult(reference.path.name, baseline.path.name, None, pd.DataFrame())
        short = found.step + 1
        rows = []
        with session.asking(baseline.path, "bisect"):  # each try: ortlab's, kept under the ORTModule run bisected
            for name, value in toggles.items():
                rows.append(_try(session, name, value, options, short, found, reference, common, tolerances))
    finally:
        if own:
            session.close()
    import pandas as pd

    columns = ["option", "value", "run", "first divergence", "disappears", "evidence"]
    table = pd.DataFrame(rows, columns=columns)
    fixes = [f"{r['option']}={r['value']}" for r in rows if r["disappears"]]
    return BisectResult(reference.path.name, baseline.path.name, found, table, fixes)


def _check(run) -> None:
    if run.status != RunStatus.OK:
        raise FailedBurstError(f"{run.backend} burst {run.path.name} ended {run.status}: {run.error}")


def _toggles(candidates: Any, options, parity: bool) -> dict[str, Any]:
    from ortlab.options import SPECS, OptionError

    flips = default_candidates(options)
    if candidates is None:
        chosen = dict(flips)
        if not parity:
            chosen[PARITY] = True
        return chosen
    if isinstance(candidates, str):
        candidates = [c.strip() for c in candidates.split(",") if c.strip()]
    if isinstance(candidates, dict):
        chosen = dict(candidates)
    else:
        chosen = {}
        for name in candidates:
            if name == PARITY:
                chosen[name] = not parity
            elif name in flips:
                chosen[name] = flips[name]
            elif name in SPECS and isinstance(options[name], bool):
                chosen[name] = not options[name]
            else:
                raise OptionError(f"bisect candidate {name!r} is not known or has no obvious toggle; known: "
                                  f"{', '.join([*flips, PARITY])} (or pass a dict option -> value)")
    for name, value in chosen.items():
        if name != PARITY:
            options.replace(**{name: value})  # validates: OptionError names the option and what is allowed
    return chosen


def _try(session, name: str, value: Any, options, steps: int, found: Divergence, reference, common: dict,
         tolerances: Any) -> dict[str, Any]:
    from ortlab.engine import BurstError

    kwargs = dict(common)
    row = {"option": name, "value": value, "run": None}
    try:
        if name == PARITY:
            kwargs["parity"] = value
            reference = session.burst("pytorch", steps, options, **kwargs)
            changed = options
        else:
            changed = options.replace(**{name: value})
        run = session.burst("ortmodule", steps, changed, **kwargs)
    except BurstError as e:  # e.g. an import-time option in an in-process session
        return {**row, "first divergence": f"not tried: {e}", "disappears": False, "evidence": "-"}
    row["run"] = run.path.name
    if run.status != RunStatus.OK:
        return {**row, "first divergence": f"burst {run.status}: {run.error}", "disappears": False,
                "evidence": "-"}
    try:
        first = compare(reference, run, tolerances, steps=range(steps)).first
    except StatsFileError:
        # no statistics from this burst (custom autograd off inlines ortlab's PythonOps): the first step's
        # gradients with the option toggled are the evidence, never the loss of a burst too short to show a
        # gradient divergence
        check = session.gradient_check(changed, parity=kwargs.get("parity", True), seed=kwargs.get("seed", 0))
        if check.get("skipped"):
            return {**row, "first divergence": f"not judged: {check.get('error')}", "disappears": False,
                    "evidence": "-"}
        worst = (check.get("worst") or [{}])[0]
        where = None if check["agree"] else (f"gradient of {worst.get('parameter')} {worst.get('relative', 0):.3g}x "
                                             "off (first step)")
        return {**row, "first divergence": where, "disappears": check["agree"], "evidence": "first-step gradients"}
    where = None if first is None else f"step {first.step} {first.phase} {first.name}"
    return {**row, "first divergence": where, "disappears": first is None, "evidence": "statistics"}
