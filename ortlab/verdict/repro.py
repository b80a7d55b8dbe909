"""`ortlab repro`: a gradient divergence shrunk to one module and written as a script a user keeps.

The localizer (`ortlab.verdict.localize`) names the smallest module whose ORTModule run alone reproduces the
divergence; this writes that module as a regression test needing only torch and onnxruntime-training: the
script (ortlab/verdict/repro_script.py with its CASE filled in) and, beside it, a .pt file with the module
(pickled: its class is imported from the user's package or file), its state, the activations at its input and
the gradient that reached its output, captured with hooks on the run's first batch, every dropout off.
"""

from __future__ import annotations

import inspect
import pprint
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortlab.engine.backends import has
from ortlab.errors import InputError
from ortlab.verdict.localize import LOCALIZED, Localization, Tried

TEMPLATE = Path(__file__).with_name("repro_script.py")
_CASE_LINE = re.compile(r"^CASE = \{\}.*$", re.MULTILINE)


class ReproError(InputError):
    """A run `ortlab repro` cannot shrink: not an ORTModule run, no verdict, or a verdict that did not diverge on
    gradients; or a model it cannot build again."""


@dataclass
class Repro:
    """The localization of a run's gradient divergence and the regression test written for it (None when the
    divergence did not reproduce in any module)."""

    run: str
    localization: Localization
    script: Path | None = None
    data: Path | None = None

    @property
    def text(self) -> str:
        """What was found and written, as `ortlab repro` prints it."""
        if self.script is None:
            return self.localization.text
        return (f"{self.localization.text}\nwrote {self.script} (and {self.data.name} beside it); run it: python "
                f"{self.script} (exit 1 while ORT's gradient is wrong)")

    def to_dict(self) -> dict[str, Any]:
        """The repro as plain data (`ortlab repro --json`)."""
        return {"run": self.run, "localization": self.localization.to_dict(),
                "script": str(self.script) if self.script else None, "data": str(self.data) if self.data else None}

    def __str__(self) -> str:
        return self.text


def repro(run: Any, out: str | Path | None = None, *, model: Any = None, model_kwargs: dict | None = None,
          in_process: bool = False, progress: Callable[[int, Tried], None] | None = None) -> Repro:
    """The Repro of an ORTModule run (a Run or its folder) whose verdict diverged on gradients: the smallest
    module that reproduces the divergence alone, and the script written into `out` (default: the run's folder,
    `repro/`) that shows it with bare ORTModule (exit 1 while ORT's gradient is wrong). The localization is
    stored in the run's verdict.json (key "localized") and reused. `model`: the factory, when the run cannot
    name it (a callable from a notebook)."""
    from ortlab.compat.registry import parse
    from ortlab.engine.config import BurstConfig
    from ortlab.engine.session import Session
    from ortlab.run import Run, load_run, write_json
    from ortlab.verdict.judge import FILE

    run = run if isinstance(run, Run) else load_run(run)
    verdict = _diverged_on_gradients(run)
    known = verdict.get(LOCALIZED)
    if known is not None and known.get("path") is None:  # localized before: no module reproduces it
        return Repro(run.path.name, Localization.from_dict(known))
    factory, kwargs, seed, snapshot = _rebuild(run, model, model_kwargs)
    config = BurstConfig.from_dict(run.meta["config"])
    fixes = parse(tuple((run.meta.get("fixes") or {}).get("applied") or ()))
    folder = Path(out).expanduser().resolve() if out is not None else run.path / "repro"
    folder.mkdir(parents=True, exist_ok=True)
    with Session(factory, kwargs, out=run.path.parent, in_process=in_process, seed=seed, snapshot=snapshot) as s:
        found = s.localize(config.options, fixes, seed=config.seed, progress=progress, repro=folder, known=known,
                           origin=f"the first batch of run {run.path.name}")
    if not known:
        write_json(run.path / FILE, {**verdict, LOCALIZED: {**found.to_dict(), "repro": None}})
    script = Path(found.repro["script"]) if found.repro else None
    return Repro(run.path.name, found, script, script.with_suffix(".pt") if script else None)


def _diverged_on_gradients(run: Any) -> dict[str, Any]:
    from ortlab.verdict.judge import DIVERGED, FILE

    name = run.path.name
    if not has(run.backend, "compat"):
        raise ReproError(f"run {name} is a {run.backend} run; ortlab repro needs an ORTModule run whose verdict "
                         "diverged on gradients")
    verdict = run.read_json(FILE)
    if not isinstance(verdict, dict):
        raise ReproError(f"run {name} has no verdict; compare it with PyTorch first (ortlab burst --backend both "
                         "--parity)")
    if verdict.get("status") != DIVERGED:
        raise ReproError(f"run {name}'s verdict is {verdict.get('status')!r}: nothing to reproduce (ortlab repro "
                         "needs a verdict that diverged on gradients)")
    if (verdict.get("gradients") or {}).get("agree", True):
        raise ReproError(f"run {name} diverged, but its first step's gradients agree: ortlab repro shrinks "
                         "gradient divergences only")
    return verdict


def _rebuild(run: Any, model: Any, model_kwargs: dict | None) -> tuple[Any, dict, int, str | None]:
    """The factory, its arguments, the seed and snapshot the run's model was built with."""
    from ortlab.workload import ModelRef

    rebuild = (run.meta.get("model") or {}).get("rebuild") or {}
    seed, snapshot = rebuild.get("seed", 0), rebuild.get("snapshot")
    if model is not None:
        return model, dict(model_kwargs or {}), seed, snapshot
    if rebuild.get("ref"):
        return ModelRef.from_dict(rebuild["ref"]), {}, seed, snapshot
    raise ReproError(f"run {run.path.name} does not say how to build its model again (a factory passed as a "
                     "callable, or an older run); pass it: ortlab repro RUN --model module:callable")


def write(workload: Any, batch: tuple[Any, Any], found: Localization, folder: Path, seed: int = 0,
          origin: str = "") -> dict[str, str]:
    """Write the regression test of the module `found` names: `repro_<path>.py` and its .pt file in `folder`.
    Returns their paths."""
    import torch

    from ortlab.verdict import exact

    module = workload.model.get_submodule(found.path) if found.path else workload.model
    data = capture(workload, batch, found.path, seed)
    cls = type(module)
    slug = re.sub(r"\W", "_", found.path) or cls.__name__
    script = Path(folder) / f"repro_{slug}.py"
    model_name = type(workload.model).__name__
    case = {"class": f"{cls.__module__}:{cls.__qualname__}", "modules": _modules(module),
            "where": f"{found.path} of {model_name}" if found.path else f"the whole {model_name}",
            "origin": origin or "written by ortlab repro", "factor": exact.FACTOR,
            "relative_floor": exact.RELATIVE_FLOOR, "absolute_floor": exact.ABSOLUTE_FLOOR, "scale": found.scale}
    try:
        torch.save(data, script.with_suffix(".pt"))
    except Exception as e:  # a module holding a lambda, an open file ...
        raise ReproError(f"cannot write a repro of {found.path or model_name}: its module or inputs cannot be "
                         f"saved ({type(e).__name__}: {e})") from None
    header = f"# {found.text}\n# Written by `ortlab repro` from {origin or 'a run'}.\n"
    text = _CASE_LINE.sub(lambda _: f"CASE = {pprint.pformat(case, width=100, sort_dicts=False)}",
                          TEMPLATE.read_text(), count=1)
    script.write_text(header + text)
    return {"script": str(script), "data": str(script.with_suffix(".pt"))}


def capture(workload: Any, batch: tuple[Any, Any], path: str, seed: int = 0) -> dict[str, Any]:
    """The module at `path` on the first batch, in PyTorch fp32 with every dropout off: itself (at the state it
    starts from), the arguments of its first call, which of them carries an input gradient, and the gradient
    that reached each of its outputs. The model is left as it was."""
    import torch

    from ortlab.engine.parity import parity
    from ortlab.verdict.gradients import kept
    from ortlab.workload import call_model, to_device

    model = workload.model
    module = model.get_submodule(path) if path else model
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    inputs, target = (to_device(v, device) for v in batch)
    seen: dict[str, Any] = {}
    grads: dict[int, Any] = {}

    def before(m, args, kwargs):
        if "args" not in seen:
            seen.update(args=_detached(args), kwargs=_detached(kwargs), input=_grad_input(args, kwargs),
                        module=_saved(m), training=m.training)

    def after(m, args, kwargs, output):
        if "outputs" in seen:
            return
        outputs = _tensors(output)
        seen["outputs"] = len(outputs)
        for i, o in enumerate(outputs):
            if o.requires_grad:
                o.register_hook(lambda g, i=i: grads.__setitem__(i, g.detach().clone()))

    model.train()
    handles = [module.register_forward_pre_hook(before, with_kwargs=True),
               module.register_forward_hook(after, with_kwargs=True)]
    try:
        with kept(model), parity(model, True, seed):
            loss = workload.loss(call_model(model, inputs), target)
            loss.backward()
    finally:
        for h in handles:
            h.remove()
    return {"format": "ortlab-repro-1", "module": seen["module"], "state": seen["module"].state_dict(),
            "args": seen["args"], "kwargs": seen["kwargs"], "input": seen["input"], "training": seen["training"],
            "grad_outputs": [grads.get(i) for i in range(seen["outputs"])]}


def _saved(module: Any) -> Any:
    """A copy of the module as it is now, with no hooks (ortlab's are on it while it runs)."""
    import copy

    saved = copy.deepcopy(module)
    for m in saved.modules():
        m._forward_pre_hooks.clear()
        m._forward_hooks.clear()
        m._forward_pre_hooks_with_kwargs.clear()
        m._forward_hooks_with_kwargs.clear()
    return saved


def _grad_input(args: tuple, kwargs: dict) -> int | str | None:
    """The position (or keyword) of the first floating tensor argument that requires grad: its gradient is
    judged too (as the localizer does)."""
    import torch

    for key, value in [*enumerate(args), *kwargs.items()]:
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.requires_grad:
            return key
    return None


def _detached(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return type(value)(_detached(v) for v in value)
    return value


def _tensors(value: Any) -> list[Any]:
    """The tensors of a nested output in the order the script flattens them (repro_script.tensors)."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, tuple | list):
        return [t for v in value for t in _tensors(v)]
    return []


def _modules(module: Any) -> dict[str, str | None]:
    """Every Python module defining a class in `module`'s tree, with its file (the script imports each by name,
    or from the file when the name does not import: a model loaded from `file.py:factory`)."""
    out: dict[str, str | None] = {}
    for m in module.modules():
        name = type(m).__module__
        if name not in out:
            try:
                out[name] = inspect.getsourcefile(sys.modules[name])
            except (KeyError, TypeError):
                out[name] = None
    return out
