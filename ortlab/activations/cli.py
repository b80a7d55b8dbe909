"""`ortlab diff | merge | bisect`: activation statistics from the command line. Bad input prints one line and
exits 2; `diff` exits 1 when the two runs diverge (as diff(1) does when files differ)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _fail(command: str, message: str) -> int:
    print(f"ortlab {command}: {message}".splitlines()[0], file=sys.stderr)
    return 2


def _source(command: str, flag: str, value: str) -> str | None:
    if not Path(value).exists():
        _fail(command, f"{flag} {value!r} does not exist (expected an ortlab run folder, a stats.npz or an ORT "
                       "StatisticsSubscriber folder)")
        return None
    return value


def _tolerance(text: str | None):
    if text is None:
        return None
    try:
        if "=" in text:  # mean=1e-3,std=1e-2
            return {key.strip(): float(value) for key, _, value in (p.partition("=") for p in text.split(","))}
        return float(text)
    except ValueError:
        raise ValueError(f"--tolerance {text!r} is not a number or statistic=number pairs (e.g. 1e-3 or "
                         "mean=1e-3,std=1e-2)") from None


def cmd_diff(args) -> int:
    from ortlab.activations.compare import compare
    from ortlab.activations.table import StatsFileError

    if _source("diff", "A", args.a) is None or _source("diff", "B", args.b) is None:
        return 2
    try:
        diff = compare(args.a, args.b, _tolerance(args.tolerance))
    except (StatsFileError, ValueError, FileNotFoundError) as e:
        return _fail("diff", str(e))
    if args.json:
        print(json.dumps(diff.to_dict() | {"top": diff.top(args.top).to_dict(orient="records")}, indent=2, default=str))
    else:
        print(diff.report(args.top))
    return 1 if diff.diverged else 0


def cmd_merge(args) -> int:
    from ortlab.activations.legacy import merge

    try:
        out = merge(args.pt_dir, args.ort_dir, args.output_dir, overwrite=args.overwrite)
    except (FileExistsError, FileNotFoundError, ValueError) as e:
        return _fail("merge", str(e))
    print(f"per-step summaries in {out / 'merge_pt'} and {out / 'merge_ort'}")
    return 0


def cmd_bisect(args) -> int:
    from ortlab.activations.bisect import bisect
    from ortlab.burst import BurstError
    from ortlab.options import OptionError, Options
    from ortlab.worker import Session, WorkerError
    from ortlab.workload import WorkloadError

    try:
        kwargs = {}
        for text in args.model_arg:
            key, sep, value = text.partition("=")
            if not sep:
                raise OptionError(f"--model-arg {text!r} is not KEY=VALUE (for example n_layer=4)")
            try:
                kwargs[key] = json.loads(value)
            except json.JSONDecodeError:
                kwargs[key] = value
        options = Options.parse(args.option)
        with Session(args.model, kwargs, out=args.out, in_process=args.in_process) as session:
            result = bisect(session=session, steps=args.steps, options=options, candidates=args.candidates,
                            parity=not args.no_parity, tolerances=_tolerance(args.tolerance), seed=args.seed)
    except (OptionError, BurstError, WorkloadError, WorkerError, ValueError) as e:
        return _fail("bisect", str(e))
    except RuntimeError as e:
        print(f"ortlab bisect: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"divergence": str(result.divergence) if result.divergence else None, "fixes": result.fixes,
                          "rows": result.rows.to_dict(orient="records")}, indent=2, default=str))
    else:
        print(result)
    return 0


def register(subparsers) -> None:
    d = subparsers.add_parser("diff", help="compare two runs' activation statistics (or ORT dumps): first divergence")
    d.add_argument("a", help="run folder, stats.npz or ORT StatisticsSubscriber folder (the reference)")
    d.add_argument("b", help="the same for the other run")
    d.add_argument("--tolerance", help="relative tolerance for every statistic (default 1e-3), or mean=..,std=..")
    d.add_argument("--top", type=int, default=10, help="how many of the largest differences to list")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_diff)

    m = subparsers.add_parser("merge", help="per-step summaries as ORT's merge_activation_summary writes them")
    m.add_argument("--pt_dir", required=True, help="ORT dump folder or ortlab run of the PyTorch run (its order is used)")
    m.add_argument("--ort_dir", required=True, help="ORT dump folder or ortlab run of the ORTModule run")
    m.add_argument("--output_dir", required=True, help="where merge_pt/ and merge_ort/ are written (must not exist)")
    m.add_argument("--overwrite", action="store_true", help="replace --output_dir if it exists")
    m.set_defaults(func=cmd_merge)

    b = subparsers.add_parser("bisect", help="toggle ORTModule options one at a time to find what causes a divergence")
    b.add_argument("--model", default=None, help="factory: module:callable or file.py:callable (default: the demo)")
    b.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE")
    b.add_argument("--steps", type=int, default=10, help="burst length for finding the divergence")
    b.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="the ORTModule options that diverge")
    b.add_argument("--candidates", help="comma-separated options to toggle (default: every graph-changing option)")
    b.add_argument("--no-parity", action="store_true", help="keep dropout and the compute optimizer (also tries parity)")
    b.add_argument("--tolerance", help="relative tolerance (default 1e-3)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--out", default="runs")
    b.add_argument("--in-process", action="store_true")
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=cmd_bisect)
