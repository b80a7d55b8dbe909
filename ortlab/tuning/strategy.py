"""How the search fits its budget: every knob alone from the baseline when the budget holds them all, else the most
promising for the goal first; then the winners combined greedily (the best, then with the next winner, kept when
that is better still) while the budget lasts. The choice and why are part of the result.

A candidate's cost is measured, not guessed: the baseline's first burst (worker start and export included) plus its
guard (the parity burst and the verdict).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ortlab.tuning.errors import TuneError
from ortlab.tuning.goals import Goals
from ortlab.tuning.space import Candidate, Pruned

EVERY = "one knob at a time from the baseline, then the winners combined"
FIRST = "the most promising knobs for the goal first, then the winners combined"
# per objective, the knobs most likely to move it first ("plans": the plan files)
PRIORITY = {
    "memory": ("memory_opt_level", "plans", "enable_mem_efficient_grad_mgmt", "deepcopy_before_model_export"),
    "time": ("enable_compute_optimizer", "enable_embedding_sparse_optimizer", "enable_label_sparse_optimizer",
             "enable_mem_efficient_grad_mgmt", "deepcopy_before_model_export"),
    "rss": ("deepcopy_before_model_export", "enable_mem_efficient_grad_mgmt", "memory_opt_level"),
}


@dataclass
class Strategy:
    """The search chosen: its name, why, the single candidates in the order they run, and those left out."""

    name: str
    reason: str
    order: list[Candidate]
    left_out: list[Pruned] = field(default_factory=list)
    cost_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "reason": self.reason, "order": [c.name for c in self.order],
                "left_out": [p.to_dict() for p in self.left_out], "cost_s": self.cost_s}


def knob(candidate: Candidate) -> str:
    return "plans" if candidate.plans else next(iter(candidate.options), candidate.name)


def ranked(candidates: Sequence[Candidate], goals: Goals) -> list[Candidate]:
    """The candidates, the most promising for the objectives first; those that need a fresh worker last."""
    def rank(c: Candidate) -> tuple:
        places = [PRIORITY.get(m, ()).index(knob(c)) if knob(c) in PRIORITY.get(m, ()) else 99
                  for m in goals.objectives]
        return (c.restart, min(places), candidates.index(c))

    return sorted(candidates, key=rank)


def choose(candidates: Sequence[Candidate], goals: Goals, cost_s: float, budget_s: float,
           spent_s: float = 0.0) -> Strategy:
    """The strategy for these single candidates, each costing about `cost_s` seconds, in what is left of
    `budget_s` after `spent_s`. TuneError when not even one candidate fits."""
    left = budget_s - spent_s
    fits = int(left // cost_s) if cost_s > 0 else len(candidates) + 2
    minutes = budget_s / 60
    if not candidates:
        return Strategy(EVERY, "nothing to search: every candidate was pruned", [], [], cost_s)
    if fits < 1:
        need = math.ceil((spent_s + cost_s) / 60 * 10) / 10
        raise TuneError(f"budget {minutes:g} min is too small for one candidate: the baseline took "
                        f"{spent_s / 60:.1f} min and a candidate takes about {cost_s / 60:.1f} min (burst, export "
                        f"and verdict); allowed: a budget of at least {need:g} min")
    n = len(candidates)
    if fits >= n + 1:
        return Strategy(EVERY, f"the budget ({minutes:g} min) holds all {n} candidates at about {cost_s:.0f} s "
                               f"each, with room left to combine the winners", list(candidates), [], cost_s)
    keep = max(1, fits - 1) if fits >= 2 else 1
    order = ranked(candidates, goals)
    # one sentence for the count, in the strategy's reason and in every left-out candidate's
    holds = (f"the budget ({minutes:.3g} min) holds {keep} of the {n} candidates at about {cost_s:.0f} s each"
             + (", and one more run to combine the winners" if keep < fits else ""))
    objectives = " and ".join(goals.objectives)
    left_out = [Pruned(c.name, f"over the budget: {holds}") for c in order[keep:]]
    first = f"the {keep} most likely to improve {objectives} first" if keep > 1 else \
        f"the most likely to improve {objectives}"
    return Strategy(FIRST, f"{holds}: {first}", order[:keep], left_out, cost_s)
