"""Where people train: trainers a model factory may return instead of a Workload (ortlab.workload.ADAPTERS:
`trainer`, `lightning`), a user's own loop recorded as a run (`recorder`, `ortlab.record`), and the callbacks that
record a trainer's own run (`hf_record`, `lightning_record`, public as ortlab.hf and ortlab.lightning)."""
