"""The profilers' files read as rows of attributed time, and one step's breakdown built from them the same way
for every backend.

A row is (step, phase, module, op type, node, seconds): one ORT node's kernel time (ORT's profiler JSON: its
node events carry the op type and the node name, whose scopes are the module path the export names, e.g.
/blocks.0/attn/MatMul), or one PyTorch op's self time (torch.profiler's Chrome trace: its module from the
innermost `module: PATH` range, a backward op's from the forward op of the same autograd sequence number). On CUDA
a row is one kernel's GPU time (a `kernel`, `gpu_memcpy` or `gpu_memset` event on a GPU stream), attributed through
its correlation id to the launch (`cuda_runtime` / `cuda_driver` event) and so to the PyTorch op, module, step and
phase that launched it.
"""

from __future__ import annotations

import collections
from typing import Any

from ortlab.graphs.names import PYTHON_OPS, is_tap, user_scope

ROOT = "(root)"  # the model's own ops, in no submodule
NONE = "(not in a module)"  # the loss, nodes whose names carry no scope
OPTIMIZER = "(optimizer)"
COLLECTIVES = "(collectives)"  # torch.distributed's ops (c10d::...): a rank's exchanges with the others
COMPILED = "(compiled graph: modules fused)"
TAPS = "(ortlab's statistics taps)"  # their kernel time is ortlab's, not the module's they sit in
TOP_NODES = 300  # nodes kept per run (the rest are summed in the module and op type rows)

Row = tuple[int, str, str, str, str, float]


def module_of(node: str, modules: set[str]) -> str:
    """The module path an exported node's name carries: "/_original_module/blocks/blocks.1/mlp/mlp.0/MatMul" ->
    "blocks.1.mlp.0" (a container's child is scoped as "<container>.<index>"; scopes naming no module before the
    first that does, ORTModule's wrapper, are skipped, and its prefix on the children of the module it wraps,
    `/_original_module/_original_module.0/Gemm` in a top-level nn.Sequential, is the user's `0`). A name without
    scopes (a node ORT's gradient builder or optimizer made) names no module."""
    if not node.startswith("/"):
        return NONE
    path = ""
    for part in node.strip("/").split("/")[:-1]:
        part = user_scope(part)
        last = path.rpartition(".")[2]
        candidates = [f"{path}.{part}" if path else part]
        if last and part.startswith(last + "."):
            candidates.append(f"{path}.{part[len(last) + 1:]}")
        found = next((c for c in candidates if c in modules), None)
        if found is None and path:
            break
        path = found or path
    return path or ROOT


def ort_rows(events: list[dict[str, Any]], start_ns: int, windows: dict[int, dict[str, tuple[int, int]]],
             modules: set[str]) -> tuple[list[Row], dict[str, Any]]:
    """ORT's profiler events -> rows of the node kernel times inside the profiled steps' phase windows (epoch ns),
    and the Chrome trace of those steps (ORT's events and ortlab's phase spans, microseconds from the first)."""
    spans = sorted((lo, hi, step, phase) for step, phases in windows.items() for phase, (lo, hi) in phases.items())
    if not spans:
        return [], {"traceEvents": []}
    first, last = spans[0][0], spans[-1][1]
    rows: list[Row] = []
    kept: list[dict[str, Any]] = []
    cache: dict[str, tuple[str, str]] = {}
    i = 0
    for e in sorted(events, key=lambda e: e.get("ts", 0)):
        at = start_ns + int(e.get("ts", 0)) * 1000
        if not first <= at <= last:
            continue
        kept.append({**e, "ts": (at - first) / 1000})
        name = e.get("name", "")
        if e.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        while i < len(spans) and spans[i][1] < at:
            i += 1
        if i == len(spans) or spans[i][0] > at:
            continue
        node = name[: -len("_kernel_time")]
        if node not in cache:
            cache[node] = (module_of(node, modules), (e.get("args") or {}).get("op_name", "?"))
        module, op = cache[node]
        rows.append((spans[i][2], spans[i][3], module, op, node, float(e.get("dur", 0)) / 1e6))
    pid = next((e["pid"] for e in kept if isinstance(e.get("pid"), int)), 0)  # ORT's process: ortlab's on tid 0
    kept.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": 0, "ts": 0,
                 "args": {"name": "ortlab: step phases"}})
    for lo, hi, step, phase in spans:
        kept.append({"name": f"step {step} {phase}", "cat": "ortlab", "ph": "X", "pid": pid, "tid": 0,
                     "ts": (lo - first) / 1000, "dur": (hi - lo) / 1000})
    return rows, {"traceEvents": kept, "displayTimeUnit": "ms"}


KERNELS = ("kernel", "gpu_memcpy", "gpu_memset")  # what runs on a GPU stream
LAUNCHES = ("cuda_runtime", "cuda_driver")  # the host's calls that start them (cuLaunchKernel: inductor's kernels)


def torch_rows(events: list[dict[str, Any]], compiled: bool = False) -> list[Row]:
    """torch.profiler's Chrome trace events -> rows of each op's self time inside the `ortlab: step S PHASE`
    ranges, attributed to the innermost `module: PATH` range (a backward op: to its forward op's module, by
    autograd sequence number; `compiled`: what runs inside torch.compile's graphs to COMPILED)."""
    ops, _ = _walk(events, compiled)
    return _in_steps(ops, _spans(events))


def cuda_rows(events: list[dict[str, Any]], compiled: bool = False) -> tuple[list[Row], list[dict[str, Any]]]:
    """torch.profiler's Chrome trace of a CUDA burst -> (rows of each kernel's GPU time, attributed to the op,
    module, step and phase whose launch started it (its correlation id); each kernel name's GPU time per step and
    phase, longest first). Kernels of launches outside the profiled steps' phases are left out."""
    _ops, launches = _walk(events, compiled)
    kernels: list[tuple[float, float, str, str]] = []
    names: dict[int, str] = {}  # index in kernels -> the kernel's name
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in KERNELS:
            continue
        launch = launches.get((e.get("args") or {}).get("correlation"))
        if launch is not None:
            at, module, op = launch
            names[len(kernels)] = str(e.get("name", ""))
            kernels.append((at, float(e.get("dur", 0)) / 1e6, module, op))
    order = sorted(range(len(kernels)), key=lambda k: kernels[k][0])
    spans = _spans(events)
    rows = _in_steps([kernels[k] for k in order], spans, [names[k] for k in order])
    per: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for _step, phase, _module, _op, name, seconds in rows:
        per[name, phase][0] += seconds
        per[name, phase][1] += 1
    steps = len({r[0] for r in rows}) or 1
    top = [{"kernel": k, "phase": p, "s": s / steps, "count": c / steps} for (k, p), (s, c) in per.items()]
    return [(*r[:4], "", r[5]) for r in rows], sorted(top, key=lambda t: -t["s"])


def _spans(events: list[dict[str, Any]]) -> list[tuple[float, float, list[str]]]:
    """The step phases' ranges on the host (on CUDA the profiler mirrors them on the GPU's timeline as
    gpu_user_annotation events: those are not the phases' wall time)."""
    return sorted((e["ts"], e["ts"] + e.get("dur", 0), e["name"].split()) for e in events
                  if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                  and str(e.get("name", "")).startswith("ortlab: step "))


def _walk(events: list[dict[str, Any]], compiled: bool) -> tuple[list[tuple[float, float, str, str]],
                                                                 dict[Any, tuple[float, str, str]]]:
    """Each host thread's ops as a stack: ([(start, self seconds, module, op)], {correlation id: (the launch's
    start, the module and op it was launched from)} for the CUDA launches among them)."""
    by_thread: dict[Any, list[dict[str, Any]]] = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation", *LAUNCHES):
            by_thread[(e.get("pid"), e.get("tid"))].append(e)
    forward_module: dict[int, str] = {}  # autograd sequence number -> the module of the forward op that made it
    ops: list[tuple[float, float, str, str]] = []  # (start, self seconds, module, op)
    launches: dict[Any, tuple[float, str, str]] = {}
    threads = sorted(by_thread.values(), key=lambda evs: min(e["ts"] for e in evs))
    for thread in threads:
        thread.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
        stack: list[list[Any]] = []  # [end, module, event, children's time]
        done: list[list[Any]] = []
        for e in thread:
            start, end = e["ts"], e["ts"] + e.get("dur", 0)
            while stack and stack[-1][0] <= start:
                done.append(stack.pop())
            module = stack[-1][1] if stack else NONE
            if e.get("cat") in LAUNCHES:  # not a frame: an op's self time keeps its launches, as without CUDA
                op = next((f[2]["name"] for f in reversed(stack) if f[2].get("cat") == "cpu_op"), e.get("name", ""))
                launches[(e.get("args") or {}).get("correlation")] = (start, module, _op_name(op))
                continue
            name = e.get("name", "")
            args = e.get("args") or {}
            seq = args.get("Sequence number")
            if e.get("cat") == "user_annotation":
                if name.startswith("module: "):
                    module = name[len("module: "):]
            else:
                if stack and stack[-1][2].get("cat") == "cpu_op":
                    stack[-1][3] += e.get("dur", 0)
                if compiled and name.startswith(("Torch-Compiled Region", "CompiledFunction")):
                    module = COMPILED  # what torch.compile runs: its graphs, forward and backward
                elif name.startswith("autograd::engine::evaluate_function") and seq is not None:
                    module = forward_module.get(seq, module)
                elif seq is not None and module != NONE:
                    forward_module.setdefault(seq, module)
            stack.append([end, module, e, 0.0])
        done.extend(stack)
        for _end, module, e, children in done:
            if e.get("cat") == "cpu_op":
                ops.append((e["ts"], max(e.get("dur", 0) - children, 0) / 1e6, module, _op_name(e["name"])))
    ops.sort()
    return ops, launches


def _in_steps(items: list[tuple[float, float, str, str]], spans: list[tuple[float, float, list[str]]],
              nodes: list[str] | None = None) -> list[Row]:
    """(start, seconds, module, op) sorted by start -> rows of those inside a step's phase (`nodes`: each item's
    node column)."""
    rows: list[Row] = []
    i = 0
    for k, (start, seconds, module, op) in enumerate(items):
        while i < len(spans) and spans[i][1] < start:
            i += 1
        if i == len(spans):
            break
        lo, _hi, words = spans[i]
        if start >= lo:
            phase = words[3]
            if op.startswith("c10d::"):
                module = COLLECTIVES
            elif phase == "optimizer":
                module = OPTIMIZER
            rows.append((int(words[2]), phase, module, op, nodes[k] if nodes else "", seconds))
    return rows


def _op_name(name: str) -> str:
    """An op's type: `autograd::engine::evaluate_function: MmBackward0` -> `MmBackward0 (autograd)`."""
    head, sep, tail = name.partition(": ")
    return f"{tail} (autograd)" if sep and head.startswith("autograd::") else name


WAIT = ("waiting for the slowest rank (its lead on the forward, as ortlab.engine.balance measures it; DDP's "
        "gradient all-reduce makes the ranks wait in the backward)")


def breakdown(rows: list[Row], walls: dict[int, dict[str, float]], kernels: str, outside: str,
              python_ops: dict[str, str] | None = None, waits: dict[int, float] | None = None) -> dict[str, Any]:
    """One profiled step on average: its phases (wall clock), each split into the profiler's kernel time and
    the rest (`outside`, named), and the kernel time per module, op type and node. Seconds per step. A rank of a
    distributed burst: `waits` (step -> its wait for the slowest rank) is taken out of the backward's outside."""
    n = len(walls) or 1
    python = python_ops or {}
    taps = {node for *_, op, node, _s in rows if op in PYTHON_OPS and is_tap(op, _function(node, python) or "")}
    inside: dict[tuple[int, str], float] = collections.defaultdict(float)
    modules: dict[tuple[str, str], float] = collections.defaultdict(float)
    ops: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0.0, 0])
    nodes: dict[tuple[str, str], list[Any]] = {}
    for step, phase, module, op, node, seconds in rows:
        if node in taps:
            module, op = TAPS, f"{op} (ortlab's tap)"
        inside[step, phase] += seconds
        modules[module, phase] += seconds
        ops[op, phase][0] += seconds
        ops[op, phase][1] += 1
        if node:
            entry = nodes.setdefault((node, phase), [op, module, 0.0, 0])
            entry[2] += seconds
            entry[3] += 1
    step_rows = []
    for step in sorted(walls):
        row: dict[str, Any] = {"step": step, "step_s": sum(walls[step].values())}
        for phase, seconds in walls[step].items():
            row[f"{phase}_s"] = seconds
            row[f"{phase}_kernels_s"] = inside[step, phase]
        step_rows.append(row)
    parts = []
    for phase in dict.fromkeys(p for w in walls.values() for p in w):  # forward, backward, optimizer; or loop
        wall = sum(w[phase] for w in walls.values()) / n
        kernel = sum(inside[s, phase] for s in walls) / n
        parts.append({"phase": phase, "part": kernels, "kind": "kernels", "s": kernel})
        wait = min(sum((waits or {}).get(s, 0.0) for s in walls) / n, wall - kernel) if phase == "backward" else 0
        parts.append({"phase": phase, "part": outside, "kind": "outside", "s": wall - kernel - wait})
        if waits is not None and phase == "backward":
            parts.append({"phase": phase, "part": WAIT, "kind": "wait", "s": wait})
    top = sorted(nodes.items(), key=lambda kv: -kv[1][2])
    return {
        "step_rows": step_rows,
        "step_s": sum(r["step_s"] for r in step_rows) / n,
        "parts": parts,
        "modules": [{"module": m, "phase": p, "s": s / n} for (m, p), s in sorted(modules.items())],
        "ops": [{"op": o, "phase": p, "s": s / n, "count": c / n} for (o, p), (s, c) in sorted(ops.items())],
        "nodes": [{"node": k, "phase": p, "op": op, "module": m, "s": s / n, "count": c / n}
                  for (k, p), (op, m, s, c) in top[:TOP_NODES]],
        "nodes_total": len(nodes),
        "python_ops": [{"node": k, "phase": p, "function": _function(k, python), "ortlab_tap": k in taps, "s": s / n}
                       for (k, p), (op, _m, s, _c) in top if op in PYTHON_OPS or k in taps],
    }


def _function(node: str, python_ops: dict[str, str]) -> str | None:
    """The autograd.Function a PythonOp (or its gradient node, named after it) runs: ORT names PythonOps of the
    execution graph `<function>_id_<n>`, the export names them by scope."""
    for name, function in python_ops.items():
        if node == name or node.startswith((name + "_Grad", name + "/", function + "_id_")):
            return function
    return None
