"""`ortlab runs`: the user's runs in a folder (--asked: and, beneath them, the runs ortlab made for its own purposes,
kept under what asked for them), newest first, as a table that fits 100 columns; each run's details (the memory
account's words, fixes, hazards, the verdict's evidence, a busy machine, the path) with --long, or for one run named
by its folder; damaged runs listed as unreadable with the reason."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

from ortlab.cli.common import CliError, add_json_arg, print_json
from ortlab.runs.facts import MISSING

WIDTH = 100  # the terminal columns the table and the details fit
# the table's columns: (summary field, heading, how a value is shown)
COLUMNS = (("backend", "backend", str), ("status", "status", str), ("steps", "steps", lambda v: f"{v:.0f}"),
           ("final_loss", "final loss", lambda v: f"{v:.4g}"),
           ("median_step_s", "step ms", lambda v: f"{1000 * v:.0f}" if v >= 0.1 else f"{1000 * v:.3g}"),
           ("verdict", "verdict", str))
TEXT = ("backend", "status", "verdict")  # left-aligned; the figures right-aligned
SHOWN = {"run", "started", *(c[0] for c in COLUMNS)}


def cmd_runs(args) -> int:
    from ortlab.reporting.listing import list_runs, summary_row
    from ortlab.runs.run import load_run

    folder = Path(args.folder)
    if not folder.is_dir():
        raise CliError(f"{folder} is not a folder" + (" (it is a file)" if folder.exists() else " (it does not exist)"))
    if (folder / "meta.json").is_file():  # one run: its details
        one = {**summary_row(load_run(folder)), "path": str(folder)}
        print_json(one) if args.json else print("\n".join(details(one)))
        return 0
    df = list_runs(folder, asked=args.asked)
    rows = [{**{k: v for k, v in r.items() if not _missing(v)},
             "path": str(folder / r["run"]) if _missing(r.get("asked_by")) else r["path"]}  # as typed
            for r in df.to_dict(orient="records")]
    users = [r for r in rows if "asked_by" not in r]
    asked = [r for r in rows if "asked_by" in r]  # with --asked: ortlab's own, beneath the user's
    if args.json:
        print_json(df.to_dict(orient="records"))
    elif not rows:
        print(f"no runs in {folder}")
    elif args.long:
        print("\n".join(line for row in rows for line in details(row)))
    else:
        print("\n".join(table(users)) if users else f"no runs of yours in {folder}")
        if asked:
            print("\nmade by ortlab for its own purposes (Tune, the plans, verdicts), under what asked for them:")
            print("\n".join(table(asked)))
        print("each run's details: --long, or ortlab runs RUN_FOLDER")
    return 0


def register(sub) -> None:
    r = sub.add_parser("runs", help="list the runs in a folder (a table; --long or a run's folder: the details)")
    r.add_argument("folder", nargs="?", default="runs",
                   help="a folder of run folders, or one run's folder for its details (default: ./runs)")
    r.add_argument("--long", action="store_true", help="every run's details, not the table")
    r.add_argument("--asked", action="store_true", help="also the runs ortlab made for its own purposes (Tune's "
                   "measurements, the plans' bursts, a verdict's evidence), kept under what asked for them")
    add_json_arg(r)
    r.set_defaults(func=cmd_runs)


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The runs as a table of at most WIDTH columns: the run's folder name first (on a line of its own when it is
    longer than the room left), then its backend, status, steps, final loss, median step and verdict."""
    cells = [[_cell(row, key, show) for key, _, show in COLUMNS] for row in rows]
    widths = [max(len(heading), *(len(c[i]) for c in cells)) for i, (_, heading, _) in enumerate(COLUMNS)]
    room = WIDTH - sum(w + 2 for w in widths)
    name = min(room, max(len("run"), *(len(row["run"]) for row in rows)))
    keys = [key for key, _, _ in COLUMNS]

    def line(first: str, values: list[str]) -> str:
        return (first + "".join(f"  {v:<{w}}" if k in TEXT else f"  {v:>{w}}"
                                for k, v, w in zip(keys, values, widths, strict=True))).rstrip()

    out = [line("run".ljust(name), [h for _, h, _ in COLUMNS])]
    for row, values in zip(rows, cells, strict=True):
        figures = line("", values)
        if len(row["run"]) > name:  # the whole name (it is what `ortlab runs RUN` takes), the figures below it
            out += [row["run"], " " * name + figures]
        else:
            out.append(row["run"].ljust(name) + figures)
    return out


def details(row: dict[str, Any]) -> list[str]:
    """One run as lines of at most WIDTH columns: its name and table figures, then every other field."""
    head = ", ".join(f"{heading} {_cell(row, key, show)}" for key, heading, show in COLUMNS
                     if not _missing(row.get(key)))
    out = [row["run"], *textwrap.wrap(head, WIDTH, initial_indent="  ", subsequent_indent="    ")]
    for key, value in row.items():
        if key in SHOWN or _missing(value):
            continue
        out += textwrap.wrap(f"{key}: {_text(value)}", WIDTH, initial_indent="  ", subsequent_indent="    ",
                             break_on_hyphens=False, break_long_words=False)  # a path stays whole
    if row.get("started"):
        out.append(f"  started: {row['started']}")
    return out


def _cell(row: dict[str, Any], key: str, show) -> str:
    value = row.get(key)
    if _missing(value):
        return MISSING
    try:
        return show(value)
    except (TypeError, ValueError):
        return str(value)


def _text(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ", ".join(_text(v) for v in value)
    if isinstance(value, dict):
        return "; ".join(f"{k} {_text(v)}" for k, v in value.items() if not _missing(v))
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))
