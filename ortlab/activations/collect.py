"""Collector "stats": per-step statistics of every module output and its gradient, the same in both backends.

PyTorch bursts use module forward hooks and tensor gradient hooks. Under ORTModule hooks run only while ORT
exports, so there each observed tensor goes through `_Tap`, an autograd Function that the exporter turns into
a PythonOp (ORT's own hooks package does the same): ORT calls back into Python in forward and in backward.
Both backends summarize with the same code (a one-pass C kernel for float32 on the CPU, else numpy or torch),
so identical tensors give identical rows. Why not ONNX reductions inside the graph: measured on this CPU, ORT's
Equal/IsNaN/IsInf + Cast + ReduceSum cost ~0.5 ns per element and count, five times numpy's and six times the
kernel's (docs/convergence.md), and two of ORT 1.19.2's graph transformers fail on Mul(x, x) and on If nodes
in such a branch.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import json
import math
import os
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ortlab.activations.table import FIELDS, FORMAT, STATS_FILE
from ortlab.burst import Collector

ROOT = "(root)"  # the name of the model's own output
_NF = len(FIELDS)

_ACTIVE: StatsCollector | None = None  # the collector of the running burst (taps and ORT's callbacks find it)


class StatsError(ValueError):
    """Bad collector arguments, or a stats file that cannot be read."""


# --------------------------------------------------------------------------- summaries


class _Summarizer:
    """Statistics of one tensor: min, max, sum, sum of squares, centred sum of squares (std that is right for
    any mean), counts of nan, inf and zeros, and `k` values at evenly spaced flat positions. Reductions are in
    fp32 or wider (fp16/bf16 are widened first); min/max/sums are over the finite values when there are nan or
    inf. float32 on the CPU goes through a one-pass C kernel (see _kernel), the rest through numpy."""

    def __init__(self, k: int):
        from ortlab.activations._kernel import kernel

        self.k = k
        self.kernel = kernel()
        self._index: dict[int, tuple[np.ndarray, int]] = {}
        self._bases: dict[int, tuple[np.ndarray, int]] = {}  # id(buffer) -> (buffer, address)

    def positions(self, n: int) -> np.ndarray:
        return self._positions(n)[0]

    def _positions(self, n: int) -> tuple[np.ndarray, int]:
        entry = self._index.get(n)
        if entry is None:
            idx = np.unique(np.linspace(0, n - 1, min(self.k, n)).round().astype(np.int64))
            entry = self._index[n] = (idx, idx.ctypes.data)
        return entry

    def _address(self, buffer: np.ndarray) -> int:
        entry = self._bases.get(id(buffer))
        if entry is None or entry[0] is not buffer:
            entry = self._bases[id(buffer)] = (buffer, buffer.ctypes.data)
        return entry[1]

    def __call__(self, t: torch.Tensor, rows: np.ndarray, samples: np.ndarray, i: int) -> None:
        """Summarize `t` into rows[i] (FIELDS) and samples[i]."""
        t = t.detach()
        if t.dtype is torch.float32 and t.device.type == "cpu" and self.kernel is not None:
            t = t.contiguous()
            n = t.numel()
            idx, idx_ptr = self._positions(n) if n else (None, 0)
            self.kernel(t.data_ptr(), n, idx_ptr, len(idx) if n else 0,
                        self._address(rows) + i * rows.strides[0], self._address(samples) + i * samples.strides[0])
            row = rows[i]
            if row[6] or row[7]:
                self._nonfinite(t.numpy().reshape(-1), row)
            elif n and row[3] * row[3] / n > 0.5 * row[4]:  # |mean| dominates: one pass loses digits, take two
                a = t.numpy().reshape(-1)
                d = a - np.float32(row[3] / n)
                row[5] = float(np.dot(d, d))
            return
        self._generic(t, rows[i], samples[i])

    def _generic(self, t: torch.Tensor, row: np.ndarray, samples: np.ndarray) -> None:
        if t.is_complex() or t.is_sparse:
            row[0] = t.numel()
            return
        if t.dtype in (torch.float16, torch.bfloat16) or (not t.is_floating_point() and t.dtype != torch.float64):
            t = t.to(torch.float32 if t.is_floating_point() else torch.float64)
        if t.device.type != "cpu":
            self._on_device(t, row, samples)
            return
        a = t.numpy().reshape(-1)
        n = a.size
        row[0] = n
        if n == 0:
            row[3:9] = 0  # no values: sums and counts 0, min and max undefined
            return
        mn, mx, s = a.min(), a.max(), float(t.sum())
        if math.isfinite(mn) and math.isfinite(mx) and math.isfinite(s):
            row[6:9] = (0, 0, n - np.count_nonzero(a != 0))
            self._moments(a, float(mn), float(mx), s, float(np.dot(a, a)), row)
        else:
            self._nonfinite(a, row)
        idx = self.positions(n)
        samples[: len(idx)] = a[idx]

    @staticmethod
    def _moments(a: np.ndarray, mn: float, mx: float, s: float, ss: float, row: np.ndarray) -> None:
        m = a.size
        css = ss - s * s / m
        if s * s / m > 0.5 * ss:  # |mean| dominates: the one-pass formula loses digits, take two passes
            d = a - a.dtype.type(s / m)
            css = float(np.dot(d, d))
        row[1:6] = (mn, mx, s, ss, max(css, 0.0))

    def _nonfinite(self, a: np.ndarray, row: np.ndarray) -> None:
        finite = np.isfinite(a)
        nan = np.count_nonzero(np.isnan(a))
        f = a[finite].astype(np.float64)
        row[6:9] = (nan, a.size - nan - f.size, f.size - np.count_nonzero(f))
        if f.size:
            self._moments(f, float(f.min()), float(f.max()), float(f.sum()), float(np.dot(f, f)), row)
        else:  # nothing finite: no min or max, empty sums
            row[1:6] = (np.nan, np.nan, 0.0, 0.0, 0.0)

    def _on_device(self, t: torch.Tensor, row: np.ndarray, samples: np.ndarray) -> None:
        """The same statistics with torch reductions on the tensor's device and one copy to the host (a second
        pass on the host when there are nan or inf)."""
        v = t.reshape(-1)
        n = v.numel()
        row[0] = n
        if n == 0:
            row[3:9] = 0
            return
        mn, mx = torch.aminmax(v)
        s, ss = v.sum(), torch.dot(v, v)
        d = v - s / n
        counts = torch.stack([(~torch.isfinite(v)).sum(), (v == 0).sum()]).double()
        idx = torch.from_numpy(self.positions(n)).to(t.device)
        host = torch.cat([torch.stack([mn, mx, s, ss, torch.dot(d, d)]).double(), counts,
                          v[idx].double()]).cpu().numpy()
        if host[5]:
            self._generic(t.cpu(), row, samples)
            return
        row[1:9] = (*host[:5], 0, 0, host[6])
        samples[: len(idx)] = host[7:]


# --------------------------------------------------------------------------- tensors inside any output


def _leaves(obj: Any, path: str = "", out: list | None = None, seen: set | None = None, depth: int = 0) -> list:
    """Every tensor in a module's output with its path: tuples, lists, dicts, model outputs, dataclasses and
    plain objects (cache objects) are walked; everything else is skipped."""
    out = [] if out is None else out
    if isinstance(obj, torch.Tensor):
        out.append((path, obj))
        return out
    seen = set() if seen is None else seen
    if (obj is None or depth > 6 or id(obj) in seen or isinstance(obj, str | bytes | int | float | complex | type)
            or isinstance(obj, torch.nn.Module) or callable(obj)):
        return out
    seen.add(id(obj))
    for key, value in _children(obj):
        _leaves(value, f"{path}.{key}" if path else str(key), out, seen, depth + 1)
    return out


def _children(obj: Any) -> list[tuple[str, Any]]:
    if isinstance(obj, Mapping):
        return [(str(k), v) for k, v in obj.items()]
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        return list(zip(obj._fields, obj, strict=True))
    if isinstance(obj, list | tuple):
        return list(enumerate(obj))
    if dataclasses.is_dataclass(obj):
        return [(f.name, getattr(obj, f.name, None)) for f in dataclasses.fields(obj)]
    if hasattr(obj, "__dict__"):
        return [(k, v) for k, v in vars(obj).items() if not k.startswith("_")]
    return []


def _substitute(obj: Any, new: dict[int, torch.Tensor], seen: set | None = None, depth: int = 0) -> Any:
    """`obj` with each tensor whose id is in `new` replaced: immutable containers are rebuilt, mutable ones
    (and cache objects) are changed in place, mirroring `_leaves`."""
    if isinstance(obj, torch.Tensor):
        return new.get(id(obj), obj)
    seen = set() if seen is None else seen
    if (obj is None or depth > 6 or id(obj) in seen or isinstance(obj, str | bytes | int | float | complex | type)
            or isinstance(obj, torch.nn.Module) or callable(obj)):
        return obj
    seen.add(id(obj))
    if isinstance(obj, tuple):
        items = [_substitute(v, new, seen, depth + 1) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    if isinstance(obj, list):
        obj[:] = [_substitute(v, new, seen, depth + 1) for v in obj]
        return obj
    if isinstance(obj, dict) or isinstance(obj, Mapping) and hasattr(obj, "__setitem__"):
        for k, v in list(obj.items()):
            obj[k] = _substitute(v, new, seen, depth + 1)  # transformers' ModelOutput sets the field too
        return obj
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            object.__setattr__(obj, f.name, _substitute(getattr(obj, f.name, None), new, seen, depth + 1))
        return obj
    if hasattr(obj, "__dict__"):
        for k, v in list(vars(obj).items()):
            if not k.startswith("_"):
                setattr(obj, k, _substitute(v, new, seen, depth + 1))
    return obj


# --------------------------------------------------------------------------- the observed tensors


@dataclasses.dataclass
class Slot:
    """One observed tensor: a module output (or part of one) or a tap, in forward order."""

    index: int
    name: str
    kind: str  # "module" or "tap"
    module: str  # module path ("(root)" for the model), or the tap's name
    cls: str  # the module's class name
    ort_index: int  # the module's number in ORT's StatisticsSubscriber names (Class_<n>_<k>th_output), -1 for taps
    output_index: int  # k: the tensor's position among the module output's tensors
    shape: str = ""
    dtype: str = ""


def ort_module_numbers(model: torch.nn.Module) -> dict[torch.nn.Module, int]:
    """The numbers ORT's SubscriberManager gives modules (depth first, children in order, each module once):
    its dump files are named `<Class>_<number>_<k>th_output_forward`."""
    numbers: dict[torch.nn.Module, int] = {}
    counter = [0]

    def visit(module: torch.nn.Module) -> None:
        numbers[module] = counter[0]
        for child in module.children():
            if child not in numbers:
                counter[0] += 1
                visit(child)

    visit(model)
    return numbers


class _Hook:
    """A forward hook that survives ORT's deepcopy of the model before export (it copies the hook, not us)."""

    def __init__(self, collector: StatsCollector, fn: str, name: str = "", cls: str = "", ort_index: int = -1):
        self.method = getattr(collector, fn)
        self.name, self.cls, self.ort_index = name, cls, ort_index

    def __call__(self, module, *args):
        return self.method(self, *args)

    def __deepcopy__(self, memo):
        return self


class _Tap(torch.autograd.Function):
    """Identity that reports its input in forward and its gradient in backward. Exported as ORT PythonOp."""

    @staticmethod
    def forward(ctx, slot: int, x: torch.Tensor):
        ctx.slot = slot
        c = _ACTIVE
        if c is not None and not torch.jit.is_tracing() and not _ort_exporting():
            c.on_forward(slot, x)
        return x.detach()

    @staticmethod
    def backward(ctx, grad):
        c = _ACTIVE
        if c is not None and grad is not None:
            c.on_backward(ctx.slot, grad)
        return None, grad

    @staticmethod
    def infer_shape(node, tensor_input_shapes, tensor_input_dtypes):
        return tensor_input_shapes, tensor_input_dtypes

    @staticmethod
    def alias_input(node_proto_str: str):
        return [1], [-1, 0]  # output 0 is input 1; the gradient of input 1 is gradient output 0


_EXPORT_FLAG: list | None = None


def _ort_exporting() -> bool:
    """True while ORT runs the model to export it (its schema run and the trace): no step is running then.
    ORT sets this flag of its hooks package around export for the same reason."""
    global _EXPORT_FLAG
    if _EXPORT_FLAG is None:
        try:
            from onnxruntime.training.utils.hooks._subscriber_manager import ORT_NO_INCREASE_GLOBAL_STEP
        except ImportError:
            ORT_NO_INCREASE_GLOBAL_STEP = [False]
        _EXPORT_FLAG = ORT_NO_INCREASE_GLOBAL_STEP
    return bool(_EXPORT_FLAG[0])


# What an export traced, per model and graph key: a later burst that reuses the same ORTModule does not export
# again (so no hook runs), but ORT's PythonOps still report the slot numbers given while tracing.
_TRACED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _step_range(steps: Any) -> range | None:
    if steps is None:
        return None
    if isinstance(steps, range):
        return steps
    if isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0:
        return range(steps)
    if isinstance(steps, list | tuple) and len(steps) in (2, 3) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in steps) and steps[0] >= 0 and steps[-1] > 0:
        return range(*steps)
    raise StatsError(f"stats steps {steps!r} is not allowed; allowed: None (every step), N (the first N), "
                     "[start, stop] or [start, stop, every]")


class StatsCollector(Collector):
    """Collector "stats": `collect={"stats": {...}}` on a burst writes `stats.npz` into the run folder.

    Arguments: `modules` (glob patterns on module paths, e.g. "blocks.0.*"; default every module), `steps`
    (None, N, [start, stop] or [start, stop, every]), `grads` (also the gradient of each tensor, default True),
    `taps` (tensors passed to `ortlab.activations.tap`, default True), `samples` (values kept per tensor, 8).

    Names: a module's path ("blocks.0.attn", "(root)" for the model), ":<path>" inside a structured output
    ("(root):logits", "encoder:past_key_values.key_cache.0"), "#2" on a module's second call in one forward.
    Order: forward order as PyTorch runs it (also under ORTModule, whose PythonOps carry their trace order);
    backward rows are the gradients of the same tensors. A tensor that is the same object as an earlier one
    (a Sequential's output is its last child's) is summarized once and copied.
    """

    changes_graph = True

    def __init__(self, modules: str | list[str] | None = None, steps: Any = None, grads: bool = True,
                 taps: bool = True, samples: int = 8):
        if isinstance(modules, str):
            modules = [modules]
        if modules is not None and not (isinstance(modules, list | tuple) and modules
                                        and all(isinstance(m, str) for m in modules)):
            raise StatsError(f"stats modules {modules!r} is not allowed; allowed: None, a glob pattern or a list of them")
        if not isinstance(samples, int) or isinstance(samples, bool) or not 0 <= samples <= 4096:
            raise StatsError(f"stats samples {samples!r} is not allowed; allowed: a whole number from 0 to 4096")
        self.modules = list(modules) if modules is not None else None
        self.steps = _step_range(steps)
        self.grads, self.taps, self.samples = bool(grads), bool(taps), samples
        self._summarize = _Summarizer(samples)
        self.slots: list[Slot] = []
        self._by_name: dict[str, int] = {}
        self._aliases: dict[int, int] = {}  # slot -> slot it is the same tensor as (graph: fixed at trace)
        self._handles: list = []
        self._graph = False
        self._frames: list[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self._fw, self._bw = np.empty((0, _NF)), np.empty((0, _NF))  # this step's rows, per slot
        self._fws, self._bws = np.empty((0, samples), np.float32), np.empty((0, samples), np.float32)
        self._step: int | None = None
        self._reset_forward()

    @property
    def graph_key(self) -> str:
        """What of this collector is part of an exported graph: which tensors carry a PythonOp."""
        return f"stats(modules={','.join(self.modules) if self.modules else '*'}, taps={self.taps})"

    # -- burst protocol

    def start(self, engine, cfg, run_dir: Path) -> None:
        global _ACTIVE
        if _ACTIVE is not None and _ACTIVE is not self:
            raise StatsError("another stats collector is active in this process (a burst inside a burst?)")
        self._graph = cfg.backend == "ortmodule"
        model = engine.model
        if self._graph and self.graph_key in _TRACED.get(model, {}):
            slots, aliases = _TRACED[model][self.graph_key]
            self.slots = [dataclasses.replace(s) for s in slots]
            self._by_name = {s.name: s.index for s in self.slots}
            self._aliases = dict(aliases)
        numbers = ort_module_numbers(model)
        selected = 0
        for path, module in model.named_modules():
            name = path or ROOT
            if self.modules is not None and not any(fnmatch.fnmatchcase(name, p) for p in self.modules):
                continue
            hook = _Hook(self, "_on_output", name, type(module).__name__, numbers.get(module, -1))
            self._handles.append(module.register_forward_hook(hook))
            selected += 1
        if self.modules is not None and not selected:
            names = [p or ROOT for p, _ in model.named_modules()][:8]
            raise StatsError(f"stats modules {self.modules} match no module of the model; modules are named like "
                             f"{', '.join(names)}")
        self._handles.append(model.register_forward_pre_hook(_Hook(self, "_on_forward_start")))
        self._handles.append(model.register_forward_hook(_Hook(self, "_on_forward_end")))
        _ACTIVE = self

    def step_begin(self, step: int) -> None:
        self._step = step if self.steps is None or step in self.steps else None
        if self._step is not None:
            self._grow(len(self.slots))
            for buffer in (self._fw, self._bw, self._fws, self._bws):  # reused every step: stable addresses
                buffer.fill(np.nan)
            if not self._graph:
                self._aliases = {}

    def step_end(self, step: int) -> None:
        if self._step is None:
            return
        n = len(self.slots)
        self._grow(n)
        for slot, source in self._aliases.items():
            for rows in (self._fw, self._bw, self._fws, self._bws):
                rows[slot] = rows[source]
        self._frames.append((step, self._fw[:n].copy(), self._bw[:n].copy(), self._fws[:n].copy(),
                             self._bws[:n].copy()))
        self._step = None

    def finish(self, engine, cfg, run_dir: Path, status: str) -> None:
        global _ACTIVE
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if _ACTIVE is self:
            _ACTIVE = None
        self._step = None
        self._reset_forward()
        if self._graph and self.slots:
            traced = [dataclasses.replace(s) for s in self.slots], dict(self._aliases)
            _TRACED.setdefault(engine.model, {})[self.graph_key] = traced
        self.write(run_dir / STATS_FILE, backend=cfg.backend, status=status)
        recorded = any(np.isfinite(frame[1][:, 0]).any() for frame in self._frames)
        if self._graph and self.slots and self._frames and not recorded and status == "ok":
            raise StatsError("ORTModule ran the burst but reported no statistics: the PythonOps of the observed "
                             "tensors did not run (is enable_custom_autograd off? ORT then inlines them away)")

    # -- recording

    def _reset_forward(self) -> None:
        self._seen: dict[int, tuple[int, torch.Tensor]] = {}  # id -> (slot, tensor): keeps ids unique
        self._calls: dict[str, int] = {}

    def _on_forward_start(self, hook, args):
        self._reset_forward()

    def _on_forward_end(self, hook, args, output):
        self._reset_forward()

    def _tracing(self) -> bool:
        """Whether ORT is exporting (the hooks' only chance to put PythonOps into its graph)."""
        return self._graph and (torch.jit.is_tracing() or _ort_exporting())

    def _observe(self, name: str, kind: str, module: str, cls: str, ort_index: int, k: int, t: torch.Tensor):
        """Record `t` under `name`; returns the tensor the forward continues with (under ORTModule the output
        of the PythonOp that reports it)."""
        calls = self._calls.get(name, 0) + 1
        self._calls[name] = calls
        if calls > 1:
            name = f"{name}#{calls}"
        slot = self._by_name.get(name)
        if slot is None:
            slot = len(self.slots)
            self.slots.append(Slot(slot, name, kind, module, cls, ort_index, k,
                                   "x".join(map(str, t.shape)), str(t.dtype).removeprefix("torch.")))
            self._by_name[name] = slot
        seen = self._seen.get(id(t))
        if seen is not None and seen[1] is t:
            if seen[0] != slot:
                self._aliases[slot] = seen[0]
            return t
        if self._graph:  # exporting, or running in PyTorch after ORT fell back: the op reports at run time
            out = _Tap.apply(slot, t)
            self._seen[id(out)] = (slot, out)
            self._seen[id(t)] = (slot, t)
            return out
        self._seen[id(t)] = (slot, t)
        self.on_forward(slot, t)
        if self.grads and t.requires_grad:
            t.register_hook(functools.partial(self.on_backward, slot))
        return t

    def _on_output(self, hook: _Hook, args, output):
        if self._step is None and not self._tracing():
            return None
        if type(output) is torch.Tensor:  # the common case, without walking
            out = self._observe(hook.name, "module", hook.name, hook.cls, hook.ort_index, 0, output)
            return None if out is output else out
        leaves = _leaves(output)
        single = len(leaves) == 1 and leaves[0][0] == ""
        replaced: dict[int, torch.Tensor] = {}
        for k, (path, t) in enumerate(leaves):
            t2 = self._observe(hook.name if single else f"{hook.name}:{path}", "module", hook.name, hook.cls,
                               hook.ort_index, k, t)
            if t2 is not t:
                replaced[id(t)] = t2
        return _substitute(output, replaced) if replaced else None

    def tap(self, name: str, t: torch.Tensor) -> torch.Tensor:
        if not self.taps or not isinstance(t, torch.Tensor) or (self._step is None and not self._tracing()):
            return t
        return self._observe(name, "tap", name, "", -1, 0, t)

    def _grow(self, size: int) -> None:
        """Make the step buffers hold at least `size` tensors (doubling, keeping what they hold)."""
        n = len(self._fw)
        if size <= n:
            return
        extra = max(size - n, n, 16)
        self._fw = np.concatenate([self._fw, np.full((extra, _NF), np.nan)])
        self._bw = np.concatenate([self._bw, np.full((extra, _NF), np.nan)])
        self._fws = np.concatenate([self._fws, np.full((extra, self.samples), np.nan, np.float32)])
        self._bws = np.concatenate([self._bws, np.full((extra, self.samples), np.nan, np.float32)])

    def on_forward(self, slot: int, t: torch.Tensor) -> None:
        """Called by the forward hooks (PyTorch) or by ORT's PythonOp (ORTModule) with the tensor's value."""
        if self._step is not None:
            if slot >= len(self._fw):
                self._grow(slot + 1)
            self._summarize(t, self._fw, self._fws, slot)

    def on_backward(self, slot: int, grad: torch.Tensor) -> None:
        if self._step is not None and self.grads:
            if slot >= len(self._bw):
                self._grow(slot + 1)
            self._summarize(grad, self._bw, self._bws, slot)

    # -- output

    def write(self, path: Path, **meta: Any) -> Path:
        """Write the recorded steps as one columnar file (numpy .npz, no pickles), atomically: arrays
        [step, tensor, field] for forward and backward, their samples, and one array per Slot field."""
        n = len(self.slots)

        def stack(i: int, width: int, dtype) -> np.ndarray:
            out = np.full((len(self._frames), n, width), np.nan, dtype)
            for j, frame in enumerate(self._frames):
                out[j, : len(frame[i])] = frame[i]
            return out

        slot_columns = {f"slot_{f.name}": np.array([getattr(s, f.name) for s in self.slots],
                                                   dtype=np.int64 if f.type == "int" else str)
                        for f in dataclasses.fields(Slot)}
        info = {"format": FORMAT, "fields": list(FIELDS), "samples": self.samples, "modules": self.modules,
                "steps": [self.steps.start, self.steps.stop, self.steps.step] if self.steps else None,
                "grads": self.grads, "aliases": {str(k): v for k, v in sorted(self._aliases.items())},
                "summarizer": "c" if self._summarize.kernel is not None else "numpy", **meta}
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
        np.savez(tmp, meta=np.array(json.dumps(info)), step=np.array([f[0] for f in self._frames], np.int64),
                 forward=stack(1, _NF, np.float64), backward=stack(2, _NF, np.float64),
                 forward_samples=stack(3, self.samples, np.float32),
                 backward_samples=stack(4, self.samples, np.float32), **slot_columns)
        tmp.replace(path)
        return path


def tap(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """Record `tensor` under `name` in the running burst's statistics (forward and gradient); returns the tensor
    to continue with. Use the result: under ORTModule it is a PythonOp's output, and an unused op is pruned.
    Outside a burst that collects "stats" it returns `tensor` itself."""
    c = _ACTIVE
    return tensor if c is None else c.tap(name, tensor)
