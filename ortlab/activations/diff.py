"""Compare two sources of activation statistics (ortlab runs or ORT dump folders, in any mix) and find the
first divergence: the earliest step, and in it the earliest tensor in execution order, whose difference
exceeds its tolerance (or the run-to-run noise floor).

Differences are relative to a scale that keeps values near zero from looking big: mean, min, max and samples
against the larger of the two values and the tensor's RMS; std and norm against the larger of the two; the
zero count as a share of the elements; nan and inf counts must be equal.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ortlab.activations.errors import ActivationsError, StatsFileError
from ortlab.activations.legacy import is_dump, read_dump
from ortlab.activations.ranks import apply_rank_rules, rank_of, rank_pair
from ortlab.activations.results import METRICS, ActivationDiff, Divergence, NonFinite, Tolerances
from ortlab.activations.table import STATS_FILE, dims_text, read_stats
from ortlab.runs import files
from ortlab.runs.run import RunStatus


def load(source: Any, model: Any = None):
    """A table from a Run, a run folder, a stats.npz, an ORT StatisticsSubscriber folder or a table itself."""
    import pandas as pd

    if isinstance(source, pd.DataFrame):
        return source
    path = Path(getattr(source, "path", source))
    if path.is_dir() and is_dump(path):
        return read_dump(path, model=model)
    if path.is_dir() and not (path / STATS_FILE).exists() and not (path / "meta.json").exists():
        raise StatsFileError(f"{path} is neither an ortlab run with statistics ({STATS_FILE}) nor an ORT "
                             "StatisticsSubscriber folder (step_N/order.txt)")
    _not_a_fallback(path)
    return read_stats(path)


def _not_a_fallback(path: Path) -> None:
    """A run whose ORTModule fell back to PyTorch recorded PyTorch's statistics under ORTModule's name: comparing
    them with PyTorch's would show agreement that ORT never earned."""
    meta = files.meta(path)  # {} when damaged: read_stats names a damaged run
    if meta.get("status") == RunStatus.FALLBACK:
        why = meta.get("error") or "it fell back to PyTorch"
        raise ActivationsError(f"{path.name} did not run on ORTModule: {why}; its statistics are PyTorch's, so "
                               "there is nothing of ORT's to compare")


def _label(source: Any, table) -> str:
    rank = rank_of(source)
    if rank is not None:  # <run>/ranks/<r>
        return f"{Path(getattr(source, 'path', source)).resolve().parent.parent.name} rank {rank}"
    if hasattr(source, "path"):
        return Path(source.path).name
    if isinstance(source, str | Path):
        return Path(source).name
    return table.attrs.get("source", "table")


# --------------------------------------------------------------------------- the comparison


def compare(a: Any, b: Any = None, tolerances: Tolerances | float | dict | None = None, *, noise: Any = None,
            noise_factor: float = 1.0, model: Any = None, steps: Any = None, ranks: Any = None) -> ActivationDiff:
    """Compare two sources (Run, run folder, ORT dump folder or table; or one ortlab Comparison from
    Session.compare; or one distributed run and `ranks=(i, j)`). Two ranks of a distributed burst are compared
    as ranks (see ortlab.activations.ranks): their activations may differ, their parameter gradients not.
    `tolerances`: one number for every statistic or a dict per statistic. `noise`: a
    NoiseFloor, whose run-to-run differences (times `noise_factor`) raise the tolerance per tensor and step.
    `model`: the nn.Module of an ORT dump, to name its tensors by module path. `steps`: only these steps.
    Against a noise floor, each tensor's tolerance becomes the larger of `tolerances` and `noise_factor` times
    that tensor's run-to-run difference. Returns an ActivationDiff: per tensor and step, what differs, and the
    first divergence."""
    if ranks is not None:
        if b is not None:
            raise ActivationsError("compare takes two sources or one distributed run with ranks=(i, j), not both")
        a, b = rank_pair(a, ranks)
    if b is None and hasattr(a, "pytorch") and hasattr(a, "ortmodule"):
        a, b = a.pytorch, a.ortmodule
    if b is None:
        raise ActivationsError("compare needs two sources (or one Comparison from Session.compare, or one "
                               "distributed run and ranks=(i, j))")
    tol = Tolerances.of(tolerances)
    ra, rb = rank_of(a), rank_of(b)
    pair = (ra, rb) if ra is not None and rb is not None and ra != rb else None
    _same_model(a, b)
    for source in (a, b):  # before either is read: a missing stats file is not the reason to give
        if isinstance(source, str | Path) or hasattr(source, "path"):
            _not_a_fallback(Path(getattr(source, "path", source)))
    ta, tb = load(a, model), load(b, model)
    la, lb = _label(a, ta), _label(b, tb)
    if la == lb:
        la, lb = f"{la} (a)", f"{lb} (b)"
    for label, t in ((la, ta), (lb, tb)):
        if not len(t):
            reasons = "; ".join(str(e) for e in t.attrs.get("errors", [])[:3])
            raise StatsFileError(f"{label} holds no statistics" + (f" ({reasons})" if reasons else ""))
    if steps is not None:
        keep = set(steps)
        ta, tb = ta[ta["step"].isin(keep)], tb[tb["step"].isin(keep)]
    errors = [str(e) for t in (ta, tb) for e in t.attrs.get("errors", [])]
    merged, aligned_by, unmatched = _align(ta, tb, la, lb)
    table = _differences(merged, tol, comparable_samples=_same_sampling(ta, tb))
    if noise is not None:
        table = _apply_noise(table, noise, tol, noise_factor)
    if pair is not None:
        table = apply_rank_rules(table, tolerances_given=tolerances is not None)
    first = _first_divergence(table)
    nonfinite = {la: _first_nonfinite(ta), lb: _first_nonfinite(tb)}
    return ActivationDiff(la, lb, table, first, nonfinite, aligned_by, tol, unmatched, errors, noise, pair)


def _same_model(a: Any, b: Any) -> None:
    """Two ortlab runs of different models are not a divergence: say so (the model is in each run's meta)."""
    models = []
    for source in (a, b):
        meta = getattr(source, "meta", None)
        if meta is None and isinstance(source, str | Path):
            meta = files.meta(source)
        models.append((meta or {}).get("model") if isinstance(meta, dict) else None)
    ma, mb = models
    # parameters only: a recorded loop names its model otherwise than a factory does
    if ma and mb and ma.get("parameters") and mb.get("parameters") and ma["parameters"] != mb["parameters"]:
        raise ActivationsError(f"the runs are of different models: {ma.get('name')} ({ma.get('parameters')} "
                               f"parameters) vs {mb.get('name')} ({mb.get('parameters')} parameters); "
                               "compare runs of one model")


def _same_sampling(ta, tb) -> bool:
    ka, kb = ta.attrs.get("kind"), tb.attrs.get("kind")
    if ka != kb:
        return False
    if ka == "ortlab":
        return ta.attrs.get("meta", {}).get("samples") == tb.attrs.get("meta", {}).get("samples")
    return True


def _align(ta, tb, la: str, lb: str):
    """Join the two tables per step and phase on the tensor name, or on ORT's names when one side is an ORT
    dump, or else on the forward position."""
    names_a, names_b = set(ta["name"]), set(tb["name"])
    ort_a, ort_b = set(ta["ort_name"]), set(tb["ort_name"])
    overlap = len(names_a & names_b) / max(1, min(len(names_a), len(names_b)))
    ort_overlap = len(ort_a & ort_b) / max(1, min(len(ort_a), len(ort_b)))
    if overlap >= 0.5 or (overlap > 0 and overlap >= ort_overlap):
        key, aligned_by = "name", "name"
    elif ort_overlap >= 0.5:
        key, aligned_by = "ort_name", "ORT name"
    else:
        key, aligned_by = "order", "forward position"
    a, b = ta.copy(), tb.copy()
    if key != "name":  # name the rows after the side with module paths (an ortlab run) when there is one
        donor = a if a.attrs.get("kind") == "ortlab" or b.attrs.get("kind") != "ortlab" else b
        names = donor.drop_duplicates([key]).set_index(key)[["name", "module"]]
        for t in (a, b):
            mapped = t[key].map(names["name"])
            t["module"] = t[key].map(names["module"]).fillna(t["module"])
            t["name"] = mapped.fillna(t["name"])
    on = ["step", "phase", key]
    merged = a.merge(b, on=on, how="inner", suffixes=("_a", "_b"))
    merged["name"] = merged["name_a"] if key != "name" else merged["name"]
    merged["module"] = merged["module_a"].where(merged["module_a"].astype(bool), merged["module_b"])
    merged["seq"] = merged["seq_a"]
    only_a = sorted(set(a[key].astype(str)) - set(b[key].astype(str)))
    only_b = sorted(set(b[key].astype(str)) - set(a[key].astype(str)))
    return merged, aligned_by, {la: only_a, lb: only_b}


def _differences(m, tol: Tolerances, comparable_samples: bool):
    import pandas as pd

    out = pd.DataFrame({"step": m["step"].astype(int), "phase": m["phase"], "seq": m["seq"].astype(int),
                        "name": m["name"], "module": m["module"]})
    with np.errstate(divide="ignore", invalid="ignore"):
        def scale(side: str) -> np.ndarray:
            rms = m[f"norm_{side}"].to_numpy(float) / np.sqrt(m[f"numel_{side}"].to_numpy(float))
            lo, hi = m[f"min_{side}"].to_numpy(float), m[f"max_{side}"].to_numpy(float)
            bound = np.maximum(np.abs(lo), np.abs(hi))
            return np.where(np.isfinite(rms), rms, bound)

        s = np.fmax(scale("a"), scale("b"))

        def rel(x, y, den):
            d = np.abs(x - y)
            r = np.where(d == 0, 0.0, d / den)
            return np.where(np.isnan(x) | np.isnan(y), np.nan, r)

        for metric in ("mean", "min", "max"):
            x, y = m[f"{metric}_a"].to_numpy(float), m[f"{metric}_b"].to_numpy(float)
            out[f"{metric}_a"], out[f"{metric}_b"] = x, y
            out[f"rel_{metric}"] = rel(x, y, np.fmax(np.fmax(np.abs(x), np.abs(y)), s))
        for metric in ("std", "norm"):
            x, y = m[f"{metric}_a"].to_numpy(float), m[f"{metric}_b"].to_numpy(float)
            if metric == "std":
                ok = m["std_reliable_a"].astype(bool).to_numpy() & m["std_reliable_b"].astype(bool).to_numpy()
                x, y = np.where(ok, x, np.nan), np.where(ok, y, np.nan)
            out[f"{metric}_a"], out[f"{metric}_b"] = x, y
            out[f"rel_{metric}"] = rel(x, y, np.fmax(np.abs(x), np.abs(y)))
        worst = [_sample_rel(p, q, sc) for p, q, sc in zip(m["samples_a"], m["samples_b"], s, strict=True)] \
            if comparable_samples else [(np.nan, np.nan, np.nan)] * len(m)
        out["rel_samples"] = [w[0] for w in worst]
        out["samples_a"] = [w[1] for w in worst]  # the most different pair
        out["samples_b"] = [w[2] for w in worst]
        for metric in ("zero", "nan", "inf"):
            out[f"{metric}_a"], out[f"{metric}_b"] = m[f"{metric}_a"].to_numpy(), m[f"{metric}_b"].to_numpy()
            out[f"rel_{metric}"] = np.abs(m[f"{metric}_a"].to_numpy(float) - m[f"{metric}_b"].to_numpy(float))
        out["rel_zero"] /= np.fmax(m["numel_a"].to_numpy(float), 1)  # zero count: a share of the elements
        out["shape_a"], out["shape_b"] = (m[f"shape_{s}"].astype(str).map(dims_text) for s in "ab")  # numbers
        out["rel_shape"] = (out["shape_a"] != out["shape_b"]).astype(float)
        for metric in METRICS:
            out[f"tol_{metric}"] = getattr(tol, metric)
    return _score(out)


def _sample_rel(p, q, sc: float) -> tuple[float, float, float]:
    """The largest relative difference among the paired samples, and that pair."""
    p, q = np.asarray(p, float), np.asarray(q, float)
    k = min(len(p), len(q))
    ok = ~(np.isnan(p[:k]) | np.isnan(q[:k]))
    if not ok.any():
        return np.nan, np.nan, np.nan
    p, q = p[:k][ok], q[:k][ok]
    d = np.abs(p - q)
    den = np.fmax(np.fmax(np.abs(p), np.abs(q)), sc if np.isfinite(sc) else 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(d == 0, 0.0, d / den)
    i = int(np.argmax(r))
    return float(r[i]), float(p[i]), float(q[i])


def _score(out):
    """score = the largest relative difference divided by its tolerance (> 1: diverged); worst = which."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.stack([np.where(out[f"rel_{m}"].to_numpy(float) == 0, 0.0,
                                    out[f"rel_{m}"].to_numpy(float) / out[f"tol_{m}"].to_numpy(float))
                           for m in METRICS], axis=1)
    finite = np.where(np.isnan(ratios), -1.0, ratios)
    worst = finite.argmax(axis=1) if len(out) else np.array([], int)
    score = finite.max(axis=1) if len(out) else np.array([])
    out["score"] = np.where(score < 0, np.nan, score)
    out["worst"] = [METRICS[i] for i in worst]
    out["diverged"] = out["score"] > 1
    return out.sort_values(["step", "seq"], ignore_index=True)


def _apply_noise(table, noise, tol: Tolerances, factor: float):
    floor = noise.floor if hasattr(noise, "floor") else noise
    t = table.merge(floor, on=["phase", "name"], how="left", suffixes=("", "_floor"))
    for m in METRICS:
        col = f"floor_{m}"
        if col in t:
            t[f"tol_{m}"] = np.fmax(getattr(tol, m), factor * t[col].fillna(0).to_numpy(float))
    return _score(t.drop(columns=[c for c in t.columns if c.startswith("floor_")]))


def _first_divergence(table) -> Divergence | None:
    bad = table[table["diverged"]]
    if not len(bad):
        return None
    row = bad.iloc[0]  # the table is sorted by step, then execution order
    same_step = table[(table["step"] == row["step"]) & (table["seq"] < row["seq"]) & ~table["diverged"]
                      & table["score"].notna()]
    previous = same_step.iloc[-1]["name"] if len(same_step) else None
    metric = row["worst"]
    a = row.get(f"{metric}_a", math.nan)
    b = row.get(f"{metric}_b", math.nan)
    return Divergence(int(row["step"]), row["phase"], row["name"], row["module"], metric,
                      _py(a), _py(b), float(row[f"rel_{metric}"]), float(row[f"tol_{metric}"]), previous)


def _py(v):
    if isinstance(v, np.generic):
        return v.item()
    return v


def _first_nonfinite(t) -> NonFinite | None:
    if not len(t):
        return None
    t = t.sort_values(["step", "seq"])
    bad = t[(t["nan"] > 0) | (t["inf"] > 0)]
    if not len(bad):
        return None
    row = bad.iloc[0]
    before = t[(t["step"] == row["step"]) & (t["seq"] < row["seq"])]
    previous = before.iloc[-1]["name"] if len(before) else None
    return NonFinite(int(row["step"]), row["phase"], row["name"], row["module"], int(row["nan"]),
                     int(row["inf"]), previous)

