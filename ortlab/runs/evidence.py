"""What a burst keeps of itself so that a verdict can be reached on it anywhere: its end state, and in parity mode
its first step and its starting point. The engine writes these files as a burst ends; the verdict
(ortlab.verdict.state, ortlab.verdict.record) reads and judges them. A leaf: torch only, imported on use.

- final_state.json (every burst): the model's state per parameter and buffer, summarized (sum and sum of squares in
  float64, kind, dtype, size, the owning module's class): enough to name the tensors two runs disagree on, small
  enough to keep with every run.
- judge.json, first_step_summary.pt, snapshot.pt (a parity burst): the starting snapshot's and each step's batch's
  SHA-256, the first step's gradients summarized (a fixed size a parameter: ortlab.runs.sketch; first_step.pt holds
  them whole when the burst's evidence is "full"), and the snapshot itself when small (ortlab.verdict.record says
  why each).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

from ortlab.runs.run import write_json

STATE_FILE = "final_state.json"
FROZEN = "frozen parameter"  # a parameter that does not require grad
RECORD_FILE = "judge.json"
GRADIENTS = "first_step.pt"  # every gradient (BurstConfig.evidence "full")
SUMMARY = "first_step_summary.pt"  # a summary a parameter (ortlab.runs.sketch): what any parity burst keeps
SNAPSHOT = "snapshot.pt"
SNAPSHOT_KEPT_BYTES = 32 * 2**20  # a snapshot up to this size is written into the run folder (the demo: 0.4 MB)
FORMAT = "ortlab-judge-1"


def summarize(model: Any) -> dict[str, dict[str, Any]]:
    """Per state_dict entry: parameter or buffer, dtype, size, the owning module's class, and the float64 sum and
    sum of squares."""
    import torch

    parameters = {n: p.requires_grad for n, p in model.named_parameters()}
    types = {n: type(m).__name__ for n, m in model.named_modules()}
    out = {}
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            tensor = _whole(tensor)
            values = (tensor.detach().abs() if tensor.is_complex() else tensor.detach()).double()
            kind = "buffer" if name not in parameters else "parameter" if parameters[name] else FROZEN
            out[name] = {"kind": kind,
                         "dtype": str(tensor.dtype).removeprefix("torch."), "numel": tensor.numel(),
                         "module_type": types.get(name.rpartition(".")[0]),
                         "sum": float(values.sum()), "sumsq": float((values * values).sum())}
    return out


def _whole(tensor: Any) -> Any:
    """A tensor as one process holds it: an FSDP2 shard (a DTensor) gathered from every rank (a collective: every rank
    of the burst calls it at the same point), any other as it is. The models judged this way are small; at scale
    each shard's summary (ortlab.runs.sketch) combined across ranks is to replace this gather (verdict at scale)."""
    full = getattr(tensor, "full_tensor", None)
    return full() if callable(full) else tensor


def write_state(model: Any, run_dir: Path) -> None:
    """The run's final_state.json: `summarize(model)`."""
    write_json(Path(run_dir) / STATE_FILE, summarize(model))


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


def gradients(model: Any, loss: float, scaler: Any = None, full: bool = False) -> dict[str, Any]:
    """The first step's loss and every trained parameter's gradient summarized (ortlab.runs.sketch: a fixed size a
    parameter, computed on its device; None where it got none), taken after the step's backward and before the
    optimizer's step; under a GradScaler, unscaled. `full`: the gradients themselves too (fp32 copies on the CPU)."""
    import torch

    from ortlab.runs import sketch

    scale = float(scaler.get_scale()) if scaler is not None else 1.0
    summaries, grads = {}, {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        g = None if p.grad is None else _whole(p.grad.detach())
        summaries[name] = None if g is None else sketch.summarize(g if scale == 1.0 else g.double() / scale,
                                                                  name).to_dict()
        if full:
            grads[name] = None if g is None else (g.to("cpu", torch.float32, copy=True) / scale)
    return {"loss": float(loss), "summaries": summaries, **({"grads": grads} if full else {})}


def write_record(path: Path, first: dict[str, Any] | None, initial: Any, workload: Any, feed: Any, seed: int,
                 steps: int) -> None:
    """The run's judge.json, and first_step.pt (`first`: `gradients()` at step 0) and (small) snapshot.pt beside it:
    `initial` the burst's starting Snapshot, `feed` its batches."""
    started = time.perf_counter()
    files = {}
    if first is not None:
        from ortlab.runs import sketch

        _save(path / SUMMARY, {"format": sketch.FORMAT, "width": sketch.WIDTH, "exact": sketch.EXACT,
                               "loss": first["loss"], "grads": first["summaries"]})
        files["first_step_summary"] = SUMMARY
        if first.get("grads") is not None:
            _save(path / GRADIENTS, {"format": FORMAT, "loss": first["loss"], "grads": first["grads"]})
            files["first_step"] = GRADIENTS
    size = sum(t.numel() * t.element_size() for t in initial.model.values())
    if size <= SNAPSHOT_KEPT_BYTES:
        initial.save(path / SNAPSHOT)
        files["snapshot_file"] = SNAPSHOT
    record = {"format": FORMAT, "snapshot": snapshot_hash(initial), "snapshot_bytes": size,
              "batches": batch_hashes(workload, feed, steps), "seed": seed, **files}
    record["cost_s"] = round(time.perf_counter() - started, 4)
    write_json(path / RECORD_FILE, record)


def _save(target: Path, data: Any) -> None:
    """torch.save whole or not at all."""
    import torch

    tmp = target.with_name(f".{target.name}.tmp")
    torch.save(data, tmp)
    tmp.replace(target)
