"""`ortlab doctor` and `ortlab setup`: what runs here (per backend, on this stack), and build what ORTModule needs."""

from __future__ import annotations

import sys

from ortlab.cli.common import add_json_arg, print_json


def cmd_doctor(args) -> int:
    from ortlab.engine.diagnosis import doctor

    report = doctor()
    print_json(report.to_dict()) if args.json else print(report)
    return 0 if report.ok else 1


def cmd_setup(args) -> int:
    from ortlab.stacks.environment import SetupError, setup

    try:
        setup(force=args.force, log=lambda line: print(line, flush=True))
    except SetupError as e:
        print(f"ortlab setup: {e}", file=sys.stderr)
        return 1
    return 0


def register(sub) -> None:
    d = sub.add_parser("doctor", help="the stack, what runs here per backend (and why not), the GPU, versions; each "
                       "problem with its fix")
    add_json_arg(d)
    d.set_defaults(func=cmd_doctor)
    s = sub.add_parser("setup", help="build ORTModule's torch C++ extensions (CPU always, CUDA with a GPU)")
    s.add_argument("--force", action="store_true", help="rebuild even if built")
    s.set_defaults(func=cmd_setup)
