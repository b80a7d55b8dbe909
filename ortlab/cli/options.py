"""`ortlab options`: every ORTModule option ortlab knows, with when ORT reads it."""

from __future__ import annotations

from ortlab.cli.common import CliError, add_json_arg, print_json


def cmd_options(args) -> int:
    from ortlab.options import REGISTRY, by_area

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


def registry_markdown() -> str:
    """The options reference page (docs/options.md), generated from the registry."""
    lines = [
        "# ORTModule options",
        "",
        "Generated from `ortlab.options.REGISTRY` by `ortlab options --markdown`; a test keeps this page equal to it.",
        "`--option KEY=VALUE` (burst, compare, check, bisect) and `options=` in Python take either the option's name",
        "(`memory_opt_level=1`) or its variable (`ORTMODULE_MEMORY_OPT_LEVEL=1`).",
        "Every `ORTMODULE_*` variable that onnxruntime-training 1.19.2 reads or its guidelines document, and the",
        "`DebugOptions` fields. **Read at** is taken from the 1.19.2 source (a test checks it against the AST):",
        "",
        "- `import`: read once when onnxruntime is imported. ortlab starts a new worker process; in-process, restart "
        "the kernel.",
        "- `construction`: read when `ORTModule(...)` is built. ortlab re-wraps the model, which re-exports it.",
        "- `export`: read while exporting. ortlab re-wraps so the model is exported again.",
        "- `runtime`: read when the feature first runs.",
        "- `never`: documented, but 1.19.2 never reads it; setting it has no effect.",
        "",
        "**Graph**: a change alters the exported or optimized graph. **CUDA**: needs a GPU (disabled on the CPU).",
        "",
    ]
    header = "| option | variable | type | default | allowed | read at | graph | CUDA | description |"
    from ortlab.options import by_area

    for area, specs in by_area().items():
        lines += ["", f"## {area}", "", header, "|---|---|---|---|---|---|---|---|---|"]
        for s in specs:
            lines.append(_markdown_row(s))
    return "\n".join(lines) + "\n"


def _markdown_row(s) -> str:
    default = "" if s.default == "" else f"`{s.default}`"
    allowed = s.allowed().replace("|", "\\|")
    notes = s.description + ("" if s.documented else " *(not in the guidelines)*")
    variable = f"`{s.env}`" if s.env else "(DebugOptions)"
    graph, cuda = ("yes" if s.changes_graph else ""), ("yes" if s.needs_cuda else "")
    return (f"| `{s.name}` | {variable} | {s.kind.value} | {default} | {allowed} "
            f"| {s.read_at.value} | {graph} | {cuda} | {notes} |")
