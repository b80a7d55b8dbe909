"""A PyTorch burst beside an ORTModule burst of the same steps: the numbers a person compares first."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ortlab.run import Run


@dataclass
class Comparison:
    """`ortmodule` is None when the comparison was stopped during the PyTorch burst (the second never ran)."""

    pytorch: Run
    ortmodule: Run | None

    @property
    def runs(self) -> list[Run]:
        return [r for r in (self.pytorch, self.ortmodule) if r is not None]

    def losses(self):
        """Loss per step, one column per backend, and their absolute difference."""
        import pandas as pd

        pt = self.pytorch.metrics.set_index("step")["loss"] if len(self.pytorch.metrics) else pd.Series(dtype=float)
        ort = (self.ortmodule.metrics.set_index("step")["loss"] if self.ortmodule is not None
               and len(self.ortmodule.metrics) else pd.Series(dtype=float))
        df = pd.DataFrame({"pytorch": pt, "ortmodule": ort})
        df["abs_diff"] = (df["pytorch"] - df["ortmodule"]).abs()
        return df

    @property
    def verdict(self):
        """The Verdict on the two runs (agree or diverged, the evidence and the causes), as Session.judge wrote it
        into the ORTModule run's folder; None when none was made."""
        from ortlab.verdict.judge import FILE, Verdict

        data = self.ortmodule.read_json(FILE) if self.ortmodule is not None else None
        return Verdict.from_dict(data) if data else None

    @property
    def not_compared(self) -> str | None:
        """Why the two runs are not compared (loss difference, step time and memory ratios): the ORTModule run fell
        back to PyTorch, so its numbers are PyTorch's."""
        if self.ortmodule is not None and self.ortmodule.status == "fallback":
            return f"the ortmodule run is a PyTorch run ({self.ortmodule.error})"
        return None

    def to_dict(self) -> dict[str, Any]:
        pt = self.pytorch.summary()
        ort = self.ortmodule.summary() if self.ortmodule is not None else {"backend": "ortmodule", "status": "not run"}
        losses = self.losses().dropna()
        if self.not_compared:
            losses, ort = losses.iloc[:0], {k: v for k, v in ort.items() if k not in _COMPARED}
        out = {
            "pytorch": {**pt, "path": str(self.pytorch.path)},
            "ortmodule": {**ort, "path": str(self.ortmodule.path) if self.ortmodule is not None else None},
            "max_loss_diff": float(losses["abs_diff"].max()) if len(losses) else None,
            "step_time_ratio": (ort["median_step_s"] / pt["median_step_s"])
            if pt.get("median_step_s") and ort.get("median_step_s") else None,
            "ort_init_s": ort.get("ort_init_s"),
            "parity": bool(self.pytorch.meta.get("config", {}).get("parity")),
            "saved_for_backward_ratio": (ort["saved_for_backward_mb"] / pt["saved_for_backward_mb"])
            if pt.get("saved_for_backward_mb") and ort.get("saved_for_backward_mb") is not None else None,
        }
        if self.not_compared:
            out["not_compared"] = self.not_compared
        verdict = self.verdict
        out["verdict"] = verdict.to_dict() if verdict is not None else None
        for run in self.runs:
            if run.error or run.meta.get("warning"):
                out.setdefault("problems", []).append(f"{run.backend}: {run.error or run.meta['warning']}")
        return out

    def __str__(self) -> str:
        d = self.to_dict()

        def fmt(value, spec=".4f"):
            return "-" if value is None else format(value, spec)

        rows = [("", "pytorch", "ortmodule")]
        process = "peak CUDA allocated (MB)" if self.pytorch.meta.get("device") == "cuda" else "peak resident set (MB)"
        shown = (("status", "status", "s"), ("steps", "steps", "d"), ("final loss", "final_loss", ".4f"),
                 ("median step (ms)", "median_step_s", "ms"), (process, "peak_mem_mb", ".0f"),
                 ("kept for backward (MB)", "saved_for_backward_mb", ".2f"),
                 ("activation peak (MB)", "activation_peak_mb", ".2f"))
        for label, key, spec in shown:
            vals = []
            for backend in ("pytorch", "ortmodule"):
                v = d[backend].get(key)
                vals.append("-" if v is None else f"{v * 1000:.1f}" if spec == "ms" else format(v, spec))
            rows.append((label, *vals))
        if any(d[backend].get("fixes") for backend in ("pytorch", "ortmodule")):  # ortlab.compat fixes applied
            rows.insert(2, ("fixes", *(", ".join(d[backend].get("fixes") or []) or "-"
                                      for backend in ("pytorch", "ortmodule"))))
        if any(d[backend].get("nproc") for backend in ("pytorch", "ortmodule")):  # a distributed burst
            rows.append(("ranks", *(_ranks_cell(d[backend]) for backend in ("pytorch", "ortmodule"))))
        if any(d[backend].get("imbalance") for backend in ("pytorch", "ortmodule")):  # ranks (ortlab.balance)
            for label, key, spec in (("load imbalance (max/mean)", "load", ".3f"),
                                     ("ranks waited (of step)", "wait_share", ".1%")):
                rows.append((label, *(fmt((d[backend].get("imbalance") or {}).get(key), spec)
                                      for backend in ("pytorch", "ortmodule"))))
        width = max(len(r[0]) for r in rows)
        lines = [f"{r[0]:<{width}}  {r[1]:>12}  {r[2]:>12}" for r in rows]
        if d.get("verdict"):
            from ortlab.verdict.judge import Verdict

            lines += ["verdict: " + line if i == 0 else line
                      for i, line in enumerate(Verdict.from_dict(d["verdict"]).lines())]
        if d.get("not_compared"):
            lines.append("loss difference, step time ratio, memory: not compared: " + d["not_compared"])
        else:
            lines.append(f"max |loss difference| {fmt(d['max_loss_diff'], '.3g')}")
            lines.append(f"step time ratio (ortmodule / pytorch, median after step 0) "
                         f"{fmt(d['step_time_ratio'], '.2f')}")
            lines.append(f"ORT init overhead {fmt(d['ort_init_s'], '.2f')} s")
        lines += _memory_lines(d)
        if not d["parity"]:
            lines.append("not in parity mode: dropout and ORT's compute optimizer can make losses differ "
                         "(use --parity)")
        for problem in d.get("problems", []):
            lines.append(f"problem: {problem}")
        lines.append("runs: " + "\n      ".join(_shown(r.path) for r in self.runs))
        return "\n".join(lines)


# What a run that fell back to PyTorch cannot show of ORTModule (its figures would be PyTorch's under its name).
_COMPARED = ("median_step_s", "ort_init_s", "saved_for_backward_mb", "activation_peak_mb")


def _shown(path) -> str:
    """A run folder as a person reads it: relative to the working folder when inside it (no machine paths in a
    notebook's saved output), else absolute."""
    import os
    from pathlib import Path

    try:
        return os.path.relpath(path) if Path(path).resolve().is_relative_to(Path.cwd().resolve()) else str(path)
    except ValueError:
        return str(path)


def _memory_lines(d: dict[str, Any]) -> list[str]:
    """What the accounted rows count (the process figure counts everything the process holds), or why a backend
    has no account."""
    accounted = [b for b in ("pytorch", "ortmodule") if d[b].get("memory_counts") and not d[b].get("memory_missing")]
    lines = []
    if accounted:
        lines.append("accounted rows: activations only (ortlab.account), exact at the burst's shapes; the "
                     "process's peak counts everything it holds:")
        lines += [f"  {d[b]['memory_counts']}" for b in accounted]
    lines += [f"no activation account for {b}: {d[b]['memory_missing']}" for b in ("pytorch", "ortmodule")
              if d[b].get("memory_missing")]
    return lines


def _ranks_cell(summary: dict[str, Any]) -> str:
    """"2, in sync" / "2, NOT in sync" / "-": how many ranks and whether their parameters stayed equal."""
    ranks = summary.get("ranks")
    if not ranks:
        return "-"
    sync = {True: "in sync", False: "NOT in sync"}.get(summary.get("in_sync"), "sync unknown")
    return f"{len(ranks)}, {sync}"
