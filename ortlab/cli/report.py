"""`ortlab report RUN... [--out FILE]`: one self-contained HTML page about runs, a folder of runs or a tuning, to hand
on (a teammate, a reviewer, a bug tracker): it reads offline in any browser."""

from __future__ import annotations


def cmd_report(args) -> int:
    """Nothing to report on (a path that is neither a run, a folder of runs nor a tuning) raises ReportError: exit 2,
    one line."""
    from ortlab.reporting import report

    path = report(*args.runs, out=args.out)
    print(f"wrote {path} ({path.stat().st_size / 2**20:.2f} MB): open it in any browser, offline")
    return 0


def register(sub) -> None:
    p = sub.add_parser("report", help="one offline HTML page about runs (a comparison, a folder of runs) to hand on",
                       description="Write one self-contained HTML page (no CDN, no script, figures inside) about "
                       "the runs given: what was run (command line or call, options, stack and versions, machine, "
                       "dates), the summary table, the verdict with its evidence and causes, the loss curves, where "
                       "the time goes and what changed in it, the memory account, the first divergence of the "
                       "statistics, the exported graphs' stages, recompute plans, tunings, and how to reproduce. "
                       "Runs are read, never executed.")
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="run folders, folders of runs (every run in them) or tuning folders (tune.json)")
    p.add_argument("--out", metavar="FILE",
                   help="the page to write, or a folder for it (default: report-<time>.html beside the first run)")
    p.set_defaults(func=cmd_report)
