"""Lightning: `RecordCallback` records a real `Trainer.fit()` as a run folder, the way `ortlab.record` records a loop
(per-step loss, step time, memory, the collectors "stats" and "time"), so that `ortlab runs`, `diff`, `time`, the
Lab and the notebooks read it. For example:

    trainer = lightning.Trainer(max_steps=20, callbacks=[ortlab.lightning.RecordCallback(out="runs")])

One row per optimizer step (`accumulate_grad_batches`: the micro-batches of a step are one row); its loss is what
`training_step` returned, the mean over the step's micro-batches. A LightningModule that trains an `ortlab.wrap`ped
module (`self.net = ortlab.wrap(net)`) is recorded through that ORTModule: ORT's transitions, graphs and collectors
too. The callback only observes. A `pytorch_lightning` Trainer takes it as well (it is both packages' Callback).
"""

from ortlab.integrations.lightning_record import RecordCallback

__all__ = ["RecordCallback"]
