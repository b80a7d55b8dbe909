"""Two distributed jobs on one machine that take turns every few steps: what benchmarks/distributed_overhead.py
measures with. The speed of these shared 2-vCPU machines drifts by 10-30% between bursts of ten seconds, more than
the 5% compared; jobs that alternate every few hundred milliseconds see the same machine.

A progress file holds one number per rank of each job: the steps that rank has done. Each rank calls `wait(step)`
where its step begins (inside `batch`), which posts its progress and sleeps until its job's turn: job 0 runs steps
[iK, (i+1)K) once job 1 has done iK steps, job 1 runs them once job 0 has done (i+1)K (or all of its steps). So
while one job trains, the other's ranks sleep in `wait`: the iterations that begin a block contain that wait and
are left out of the figures (`measured`). A job that has done all its steps waits (`done`) until the other has
begun its last: the last turn, measured like the others, is not shared with the end of the other job's processes.

Job 0 is the bare script (benchmarks/ddp_bare.py), job 1 ortlab's ranks, which train the `demo` workload below
(a factory: `benchmarks/_turns.py:demo`)."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

WORLD = 2  # ranks per job
POLL_S = 0.001
GIVE_UP_S = 300.0  # the other job did not come (it failed to start): end instead of waiting for ever
FIRST_LEFT_OUT = 2  # iterations left out at the start of each block: the wait, and the one after it (cold caches)


def create(path: Path) -> Path:
    """A progress file where no rank has started (-1 steps)."""
    path.write_bytes(struct.pack(f"{2 * WORLD}q", *[-1] * (2 * WORLD)))
    return path


class Turns:
    """Rank `rank` of job `job` (0 or 1) in a run of `steps` steps per job, turns of `block` steps."""

    def __init__(self, path: str | Path, job: int, rank: int, block: int, steps: int):
        self.fd = os.open(path, os.O_RDWR)
        self.job, self.rank, self.block, self.steps = job, rank, block, steps

    def _post(self, done: int) -> None:
        os.pwrite(self.fd, struct.pack("q", done), 8 * (self.job * WORLD + self.rank))

    def _other(self) -> int:
        """The steps that every rank of the other job has done."""
        values = struct.unpack(f"{WORLD}q", os.pread(self.fd, 8 * WORLD, 8 * (1 - self.job) * WORLD))
        return min(values)

    def wait(self, step: int) -> None:
        self._post(step)
        if step % self.block:
            return  # inside our block: the other job is waiting
        first = step // self.block * self.block
        self._until(first if self.job == 0 else min(first + self.block, self.steps))

    def done(self) -> None:
        """After the last step: stay until the other job has begun its last step, so that this job's ending
        (writing its rows, the process group's teardown, the exit) does not fall in the other job's last turn."""
        self._post(self.steps)
        self._until(self.steps - 1)

    def _until(self, need: int) -> None:
        deadline = time.monotonic() + GIVE_UP_S
        while self._other() < need:
            if time.monotonic() > deadline:
                raise SystemExit(f"turns: the other job did not reach step {need} in {GIVE_UP_S:.0f} s")
            time.sleep(POLL_S)


def measured(step: int, block: int) -> bool:
    """Whether the iteration that starts at `step` counts: not one of the first in its block."""
    return step % block >= FIRST_LEFT_OUT


def demo(turns: str, block: int, steps: int, job: int = 1):
    """The demo workload whose `batch` waits for its turn in a rank of a distributed burst (RANK is set by torch's
    launcher; anywhere else it does not wait)."""
    from ortlab.demo import gpt

    w = gpt()
    if "RANK" not in os.environ:
        return w
    rank = int(os.environ["RANK"])
    me = Turns(turns, job, rank, block, steps)
    batch = w.batch

    def batch_in_turn(index: int):
        me.wait(index // WORLD)
        return batch(index)

    w.batch = batch_in_turn
    return w
