"""Bursts from a Hugging Face `transformers.Trainer`: a factory returns the Trainer it would call `train()` on, and
ortlab trains what that trainer would, through its public methods rather than a copy of its loop (a copied loop
broke with every transformers release: Optimum's ORTTrainer).

- the model: `trainer.model` (a PEFT model as it is: its frozen base stays frozen);
- the batches: the first ones of `trainer.get_train_dataloader()` (its sampler, collator and removed columns),
  drawn once with torch's random numbers seeded from `args.seed` as `train()` seeds them (one stream over the
  epochs, apart from the process's own) and kept, so every burst and backend sees the same ones;
- the loss: `trainer.compute_loss(runner, inputs, num_items_in_batch=...)`, with the token count of the whole
  optimizer step as `trainer.get_batch_samples` works it out, divided by the accumulation where the Trainer's
  `training_step` divides it;
- the optimizer and LR scheduler: `create_optimizer_and_scheduler` for the run `args` describe (learning rate,
  weight decay, warmup, scheduler type), made anew for each burst and for the float64 copy;
- `args.gradient_accumulation_steps` micro-batches per step and `args.max_grad_norm` clipping. Where the
  accumulation does not divide an epoch's batches, the Trainer's last step of the epoch takes the remainder; a
  burst's steps always take as many, running on into the next epoch (bursts are short: most stay in the first).
"""

from __future__ import annotations

import sys
from typing import Any

from ortlab.workload import Workload, WorkloadError


class TrainerError(WorkloadError):
    """A Trainer ortlab cannot burst from, said in one line: what is missing and what to pass instead."""


def accepts(made: Any) -> bool:
    """Whether a factory returned a `transformers.Trainer` (or a subclass); never imports transformers."""
    module = sys.modules.get("transformers.trainer")
    return module is not None and isinstance(made, module.Trainer)


def workload(trainer: Any, origin: str = "the model factory") -> Workload:
    """The Workload that trains what `trainer.train()` would: see the module docstring. TrainerError when the
    trainer cannot be burst from as it is."""
    args = trainer.args
    _refuse(trainer, origin)
    accumulation = int(args.gradient_accumulation_steps)
    batches = Batches(trainer, accumulation)
    scaled = not trainer.model_accepts_loss_kwargs and trainer.compute_loss_func is None  # training_step divides

    def step_loss(runner: Any, inputs: Any, num_items_in_batch: Any) -> Any:
        with trainer.compute_loss_context_manager():
            loss = trainer.compute_loss(runner, dict(inputs), num_items_in_batch=num_items_in_batch)
        if loss is None:
            raise TrainerError(f"{type(trainer).__name__}.compute_loss returned None: the model computed no loss "
                               "(are there labels in the batches?)")
        return loss / accumulation if scaled else loss

    steps = training_steps(trainer, batches.loader)

    def optimizer(model: Any) -> tuple[Any, Any]:
        return optimizer_and_scheduler(trainer, model, steps)

    model = trainer.model
    clip = float(args.max_grad_norm) if args.max_grad_norm else None
    return Workload(model, batches, None, name=f"{type(trainer).__name__} of {_model_name(model)}",
                    batch_size=args.per_device_train_batch_size, step_loss=step_loss, optimizer=optimizer,
                    accumulation=accumulation, clip_grad_norm=clip)


def _refuse(trainer: Any, origin: str) -> None:
    """TrainerError for what a burst cannot reproduce of this trainer."""
    args = trainer.args
    name = type(trainer).__name__
    if trainer.train_dataset is None:
        raise TrainerError(f"model factory {origin} returned a {name} without a train_dataset: a burst trains on "
                           f"the first batches of its train dataloader; pass {name}(train_dataset=...)")
    if trainer.state.global_step > 0:
        raise TrainerError(f"model factory {origin} returned a {name} that has trained already (global step "
                           f"{trainer.state.global_step}): return it before trainer.train()")
    if trainer.optimizer is not None or trainer.lr_scheduler is not None:
        raise TrainerError(f"model factory {origin} returned a {name} with optimizers=(...) given: a burst makes "
                           "the optimizer anew from the arguments (and for its float64 copy), so say it with "
                           "TrainingArguments(optim=..., lr_scheduler_type=...) or optimizer_cls_and_kwargs")
    if args.fp16 or args.bf16:
        raise TrainerError(f"model factory {origin} returned a {name} with {'fp16' if args.fp16 else 'bf16'}=True: "
                           "bursts from a Trainer train in fp32 (use precision='bf16', or 'fp16' on CUDA, for "
                           "mixed precision)")
    if args.world_size > 1 or args.deepspeed:
        raise TrainerError(f"model factory {origin} returned a {name} set up for several processes or DeepSpeed: "
                           "a burst from a Trainer runs in one process")


class Batches:
    """The trainer's train batches, micro-batch i as `(inputs, num_items_in_batch)`: drawn from its dataloader on
    first use and kept (a new epoch when it ends); the token count is the whole optimizer step's."""

    def __init__(self, trainer: Any, accumulation: int):
        self.trainer, self.accumulation = trainer, accumulation
        self.loader = trainer.get_train_dataloader()
        self.drawn: list[dict[str, Any]] = []
        self.counts: dict[int, Any] = {}  # optimizer step -> num_items_in_batch
        self.epoch, self._iterator, self._rng = 0, None, None

    def __call__(self, i: int) -> tuple[dict[str, Any], Any]:
        step = i // self.accumulation
        while len(self.drawn) < (step + 1) * self.accumulation:
            self._draw()
        if step not in self.counts:
            group = self.drawn[step * self.accumulation:(step + 1) * self.accumulation]
            self.counts[step] = self._count(group)
        return dict(self.drawn[i]), self.counts[step]

    def _draw(self) -> None:
        """One more batch into `drawn` (none at an epoch's end: the next call begins the next epoch), with the
        draw's own stream of torch's random numbers (seeded from args.seed) instead of the process's: the order is
        the same whoever draws, and the process's own stream is left alone."""
        import torch

        with torch.random.fork_rng(devices=[]):
            if self._rng is None:
                torch.manual_seed(self.trainer.args.seed)  # as trainer.train() seeds before its first epoch
            else:
                torch.set_rng_state(self._rng)
            if self._iterator is None:
                self._iterator = iter(self.loader)
            try:
                batch = next(self._iterator)
            except StopIteration:
                if not self.drawn:
                    raise TrainerError("the Trainer's train dataloader gives no batch (an empty train_dataset, or "
                                       "dataloader_drop_last with fewer samples than a batch)") from None
                self.epoch, self._iterator = self.epoch + 1, None  # the next epoch's order: the same stream
                self._rng = torch.get_rng_state()
                return
            self._rng = torch.get_rng_state()
        self.drawn.append({k: v for k, v in batch.items()})

    def _count(self, group: list[dict[str, Any]]) -> Any:
        """The step's num_items_in_batch as the Trainer counts it (None where its loss takes none)."""
        counter = getattr(self.trainer, "get_batch_samples", None)
        if counter is None:
            return None
        _, count = counter(iter([dict(b) for b in group]), len(group), self.trainer.args.device)
        return count


def training_steps(trainer: Any, loader: Any) -> int:
    """The optimizer steps `trainer.train()` would take (what its scheduler's warmup and decay are laid over)."""
    import math

    args = trainer.args
    if args.max_steps and args.max_steps > 0:
        return int(args.max_steps)
    try:
        per_epoch = max(len(loader) // args.gradient_accumulation_steps, 1)
    except TypeError:
        raise TrainerError("the Trainer's train dataset has no length: set TrainingArguments(max_steps=...)") from None
    return math.ceil(args.num_train_epochs * per_epoch)


def optimizer_and_scheduler(trainer: Any, model: Any, steps: int) -> tuple[Any, Any]:
    """The optimizer and scheduler `trainer` creates from its arguments, over `model` (its own model or a float64
    copy) instead of its own: the trainer is left as it was."""
    kept = trainer.model, trainer.optimizer, trainer.lr_scheduler
    trainer.model, trainer.optimizer, trainer.lr_scheduler = model, None, None
    try:
        trainer.create_optimizer_and_scheduler(num_training_steps=steps)
        return trainer.optimizer, trainer.lr_scheduler
    finally:
        trainer.model, trainer.optimizer, trainer.lr_scheduler = kept


def _model_name(model: Any) -> str:
    base = getattr(model, "get_base_model", None)
    if callable(base):  # a PEFT model: its adapter on the base model
        return f"{type(base()).__name__} with {type(model).__name__}"
    return type(model).__name__
