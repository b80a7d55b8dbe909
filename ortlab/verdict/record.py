"""What a parity burst records so that its run folder can be judged anywhere (`ortlab judge`,
ortlab.verdict.folders): in another process, on another stack, on another machine.

The verdict in one process (ortlab.verdict.procedure) recomputes what it needs from the session's snapshot and
batches; two folders made by separate processes (ORTModule on torch 2.6, torch.compile on the newest torch) share
neither. So a parity burst writes, beside its losses (metrics.jsonl) and end state (final_state.json):
- judge.json: the starting snapshot's SHA-256 (model and optimizer state), each step's batch's SHA-256, the burst
  seed, and which of the files below it wrote: what `ortlab judge` checks before judging two folders together;
- first_step_summary.pt: the first step's gradient of every trained parameter summarized in a fixed size
  (ortlab.runs.sketch: norm, sum, finiteness, a count sketch the float64 side computes alike; unscaled under fp16's loss
  scaling): what any parity burst keeps, tens of MB at most whatever the model's size;
- first_step.pt (the burst's evidence "full"): the first step's gradient of every trained parameter whole (fp32,
  on the CPU) and its loss.
Either is the evidence the verdict judges against float64, which the judging process cannot recompute for a
backend it may not have (ORTModule does not load on torch >= 2.7); a summary decides as the whole gradients do
except near the line (ortlab.runs.sketch.UNCERTAIN), where the verdict says it cannot decide.
- snapshot.pt: the starting snapshot itself when it is small (SNAPSHOT_KEPT_BYTES): then the judging process
  needs no model factory that builds the same weights (another torch can initialise differently). A larger one is
  built again by the run's factory (or read from the --snapshot file the run names) and checked by its hash.

Cost (measured in docs/convergence.md): the summaries at step 0 (computed on the device) and 32 kB a parameter
tensor on disk (4 bytes a parameter more with "full"); hashing the snapshot once per process and the burst's
batches once per burst.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# written by the engine as a parity burst ends (ortlab.runs.evidence); named here for the verdict's readers
from ortlab.runs.evidence import FORMAT, GRADIENTS, SNAPSHOT, SUMMARY, batch_hashes, snapshot_hash  # noqa: F401
from ortlab.runs.evidence import RECORD_FILE as FILE
from ortlab.runs.files import read_json


def read(run: Any) -> dict[str, Any] | None:
    """The run's judge.json, or None when the burst did not record one (not in parity mode, an older ortlab)."""
    data = read_json(Path(run.path) / FILE, strict=False)
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def first_step(run: Any) -> Any:
    """The run's first step as a gradients.Step (loaded without executing code): its gradients whole where the run
    kept them (first_step.pt), else their summaries (first_step_summary.pt: ortlab.runs.sketch.Summary per parameter),
    or None when it recorded neither."""
    import torch

    from ortlab.runs import sketch
    from ortlab.verdict.gradients import Step

    for name in (GRADIENTS, SUMMARY):
        path = Path(run.path) / name
        if not path.is_file():
            continue
        try:
            data = torch.load(path, map_location="cpu", weights_only=True)
            if name == GRADIENTS:
                return Step(float(data["loss"]), dict(data["grads"]))
            if data.get("format") != sketch.FORMAT or data.get("width") != sketch.WIDTH:
                raise ValueError(f"format {data.get('format')} of width {data.get('width')}")
            return Step(float(data["loss"]), {k: None if v is None else sketch.Summary.from_dict(v)
                                              for k, v in data["grads"].items()})
        except Exception as e:  # a damaged or foreign file: named, never a traceback
            from ortlab.runs.run import RunError

            raise RunError(f"{path}: not a first step ortlab recorded (damaged, foreign or of another ortlab: "
                           f"{type(e).__name__})") from None
    return None


def has_first_step(run: Any) -> bool:
    """Whether the run recorded its first step's gradients (whole or summarized)."""
    return any((Path(run.path) / name).is_file() for name in (GRADIENTS, SUMMARY))
