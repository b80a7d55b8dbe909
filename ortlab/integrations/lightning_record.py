"""`ortlab.lightning.RecordCallback` (documented there): a Lightning `Trainer.fit()` recorded as a run folder
through `recorder.Recorder`, one row per optimizer step, through the LightningModule's `ortlab.wrap`ped ORTModule
when it has one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch import Callback

from ortlab.integrations.recorder import Recorder, checked_collect
from ortlab.runs.run import RunStatus

try:  # the same package under its older name, so that its Trainer accepts the callback too
    from pytorch_lightning import Callback as _OlderCallback
except ImportError:  # pragma: no cover - not installed
    _OlderCallback = object


class _Recording:
    def __init__(self, out: str | Path = "runs", collect: dict[str, dict] | None = None, name: str | None = None):
        self.out, self.collect, self.name = out, checked_collect(collect), name
        self.recorder: Recorder | None = None
        self.path: Path | None = None
        self._steps = 0  # the trainer's optimizer steps when the last row was written
        self._loss: Any = None  # this optimizer step's micro-batch losses, summed (each is loss / accumulation)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._close(RunStatus.FAILED, "a new fit() began before the last one ended")
        if not trainer.is_global_zero:  # several processes: the first records, as Lightning logs
            return
        model = _ortmodule_in(pl_module) or pl_module
        accumulate = int(getattr(trainer, "accumulate_grad_batches", 1) or 1)
        loader = getattr(trainer, "train_dataloader", None)
        size = getattr(loader, "batch_size", None)
        self.recorder = Recorder(model, self.out, self.collect, self.name,
                                 batch_size=size * accumulate if isinstance(size, int) else None,
                                 origin=f"{type(trainer).__module__.partition('.')[0]}.Trainer",
                                 meta={"trainer": {"max_steps": trainer.max_steps, "max_epochs": trainer.max_epochs,
                                                   "accumulate_grad_batches": accumulate,
                                                   "gradient_clip_val": trainer.gradient_clip_val,
                                                   "module": type(pl_module).__qualname__}})
        self.recorder.__enter__()
        self.path = self.recorder.path
        self._steps, self._loss = trainer.global_step, None

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.recorder is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None and hasattr(loss, "detach"):
            self._loss = loss.detach() if self._loss is None else self._loss + loss.detach()
        if trainer.global_step != self._steps:  # the optimizer stepped in this batch
            self._steps, loss, self._loss = trainer.global_step, self._loss, None
            self.recorder.step(loss=loss)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._close(RunStatus.OK)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._close(RunStatus.FAILED, exception)

    def _close(self, status: str, error: Any = None) -> None:
        if self.recorder is None:
            return
        recorder, self.recorder = self.recorder, None
        if status == RunStatus.OK:
            recorder.__exit__(None, None, None)
            return
        error = error if isinstance(error, BaseException) else RuntimeError(str(error))
        recorder.__exit__(type(error), error, None)


class RecordCallback(_Recording, Callback, *(() if _OlderCallback is object else (_OlderCallback,))):
    """Records `trainer.fit()` into a run folder under `out` (`path` once training started; see the module
    docstring). `collect`: {"stats": {...}, "time": {...}} as `ortlab.record` takes them."""


def _ortmodule_in(module: Any) -> Any:
    """The one ORTModule inside a LightningModule (None: none, or several)."""
    from ortlab import _ort

    found, todo = [], list(module.children())
    while todo:
        child = todo.pop()
        if _ort.is_ortmodule(child):
            found.append(child)
        else:
            todo.extend(child.children())
    return found[0] if len(found) == 1 else None
