"""`ortlab ...`: the Python API from the command line. One parser, subcommands registered explicitly, one
mapping of errors to exit codes: 0 ok, 1 a result that means failure, 2 bad input (one line naming it),
130 interrupted."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


class _Parser(argparse.ArgumentParser):
    """Bad arguments in one line naming the flag (`ortlab burst: argument --seed: ...`), exit 2; `-h` for usage."""

    def error(self, message: str):
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from ortlab.cli import activations, burst, check, compare, env, graphs, memory, options, plans, runs, time

    p = _Parser(prog="ortlab", description="Explore ONNX Runtime's ORTModule: options, bursts, runs, "
                                "exported graphs, recompute plans, activation statistics.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (env, options, check, burst, compare, runs, graphs, plans, memory, time, activations):
        module.register(sub)
    return p


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    if isinstance(e, OSError) and e.filename is not None:
        text = f"{e.filename}: {e.strerror or text}"
    return " ".join(text.split("\n", 1)[0].split()) if "\n" not in text else text


def main(argv: Sequence[str] | None = None) -> int:
    from ortlab.engine.session import WorkerError
    from ortlab.errors import InputError

    args = build_parser().parse_args(argv)
    where = f"ortlab {args.command}"
    try:
        return args.func(args)
    except (InputError, WorkerError) as e:
        print(f"{where}: {e}", file=sys.stderr)
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


if __name__ == "__main__":
    sys.exit(main())
