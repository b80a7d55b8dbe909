"""Below the module: the ops a localized module runs (forward and backward, in execution order, each input's
producer named), each judged against itself replayed in float64, so that an op is "diverged here" only where its
own error exceeds PyTorch fp32's and "inherited" where what reached it already carried the difference.

The localizer (ortlab.verdict.localize) names the smallest module whose run on the backend reproduces a gradient
divergence; a module still runs dozens of ops. Here the module runs once in PyTorch fp32 on the inputs and the
output gradient it saw on the first batch (ortlab.verdict.repro_case.capture), under a dispatch mode that records
every aten op with its inputs and outputs. Then each op that computes is run three ways on those recorded inputs:
on the backend alone (`Alone.op`: torch.compile compiles the one op with the run's settings, so a decomposition
or lowering of it is what runs), in float64, and as recorded (PyTorch fp32). Its own error is the backend's
distance to float64 against PyTorch's, by the verdict's arbiter (ortlab.verdict.exact). Two chains replayed op by
op say what reached each op: the backend's (each op on the backend, fed the backend chain's values) against
float64's (each op in float64, fed float64's values). An op whose own error is within fp32's but whose chain value
is beyond it inherited the divergence.

Ops that only view or move memory (views, detach, copies of metadata) and ops without a floating output are not
judged (they replay as recorded); random ops are not replayed. The cost is the module's own size: the recorded
values are kept while it runs (ortlab.verdict.op_record), and at most MAX_OPS ops are judged.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ortlab.verdict.op_record import Call, Recording, Ref, record

if TYPE_CHECKING:
    from ortlab.engine.backends import Alone

DIVERGED_HERE, INHERITED, AGREES, NOT_JUDGED = "diverged here", "inherited", "agrees", "not judged"
MAX_OPS = 400  # ops judged at most (a module this large was not localized far enough)
BUDGET_SECONDS = 600.0  # compiling ops one by one stops after this long; the rest are "not judged"
# aten ops that compute nothing a backend could round differently
_MOVES = {"detach", "alias", "clone", "contiguous", "lift_fresh", "lift_fresh_copy", "copy", "_to_copy", "empty_like",
          "zeros_like", "ones_like", "full_like", "empty", "zeros", "ones", "full", "scalar_tensor", "new_empty",
          "new_zeros", "new_ones", "new_full", "empty_strided", "new_empty_strided", "fill", "zero", "cat", "stack",
          "index_select", "gather", "slice_scatter", "select_scatter", "constant_pad_nd", "_unsafe_view", "view",
          "reshape", "expand", "t", "transpose", "permute", "squeeze", "unsqueeze", "split", "split_with_sizes",
          "unbind", "chunk", "flatten", "select", "slice", "as_strided", "repeat", "masked_fill", "where"}


@dataclass
class Op:
    """One op the module ran: where (the module inside the localized one, or the backward of one), what fed it, and
    how it was judged (`own`: the op alone on the backend against float64 on the same inputs; `carried`: the
    backend chain's value against float64's chain; each an exact.Judged as a dict)."""

    index: int
    name: str  # "aten.addmm.default"
    phase: str  # "forward" or "backward"
    where: str  # "inp", "out.0" (a module inside the localized one; "" itself); backward: "inp (AddmmBackward0)"
    inputs: list[str]  # each tensor input's producer: "#3" (an op), a parameter's name, "input 0", "constant"
    shape: list[int]
    status: str = NOT_JUDGED
    own: dict[str, Any] | None = None
    carried: dict[str, Any] | None = None
    note: str | None = None
    # how it was judged: "alone" (the op run alone on the backend), "graph" (a node of the backend's graph, on the
    # inputs the graph gave it), "logs" (two logs' hashes)
    basis: str = "alone"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def text(self) -> str:
        """"aten.mul.Tensor (#4, forward, in block): alone on torch.compile 1.2e+04x further from float64 than
        PyTorch's" """
        where = f"in {self.where}" if self.where else ""
        head = f"{_short(self.name)} ({', '.join(p for p in (f'#{self.index}', self.phase, where) if p)})"
        if self.status == DIVERGED_HERE and self.note and (self.basis == "logs" or not (self.own or {}).get(
                "diverged")):
            return f"{head}: {self.note}"
        if self.status == DIVERGED_HERE and self.own and self.basis in ("alone", "graph"):
            from ortlab.verdict.exact import Judged, percent, times

            own = Judged(**self.own)
            error = percent(own.candidate, own.norm)
            how = "run alone it is" if self.basis == "alone" else "on the inputs ORT gave it, its output is"
            if own.pytorch == 0:
                return f"{head}: {how} {error} of its value off float64, where PyTorch fp32's is exact"
            return (f"{head}: {how} {times(own.candidate, own.pytorch)} further from float64 than PyTorch fp32's "
                    f"(an error of {error} of its value)")
        return f"{head}: {self.status}" + (f" ({self.note})" if self.note else "")


@dataclass
class OpTable:
    """The ops inside a module on one backend, judged; `first`: the first op that diverged here (its text)."""

    module: str
    backend: str  # whose ops ("torch.compile")
    ops: list[Op] = field(default_factory=list)
    seconds: float = 0.0
    note: str | None = None  # why some or all ops were not judged
    bisect: dict[str, Any] | None = None  # which part of the backend makes the first op wrong (Alone.bisect)

    @property
    def first(self) -> Op | None:
        return next((o for o in self.ops if o.status == DIVERGED_HERE), None)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for o in self.ops:
            out[o.status] = out.get(o.status, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        first = self.first
        text = first.text if first else None
        if text and self.bisect:
            text = f"{text}; {bisected(self.bisect)}"
        return {"module": self.module, "backend": self.backend, "ops": [o.to_dict() for o in self.ops],
                "seconds": self.seconds, "note": self.note, "counts": self.counts(), "first": text,
                "first_index": first.index if first else None, "bisect": self.bisect}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OpTable:
        return cls(d["module"], d["backend"], [Op(**o) for o in d.get("ops", [])], d.get("seconds", 0.0),
                   d.get("note"), d.get("bisect"))


def bisected(found: dict[str, Any]) -> str:
    """CompilerBisector's finding in words: "inductor's CompilerBisector: backend aot_eager_decomp_partition,
    subsystem decomposition, its 3rd application (aten.gain)"."""
    where = f"backend {found['backend']}"
    if found.get("subsystem"):
        where += f", subsystem {found['subsystem']}"
    if found.get("application") is not None:
        where += f", application {found['application']}"
    detail = re.sub(r"<OpOverload\(op='([^']+)', overload='([^']+)'\)>", r"\1.\2", str(found.get("detail") or ""))
    detail = f" ({detail})" if detail else ""
    return f"inductor's CompilerBisector: the op goes wrong at {where}{detail}"


def inside(workload: Any, batch: tuple[Any, Any], path: str, alone: Alone, seed: int = 0,
           progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """The OpTable (as a dict) of the module at `path` ("" the whole model) on the backend `alone` describes, from
    its first batch's inputs and output gradient. A backend that cannot run one op alone (ORTModule runs graphs)
    gets a table with a note and no ops. `progress(done, total)` after each op judged."""
    from ortlab.verdict.repro_case import capture

    started = time.perf_counter()
    table = OpTable(path, alone.who)
    if alone.op is None and alone.graph is None:
        table.note = f"{alone.who} runs whole graphs, not one op alone: its ops are not judged here"
        return table.to_dict()
    data = capture(workload, batch, path, seed)
    if alone.op is None:  # ORTModule: the nodes of its training graph (ortlab.verdict.graph_nodes)
        from ortlab.verdict.graph_nodes import inside as nodes

        try:
            table = nodes(data, alone, path)
        except Exception as e:  # the graph cannot be run again here: the module's localization stands
            from ortlab.compat.errors import root_message

            table.note = f"its graph's nodes were not judged: {root_message(e)}"
        table.seconds = time.perf_counter() - started
        return table.to_dict()
    recording = record(data)
    table.ops, table.note = judge(recording, alone, progress), recording.note
    if recording.cut is not None:
        table.note = f"recorded up to op #{recording.cut} ({recording.note})"
    first = table.first
    if first is not None and alone.bisect is not None:
        table.bisect = _bisect(recording, recording.calls[first.index], alone)
    table.seconds = time.perf_counter() - started
    return table.to_dict()


# -- judging


def judge(rec: Recording, alone: Alone, progress: Callable[[int, int], None] | None = None) -> list[Op]:
    """Each recorded op judged alone and along both chains (module docstring)."""
    import torch
    from torch.utils._pytree import tree_flatten

    from ortlab.compat.errors import root_message

    started = time.perf_counter()
    f64 = {r: _cast(v) for r, v in rec.values.items() if r.kind == "leaf"}  # float64's chain
    chain = {r: v for r, v in rec.values.items() if r.kind == "leaf"}  # the backend's chain
    computes = [_computes(c, rec) for c in rec.calls]  # once each: a random op is run again to see it repeats
    judged = [c for c, yes in zip(rec.calls, computes, strict=True) if yes][:MAX_OPS]
    wanted = {id(c) for c in judged}
    ops, done = [], 0
    for index, call in enumerate(rec.calls):
        inputs = [_producer(r, rec) for r in tree_flatten((call.args, call.kwargs))[0] if isinstance(r, Ref)]
        recorded = [rec.values[r] if r is not None else None for r in call.outputs]
        first = next((v for v in recorded if v is not None), None)
        op = Op(index, str(call.func), call.phase, call.where, inputs, list(first.shape) if first is not None else [])
        ops.append(op)
        c64 = _run(call, f64, torch.float64)
        if id(call) not in wanted:  # the backend chain takes PyTorch's: nothing computed, or past the limits
            chain_out = _run(call, chain, None)
            if computes[index]:
                op.note = f"beyond the {MAX_OPS} ops judged"
        elif time.perf_counter() - started > BUDGET_SECONDS:
            chain_out = _run(call, chain, None)
            op.note = f"the {BUDGET_SECONDS:.0f} s budget for judging ops was spent"
        else:
            try:
                runner = alone.op(call.func)  # type: ignore[misc]  # not None: inside() returned before
                mine = _run(call, rec.values, None, runner)
                chain_out = _run(call, chain, None, runner)
            except Exception as e:
                op.note = f"it does not run alone on {alone.who}: {root_message(e)}"
                chain_out = _run(call, chain, None)
                mine = None
            if mine is not None:
                scale = _scale(call, rec)
                op.own = judge_outputs(mine, recorded, _run(call, rec.values, torch.float64), scale)
                op.carried = judge_outputs(chain_out, recorded, c64, scale)
                op.status = status_of(op.own, op.carried)
            done += 1
            if progress is not None:
                progress(done, len(judged))
        for ref, value in zip(call.outputs, chain_out, strict=False):
            if ref is not None:
                chain[ref] = value
        for ref, value in zip(call.outputs, c64, strict=False):
            if ref is not None:
                f64[ref] = value
    return ops


def _bisect(rec: Recording, call: Call, alone: Alone) -> dict[str, Any] | None:
    """Which part of the backend makes the op wrong (Alone.bisect), on its recorded inputs; a bisection that fails
    is a finding not made, never the table lost."""
    import torch

    scale = _scale(call, rec)
    exact = _run(call, rec.values, torch.float64)
    recorded = [rec.values[r] if r is not None else None for r in call.outputs]

    def agrees(runner: Callable[..., Any]) -> bool:
        judged = judge_outputs(_run(call, rec.values, None, runner), recorded, exact, scale)
        return judged is None or not judged["diverged"]

    try:
        return alone.bisect(call.func, agrees)  # type: ignore[misc]  # not None: asked only then
    except Exception:  # a bisection that fails finds nothing
        return None


def _computes(call: Call, rec: Recording) -> bool:
    """Whether the op computes values a backend could round differently (a floating output, not a view or a
    move, not random)."""
    import torch

    packet = call.func.name().split("::")[-1].split(".")[0]
    if packet in _MOVES or (packet.endswith("_") and packet[:-1] in _MOVES):
        return False
    if torch.Tag.nondeterministic_seeded in getattr(call.func, "tags", ()) and not _repeats(call, rec):
        return False  # random (attention with dropout); with dropout off it repeats and is judged
    if getattr(call.func, "is_view", False):
        return False
    return any(r is not None and rec.values[r].is_floating_point() for r in call.outputs)


def _repeats(call: Call, rec: Recording) -> bool:
    """Whether the op, run again on its recorded inputs, gives exactly what it gave."""
    import torch

    try:
        again = _run(call, rec.values, None)
    except Exception:  # an op that cannot run again is not judged
        return False
    return all(r is None or (a is not None and torch.equal(a, rec.values[r])) for r, a in zip(call.outputs, again,
                                                                                         strict=False))


def _run(call: Call, values: dict[Ref, Any], dtype: Any, runner: Callable | None = None) -> list[Any]:
    """The op's tensor outputs (pytree order, None where not a tensor) on the values given, each input cloned (an
    in-place op changes its copy); `dtype` float64: floating inputs cast and float32 requests made float64."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_map

    def value(v: Any) -> Any:
        if isinstance(v, Ref):
            t = values[v].clone()
            return t.to(dtype) if dtype is not None and t.is_floating_point() else t
        if dtype is not None and isinstance(v, torch.dtype) and v.is_floating_point:
            return dtype
        return v

    args, kwargs = tree_map(value, (call.args, call.kwargs), is_leaf=lambda v: isinstance(v, Ref))
    out = (runner or call.func)(*args, **kwargs)
    flat, _ = tree_flatten(out)
    return [t.detach() if isinstance(t, torch.Tensor) else None for t in flat]


def judge_outputs(candidate: list[Any], pytorch: list[Any], float64: list[Any], scale: float
                  ) -> dict[str, Any] | None:
    """The worst floating output of an op judged (exact.judge: the candidate against PyTorch fp32, both measured
    from float64), as a dict; None when it has none."""
    from ortlab.verdict import exact

    worst = None
    for c, p, e in zip(candidate, pytorch, float64, strict=False):
        if c is None or p is None or e is None or not p.is_floating_point() or c.shape != p.shape:
            continue
        if not bool(c.isfinite().all()):  # where both fp32 sides overflow alike (a mask's minimum plus more), fp32's
            same = (c == p) | (c.isnan() & p.isnan())  # range is the limit, not the backend: judged elsewhere
            if not bool((~c.isfinite() & ~same).any()):
                keep = c.isfinite()
                c, p, e = c[keep], p[keep], e[keep]
        j = exact.judge(c, p, e, scale)
        if j.diverged and exact.close(c, p):
            j.diverged = False
        if worst is None or (j.diverged, _ratio(j)) > (worst.diverged, _ratio(worst)):
            worst = j
    return worst.to_dict() if worst is not None else None


def status_of(own: dict[str, Any] | None, carried: dict[str, Any] | None) -> str:
    """An op's status from its own judgement and its chain's (judge_outputs): diverged here where its own error is
    beyond fp32's, inherited where only what reached it was, agrees where it was judged and neither is."""
    if own and own["diverged"]:
        return DIVERGED_HERE
    if carried and carried["diverged"]:
        return INHERITED
    return AGREES if own is not None else NOT_JUDGED


def input_norm(tensors: Any) -> float:
    """The absolute floor's unit for an op or node: the norm of its floating inputs (a sum that cancels is judged
    against what it summed, not against its near-zero result)."""
    import torch

    return math.sqrt(sum(float(t.double().norm()) ** 2 for t in tensors
                         if isinstance(t, torch.Tensor) and t.is_floating_point()))


def _ratio(j: Any) -> float:
    return j.candidate / j.allowed if j.allowed > 0 else (math.inf if j.candidate > 0 else 0.0)


def _scale(call: Call, rec: Recording) -> float:
    """input_norm of the op's recorded inputs."""
    from torch.utils._pytree import tree_flatten

    return input_norm(rec.values[r] for r in tree_flatten((call.args, call.kwargs))[0] if isinstance(r, Ref))


def _producer(ref: Ref, rec: Recording) -> str:
    return f"#{ref.index}" if ref.kind == "op" else rec.leaves[ref.index]


def _cast(value: Any) -> Any:
    return value.double() if value.is_floating_point() else value


def _short(name: str) -> str:
    """aten.addmm.default -> aten.addmm; ortlab_test.gain.default -> ortlab_test.gain."""
    return name[:-len(".default")] if name.endswith(".default") else name


def lines(table: dict[str, Any], context: int = 3) -> list[str]:
    """The judged ops of an OpTable dict as text lines, the first op that diverged here marked ">>", with
    `context` judged ops before it and the ops after it that inherited it folded into a count."""
    from ortlab.verdict.exact import Judged, number, times

    ops = [o for o in table.get("ops", []) if o["status"] != NOT_JUDGED]
    if not ops:
        return [f"ops inside {table.get('module') or 'the model'}: {table.get('note') or 'none judged'}"]
    first = table.get("first_index")
    at = next((i for i, o in enumerate(ops) if o["index"] == first), None)
    shown = ops if at is None else ops[max(0, at - context):]
    logs, graph = ops[0].get("basis") == "logs", ops[0].get("basis") == "graph"
    module = table.get("module") or "the whole model"
    head = (f"ops of {table['backend']} ({len(ops)} judged of {len(table.get('ops', []))}; differs: the worst "
            "output norm's difference, relative)" if logs else
            f"nodes of {table['backend']}'s training graph of {module} ({len(ops)} judged of "
            f"{len(table.get('ops', []))}; alone: each node's error against float64 on the inputs ORT gave it, over "
            "PyTorch fp32's)" if graph else
            f"ops inside {module} on {table['backend']} ({len(ops)} judged of "
            f"{len(table.get('ops', []))}; alone: its error against float64 over PyTorch fp32's on the same inputs)")
    out = [head, f"   {'#':>4}  {'op':<28} {'phase':<8} {'where':<26} {'differs' if logs else 'alone':>9}  "
                 f"{'status':<13} inputs"]
    inherited = 0
    for o in shown:
        if at is not None and o["index"] > first and o["status"] == INHERITED and inherited >= context:
            inherited += 1
            continue
        inherited += o["status"] == INHERITED
        own = Judged(**o["own"]) if o.get("own") else None
        ratio = "" if own is None else "inf" if own.pytorch <= 0 < own.candidate else times(own.candidate, own.pytorch)
        if logs:
            worst = o.get("own") or o.get("carried")
            ratio = number(worst["candidate"] / worst["norm"]) if worst and worst["norm"] else ""
        mark = ">>" if o["index"] == first else "  "
        where = (o["where"] or "-")[:26]
        out.append(f"{mark} {o['index']:>4}  {_short(o['name'])[:28]:<28} {o['phase']:<8} {where:<26} "
                   f"{ratio:>9}  {o['status']:<13} {', '.join(o['inputs'])[:40]}")
    if inherited > context:
        out.append(f"   ... and {inherited - context} more ops after it that inherited the difference")
    if table.get("note"):
        out.append(f"   note: {table['note']}")
    return out


def table_of(verdict: dict[str, Any] | None) -> dict[str, Any] | None:
    """The op table a run's verdict.json holds (its localization's, kept by `ortlab repro` or by the verdict's own
    cause), or None."""
    from ortlab.verdict.localize import localization_of

    table = (localization_of(verdict) or {}).get("ops")
    return table if table and table.get("ops") else None
