"""`ortlab diff | merge | bisect`: activation statistics from a terminal. Bad input raises an InputError (exit
2, one line); `diff` exits 1 when the two runs diverge (as diff(1) does when files differ), `bisect` when a
burst it ran failed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ortlab.cli.common import (
    CliError,
    add_in_process_arg,
    add_json_arg,
    add_model_args,
    add_out_arg,
    model_kwargs,
    positive_int,
    print_json,
    seed,
)

SOURCE = "an ortlab run folder, a stats.npz or an ORT StatisticsSubscriber folder"


def tolerance(text: str) -> float | dict[str, float]:
    """`--tolerance 1e-3` (every statistic) or `mean=1e-3,std=1e-2`; Tolerances checks names and signs."""
    try:
        if "=" in text:
            pairs = (part.partition("=") for part in text.split(","))
            return {key.strip(): float(value) for key, _, value in pairs}
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number or statistic=number pairs (e.g. 1e-3 or "
                                         "mean=1e-3,std=1e-2)") from None


def _existing(name: str, value: str) -> str:
    if not Path(value).exists():
        raise CliError(f"{name} {value!r} does not exist (expected {SOURCE})")
    return value


def cmd_diff(args) -> int:
    from ortlab.activations import compare

    if args.ranks is not None:
        if args.b is not None:
            raise CliError("give one distributed run with --ranks I J, or two sources without it")
        diff = compare(_existing("RUN", args.a), tolerances=args.tolerance, ranks=tuple(args.ranks))
    elif args.b is None:
        raise CliError("diff needs two sources (A B), or one distributed run and --ranks I J")
    else:
        diff = compare(_existing("A", args.a), _existing("B", args.b), args.tolerance)
    if args.json:
        print_json(diff.to_dict() | {"top": diff.top(args.top).to_dict(orient="records")})
    else:
        print(diff.report(args.top))
    return 1 if diff.diverged else 0


def cmd_merge(args) -> int:
    from ortlab.activations import merge

    out = merge(args.pt_dir, args.ort_dir, args.output_dir, overwrite=args.overwrite)
    print(f"per-step summaries in {out / 'merge_pt'} and {out / 'merge_ort'}")
    return 0


def cmd_bisect(args) -> int:
    from ortlab.activations import FailedBurstError, bisect
    from ortlab.engine import Session
    from ortlab.options import Options

    options = Options.parse(args.option)
    try:
        with Session(args.model, model_kwargs(args), out=args.out, in_process=args.in_process) as session:
            result = bisect(session=session, steps=args.steps, options=options, candidates=args.candidates,
                            parity=not args.no_parity, tolerances=args.tolerance, seed=args.seed)
    except FailedBurstError as e:  # not bad input: a burst it needed did not finish
        print(f"ortlab bisect: {e}", file=sys.stderr)
        return 1
    if args.json:
        print_json({"divergence": str(result.divergence) if result.divergence else None,
                    "fixes": result.fixes, "rows": result.rows.to_dict(orient="records")})
    else:
        print(result)
    return 0


def register(sub) -> None:
    d = sub.add_parser("diff", help="compare activation statistics or ORT dumps: the first divergence",
                       description="Compare two sources of activation statistics and name the first "
                                   "divergence. Exit 1 when they diverge.")
    d.add_argument("a", help=f"the reference: {SOURCE} (with --ranks: a distributed run)")
    d.add_argument("b", nargs="?", help="the same for the other run")
    d.add_argument("--ranks", nargs=2, type=int, metavar=("I", "J"),
                   help="compare two ranks of the distributed run A (RUN/ranks/I and RUN/ranks/J): activations "
                        "may differ by data, parameter gradients after all-reduce must be equal")
    d.add_argument("--tolerance", type=tolerance,
                   help="relative tolerance for every statistic, e.g. 1e-2, or per statistic, e.g. "
                        "mean=1e-2,std=1e-3 (default: 1e-3; nan and inf counts and shapes exact)")
    d.add_argument("--top", type=positive_int, default=10, help="how many of the largest differences to list")
    add_json_arg(d)
    d.set_defaults(func=cmd_diff)

    m = sub.add_parser("merge", help="per-step summaries as ORT's merge_activation_summary writes them")
    m.add_argument("--pt-dir", required=True,
                   help="ORT dump folder or ortlab run of the PyTorch run (its order is used)")
    m.add_argument("--ort-dir", required=True, help="ORT dump folder or ortlab run of the ORTModule run")
    m.add_argument("--output-dir", required=True,
                   help="where merge_pt/ and merge_ort/ are written (must not exist)")
    m.add_argument("--overwrite", action="store_true", help="replace --output-dir if it exists")
    m.set_defaults(func=cmd_merge)

    b = sub.add_parser("bisect",
                       help="toggle ORTModule options one at a time to find what causes a divergence",
                       description="Burst PyTorch and ORTModule with the options that diverge, then toggle "
                       "them one at a time (and parity) to find which one makes the difference.")
    add_model_args(b)
    b.add_argument("--steps", type=positive_int, default=10, help="burst length for finding the divergence")
    b.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="the ORTModule options that diverge (repeatable)")
    b.add_argument("--candidates",
                   help="comma-separated options to toggle (default: every graph-changing option)")
    b.add_argument("--no-parity", action="store_true",
                   help="keep dropout and the compute optimizer (also tries parity)")
    b.add_argument("--tolerance", type=tolerance,
                   help="relative tolerance, e.g. 1e-2, or mean=1e-2,std=1e-3 (default: 1e-3; nan and inf "
                        "counts and shapes exact)")
    b.add_argument("--seed", type=seed, default=0,
                   help="seeds the burst's random numbers: dropout, a sampler's shuffle (the model starts from "
                   "the session's snapshot)")
    add_out_arg(b)
    add_in_process_arg(b)
    add_json_arg(b)
    b.set_defaults(func=cmd_bisect, needs_ortmodule=True)
