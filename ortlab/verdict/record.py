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

import json
from pathlib import Path
from typing import Any

# written by the engine as a parity burst ends (ortlab.evidence); named here for the verdict's readers
from ortlab.evidence import FORMAT, GRADIENTS, SNAPSHOT, batch_hashes, snapshot_hash  # noqa: F401
from ortlab.evidence import RECORD_FILE as FILE


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
