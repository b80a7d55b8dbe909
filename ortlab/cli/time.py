"""`ortlab time RUN [RUN...]`: where a step's time goes in each run, side by side: the step's parts, modules,
op types, ORT's graph nodes, where a backend is slower or faster than PyTorch; text or JSON."""

from __future__ import annotations

from ortlab.cli.common import add_json_arg, positive_int, print_result


def cmd_time(args) -> int:
    """A run without time data raises an InputError (the CLI: one line saying how to collect it, exit 2)."""
    if args.diff:
        return _diff(args)
    from ortlab.timing.table import time

    tables = time(*args.runs)
    return print_result(args, lambda: tables.to_dict(args.top), lambda: tables.report(args.top))


def _diff(args) -> int:
    """Two runs' time data against each other: what was added, removed, faster, slower, largest change first."""
    from ortlab.cli.common import CliError
    from ortlab.timing.diff import time_diff

    if len(args.runs) != 2:
        raise CliError(f"--diff compares two runs (A B), not {len(args.runs)}")
    diff = time_diff(*args.runs)
    return print_result(args, lambda: diff.to_dict(args.top), lambda: diff.report(args.top))


def register(sub) -> None:
    description = ("Where the time of a training step goes in runs burst with `--collect time` (ORT's profiler "
                   "for ORTModule, torch.profiler for PyTorch and torch.compile): the step's forward, backward and "
                   "optimizer, inside and outside the kernels, per module, op type and ORT graph node, and where "
                   "each backend is slower or faster than PyTorch. Each run folder also holds trace.json, which "
                   "Perfetto (ui.perfetto.dev) opens.")
    p = sub.add_parser("time", help="where a step's time goes, per module and operator, runs side by side",
                       description=description)
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folders burst with --collect time")
    add_json_arg(p)
    p.add_argument("--diff", action="store_true",
                   help="what changed from run A to run B (two runs): modules (across backends), op types and ORT "
                   "nodes (same profiler) added, removed, faster, slower, in ms, %% and share of the step")
    p.add_argument("--top", type=positive_int, default=10, help="rows per table (default: 10)")
    p.set_defaults(func=cmd_time)
