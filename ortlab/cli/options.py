"""`ortlab options`: every ORTModule option ortlab knows, with when ORT reads it."""

from __future__ import annotations

from ortlab.cli.common import CliError, add_json_arg, print_json


def cmd_options(args) -> int:
    from ortlab.options import REGISTRY, by_area, registry_markdown

    if args.markdown:
        print(registry_markdown(), end="")
        return 0
    specs = [s for s in REGISTRY if not args.area or args.area.lower() in s.area.lower()]
    if not specs:
        areas = sorted({s.area for s in REGISTRY})
        raise CliError(f"--area {args.area!r} matches no option; areas: {', '.join(areas)}")
    if args.json:
        print_json([s.to_dict() for s in specs])
        return 0
    width = max(len(s.name) for s in specs)
    variable = max(len(s.env or "(DebugOptions)") for s in specs)
    for area, members in by_area(specs).items():
        print(f"\n{area}")
        for s in members:
            flags = [s.read_at.value]
            if s.needs_cuda:
                flags.append("CUDA")
            if s.changes_graph:
                flags.append("graph")
            print(f"  {s.name:<{width}}  {s.env or '(DebugOptions)':<{variable}}  default {s.default!r:<10} "
                  f"[{', '.join(flags)}]  {s.description}")
    print("\n--option KEY=VALUE takes the name (first column) or the variable; read at: import = new worker, "
          "construction/export = new wrap; graph = changes the exported graph")
    return 0


def register(sub) -> None:
    o = sub.add_parser("options", help="every ORTModule option: variable, default, when ORT reads it")
    add_json_arg(o)
    o.add_argument("--area", help="only options whose feature area contains this text")
    o.add_argument("--markdown", action="store_true", help="the reference page docs/options.md")
    o.set_defaults(func=cmd_options)
