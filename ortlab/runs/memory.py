"""memory.json, the account a burst writes (collector "memory"), and what a run's summary shows of it.

Light on purpose: `Run.summary()` reads it without importing torch, onnx or pandas.
"""

from __future__ import annotations

from typing import Any

FILE = "memory.json"
MB = 2**20
GRAPH = "graph"  # ORTModule: the execution graph's account (MemoryAccount)
AUTOGRAD = "autograd"  # PyTorch: what autograd saves for backward (TorchAccount)
COUNTS = {
    GRAPH: "ORTModule: the activation buffers of ORT's execution graph at the burst's shapes, step by step (kept "
           "for backward: forward buffers alive across the yield); parameters, gradients, optimizer state apart",
    AUTOGRAD: "PyTorch: the storages autograd saves for backward in one step on the first batch; parameters, "
              "inputs and what the loss saves apart",
}


def missing(kind: str, reason: str) -> dict[str, Any]:
    """memory.json when there is no account: what would have been counted, and why it is not there."""
    return {"kind": kind, "counts": COUNTS[kind], "missing": reason}


def summary_fields(data: dict[str, Any] | None) -> dict[str, Any]:
    """A run's summary of its account: MB kept for backward (both backends; the figure to compare), the
    graph's activation peak (ORTModule; autograd's account does not see backward temporaries), what is
    counted, or why there is no account. {} when the burst did not collect one."""
    if not data:
        return {}
    allocator = data.get("allocator")  # CUDA: the caching allocator's peaks over the burst's steps
    extra = {"cuda_allocator_mb": {k.removesuffix("_bytes"): _mb(v) for k, v in allocator.items()}} if allocator \
        else {}
    if data.get("missing"):
        return {"memory_missing": data["missing"], "memory_counts": data.get("counts"), **extra}
    counts = data.get("counts") or COUNTS.get(data.get("kind") or "", "")
    if data.get("kind") == AUTOGRAD:
        return {"saved_for_backward_mb": _mb(data.get("saved_bytes")), "memory_counts": counts, **extra}
    if data.get("uncertain"):
        counts += (f"; a lower bound: {len(data['uncertain'])} buffers of unknown size not counted "
                   f"({data.get('uncertain_at_peak', 0)} alive at the peak)")
    return {"saved_for_backward_mb": _mb(data.get("stashed_bytes")),
            "activation_peak_mb": _mb(data.get("peak_activation_bytes")), "memory_counts": counts, **extra}


def _mb(value: Any) -> float | None:
    return None if value is None else round(value / MB, 3)
