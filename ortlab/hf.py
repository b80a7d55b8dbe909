"""Hugging Face: `RecordCallback` records a real `Trainer.train()` as a run folder, the way `ortlab.record` records a
loop (per-step loss, step time, memory, the collectors "stats" and "time"), so that `ortlab runs`, `diff`, `time`,
the Lab and the notebooks read it. For example:

    trainer = Trainer(model=ortlab.wrap(model), args=args, train_dataset=data,
                      callbacks=[ortlab.hf.RecordCallback(out="runs")])

One row per optimizer step (gradient accumulation: the micro-batches of a step are one row). The loss is the
Trainer's own logged loss (what `trainer.state.log_history` holds; with `logging_steps=1`, every step's, else the
logged steps' interval means and the other rows without one), with its grad_norm and learning_rate. The callback
only observes: it reads what the Trainer hands every callback and changes none of it.
"""

from ortlab.integrations.hf_record import RecordCallback

__all__ = ["RecordCallback"]
