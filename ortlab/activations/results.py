"""What a comparison of two runs' activation statistics says: the tolerances it used, the first divergence,
each run's first nan/inf, and the table of differences behind them (`ActivationDiff`, which `compare`
returns)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ortlab.activations.errors import ActivationsError

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
                raise ActivationsError(f"tolerance for {unknown[0]!r} is not known; known: "
                                       f"{', '.join(METRICS)}")
            bad = [k for k, v in value.items()
                   if not isinstance(v, int | float) or isinstance(v, bool) or v < 0]
            if bad:
                raise ActivationsError(f"tolerance {bad[0]}={value[bad[0]]!r} is not allowed; allowed: a "
                                       "number >= 0")
            return cls(**{k: float(v) for k, v in value.items()})
        raise ActivationsError(f"tolerances {value!r} are not allowed; allowed: a number >= 0, a dict per "
                               "statistic or ortlab.activations.Tolerances")


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
        before = (f"; last match before it: {self.previous}" if self.previous
                  else "; nothing before it matched")
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


def _rank_lines(diff) -> list[str]:
    from ortlab.activations.ranks import rank_lines

    return rank_lines(diff)


def _fmt(v: float) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


@dataclass
class ActivationDiff:
    """The comparison of two sources: per tensor and step the relative difference of each statistic
    (`table`), the first divergence, and each run's first nan/inf producer."""

    a: str
    b: str
    # DataFrame: step, phase, seq, name, module, <metric>_a/_b, rel_<metric>, tol_<metric>, score, worst
    table: Any
    first: Divergence | None
    nonfinite: dict[str, NonFinite | None]
    aligned_by: str  # "name", "ORT name" or "forward position"
    tolerances: Tolerances
    unmatched: dict[str, list[str]] = field(default_factory=dict)  # names only one side has
    errors: list[str] = field(default_factory=list)  # unreadable dump files
    noise: Any = None  # the NoiseFloor used, if any
    ranks: tuple[int, int] | None = None  # two ranks of a distributed burst: only parameter gradients must match

    @property
    def diverged(self) -> bool:
        return self.first is not None

    def top(self, n: int = 10):
        """The n largest differences (relative to tolerance), one row per tensor: its worst step."""
        t = self.table.dropna(subset=["score"])
        if self.ranks is not None:  # differences by data are expected between ranks
            t = t[~t["expected"] & (t["score"] > 0)]
        t = t.sort_values("score", ascending=False)
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
                "noise_floor": bool(self.noise is not None), "ranks": list(self.ranks) if self.ranks else None,
                "rank_notes": _rank_lines(self) if self.ranks else None,
                "top": self.top(10).to_dict(orient="records"),
                "compared": {"tensors": int(self.table["name"].nunique()),
                             "steps": int(self.table["step"].nunique())}}

    def __str__(self) -> str:
        return self.report()

    def report(self, top: int = 10) -> str:
        """The first divergence, the first nan/inf per run, then the `top` largest differences."""
        against = ", against the noise floor" if self.noise is not None else ""
        lines = [f"{self.a} vs {self.b}: {self.table['name'].nunique()} tensors x "
                 f"{self.table['step'].nunique()} steps, aligned by {self.aligned_by}{against}"]
        if self.ranks is not None:
            lines += _rank_lines(self)
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
        largest = self.top(top)
        if len(largest):
            lines.append("largest differences (relative to tolerance):")
            lines.append(largest.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
        return "\n".join(lines)

    def __repr__(self) -> str:
        first = "none"
        if self.first:
            first = f"{self.first.name!r} at step {self.first.step} ({self.first.phase})"
        return f"ActivationDiff({self.a!r} vs {self.b!r}, first divergence: {first})"
