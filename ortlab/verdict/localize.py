"""Localize a gradient divergence like a minifier: the smallest module whose run alone on the backend (ORTModule
or torch.compile over that subtree, the rest of the model in PyTorch, the same state and batch, every dropout off)
still reproduces it against float64.

A whole-model gradient check says *that* a backend's gradients are wrong, not *where*: a wrong backward anywhere
corrupts every gradient upstream of it. So the search wraps one subtree at a time (replacing it in its parent
by the backend's runner over it for one step, `Backend.alone`, then putting the original back) and judges the
subtree's own gradients,
its parameters' and its input's, with `exact.judge` (the distance to float64 against PyTorch fp32's). It starts
at the root and descends into a child that reproduces alone, until no child of the current module does. Each
try is an export, so children are tried in the order the evidence points to (the last one, in call order, whose
parameters' gradients diverged in its parent's run: nothing after it in the parent was wrong, so its own
backward is the first suspect; then the modules after it, then the rest, last first), not all of them.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ortlab.engine.backends import Alone

LOCALIZED = "localized"  # the key of a run's verdict.json that holds its Localization (ortlab.verdict.repro)
INPUT = "<input>"  # the name of a module's input's gradient among its parameters' (a module has no such parameter)
REPRODUCES, AGREES, SKIPPED = "reproduces", "does not reproduce", "skipped"
# A parameter whose backend's gradient is this many times further from float64 than allowed points at its module (one
# just beyond the allowance can be rounding that a different forward order carried: EfficientNet-B0's classifier)
SUSPECT = 2.0


@dataclass
class Tried:
    """One module tried alone: its path ("" is the whole model), class, verdict and cost."""

    path: str
    class_name: str
    verdict: str  # REPRODUCES, AGREES or SKIPPED
    seconds: float
    reason: str | None = None  # why it was skipped
    worst: dict[str, Any] | None = None  # its worst tensor (see `Localization.worst`)

    def to_dict(self) -> dict[str, Any]:
        """The row as plain data."""
        return asdict(self)


@dataclass
class Localization:
    """Where a gradient divergence reproduces: the module (`path`, "" for the whole model; None when it does not
    reproduce even there), its class and the line that defines it, its worst tensor (`tensor`: a parameter's
    name inside the module or "<input>"; `candidate` and `pytorch`: the backend's and PyTorch fp32's distance to
    float64; `factor`: how many times PyTorch's the backend's is; `allowed`), every module tried, the scale the
    floors used, and the ops inside the module judged one by one (`ops`)."""

    path: str | None
    class_name: str | None = None
    file: str | None = None
    line: int | None = None
    worst: dict[str, Any] | None = None
    tried: list[Tried] = field(default_factory=list)
    seconds: float = 0.0
    scale: float = 0.0  # the norm of the whole model's float64 gradients (the absolute floor's unit)
    note: str | None = None  # why nothing was localized
    repro: dict[str, str] | None = None  # the script and data `ortlab repro` wrote for it
    who: str = "ORT"  # whose gradients were searched ("ORT", "torch.compile")
    ops: dict[str, Any] | None = None  # the ops inside the module, judged (ortlab.verdict.ops.OpTable.to_dict)

    @property
    def found(self) -> bool:
        """Whether the divergence reproduces (in the whole model at least)."""
        return self.path is not None

    @property
    def exports(self) -> int:
        """How many modules were exported (tried, not skipped before an export)."""
        return sum(1 for t in self.tried if t.verdict != SKIPPED or t.seconds > 0)

    @property
    def text(self) -> str:
        """One line a cause can show."""
        if not self.found:
            return f"the divergence does not reproduce against float64: {self.note or 'no module reproduces it'}"
        where = f"in {self.path}" if self.path else "only in the whole model"
        place = f", {short_path(self.file)}:{self.line}" if self.file else ""
        alone = " alone" if self.path else ""
        worst = worst_text(self.worst, self.who)
        text = f"the divergence reproduces {where} ({self.class_name}{place}){alone}: {worst}"
        first = (self.ops or {}).get("first")
        return text if not first else f"{text}; first op beyond float64's rounding: {first}"

    def to_dict(self) -> dict[str, Any]:
        """The localization as plain data (what verdict.json keeps under "localized"), with its text."""
        return {**asdict(self), "text": self.text, "exports": self.exports}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Localization:
        """The Localization `to_dict` wrote, read back (unknown keys ignored)."""
        kept = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        kept["tried"] = [Tried(**t) for t in kept.get("tried", [])]
        if kept.get("worst") and "ort" in kept["worst"]:  # written before torch.compile was localized
            kept["worst"] = {("candidate" if k == "ort" else k): v for k, v in kept["worst"].items()}
        return cls(**kept)

    def __str__(self) -> str:
        return self.text


def localization_of(verdict: dict[str, Any] | None) -> dict[str, Any] | None:
    """The localization a run's verdict.json holds (as a dict): the one `ortlab repro` stored under LOCALIZED, else
    the one the verdict's own cause found (torch.compile); None when it holds none."""
    if not verdict:
        return None
    return verdict.get(LOCALIZED) or next((c[LOCALIZED] for c in verdict.get("causes") or []
                                           if isinstance(c, dict) and c.get(LOCALIZED)), None)


def worst_text(worst: dict[str, Any] | None, who: str = "ORT") -> str:
    """ "ORT's gradient of fc1.weight is 18x further from float64 than PyTorch's" (or not finite, or where
    PyTorch's is exact); `who`: the backend searched."""
    if not worst:
        return "no gradient to judge"
    what = "its input" if worst["tensor"] == INPUT else worst["tensor"]
    if worst.get("note"):
        return f"{who}'s gradient of {what}: {worst['note']}"
    if not math.isfinite(worst["candidate"]):
        return f"{who}'s gradient of {what} is not finite"
    if worst["pytorch"] == 0:
        return f"{who}'s gradient of {what} is {worst['candidate']:.2g} from float64, where PyTorch's is exact"
    factor, relative = worst["factor"], worst["candidate"] / worst["norm"] if worst.get("norm") else None
    times = f"{factor:.2g}x" if factor < 10 or factor >= 1e4 else f"{factor:.0f}x"
    percent = "" if relative is None else f"{100 * relative:.2g}" if relative < 0.1 else f"{100 * relative:.0f}"
    error = ("" if relative is None else f" (an error of {percent}% of its norm)" if relative < 10
             else f" (an error of {relative:.2g} times its norm)")
    return f"{who}'s gradient of {what} is {times} further from float64 than PyTorch's{error}"


def short_path(file: str | None) -> str:
    """A source file as a reader finds it: from its package folder on (site-packages/torchvision/ops/misc.py
    -> .../torchvision/ops/misc.py), or as it is."""
    if not file:
        return ""
    parts = Path(file).parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return str(Path("...", *parts[parts.index(marker) + 1:]))
    return file


def class_source(module: Any) -> tuple[str, str | None, int | None]:
    """A module's class (qualified name) and the file and line of its definition (None where inspect cannot
    tell, e.g. a class made in a notebook cell)."""
    cls = type(module)
    name = f"{cls.__module__}.{cls.__qualname__}"
    try:
        return name, inspect.getsourcefile(cls), inspect.getsourcelines(cls)[1]
    except (OSError, TypeError):
        return name, None, None


@dataclass
class _Pass:
    """One forward and backward: every trained parameter's gradient, and for the tapped modules the gradient of
    their input (first call) and the order of their first calls."""

    grads: dict[str, Any]
    inputs: dict[str, Any]
    order: list[str]
    in_place: set[str] = field(default_factory=set)


def localize(workload: Any, batch: tuple[Any, Any], alone: Alone, seed: int = 0,
             progress: Callable[[int, Tried], None] | None = None) -> Localization:
    """The smallest module of `workload.model` whose run alone on the backend (`alone`: Backend.alone, with the
    burst's fixes or settings) reproduces the gradient divergence on `batch` (its inputs and target) against
    float64, every dropout off. `progress(tried, row)` after each module tried. The model is left exactly as it
    was (state, gradients, modules, hooks, modes)."""
    started = time.perf_counter()
    with _untouched(workload.model):
        search = _Search(workload, batch, alone, seed, progress)
        found = search.run()
    found.seconds = time.perf_counter() - started
    found.who = alone.who
    return found


class _Search:
    def __init__(self, workload: Any, batch: tuple[Any, Any], alone: Alone, seed: int,
                 progress: Callable[[int, Tried], None] | None):
        import torch

        from ortlab.workload import to_device

        self.workload, self.model, self.alone, self.seed = workload, workload.model, alone, seed
        self.progress = progress
        device = next((p.device for p in self.model.parameters()), torch.device("cpu"))
        self.inputs, self.target = (to_device(v, device) for v in batch)
        self.twin = None  # the model in float64
        self.scale = 0.0  # the norm of its gradients
        self.tried: list[Tried] = []
        self.rows: dict[str, list[dict[str, Any]]] = {}  # each module tried: its tensors judged, worst first
        self.named: dict[int, list[tuple[str, Any]]] = {}  # each model's trained parameters (_named)

    def run(self) -> Localization:
        self.model.train()
        self._named(self.model)
        try:
            self.twin = copy.deepcopy(self.model).double()
        except Exception as e:
            from ortlab.compat.errors import root_message

            return Localization(None, note=f"the model cannot run in float64 ({root_message(e)})")
        root = self._try("", self._passes([]))
        if root.verdict != REPRODUCES:
            reason = root.reason or (f"{self.alone.who}'s gradients over the whole model are as close to float64 "
                                     "as PyTorch's")
            return self._result(None, None, note=reason)
        path, evidence = "", root
        while True:
            children = [f"{path}.{n}" if path else n for n, _ in self._module(path).named_children()]
            if not children:
                break
            passes = self._passes(children)
            for child in self._order(path, children, passes[0].order):
                tried = self._try(child, passes)
                if tried.verdict == REPRODUCES:
                    path, evidence = child, tried
                    break
            else:
                break
        return self._result(path, evidence.worst)

    def _result(self, path: str | None, worst: dict[str, Any] | None, note: str | None = None) -> Localization:
        cls = file = line = None
        if path is not None:
            cls, file, line = class_source(self._module(path))
        return Localization(path, cls, file, line, worst, self.tried, scale=self.scale, note=note)

    def _module(self, path: str, model: Any = None) -> Any:
        model = self.model if model is None else model
        return model.get_submodule(path) if path else model

    # -- the references: PyTorch fp32 and float64, with the candidate modules' inputs tapped

    def _passes(self, paths: list[str]) -> tuple[_Pass, _Pass]:
        import torch

        fp32 = self._pass(self.model, self.inputs, self.target, paths)
        exact = self._pass(self.twin, _cast(self.inputs, torch.float64), _cast(self.target, torch.float64), paths)
        self.scale = math.sqrt(sum(float(g.norm()) ** 2 for g in exact.grads.values() if g is not None))
        return fp32, exact

    def _pass(self, model: Any, inputs: Any, target: Any, paths: list[str], runner: Any = None) -> _Pass:
        from ortlab.common.parity import parity
        from ortlab.runs.snapshot import kept

        with kept(model), parity(model, True, self.seed), _taps({p: self._module(p, model) for p in paths}) as tap:
            for p in model.parameters():
                p.grad = None
            loss = self.workload.forward_loss(runner if runner is not None else model, inputs, target)
            loss.backward()
            grads = {n: None if p.grad is None else p.grad.detach().clone() for n, p in self._named(model)}
        return _Pass(grads, dict(tap.grads), list(tap.order), tap.in_place)

    def _named(self, model: Any) -> list[tuple[str, Any]]:
        """The trained parameters of `model` (the model or its twin) by the names they have when no runner sits in
        it (torch.compile's module names them "<path>._orig_mod.<name>"), taken once."""
        key = id(model)
        if key not in self.named:
            self.named[key] = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        return self.named[key]

    # -- one module on the backend

    def _try(self, path: str, passes: tuple[_Pass, _Pass]) -> Tried:
        module = self._module(path)
        cls = class_source(module)[0]
        fp32, exact = passes
        names = [f"{path}.{n}" if path else n for n, p in module.named_parameters() if p.requires_grad]
        has_input = path in fp32.inputs and fp32.inputs[path] is not None
        if not names and not has_input:
            why = "it changes its input in place" if path in fp32.in_place else "no input gradient"
            return self._record(Tried(path, cls, SKIPPED, 0.0, f"nothing to judge: no trained parameter, {why}"))
        started = time.perf_counter()
        try:
            ort = self._alone_pass(path)
        except Exception as e:
            from ortlab.compat.errors import root_message

            seconds = time.perf_counter() - started
            return self._record(Tried(path, cls, SKIPPED, seconds, f"cannot run on {self.alone.who} alone: "
                                                                   f"{root_message(e)}"))
        seconds = time.perf_counter() - started
        judged = [self._judge(n[len(path) + 1:] if path else n, ort.grads.get(n), fp32.grads.get(n),
                              exact.grads.get(n)) for n in names]
        if has_input:
            judged.append(self._judge(INPUT, ort.inputs.get(path), fp32.inputs[path], exact.inputs.get(path)))
        rows = [r for r in judged if r is not None]
        rows.sort(key=lambda r: (r["diverged"], r["ratio"]), reverse=True)
        worst = rows[0] if rows else None
        verdict = REPRODUCES if worst and worst["diverged"] else AGREES
        self.rows[path] = rows
        return self._record(Tried(path, cls, verdict, seconds, worst=worst))

    def _alone_pass(self, path: str) -> _Pass:
        """One forward and backward with the backend over the module at `path` (the whole model for ""), the rest
        in PyTorch; the original module is back in its parent afterwards. Raises when the backend fails or did
        not run it (ORTModule fell back, dynamo compiled nothing)."""
        with self.alone.around(self.model):
            if not path:
                runner = self.alone.wrap(self.model)
                result = self._pass(self.model, self.inputs, self.target, [], runner)
            else:
                parent_path, _, name = path.rpartition(".")
                parent = self._module(parent_path)
                original = parent._modules[name]
                runner = self.alone.wrap(original)
                parent._modules[name] = runner
                try:
                    with _taps({path: runner}) as tap:
                        result = self._pass(self.model, self.inputs, self.target, [])
                finally:
                    parent._modules[name] = original
                result.inputs = dict(tap.grads)
            self.alone.ran(runner)
        return result

    def _judge(self, name: str, ort: Any, pytorch: Any, exact: Any) -> dict[str, Any] | None:
        from ortlab.verdict import exact as arbiter

        if ort is None and pytorch is None:
            return None
        if ort is None or pytorch is None or exact is None:
            who = self.alone.who if pytorch is None else "PyTorch"
            return {"tensor": name, "candidate": math.nan, "pytorch": math.nan, "allowed": math.nan, "norm": math.nan,
                    "factor": math.inf, "ratio": math.inf, "diverged": True, "note": f"only {who} gave it a gradient"}
        j = arbiter.judge(ort, pytorch, exact, self.scale)
        diverged = j.diverged and not arbiter.close(ort, pytorch)
        ratio = j.candidate / j.allowed if j.allowed > 0 else (math.inf if j.candidate > 0 else 0.0)
        return {"tensor": name, "candidate": j.candidate, "pytorch": j.pytorch, "allowed": j.allowed, "norm": j.norm,
                "factor": j.times_noise, "ratio": ratio if math.isfinite(j.candidate) else math.inf,
                "diverged": diverged}

    def _record(self, tried: Tried) -> Tried:
        self.tried.append(tried)
        if self.progress is not None:
            self.progress(len(self.tried), tried)
        return tried

    def _order(self, path: str, children: list[str], called: list[str]) -> list[str]:
        """The children worth trying, most likely first: the last one in call order whose parameters' gradients
        clearly diverged in the parent's run (SUSPECT times what is allowed; else diverged at all), the ones
        called after it, then the rest from the last called back. A child never called is not tried."""
        order = [c for c in called if c in children]
        prefix = f"{path}." if path else ""
        rows = [r for r in self.rows.get(path, []) if r["diverged"] and r["tensor"] != INPUT]
        diverged = {prefix + r["tensor"] for r in rows if r["ratio"] >= SUSPECT} or {prefix + r["tensor"] for r in rows}
        suspects = [i for i, c in enumerate(order) if any(n.startswith(c + ".") for n in diverged)]
        if not suspects:
            return order[::-1]
        last = suspects[-1]
        return order[last:] + order[:last][::-1]


class _Taps:
    def __init__(self) -> None:
        self.grads: dict[str, Any] = {}
        self.order: list[str] = []
        self.aliases: dict[str, tuple[Any, int]] = {}  # each tapped input and its version when passed on

    @property
    def in_place(self) -> set[str]:
        """The modules that changed their input in place (its gradient then cannot be told apart)."""
        return {p for p, (alias, version) in self.aliases.items() if alias._version != version}


@contextlib.contextmanager
def _taps(modules: dict[str, Any]) -> Iterator[_Taps]:
    """For each module, its first call's input (the first floating tensor argument that requires grad) is passed
    on as an alias whose gradient is recorded, so that the gradient is the module's own, not that of every use of
    the tensor (a residual connection); and the order of first calls is recorded. The hooks are removed after."""
    import torch

    tap, handles = _Taps(), []

    def hook_for(path: str):
        def pre(module, args, kwargs):
            if path in tap.order:
                return None
            tap.order.append(path)
            tap.grads[path] = None
            args, kwargs = list(args), dict(kwargs)
            for holder, keys in ((args, range(len(args))), (kwargs, list(kwargs))):
                for k in keys:
                    value = holder[k]
                    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.requires_grad:
                        alias = value.view_as(value)
                        alias.register_hook(lambda g: tap.grads.__setitem__(path, g.detach().clone()))
                        tap.aliases[path] = alias, alias._version
                        holder[k] = alias
                        return tuple(args), kwargs
            return None

        return pre

    try:
        for path, module in modules.items():
            handles.append(module.register_forward_pre_hook(hook_for(path), with_kwargs=True))
        yield tap
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def _untouched(model: Any) -> Iterator[None]:
    """Every module's training mode as before the block (an ORTModule built over a subtree sets the subtree's
    mode to its root's)."""
    modes = [(m, m.training) for m in model.modules()]
    try:
        yield
    finally:
        for m, mode in modes:
            m.training = mode


def _cast(value: Any, dtype: Any) -> Any:
    """Every floating tensor in a nested structure cast to `dtype`."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, dict):
        return {k: _cast(v, dtype) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return type(value)(_cast(v, dtype) for v in value)
    return value
