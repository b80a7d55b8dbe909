"""Which ORTModule options make a model fastest or smallest, guarded by the verdict.

    tuning = ortlab.tune(goal="memory", budget=5)      # the defaults first, one knob at a time, then combined
    tuning.table; tuning.pareto(); tuning.best; print(tuning.export_lines())

Modules: space (the options and plans searched, pruning with reasons), goals (Olive's goal vocabulary, the decision
with the baseline's noise), strategy (what fits the budget), measure (a burst's figures, the baseline's noise),
search (`Tuner`, `tune`), result (`Tuning`), figures (the pareto figure), errors.
"""

from ortlab.common.lazy import lazy as _lazy
from ortlab.tuning.errors import TuneError as TuneError

# name -> module, loaded on first use: `import ortlab.tuning` imports neither torch nor pandas.
_EXPORTS = {
    "tune": "ortlab.tuning.search",
    "Tuner": "ortlab.tuning.search",
    "Tuning": "ortlab.tuning.result",
    "Goal": "ortlab.tuning.goals",
    "Goals": "ortlab.tuning.goals",
    "parse_goals": "ortlab.tuning.goals",
    "decide": "ortlab.tuning.goals",
    "Candidate": "ortlab.tuning.space",
    "Pruned": "ortlab.tuning.space",
    "singles": "ortlab.tuning.space",
    "combined": "ortlab.tuning.space",
    "Strategy": "ortlab.tuning.strategy",
    "choose": "ortlab.tuning.strategy",
    "pareto_figure": "ortlab.tuning.figures",
}

__all__ = sorted([*_EXPORTS, "TuneError"])

__getattr__, __dir__ = _lazy(__name__, _EXPORTS, globals())
