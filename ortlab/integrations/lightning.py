"""A LightningModule with its data as a Workload (an adapter of `ortlab.workload.ADAPTERS`), so that a factory may
return what a Lightning user already has:

    def make():
        return Classifier(), DataLoader(data, batch_size=8)      # or (Classifier(), MyDataModule())

The module's `training_step` is the loss (through the backend's runner: the model a backend trains is the step
itself, `TrainingStep`, so that ORTModule exports the module's forward and loss as the user wrote them), its
`configure_optimizers` the optimizer (and a scheduler that steps per step; one stepping per epoch is left out: a
burst is shorter than an epoch), the batches the loader's first epoch in order. Accumulation and clipping are a
Lightning Trainer's arguments, which the factory does not return: the workload has neither. Lightning is not
imported unless the factory already did (a module that is not a LightningModule is not this adapter's).
"""

from __future__ import annotations

import re
import sys
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from ortlab.workload import Workload, WorkloadError

MODULES = ("lightning.pytorch", "pytorch_lightning")  # where LightningModule lives (the same class, two names)
NO_TRAINER = "You are trying to `self.log()` but the `self.trainer` reference is not registered"
_batch_index = [0]  # the batch_idx the running training_step is given (set per micro-batch by step_loss)


def _classes(name: str) -> tuple[type, ...]:
    return tuple(getattr(sys.modules[m], name) for m in MODULES if m in sys.modules and hasattr(sys.modules[m], name))


def accepts(made: Any) -> bool:
    """A LightningModule alone (with its own train_dataloader), or with a DataLoader or a LightningDataModule."""
    modules = _classes("LightningModule")
    if not modules:
        return False
    module = made[0] if isinstance(made, tuple) and len(made) == 2 else made
    return isinstance(module, modules)


def workload(made: Any, origin: str) -> Workload:
    """The Workload of a LightningModule and its data; a module without a loss or an optimizer ortlab can train
    with gets one line naming it."""
    module, data = made if isinstance(made, tuple) else (made, None)
    if not getattr(module, "automatic_optimization", True):
        raise WorkloadError(f"{origin}: {type(module).__name__} optimizes manually (automatic_optimization=False); "
                            "ortlab trains LightningModules that return their loss from training_step")
    loader = _loader(module, data, origin)
    batches = _Batches(loader, origin)
    step = TrainingStep(module)
    step.train()
    first = step(batches(0)[0][0])
    if not isinstance(first, torch.Tensor) or first.dim() != 0 or not first.requires_grad:
        raise WorkloadError(f"{origin}: {type(module).__name__}.training_step returned {_shown(first)}; it must "
                            "return the loss (a scalar tensor with a gradient, or a dict with 'loss')")
    _optimizer(step, origin)  # refuses what ortlab cannot train with before a burst starts
    return Workload(step, batches, None, name=type(module).__name__, batch_size=getattr(loader, "batch_size", None),
                    step_loss=_step_loss, optimizer=lambda model: _optimizer(model, origin))


class TrainingStep(torch.nn.Module):
    """A LightningModule's training_step as a module whose forward is the loss: the model a backend trains
    (ORTModule exports it whole; the float64 reference deep-copies it with the module inside)."""

    def __init__(self, module: Any):
        super().__init__()
        self.module = module

    def forward(self, batch: Any) -> Any:
        with warnings.catch_warnings():  # self.log() has no Trainer to log to here: nothing is lost
            warnings.filterwarnings("ignore", message=re.escape(NO_TRAINER))
            out = self.module.training_step(batch, _batch_index[0])
        return out.get("loss") if isinstance(out, Mapping) else out


def _step_loss(runner: Any, inputs: Any, target: Any) -> Any:
    """The micro-batch's loss through the backend's runner (TrainingStep, its ORTModule or compiled module)."""
    _batch_index[0] = int(target)
    return runner(*inputs)


def _loader(module: Any, data: Any, origin: str) -> Any:
    """The training DataLoader: the one given, a LightningDataModule's (prepared and set up for fit), or the
    module's own train_dataloader()."""
    if data is None or isinstance(data, _classes("LightningDataModule")):
        source = data if data is not None else module
        if data is not None:
            data.prepare_data()
            data.setup("fit")
        try:
            data = source.train_dataloader()
        except Exception as e:
            raise WorkloadError(f"{origin}: {type(source).__name__}.train_dataloader() failed ({type(e).__name__}: "
                                f"{e}); return (module, DataLoader) or (module, LightningDataModule)") from None
    if not isinstance(data, torch.utils.data.DataLoader):
        raise WorkloadError(f"{origin}: the data is {type(data).__name__}; allowed: a torch DataLoader or a "
                            "LightningDataModule beside the LightningModule")
    return data


class _Batches:
    """batch(step) -> ((batch,), step): the loader's first epoch in order, read as the steps need it, wrapping
    around (the same batches for every backend of a worker)."""

    def __init__(self, loader: Any, origin: str):
        self.loader, self.origin, self.seen, self.it = loader, origin, [], None

    def __call__(self, step: int) -> tuple[Any, Any]:
        while self.it is not False and len(self.seen) <= step:
            if self.it is None:
                self.it = iter(self.loader)
            try:
                self.seen.append(next(self.it))
            except StopIteration:
                self.it = False  # the first epoch is read: later steps wrap around
        if not self.seen:
            raise WorkloadError(f"{self.origin}: the training DataLoader is empty")
        k = step % len(self.seen)
        return (self.seen[k],), k


def _optimizer(step: Any, origin: str) -> tuple[Any, Any]:
    """(optimizer, scheduler or None) from the module's configure_optimizers (over `step`'s module: the model's or
    its float64 copy's parameters)."""
    made = step.module.configure_optimizers()
    scheduler = None
    if isinstance(made, Mapping):
        made, scheduler = made.get("optimizer"), made.get("lr_scheduler")
    elif isinstance(made, list | tuple) and len(made) == 2 and isinstance(made[0], list | tuple):
        made, schedulers = made
        scheduler = schedulers[0] if len(schedulers) == 1 else schedulers or None
    if isinstance(made, list | tuple):
        made = made[0] if len(made) == 1 else made
    if not isinstance(made, torch.optim.Optimizer):
        raise WorkloadError(f"{origin}: configure_optimizers returned {_shown(made)}; ortlab trains with one "
                            "optimizer (and at most one scheduler)")
    if isinstance(scheduler, Mapping):
        scheduler = scheduler.get("scheduler") if scheduler.get("interval", "epoch") == "step" else None
    elif scheduler is not None and not isinstance(scheduler, list):
        scheduler = None  # Lightning steps a bare scheduler once per epoch: a burst is shorter than an epoch
    if isinstance(scheduler, list):
        raise WorkloadError(f"{origin}: configure_optimizers returned several schedulers; ortlab trains with at "
                            "most one")
    return made, scheduler


def _shown(value: Any) -> str:
    return "None" if value is None else type(value).__name__
