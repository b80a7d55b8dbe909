"""One ORTModule per option set over the same module, and why ORTModule exported (cf. ORT PR 19007)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ortlab import _ort
from ortlab.compat.errors import root_message
from ortlab.compat.inputs import InputWatch
from ortlab.engine.types import Transition
from ortlab.options import SPECS, Options, ReadAt
from ortlab.workload import call_arguments

# Every ORTModule wrap builds DebugOptions from these; the rest reach ORT through the environment.
_DEBUG_FIELDS = ("log_level", "save_onnx", "onnx_prefix", "save_onnx_path")


def input_schema(value: Any) -> Any:
    """The part of the inputs ORTModule's re-export check looks at: structure, dtypes and ranks (not sizes:
    dimensions are dynamic axes)."""
    if isinstance(value, torch.Tensor):
        return f"Tensor[{str(value.dtype).removeprefix('torch.')}, rank {value.dim()}]"
    if isinstance(value, dict):
        return {str(k): input_schema(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [input_schema(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return repr(value)
    return type(value).__name__


def requires_grad_set(model: torch.nn.Module, inputs: Any) -> list[str]:
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    flat, _ = torch.utils._pytree.tree_flatten(inputs)
    names += [f"input[{i}]" for i, t in enumerate(flat) if isinstance(t, torch.Tensor) and t.requires_grad]
    return names


def wrap_key(options: Options, parity: bool, extra: tuple = ()) -> tuple:
    """What a wrap is built for: every option ORT reads at construction or export, the parity switch (which
    sets dropout to 0 and so changes the exported graph) and any instrumentation that is part of the graph
    (`extra`: collector names). Import-time options are the worker's business."""
    kept = {k: v for k, v in options.items() if options_read_at(k) is not ReadAt.IMPORT}
    return tuple(sorted(kept.items())), parity, tuple(extra)


def options_read_at(name: str) -> ReadAt:
    return SPECS[name].read_at


class Wrapper:
    """Keeps the ORTModule for the current option set; a new option set means a new wrap (a new export)."""

    def __init__(self, module: torch.nn.Module):
        self.module = module
        self.ort_module = None
        self._key: tuple | None = None
        self._options: Options | None = None
        self._schema: Any = None
        self._grad_set: list[str] | None = None
        self._export_seen: dict[int, Any] = {}  # id(ORTModule) -> the export record last seen of it
        self.watch: InputWatch | None = None  # what the current graph was exported with (after its export)
        self.export_pending = False  # the current ORTModule has not exported yet: its next forward will
        self._graphs: dict[tuple, tuple[Any, InputWatch]] = {}  # fix graph-per-value: a graph per baked value

    def prepare(self, options: Options, parity: bool, inputs: Any, run: str, onnx_dir: Path,
                extra_key: tuple = (), fixes: tuple[str, ...] = (),
                threads: int | None = None) -> tuple[Any, Transition]:
        """The ORTModule to train with for these options, and the transition row that says why. `fixes` (ortlab's
        compatibility fixes, applied by the caller) change the exported graph: another set means another wrap;
        another count of `threads` (its session's intra-op threads, fixed when ORT builds the session) too."""
        key = (*wrap_key(options, parity, extra_key), tuple(fixes), threads)
        schema = input_schema(inputs)
        grad_set = requires_grad_set(self.module, inputs)
        if self.ort_module is None or key != self._key:
            first = self.ort_module is None
            changes = {}
            if not first and self._key is not None and self._options is not None:  # both set with the wrap
                changes = {k: {"old": old, "new": new} for k, (old, new) in self._options.diff(options).items()
                           if options_read_at(k) is not ReadAt.IMPORT}
                if parity != self._key[1]:
                    changes["parity"] = {"old": self._key[1], "new": parity}
                if key[2] != self._key[2]:
                    changes["instrumentation"] = {"old": list(self._key[2]), "new": list(key[2])}
                if key[3] != self._key[3]:
                    changes["fixes"] = {"old": list(self._key[3]), "new": list(key[3])}
                if key[4] != self._key[4]:
                    changes["ort_threads"] = {"old": self._key[4], "new": key[4]}
            self.ort_module = self._wrap(options, onnx_dir)
            self._key, self._options = key, options
            self.watch, self.export_pending, self._graphs = None, True, {}
            reason = "first export" if first else "options changed: " + ", ".join(
                f"{k} {v['old']!r} -> {v['new']!r}" for k, v in changes.items())
            row = Transition(run, 0, "wrap" if first else "re-wrap", reason, changes)
        elif schema != self._schema:
            row = Transition(run, 0, "re-export", "input schema changed",
                             {"input_schema": {"old": self._schema, "new": schema}})
            _note_skipped_check(row, options)
        elif grad_set != self._grad_set:
            old, new = set(self._grad_set or []), set(grad_set)
            row = Transition(run, 0, "rebuild gradient graph", "requires-grad set changed",
                             {"requires_grad": {"added": sorted(new - old), "removed": sorted(old - new)}})
            _note_skipped_check(row, options)
        else:
            row = Transition(run, 0, "reuse", "same options, input schema and requires-grad set: no re-export", {})
        self._schema, self._grad_set = schema, grad_set
        self._save_graphs_into(options, onnx_dir)
        return self.ort_module, row

    def parity_wrap(self, options: Options, fixes: tuple[str, ...] | list[str], inputs: Any) -> Any:
        """The ORTModule for `inputs` when it was exported for these options in parity mode (dropout off), with
        these fixes and no instrumentation in its graph: one a gradient check can reuse without exporting. None
        otherwise."""
        if self.ort_module is None or self._key is None or self.watch is None:
            return None
        wrapped_options, parity, instrumentation, wrapped_fixes, _ = self._key
        if (not parity or instrumentation or tuple(wrapped_fixes) != tuple(fixes)
                or wrapped_options != wrap_key(options, True)[0]):
            return None
        found = self._graphs.get(self.watch.key(inputs))  # with graph-per-value: the graph of these inputs
        return found[0] if found is not None else None

    def _save_graphs_into(self, options: Options, onnx_dir: Path) -> None:
        """ORT writes a re-export's graphs where the wrap's DebugOptions point: point them at this burst's
        folder, or a re-export in a later burst would overwrite the graphs of the burst that wrapped."""
        if not options["save_onnx"] or options["save_onnx_path"]:
            return
        onnx_dir.mkdir(parents=True, exist_ok=True)
        self._wrapped().set_onnx_save_path(onnx_dir)

    def _wrap(self, options: Options, onnx_dir: Path):
        return build_ortmodule(self.module, options, onnx_dir)

    # ORT's own state, read after a step -------------------------------------------------------------

    def internals(self) -> _ort.Wrap | None:
        """ORT's private state of the current wrap, in the module's current mode (None before the first wrap)."""
        return None if self.ort_module is None else _ort.Wrap(self.ort_module, self.module.training)

    def _wrapped(self) -> _ort.Wrap:
        """`internals()` where a wrap exists (after `prepare`)."""
        wrap = self.internals()
        if wrap is None:
            raise RuntimeError("ORTModule is not wrapped yet: prepare() first")
        return wrap

    def exported_since_last_check(self) -> bool:
        """Whether ORT exported the current ORTModule (first time or again) since the last call, from ORT's own
        exported-model record."""
        info = self._wrapped().exported_model()
        seen = self._export_seen.get(id(self.ort_module))
        changed = info is not None and info is not seen  # the record is a new object after every export
        self._export_seen[id(self.ort_module)] = info
        return changed

    def exported(self, inputs: Any, hazards: list[dict[str, Any]]) -> None:
        """The current ORTModule exported on `inputs`: remember what its graph was exported with and reads."""
        read = self._wrapped().graph_inputs_read() or set()
        self.watch = InputWatch.exported(self.module, inputs, read, hazards)
        self.export_pending = False
        self._graphs[self.watch.key(inputs)] = (self.ort_module, self.watch)

    def follow(self, inputs: Any, run: str, step: int, per_value: bool, options: Options,
               onnx_dir: Path) -> tuple[Any, Transition | None, list[dict[str, Any]]]:
        """The ORTModule to train this step's inputs with, a transition row when that changed, and the inputs the
        graph cannot follow (a baked value that changed, a shape after shape-dependent Python). With the fix
        graph-per-value, such inputs get a graph of their own (a new export once per distinct value, parameters
        shared) instead of being ignored."""
        changes = self.watch.changes(inputs) if self.watch is not None else []
        if not changes or not per_value or self.watch is None:
            return self.ort_module, None, changes
        what = ", ".join(f"{c['input']} {c['old']} -> {c['new']}" for c in changes)
        found = self._graphs.get(self.watch.key(inputs))
        if found is not None:
            self.ort_module, self.watch = found
            return self.ort_module, Transition(run, step, "switch graph", f"{what}: the graph exported for "
                                               "these values", {"inputs": changes}, False), []
        self.ort_module = self._wrap(options, onnx_dir)
        self.watch, self.export_pending = None, True
        return self.ort_module, Transition(run, step, "new graph", f"{what}: a graph of their own (fix "
                                           "graph-per-value)", {"inputs": changes}), []

    def fallback(self) -> str | None:
        """Why ORTModule fell back to PyTorch, if it did."""
        exc = self.fallback_error()
        return f"{type(exc).__name__}: {root_message(exc)}" if exc is not None else None

    def fallback_error(self) -> BaseException | None:
        """The exception that made ORTModule fall back to PyTorch (None: it did not, or nothing is wrapped)."""
        return None if self.ort_module is None else self._wrapped().fallback()

    def overhead(self) -> dict[str, float]:
        """ORT's first-time initialization breakdown in seconds (export, graph building, session creation ...)."""
        return self._wrapped().init_overhead()

    def input_shapes(self, inputs: Any) -> dict[str, list[int]]:
        """The concrete shape of each graph input for these inputs, through ORT's own input accessors (the
        memory account evaluates the graph's symbolic dimensions with them)."""
        info = self._wrapped().post_export()
        if info is None:
            return {}
        args, kwargs = call_arguments(inputs)
        shapes = {}
        for name, accessor in info.input_accessors.items():
            try:
                tensor = accessor(args, kwargs)
            except (KeyError, IndexError):  # an argument a workload's own step adds (a Trainer's num_items_in_batch)
                continue
            if isinstance(tensor, torch.Tensor):
                shapes[name] = list(tensor.shape)
        return shapes

    def post_export(self) -> dict[str, Any]:
        """What ORT's GraphTransitionManager knows about the exported graph."""
        info = self._wrapped().post_export()
        return {} if info is None else info.to_dict()


def build_ortmodule(module: torch.nn.Module, options: Options, onnx_dir: Path) -> Any:
    """A new ORTModule over `module` with the DebugOptions these options name (its graphs saved into `onnx_dir`
    unless save_onnx_path names a folder); ORT reads the other options from the environment (the caller's)."""
    save_onnx = bool(options["save_onnx"])
    save_path = options["save_onnx_path"] or str(onnx_dir)
    if save_onnx:
        Path(save_path).mkdir(parents=True, exist_ok=True)
    return _ort.new_ortmodule(module, options["log_level"], save_onnx=save_onnx, onnx_prefix=options["onnx_prefix"],
                              save_path=save_path)


def ort_checks_for_reexport(options: Options) -> bool:
    """Whether ORT looks for a changed input schema or requires-grad set after the first step. Its default
    ORTMODULE_SKIPCHECK_POLICY includes SKIP_CHECK_BUILD_GRADIENT, which skips that check entirely."""
    policy = str(options["skipcheck_policy"])
    return "SKIP_CHECK_DISABLED" in policy or "SKIP_CHECK_BUILD_GRADIENT" not in policy


def _note_skipped_check(row: Transition, options: Options) -> None:
    if not ort_checks_for_reexport(options):
        row.action += " skipped"
        row.reason += (": but ORT's skip-check policy (SKIP_CHECK_BUILD_GRADIENT, on by default) skips its re-export "
                       "check after the first step, so the graph built for the old inputs is reused; set "
                       "skipcheck_policy=SKIP_CHECK_DISABLED to make ORT re-export")
