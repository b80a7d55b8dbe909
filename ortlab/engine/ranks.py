"""One rank of a distributed burst (`python -m ortlab.engine.ranks SPEC`, started by torch's elastic agent in
ortlab.engine.launch): the process group, the workload with this rank's share of the data, the model inside
DistributedDataParallel (ORTModule inside DDP, as ORT's guidelines say), an in-sync check of every step's
parameters that also carries the Stop request, and the checkpoint at the end. Everything else is the
single-process Engine, so a rank's folder (`<run>/ranks/<r>`) is an ordinary run."""

from __future__ import annotations

import datetime
import faulthandler
import math
import os
import pickle
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ortlab.engine import balance, comm, sharding, syncnorm
from ortlab.engine.config import BurstConfig, optimizer_for, resolve_device
from ortlab.engine.exchange import Checksums, Exchange, Table
from ortlab.engine.loop import Engine, _Burst
from ortlab.engine.orphan import on_parent_death
from ortlab.engine.sampling import Feed
from ortlab.engine.types import Strategy
from ortlab.errors import InputError
from ortlab.options import Options
from ortlab.runs.files import read_json
from ortlab.runs.run import RunStatus, RunWriter, load_run
from ortlab.runs.snapshot import Snapshot
from ortlab.stacks import table as stacks

CHECKPOINT = "checkpoint.pt"
_COLLECTIVE_WORDS = ("gloo", "nccl", "connection closed", "connection reset", "timed out", "timeout")


def collective_error(e: BaseException) -> bool:
    """Whether an exception came from a collective (a peer that is gone or stuck), not from this rank's work."""
    return isinstance(e, dist.DistError) or any(w in str(e).lower() for w in _COLLECTIVE_WORDS)


def optimizer_state_bytes(optimizer: Any) -> int:
    """Bytes of the optimizer state this rank holds (under ZeRO-1 only its shard)."""
    local = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer keeps its shard's optimizer there
    return sum(_local(v).numel() * v.element_size() for state in local.state.values() for v in state.values()
               if isinstance(v, torch.Tensor))


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: an FSDP2 DTensor's shard (its numel() is the whole tensor's)."""
    return getattr(tensor, "_local_tensor", tensor)


class RankEngine(Engine):
    """The Engine of one rank: rank r trains on `workload.batch(step * world_size + r)`, or on its share of the
    workload's dataset (ortlab.engine.sampling)."""

    time_forward = True
    cpu_clock = False  # its step waits on the other ranks (their gradients): its wall time is its time

    def __init__(self, ref, seed: int, snapshot: str | None, run: Path, timeout_s: float):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        super().__init__(ref, seed=seed, import_options=Options.from_environ(), snapshot=snapshot)
        self.run_folder = run
        self.stop_file = run / "stop"
        self.timeout_s = timeout_s
        self.stop_agreed = False  # some rank saw a Stop request: every rank ends after the same step
        self.names = [name for name, _ in self.model.named_parameters()]
        self.first_step_at = 0.0  # perf_counter as the burst's first step began: rows' started_s count from it
        self.exchange = Exchange(self.rank, self.world, len(self.names), 1 + len(balance.GATHERED))
        # the parameters' checksums where the burst trains them (_prepare): Checksums, or zeros under FSDP2
        self.checksums: Callable[[], list[int]] | None = None
        self._sums: list[int] = []  # the step's checksums and Stop flag, taken as it began
        self._stop = False
        self.comm = comm.CommClock().install()  # each step's time with a collective in flight

    def _checksums_now(self) -> list[int]:
        """The parameters' checksums now (set once the burst has prepared)."""
        if self.checksums is None:
            raise RuntimeError("parameter checksums asked for before the burst prepared")
        return self.checksums()

    def _feed(self, cfg: BurstConfig) -> Feed:
        return Feed(self.workload, cfg.sampler, self.world, self.rank, cfg.seed)

    def _run_dir(self, cfg: BurstConfig) -> Path:
        path = self.run_folder / "ranks" / str(self.rank)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _prepare(self, cfg: BurstConfig) -> _Burst:
        b = super()._prepare(cfg)
        b.writer.meta.update(rank=self.rank, world_size=self.world, local_rank=int(os.environ.get("LOCAL_RANK", 0)),
                             host=os.uname().nodename, strategy=str(cfg.strategy))
        b.writer.write("meta.json", b.writer.meta)
        if cfg.sync_batchnorm:
            b.extra["sync_batchnorm"] = syncnorm.convert(self.model, b.device)
        if cfg.strategy == Strategy.FSDP2:  # each parameter held once, sharded: no checksums to compare
            b.extra["fsdp2_units"] = sharding.shard(self.model, b.device, self.world, cfg.reshard_after_forward,
                                                    self.workload.blocks)
            b.optimizer, b.scheduler = optimizer_for(self.workload, self.model, cfg.optimizer, cfg.lr, b.device)
            self.checksums = lambda: [0] * len(self.names)
        else:
            b.extra["in_sync"] = True
            self.checksums = Checksums(list(self.model.parameters()))  # after the model moved to the burst's device
        on_grads = getattr(b.collectors.get("stats"), "on_parameter_grads", None)  # collector "stats"'s
        if on_grads is not None:  # the gradients every rank must agree on: after the all-reduce, before the update
            b.optimizer.register_step_pre_hook(lambda *_: on_grads(self.model.named_parameters()))
        return b

    def _ddp(self, module: torch.nn.Module, b: _Burst):
        from torch.nn.parallel import DistributedDataParallel

        ids = [torch.cuda.current_device()] if b.device.type == "cuda" else None
        ddp = DistributedDataParallel(self.exchange.carrier(module, b.device), device_ids=ids)
        comm.hook_ddp(ddp)  # its all-reduce timed
        return ddp

    def _runner(self, b: _Burst, runner: Any) -> Any:
        if b.cfg.strategy == Strategy.FSDP2:  # sharded in _prepare; the exchange is all-gathered (no DDP to ride)
            return runner
        return self._ddp(runner, b)  # DDP(model), DDP(ORTModule(model)), DDP(compiled model)

    def _train(self, b: _Burst, on_step, should_stop) -> None:
        try:
            try:
                super()._train(b, on_step, should_stop)
            except KeyboardInterrupt:
                if self.stop_agreed:  # every rank ends here: the last update is checked all the same
                    self._last_check(b)
                raise
            self._last_check(b)
        finally:
            b.extra["optimizer_state_bytes"] = optimizer_state_bytes(b.optimizer)
        if b.cfg.save_checkpoint:
            b.stage = "checkpoint"
            path = self._save_checkpoint(b)
            if path is not None:
                b.extra["checkpoint"] = str(path)
            b.stage = "done"

    def _step(self, b: _Burst, step: int) -> dict[str, Any]:
        started = time.perf_counter()
        if step == 0:
            self.first_step_at = started
        b.stage = "in-sync check"
        self._sums, self._stop = self._checksums_now(), self.stop_file.exists()
        self.comm.begin()
        row = super()._step(b, step)
        row.update(comm.step_fields(self.comm.seconds(), row["step_time_s"]))
        row["started_s"] = started - self.first_step_at  # consecutive starts: whole iterations, all included
        b.stage = "in-sync check"
        table = self.exchange.collect(b.device)
        row["in_sync"] = self._settle(b, step, table)
        row.update(balance.step_fields(self.rank, [f[0] for f in table.figures], [f[1:] for f in table.figures]))
        return row

    def _before_backward(self, b: _Burst, step: int, loss: torch.Tensor) -> torch.Tensor:
        """This rank's row of the step's exchange (ortlab.engine.exchange): the checksums taken as the step began,
        the Stop flag, the forward time and the batch's load and tokens (ortlab.engine.balance). It travels with the
        backward's gradient all-reduce and is read when the step ends."""
        load = b.feed.load(step) or {}
        self.exchange.post(self._sums, self._stop,
                           [b.forward_s, *(float(load.get(k, math.nan)) for k in balance.GATHERED)])
        return loss if b.cfg.strategy == Strategy.FSDP2 else self.exchange.ride(loss)

    def _last_check(self, b: _Burst) -> None:
        """The parameters after the last update (no step begins with them): an all-gather of its own."""
        b.stage = "in-sync check"
        self.exchange.post(self._checksums_now(), self.stop_file.exists())
        self._settle(b, b.steps_done, self.exchange.collect(b.device))

    def _settle(self, b: _Burst, step: int, table: Table) -> bool:
        """Whether every rank began `step` with the same parameters (the first step and parameter where they
        differ are kept). A Stop flag seen by any rank is seen by all: every rank ends after this step."""
        self.stop_agreed = any(table.stop)
        i = table.first_difference()
        if i is None:
            return True
        if b.extra.get("in_sync", True):
            b.extra["in_sync"] = False
            b.extra["out_of_sync"] = {"step": step, "parameter": self.names[i],
                                      "checksums": {str(r): sums[i] for r, sums in enumerate(table.checksums)}}
        return False

    def _save_checkpoint(self, b: _Burst) -> Path | None:
        """The full fp32 weights on rank 0: under ZeRO-1 each parameter from the rank whose shard updates it
        (gathered, without the optimizer state, as PR 5478's aggregation does); under DDP rank 0's own."""
        owned: dict[str, torch.Tensor] = {}
        if b.cfg.optimizer == "zero1":
            name_of = {id(p): n for n, p in self.model.named_parameters()}
            owned = {name_of[id(p)]: p.detach().float().cpu() for group in b.optimizer.optim.param_groups
                     for p in group["params"]}
            shards: list[Any] | None = [None] * self.world if self.rank == 0 else None
            dist.gather_object(owned, shards, dst=0)
            owned = {k: v for shard in shards or [] for k, v in shard.items()}
        if self.rank != 0:
            return None
        snap = Snapshot.take(self.model)
        missing = set(self.names) - set(owned) if b.cfg.optimizer == "zero1" else set()
        if missing:
            raise RuntimeError(f"ZeRO-1 shards did not cover parameters {sorted(missing)[:5]}")
        snap.model.update(owned)
        return snap.save(self.run_folder / CHECKPOINT)

    def _failed(self, b: _Burst, e: Exception) -> None:
        super()._failed(b, e)
        b.extra["failed_at"] = time.time()
        error = f"rank {self.rank}: {b.extra['error']}"
        if collective_error(e):
            b.extra["collective"] = True
            error += (f" (a collective with the other ranks failed: one of them is gone or stuck; collectives time "
                      f"out after {self.timeout_s:.0f} s)")
        b.extra["error"] = error


def _log_to(path: Path) -> None:
    """File descriptors 1 and 2 into the rank's log, so that what happens before the burst (imports, the process
    group, a crash in C++) is kept too."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for target in (1, 2):
        os.dup2(fd, target)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115


def _failed_early(folder: Path, cfg: BurstConfig, rank: int, error: str, bad_input: str | None = None) -> None:
    writer = RunWriter(folder, {"backend": cfg.backend, "config": cfg.to_dict(), "rank": rank, "pid": os.getpid(),
                                "stack": stacks.recorded()})
    extra = {"bad_input": bad_input} if bad_input else {}
    writer.finish(RunStatus.FAILED, error=error, failed_at=time.time(), **extra)
    print(f"[ortlab] {error}", flush=True)


def main(spec_path: str) -> int:
    spec_file = Path(spec_path)
    spec = read_json(spec_file)
    rank = int(os.environ["RANK"])
    run = Path(spec["run"])
    folder = run / "ranks" / str(rank)
    folder.mkdir(parents=True, exist_ok=True)
    _log_to(folder / "log.txt")
    faulthandler.enable()
    on_parent_death(lambda: os._exit(3), "ortlab-agent-watch")  # no rank outlives its launch
    cfg = BurstConfig.from_dict(spec["config"])
    timeout = float(spec["timeout_s"])
    try:
        device = resolve_device(cfg.device)
        if device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                timeout=datetime.timedelta(seconds=timeout))
    except Exception as e:
        _failed_early(folder, cfg, rank, f"rank {rank}: the process group did not form within {timeout:.0f} s: "
                                         f"{type(e).__name__}: {e}")
        return 1
    try:
        ref = pickle.loads((spec_file.parent / "ref.pkl").read_bytes())  # written by this package's launcher
        engine = RankEngine(ref, spec["seed"], spec["snapshot"], run, timeout)
        path = engine.run(cfg, should_stop=lambda: engine.stop_agreed)
    except Exception as e:  # the workload or the arguments: before the burst started
        _failed_early(folder, cfg, rank, f"rank {rank}: {type(e).__name__}: {e}",
                      bad_input=str(e) if isinstance(e, InputError) else None)
        return 1
    status = load_run(path).status
    dist.destroy_process_group()
    return 0 if status in (RunStatus.OK, RunStatus.INTERRUPTED) else 1


if __name__ == "__main__":
    code = main(sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything is written and the process group destroyed: end here. In the interpreter's teardown a gloo thread
    # can still abort the process ("terminate called without an active exception", SIGABRT), and the agent would
    # report a rank that finished its burst as failed (seen once in notebook 06 under the suite).
    os._exit(code)
