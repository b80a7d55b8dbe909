"""What `ortlab check` found (`CheckReport`): the blockers of the model as it is, the fixes the verification
applied and what they left, whether ORTModule trained a step; its status and verdict in words, as a table, as
plain data (check.json) and as the text `ortlab check` prints."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ortlab.compat.blockers import BAKED_INPUT, BUFFER_UPDATE, FROZEN_FLOW, WRONG_GRADIENT, Blocker

# ORTModule trains, but not the model PyTorch trains
DIVERGING = (WRONG_GRADIENT, BAKED_INPUT, FROZEN_FLOW, BUFFER_UPDATE)


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
    hazards: list[dict[str, Any]] = field(default_factory=list)  # what the exporter warned about (ortlab.verdict)
    unchecked: list[str] = field(default_factory=list)  # operators ORT could not try alone (the step judges them)
    path: str | None = None  # the check's folder (check.json, log.txt)

    @property
    def own_hazards(self) -> list[dict[str, Any]]:
        """The hazards in the model's code (the user's to judge): not torch's own known-harmless checks
        (ortlab.compat.hazards.harmless), nor the exporter's dropped buffer update when the buffer update is a
        blocker of its own."""
        from ortlab.compat.hazards import harmless

        buffers = any(b.kind == BUFFER_UPDATE for b in self.blockers + self.remaining)
        return [h for h in self.hazards if not harmless(h) and not (buffers and h["kind"].startswith("in-place"))]

    @property
    def hazard_note(self) -> str | None:
        """torch's own checks the export traced, in one note: what the burst's verdict says of them."""
        from ortlab.compat.hazards import harmless, harmless_note

        return harmless_note([h for h in self.hazards if harmless(h)], when="")

    @property
    def status(self) -> str:
        """"ok" (trains as it is), "fixed" (trains with `fixes`), "diverges" (ORTModule trains, but another model
        than PyTorch: wrong gradients, baked arguments, buffers), or "blocked"."""
        if self.trains and not self.remaining:
            return "fixed" if self.fixes else "ok"
        if self.trains and all(b.kind in DIVERGING for b in self.remaining):
            return "diverges"
        return "blocked"

    @property
    def verdict(self) -> str:
        """The outcome in words: trains as it is, with which fixes, or what blocks it."""
        if self.status == "ok":
            return "trains on ORTModule as it is"
        if self.status == "fixed":
            return f"trains on ORTModule with fixes {', '.join(self.fixes)} (burst with --fix auto)"
        reasons = "; ".join(f"{b.kind} {b.op}" for b in self.remaining) or "ORTModule's training step failed"
        tried = f" with fixes {', '.join(self.fixes)}" if self.fixes else ""
        if self.status == "diverges":
            return f"ORTModule trains{tried}, but another model than PyTorch: {reasons}"
        return f"blocked{tried}: {reasons}"

    def table(self):
        """The blockers as rows (kind, op, module, source, nodes, the fixes that removed it (verified) or the
        remedy, the fixes tried that did not, whether ORT has what is missing on CUDA, left after the fixes)."""
        import pandas as pd

        left = {b.key for b in self.remaining}
        cuda = {True: "ORT has it", False: "missing too", None: None}
        known = {b.key for b in self.blockers}
        shown = self.blockers + [b for b in self.remaining if b.key not in known]
        rows = [{"kind": b.kind, "op": b.op, "types": ", ".join(b.dtypes), "module": b.module, "source": b.source,
                 "nodes": b.count, "fix": ", ".join(b.fixes) or None, "remedy": None if b.fixes else b.remedy,
                 "tried": ", ".join(b.tried) or None, "on CUDA": cuda[b.cuda], "left after fixes": b.key in left}
                for b in shown]
        return pd.DataFrame(rows, columns=["kind", "op", "types", "module", "source", "nodes", "fix", "remedy",
                                           "tried", "on CUDA", "left after fixes"])

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data (check.json, `ortlab check --json`)."""
        return {"model": self.model, "status": self.status, "verdict": self.verdict,
                "blockers": [b.to_dict() for b in self.blockers], "fixes": self.fixes,
                "remaining": [b.to_dict() for b in self.remaining], "trains": self.trains, "seconds": self.seconds,
                "versions": self.versions, "hazards": self.hazards, "unchecked": self.unchecked,
                "path": self.path}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CheckReport:
        """The report `to_dict` wrote, read back."""
        return cls(d["model"], [Blocker.from_dict(b) for b in d["blockers"]], list(d["fixes"]),
                   [Blocker.from_dict(b) for b in d["remaining"]], d["trains"], d.get("seconds", {}),
                   d.get("versions", {}), d.get("hazards", []), d.get("unchecked", []), d.get("path"))

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
        own = self.own_hazards
        if own:
            lines.append(f"export hazards ({len(own)}): Python decisions the graph froze")
            lines += [(f"  {h['file']}:{h['line']}" if h.get("file") else "  (no line of the model's code)")
                      + (f" (module {h['module']})" if h.get("module") else "")
                      + f": {h['kind']}; {h['advice']}" for h in own]
        if self.hazard_note:
            lines.append(f"note: {self.hazard_note}")
        lines.append(f"verdict: {self.verdict}")
        return "\n".join(lines)
