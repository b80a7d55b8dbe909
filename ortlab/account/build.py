"""`memory(run_or_path)`: find the execution model and the burst's dimensions, walk the graph, assemble the
account.

A run knows what a bare graph does not: its input shapes (ort.json `input_shapes`, or the plans collector's
`dims`), which inputs are parameters (ORT's post-export record), the options (which execution order ORT
used), the optimizer and the device. For a bare `.onnx` file, pass `dims` or `input_shapes`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ortlab.account.account import MemoryAccount
from ortlab.account.errors import AccountError
from ortlab.account.graph import (
    DTYPES,
    ExecGraph,
    Shapes,
    dims_from_inputs,
    input_symbols,
    nbytes,
    read_graph,
    resolve,
)
from ortlab.account.liveness import Plan, alive_at, plan, timeline
from ortlab.account.order import ORDERS, execution_order

ORDER_CHOICES = ("auto", *ORDERS)
# moment buffers (ortlab's SGD: momentum 0.9; an optimizer a workload brought is named by its class: adamw, adam)
_STATE_PER_PARAMETER = {"adamw": 2, "adam": 2, "fused_adam": 2, "sgd": 1}


def memory(source: Any, *, dims: Mapping[str, int] | None = None,
           input_shapes: Mapping[str, Any] | None = None, order: str = "auto",
           prefix: str | None = None) -> MemoryAccount:
    """The activation-memory account of an ORTModule training graph.

    `source`: a Run, a run folder (a burst with option save_onnx), a folder of ORTModule stage files, or an
    execution model `.onnx`. `dims` ({symbol: value}) and `input_shapes` ({graph input:
    shape}) give the shapes to evaluate at; what the run recorded fills in every symbol they leave out. `order`:
    "auto" (the one ORT used: memory_efficient when the memory optimizer is on), "default" or "memory_efficient".
    `prefix` picks one export of several. Returns a MemoryAccount; bad input raises AccountError.
    """
    _check_order(order)
    path, run = _locate(source, prefix)
    return account_of(path, run, dims=dims, input_shapes=input_shapes, order=order)


def account_of(path: Path, run: Any, *, dims: Mapping[str, int] | None = None,
               input_shapes: Mapping[str, Any] | None = None, order: str = "auto",
               user_inputs: Sequence[str] | None = None) -> MemoryAccount:
    """The account of the execution model at `path`, for `run` (its options, optimizer and device; None: a bare
    graph). `user_inputs`, the graph inputs that are not parameters, default to ORT's record in the run's
    ort.json: a burst's collector passes them (and `input_shapes`) before the burst writes that file, and may
    name a graph of an earlier burst whose ORTModule this one reused."""
    _check_order(order)
    g = read_graph(path)
    values = _values(g, run, dims, input_shapes)
    shapes = resolve(g, values)
    sizes = {t: nbytes(v) for t, v in shapes.concrete.items()}
    kind, reason = _order(g, run, order)
    steps, used = execution_order(g, kind)
    if used != kind:
        reason = f"{kind} asked, but the graph has no single YieldOp: default"
    p = plan(g, steps, sizes, _parameters(g, run, user_inputs))
    return _assemble(g, run, p, shapes, values, used, reason)


def _check_order(order: str) -> None:
    if order not in ORDER_CHOICES:
        raise AccountError(f"order={order!r}: allowed are {', '.join(ORDER_CHOICES)}")


def _locate(source: Any, prefix: str | None) -> tuple[Path, Any]:
    """The execution model file, and the run it belongs to (or None)."""
    from ortlab.graphs import GraphsError, load
    from ortlab.runs.run import Run

    if not isinstance(source, Run | str | Path):
        raise AccountError(f"memory() takes a Run, a folder or an .onnx path, not {type(source).__name__}")
    if not isinstance(source, Run):
        path = Path(source).expanduser()
        if path.suffix == ".onnx":
            return path, None
        if not path.exists():
            raise AccountError(f"{path} does not exist; give a run, a run folder, a folder of ORTModule "
                               "stage files or an execution model .onnx")
    try:
        graphs = load(source, prefix=prefix)
    except GraphsError as e:
        raise AccountError(str(e)) from None
    found = graphs.files.get(("training", "execution_model"))
    if found is None:
        stages = ", ".join(f"{s} ({m})" for m, s in sorted(graphs.files)) or "none"
        raise AccountError(f"{graphs.folder} has no training execution model (the graph ORT runs, "
                           f"PREFIX_execution_model_training.onnx); stage files there: {stages}")
    return found, graphs.run


def _values(g: ExecGraph, run: Any, dims: Mapping[str, int] | None,
            input_shapes: Mapping[str, Any] | None) -> dict[str, int]:
    """Values of the graph's symbolic input dimensions: the run's recorded ones, then `input_shapes`, then `dims`,
    each overriding only the symbols it names (so `--dim` changes one symbol and keeps the rest)."""
    values: dict[str, int] = {}
    recorded = run.ort.get("input_shapes") if run is not None else None
    planned = (run.read_json("plans.json") or {}).get("dims") if run is not None and not recorded else None
    if recorded:  # the inputs `input_shapes` names are its to give
        values.update(dims_from_inputs(g, {k: v for k, v in recorded.items() if k not in (input_shapes or {})}))
    elif planned:
        values.update({str(k): int(v) for k, v in planned.items()})
    if input_shapes is not None:
        values.update(dims_from_inputs(g, input_shapes))
    needed = input_symbols(g)
    for name, value in (dims or {}).items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise AccountError(f"dims[{name!r}] = {value!r}: allowed is a whole number >= 0")
        if str(name) not in needed:  # a typo would otherwise leave the recorded value in place, silently
            raise AccountError(f"dims[{name!r}]: {g.path.name} has no input symbol {name!r}; its symbols: "
                               f"{', '.join(sorted(needed)) or 'none'}")
        values[str(name)] = value
    missing = sorted(set(needed) - set(values))
    if missing:
        where = "; ".join(f"{s} (axis {a} of {n})" for s in missing for n, a in needed[s][:1])
        told = ("the run recorded no input shapes (ort.json input_shapes, plans.json dims); "
                if run is not None and not recorded and not planned else "")
        example = ", ".join(repr(s) + ": ..." for s in missing)
        raise AccountError(f"{g.path.name}: the shapes use symbols without a value: {where}; {told}pass "
                           f"dims={{{example}}} or input_shapes={{input name: shape}} "
                           "(CLI: --dim SYMBOL=VALUE)")
    return values


def _order(g: ExecGraph, run: Any, order: str) -> tuple[str, str]:
    """The execution order ORT used: ORTModule sorts MEMORY_EFFICIENT when the memory optimizer (level 1 or 2,
    or a plan config at level 0) or memory-efficient gradient management is on, DEFAULT otherwise."""
    if order != "auto":
        return order, "asked"
    if run is not None:
        options = run.meta.get("effective_options") or (run.meta.get("config") or {}).get("options") or {}
        on = (int(options.get("memory_opt_level") or 0) in (1, 2) or options.get("memory_opt_config")
              or options.get("enable_mem_efficient_grad_mgmt"))
        if on:
            return "memory_efficient", "the run's options turn ORT's memory optimizer on"
        return "default", "the run's options leave ORT's memory optimizer off"
    if any(n.endswith("_recompute") for n in g.names):
        return "memory_efficient", "the graph has recompute nodes: ORT's memory optimizer was on"
    return "default", "no recompute nodes: ORT's memory optimizer taken as off"


def _parameters(g: ExecGraph, run: Any, user_inputs: Sequence[str] | None) -> set[str] | None:
    """Graph inputs that are parameters, from ORT's post-export record (None: guess from the gradients)."""
    if user_inputs is None:
        info = (run.ort.get("post_export") or {}) if run is not None else {}
        user_inputs = info.get("user_inputs")
    if user_inputs is None:
        return None
    user = set(user_inputs)
    return {t for t in g.graph_inputs if t not in user and t not in g.initializers}


def _phase(step: int, yield_step: int | None) -> str:
    if yield_step is None or step < yield_step:
        return "forward"
    return "yield" if step == yield_step else "backward"


def _assemble(g: ExecGraph, run: Any, p: Plan, shapes: Shapes, values: dict[str, int], order: str,
              reason: str) -> MemoryAccount:
    from ortlab.graphs import module_scope

    tl = timeline(p)
    producer = {t: i for i, outs in enumerate(g.outputs) for t in outs if t}
    peak = max(range(p.steps), key=tl.live.__getitem__)
    y = p.yield_step
    members = p.members()

    def row(root: str, step: int) -> dict[str, Any]:
        """A buffer as the tensor it holds at `step` (an in-place kernel's output, not what it overwrote)."""
        name = p.holder(root, step)
        i = producer[name]
        elem, dims = shapes.concrete.get(name, (g.saved.get(name, (0, None))[0], None))
        return {"name": name, "bytes": p.size[root], "shape": list(dims) if dims is not None else None,
                "dtype": DTYPES.get(elem, str(elem)), "producer": g.names[i], "op": g.ops[i],
                "module": module_scope(g.names[i]), "born": _phase(p.start[root], y), "freed": p.end[root],
                "buffer": root, "views": len(members[root]) - 1}

    def total(kind: str) -> int:
        return sum(p.size[r] or 0 for r in p.start if p.kind[r] == kind)

    uncertain = [{**row(r, p.start[r]), "reason": shapes.unknown.get(r, "no size for its type")}
                 for r in p.start if p.kind[r] == "activation" and p.size[r] is None]
    stash = [] if y is None else [r for r in alive_at(p, y) if p.start[r] < y < p.end[r]]
    optimizer = ((run.meta.get("config") or {}) if run is not None else {}).get("optimizer")
    known = _STATE_PER_PARAMETER
    if optimizer == "auto":  # the class the burst made (a Trainer's own, else AdamW; older runs: ortlab's AdamW);
        optimizer = str(run.meta.get("optimizer") or "AdamW").lower()  # another's SGD: its momentum is not known
        known = {k: v for k, v in known.items() if k != "sgd"}
    factor = known.get(optimizer) if optimizer else None
    trainable = sum(p.size[r] or 0 for r in p.start
                    if p.kind[r] == "parameter" and f"{r}_grad" in g.graph_outputs)
    steps: dict[str, list[Any]] = {"node": [g.names[i] for i in p.order], "op": [g.ops[i] for i in p.order],
             "phase": [_phase(s, y) for s in range(p.steps)], "live": tl.live, "gradients": tl.gradients,
             "uncertain": tl.uncertain}
    account = MemoryAccount(
        source=str(g.path), run=run.path.name if run is not None else None, order=order, order_reason=reason,
        device=(run.meta.get("device") if run is not None else None) or "unknown", dims=dict(values),
        nodes=len(g), peak_activation_bytes=tl.live[peak], peak_index=peak, peak_node=g.names[p.order[peak]],
        peak_op=g.ops[p.order[peak]], peak_phase=_phase(peak, y), yield_index=y,
        yield_activation_bytes=None if y is None else tl.live[y],
        stashed_bytes=None if y is None else sum(p.size[r] or 0 for r in stash),
        parameter_bytes=total("parameter"), gradient_bytes=total("gradient"), input_bytes=total("input"),
        constant_bytes=total("constant"),
        optimizer_state_bytes=None if factor is None else factor * trainable,
        optimizer=optimizer, top_tensors=[row(r, peak) for r in alive_at(p, peak)],
        stashed_tensors=[row(r, y) for r in stash] if y is not None else [], uncertain=uncertain,
        uncertain_at_peak=tl.uncertain[peak],
        what="", steps=steps)
    account.what = _what(account, g.taps)
    return account


def _what(a: MemoryAccount, taps: int = 0) -> str:
    """What the figures count, in words, for this account."""
    order = a.order.replace("_", "-")
    text = [
        "What is counted: the bytes of the buffers ORT allocates while the graph runs (activations: forward "
        "values, those stashed for the backward pass, backward temporaries), live from the step that writes "
        f"them to the last step that reads them, walked in ORT's {order} execution order; a Reshape-like "
        "view or an in-place kernel shares its input's buffer, as ORT's allocation planner decides "
        "(onnxruntime-training 1.19.2, CPU kernels). Exact at the shapes given, not a process measurement.",
        "Counted apart: parameters and user inputs (PyTorch's tensors, fed to the graph), the parameter "
        "gradients the graph outputs (held to the end of backward), the graph's constants, and the "
        "optimizer's state (PyTorch's, outside the graph). The forward outputs are counted until the yield; "
        "then PyTorch holds them.",
    ]
    if a.order == "memory_efficient":
        text.append("The memory-efficient order is rebuilt from the saved graph; ORT breaks ties between "
                    "independent nodes by in-memory node index, which the file does not keep.")
    if a.device not in ("cpu", "unknown"):
        text.append(f"On {a.device}, kernels that work in place differ from the CPU's; the account uses the "
                    "CPU's.")
    if taps:
        text.append(f"The graph holds {taps} nodes of ortlab's statistics taps (PythonOp, PythonOpGrad: the burst "
                    "collected statistics): each returns its input's tensor, counted once as its input, and holds "
                    "only an 8-byte context handle of its own; they can keep ORT from fusing the ops on either "
                    "side.")
    if a.uncertain:
        text.append(f"{len(a.uncertain)} activation buffers have no known size and are not counted "
                    f"({a.uncertain_at_peak} alive at the peak): the peak is a lower bound.")
    return "\n".join(text)
