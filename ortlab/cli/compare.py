"""`ortlab compare`: stay on ORTModule or move to torch.compile? Every backend from one snapshot, side by side."""

from __future__ import annotations

import sys

from ortlab.cli.burst import add_burst_args, backend_list, burst_kwargs, chosen_backends, outcome
from ortlab.cli.common import CliError, model_kwargs, print_json


def cmd_compare(args) -> int:
    from ortlab.comparison import cross_stack
    from ortlab.engine.session import Session
    from ortlab.move.report import print_move

    kwargs, options = burst_kwargs(args)  # bad flags first, then what cannot run here
    placed = cross_stack.placements(args.backends)  # a backend placed on a stack: "compile@current"
    if placed is not None and cross_stack.crosses(placed):
        if args.in_process:
            raise CliError("--in-process: a comparison across stacks runs each backend in a worker of its stack")
        comparison = cross_stack.compare(args.model, model_kwargs(args), placed, args.steps, options, out=args.out,
                                         **kwargs)
    else:
        backends = chosen_backends(args.backends if placed is None else ",".join(p.backend for p in placed))
        with Session(args.model, model_kwargs(args), out=args.out, in_process=args.in_process,
                     float64=args.float64) as session:
            comparison = session.compare(args.steps, options, backends=backends, **kwargs)
    decision, recommendation = comparison.decision(), comparison.recommendation()
    if args.json:
        print_json({**comparison.to_dict(), "decision": decision.to_dict(orient="records"),
                    "recommendation": recommendation.to_dict()})
    else:
        print(comparison)
        print()
        print("the backends side by side:")
        shown = decision.astype(object).where(decision.notna(), "-")
        print(shown.to_string(index=False, max_colwidth=70, float_format=lambda v: f"{v:.2f}"))
        print(recommendation.line)
        print_move(comparison)  # ORTModule and torch.compile both ran: the move, written out (ortlab.move)
    sys.stdout.flush()
    return outcome(comparison.runs, comparison, args.allow_fallback)


def register(sub) -> None:
    import argparse

    c = sub.add_parser("compare", help="stay or move: PyTorch, ORTModule and torch.compile from one snapshot, with "
                       "speed after start-up, start-up cost, steps to break even, memory, numerics",
                       description="Train the same steps from one snapshot on every backend, judge each against "
                       "PyTorch (first-step gradients; in parity mode losses and end state; each against float64 "
                       "PyTorch), and print which backend to train with, and why. Exit 1 when a backend failed or "
                       "diverged.")
    c.add_argument("--backends", default="all", type=backend_list, metavar="BACKEND[@STACK][,BACKEND]",
                   help="the backends (pytorch is always the reference): all (every backend that runs here), both, "
                   "or a comma list, each optionally on a stack: BACKEND@ort or BACKEND@current runs it in a worker "
                   "of that stack's Python (built like bin/ortlab's on first use), e.g. "
                   "pytorch,ortmodule@ort,compile@current (without @: ortmodule on ort, the others here)")
    c.add_argument("--parity", action=argparse.BooleanOptionalAction, default=True,
                   help="same seeds, dropout 0, compute optimizer off, deterministic (judges the numerics)")
    add_burst_args(c, per_backend=True)
    c.set_defaults(func=cmd_compare)
