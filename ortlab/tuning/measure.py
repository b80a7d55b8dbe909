"""What one burst measured, as the figures a goal is judged on, and the baseline's noise from its repeats.

Every figure comes from the run folder the burst wrote: the median step after warm-up (metrics.jsonl), the
activation peak and stash from ortlab's memory account (collector "memory": memory.json), and the process's peak
resident set (peak_mem_mb on the CPU; torch's allocator peak on CUDA).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from ortlab.account.record import MB
from ortlab.tuning.goals import METRICS

COLLECT = {"memory": {}}  # every measured burst: its activation-memory account


def figures(run: Any, warmup: int) -> dict[str, Any]:
    """{median_step_ms, activation_mb, stash_mb, rss_mb, exact, steps_timed} of one burst (None: not measured)."""
    m = run.metrics
    timed = m.iloc[warmup:] if len(m) > warmup else m.iloc[0:0]
    memory = run.memory or {}
    peak, stash = memory.get("peak_activation_bytes"), memory.get("stashed_bytes")
    return {"median_step_ms": float(timed["step_time_s"].median() * 1000) if len(timed) else None,
            "activation_mb": None if peak is None else peak / MB,
            "stash_mb": None if stash is None else stash / MB,
            "rss_mb": float(m["peak_mem_mb"].max()) if len(m) and "peak_mem_mb" in m else None,
            "exact": bool(memory.get("exact", not memory.get("uncertain"))) if peak is not None else None,
            "steps_timed": len(timed)}


def metric_values(row: dict[str, Any]) -> dict[str, float | None]:
    """{metric: value} of a row of figures (the goals' view of it)."""
    return {metric: row.get(column) for metric, (column, _, _) in METRICS.items()}


def baseline(rows: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, float]]:
    """The baseline's figures (the median of its repeats) and each metric's noise: the repeats' range over their
    median (relative), measured. One repeat has no measured noise: 0."""
    merged: dict[str, Any] = {}
    noise: dict[str, float] = {}
    for key in ("median_step_ms", "activation_mb", "stash_mb", "rss_mb"):
        values = [r[key] for r in rows if r.get(key) is not None]
        merged[key] = statistics.median(values) if values else None
    merged["exact"] = all(r.get("exact") for r in rows) if rows else None
    merged["steps_timed"] = sum(r.get("steps_timed", 0) for r in rows)
    for metric, (column, _, _) in METRICS.items():
        values = [r[column] for r in rows if r.get(column) is not None]
        middle = statistics.median(values) if values else None
        noise[metric] = (max(values) - min(values)) / middle if len(values) > 1 and middle else 0.0
    return merged, noise
