"""Collector "stats": per-step statistics of every module output and its gradient, the same in both backends.

PyTorch bursts use module forward hooks and tensor gradient hooks. Under ORTModule hooks run only while ORT
exports, so there each observed tensor goes through a PythonOp (see pythonop) that reports it at run time.
Both backends summarize with the same code (see summarize). Why not ONNX reductions inside the graph: measured
on this CPU, ORT's Equal/IsNaN/IsInf + Cast + ReduceSum cost ~0.5 ns per element and count, five times numpy's
and six times the kernel's (docs/convergence.md), and two of ORT 1.19.2's graph transformers fail on Mul(x, x)
and on If nodes in such a branch.
"""

from __future__ import annotations

import collections
import dataclasses
import fnmatch
import functools
import json
import os
import weakref
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from ortlab.activations import pythonop
from ortlab.activations.errors import StatsError
from ortlab.activations.structure import leaves, substitute
from ortlab.activations.summarize import Summarizer
from ortlab.activations.table import FIELDS, FORMAT, STATS_FILE, dims
from ortlab.engine.backends import registered
from ortlab.engine.types import Collector
from ortlab.runs.run import RunStatus

ROOT = "(root)"  # the name of the model's own output
_NF = len(FIELDS)


@dataclasses.dataclass
class Slot:
    """One observed tensor: a module output (or part of one) or a tap, in forward order."""

    index: int
    name: str
    kind: str  # "module" or "tap"
    module: str  # module path ("(root)" for the model), or the tap's name
    cls: str  # the module's class name
    ort_index: int  # the module's number in ORT's dump names (Class_<n>_<k>th_output), -1 for taps
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


class _Hook(functools.partial):
    """A forward hook that survives ORT's deepcopy of the model before export (it copies the hook, not us). A
    partial, so that torch calls the collector's method from C, without a Python frame of the hook's own (it runs
    for every module of every step)."""

    def __deepcopy__(self, memo):
        return self


def _grad_hook(t: torch.Tensor, hook) -> None:
    """`t.register_hook(hook)` without the handle, for a tensor with no hooks yet: what Tensor.register_hook does
    (an OrderedDict of hooks set on the tensor and given to its grad_fn), less the RemovableHandle, which costs 8 of
    its 10 us and is never used here (the tensor is gone after the step). Key -1: the ids of handles that the model's
    own code may add later are never negative. Any other tensor takes the public way."""
    if t.grad_fn is None or t._backward_hooks is not None:
        t.register_hook(hook)
        return
    hooks = collections.OrderedDict()  # weak-referenceable, as later handles need
    hooks[-1] = hook
    t._backward_hooks = hooks
    t.grad_fn._register_hook_dict(t)


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
    whole = isinstance(steps, list | tuple) and all(type(v) is int for v in steps)
    if whole and len(steps) in (2, 3) and steps[0] >= 0 and steps[-1] > 0:
        return range(*steps)
    raise StatsError(f"stats steps {steps!r} is not allowed; allowed: None (every step), N (the first N), "
                     "[start, stop] or [start, stop, every]")


class StatsCollector(Collector):
    """Collector "stats": `collect={"stats": {...}}` on a burst writes `stats.npz` into the run folder.

    Arguments: `modules` (glob patterns on module paths, e.g. "blocks.0.*"; default every module), `steps`
    (None, N, [start, stop] or [start, stop, every]), `grads` (also the gradient of each tensor, default
    True), `taps` (tensors passed to `ortlab.activations.tap`, default True), `samples` (values kept per
    tensor, 8).

    Names: a module's path ("blocks.0.attn", "(root)" for the model), ":<path>" inside a structured output
    ("(root):logits", "encoder:past_key_values.key_cache.0"), "#2" on a module's second call in one forward.
    Order: forward order as PyTorch runs it (also under ORTModule, whose PythonOps carry their trace order);
    backward rows are the gradients of the same tensors. A tensor that is the same object as an earlier one
    (a Sequential's output is its last child's) is summarized once and copied.

    In a rank of a distributed burst the rank also calls `on_parameter_grads` before each optimizer step: each
    parameter's gradient after DDP's all-reduce (phase "param_grad"), which must be equal on every rank.
    """

    changes_graph = True
    times_phases = True  # rows summarized on a GPU are written before the optimizer, inside the step's time

    def __init__(self, modules: str | list[str] | None = None, steps: Any = None, grads: bool = True,
                 taps: bool = True, samples: int = 8):
        if isinstance(modules, str):
            modules = [modules]
        if modules is not None and not (isinstance(modules, list | tuple) and modules
                                        and all(isinstance(m, str) for m in modules)):
            raise StatsError(f"stats modules {modules!r} is not allowed; allowed: None, a glob pattern or a "
                             "list of them")
        if not isinstance(samples, int) or isinstance(samples, bool) or not 0 <= samples <= 4096:
            raise StatsError(f"stats samples {samples!r} is not allowed; allowed: a whole number from 0 to "
                             "4096")
        self.modules = list(modules) if modules is not None else None
        self.steps = _step_range(steps)
        self.grads, self.taps, self.samples = bool(grads), bool(taps), samples
        self._summarize = Summarizer(samples)
        self.slots: list[Slot] = []
        self._by_name: dict[str, int] = {}
        self._aliases: dict[int, int] = {}  # slot -> slot it is the same tensor as (graph: fixed at trace)
        self._hooks: list[tuple[torch.nn.Module, bool, _Hook]] = []  # (module, pre-hook?, hook), set in start
        self._handles: list = []  # while the hooks are registered
        self._taps: Any = None  # the burst's backend's statistics taps (its registry entry's), made in start
        self._graph = False  # its taps are in the exported graph (set in start)
        self._frames: list[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self._fw: np.ndarray = np.empty((0, _NF))  # this step's rows, per slot
        self._bw: np.ndarray = np.empty((0, _NF))
        self._fws: np.ndarray = np.empty((0, samples), np.float32)
        self._bws: np.ndarray = np.empty((0, samples), np.float32)
        self._step: int | None = None
        self.params: list[tuple[str, str, str]] = []  # (name, shape, dtype) of each parameter with a gradient
        self._pg = np.empty((0, _NF))  # this step's parameter-gradient rows
        self._pgs: np.ndarray = np.empty((0, samples), np.float32)
        self._param_frames: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # step -> rows, samples
        self._reset_forward()

    @property
    def graph_key(self) -> str:  # type: ignore[override]  # the contract's class attribute, computed here
        """What of this collector is part of an exported graph: which tensors carry a PythonOp."""
        return f"stats(modules={','.join(self.modules) if self.modules else '*'}, taps={self.taps})"

    # -- burst protocol

    def start(self, engine, cfg, run_dir: Path) -> None:
        if pythonop.active() not in (None, self):
            raise StatsError("another stats collector is active in this process (a burst inside a burst?)")
        self._taps = taps = registered(cfg.backend).stats_taps.resolve()()
        self._graph = taps.in_graph
        self._summarize.device.always_copy = taps.copy_observed
        taps.prepare()
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
            self._hooks.append((module, False, _Hook(self._on_output, name, type(module).__name__,
                                                     numbers.get(module, -1))))
            selected += 1
        if self.modules is not None and not selected:
            names = [p or ROOT for p, _ in model.named_modules()][:8]
            raise StatsError(f"stats modules {self.modules} match no module of the model; modules are named "
                             f"like {', '.join(names)}")
        self._hooks += [(model, True, _Hook(self._on_forward_start)), (model, False, _Hook(self._on_forward_end))]
        self._attach()
        pythonop.activate(self)

    def _attach(self) -> None:
        """Register the forward hooks (a module with hooks takes torch's slower call path, so a PyTorch burst
        that records only some steps has them only on those: see step_end)."""
        if not self._handles:
            wrap = self._taps.hook
            self._handles = [module.register_forward_pre_hook(wrap(hook)) if pre else
                             module.register_forward_hook(wrap(hook)) for module, pre, hook in self._hooks]

    def _detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def step_begin(self, step: int) -> None:
        self._summarize.clear()  # rows of a step that did not end
        self._step = step if self.steps is None or step in self.steps else None
        if self._step is not None:
            self._attach()
            self._grow(len(self.slots))
            for buffer in (self._fw, self._bw, self._fws, self._bws):  # reused every step: stable addresses
                buffer.fill(np.nan)
            if not self._graph:
                self._aliases = {}

    def step_end(self, step: int) -> None:
        if not self._taps.hooks_stay and self.steps is not None and step + 1 not in self.steps:
            self._detach()  # the next step records nothing (taps that stay: ORTModule's hooks run only in the
            # export; torch.compile's: another set of hooks is another graph to compile)
        if self._step is None:
            return
        self._summarize.flush()
        n = len(self.slots)
        self._grow(n)
        for slot, source in self._aliases.items():
            for rows in (self._fw, self._bw, self._fws, self._bws):
                rows[slot] = rows[source]
        self._frames.append((step, self._fw[:n].copy(), self._bw[:n].copy(), self._fws[:n].copy(),
                             self._bws[:n].copy()))
        self._step = None

    def phase(self, step: int, name: str) -> None:
        """Before the optimizer every forward and backward row of the step is there: the rows summarized on a
        GPU reach the host now (one copy), inside the step's time as the engine measures it."""
        if name == "optimizer" and self._step is not None:
            self._summarize.flush()

    def finish(self, engine, cfg, run_dir: Path, status: str) -> None:
        self._summarize.clear()
        self._detach()
        self._hooks.clear()
        pythonop.deactivate(self)
        self._step = None
        self._reset_forward()
        if self._graph and self.slots:
            traced = [dataclasses.replace(s) for s in self.slots], dict(self._aliases)
            _TRACED.setdefault(engine.model, {})[self.graph_key] = traced
        self.write(run_dir / STATS_FILE, backend=cfg.backend, status=status)
        recorded = any(np.isfinite(frame[1][:, 0]).any() for frame in self._frames)
        if self._graph and self.slots and self._frames and not recorded and status == RunStatus.OK:
            raise StatsError("ORTModule ran the burst but reported no statistics: the PythonOps of the "
                             "observed tensors did not run (is enable_custom_autograd off? ORT then inlines "
                             "them away)")

    # -- recording

    def _reset_forward(self) -> None:
        self._seen: dict[int, tuple[int, torch.Tensor]] = {}  # id -> (slot, tensor): keeps ids unique
        self._calls: dict[str, int] = {}

    def _on_forward_start(self, module, args):
        self._reset_forward()

    def _on_forward_end(self, module, args, output):
        self._reset_forward()

    def _tracing(self) -> bool:
        """Whether ORT is exporting (the hooks' only chance to put PythonOps into its graph)."""
        return self._graph and (torch.jit.is_tracing() or pythonop.exporting())

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
                                   dims(t.shape), str(t.dtype).removeprefix("torch.")))
            self._by_name[name] = slot
        seen = self._seen.get(id(t))
        if seen is not None and seen[1] is t:
            if seen[0] != slot:
                self._aliases[slot] = seen[0]
            return t
        if self._graph:  # exporting, or running in PyTorch after ORT fell back: the op reports at run time
            out = pythonop.Tap.apply(slot, t)
            self._seen[id(out)] = (slot, out)
            self._seen[id(t)] = (slot, t)
            return out
        self._seen[id(t)] = (slot, t)
        if slot >= len(self._fw):  # recording a step (else the hook returned): summarize without more checks
            self._grow(slot + 1)
        self._summarize(t, self._fw, self._fws, slot)
        if self.grads and t.requires_grad:
            _grad_hook(t, functools.partial(self.on_backward, slot))
        return t

    def _on_output(self, name: str, cls: str, ort_index: int, module, args, output):
        if self._step is None and not self._tracing():
            return None
        if type(output) is torch.Tensor:  # the common case, without walking
            out = self._observe(name, "module", name, cls, ort_index, 0, output)
            return None if out is output else out
        found = leaves(output)
        single = len(found) == 1 and found[0][0] == ""
        replaced: dict[int, torch.Tensor] = {}
        for k, (path, t) in enumerate(found):
            t2 = self._observe(name if single else f"{name}:{path}", "module", name, cls, ort_index, k, t)
            if t2 is not t:
                replaced[id(t)] = t2
        return substitute(output, replaced) if replaced else None

    def tap(self, name: str, t: torch.Tensor) -> torch.Tensor:
        if not self.taps or not isinstance(t, torch.Tensor) or (self._step is None and not self._tracing()):
            return t
        return self._observe(name, "tap", name, "", -1, 0, t)

    def _grow(self, size: int) -> None:
        """Make the step buffers hold at least `size` tensors (doubling, keeping what they hold)."""
        n = len(self._fw)
        if size <= n:
            return
        self._summarize.flush()  # rows waiting on the device go to the buffers they were meant for
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

    def on_parameter_grads(self, named_parameters) -> None:
        """Each parameter's gradient as it is now (a rank calls this after backward, before the optimizer step:
        after DDP's all-reduce), in the order of the model's parameters."""
        if self._step is None:
            return
        grads = [(name, p.grad) for name, p in named_parameters if p.grad is not None]
        if not self.params:
            self.params = [(n, dims(g.shape), str(g.dtype).removeprefix("torch.")) for n, g in grads]
            self._pg = np.full((len(grads), _NF), np.nan)
            self._pgs = np.full((len(grads), self.samples), np.nan, np.float32)
        index = {name: i for i, (name, _, _) in enumerate(self.params)}
        self._pg.fill(np.nan)
        self._pgs.fill(np.nan)
        for name, g in grads:
            if name in index:
                self._summarize(g, self._pg, self._pgs, index[name])
        self._summarize.flush()
        self._param_frames[self._step] = (self._pg.copy(), self._pgs.copy())

    # -- output

    def write(self, path: Path, **meta: Any) -> Path:
        """Write the recorded steps as one columnar file (numpy .npz, no pickles), atomically: arrays
        [step, tensor, field] for forward and backward, their samples, and one array per Slot field."""
        n = len(self.slots)

        def stack(i: int, width: int, dtype) -> np.ndarray:
            out = np.full((len(self._frames), n, width), np.nan, dtype)
            for j, frame in enumerate(self._frames):
                rows = cast(np.ndarray, frame[i])  # i > 0: the frame's arrays, after its step
                out[j, : len(rows)] = rows
            return out

        slot_columns = {f"slot_{f.name}": np.array([getattr(s, f.name) for s in self.slots],
                                                   dtype=np.int64 if f.type == "int" else str)
                        for f in dataclasses.fields(Slot)}
        info = {"format": FORMAT, "fields": list(FIELDS), "samples": self.samples, "modules": self.modules,
                "steps": [self.steps.start, self.steps.stop, self.steps.step] if self.steps else None,
                "grads": self.grads, "aliases": {str(k): v for k, v in sorted(self._aliases.items())},
                "summarizer": self._summarize.describe(),
                # rows left empty on a GPU: a tensor kept by reference was changed in place (ortlab.activations.batched)
                "lost_rows": self._summarize.device.lost, **meta}
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
        arrays: dict[str, Any] = {
            "meta": np.array(json.dumps(info)), "step": np.array([f[0] for f in self._frames], np.int64),
            "forward": stack(1, _NF, np.float64), "backward": stack(2, _NF, np.float64),
            "forward_samples": stack(3, self.samples, np.float32),
            "backward_samples": stack(4, self.samples, np.float32), **slot_columns, **self._param_arrays()}
        np.savez(tmp, **arrays)
        tmp.replace(path)
        return path

    def _param_arrays(self) -> dict[str, np.ndarray]:
        """The parameter gradients (when a rank recorded them), per recorded step: [step, parameter, field]."""
        if not self.params:
            return {}
        p = len(self.params)
        rows = np.full((len(self._frames), p, _NF), np.nan)
        samples: np.ndarray = np.full((len(self._frames), p, self.samples), np.nan, np.float32)
        for j, frame in enumerate(self._frames):
            if frame[0] in self._param_frames:
                rows[j], samples[j] = self._param_frames[frame[0]]
        return {"param_grad": rows, "param_grad_samples": samples,
                **{f"param_{k}": np.array([q[i] for q in self.params], dtype=str)
                   for i, k in enumerate(("name", "shape", "dtype"))}}
