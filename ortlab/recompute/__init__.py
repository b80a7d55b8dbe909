"""The memory optimizer's recompute plans as data: read from ORT, evaluate for other shapes, choose, measure.

    run = session.burst("ortmodule", 2, collect={"plans": {}})
    table = ortlab.recompute.plans(run)          # one row per plan, largest saving first
    ortlab.recompute.what_if(table, input_ids_dim1=512)
    ortlab.recompute.write_config([1, 2], "plans.json", plans=table)   # ORTMODULE_MEMORY_OPT_CONFIG
    sweep = ortlab.recompute.plan_sweep(session)  # per plan set: step time, accounted saving, loss equality

Modules: expr (plan ids, symbolic savings), observer (ORT's plans from a wrap), collector ("plans"), table
(plans, what_if, plan_config, write_config), sweep (plan_sweep), figures.
"""

from ortlab.common.lazy import lazy as _lazy
from ortlab.recompute.errors import PlanError as PlanError

# name -> module, loaded on first use: `import ortlab.recompute` imports neither torch nor pandas.
_EXPORTS = {
    "evaluate": "ortlab.recompute.expr",
    "TYPE_NAMES": "ortlab.recompute.expr",
    "read_plans": "ortlab.recompute.observer",
    "recompute_nodes": "ortlab.recompute.observer",
    "PlanCollector": "ortlab.recompute.collector",
    "PLANS_FILE": "ortlab.recompute.table",
    "plans": "ortlab.recompute.table",
    "what_if": "ortlab.recompute.table",
    "plan_config": "ortlab.recompute.table",
    "write_config": "ortlab.recompute.table",
    "Sweep": "ortlab.recompute.sweep",
    "plan_sweep": "ortlab.recompute.sweep",
    "default_sets": "ortlab.recompute.sweep",
    "LOSS_RTOL": "ortlab.recompute.sweep",
    "what_if_figure": "ortlab.recompute.figures",
    "pareto_figure": "ortlab.recompute.figures",
    "saving_figure": "ortlab.recompute.figures",
}

__all__ = sorted([*_EXPORTS, "PlanError"])

__getattr__, __dir__ = _lazy(__name__, _EXPORTS, globals())
