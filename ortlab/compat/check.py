"""`ortlab check`: does a model train on ORTModule, and if not, every reason why at once, where in the model, and
which fix removes it, verified by exporting again.

Three passes over the model as it is: ortlab's own export (`probe`: every ATen operator the exporter cannot
convert, not only the first), every distinct operator tried on ORT alone (`opcheck`: types, kernels, gradients,
gradient kernels), and, once nothing is left, one real ORTModule training step (forward and backward, the
parameters restored after), which also meets what only the whole graph shows. No optimizer step is taken.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortlab.compat import registry
from ortlab.compat.blockers import (
    EXPORT_FAILED,
    INVALID_TYPE,
    NO_GRADIENT,
    NO_GRADIENT_KERNEL,
    NO_KERNEL,
    ORT_FAILED,
    UNSUPPORTED_OP,
    Blocker,
    frames,
    merge,
    model_line,
    module_path,
)
from ortlab.compat.errors import failure_stage, read_error, root_message

REMEDIES = {
    UNSUPPORTED_OP: "no ortlab fix: write this line with operators the exporter converts, or register an exporter "
                    "symbolic for it (torch.onnx.register_custom_op_symbolic)",
    EXPORT_FAILED: "the exporter could not trace the model: see the message; data-dependent Python in forward "
                   "is the usual cause",
    INVALID_TYPE: "no ortlab fix: cast the input to a type ORT accepts for this operator before it",
    NO_KERNEL: "no ortlab fix: ORT 1.19.2 has no CPU kernel for it; write it with other operators",
    NO_GRADIENT: "no ortlab fix: ORT 1.19.2 cannot build its gradient; write it with operators that have one, or "
                 "keep this module out of ORTModule",
    NO_GRADIENT_KERNEL: "no ortlab fix: ORT 1.19.2 has no CPU kernel for its gradient; write it with other "
                        "operators",
    ORT_FAILED: "no ortlab fix known for this failure",
}


@dataclass
class CheckReport:
    """What `check` found. `blockers`: the model as it is; `fixes`: the fixes the verification applied;
    `remaining`: what is left with them; `trains`: whether ORTModule ran a training step with them (None: not
    tried, because blockers remained)."""

    model: str
    blockers: list[Blocker]
    fixes: list[str]
    remaining: list[Blocker]
    trains: bool | None
    seconds: dict[str, float] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    warnings: list[dict[str, Any]] = field(default_factory=list)  # what the exporter warned about, with its line
    unchecked: list[str] = field(default_factory=list)  # operators ORT could not try alone (the step judges them)
    path: str | None = None  # the check's folder (check.json, log.txt)

    @property
    def status(self) -> str:
        """"ok" (trains as it is), "fixed" (trains with `fixes`), or "blocked"."""
        if self.trains and not self.remaining:
            return "fixed" if self.fixes else "ok"
        return "blocked"

    @property
    def verdict(self) -> str:
        if self.status == "ok":
            return "trains on ORTModule as it is"
        if self.status == "fixed":
            return f"trains on ORTModule with fixes {', '.join(self.fixes)} (burst with --fix auto)"
        reasons = "; ".join(f"{b.kind} {b.op}" for b in self.remaining) or "ORTModule's training step failed"
        tried = f" after fixes {', '.join(self.fixes)}" if self.fixes else ""
        return f"blocked{tried}: {reasons}"

    def table(self):
        """The blockers as rows (kind, op, module, source, nodes, fixes or remedy, left after the fixes)."""
        import pandas as pd

        left = {b.key for b in self.remaining}
        rows = [{"kind": b.kind, "op": b.op, "types": ", ".join(b.dtypes), "module": b.module, "source": b.source,
                 "nodes": b.count, "fix": ", ".join(b.fixes) or None, "remedy": None if b.fixes else b.remedy,
                 "left after fixes": b.key in left} for b in self.blockers]
        extra = [b for b in self.remaining if b.key not in {x.key for x in self.blockers}]
        rows += [{"kind": b.kind, "op": b.op, "types": ", ".join(b.dtypes), "module": b.module, "source": b.source,
                  "nodes": b.count, "fix": None, "remedy": b.remedy, "left after fixes": True} for b in extra]
        return pd.DataFrame(rows, columns=["kind", "op", "types", "module", "source", "nodes", "fix", "remedy",
                                           "left after fixes"])

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "status": self.status, "verdict": self.verdict,
                "blockers": [b.to_dict() for b in self.blockers], "fixes": self.fixes,
                "remaining": [b.to_dict() for b in self.remaining], "trains": self.trains, "seconds": self.seconds,
                "versions": self.versions, "warnings": self.warnings, "unchecked": self.unchecked,
                "path": self.path}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CheckReport:
        return cls(d["model"], [Blocker.from_dict(b) for b in d["blockers"]], list(d["fixes"]),
                   [Blocker.from_dict(b) for b in d["remaining"]], d["trains"], d.get("seconds", {}),
                   d.get("versions", {}), d.get("warnings", []), d.get("unchecked", []), d.get("path"))

    def __str__(self) -> str:
        lines = [f"model {self.model}"]
        if self.blockers:
            lines.append(f"blockers of the model as it is ({len(self.blockers)}):")
            lines += [f"  {b.line()}" for b in self.blockers]
        else:
            lines.append("blockers of the model as it is: none found")
        if self.fixes:
            left = self.remaining
            lines.append(f"with fixes {', '.join(self.fixes)}: " + (f"{len(left)} left" if left else "none left"))
            lines += [f"  {b.line()}" for b in left]
        elif self.remaining and {b.key for b in self.remaining} != {b.key for b in self.blockers}:
            lines += [f"  {b.line()}" for b in self.remaining if b.key not in {x.key for x in self.blockers}]
        step = {True: "ORTModule trained one step (forward and backward)", False: "ORTModule's training step failed",
                None: "no ORTModule training step tried (blockers remain)"}[self.trains]
        lines.append(step)
        if self.unchecked and not self.trains:
            lines.append(f"not judged alone (ORT needs the whole graph for them): {', '.join(self.unchecked)}")
        lines.append(f"verdict: {self.verdict}")
        return "\n".join(lines)


@dataclass
class Found:
    """What one pass found: the blockers (one per cause), the probe export (None when the export itself failed),
    and the operators ORT could not try alone (it crashed on their one-node graph)."""

    blockers: list[Blocker]
    exported: Any
    unchecked: list[str]


def find(model: Any, inputs: Any, opset: int = 17, log: Path | None = None) -> Found:
    """The export's and ORT's per-operator blockers of `model` on `inputs`."""
    from ortlab.compat import opcheck, probe

    try:
        exported = probe.export(model, inputs, opset, log)
    except Exception as e:
        return Found([_export_failure(e)], None, [])
    found = []
    for node in exported.unconverted():
        stack = frames(node.doc_string)
        found.append(Blocker(UNSUPPORTED_OP, f"aten::{node.op_type}", f"the exporter has no ONNX symbolic for "
                             f"aten::{node.op_type} at opset {opset}", "export", node.name, module_path(node.name),
                             model_line(stack), stack))
    per_op, unchecked = opcheck.check_nodes(exported)
    return Found(merge(found + per_op), exported, unchecked)


def _export_failure(e: BaseException) -> Blocker:
    import traceback

    stack = [f"{f.filename}({f.lineno}): {f.name}" for f in reversed(traceback.extract_tb(e.__traceback__))]
    message = root_message(e)
    read = read_error(message)
    return Blocker(EXPORT_FAILED, read.op or type(e).__name__, message, "export", source=model_line(stack),
                   stack=stack)


def recommend(blockers: list[Blocker], model: Any) -> list[str]:
    """Attach to each blocker the fixes that remove it (or a remedy in words); the fixes, in registry order."""
    chosen: list[str] = []
    for b in blockers:
        b.fixes = registry.for_blocker(b, model)
        b.remedy = None if b.fixes else REMEDIES.get(b.kind)
        chosen += [f for f in b.fixes if f not in chosen]
    return [f for f in registry.FIXES if f in chosen]


def check(workload: Any, fixes: Any = registry.AUTO, opset: int = 17, out: Path | None = None,
          train_step: bool = True) -> CheckReport:
    """Check a workload (its model and first batch) for ORTModule: see the module docstring. `fixes`: "auto"
    (the ones that remove what was found), "none", or fix names. The model's state is unchanged after."""
    from ortlab.versions import versions
    from ortlab.workload import to_device

    asked = registry.parse(fixes)
    model = workload.model
    inputs, target = workload.batch(0)
    device = next((p.device for p in model.parameters()), None)
    if device is not None:
        inputs, target = to_device(inputs, device), to_device(target, device)
    log = out / "log.txt" if out else None
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    model.train()
    found = find(model, inputs, opset, log)
    blockers = found.blockers
    seconds["find"] = time.perf_counter() - started
    recommended = recommend(blockers, model)  # named on each blocker whether or not they are applied here
    chosen = recommended if asked == registry.AUTO else list(asked)
    if chosen:
        started = time.perf_counter()
        with registry.applied(model, chosen):
            found = find(model, inputs, opset, log)
        recommend(found.blockers, model)
        seconds["verify fixes"] = time.perf_counter() - started
    remaining, exported = found.blockers, found.exported
    trains = None
    if train_step and not remaining:
        started = time.perf_counter()
        with registry.applied(model, chosen):
            failure = train_once(workload, inputs, target, exported, log)
        trains = failure is None
        if failure is not None:
            recommend([failure], model)
            remaining = [failure]
        seconds["training step"] = time.perf_counter() - started
    notes = [{"category": w.category.__name__, "message": str(w.message).splitlines()[0],
              "file": w.filename, "line": w.lineno} for w in (exported.warnings if exported else [])
             if w.category.__name__ == "TracerWarning"]
    report = CheckReport(getattr(workload, "name", "") or type(model).__name__, blockers, chosen, remaining, trains,
                         {k: round(v, 2) for k, v in seconds.items()}, versions(), notes, found.unchecked,
                         str(out) if out else None)
    if out:
        from ortlab.run import write_json

        write_json(out / "check.json", report.to_dict())
    return report


def train_once(workload: Any, inputs: Any, target: Any, exported: Any, log: Path | None) -> Blocker | None:
    """One forward and backward through a fresh ORTModule (no optimizer step; the model as before after). A
    Blocker when it fails or when ORTModule falls back to PyTorch."""
    from ortlab.verdict.gradients import step

    try:
        step(workload, inputs, target, ortmodule=True, log=log)
    except Exception as e:
        return _step_failure(e, exported)
    return None


def _step_failure(e: BaseException, exported: Any) -> Blocker:
    """A failed ORTModule step as a blocker: the kind from ORT's message, the node's module and source line
    from the probe export."""
    message = root_message(e)
    read = read_error(message)
    lowered = message.lower()
    kind = (INVALID_TYPE if "type error" in lowered else NO_KERNEL if "could not find an implementation" in lowered
            else NO_GRADIENT if "gradient" in lowered else UNSUPPORTED_OP if "exporting the operator" in lowered
            else ORT_FAILED)
    node = _node(exported, read.node)
    stack = frames(node.doc_string) if node is not None else []
    return Blocker(kind, read.op or (node.op_type if node is not None else type(e).__name__), message,
                   failure_stage(e) or "training step", read.node, module_path(read.node or ""), model_line(stack),
                   stack, [read.dtype] if read.dtype else [])


def _node(exported: Any, name: str | None) -> Any:
    if exported is None or not name:
        return None
    with contextlib.suppress(StopIteration):
        return next(n for n in exported.model.graph.node if n.name == name)
    return None
