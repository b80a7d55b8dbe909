"""The command-line reference, docs/cli.md, generated from ortlab's argparse parsers: every subcommand, argument,
choice and default in one page, as `ortlab COMMAND --help` shows them.

    python scripts/cli_reference.py  # write docs/cli.md

tests/test_reference.py fails when the page is out of date (a flag added without running this).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "cli.md"


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of every subcommand, in the order `ortlab --help` lists them."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help or "" for c in action._choices_actions}
    return [(name, helps.get(name, ""), p) for name, p in action.choices.items()]


def _invocation(action: argparse.Action) -> str:
    """How the argument is typed: `--optimizer {adamw,sgd}`, `--diff A B`, `RUN`, `--memory, --no-memory`."""
    if action.choices is not None and action.metavar is None:
        metavar: str | tuple = "{" + ",".join(map(str, action.choices)) + "}"
    else:
        metavar = action.metavar or (action.dest.upper() if action.option_strings else action.dest)
    if not action.option_strings:
        return metavar if isinstance(metavar, str) else " ".join(metavar)
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    names = metavar if isinstance(metavar, tuple) else (metavar,) * (action.nargs
                                                                     if isinstance(action.nargs, int) else 1)
    value = " ".join(names)
    if action.nargs == "?":
        value = f"[{value}]"
    elif action.nargs in ("*", "+"):
        value = f"{value} ..."
    return ", ".join(f"{o} {value}" for o in action.option_strings)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _table(actions: list[argparse.Action]) -> list[str]:
    from ortlab.cli import own_help, shown_default

    rows = ["| argument | default | what it does |", "|---|---|---|"]
    for a in actions:
        notes = []
        if a.required and a.option_strings:
            notes.append("required")
        if isinstance(a, argparse._AppendAction):
            notes.append("repeatable")
        if not a.option_strings and a.nargs == "?":
            notes.append("optional")
        shown = shown_default(a)
        text = own_help(a) + (f" ({', '.join(notes)})" if notes and "repeatable" not in own_help(a) else "")
        rows.append(f"| `{_cell(_invocation(a))}` | {'`' + _cell(shown) + '`' if shown else ''} | {_cell(text)} |")
    return rows


def _command(name: str, help: str, parser: argparse.ArgumentParser) -> list[str]:
    """One subcommand: its synopsis, what it does, one table of its own arguments, one per titled group."""
    untitled = ("positional arguments", "options", "optional arguments")
    groups = [(g.title, [a for a in g._group_actions if not isinstance(a, argparse._HelpAction)])
              for g in parser._action_groups]
    positional = " ".join(_invocation(a) if a.nargs != "?" else f"[{_invocation(a)}]"
                          for _, actions in groups for a in actions if not a.option_strings)
    lines = ["", f"## ortlab {name}", "", f"`ortlab {name} {positional + ' ' if positional else ''}[options]`", "",
             parser.description or (help[:1].upper() + help[1:] + "."), ""]
    mine = [a for title, actions in groups if title in untitled for a in actions]
    lines += [*_table(mine), ""]
    for title, actions in groups:
        if title not in untitled and actions:
            lines += [f"*{title}*", "", *_table(actions), ""]
    return lines[:-1]


def render() -> str:
    """docs/cli.md as the parsers say it now."""
    from ortlab.cli import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, build_parser

    parser = build_parser()
    commands = _subcommands(parser)
    lines = [
        "# The `ortlab` command line",
        "",
        "Generated from ortlab's argparse parsers by `python scripts/cli_reference.py`; tests/test_reference.py",
        "keeps this page equal to it. `ortlab COMMAND --help` shows the same arguments and defaults; the Python",
        "API is in [api.md](api.md), how to use both in [guide.md](guide.md).",
        "",
        f"Exit codes, for every command: {EXIT_OK} ok; {EXIT_FAILED} a result that means failure (a run that "
        f"failed or fell back,",
        f"a verdict that diverged, a model `check` found blocked, an internal error); {EXIT_BAD_INPUT} bad input "
        "(one line on stderr",
        f"naming it); {EXIT_INTERRUPTED} interrupted. `ORTLAB_TRACEBACK=1` shows where an internal error came from.",
        "",
        "| command | what it does |",
        "|---|---|",
        *(f"| [`ortlab {name}`](#ortlab-{name}) | {_cell(help)} |" for name, help, _ in commands),
    ]
    for name, help, sub in commands:
        lines += _command(name, help, sub)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    PAGE.write_text(render(), encoding="utf-8")
