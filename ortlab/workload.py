"""What a burst trains: the factory protocol (model, batches, loss) and references to factories a worker can load."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortlab.errors import InputError

if TYPE_CHECKING:  # torch is imported where it is used: the CLI checks a --model before loading torch
    import torch


class WorkloadError(InputError):
    """A model factory that cannot be found, sent to a worker, or that returns the wrong thing."""


class FactoryError(WorkloadError):
    """The model factory (or the file that defines it) raised: the user's own exception in one line, its type, its
    message and the lines of the user's code it went through; `traceback` holds the whole of it. The same words in a
    worker and in this process (a worker's error adds the log that holds the traceback)."""

    def __init__(self, message: str, traceback: str = "", cli: str | None = None):
        super().__init__(message, cli=cli)
        self.traceback = traceback

    @classmethod
    def of(cls, what: str, e: BaseException) -> FactoryError:
        """`what` ("model factory x.py:make") raised `e`: the error, with the traceback and the CLI's pointer to it."""
        import traceback

        from ortlab.common.readable import sentence

        frames = [f"{_short(f.filename)}:{f.lineno} in {f.name}" for f in reversed(traceback.extract_tb(
            e.__traceback__)) if _users(f.filename)]
        where = f" at {frames[0]}" + (f", called from {', '.join(frames[1:3])}" if len(frames) > 1 else "") \
            if frames else ""
        message = f"{what} raised {type(e).__name__}: {sentence(str(e)) or '(no message)'}{where}"
        return cls(message, "".join(traceback.format_exception(e)),
                   f"{message}; the whole traceback: ORTLAB_TRACEBACK=1 prints it")


def _users(filename: str) -> bool:
    """Whether a traceback's frame is the user's code: not Python's own library, an installed package or ortlab's
    engine (ortlab's demo models count as a user's)."""
    import sysconfig

    if filename.startswith("<frozen"):
        return False
    path = str(Path(filename).resolve())
    libraries = {sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    own = str(Path(__file__).resolve().parent)
    if path.startswith(own) and not path.startswith(str(Path(own, "demo"))):
        return False
    return not any(path.startswith(str(Path(lib).resolve())) for lib in libraries if lib)


def _short(filename: str) -> str:
    from ortlab.common.readable import short_path

    return short_path(filename)


# modules that turn what a trainer library made into a Workload, each with `accepts(made) -> bool` (without
# importing the library: a factory that did not use it has not imported it) and `workload(made, origin)`
ADAPTERS: tuple[str, ...] = ("ortlab.integrations.trainer", "ortlab.integrations.lightning")


@dataclass
class Workload:
    """The factory protocol: a factory returns one of these (or a `(model, batch, loss)` tuple).

    - `model`: a `torch.nn.Module`, freshly initialised (ortlab seeds torch before calling the factory).
    - `batch(step)`: the inputs and target of training step `step`, as `(inputs, target)`. `inputs` is a
      tensor, a tuple of positional arguments, or a dict of keyword arguments. It must be deterministic in
      `step`, so that a PyTorch burst and an ORTModule burst see the same data.
    - `loss(outputs, target)`: a scalar tensor.

    Or, instead of `batch` (pass `batch=None`), samples that ortlab batches itself, so that a burst of several
    ranks can choose a sampler (`sampler="distributed"|"load_balancing"`) and report each rank's load:

    - `dataset`: a sequence of samples (`len()` and `dataset[i]`, deterministic in `i`).
    - `collate(samples)`: a list of samples -> `(inputs, target)` as `batch` returns (e.g. padded to the longest).
    - `complexity(sample)`: a whole number, the work a sample costs (e.g. its sequence length); optional, needed
      by the load-balancing sampler and for the load figures.
    - `batch_size`: samples per step. Without a sampler, step k trains on samples k * batch_size onwards, in order
      (wrapping around), so `batch(step)` still works everywhere.

    A workload taken from a trainer (a Hugging Face `Trainer`, a LightningModule) also brings the pieces of its
    training step, so that every backend and the float64 reference train exactly what that trainer computes:

    - `step_loss(runner, inputs, target)`: the loss to backward, in place of `loss(runner(inputs), target)` (a
      Trainer's `compute_loss`, a LightningModule's `training_step`); `runner` is the module the backend trains
      (the model, its ORTModule, its compiled module), its parameters the model's. Scaled as the trainer
      backwards it (divided by `accumulation` where the trainer does).
    - `optimizer(model)`: `(optimizer, scheduler or None)` over `model`'s parameters (the model itself, or its
      float64 copy for the reference burst). Used unless a burst names an optimizer (`optimizer="auto"`, the
      default, takes it); the scheduler steps after each optimizer step.
    - `accumulation`: micro-batches per optimizer step: step k trains on `batch(k * accumulation + j)`, each
      backwarded, and its row's loss is their losses' sum (what the trainer logs).
    - `clip_grad_norm`: the gradients' total norm clipped to this before each optimizer step (None: not).
    """

    model: torch.nn.Module
    batch: Callable[[int], tuple[Any, Any]] | None
    loss: Callable[[Any, Any], torch.Tensor] | None
    name: str = ""
    batch_size: int | None = None  # samples per step, for samples/s
    dataset: Sequence[Any] | None = None
    collate: Callable[[list[Any]], tuple[Any, Any]] | None = None
    complexity: Callable[[Any], int] | None = None
    step_loss: Callable[[Any, Any, Any], torch.Tensor] | None = None
    optimizer: Callable[[Any], tuple[Any, Any]] | None = None
    accumulation: int = 1
    clip_grad_norm: float | None = None
    # the modules strategy fsdp2 shards one by one, by name (None: each direct child holding parameters, a
    # container's items in its place: ortlab.engine.sharding)
    blocks: tuple[str, ...] | None = None

    def __post_init__(self):
        if not isinstance(self.accumulation, int) or isinstance(self.accumulation, bool) or self.accumulation < 1:
            raise WorkloadError(f"a Workload's accumulation must be a whole number >= 1, not {self.accumulation!r}")
        if self.clip_grad_norm is not None and not (isinstance(self.clip_grad_norm, int | float)
                                                    and self.clip_grad_norm > 0):
            raise WorkloadError(f"a Workload's clip_grad_norm must be a number > 0 or None, not "
                                f"{self.clip_grad_norm!r}")
        if self.loss is None and self.step_loss is None:
            raise WorkloadError("a Workload needs loss(outputs, target) or step_loss(runner, inputs, target)")
        if self.dataset is None:
            if self.batch is None:
                raise WorkloadError("a Workload needs batch(step), or a dataset with collate and batch_size")
            return
        if self.collate is None or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise WorkloadError("a Workload with a dataset needs collate(samples) and batch_size (a whole number "
                                ">= 1)")
        if len(self.dataset) < 1:
            raise WorkloadError("a Workload's dataset is empty")
        if self.batch is None:
            self.batch = self.dataset_batch

    def step_indices(self, k: int) -> list[int]:
        """The dataset indices of batch k in order: k * batch_size onwards, wrapping around."""
        n = len(self.dataset)
        return [(k * self.batch_size + j) % n for j in range(self.batch_size)]

    def dataset_batch(self, k: int) -> tuple[Any, Any]:
        """The batch of step `k` from `dataset` (the samples `step_indices(k)` picks, collated)."""
        return self.collate([self.dataset[i] for i in self.step_indices(k)])

    @property
    def own_step(self) -> bool:
        """Whether the workload brings pieces of its training step (its loss step, optimizer, accumulation or
        clipping) rather than the plain protocol's."""
        return (self.step_loss is not None or self.optimizer is not None or self.accumulation > 1
                or self.clip_grad_norm is not None)

    def micro_batches(self, batch: Callable[[int], tuple[Any, Any]], step: int) -> list[tuple[Any, Any]]:
        """The `(inputs, target)` pairs optimizer step `step` trains on, from `batch` (the workload's, or a
        burst's feed): `accumulation` of them."""
        return [batch(step * self.accumulation + j) for j in range(self.accumulation)]

    def forward_loss(self, runner: Any, inputs: Any, target: Any) -> torch.Tensor:
        """One micro-batch's loss through `runner`: `step_loss`, or the model's outputs given to `loss`; a
        WorkloadError when `step_loss` gives no tensor (a trainer step that computed no loss)."""
        if self.step_loss is None:
            return self.loss(call_model(runner, inputs), target)
        import torch

        loss = self.step_loss(runner, inputs, target)
        if not isinstance(loss, torch.Tensor):
            raise WorkloadError(f"the workload's step_loss returned {type(loss).__name__}, not the loss tensor to "
                                "backward")
        return loss

    def backward(self, runner: Any, batches: list[tuple[Any, Any]], cast: Callable[[Any], Any] = lambda v: v
                 ) -> float:
        """The step's loss as a row shows it (the sum of its micro-batches'), after the forward and backward of
        every micro-batch through `runner` (inputs and targets through `cast`, e.g. to float64), gradients
        accumulating."""
        total = 0.0
        for inputs, target in batches:
            loss = self.forward_loss(runner, cast(inputs), cast(target))
            loss.backward()
            total += float(loss.detach())
        return total

    def optimizer_step(self, model: Any, optimizer: Any, scheduler: Any, scaler: Any = None) -> None:
        """After a step's backward: clip (`clip_grad_norm`), the optimizer's step, the scheduler's, gradients
        cleared."""
        import torch

        if self.clip_grad_norm is not None:
            if scaler is not None:
                scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), self.clip_grad_norm)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        if scheduler is not None:
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)

    @classmethod
    def coerce(cls, made: Any, origin: str) -> Workload:
        """The Workload a factory made (a Workload, a `(model, batch, loss)` tuple, or what an adapter of
        `ADAPTERS` reads: a trainer not yet trained); else WorkloadError naming `origin`."""
        if isinstance(made, Workload):
            return made
        if isinstance(made, tuple) and len(made) == 3:
            return cls(*made)
        for name in ADAPTERS:
            adapter = importlib.import_module(name)
            if adapter.accepts(made):
                return adapter.workload(made, origin)
        raise WorkloadError(
            f"model factory {origin} returned {type(made).__name__}; it must return "
            "ortlab.Workload(model, batch, loss), "
            "a (model, batch, loss) tuple or a trainer ortlab reads (transformers.Trainer)"
        )

    def describe(self) -> dict[str, Any]:
        """What the workload is, as a dict: name, model class, parameter counts, batch size."""
        params = sum(p.numel() for p in self.model.parameters())
        trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        return {"name": self.name or type(self.model).__name__, "class": type(self.model).__qualname__,
                "parameters": params, "trainable_parameters": trainable, "batch_size": self.batch_size,
                **({"dataset_size": len(self.dataset)} if self.dataset is not None else {}),
                **({"accumulation": self.accumulation, "clip_grad_norm": self.clip_grad_norm,
                    "own_loss": self.step_loss is not None, "own_optimizer": self.optimizer is not None}
                   if self.own_step else {})}


@dataclass(frozen=True)
class ModelRef:
    """A model factory a worker process can load: `module:callable`, `path.py:callable`, or a pickled callable.

    The `key` names the factory and its arguments: a worker built for one key serves bursts of that key only.
    """

    kind: str  # "import", "file" or "pickle"
    target: str | bytes
    kwargs: tuple[tuple[str, Any], ...] = field(default=())
    label: str = ""

    @classmethod
    def of(cls, factory: str | Callable | ModelRef | None = None, **kwargs: Any) -> ModelRef:
        if isinstance(factory, ModelRef):
            if not kwargs:
                return factory
            return cls(factory.kind, factory.target, tuple(sorted(kwargs.items())), factory.label)
        frozen = tuple(sorted(kwargs.items()))
        if factory is None:
            return cls("import", "ortlab.demo:gpt", frozen, "ortlab.demo:gpt")
        if isinstance(factory, str):
            module, sep, name = factory.rpartition(":")
            if not sep or not module or not name:
                raise WorkloadError(
                    f"model {factory!r} is not 'module:callable' or 'path/to/file.py:callable' "
                    "(for example ortlab.demo:gpt or ./my_model.py:make)"
                )
            if module.endswith(".py"):
                path = Path(module).expanduser().resolve()
                if not path.is_file():
                    raise WorkloadError(f"model file {module!r} does not exist (looked for {path}); a model is "
                                        "'path/to/file.py:callable' or 'module:callable'",
                                        cli=f"model file {module!r} does not exist (from --model {factory!r})")
                return cls("file", f"{path}:{name}", frozen, factory)
            return cls("import", factory, frozen, factory)
        if callable(factory):
            import cloudpickle

            label = getattr(factory, "__qualname__", repr(factory))
            try:
                payload = cloudpickle.dumps(factory)
            except Exception as e:
                raise WorkloadError(
                    f"model factory {label} cannot be sent to the worker process ({type(e).__name__}: {e}). "
                    "Make it self-contained: build everything inside the function instead of capturing open files, "
                    "locks or GPU tensors from the notebook, or put it in a .py file and pass 'file.py:name', or "
                    "run in-process with in_process=True."
                ) from e
            return cls("pickle", payload, frozen, label)
        raise WorkloadError(f"model must be a 'module:callable' string or a callable, not {type(factory).__name__}")

    @property
    def key(self) -> tuple:
        return (self.kind, self.target, self.kwargs)

    def to_dict(self) -> dict[str, Any] | None:
        """The reference as JSON a run keeps, to build the model again (`ortlab repro`); None for a pickled
        callable or arguments JSON cannot hold."""
        import json

        if self.kind == "pickle":
            return None
        try:
            json.dumps(dict(self.kwargs), allow_nan=False)
        except (TypeError, ValueError):
            return None
        return {"kind": self.kind, "target": self.target, "kwargs": dict(self.kwargs), "label": self.label}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelRef:
        """The reference `to_dict` wrote."""
        return cls(d["kind"], d["target"], tuple(sorted(d.get("kwargs", {}).items())), d.get("label", ""))

    def describe(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs)
        return f"{self.label}({args})" if args else self.label

    def load(self) -> Callable[..., Any]:
        if self.kind == "pickle":
            import cloudpickle

            return cloudpickle.loads(self.target)
        module_name, _, attr = str(self.target).rpartition(":")
        if self.kind == "file":
            path = Path(module_name)
            mod_name = f"ortlab_user_{path.stem}"
            spec = importlib.util.spec_from_file_location(mod_name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[mod_name] = module
            try:
                spec.loader.exec_module(module)
            except Exception as e:
                raise FactoryError.of(f"model file {path.name}", e) from e
        else:
            try:
                module = importlib.import_module(module_name)
            except ImportError as e:
                raise WorkloadError(f"model module {module_name!r} cannot be imported: {e}") from e
            except Exception as e:
                raise FactoryError.of(f"model module {module_name}", e) from e
        try:
            return getattr(module, attr)
        except AttributeError:
            names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
            raise WorkloadError(f"{module_name!r} has no {attr!r}; callables there: "
                                f"{', '.join(sorted(names)[:12])}") from None

    def build(self) -> Workload:
        factory = self.load()
        kwargs = dict(self.kwargs)
        try:
            inspect.signature(factory).bind(**kwargs)
        except TypeError as e:
            raise WorkloadError(f"model factory {self.describe()} does not take these arguments: {e}") from None
        except ValueError:
            pass  # builtins without a signature
        try:
            made = factory(**kwargs)
        except SystemExit as e:  # a factory (or a script it runs) that exits must not end ortlab's process
            raise WorkloadError(f"model factory {self.describe()} called sys.exit({e.code!r}) instead of returning "
                                "a model") from None
        except InputError:
            raise
        except Exception as e:  # the user's own bug: said as theirs, with their lines (not as ortlab's)
            raise FactoryError.of(f"model factory {self.describe()}", e) from e
        return Workload.coerce(made, self.describe())


def to_device(value: Any, device: torch.device) -> Any:
    """Move every tensor in a nested structure of tuples, lists and dicts to `device`."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, Mapping):
        return type(value)({k: to_device(v, device) for k, v in value.items()}) if isinstance(value, dict) else {
            k: to_device(v, device) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return type(value)(to_device(v, device) for v in value)
    return value


def call_arguments(inputs: Any) -> tuple[tuple, dict]:
    """A batch's inputs as the positional and keyword arguments the model takes them as: a mapping by name, a tuple
    or list in order, anything else as the one argument."""
    if isinstance(inputs, Mapping):
        return (), dict(inputs)
    if isinstance(inputs, tuple | list):
        return tuple(inputs), {}
    return (inputs,), {}


def call_model(model: torch.nn.Module, inputs: Any) -> Any:
    args, kwargs = call_arguments(inputs)
    return model(*args, **kwargs)
