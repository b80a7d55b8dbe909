"""`ortlab.hf.RecordCallback` (documented there): a Hugging Face `Trainer.train()` recorded as a run folder
through `recorder.Recorder`, one row per optimizer step with the Trainer's own logged loss."""

from __future__ import annotations

import atexit
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from ortlab.integrations.recorder import Recorder, checked_collect
from ortlab.runs.run import RunStatus

# what the run keeps of the Trainer's arguments (meta.json "trainer")
ARGUMENTS = ("learning_rate", "weight_decay", "warmup_steps", "warmup_ratio", "lr_scheduler_type", "max_steps",
             "num_train_epochs", "per_device_train_batch_size", "gradient_accumulation_steps", "max_grad_norm",
             "logging_steps", "seed", "optim")


class RecordCallback(TrainerCallback):
    """Records `trainer.train()` into a run folder under `out` (`path` once training started; see the module
    docstring). `collect`: {"stats": {...}, "time": {...}} as `ortlab.record` takes them."""

    def __init__(self, out: str | Path = "runs", collect: dict[str, dict] | None = None, name: str | None = None):
        self.out, self.collect, self.name = out, checked_collect(collect), name
        # A Trainer tells its callbacks nothing of an exception: the run ends "failed" when the next train() begins
        # or the process ends first
        self.recorder: Recorder | None = None
        self.path: Path | None = None
        self._waiting: int | None = None  # the step whose row waits for the Trainer's log of its loss

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._close(RunStatus.FAILED, "a new train() began before the last one ended")
        if not state.is_world_process_zero:  # several processes: the first records, as the Trainer logs
            return
        trainer = {k: _plain(getattr(args, k, None)) for k in ARGUMENTS}
        self.recorder = Recorder(model, self.out, self.collect, self.name,
                                 batch_size=args.per_device_train_batch_size * args.gradient_accumulation_steps,
                                 origin="transformers.Trainer", meta={"trainer": trainer})
        self.recorder.__enter__()
        self.path = self.recorder.path
        atexit.register(self._at_exit)  # an exception in train() reaches no callback: a script's ends the process

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._flush()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.recorder is None:
            return
        if control.should_log:  # the Trainer logs this step's loss next (on_log)
            self._waiting = state.global_step
        else:
            self.recorder.step()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        if self.recorder is None or self._waiting != state.global_step or "loss" not in (logs or {}):
            return
        self._waiting = None
        self.recorder.step(loss=logs["loss"], **{k: logs[k] for k in ("grad_norm", "learning_rate") if k in logs})

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._flush()
        self._close(RunStatus.OK)

    def _flush(self) -> None:
        if self.recorder is not None and self._waiting is not None:
            self._waiting = None
            self.recorder.step()

    def _at_exit(self) -> None:
        self._close(RunStatus.FAILED, f"the process ended during train() after {self.recorder.steps} steps (an "
                    "exception in train() reaches no callback)")

    def _close(self, status: str, why: str = "") -> None:
        if self.recorder is None:
            return
        atexit.unregister(self._at_exit)
        recorder, self.recorder = self.recorder, None
        error = RuntimeError(why) if status != RunStatus.OK else None
        recorder.__exit__(None if error is None else RuntimeError, error, None)


def _plain(value: Any) -> Any:
    """An argument as JSON keeps it (enums as their value)."""
    value = getattr(value, "value", value)
    return value if value is None or isinstance(value, bool | int | float | str) else str(value)
