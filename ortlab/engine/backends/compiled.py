"""torch.compile: the model compiled with the burst's settings (mode, dynamic shapes, fullgraph, backend, and the
activation memory budget its partitioner recomputes to), kept while the settings stay; its start-up (compile time per
step: the first, and any that re-compiles), its graph breaks (the reason and the user's line) and re-compilations
(the guard failures) as data, the analogue of ORTModule's init overhead and transitions; inductor's generated code
kept in the run (compiled/)."""

from __future__ import annotations

import contextlib
import math
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, cast

from ortlab.engine.backends import Alone, Backend
from ortlab.engine.types import Burst, BurstError, Engine, Transition
from ortlab.errors import did_you_mean

# Each setting and what it may be; the first is the default.
SETTINGS: dict[str, tuple[Any, ...]] = {
    "mode": ("default", "reduce-overhead", "max-autotune-no-cudagraphs"),
    "dynamic": (None, True, False),  # None: torch decides (dynamic after a shape changes)
    "fullgraph": (False, True),  # True: a graph break fails the burst, with its reason
    "backend": ("inductor", "aot_eager", "eager"),  # aot_eager / eager: for debugging a divergence
}
# torch._functorch.config.activation_memory_budget, a number in (0, 1]: the share of the activations AOTAutograd's
# partitioner keeps for backward, recomputing the rest (ORTModule's memory_opt_level, on torch.compile's side);
# None: torch's default (1.0, the partitioner's own choice)
BUDGET = "memory_budget"
KNOWN = (*SETTINGS, BUDGET)
_COMPILED_UNDER: list[float | None] = []  # the budget of the last module compiled in this process
FILE = "compile.json"
_USER_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')


class Settings(TypedDict):
    """A compile burst's settings as `settings` checked them: what BurstConfig.compile holds (the backend's registry
    entry names `settings` as the check of that field), read here without checking again."""

    mode: str
    dynamic: bool | None
    fullgraph: bool
    backend: str
    memory_budget: float | None


# What an activation memory budget may be, in the words of every message that refuses one (BurstConfig's, the CLI's)
BUDGET_ALLOWED = "a number in (0, 1] (the share of activations torch.compile keeps for backward; 1: torch's default)"


def settings(given: dict[str, Any] | None) -> Settings:
    """The compile settings with defaults filled in; a bad one raises naming it and what is allowed."""
    given = dict(given or {})
    unknown = sorted(set(given) - set(KNOWN))
    if unknown:
        raise BurstError(f"compile setting {unknown[0]!r} is not known; known: {', '.join(KNOWN)}"
                         f"{did_you_mean(unknown[0], KNOWN)}")
    out = {}
    for name, allowed in SETTINGS.items():
        value = given.get(name, allowed[0])
        if not any(value is a or (value == a and type(value) is type(a)) for a in allowed):
            raise BurstError(f"compile {name} {value!r} is not allowed; allowed: "
                             f"{', '.join(repr(a) for a in allowed)}")
        out[name] = value
    out[BUDGET] = memory_budget(given.get(BUDGET))
    if out[BUDGET] is not None and out["backend"] == "eager":  # no AOTAutograd: nothing partitions by the budget
        raise BurstError("compile memory_budget needs backend 'inductor' or 'aot_eager': AOTAutograd's partitioner "
                         "reads it, and backend 'eager' runs dynamo's graphs without AOTAutograd")
    return cast(Settings, out)


def memory_budget(value: Any) -> float | None:
    """The activation memory budget checked: None, or a number in (0, 1] (as a float)."""
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and 0 < value <= 1:
        return float(value)
    raise BurstError(f"compile memory_budget {value!r} is not allowed; allowed: {BUDGET_ALLOWED} or None")


def _chosen(cfg: Any) -> Settings:
    """The burst's settings, which BurstConfig checked as it was made (its field compile holds `settings`'s
    result)."""
    return cast(Settings, cfg.compile)


def compiled(model: Any, chosen: Settings) -> Any:
    """torch.compile(model) with the settings; a memory budget is in effect on every call of the compiled module:
    AOTAutograd reads it when it partitions the joint graph, which happens at the first call (and at a re-compile),
    not inside torch.compile itself."""
    import torch

    from ortlab import _dynamo

    budget = chosen["memory_budget"]
    if _COMPILED_UNDER and _COMPILED_UNDER[0] != budget:  # dynamo's guards do not see the budget: a graph of the
        _dynamo.reset()  # same code cached under another one (another session's model, in this process) is reused
    _COMPILED_UNDER[:] = [budget]
    module = torch.compile(model, **{k: v for k, v in chosen.items() if k in SETTINGS})
    if budget is not None:
        from torch._functorch import config

        compiled_forward = module.forward  # dynamo's wrapped forward (an instance attribute of OptimizedModule)

        def forward(*args: Any, **kwargs: Any) -> Any:
            with config.patch(activation_memory_budget=budget):
                return compiled_forward(*args, **kwargs)

        module.forward = forward
    return module


@dataclass
class CompileState:
    observer: Any = None
    before: float = 0.0  # seconds of compile time before this step
    at: int | None = None  # the step whose first forward set `before` (a step of several micro-batches: the first)
    steps: list[dict[str, Any]] = field(default_factory=list)  # the steps that compiled: step, seconds
    info: dict[str, Any] = field(default_factory=dict)


class Compiled(Backend):
    name = "compile"

    def __init__(self, model: Any):
        super().__init__(model)
        self._module = None
        self._key: tuple | None = None

    def begin(self, engine: Engine, b: Burst) -> None:
        from ortlab import _dynamo

        b.state = CompileState(observer=b.stack.enter_context(_dynamo.Observer()))

    def gradient_runner(self, engine: Engine, cfg: Any, fixes: tuple[str, ...],
                        batch: tuple[Any, Any]) -> tuple[Any, bool]:
        """The compiled module for the burst's settings: the last burst's when they match, else a new one."""
        chosen = _chosen(cfg)
        if self._module is not None and tuple(sorted(chosen.items())) == self._key:
            return self._module, False
        return compiled(engine.model, chosen), False

    def alone(self, cfg: Any, fixes: tuple[str, ...], log: Any) -> Alone:
        """The module compiled alone with the burst's settings, from no cached graph (a graph break is allowed:
        the user's run allowed it; a module dynamo compiled no graph of did not run on torch.compile)."""
        from ortlab import _dynamo

        chosen, graphs = _chosen(cfg), [0]

        def wrap(module: Any) -> Any:
            _dynamo.reset()
            graphs[0] = _dynamo.unique_graphs() or 0
            return compiled(module, chosen)

        def ran(runner: Any) -> None:
            if (_dynamo.unique_graphs() or 0) <= graphs[0]:
                raise RuntimeError("torch.compile compiled no graph of it (dynamo ran it in eager)")

        @contextlib.contextmanager
        def around(model: Any) -> Iterator[None]:
            from ortlab.common.capture import captured_output

            try:
                with captured_output(log):
                    yield
            finally:
                _dynamo.reset()  # no graph of a module tried alone outlives its try

        def op(func: Any) -> Callable[..., Any]:
            _dynamo.reset()  # one op's graph at a time: no earlier op's cache entry is reused or overflows

            def alone(*args: Any, **kwargs: Any) -> Any:
                return func(*args, **kwargs)

            runner = compiled(alone, {**chosen, "fullgraph": True, "dynamic": False})
            compiled_once = [False]  # its first call must compile a graph; later calls reuse it

            def checked(*args: Any, **kwargs: Any) -> Any:
                before = _dynamo.unique_graphs() or 0
                out = runner(*args, **kwargs)
                if (_dynamo.unique_graphs() or 0) <= before and not compiled_once[0]:
                    raise RuntimeError("torch.compile compiled no graph of it")
                compiled_once[0] = True
                return out

            return checked

        def bisect(func: Any, agrees: Callable[[Callable[..., Any]], bool]) -> dict[str, Any] | None:
            """Inductor's CompilerBisector on the one op: the backend (eager, aot_eager, aot_eager_decomp_partition,
            inductor), subsystem (decomposition, a pass, lowerings, a config) and its application that first make
            it disagree. Only for the inductor backend (the bisector swaps in the simpler ones)."""
            if chosen["backend"] != "inductor":
                return None
            return _dynamo.bisect(lambda: agrees(op(func)))

        return Alone("torch.compile", wrap, ran, around, op, bisect)

    def wrap(self, engine: Engine, b: Burst, inputs: Any) -> Any:
        from ortlab import _dynamo
        chosen = _chosen(b.cfg)
        key = tuple(sorted(chosen.items()))
        if self._module is None or key != self._key:
            first = self._module is None
            changes = {} if first else {k: {"old": old, "new": new} for (k, old), (_, new)
                                        in zip(self._key or (), key, strict=True) if new != old}
            if not first:
                _dynamo.reset()
            self._module = compiled(engine.model, chosen)
            self._key = key
            reason = "first compile" if first else "settings changed: " + ", ".join(
                f"{k} {v['old']!r} -> {v['new']!r}" for k, v in changes.items())
            b.transitions.append(Transition(b.path.name, 0, "compile" if first else "re-compile", reason, changes))
        else:
            b.transitions.append(Transition(b.path.name, 0, "reuse", "same settings: the compiled module is reused "
                                            "(a step whose guards fail re-compiles)", {}))
        return self._module

    @contextlib.contextmanager
    def forward(self, engine: Engine, b: Burst, step: int, inputs: Any) -> Iterator[None]:
        from ortlab import _dynamo

        b.state.observer.step = step
        if b.state.at != step:  # once per step: a later micro-batch's forward must not hide the first one's compile
            b.state.at, b.state.before = step, _dynamo.compile_seconds()
        yield

    def after_step(self, engine: Engine, b: Burst, step: int, inputs: Any, row: dict[str, Any]) -> None:
        """The step's compile time (forward and backward), when it compiled anything."""
        from ortlab import _dynamo

        spent = _dynamo.compile_seconds() - b.state.before
        if spent > 1e-3:
            row["compile_s"] = spent
            b.state.steps.append({"step": step, "seconds": round(spent, 4)})
            if step > 0:
                t = Transition(b.path.name, step, "re-compile", "a guard failed: " + "; ".join(
                    r for rc in b.state.observer.observed.recompiles if rc["step"] == step for r in rc["reasons"])
                    or "a guard failed", {}, True)
                b.transitions.append(t)

    def where_failed(self, engine: Engine, b: Burst, error: BaseException) -> str | None:
        if b.stage not in ("forward", "backward", "loss"):
            return None
        text = str(error)
        if "Unsupported" in type(error).__name__ or "graph break" in text.lower() or "fullgraph" in text:
            frames = _USER_FRAME.findall(text)
            if frames:
                from ortlab.common.readable import short_path

                file, line, func = frames[-1]
                from ortlab._dynamo import break_reason

                b.extra["graph_break"] = {"reason": break_reason(text), "file": short_path(file),
                                          "line": int(line), "function": func}
            return "torch.compile (a graph break with fullgraph=True)" if b.cfg.compile.get("fullgraph") else \
                "torch.compile"
        return f"torch.compile {b.stage}"

    def outcome(self, engine: Engine, b: Burst) -> None:
        b.state.observer.step = None  # what follows (accounts, collectors) is not the burst's

    def finish(self, engine: Engine, b: Burst) -> None:
        from ortlab import _dynamo
        from ortlab.common.readable import short_path

        observed = b.state.observer.observed
        breaks: dict[tuple, dict[str, Any]] = {}
        for g in observed.graph_breaks:
            key = (g["file"], g["line"], g["reason"])
            if key not in breaks:
                breaks[key] = {**g, "file": short_path(g["file"]), "count": 0}
            breaks[key]["count"] += 1
        code = self._keep_code(observed.code_files, b.path / "compiled")
        b.state.info = {
            "settings": _chosen(b.cfg), "compile_s": round(sum(s["seconds"] for s in b.state.steps), 4),
            "compiled_steps": b.state.steps, "graph_breaks": list(breaks.values()),
            "recompiles": [{**r, "file": short_path(r["file"])} for r in observed.recompiles],
            "unique_graphs": _dynamo.unique_graphs(), "generated_code": code,
            "compiled": any(t.action in ("compile", "re-compile") for t in b.transitions),
        }
        if b.extra.get("graph_break"):
            b.state.info["fullgraph_break"] = b.extra["graph_break"]

    @staticmethod
    def _keep_code(files: list[str], folder: Path) -> list[str]:
        """Inductor's generated code for this burst, copied into the run (its cache may be emptied later)."""
        kept = []
        for name in dict.fromkeys(files):
            source = Path(name)
            if source.is_file():
                folder.mkdir(exist_ok=True)
                target = folder / source.name
                shutil.copy2(source, target)
                kept.append(target.name)
        return kept

    def write(self, engine: Engine, b: Burst) -> None:
        b.writer.write(FILE, b.state.info)
        b.writer.write("transitions.json", [t.to_dict() for t in b.transitions])
