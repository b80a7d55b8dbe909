"""`ortlab graphs RUN`: ORTModule's exported graphs from a terminal: the stages, what each changed, one stage
in detail, a stage diff, or a node search; text or JSON."""

from __future__ import annotations

from pathlib import Path

from ortlab.cli.common import add_json_arg, print_json
from ortlab.graphs import KINDS, MODES, STAGES, load  # imports neither onnx nor pandas: --help stays fast
from ortlab.graphs.collection import stage_file_of


def cmd_graphs(args) -> int:
    """Bad input (no stage files, an unknown stage, node or prefix) raises GraphsError: exit 2, one line."""
    if args.overlay:
        return _overlay(args)
    if args.against:
        from ortlab.cli.common import CliError

        raise CliError("--against goes with --overlay stats")
    g = load(args.run, prefix=args.prefix)
    if Path(args.run).is_file() and not (args.search or args.diff or args.stage):  # one stage file: that stage
        picked = stage_file_of(Path(args.run))
        args.stage, args.mode = picked.stage, picked.mode
    modes = g.modes if args.mode is None else [args.mode]
    g.stages(modes[0])  # a mode without stage files is bad input (GraphsError naming the modes there)
    args.mode = args.mode or "training"
    if args.search:
        df = g.search(args.search, args.stage, args.mode)
        data = _records(df)
        text = df.to_string(index=False) if len(df) else "no matching nodes"
    elif args.diff:
        d = g.diff(args.diff[0], args.diff[1], args.mode)
        data = {**d.summary(), "ops": _records(d.ops), "fused": _records(d.fused)}
        text = _diff_text(d)
    elif args.stage:
        st = g.stage(args.stage, args.mode)
        data = {"summary": st.summary(), "histogram": st.histogram().to_dict(), "inputs": _records(st.inputs),
                "outputs": _records(st.outputs)}
        text = _stage_text(st)
    else:
        data = {**g.to_dict(), "transitions": _records(g.transitions)}
        if modes != g.modes:
            data = {**data, "modes": modes, "stages": [r for r in data["stages"] if r.get("mode") in modes],
                    "diffs": {m: data["diffs"][m] for m in modes}}
        text = _graphs_text(g, modes)
    if args.json:
        print_json(data)
    else:
        print(text)
    return 0


def _overlay(args) -> int:
    """The per-node data of one kind written as Model Explorer's node-data JSON, and its costliest nodes."""
    from ortlab.reporting.overlay import overlay

    o = overlay(args.run, args.overlay, against=args.against)
    out = Path(args.out) if args.out else Path(args.run) / f"overlay-{args.overlay}.json"
    o.save(out)
    if args.json:
        print_json({"file": str(out), "stage_file": str(o.stage_file), "graph": o.graph, "unit": o.unit,
                    "nodes": len(o.values), "top": _records(o.top(10)), "notes": o.notes})
        return 0
    print(f"wrote {out}: {len(o.values)} nodes of {o.stage_file.name} (graph {o.graph!r}), {o.unit}")
    print(o.top(10).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    for note in o.notes:
        print(f"note: {note}")
    print(f"Model Explorer: pip install ai-edge-model-explorer model-explorer-onnx; model-explorer "
          f"--extensions=model_explorer_onnx {o.stage_file} --node_data_paths={out}")
    return 0


def _records(df) -> list[dict]:
    """Rows for JSON: missing values (NaN, pd.NA) as null, which strict JSON allows and NaN it does not."""
    return df.astype(object).where(df.notna(), None).to_dict(orient="records")


def _graphs_text(g, modes: list[str]) -> str:
    cols = ["stage", "nodes", "forward", "gradient", "recompute", "op_types", "user_inputs", "parameters",
            "outputs"]
    lines = [f"{g.folder}  (prefix {g.prefix!r})"]
    if g.rank_graphs:
        from ortlab.graphs.ranks import describe

        lines.append(describe(g.rank_graphs))
    for mode in modes:
        lines += ["", f"{mode}:", g.summary(mode)[cols].to_string(index=False), "",
                  "what each stage changed:"]
        d = g.diffs(mode)
        if len(d):
            d = d.assign(step=d["a"].str.split("/").str[-1] + " -> " + d["b"].str.split("/").str[-1])
            lines.append(d[["step", "nodes_a", "nodes_b", "added", "removed", "fused_away", "gradient",
                            "recompute"]].to_string(index=False))
    t = g.transitions
    if len(t):
        lines += ["", "why ORTModule exported:", t.to_string(index=False)]
    return "\n".join(lines)


def _stage_text(st) -> str:
    s = st.summary()
    return "\n".join([
        f"{st.label}: {s['nodes']} nodes ({', '.join(f'{k} {s[k]}' for k in KINDS)}), "
        f"{s['op_types']} op types, "
        f"parameters {s['parameter_elements']:,} elements ({s['parameter_bytes'] / 2**20:.2f} MB), "
        f"file {s['file_bytes'] / 2**20:.2f} MB", *([st.taps_note] if st.taps else []), "", "ops:",
        st.histogram().to_string(), "",
        "inputs:", st.inputs.to_string(index=False), "", "outputs:", st.outputs.to_string(index=False)])


def _diff_text(d) -> str:
    lines = [repr(d), ""]
    lines.append(d.ops.to_string(index=False) if len(d.ops) else "no op count changed")
    if len(d.fused):
        lines += ["", "fused away:", d.fused.to_string(index=False)]
    return "\n".join(lines)


def register(sub) -> None:
    p = sub.add_parser("graphs", help="ORTModule's exported graphs: stages, diffs, node search",
                       description="ORTModule's exported graphs: every stage, what each changed, one stage "
                                   "in detail, a stage diff, or a node search.")
    p.add_argument("run", metavar="RUN", help="a run folder or any folder of ORTModule stage files")
    add_json_arg(p)
    p.add_argument("--stage", help=f"one stage in detail: {', '.join(STAGES)}")
    p.add_argument("--diff", nargs=2, metavar=("A", "B"), help="what changed from stage A to stage B")
    p.add_argument("--search", metavar="TEXT",
                   help="nodes by name, op type or module scope (in --stage, default: the execution model)")
    p.add_argument("--mode", choices=MODES,
                   help="training or inference stages (default: every mode listed; training for --stage, "
                        "--diff and --search)")
    p.add_argument("--prefix", help="which export, when the folder holds several")
    p.add_argument("--overlay", choices=("stats", "time", "memory"),
                   help="per-node data over the execution graph, as Model Explorer's node-data JSON: stats = the "
                   "statistics' difference against PyTorch, time = ORT's kernel time, memory = the activation "
                   "bytes alive (written to --out)")
    p.add_argument("--against", metavar="RUN",
                   help="with --overlay stats: the PyTorch run to compare with (default: its comparison's)")
    p.add_argument("--out", metavar="FILE", help="with --overlay: the JSON file (default: RUN/overlay-KIND.json)")
    p.set_defaults(func=cmd_graphs)
