"""The move of a distributed job, rank by rank: what each rank of the ORTModule run and the same rank of the
torch.compile run cost (peak memory, median step after start-up, the share of the step with a collective in flight,
the optimizer state it holds), as the runs recorded them (ortlab.engine.launch's rows, ortlab.engine.comm), mapped
by rank and with their ratios. A figure a rank did not record is missing, never estimated."""

from __future__ import annotations

from typing import Any

# (key in a rank's row, label, scale to the unit shown, unit, whether a ratio means something)
FIGURES = (("peak_mem_mb", "peak memory", 1.0, "MB", True),
           ("median_step_s", "median step", 1000.0, "ms", True),
           ("comm_share", "in communication", 100.0, "% of step", False),
           ("optimizer_state_bytes", "optimizer state", 1 / 2**20, "MB", True))


def rank_rows(run: Any) -> list[dict[str, Any]]:
    """A distributed run's ranks as its meta.json keeps them (one row per rank, lowest first); [] for one process."""
    rows = run.meta.get("ranks") if hasattr(run, "meta") else None
    return sorted((r for r in rows or [] if isinstance(r, dict)), key=lambda r: r.get("rank", 0))


def mapped(ort: list[dict[str, Any]], target: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rank r of one run beside rank r of the other: {rank, figure: {from, to, ratio}} per figure."""
    by_rank = {r.get("rank"): r for r in target}
    out = []
    for row in ort:
        other = by_rank.get(row.get("rank"), {})
        entry: dict[str, Any] = {"rank": row.get("rank")}
        for key, _label, scale, _unit, ratio in FIGURES:
            a, b = _scaled(row.get(key), scale), _scaled(other.get(key), scale)
            entry[key] = {"from": a, "to": b, "ratio": b / a if ratio and a and b is not None else None}
        out.append(entry)
    extra = sorted(set(by_rank) - {r.get("rank") for r in ort}, key=lambda r: r or 0)
    for rank in extra:  # the target ran more ranks: its own figures, nothing to map them to
        out.append({"rank": rank, **{key: {"from": None, "to": _scaled(by_rank[rank].get(key), scale), "ratio": None}
                                     for key, _l, scale, _u, _r in FIGURES}})
    return out


def lines(rows: list[dict[str, Any]], ort_words: str, target_words: str) -> list[str]:
    """The mapped ranks as text: a header naming both runs' strategies, one line per rank."""
    if not rows:
        return []
    heads = [f"{label} ({unit})" for _k, label, _s, unit, _r in FIGURES]
    cells = [[_cell(r[key]) for key, *_ in FIGURES] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    out = [f"per rank: {ort_words} -> {target_words}",
           "  rank  " + "  ".join(f"{h:>{w}}" for h, w in zip(heads, widths, strict=True))]
    for row, cell in zip(rows, cells, strict=True):
        out.append(f"  {row['rank']!s:>4}  " + "  ".join(f"{c:>{w}}" for c, w in zip(cell, widths, strict=True)))
    return out


def _scaled(value: Any, scale: float) -> float | None:
    return float(value) * scale if isinstance(value, int | float) and not isinstance(value, bool) else None


def _cell(figure: dict[str, Any]) -> str:
    a, b, ratio = figure["from"], figure["to"], figure["ratio"]
    text = f"{_num(a)} -> {_num(b)}"
    return f"{text} ({ratio:.2f}x)" if ratio is not None else text


def _num(value: float | None) -> str:
    return "missing" if value is None else f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


__all__ = ["FIGURES", "lines", "mapped", "rank_rows"]
