"""`ortlab ...`: the Python API from the command line. One parser, subcommands registered explicitly, one
mapping of errors to exit codes: 0 ok, 1 a result that means failure, 2 bad input (one line naming it),
130 interrupted."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
_NAMES_DEFAULT = re.compile(r"\bdefault[: ]")  # a help text that says its default itself: "(default: the demo)"


def shown_default(action: argparse.Action) -> str | None:
    """An option's default as `--help` and docs/cli.md show it, or None when there is nothing to show: a switch
    that is off, an empty list, no value (the help then says what happens without it), or a help text that
    already names its default."""
    default = action.default
    if isinstance(action, argparse.BooleanOptionalAction) and isinstance(default, bool):
        return "on" if default else "off"
    if (not action.option_strings or default is None or default is argparse.SUPPRESS or default is False
            or default == [] or _NAMES_DEFAULT.search(own_help(action))
            or isinstance(action, argparse._StoreConstAction)):
        return None
    return str(default)


def own_help(action: argparse.Action) -> str:
    """The help text as written (without the "(default: ...)" BooleanOptionalAction appends by itself)."""
    return (action.help or "").removesuffix(" (default: %(default)s)")


def help_line(action: argparse.Action) -> str:
    """An argument's help with its default, as `--help` and docs/cli.md show it."""
    shown = shown_default(action)
    return own_help(action) if shown is None else f"{own_help(action)} (default: {shown})".lstrip()


class _Formatter(argparse.HelpFormatter):
    """Every option's default in its help line, only where it says something (see `shown_default`)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        return help_line(action).replace("%", "%%")


class _Parser(argparse.ArgumentParser):
    """Bad arguments in one line naming the flag (`ortlab burst: argument --seed: ...`), exit 2; `-h` for usage.
    Subcommands' parsers are made by this class too, so every `--help` shows the defaults."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from ortlab.cli import (
        activations,
        burst,
        check,
        compare,
        env,
        graphs,
        judge,
        memory,
        move,
        options,
        plans,
        report,
        repro,
        runs,
        time,
        tune,
    )

    p = _Parser(prog="ortlab", description="Explore ONNX Runtime's ORTModule: options, bursts, runs, "
                                "exported graphs, recompute plans, activation statistics.",
                epilog="Each command's flags and defaults: ortlab COMMAND --help, all of them in docs/cli.md.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (env, options, check, burst, compare, judge, move, runs, graphs, plans, memory, time, tune,
                   activations, repro, report):
        module.register(sub)
    return p


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    if isinstance(e, OSError) and e.filename is not None:
        text = f"{e.filename}: {e.strerror or text}"
    return " ".join(text.split("\n", 1)[0].split()) if "\n" not in text else text


def _warnings_in_one_line(where: str) -> None:
    """ortlab's own warnings as `ortlab burst: warning: ...` (not Python's file:line form)."""
    import warnings

    from ortlab.errors import OrtlabWarning

    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, OrtlabWarning):
            print(f"{where}: warning: {message}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show


def main(argv: Sequence[str] | None = None) -> int:
    from ortlab.engine.client import WorkerError
    from ortlab.errors import InputError

    args = build_parser().parse_args(argv)
    where = f"ortlab {args.command}"
    _warnings_in_one_line(where)
    import shlex

    from ortlab.runs.run import COMMAND

    outer = os.environ.get(COMMAND)
    os.environ[COMMAND] = shlex.join(["ortlab", *(sys.argv[1:] if argv is None else argv)])  # runs record it
    try:
        if getattr(args, "model", None) is not None:  # a missing file or a bad form, named before torch loads
            from ortlab.workload import ModelRef

            ModelRef.of(args.model)
        if getattr(args, "needs_ortmodule", False):  # an ORTModule-only command on the current stack: why, where
            from ortlab.stacks.table import ortmodule_line

            if ortmodule_line():
                raise InputError(ortmodule_line())
        return args.func(args)
    except (InputError, WorkerError) as e:
        if os.environ.get("ORTLAB_TRACEBACK") and getattr(e, "traceback", None):  # the user's own, in full
            print(e.traceback, file=sys.stderr)
        print(f"{where}: {getattr(e, 'cli', None) or e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"{where}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `ortlab options | head`
        sys.stderr.close()
        return EXIT_OK
    except OSError as e:  # a folder that cannot be written, a full disk: name the file
        print(f"{where}: {_one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as e:
        if os.environ.get("ORTLAB_TRACEBACK"):
            raise
        print(f"{where}: internal error: {type(e).__name__}: {e} (a bug in ortlab; ORTLAB_TRACEBACK=1 shows where)",
              file=sys.stderr)
        return EXIT_FAILED
    finally:
        if outer is None:
            os.environ.pop(COMMAND, None)
        else:
            os.environ[COMMAND] = outer


if __name__ == "__main__":
    sys.exit(main())
