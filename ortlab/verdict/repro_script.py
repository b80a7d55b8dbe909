"""A backend's gradient of one module against float64 (ORTModule or torch.compile, CASE["backend"]): a regression
test written by `ortlab repro`.

It needs only torch (and onnxruntime-training for ORTModule). It rebuilds the module (its class imported from its
package or file, its state and the activations at its input from the .pt file beside this script, captured on the
first batch of an ortlab run), runs one forward and backward with the gradient that reached its output there, on
the bare backend (ORTModule with fallback disabled; torch.compile with the run's settings), on PyTorch fp32 and on
PyTorch float64, and judges each gradient as ortlab does: the backend's may be at most CASE["factor"] times
further from float64 than PyTorch fp32's, plus small floors.
Exit 0: the backend's gradients agree; 1: its gradient is wrong; 2: the module could not be run.
The .pt file holds the module pickled: load only files you made (torch.load with weights_only=False).
"""

import copy
import importlib
import importlib.util
import math
import os
import sys
from pathlib import Path
from typing import Any

import torch

CASE: dict[str, Any] = {}  # what to load and how to judge: filled in by ortlab.verdict.repro

OK, WRONG, CANNOT_RUN = 0, 1, 2
WHO = {"ortmodule": "ORT", "compile": "torch.compile"}


def package_root(name, file):
    """The folder a module's file is importable from as `name` (its package's parent), or None."""
    path = Path(file).resolve()
    parts = name.split(".")
    package = path.stem == "__init__"
    if (path.parent.name if package else path.stem) != parts[-1]:
        return None
    root = path.parent
    for _ in parts if package else parts[:-1]:
        if not (root / "__init__.py").is_file():
            return None
        root = root.parent
    return root


def import_modules():
    """Each module defining a class in the saved module: from its package (found beside its file when this Python
    cannot import it: a checkout, a side folder), else from its file."""
    for name, file in CASE["modules"].items():
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
            continue
        except ImportError:
            if not file or not Path(file).is_file():
                raise
        root = package_root(name, file)
        if root is not None and str(root) not in sys.path:
            sys.path.append(str(root))
            try:
                importlib.import_module(name)
                continue
            except ImportError:
                sys.path.remove(str(root))
        spec = importlib.util.spec_from_file_location(name, file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    module_name, _, qualname = CASE["class"].partition(":")
    found = sys.modules[module_name]
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def load(cls):
    data = torch.load(Path(__file__).with_suffix(".pt"), weights_only=False)
    module = data["module"]
    assert isinstance(module, cls), f"the saved module is a {type(module).__name__}, not a {cls.__name__}"
    module.load_state_dict(data["state"])
    return module, data


def cast(value, dtype):
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, dict):
        return {k: cast(v, dtype) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(cast(v, dtype) for v in value)
    return value


def tensors(value):
    """The tensors of a nested output, in a fixed order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors(v)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors(v)]
    return []


def no_dropout(module):
    for m in module.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            m.p = 0.0


def step(module, data, dtype, backend=None):
    """One forward and backward: every parameter's gradient and the input's."""
    module = copy.deepcopy(module).to(dtype)
    module.train(data["training"])
    no_dropout(module)
    args, kwargs = cast(data["args"], dtype), cast(data["kwargs"], dtype)
    args, leaf = list(args), None
    if data["input"] is not None:  # its gradient is judged too (a copy goes in: the module may change it in place)
        holder, key = (args, data["input"]) if isinstance(data["input"], int) else (kwargs, data["input"])
        leaf = holder[key].detach().requires_grad_(True)
        holder[key] = leaf.clone()
    runner = module
    if backend == "ortmodule":
        os.environ.setdefault("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")  # a failure must not run PyTorch
        from onnxruntime.training.ortmodule import DebugOptions, LogLevel, ORTModule

        runner = ORTModule(module, DebugOptions(log_level=LogLevel.WARNING))
    elif backend == "compile":
        settings = dict(CASE.get("compile") or {})
        budget = settings.pop("memory_budget", None)
        if budget is not None:
            from torch._functorch import config

            config.activation_memory_budget = budget
        runner = torch.compile(module, **settings)
    torch.manual_seed(0)
    outputs = tensors(runner(*args, **kwargs))
    pairs = [(o, g) for o, g in zip(outputs, data["grad_outputs"], strict=True) if g is not None and o.requires_grad]
    torch.autograd.backward([o for o, _ in pairs], [g.to(o.dtype) for o, g in pairs])
    grads = {n: p.grad for n, p in module.named_parameters() if p.requires_grad}
    if leaf is not None:
        grads["<input>"] = leaf.grad
    return grads


def judge(name, ort, pytorch, exact):
    if ort is None or pytorch is None:
        return name, math.nan, math.nan, math.nan, (ort is None) != (pytorch is None)
    exact = exact.double()
    candidate = float((ort.double() - exact).norm())
    reference = float((pytorch.double() - exact).norm())
    allowed = CASE["factor"] * reference + CASE["relative_floor"] * float(exact.norm()) + \
        CASE["absolute_floor"] * CASE["scale"]
    return name, candidate, reference, allowed, not math.isfinite(candidate) or candidate > allowed


def main():
    print(f"{CASE['class']} ({CASE['where']}): {CASE['origin']}")
    try:
        cls = import_modules()
        module, data = load(cls)
        exact = step(module, data, torch.float64)
        pytorch = step(module, data, torch.float32)
        ort = step(module, data, torch.float32, CASE.get("backend", "ortmodule"))
    except Exception as e:
        print(f"could not run the module: {type(e).__name__}: {e}")
        return CANNOT_RUN
    rows = [judge(n, ort.get(n), pytorch[n], exact[n]) for n in exact if exact[n] is not None]
    who = WHO.get(CASE.get("backend", "ortmodule"), CASE.get("backend"))
    print(f"{'gradient':<28} {who + ' to fp64':>12} {'PyTorch to fp64':>16} {'allowed':>10}  verdict")
    for name, candidate, reference, allowed, wrong in rows:
        print(f"{name:<28} {candidate:>12.3g} {reference:>16.3g} {allowed:>10.3g}  {'WRONG' if wrong else 'ok'}")
    wrong = [r for r in rows if r[4]]
    if not wrong:
        print(f"{who}'s gradients are as close to float64 as PyTorch fp32's")
        return OK
    name, candidate, reference = max(wrong, key=lambda r: r[1] / r[3] if r[3] > 0 else math.inf)[:3]
    times = f"{candidate / reference:.3g}x" if reference > 0 else "infinitely"
    print(f"WRONG: {who}'s gradient of {name} is {times} further from float64 than PyTorch fp32's "
          f"(allowed: {CASE['factor']:g}x, plus floors)")
    return WRONG


def test_backend_gradient_matches_float64():
    assert main() == OK


if __name__ == "__main__":
    sys.exit(main())
