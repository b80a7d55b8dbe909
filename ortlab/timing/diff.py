"""What changed between two profiled runs: per module (and, where both runs were timed by the same profiler, per op
type and ORT node), what was added, removed, got faster or slower, by how many ms and % and with what share of the
step. Read from the two runs' time.json alone, so it works across backends (ORTModule's nodes against PyTorch's
ops, both attributed to the module path that timing.profile gives them) and across stacks (two run folders made
by different torch or onnxruntime versions: nothing in it belongs to the process that made them)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ortlab.timing.errors import TimeError

ADDED, REMOVED, SLOWER, FASTER, SAME = "added", "removed", "slower", "faster", "same"
UNSEEN = "not timed"  # only one profiler sees that phase's kernels (ORTModule's optimizer is PyTorch's, outside ORT)
SAME_SHARE = 0.005  # a change smaller than this share of A's step counts as no change (the profilers' own noise)
COLUMNS = ["what", "name", "phase", "a ms", "b ms", "change ms", "change %", "share of step %", "change"]


@dataclass
class TimeDiff:
    """Run `a` against run `b` (labels and folders): `parts` (the step part by part), `rows` (one row per module,
    op type or node and phase: COLUMNS, largest change first; `share of step %` is the change against A's step),
    `step_ms` ((a, b)), `notes` (what the matching could not see), `versions` (each run's stack)."""

    a: str
    b: str
    paths: tuple[str, str]
    step_ms: tuple[float, float]
    parts: Any  # DataFrame: phase, part, a ms, b ms, change ms
    rows: Any  # DataFrame: COLUMNS
    versions: dict[str, dict[str, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def largest(self) -> dict[str, Any] | None:
        """The row with the largest change in ms (either way), or None when nothing changed."""
        changed = self.rows[~self.rows["change"].isin((SAME, UNSEEN))]
        return changed.iloc[0].to_dict() if len(changed) else None

    def of(self, what: str):
        """The rows of one kind: "module", "op" or "node"."""
        return self.rows[self.rows["what"] == what].reset_index(drop=True)

    def headline(self) -> str:
        """The step's change and the largest change, in one line each."""
        a, b = self.step_ms
        lines = [f"step: {a:.2f} ms -> {b:.2f} ms ({_signed(b - a)} ms, {_percent(b - a, a)})"]
        row = self.largest
        if row is None:
            lines.append(f"largest change: none beyond {SAME_SHARE:.1%} of the step")
        else:
            lines.append(f"largest change: {row['what']} {row['name']} ({row['phase']}) {row['change']}: "
                         f"{row['a ms']:.3f} ms -> {row['b ms']:.3f} ms ({_signed(row['change ms'])} ms, "
                         f"{_percent(row['change ms'], row['a ms'])}, {row['share of step %']:+.1f}% of the step)")
        return "\n".join(lines)

    def report(self, top: int = 10) -> str:
        """The diff as text (`ortlab time A B --diff`): the headline, the step part by part, then per kind the
        `top` largest changes and what was added or removed."""
        import pandas as pd

        out = [f"{self.a} -> {self.b} (A: {self.paths[0]}, B: {self.paths[1]}), ms per profiled step",
               self.headline(), ""]
        with pd.option_context("display.width", 160, "display.max_columns", 20, "display.max_colwidth", 70,
                               "display.float_format", "{:.3f}".format):
            out += ["the step, part by part:", self.parts.to_string(index=False)]
            for what, title in (("module", "modules"), ("op", "op types"), ("node", "ORT nodes")):
                rows = self.of(what)
                if not len(rows):
                    continue
                changed = rows[rows["change"] != SAME]
                counts = ", ".join(f"{n} {k}" for k, n in changed["change"].value_counts().items())
                out += ["", f"{title} ({counts or 'no change'}), the {top} largest changes:",
                        changed.head(top).drop(columns=["what"]).to_string(index=False) if len(changed)
                        else "none"]
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        """Plain data (JSON-ready): what `ortlab time A B --diff --json` prints."""
        rows = self.rows if top is None else self.rows.groupby("what", sort=False).head(top)
        return {"a": self.a, "b": self.b, "paths": list(self.paths), "step_ms": list(self.step_ms),
                "largest": self.largest, "parts": json.loads(self.parts.to_json(orient="records")),
                "rows": json.loads(rows.to_json(orient="records")), "versions": self.versions,
                "notes": self.notes}

    def __str__(self) -> str:
        return self.report()


def time_diff(a: Any, b: Any) -> TimeDiff:
    """Run `a` against run `b` (Runs or folders, each with time data): what changed, largest change first."""
    import pandas as pd

    from ortlab.timing.table import load

    (la, da), (lb, db) = _first(load(a), a), _first(load(b), b)
    if la == lb:
        la, lb = f"{la} (A)", f"{lb} (B)"
    step = (da["step_s"] * 1e3, db["step_s"] * 1e3)
    parts = _parts(da, db)
    rows = [*_rows("module", da, db, ("module",), step[0])]
    notes = []
    same_source = da.get("tool") == db.get("tool")
    if same_source:
        rows += _rows("op", da, db, ("op",), step[0])
        if da.get("nodes") and db.get("nodes"):
            rows += _rows("node", da, db, ("node",), step[0])
            notes.append("ORT nodes: each run keeps its top nodes only (time.json); a node outside one run's top "
                         "counts as added or removed")
    else:
        notes.append(f"two profilers ({da.get('tool')}; {db.get('tool')}): matched by module only (the module path "
                     "each profiler attributes its kernels to); op types and nodes are not comparable across "
                     "backends. An ORT node whose name carries no module scope (fused, or made by ORT's gradient "
                     "builder) counts under '(not in a module)'")
    versions = {la: da.get("_versions") or {}, lb: db.get("_versions") or {}}
    stack = sorted(k for k in set(versions[la]) | set(versions[lb]) if versions[la].get(k) != versions[lb].get(k))
    if stack:
        notes.append("different stacks: " + ", ".join(f"{k} {versions[la].get(k, '-')} -> {versions[lb].get(k, '-')}"
                                                       for k in stack if k != "ortlab"))
    unseen = sorted((_timed(da) | _timed(db)) - (_timed(da) & _timed(db)))
    if unseen:
        notes.append(f"'{UNSEEN}': the {', '.join(unseen)} kernels are timed in one run only (ORTModule's optimizer "
                     "is PyTorch's, outside ORT's profiler): compare that phase's wall clock in the parts above")
    notes.append(f"'same': a change under {SAME_SHARE:.1%} of A's step ({SAME_SHARE * step[0]:.3f} ms)")
    frame = pd.DataFrame(rows, columns=COLUMNS)
    frame = frame.reindex(frame["change ms"].abs().sort_values(ascending=False, kind="stable").index)
    return TimeDiff(la, lb, (da["_path"], db["_path"]), step, parts, frame.reset_index(drop=True), versions, notes)


def _first(loaded: list[tuple[str, dict[str, Any]]], source: Any) -> tuple[str, dict[str, Any]]:
    """One profile per side: a distributed run's rank 0 (its ranks differ by their data only)."""
    from ortlab.runs.run import load_run

    label, data = loaded[0]
    try:
        data["_versions"] = load_run(data["_path"]).versions
    except Exception:  # a rank folder without meta: its run's versions are the same
        data["_versions"] = {}
    if not data.get("step_s"):
        raise TimeError(f"{getattr(source, 'path', source)}: its time data has no profiled step")
    return label, data


def _parts(da: dict[str, Any], db: dict[str, Any]):
    import pandas as pd

    keys = list(dict.fromkeys((p["phase"], p["kind"]) for p in [*da["parts"], *db["parts"]]))
    sa = {(p["phase"], p["kind"]): p["s"] * 1e3 for p in da["parts"]}
    sb = {(p["phase"], p["kind"]): p["s"] * 1e3 for p in db["parts"]}
    rows = [{"phase": ph, "part": kind, "a ms": sa.get((ph, kind), 0.0), "b ms": sb.get((ph, kind), 0.0)}
            for ph, kind in keys]
    rows.append({"phase": "step", "part": "", "a ms": da["step_s"] * 1e3, "b ms": db["step_s"] * 1e3})
    frame = pd.DataFrame(rows)
    frame["change ms"] = frame["b ms"] - frame["a ms"]
    return frame


def _sums(data: dict[str, Any], what: str, keys: tuple[str, ...]) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for r in data.get(f"{what}s", []):
        key = (*(r[k] for k in keys), r["phase"])
        out[key] = out.get(key, 0.0) + r["s"] * 1e3
    return out


def _timed(data: dict[str, Any]) -> set[str]:
    """The phases whose kernels the run's profiler timed (ORT's profiler sees no optimizer: it is PyTorch's)."""
    return {p["phase"] for p in data["parts"] if p["kind"] == "kernels" and p["s"] > 0}


def _rows(what: str, da: dict[str, Any], db: dict[str, Any], keys: tuple[str, ...], step_a: float):
    a, b = _sums(da, what, keys), _sums(db, what, keys)
    timed_a, timed_b = _timed(da), _timed(db)
    for key in dict.fromkeys([*a, *b]):
        ma, mb = a.get(key, 0.0), b.get(key, 0.0)
        change = mb - ma
        if key[-1] not in timed_a or key[-1] not in timed_b:
            kind = UNSEEN
        elif key not in a or ma == 0.0:
            kind = ADDED
        elif key not in b or mb == 0.0:
            kind = REMOVED
        elif abs(change) < SAME_SHARE * step_a:
            kind = SAME
        else:
            kind = SLOWER if change > 0 else FASTER
        yield {"what": what, "name": key[0], "phase": key[-1], "a ms": ma, "b ms": mb, "change ms": change,
               "change %": 100 * change / ma if ma else None, "share of step %": 100 * change / step_a if step_a
               else None, "change": kind}


def _signed(value: float) -> str:
    return f"{value:+.3f}"


def _percent(change: float, base: float) -> str:
    return f"{100 * change / base:+.1f}%" if base else "new"
