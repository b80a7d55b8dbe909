"""Which samples each step of each rank trains on (the sampler) and the work they cost (the load).

A workload gives `batch(step)` or a dataset with `collate` and `complexity` (ortlab.workload). With a dataset,
ortlab batches it: in order without a sampler, else with torch's `DistributedSampler` or ORT's
`LoadBalancingDistributedSampler` + `LoadBalancingDistributedBatchSampler`, seeded with the burst's seed on
every rank, so that a PyTorch burst and an ORTModule burst see the same batches. Each step's load is what its
samples cost: `load` (the sum of their complexities), `tokens` (samples x the longest, what a batch padded to its
longest sample computes) and `padding` (tokens - load)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ortlab.engine.types import BurstError
from ortlab.workload import Workload


class Feed:
    """The batches of one process (rank `rank` of `world`): `batch(step)` and, with a dataset, `load(step)`."""

    def __init__(self, workload: Workload, sampler: str | None = None, world: int = 1, rank: int = 0,
                 seed: int = 0):
        self.workload, self.sampler, self.world, self.rank, self.seed = workload, sampler, world, rank, seed
        if sampler is not None and workload.dataset is None:
            raise BurstError(f"sampler {sampler!r} needs a workload with a dataset (Workload(model, None, loss, "
                             "dataset=..., collate=..., complexity=..., batch_size=...)); this one gives only "
                             "batch(step): leave sampler unset")
        if sampler == "load_balancing" and workload.complexity is None:
            raise BurstError("sampler 'load_balancing' needs the workload's complexity(sample) (e.g. its length); "
                             "without it use sampler 'distributed'")
        self._epochs: dict[int, list[list[int]]] = {}
        self._per_epoch: int | None = None
        self._complexity: dict[int, int] = {}

    def indices(self, step: int) -> list[int] | None:
        """The dataset indices of this process's batch at `step` (None for a workload without a dataset)."""
        w = self.workload
        if w.dataset is None:
            return None
        if self.sampler is None:  # rank r takes the in-order batch step * world + r, as for batch(step)
            return w.step_indices(step * self.world + self.rank)
        if self._per_epoch is None:
            self._per_epoch = len(self._epoch(0))
        return self._epoch(step // self._per_epoch)[step % self._per_epoch]

    def batch(self, step: int) -> tuple[Any, Any]:
        indices = self.indices(step)
        if indices is None:
            assert self.workload.batch is not None  # a Workload without a dataset has batch(step)
            return self.workload.batch(step * self.world + self.rank)
        dataset, collate, _ = self._data()
        return collate([dataset[i] for i in indices])

    def load(self, step: int) -> dict[str, int] | None:
        """`samples`, `load`, `tokens`, `padding` of this process's batch at `step`, or None without complexity."""
        indices = self.indices(step)
        if indices is None or self.workload.complexity is None:
            return None
        costs = [self._cost(i) for i in indices]
        tokens = len(costs) * max(costs)
        return {"samples": len(costs), "load": sum(costs), "tokens": tokens, "padding": tokens - sum(costs)}

    def _cost(self, i: int) -> int:
        if i not in self._complexity:
            self._complexity[i] = self._cost_of_sample(self._data()[0][i])
        return self._complexity[i]

    def _epoch(self, epoch: int) -> list[list[int]]:
        """This rank's batches of one pass over the dataset (the same count on every rank)."""
        if epoch not in self._epochs:
            dataset, _, size = self._data()
            if self.sampler == "distributed":
                from torch.utils.data import DistributedSampler

                sampler = DistributedSampler(dataset, num_replicas=self.world, rank=self.rank, shuffle=True,
                                             seed=self.seed)
                sampler.set_epoch(epoch)
                order = list(sampler)
                batches = [order[i : i + size] for i in range(0, len(order), size)]
            else:
                from ortlab._ort import load_balancing_samplers

                balancing, batching = load_balancing_samplers()
                sampler = balancing(dataset, complexity_fn=self._cost_of_sample, world_size=self.world,
                                    rank=self.rank, shuffle=True, seed=self.seed)
                # A new sampler per epoch, its epoch set before the batch sampler sorts: in ORT 1.19.2 the batch
                # sampler's set_epoch sorts again and fails (`if not self.sample_complexities` on an array).
                sampler.set_epoch(epoch)
                ordered = batching(sampler, batch_fn=lambda ids: [ids[i : i + size] for i in range(0, len(ids), size)])
                batches = [[int(i) for i in batch] for batch in ordered]  # numpy integers from its sort
            self._epochs = {epoch: batches}  # bursts move forward: one epoch kept
        return self._epochs[epoch]

    def _cost_of_sample(self, sample: Any) -> int:
        complexity = self.workload.complexity
        assert complexity is not None  # asked only with it: load() checks, the load-balancing sampler needs it
        return int(complexity(sample))

    def _data(self) -> tuple[Sequence[Any], Callable[[list[Any]], tuple[Any, Any]], int]:
        """The workload's dataset, collate and batch size: a Workload with a dataset has all three (its checks)."""
        w = self.workload
        assert w.dataset is not None and w.collate is not None and w.batch_size is not None
        return w.dataset, w.collate, w.batch_size
