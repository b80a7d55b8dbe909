"""What a repro script is made of: the module a localization names, its state, the activations at its input and
the gradient that reached its output, captured with hooks on the first batch (every dropout off), and the script
(ortlab/verdict/repro_script.py with its CASE filled in) written beside them. Runs where the model is (the
engine); `ortlab.verdict.repro` is the user's side.
"""

from __future__ import annotations

import inspect
import pprint
import re
import sys
from pathlib import Path
from typing import Any

from ortlab.errors import InputError
from ortlab.verdict.localize import Localization

TEMPLATE = Path(__file__).with_name("repro_script.py")
_CASE_LINE = re.compile(r"^CASE(?:: [^=]+)? = \{\}.*$", re.MULTILINE)  # the template's empty CASE, annotated or not


class ReproError(InputError):
    """A run `ortlab repro` cannot shrink: not an ORTModule run, no verdict, or a verdict that did not diverge on
    gradients; or a model it cannot build again."""


def write(workload: Any, batch: tuple[Any, Any], found: Localization, folder: Path, seed: int = 0,
          origin: str = "", backend: dict[str, Any] | None = None) -> dict[str, str]:
    """Write the regression test of the module `found` names: `repro_<path>.py` and its .pt file in `folder`;
    `backend`: the one it runs on and its settings ({"backend": "compile", "compile": {...}}; default ORTModule).
    Returns their paths."""
    import torch

    from ortlab.verdict import exact

    path = found.path or ""  # "": the whole model
    module = workload.model.get_submodule(path) if path else workload.model
    data = capture(workload, batch, path, seed)
    cls = type(module)
    slug = re.sub(r"\W", "_", path) or cls.__name__
    script = Path(folder) / f"repro_{slug}.py"
    model_name = type(workload.model).__name__
    case = {"class": f"{cls.__module__}:{cls.__qualname__}", "modules": _modules(module),
            "where": f"{found.path} of {model_name}" if found.path else f"the whole {model_name}",
            "origin": origin or "written by ortlab repro", "factor": exact.FACTOR,
            "relative_floor": exact.RELATIVE_FLOOR, "absolute_floor": exact.ABSOLUTE_FLOOR, "scale": found.scale,
            **(backend or {})}  # without one the script runs ORTModule
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

    from ortlab.common.parity import parity
    from ortlab.runs.snapshot import kept
    from ortlab.workload import to_device

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
            loss = workload.forward_loss(model, inputs, target)
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
