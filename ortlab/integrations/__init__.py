"""Where people train: trainers a model factory may return instead of a Workload (ortlab.workload.ADAPTERS:
`trainer`, `lightning`), and the callbacks that record a trainer's own run (`hf_record`, `lightning_record`, public
as ortlab.hf and ortlab.lightning)."""
