"""`ortlab.wrap`: a model in ORTModule for the user's own training (a transformers Trainer, a LightningModule, a
loop under DDP), with ortlab's options and compatibility fixes, and no silent PyTorch run.

    model = ortlab.wrap(model)                       # fixes="auto": what `ortlab check` recommends
    Trainer(model=model, ...).train()                # or DDP(ortlab.wrap(model)): ORTModule inside DDP

A burst applies its fixes for the burst and undoes them after; a wrapped model lives as long as the user keeps it,
so its fixes are applied around each of its forwards instead (ORT exports, and exports again, only inside one) and
never reach another model of the process. Its options are set in the environment at construction, and those ORT reads
at export around each forward. Fallback is disabled: a failure raises `OrtModuleFailed` with ortlab's one-line reason.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortlab import _ort
from ortlab.common import held
from ortlab.compat import registry
from ortlab.errors import InputError, OrtlabError
from ortlab.options import SPECS, Options, ReadAt

ATTRIBUTE = "ortlab_wrap"  # the WrapInfo a wrapped model carries (in its ORTModule's own __dict__)
NOT_CARRIED = ("graph-per-value",)  # engine fixes a wrapped model cannot carry out: a graph per value is a burst's
_ORT_FAILURES = (_ort.OrtInternalsError, _ort.GradientBuildError)  # ortlab's errors that are ORT failing


class WrapError(InputError):
    """A model or an argument `ortlab.wrap` cannot take, or a fix it cannot carry out."""


class OrtModuleFailed(OrtlabError):
    """ORTModule failed on a wrapped model (export, graph building, a step), or `check` found what it cannot train:
    the reason in one line; the original exception is its cause."""


@dataclass
class WrapInfo:
    """What ortlab.wrap applied: the options ORT runs with, the fixes asked and applied, and what the check found
    (fixes="auto"); `pending` until a deferred check has run on the first forward's inputs."""

    options: Options
    asked: str | tuple[str, ...]
    fixes: tuple[str, ...] = ()
    found: list[dict[str, Any]] = field(default_factory=list)
    pending: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The run's "fixes" record (as a burst writes it) and the options."""
        return {"asked": self.asked if isinstance(self.asked, str) else list(self.asked),
                "applied": list(self.fixes), "found": self.found, "options": self.options.to_dict()}


def wrap(model: Any, options: Options | Mapping[str, Any] | list[str] | str | None = None, fixes: Any = "auto",
         example: Any = None) -> Any:
    """Returns `model` in an ORTModule with `options` (over the ORTMODULE_* variables already set) and `fixes`
    ("auto": the ones `ortlab check` recommends; "none"; or fix names), fallback to PyTorch disabled. With
    fixes="auto" the check runs once, on `example` (the model's inputs: a tensor, a tuple of arguments or a dict of
    keyword arguments) now, or without it on the first forward's inputs. Wrap before DDP, never after."""
    import torch

    chosen = _options(options)  # first: options read at import are set before anything imports ORTModule
    _refuse(model, torch)
    asked = registry.parse(fixes)
    if asked != registry.AUTO:
        _carried(asked)
    info = WrapInfo(chosen, asked, () if asked == registry.AUTO else tuple(asked), pending=asked == registry.AUTO)
    if info.pending and example is not None:
        _resolve(model, info, example if isinstance(example, Mapping | tuple | list) else (example,), {})
    from ortlab.engine.wrapper import build_ortmodule

    # where ORT saves the stage graphs when asked (a recorder copies them into its run folder)
    onnx_dir = Path(chosen["save_onnx_path"] or (tempfile.mkdtemp(prefix="ortlab-onnx-") if chosen["save_onnx"]
                                                 else tempfile.gettempdir()))
    with held.held(streams=True, show=_shows_ort(chosen)):  # torch's CUDA search on ORT's import: the run's log
        import onnxruntime.training.ortmodule  # noqa: F401
    with chosen.applied():
        try:
            wrapped = build_ortmodule(model, chosen, onnx_dir)
        except Exception as e:
            raise OrtModuleFailed(_reason(e, "construction")) from e
    if not _ort.is_ortmodule(wrapped):
        raise OrtModuleFailed(f"ORTModule construction gave {type(wrapped).__name__}")
    forward = wrapped.forward  # ORT's per-instance forward (it carries the model's signature)
    # the signature a Trainer reads to keep a batch's columns: a PEFT model's forward takes (*args, **kwargs), its
    # base model's names them
    named = model.get_base_model().forward if callable(getattr(model, "get_base_model", None)) else forward
    wrapped.__dict__["forward"] = functools.wraps(named)(functools.partial(_guarded, wrapped, forward, info))
    wrapped.__dict__[ATTRIBUTE] = info
    return wrapped


def info_of(model: Any) -> WrapInfo | None:
    """What ortlab.wrap applied to `model` (None: not wrapped by it)."""
    found = getattr(model, "__dict__", {}).get(ATTRIBUTE)
    return found if isinstance(found, WrapInfo) else None


def _refuse(model: Any, torch: Any) -> None:
    from ortlab._dynamo import compiled_inner

    if _ort.is_ortmodule(model):
        raise WrapError("model is already an ORTModule; pass the torch.nn.Module inside it (ortlab.wrap(model))")
    if isinstance(model, torch.nn.parallel.DistributedDataParallel | torch.nn.DataParallel):
        raise WrapError(f"model is a {type(model).__name__}; ORT requires ORTModule inside DDP: "
                        "DDP(ortlab.wrap(model)), not ortlab.wrap(DDP(model))")
    if not isinstance(model, torch.nn.Module):
        raise WrapError(f"model {type(model).__name__} is not allowed; allowed: a torch.nn.Module")
    if compiled_inner(model) is not None:
        raise WrapError("model is a torch.compile'd module; pass the module itself (ORTModule replaces the "
                        "compiler)")


def _options(given: Any) -> Options:
    """The options ORT runs with: the environment's under `given`, fallback disabled. Options read at import are
    set now when onnxruntime's ORTModule is not imported yet, and refused when they would differ from it."""
    import os

    chosen = Options.from_environ().overlaid(given)
    if chosen["fallback_policy"] not in ("DEFAULT", "FALLBACK_DISABLE"):
        raise WrapError(f"fallback_policy {chosen['fallback_policy']} is not allowed: ortlab.wrap never runs the "
                        "model on PyTorch silently (a failure raises OrtModuleFailed)")
    chosen = chosen.replace(fallback_policy="FALLBACK_DISABLE")
    imported = "onnxruntime.training.ortmodule" in sys.modules
    now = Options.from_environ()
    for name in sorted(k for k, s in SPECS.items() if s.read_at is ReadAt.IMPORT and s.env):
        if chosen[name] == now[name]:
            continue
        if imported:
            raise WrapError(f"option {name} is read when onnxruntime is imported, which this process already did: "
                            f"set {SPECS[name].env} before Python starts (Options.export_lines())")
        os.environ[SPECS[name].env] = SPECS[name].to_env(chosen[name])
    return chosen


def _carried(names: tuple[str, ...] | list[str]) -> None:
    for name in names:
        if name in NOT_CARRIED:
            raise WrapError(f"fix {name} needs ortlab's bursts (a graph per value of a baked-in argument); a wrapped "
                            "model cannot carry it out: keep that argument the same in every step")


def _resolve(module: Any, info: WrapInfo, args: Any, kwargs: dict[str, Any]) -> None:
    """fixes="auto": `ortlab check` on these inputs (the model's state and mode unchanged after); its fixes become
    the wrap's, and what no fix removes raises, named."""
    from ortlab.compat.check import check
    from ortlab.workload import Workload

    inputs = _as_inputs(module, args, kwargs)
    training = module.training
    try:  # the check's exports warn what the wrapped model's own export warns again: said once
        with info.options.replace(fallback_policy="DEFAULT").applied(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = check(Workload(module, lambda step: (inputs, None), _own_loss, name=type(module).__name__),
                           registry.AUTO, info.options["onnx_opset_version"])
    finally:
        module.train(training)
    info.fixes, info.found, info.pending = tuple(report.fixes), [b.to_dict() for b in report.blockers], False
    _carried(info.fixes)
    if report.status not in ("ok", "fixed"):
        first = f": {report.remaining[0].line()}" if report.remaining else ""
        raise OrtModuleFailed(f"ortlab check: {report.verdict}{first} (`ortlab check` lists every blocker)")


def _as_inputs(module: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """A forward's arguments as a workload's inputs: a dict of keyword arguments or a tuple of positional ones."""
    if isinstance(args, Mapping):
        return dict(args)
    if not kwargs:
        return tuple(args)
    if not args:
        return dict(kwargs)
    import inspect

    try:
        return dict(inspect.signature(module.forward).bind(*args, **kwargs).arguments)
    except TypeError as e:
        raise WrapError(f"the forward's arguments cannot be named for the check ({e}); pass example= as a dict "
                        "of keyword arguments") from None


def _own_loss(outputs: Any, _target: Any) -> Any:
    """What the check trains with: the model's own loss (a Hugging Face output with labels), else the sum of its
    floating outputs' means (gradients reach every parameter the outputs depend on)."""
    import torch

    loss = outputs.get("loss") if isinstance(outputs, Mapping) else getattr(outputs, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    flat, _ = torch.utils._pytree.tree_flatten(outputs.to_tuple() if hasattr(outputs, "to_tuple") else outputs)
    found = [t.float().mean() for t in flat if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not found:
        raise WrapError("the model's outputs hold no floating tensor to check a training step with")
    return sum(found)


def _guarded(wrapped: Any, forward: Any, info: WrapInfo, *args: Any, **kwargs: Any) -> Any:
    """ORTModule's forward with the wrap's options and fixes applied; a failure as OrtModuleFailed; with the fixes
    pytorch-buffers or embedding-max-norm, what ORT wrote into buffers undone and a PyTorch pass without
    gradients advancing them (as a burst does)."""
    import torch

    module = _ort.inner_module(wrapped)
    quiet = held.held(show=_shows_ort(info.options))  # ORT's export messages: the run's log, not the cell
    if info.pending:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            raise WrapError("fixes=\"auto\" without example= runs ortlab check on the first forward, which a "
                            "distributed run must not do inside DDP: pass example= (or fix names) to ortlab.wrap")
        with _streams_with_descriptors(), held.held(show=_shows_ort(info.options)):
            _resolve(module, info, args, kwargs)
    passing = bool(set(registry.PYTORCH_PASS) & set(info.fixes)) and module.training and torch.is_grad_enabled()
    with _export_environment(info.options), registry.applied(module, info.fixes), _streams_with_descriptors(), \
            quiet:
        kept = [(b, b.detach().clone()) for b in module.buffers()] if passing else None
        try:
            out = forward(*args, **kwargs)
        except OrtlabError as e:
            if isinstance(e, _ORT_FAILURES):  # ORT's own failure, though ortlab named it: ORTModule failed
                raise OrtModuleFailed(_reason(e, "forward")) from e
            raise
        except Exception as e:
            raise OrtModuleFailed(_reason(e, "forward")) from e
        error = _ort.Wrap(wrapped, module.training).fallback()
        if error is not None:  # FALLBACK_DISABLE makes ORT raise; never let a fallback pass as ORT's run
            raise OrtModuleFailed(_reason(error, "forward")) from error
        if kept is not None:
            with torch.no_grad():
                for buffer, saved in kept:
                    buffer.copy_(saved)
                module(*args, **kwargs)
    return out


@contextlib.contextmanager
def _export_environment(options: Options) -> Any:
    """The variables of the options ORT reads when it exports, as `options` has them, for one forward (it read the
    others at construction, under Options.applied); none is touched when the environment says the same already."""
    import os

    changed = {}
    for spec in _EXPORT_READ:
        wanted = options[spec.name]
        current = os.environ.get(spec.env)
        if (spec.default if current is None else spec.parse(current)) != wanted:
            changed[spec.env] = current
            os.environ[spec.env] = spec.to_env(wanted)
    try:
        yield
    finally:
        for name, old in changed.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


_EXPORT_READ = tuple(spec for spec in SPECS.values() if spec.read_at is ReadAt.EXPORT and spec.env)


def _streams_with_descriptors() -> contextlib.ExitStack:
    """ORT silences its export by duplicating the file descriptors of sys.stdout and sys.stderr; a Jupyter kernel
    that does not capture them (ipykernel under pytest, some front ends) has streams without one, and the export
    fails. Such a stream is replaced by the process's own (sys.__stdout__) for the forward."""
    stack = contextlib.ExitStack()
    for stream, redirect in ((sys.stdout, contextlib.redirect_stdout), (sys.stderr, contextlib.redirect_stderr)):
        try:
            stream.fileno()
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both of the last two
            real = sys.__stdout__ if redirect is contextlib.redirect_stdout else sys.__stderr__
            if real is not None:
                stack.enter_context(redirect(real))
    return stack


def _shows_ort(options: Options) -> bool:
    """ORT's messages were asked for: its log level below WARNING (ortlab.common.held keeps them out of the cell
    otherwise)."""
    return options["log_level"] in ("INFO", "DEVINFO", "VERBOSE")


def _reason(error: BaseException, stage: str) -> str:
    from ortlab.compat.errors import failure_stage, root_message

    return f"ORTModule failed in {failure_stage(error) or stage}: {root_message(error)}"
