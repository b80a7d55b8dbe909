"""A bare hand-written DDP training script: what ortlab's distributed burst is measured against.

Plain torch (and ORTModule): the demo model and batches, rank r training on batch(step * world_size + r), AdamW,
DistributedDataParallel over gloo (ORTModule inside DDP). Each rank writes one JSON line per step: the step's
compute time (forward to the loss on the host, as ortlab's `step_time_s`) and its start (from the first step's,
so that consecutive starts give whole iterations). Started by benchmarks/distributed_overhead.py as

    torchrun --nproc-per-node 2 benchmarks/ddp_bare.py --backend pytorch --steps 60 --out DIR [--turns FILE --block K]
                                                       [--device cpu|cuda]

With --device cuda each rank trains on its GPU (cuda:LOCAL_RANK) over NCCL, the step timed up to the loss read back.

With --turns it takes turns with ortlab's ranks (job 0 of benchmarks/_turns.py), waiting where a step begins.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from _turns import Turns
from torch.nn.parallel import DistributedDataParallel

from ortlab.demo import gpt
from ortlab.workload import to_device


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=("pytorch", "ortmodule"), default="pytorch")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--turns", type=Path, help="progress file of benchmarks/_turns.py")
    parser.add_argument("--block", type=int, default=12, help="steps per turn")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    cuda = args.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    workload = gpt()
    model = workload.model.train().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if args.backend == "ortmodule":
        import onnxruntime
        from onnxruntime.training.ortmodule import ORTModule

        onnxruntime.set_seed(0)
        if torch.get_num_threads() == 1:  # as ortlab's ranks run it: ORT's session on the rank's one thread, not its
            from ortlab import _ort  # default of every core (2 ranks x 2 threads on 2 cores spin against each other)

            _ort.session_threads(1)
        runner = DistributedDataParallel(ORTModule(model))
    else:
        runner = DistributedDataParallel(model)
    turns = Turns(args.turns, 0, rank, args.block, args.steps) if args.turns else None
    rows, first = [], None
    for step in range(args.steps):
        started = time.perf_counter()
        first = started if first is None else first
        if turns:
            turns.wait(step)
        x, y = to_device(workload.batch(step * world + rank), device)
        compute = time.perf_counter()
        loss = workload.loss(runner(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        value = float(loss.detach())
        rows.append({"step": step, "loss": value, "step_time_s": time.perf_counter() - compute,
                     "started_s": started - first})
    if turns:
        turns.done()
    args.out.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(row) + "\n" for row in rows)
    (args.out / f"rank{rank}.jsonl").write_text(lines, encoding="utf-8")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
