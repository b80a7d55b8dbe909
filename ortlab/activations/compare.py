"""Compare two sources of activation statistics (ortlab runs or ORT dump folders, in any mix) and find the
first divergence: the earliest step, and in it the earliest tensor in execution order, whose difference
exceeds its tolerance (or the run-to-run noise floor).

Differences are relative to a scale that keeps values near zero from looking big: mean, min, max and samples
against the larger of the two values and the tensor's RMS; std and norm against the larger of the two; the
zero count as a share of the elements; nan and inf counts must be equal.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from ortlab.activations.table import read_stats

METRICS = ("mean", "std", "min", "max", "norm", "samples", "zero", "nan", "inf", "shape")


@dataclass(frozen=True)
class Tolerances:
    """Largest relative difference that still matches, per statistic. The defaults pass PyTorch against
    ORTModule in parity mode (differences ~1e-7 per step, growing to ~1e-5 over tens of steps of training)
    and catch a 0.1% change in one module."""

    mean: float = 1e-3
    std: float = 1e-3
    min: float = 1e-3
    max: float = 1e-3
    norm: float = 1e-3
    samples: float = 1e-3
    zero: float = 1e-3  # share of the elements
    nan: float = 0.0  # counts must be equal
    inf: float = 0.0
    shape: float = 0.0

    @classmethod
    def of(cls, value: Tolerances | float | dict | None) -> Tolerances:
        if value is None:
            return cls()
        if isinstance(value, Tolerances):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            return cls(**{m: float(value) for m in ("mean", "std", "min", "max", "norm", "samples", "zero")})
        if isinstance(value, dict):
            unknown = sorted(set(value) - {f.name for f in fields(cls)})
            if unknown:
                raise ValueError(f"tolerance for {unknown[0]!r} is not known; known: {', '.join(METRICS)}")
            bad = [k for k, v in value.items() if not isinstance(v, int | float) or isinstance(v, bool) or v < 0]
            if bad:
                raise ValueError(f"tolerance {bad[0]}={value[bad[0]]!r} is not allowed; allowed: a number >= 0")
            return cls(**{k: float(v) for k, v in value.items()})
        raise ValueError(f"tolerances {value!r} are not allowed; allowed: a number >= 0, a dict per statistic "
                         "or ortlab.activations.Tolerances")


@dataclass(frozen=True)
class Divergence:
    """Where two runs first differ beyond tolerance: the tensor, its worst statistic, and what came just
    before it in execution order that still matched."""

    step: int
    phase: str
    name: str
    module: str
    metric: str
    a: float
    b: float
    rel: float
    tolerance: float
    previous: str | None  # the last tensor before it (same step, execution order) that matched

    def __str__(self) -> str:
        where = f"step {self.step}, {self.phase}: {self.name}"
        if self.module and self.module != self.name:
            where += f" (module {self.module})"
        before = f"; last match before it: {self.previous}" if self.previous else "; nothing before it matched"
        what = {"samples": "a sampled value", "zero": "zero count", "nan": "nan count", "inf": "inf count"}
        diff = "relative difference" if self.metric not in ("nan", "inf", "shape") else "difference"
        return (f"{where}: {what.get(self.metric, self.metric)} {_fmt(self.a)} vs {_fmt(self.b)} ({diff} "
                f"{self.rel:.3g} > {self.tolerance:.3g}){before}")


@dataclass(frozen=True)
class NonFinite:
    """The first tensor (earliest step, then execution order) holding nan or inf values in one run."""

    step: int
    phase: str
    name: str
    module: str
    nan: int
    inf: int
    previous: str | None  # the tensor just before it in execution order (finite)

    def __str__(self) -> str:
        return (f"step {self.step}, {self.phase}: {self.name} has {self.nan} nan and {self.inf} inf"
                + (f" (after {self.previous})" if self.previous else ""))


def _fmt(v: float) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


# --------------------------------------------------------------------------- sources


def load(source: Any, model: Any = None):
    """A table from a Run, a run folder, a stats.npz, an ORT StatisticsSubscriber folder or a table itself."""
    import pandas as pd

    from ortlab.activations.legacy import is_dump, read_dump

    from ortlab.activations.table import STATS_FILE, StatsFileError

    if isinstance(source, pd.DataFrame):
        return source
    path = Path(getattr(source, "path", source))
    if path.is_dir() and is_dump(path):
        return read_dump(path, model=model)
    if path.is_dir() and not (path / STATS_FILE).exists() and not (path / "meta.json").exists():
        raise StatsFileError(f"{path} is neither an ortlab run with statistics ({STATS_FILE}) nor an ORT "
                             "StatisticsSubscriber folder (step_N/order.txt)")
    return read_stats(path)


def _label(source: Any, table) -> str:
    if hasattr(source, "path"):
        return Path(source.path).name
    if isinstance(source, str | Path):
        return Path(source).name
    return table.attrs.get("source", "table")


# --------------------------------------------------------------------------- the comparison


@dataclass
class ActivationDiff:
    """The comparison of two sources: per tensor and step the relative difference of each statistic
    (`table`), the first divergence, and each run's first nan/inf producer."""

    a: str
    b: str
    table: Any  # DataFrame: step, phase, seq, name, module, <metric>_a/_b, rel_<metric>, tol_<metric>, score, worst
    first: Divergence | None
    nonfinite: dict[str, NonFinite | None]
    aligned_by: str  # "name", "ORT name" or "forward position"
    tolerances: Tolerances
    unmatched: dict[str, list[str]] = field(default_factory=dict)  # names only one side has
    errors: list[str] = field(default_factory=list)  # unreadable dump files
    noise: Any = None  # the NoiseFloor used, if any

    @property
    def diverged(self) -> bool:
        return self.first is not None

    def top(self, n: int = 10):
        """The n largest differences (relative to tolerance), one row per tensor: its worst step."""
        t = self.table.dropna(subset=["score"]).sort_values("score", ascending=False)
        t = t.drop_duplicates(["phase", "name"])
        out = t.head(n).copy()
        out["rel"] = [row[f"rel_{row['worst']}"] for _, row in out.iterrows()]
        out["tolerance"] = [row[f"tol_{row['worst']}"] for _, row in out.iterrows()]
        cols = ["step", "phase", "name", "module", "worst", "rel", "tolerance", "score"]
        return out[cols].reset_index(drop=True)

    def over_steps(self, name: str, phase: str = "forward"):
        """Both runs' statistics of one tensor over the steps, as a DataFrame."""
        t = self.table[(self.table["name"] == name) & (self.table["phase"] == phase)]
        if not len(t):
            raise KeyError(f"no tensor {name!r} in the {phase} of both runs; names look like "
                           f"{', '.join(self.table['name'].drop_duplicates().head(5))}")
        cols = [c for m in ("mean", "std", "min", "max", "norm") for c in (f"{m}_a", f"{m}_b", f"rel_{m}")]
        return t.set_index("step")[[*cols, "score"]]

    def heatmap(self, metric: str = "score", max_tensors: int = 80):
        """Figure: relative difference per tensor (rows, in execution order) and step (columns)."""
        from ortlab.activations.plots import diff_heatmap

        return diff_heatmap(self, metric, max_tensors)

    def figure(self, name: str, phase: str = "forward"):
        """Figure: one tensor's statistics over the steps in both runs, and their relative difference."""
        from ortlab.activations.plots import tensor_over_steps

        return tensor_over_steps(self, name, phase)

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "aligned_by": self.aligned_by, "diverged": self.diverged,
                "first": asdict(self.first) if self.first else None,
                "nonfinite": {k: asdict(v) if v else None for k, v in self.nonfinite.items()},
                "tolerances": asdict(self.tolerances), "unmatched": self.unmatched, "errors": self.errors,
                "noise_floor": bool(self.noise is not None),
                "top": self.top(10).to_dict(orient="records"),
                "compared": {"tensors": int(self.table["name"].nunique()), "steps": int(self.table["step"].nunique())}}

    def __str__(self) -> str:
        return self.report()

    def report(self, top: int = 10) -> str:
        """The first divergence, the first nan/inf per run, then the `top` largest differences."""
        lines = [f"{self.a} vs {self.b}: {self.table['name'].nunique()} tensors x {self.table['step'].nunique()} "
                 f"steps, aligned by {self.aligned_by}" + (", against the noise floor" if self.noise is not None else "")]
        lines.append(f"first divergence: {self.first}" if self.first else "no divergence beyond tolerance")
        for label, nf in self.nonfinite.items():
            if nf:
                lines.append(f"first nan/inf in {label}: {nf}")
        for label, names in self.unmatched.items():
            if names:
                more = ", ..." if len(names) > 4 else ""
                lines.append(f"only in {label}: {len(names)} tensors ({', '.join(names[:4])}{more})")
        for e in self.errors[:5]:
            lines.append(f"unreadable: {e}")
        top = self.top(top)
        if len(top):
            lines.append("largest differences (relative to tolerance):")
            lines.append(top.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
        return "\n".join(lines)

    def __repr__(self) -> str:
        first = f"{self.first.name!r} at step {self.first.step} ({self.first.phase})" if self.first else "none"
        return f"ActivationDiff({self.a!r} vs {self.b!r}, first divergence: {first})"


def compare(a: Any, b: Any = None, tolerances: Tolerances | float | dict | None = None, *, noise: Any = None,
            noise_factor: float = 1.0, model: Any = None, steps: Any = None) -> ActivationDiff:
    """Compare two sources (Run, run folder, ORT dump folder or table; or one ortlab Comparison from
    Session.compare). `tolerances`: one number for every statistic or a dict per statistic. `noise`: a
    NoiseFloor, whose run-to-run differences (times `noise_factor`) raise the tolerance per tensor and step.
    `model`: the nn.Module of an ORT dump, to name its tensors by module path. `steps`: only these steps.
    Against a noise floor, each tensor's tolerance becomes the larger of `tolerances` and `noise_factor` times
    that tensor's run-to-run difference."""
    if b is None and hasattr(a, "pytorch") and hasattr(a, "ortmodule"):
        a, b = a.pytorch, a.ortmodule
    if b is None:
        raise ValueError("compare needs two sources (or one Comparison from Session.compare)")
    tol = Tolerances.of(tolerances)
    ta, tb = load(a, model), load(b, model)
    la, lb = _label(a, ta), _label(b, tb)
    if la == lb:
        la, lb = f"{la} (a)", f"{lb} (b)"
    for label, t in ((la, ta), (lb, tb)):
        if not len(t):
            errors = "; ".join(str(e) for e in t.attrs.get("errors", [])[:3])
            raise ValueError(f"{label} holds no statistics" + (f" ({errors})" if errors else ""))
    if steps is not None:
        keep = set(steps)
        ta, tb = ta[ta["step"].isin(keep)], tb[tb["step"].isin(keep)]
    errors = [str(e) for t in (ta, tb) for e in t.attrs.get("errors", [])]
    merged, aligned_by, unmatched = _align(ta, tb, la, lb)
    table = _differences(merged, tol, comparable_samples=_same_sampling(ta, tb))
    if noise is not None:
        table = _apply_noise(table, noise, tol, noise_factor)
    first = _first_divergence(table)
    nonfinite = {la: _first_nonfinite(ta), lb: _first_nonfinite(tb)}
    return ActivationDiff(la, lb, table, first, nonfinite, aligned_by, tol, unmatched, errors, noise)


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
            bound = np.maximum(np.abs(m[f"min_{side}"].to_numpy(float)), np.abs(m[f"max_{side}"].to_numpy(float)))
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
        out["samples_a"], out["samples_b"] = [w[1] for w in worst], [w[2] for w in worst]  # the most different pair
        for metric in ("zero", "nan", "inf"):
            out[f"{metric}_a"], out[f"{metric}_b"] = m[f"{metric}_a"].to_numpy(), m[f"{metric}_b"].to_numpy()
            out[f"rel_{metric}"] = np.abs(m[f"{metric}_a"].to_numpy(float) - m[f"{metric}_b"].to_numpy(float))
        out["rel_zero"] /= np.fmax(m["numel_a"].to_numpy(float), 1)  # the zero count: as a share of the elements
        out["shape_a"], out["shape_b"] = m["shape_a"].astype(str), m["shape_b"].astype(str)
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
    return NonFinite(int(row["step"]), row["phase"], row["name"], row["module"], int(row["nan"]), int(row["inf"]),
                     previous)
