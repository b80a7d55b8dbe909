"""What a parity burst records so that its run folder can be judged anywhere (`ortlab judge`,
ortlab.verdict.folders): in another process, on another stack, on another machine.

The verdict in one process (ortlab.verdict.procedure) recomputes what it needs from the session's snapshot and
batches; two folders made by separate processes (ORTModule on torch 2.6, torch.compile on the newest torch) share
neither. So a parity burst writes, beside its losses (metrics.jsonl) and end state (final_state.json):
- judge.json: the starting snapshot's SHA-256 (model and optimizer state), each step's batch's SHA-256, the burst
  seed, and which of the files below it wrote: what `ortlab judge` checks before judging two folders together;
- first_step.pt: the first step's gradient of every trained parameter (fp32, on the CPU; unscaled under fp16's
  loss scaling) and its loss: the evidence the verdict judges against float64, which the judging process cannot
  recompute for a backend it may not have (ORTModule does not load on torch >= 2.7);
- snapshot.pt: the starting snapshot itself when it is small (SNAPSHOT_KEPT_BYTES): then the judging process
  needs no model factory that builds the same weights (another torch can initialise differently). A larger one is
  built again by the run's factory (or read from the --snapshot file the run names) and checked by its hash.

Cost (measured in docs/convergence.md): one copy of the gradients at step 0 and a file of the trained parameters'
size; hashing the snapshot once per process and the burst's batches once per burst.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

FILE = "judge.json"
GRADIENTS = "first_step.pt"
SNAPSHOT = "snapshot.pt"
SNAPSHOT_KEPT_BYTES = 32 * 2**20  # a snapshot up to this size is written into the run folder (the demo: 0.4 MB)
FORMAT = "ortlab-judge-1"


def digest(value: Any, h: Any = None) -> Any:
    """A SHA-256 over a nested structure of tensors, numbers, strings, lists and dicts (keys sorted): each tensor
    by its dtype, shape and bytes on the CPU, so that the same values give the same hash on any torch."""
    import torch

    h = h or hashlib.sha256()
    if isinstance(value, torch.Tensor):
        t = value.detach().to("cpu").contiguous()
        h.update(f"tensor:{str(t.dtype).removeprefix('torch.')}:{tuple(t.shape)}:".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(value, dict):
        h.update(f"dict:{len(value)}:".encode())
        for key in sorted(value, key=str):
            h.update(f"{key!s}=".encode())
            digest(value[key], h)
    elif isinstance(value, list | tuple):
        h.update(f"list:{len(value)}:".encode())
        for item in value:
            digest(item, h)
    else:
        h.update(f"{type(value).__name__}:{value!r};".encode())
    return h


def snapshot_hash(snapshot: Any) -> str:
    """The snapshot's SHA-256 (its model state, its dtypes and its optimizer state), once per snapshot object."""
    known = getattr(snapshot, "_sha256", None)
    if known is None:
        known = digest({"model": snapshot.model, "dtypes": snapshot.dtypes,
                        "optimizer": snapshot.optimizer}).hexdigest()
        snapshot._sha256 = known
    return known


def batch_hashes(workload: Any, feed: Any, steps: int) -> list[str]:
    """Each step's SHA-256 over its micro-batches (inputs and target), as the float64 replay reads them
    (ortlab.verdict.reference.replay: `workload.micro_batches(feed.batch, step)`)."""
    return [digest(workload.micro_batches(feed.batch, t)).hexdigest()[:32] for t in range(steps)]


def gradients(model: Any, loss: float, scaler: Any = None) -> dict[str, Any]:
    """The first step's loss and every trained parameter's gradient (fp32 copies on the CPU; None where it got
    none), taken after the step's backward and before the optimizer's step; under a GradScaler, unscaled."""
    import torch

    scale = float(scaler.get_scale()) if scaler is not None else 1.0
    grads = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            grads[name] = None if p.grad is None else (p.grad.detach().to("cpu", torch.float32, copy=True) / scale)
    return {"loss": float(loss), "grads": grads}


def write(engine: Any, cfg: Any, path: Path, first: dict[str, Any] | None, steps: int) -> None:
    """The run's judge.json, and first_step.pt and (small) snapshot.pt beside it."""
    import torch

    from ortlab.run import write_json

    started = time.perf_counter()
    files = {}
    if first is not None:
        tmp = path / f".{GRADIENTS}.tmp"
        torch.save({"format": FORMAT, **first}, tmp)
        tmp.replace(path / GRADIENTS)
        files["first_step"] = GRADIENTS
    size = sum(t.numel() * t.element_size() for t in engine.initial.model.values())
    if size <= SNAPSHOT_KEPT_BYTES:
        engine.initial.save(path / SNAPSHOT)
        files["snapshot_file"] = SNAPSHOT
    record = {"format": FORMAT, "snapshot": snapshot_hash(engine.initial), "snapshot_bytes": size,
              "batches": batch_hashes(engine.workload, engine._feed(cfg), steps), "seed": cfg.seed, **files}
    record["cost_s"] = round(time.perf_counter() - started, 4)
    write_json(path / FILE, record)


def read(run: Any) -> dict[str, Any] | None:
    """The run's judge.json, or None when the burst did not record one (not in parity mode, an older ortlab)."""
    path = Path(run.path) / FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def first_step(run: Any) -> Any:
    """The run's first step as a gradients.Step (first_step.pt, loaded without executing code), or None."""
    import torch

    from ortlab.verdict.gradients import Step

    path = Path(run.path) / GRADIENTS
    if not path.is_file():
        return None
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
        return Step(float(data["loss"]), dict(data["grads"]))
    except Exception as e:  # a damaged or foreign file: named, never a traceback
        from ortlab.run import RunError

        raise RunError(f"{path}: not a first step ortlab recorded (damaged or foreign: {type(e).__name__})") from None
