"""`ortlab runs`: the runs in a folder, newest first; damaged ones listed as unreadable with the reason."""

from __future__ import annotations

from pathlib import Path

from ortlab.cli.common import CliError, add_json_arg, print_json


def cmd_runs(args) -> int:
    from ortlab.run import list_runs

    folder = Path(args.folder)
    if not folder.is_dir():
        raise CliError(f"{folder} is not a folder" + (" (it is a file)" if folder.exists() else " (it does not exist)"))
    df = list_runs(folder)
    if args.json:
        print_json(df.to_dict(orient="records"))
    elif len(df):
        print(_text_table(df).to_string(index=False))
    else:
        print(f"no runs in {folder}")
    return 0


def register(sub) -> None:
    r = sub.add_parser("runs", help="list the runs in a folder")
    r.add_argument("folder", nargs="?", default="runs", help="a folder of run folders (default: ./runs)")
    add_json_arg(r)
    r.set_defaults(func=cmd_runs)


def _text_table(df):
    """The runs as text: lists joined with commas, nested records (a fallback's details) left to --json."""
    shown = df.drop(columns=["path", "fallback"], errors="ignore")
    if "fixes" in shown:
        shown["fixes"] = shown["fixes"].map(lambda v: ", ".join(v) if isinstance(v, list) else v)
    return shown
