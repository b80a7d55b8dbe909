"""How evenly the ranks of a distributed burst were loaded, and how long they waited for the slowest.

Every step, each rank all-gathers its forward time and its batch's `load` and `tokens` (ortlab.engine.sampling)
as soon as its forward is done (the gather runs while the backward computes; ortlab.engine.ranks), and writes
into its metrics row:

- `load_imbalance`, `tokens_imbalance`: max over ranks / mean over ranks (1.0 = balanced);
- `padding_share`: the share of all ranks' tokens that are padding;
- `forward_s` (its own), `wait_s` = the slowest rank's forward time - its own, `mean_wait_s` over ranks.

The wait is measured on the forward (and loss) only: it holds no gradient all-reduce, so it is each rank's own
work. The backward waits again inside DDP's gradient all-reduce, which cannot be told apart from the compute
without timing inside the collective: the whole wait is larger (the backward does about twice the forward's work).
Time figures leave out step 0 (ORTModule's export, warm-up) when there are more.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

GATHERED = ("load", "tokens")  # the per-rank figures each rank all-gathers after its forward time
TABLE_COLUMNS = ("step", "rank", "samples", "load", "tokens", "padding", "forward_s", "wait_s", "step_time_s")


def _ratio(values: Sequence[float]) -> float | None:
    mean = sum(values) / len(values)
    return max(values) / mean if mean > 0 else None


def step_fields(rank: int, forward_s: Sequence[float], loads: Sequence[Sequence[float]]) -> dict[str, Any]:
    """One rank's row fields from the all-gathered figures: forward_s[r], loads[r] = (load, tokens) of rank r."""
    slowest = max(forward_s)
    out: dict[str, Any] = {"forward_s": forward_s[rank], "wait_s": slowest - forward_s[rank],
                           "mean_wait_s": sum(slowest - f for f in forward_s) / len(forward_s)}
    if all(not math.isnan(x) for row in loads for x in row):
        load, tokens = [row[0] for row in loads], [row[1] for row in loads]
        out["load_imbalance"] = _ratio(load)
        out["tokens_imbalance"] = _ratio(tokens)
        out["padding_share"] = (sum(tokens) - sum(load)) / sum(tokens) if sum(tokens) > 0 else None
    return out


def _number(value: Any) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def _timed(metrics):
    return metrics.iloc[1:] if len(metrics) > 1 else metrics


def summary(metrics, sampler: str | None = None) -> dict[str, Any]:
    """The burst's imbalance from one rank's metrics (the gathered figures are every rank's): the mean over
    steps of `load` and `tokens` imbalance (and the worst step's `load_max`), `padding_share`, and the waiting:
    `wait_s` (per rank, summed over steps) and `wait_share` (of the step time)."""
    import pandas as pd

    if "mean_wait_s" not in metrics:
        return {}
    out: dict[str, Any] = {"sampler": sampler, "steps": len(metrics)}
    if "load_imbalance" in metrics and metrics["load_imbalance"].notna().any():
        load, tokens, padding = (pd.to_numeric(metrics[k], errors="coerce")  # None where a mean was 0
                                 for k in ("load_imbalance", "tokens_imbalance", "padding_share"))
        out.update(load=_number(load.mean()), load_max=_number(load.max()), tokens=_number(tokens.mean()),
                   padding_share=_number(padding.mean()))
    timed = _timed(metrics)
    wait, total = float(timed["mean_wait_s"].sum()), float(timed["step_time_s"].sum())
    out.update(wait_s=wait, wait_share=wait / total if total > 0 else None)
    return out


def rank_fields(metrics) -> dict[str, Any]:
    """A rank's row in the run's `ranks`: its mean load and tokens per step and its total wait."""
    out: dict[str, Any] = {}
    for key in GATHERED:
        if key in metrics:
            out[f"mean_{key}"] = float(metrics[key].mean())
    if "wait_s" in metrics:
        out["wait_s"] = float(_timed(metrics)["wait_s"].sum())
    return out


def imbalance(run) -> dict[str, Any]:
    """A distributed burst's imbalance summary (see `summary`): the one in its meta, else from its metrics."""
    return run.meta.get("imbalance") or summary(run.metrics, run.meta.get("config", {}).get("sampler"))


def imbalance_table(run):
    """One row per step and rank of this machine's ranks: TABLE_COLUMNS (load columns need a dataset)."""
    import pandas as pd

    frames = []
    for rank in run.ranks:
        m = rank.metrics.copy()
        m["rank"] = rank.meta.get("rank", int(rank.path.name))
        frames.append(m)
    if not frames:
        return pd.DataFrame(columns=list(TABLE_COLUMNS))
    table = pd.concat(frames, ignore_index=True)
    return table[[c for c in TABLE_COLUMNS if c in table]].sort_values(["step", "rank"], ignore_index=True)


def sampler_comparison(runs: Mapping[str, Any]):
    """Per step and run (e.g. {"distributed": run_a, "load_balancing": run_b}): the load and tokens imbalance,
    the padding share and the mean wait, as a DataFrame (label, step, ...)."""
    import pandas as pd

    columns = ["step", "load_imbalance", "tokens_imbalance", "padding_share", "mean_wait_s"]
    frames = []
    for label, run in runs.items():
        m = run.metrics
        frame = m[[c for c in columns if c in m]].copy()
        frame.insert(0, "label", label)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["label", *columns])


def sampler_figure(runs: Mapping[str, Any]):
    """The figure comparing runs' samplers (ortlab.common.plots.imbalance_figure of `sampler_comparison`)."""
    from ortlab.common.plots import imbalance_figure

    table = sampler_comparison(runs)
    return imbalance_figure(table, {label: imbalance(run) for label, run in runs.items()})
