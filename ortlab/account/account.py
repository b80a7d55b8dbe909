"""`MemoryAccount`: what an execution graph holds, step by step, as data (and as text for a terminal)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

PHASES = ("forward", "yield", "backward")
MB = 2**20


@dataclass
class MemoryAccount:
    """The activation memory of one ORTModule training graph, exact from the graph at the burst's shapes.

    Activations are the buffers the graph allocates while it runs (forward values, those stashed for the
    backward pass, backward temporaries); parameters, parameter gradients, user inputs, the graph's constants
    and the optimizer's state are counted apart. `what` says it in words.
    """

    source: str  # the execution model read
    run: str | None  # the run's folder name, when the graph came from a run
    order: str  # execution order walked: "default" or "memory_efficient"
    order_reason: str
    device: str
    dims: dict[str, int]  # symbolic dimension -> value the shapes were evaluated at
    nodes: int
    peak_activation_bytes: int
    peak_index: int
    peak_node: str
    peak_op: str
    peak_phase: str
    yield_index: int | None
    yield_activation_bytes: int | None  # live at the YieldOp: the stash plus the outputs handed to PyTorch
    stashed_bytes: int | None  # forward activations kept across the YieldOp for the backward pass
    parameter_bytes: int
    gradient_bytes: int  # the parameter gradients the graph outputs (held to the end of backward)
    input_bytes: int
    constant_bytes: int
    optimizer_state_bytes: int | None  # PyTorch's optimizer, outside the graph; None when not known
    optimizer: str | None
    top_tensors: list[dict[str, Any]]  # activation buffers alive at the peak, largest first
    stashed_tensors: list[dict[str, Any]]  # forward buffers alive across the YieldOp, largest first
    uncertain: list[dict[str, Any]]  # activation buffers whose size is not known (not counted)
    uncertain_at_peak: int
    what: str
    # per step: node, op, phase, live (bytes), gradients (bytes), uncertain (buffers of unknown size)
    steps: dict[str, list] = field(repr=False, default_factory=dict)

    @property
    def exact(self) -> bool:
        """True when every activation buffer's size is known: the peak is exact, not a lower bound."""
        return not self.uncertain

    @property
    def timeline(self):
        """One row per step of the execution order: index, node, op, phase, live_bytes (activations),
        gradient_bytes (parameter gradients produced so far), uncertain (live buffers of unknown size)."""
        import pandas as pd

        s = self.steps
        return pd.DataFrame({"index": range(len(s["node"])), "node": s["node"], "op": s["op"],
                             "phase": s["phase"], "live_bytes": s["live"], "gradient_bytes": s["gradients"],
                             "uncertain": s["uncertain"]})

    def top(self, n: int = 10):
        """The `n` largest activation buffers alive at the peak, as a DataFrame."""
        import pandas as pd

        cols = ["name", "bytes", "shape", "dtype", "producer", "op", "module", "born", "freed", "buffer",
                "views"]
        return pd.DataFrame(self.top_tensors[:n], columns=cols)

    def to_dict(self, timeline: bool = False) -> dict[str, Any]:
        """Plain data (JSON-ready); the per-step timeline only when asked (it has one entry per node)."""
        out = {k: getattr(self, k) for k in (
            "source", "run", "order", "order_reason", "device", "dims", "nodes", "peak_activation_bytes",
            "peak_index", "peak_node", "peak_op", "peak_phase", "yield_index", "yield_activation_bytes",
            "stashed_bytes", "parameter_bytes", "gradient_bytes", "input_bytes", "constant_bytes",
            "optimizer_state_bytes", "optimizer", "top_tensors", "stashed_tensors", "uncertain",
            "uncertain_at_peak", "exact", "what")}
        if timeline:
            out["timeline"] = {k: list(v) for k, v in self.steps.items()}
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemoryAccount:
        """The account back from `to_dict(timeline=True)` (a run's memory.json): what the Lab draws from."""
        from ortlab.account.errors import AccountError

        names = [f.name for f in fields(cls) if f.name != "steps"]
        missing = [k for k in (*names, "timeline") if k not in data]
        if missing:
            raise AccountError(f"not a memory account with its timeline (to_dict(timeline=True)): "
                               f"{', '.join(missing)} missing")
        return cls(**{k: data[k] for k in names}, steps={k: list(v) for k, v in data["timeline"].items()})

    def report(self, n: int = 10) -> str:
        """The account as text: the peak and where, the largest tensors then, what is counted apart."""
        name = self.run or self.source
        lower = ""
        if self.uncertain_at_peak:
            lower = f" (at least: {self.uncertain_at_peak} buffers of unknown size alive)"
        lines = [f"activation memory of {name}",
                 f"peak {_mb(self.peak_activation_bytes)}{lower} at step {self.peak_index} of {self.nodes} "
                 f"({self.peak_phase}): {self.peak_node} [{self.peak_op}]"]
        if self.yield_index is not None:
            lines.append(f"at the yield (step {self.yield_index}): {_mb(self.yield_activation_bytes)} live, "
                         f"of which {_mb(self.stashed_bytes)} stashed for the backward pass")
        dims = ", ".join(f"{k}={v}" for k, v in sorted(self.dims.items())) or "static shapes"
        lines.append(f"shapes at {dims}; order {self.order} ({self.order_reason}); device {self.device}")
        top = self.top(n)
        if len(top):
            top = top.assign(MB=(top["bytes"] / MB).round(3), shape=top["shape"].map(_shape))
            lines += ["", f"largest tensors alive at the peak ({len(self.top_tensors)} in all):",
                      top[["MB", "shape", "dtype", "module", "op", "born", "name"]].to_string(index=False)]
        state = "unknown" if self.optimizer_state_bytes is None else _mb(self.optimizer_state_bytes)
        lines += ["", "counted apart:",
                  f"  parameters {_mb(self.parameter_bytes)}, their gradients {_mb(self.gradient_bytes)}, "
                  f"optimizer state {state}" + (f" ({self.optimizer})" if self.optimizer else ""),
                  f"  user inputs {_mb(self.input_bytes)}, graph constants {_mb(self.constant_bytes)}"]
        if self.uncertain:
            more = " ..." if len(self.uncertain) > 5 else ""
            names = ", ".join(u["name"] for u in self.uncertain[:5]) + more
            lines.append(f"uncertain: {len(self.uncertain)} activation buffers of unknown size, not counted: "
                         f"{names}")
        lines += ["", self.what]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"MemoryAccount({self.run or self.source!r}, peak={_mb(self.peak_activation_bytes)} at "
                f"{self.peak_index} ({self.peak_phase}), stashed={_mb(self.stashed_bytes)}, "
                f"order={self.order!r}, uncertain={len(self.uncertain)})")


def _mb(value: int | None) -> str:
    return "?" if value is None else f"{value / MB:.3f} MB"


def _shape(dims) -> str:
    return "?" if dims is None else "x".join(str(d) for d in dims) or "scalar"
