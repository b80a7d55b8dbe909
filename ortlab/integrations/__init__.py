"""Where people train: trainers a model factory may return instead of a Workload (ortlab.workload.ADAPTERS)."""
