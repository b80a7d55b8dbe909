"""`ortlab plans`: the memory optimizer's recompute plans of a burst; `--sweep` measures plan sets."""

from __future__ import annotations

import sys

from ortlab.cli.common import (
    CliError,
    add_json_arg,
    add_model_args,
    add_out_arg,
    model_kwargs,
    positive_int,
    print_json,
)
from ortlab.runs.run import RunStatus


def cmd_plans(args) -> int:
    from ortlab.engine.session import Session
    from ortlab.recompute import plan_sweep

    least = 2 if args.sweep else 1
    steps = args.steps if args.steps is not None else (6 if args.sweep else 1)
    if steps < least:
        raise CliError(f"--steps {steps} is not allowed; allowed: a whole number >= {least}")
    with Session(args.model, model_kwargs(args), out=args.out) as session:
        if args.sweep:
            return _print_sweep(plan_sweep(session, steps=steps), args.json)
        run = session.burst("ortmodule", steps, {}, collect={"plans": {}}, progress=False)
        if run.status != RunStatus.OK:
            print(f"ortlab plans: the burst {run.status}: {run.error}", file=sys.stderr)
            return 1
        return _print_plans(run, args.json)


def _print_plans(run, as_json: bool) -> int:
    from ortlab.recompute.figures import dims_label
    from ortlab.recompute.table import plans, plans_data

    data = plans_data(run)
    if as_json:
        print_json({**data, "run": str(run.path)})
        return 0
    table = plans(run)
    print(f"{len(table)} recompute plans at {dims_label(data['dims'])} (run {run.path})")
    if len(table):
        shown = table[["plan", "cluster_id", "type", "frequency", "saving_mb", "applied", "saving_expr"]]
        print(shown.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        print("apply: ortlab.recompute.write_config([plan numbers], 'plans.json', plans=run), then "
              "--option memory_opt_config=plans.json; or --option memory_opt_level=1 (or 2)")
    return 0


def _print_sweep(sweep, as_json: bool) -> int:
    from ortlab.runs.run import RunStatus

    cols = ["set", "status", "median_step_ms", "accounted_peak_mb", "accounted_saving_mb", "predicted_saving_mb",
            "stash_saving_mb", "recompute_nodes", "loss_equal", "process_peak_mb"]
    if as_json:
        rows = sweep.table[[*cols, "plans", "accounted_stash_mb", "accounted_exact", "account_missing",
                            "max_loss_rel_diff"]]
        data = {"rows": rows.to_dict(orient="records"), "notes": sweep.notes, "path": str(sweep.path)}
        print_json(data)
    else:
        print(sweep.table[cols].to_string(index=False, float_format=lambda v: f"{v:.2f}"))
        for note in sweep.notes:
            print(f"note: {note}")
    return 0 if (sweep.table["status"] == RunStatus.OK).all() else 1


def register(sub) -> None:
    p = sub.add_parser("plans", help="the memory optimizer's recompute plans; --sweep measures them")
    add_model_args(p)
    add_json_arg(p)
    p.add_argument("--sweep", action="store_true", help="measure plan sets (none, top plans, level 1, 2...)")
    p.add_argument("--steps", type=positive_int, default=None,
                   help="steps per burst (default: 1; with --sweep: 6)")
    add_out_arg(p)
    p.set_defaults(func=cmd_plans, needs_ortmodule=True)
