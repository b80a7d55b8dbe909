"""Evidence from elsewhere: two logs that torch's DebugMode saved in two processes (`DebugMode.save_logs` after
`DebugMode.log_tensor_hashes`, torch 2.10+), or two numerics dumps of torchtitan (`--profiler.dump_numerics`: the
same hashes per op, as text), read and judged op by op: the first op whose output differs beyond rounding while its
inputs agree ("diverged here"), the ops whose inputs already differed ("inherited").

A user brings the logs of their own training job (eager against compile, one machine against another, two torch
versions); nothing of the job runs here, so the logs are read as JSON (no torch needed, any stack). DebugMode
keeps a hash per tensor, not the tensor: with hash_fn "norm" (its default) the L1 norm in float64, which a
difference beyond rounding moves. Without a yardstick the norms are judged against the rounding of the output's
dtype (ROUNDING: what reordered sums of that dtype move an L1 norm by); given a third log of the same job in
float64, by the verdict's arbiter (ortlab.verdict.exact): the second log's distance to float64 against the
first's. hash_fn "hash_tensor" says only whether the bits differ: such ops are not judged.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortlab.errors import InputError
from ortlab.verdict.ops import AGREES, DIVERGED_HERE, INHERITED, Op, OpTable

FORMAT, VERSION = "torch.utils._debug_mode.DebugMode.logs", 1  # what DebugMode.save_logs writes
TORCHTITAN = "Total captured activations:"  # how torchtitan's numerics dump begins (its DebugMode tracer, as text)
# The relative change of an L1 norm that reordered arithmetic of each dtype can make (a few units in the last place
# of a sum's terms, with headroom): a difference beyond it is not rounding
ROUNDING = {"f64": 1e-12, "f32": 1e-5, "tf32": 1e-3, "bf16": 2e-2, "f16": 5e-3}
_DTYPE = re.compile(r"\b(f64|f32|tf32|bf16|f16)\[")


class LogError(InputError):
    """A file that is not a DebugMode log ortlab can read, or two logs of different programs."""


@dataclass
class Logged:
    """One op of a DebugMode log: its name, the module it ran in (record_nn_module), its arguments as DebugMode
    wrote them, its outputs' and inputs' hashes (floats: norms; None where not a tensor or not logged)."""

    index: int
    name: str
    where: str
    args: str
    output: str
    hashes: list[Any]
    inputs: list[Any] | None  # None: the log has no input hashes
    phase: str = ""  # "forward" or "backward" where the log says (torchtitan's does)

    @property
    def rounding(self) -> float:
        found = _DTYPE.search(self.output)
        return ROUNDING[found.group(1)] if found else ROUNDING["f32"]


def read(path: str | Path) -> list[Logged]:
    """The ops of a DebugMode log file (or of torchtitan's numerics dump), in order; a file that is neither raises
    LogError naming it and what is expected."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise LogError(f"{path} is not a DebugMode log: {e}") from None
    if text.startswith(TORCHTITAN):
        return _torchtitan(text, path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise LogError(f"{path} is not a DebugMode log: {e}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise LogError(f"{path} is not a DebugMode log (expected JSON with format {FORMAT!r}, written by "
                       "torch.utils._debug_mode.DebugMode.save_logs)")
    if data.get("version") != VERSION:
        raise LogError(f"{path}: DebugMode log version {data.get('version')!r} is not known; known: {VERSION}")
    out: list[Logged] = []
    modules: list[tuple[int, str]] = []
    for call in data.get("logs") or []:
        depth = call.get("call_depth", 0)
        while modules and modules[-1][0] >= depth:
            modules.pop()
        if call.get("type") == "annotate":
            if call.get("header") == "nn.Mod":
                modules.append((depth, str(call.get("tag"))))
            continue
        if call.get("type") != "op":
            continue
        log = _value(call.get("log")) or {}
        inputs = log.get("input_hash")
        out.append(Logged(len(out), call.get("op_name", "?"), modules[-1][1] if modules else "",
                          call.get("args_str", ""), call.get("output_str", ""), _numbers(log.get("hash")),
                          None if inputs is None else _numbers(inputs)))
    if not out:
        raise LogError(f"{path} holds no op (was it saved inside `with DebugMode() as m:` from m.logs?)")
    return out


def _torchtitan(text: str, path: Path) -> list[Logged]:
    """torchtitan's numerics dump (`--profiler.dump_numerics`: numerics/rank_N_activations.log, DebugMode's norm
    hashes per op written as text): one block per captured op, "[module/op_N_name]" then "  Field: value" lines."""
    out: list[Logged] = []
    for block in re.split(r"\n(?=\[)", text.split("=" * 80, 1)[-1].strip()):
        lines = block.strip().splitlines()
        if not lines or not lines[0].startswith("["):
            continue
        key = lines[0].strip()[1:-1]
        fields = dict(line.strip().split(": ", 1) for line in lines[1:] if ": " in line)
        module = key.rpartition("/")[0]
        dtype = re.search(r"Dtype: torch\.(\w+)", fields.get("Shape", ""))
        short = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64"}
        output = f"{short.get(dtype.group(1), dtype.group(1))}[]" if dtype else ""
        inputs = fields.get("Input hashes")
        out.append(Logged(len(out), key, "" if module == "<none>" else module,
                          fields.get("Input producers", "").replace(";", ", ") or fields.get("Location", ""),
                          output, _floats(fields.get("Output hash", "")),
                          None if inputs is None else _floats(inputs), fields.get("Phase", "forward")))
    if not out:
        raise LogError(f"{path} holds no captured op (torchtitan's numerics dump lists them in [module/op_N] blocks)")
    return out


def _floats(text: str) -> list[Any]:
    values: list[Any] = []
    for item in text.split(","):
        try:
            values.append(float(item))
        except ValueError:
            values.append(None)
    return values if text.strip() else []


def compare(first: str | Path, second: str | Path, float64: str | Path | None = None) -> dict[str, Any]:
    """The OpTable (a dict) of the second log against the first, op by op; `float64`: a log of the same job in
    float64, the yardstick. Logs of different programs are compared up to where they part (said in the note)."""
    a, b = read(first), read(second)
    c = read(float64) if float64 is not None else None
    table = OpTable("", f"{Path(second).name} against {Path(first).name}")
    notes = []
    count = min(len(a), len(b), len(c) if c is not None else len(a))
    for i in range(count):
        names = {a[i].name, b[i].name} | ({c[i].name} if c is not None else set())
        if len(names) > 1:
            notes.append(f"the logs part at op #{i}: {' vs '.join(sorted(names))} (not the same program: compared "
                         "up to there)")
            count = i
            break
    else:
        if len(a) != len(b):
            notes.append(f"the logs hold {len(a)} and {len(b)} ops: compared up to #{count}")
    seen_difference = False
    no_inputs = any(x.inputs is None for x in a[:count] + b[:count])
    for i in range(count):
        op = Op(i, a[i].name, a[i].phase, a[i].where, [a[i].args], [], basis="logs")
        out = _differs(a[i].hashes, b[i].hashes, c[i].hashes if c else None, a[i].rounding)
        inp = None if no_inputs else _differs(a[i].inputs or [], b[i].inputs or [],
                                              (c[i].inputs or []) if c else None, a[i].rounding)
        entering = inp is not None and inp["diverged"] and not seen_difference
        if out is None:
            op.note = "no norm logged (hash_fn 'norm' logs one)"
        elif not out["diverged"]:
            op.status = AGREES
        elif (inp is not None and inp["diverged"]) or (inp is None and seen_difference):
            op.status, op.carried = INHERITED, out
        else:
            op.status, op.own = DIVERGED_HERE, out
        seen_difference |= op.status in (DIVERGED_HERE, INHERITED) or entering
        op.note = op.note or (_words(out, c is not None) if out and out["diverged"] else None)
        if entering:
            notes.append(f"the difference enters at op #{i} ({a[i].name}{f' in {a[i].where}' if a[i].where else ''})"
                         " through an input no logged op made: a parameter, a buffer or the data differ")
            op.note = "an input no logged op made differs" + (f"; {op.note}" if op.note else "")
        table.ops.append(op)
    if no_inputs:
        notes.append("the logs have no input hashes (DebugMode.log_tensor_hashes(hash_inputs=True) writes them): "
                     "every op after the first that differs is taken as inheriting it")
    table.note = "; ".join(notes) or None
    return table.to_dict()


def _differs(first: list[Any], second: list[Any], float64: list[Any] | None, rounding: float
             ) -> dict[str, Any] | None:
    """The worst pair of norms judged: against float64's when given (exact.decide), else against `rounding`
    relative; None when no norm was logged."""
    from ortlab.verdict import exact

    worst = None
    for k, (x, y) in enumerate(zip(first, second, strict=False)):
        if not isinstance(x, float) or not isinstance(y, float):
            continue
        if float64 is not None and k < len(float64) and isinstance(float64[k], float):
            z = float64[k]
            j = exact.decide(abs(y - z), abs(x - z), abs(z))
        else:
            scale = max(abs(x), abs(y), 1e-30)
            allowed = rounding * scale
            j = exact.Judged(abs(y - x), 0.0, allowed, scale, not math.isfinite(y - x) or abs(y - x) > allowed)
        if worst is None or (j.diverged, j.candidate / max(j.allowed, 1e-300)) > \
                (worst.diverged, worst.candidate / max(worst.allowed, 1e-300)):
            worst = j
    return worst.to_dict() if worst is not None else None


def _words(judged: dict[str, Any], yardstick: bool) -> str:
    from ortlab.verdict.exact import Judged, number, times

    j = Judged(**judged)
    if yardstick:
        return f"its output's norm is {times(j.candidate, j.pytorch)} further from float64 than the first log's"
    share = j.candidate / j.norm if j.norm else math.inf
    return f"its output's norm differs by {number(share)} of itself, where its dtype's rounding allows " \
           f"{number(j.allowed / j.norm if j.norm else 0.0)}"


def _value(node: Any) -> Any:
    """A value DebugMode serialized, rebuilt as plain Python (tuples as lists)."""
    if not isinstance(node, dict):
        return node
    kind = node.get("type")
    if kind == "scalar":
        return node.get("value")
    if kind == "nonfinite_float":
        return float(str(node.get("value")))
    if kind in ("tuple", "list"):
        return [_value(v) for v in node.get("items", [])]
    if kind == "dict":
        return {k: _value(v) for k, v in node.get("items", [])}
    return None


def _numbers(value: Any) -> list[Any]:
    """The hashes of a (nested) output or input, flattened in order: a norm as a float, a bit hash as an int, None
    where no tensor was; (norm, hash) pairs keep the norm."""
    if isinstance(value, dict):
        return [n for v in value.values() for n in _numbers(v)]
    if isinstance(value, list):
        if len(value) == 2 and isinstance(value[0], float) and isinstance(value[1], int) and \
                not isinstance(value[1], bool):
            return [value[0]]
        return [n for v in value for n in _numbers(v)]
    if isinstance(value, bool):
        return [None]
    if isinstance(value, int | float):
        return [float(value) if isinstance(value, float) else value]
    return [None]
