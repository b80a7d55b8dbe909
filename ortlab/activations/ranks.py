"""Two ranks of a distributed burst compared: what may differ and what must not.

Each rank trains on its own share of the data, so its module outputs and their gradients differ from another
rank's by design: those differences are expected, not a divergence. The parameter gradients after DDP's
all-reduce are one tensor that every rank receives, byte for byte, so they must be equal: by default exactly
(a tolerance given to `compare` applies instead). Ranks record them before each optimizer step (phase
"param_grad" of their stats.npz).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ortlab.activations.errors import ActivationsError
from ortlab.activations.results import METRICS
from ortlab.activations.table import PARAM_GRAD
from ortlab.runs import files

DATA_PHASES = ("forward", "backward")  # depend on each rank's batch


def rank_of(source: Any) -> int | None:
    """The rank a source is of (a rank's Run or folder, `<run>/ranks/<r>`), None for anything else."""
    meta = getattr(source, "meta", None)
    if meta is None and isinstance(source, str | Path):
        meta = files.meta(source)
    if isinstance(meta, dict) and "world_size" in meta and isinstance(meta.get("rank"), int):
        return meta["rank"]
    return None


def rank_pair(source: Any, ranks: Any) -> tuple[Any, Any]:
    """The two rank runs `ranks=(i, j)` of a distributed run (a Run or its folder)."""
    from ortlab.runs.run import Run, load_run

    run = source if isinstance(source, Run) else load_run(Path(getattr(source, "path", source)))
    if not (isinstance(ranks, list | tuple) and len(ranks) == 2 and all(type(r) is int for r in ranks)):
        raise ActivationsError(f"ranks {ranks!r} is not allowed; allowed: two rank numbers, e.g. (0, 1)")
    held = {rank_of(r): r for r in run.ranks}
    missing = [r for r in ranks if r not in held]
    if missing:
        have = ", ".join(str(r) for r in sorted(k for k in held if k is not None)) or "none"
        raise ActivationsError(f"run {run.path.name} has no rank {missing[0]} (its ranks here: {have})")
    return held[ranks[0]], held[ranks[1]]


def apply_rank_rules(table, tolerances_given: bool):
    """Data phases: `expected`, never diverged. Parameter gradients: equal unless a tolerance was given."""
    from ortlab.activations.diff import _score

    params = (table["phase"] == PARAM_GRAD).to_numpy()
    if not tolerances_given:
        for metric in METRICS:
            table.loc[params, f"tol_{metric}"] = 0.0
        table = _score(table)
        params = (table["phase"] == PARAM_GRAD).to_numpy()
    expected = table["phase"].isin(DATA_PHASES).to_numpy()
    table["expected"] = expected
    table["diverged"] = table["diverged"].to_numpy() & ~expected
    return table


def rank_lines(diff) -> list[str]:
    """What a comparison of two ranks says about each kind of tensor."""
    t = diff.table
    a, b = diff.ranks
    data = t[t["expected"]]
    differ = data[data["score"] > 1]["name"].nunique()
    lines = [f"ranks {a} and {b}: each trains on its own data, so module outputs and their gradients differ "
             f"(expected, not a divergence: {differ} of {data['name'].nunique()} tensors differ beyond tolerance)"]
    params = t[t["phase"] == PARAM_GRAD]
    if not len(params):
        lines.append("parameter gradients: none recorded (ranks record them when the burst collects statistics: "
                     "--collect stats, collect={'stats': {}}), so nothing that must be equal was compared")
    elif not params["diverged"].any():
        rel = np.nan_to_num(params[[f"rel_{m}" for m in METRICS]].to_numpy(float))
        how = "within tolerance" if rel.any() else "equal"
        lines.append(f"parameter gradients after all-reduce: {params['name'].nunique()} parameters x "
                     f"{params['step'].nunique()} steps, all {how}")
    else:
        bad = params[params["diverged"]]
        lines.append(f"parameter gradients after all-reduce DIFFER: {bad['name'].nunique()} of "
                     f"{params['name'].nunique()} parameters, first {bad.iloc[0]['name']} at step "
                     f"{int(bad.iloc[0]['step'])} (the ranks do not train one model)")
    return lines
