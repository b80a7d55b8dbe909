"""`ortlab move RUN RUN [--reference RUN]`: what an ORTModule run's options become on the newest torch, with both
sides' measured figures and the verdict (ortlab.move)."""

from __future__ import annotations

from ortlab.cli.common import add_json_arg, print_json


def cmd_move(args) -> int:
    from ortlab.move.report import move_report

    report = move_report(args.first, args.second, args.reference)
    if args.json:
        print_json(report.to_dict())
    else:
        print(report)
    return 0


def register(sub) -> None:
    m = sub.add_parser("move", help="the move written out: what an ORTModule run's options become on the newest "
                       "torch, with both runs' step time, start-up, memory and verdict",
                       description="For an ORTModule run (ort stack) and a torch.compile run (typically the current "
                       "stack, torch 2.14), in either order: each option the ORTModule run used and what it becomes "
                       "(with a snippet to paste), the measured figures of both sides as their folders recorded them "
                       "(missing ones said missing), the torch and stack of each, and the verdict on each (its "
                       "verdict.json, or judged now against --reference).")
    m.add_argument("first", metavar="RUN", help="a run folder: the ORTModule run or the torch.compile run")
    m.add_argument("second", metavar="RUN", help="the other run folder")
    m.add_argument("--reference", metavar="RUN", default=None,
                   help="a PyTorch parity run of the same start: judges both runs now when they have no verdict "
                   "(as ortlab judge does)")
    add_json_arg(m)
    m.set_defaults(func=cmd_move)
