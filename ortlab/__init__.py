"""ortlab: explore ONNX Runtime's ORTModule interactively: options, bursts beside PyTorch, runs on disk."""

from importlib import import_module as _import_module

__version__ = "0.1.0"

# name -> module; loaded on first use so that `import ortlab` imports neither torch nor onnxruntime.
_EXPORTS = {
    "Options": "ortlab.options",
    "OptionError": "ortlab.options",
    "OptionSpec": "ortlab.options",
    "REGISTRY": "ortlab.options",
    "registry_table": "ortlab.options",
    "Session": "ortlab.worker",
    "burst": "ortlab.worker",
    "session": "ortlab.worker",
    "WorkerError": "ortlab.worker",
    "BurstError": "ortlab.burst",
    "Workload": "ortlab.workload",
    "WorkloadError": "ortlab.workload",
    "Run": "ortlab.run",
    "load_run": "ortlab.run",
    "list_runs": "ortlab.run",
    "Comparison": "ortlab.summary",
    "Snapshot": "ortlab.snapshot",
    "Lab": "ortlab.widgets.lab",
    "compare": "ortlab.activations",
    "tap": "ortlab.activations",
    "bisect": "ortlab.activations",
    "plans": "ortlab.recompute",
    "plan_sweep": "ortlab.recompute",
    "what_if": "ortlab.recompute",
    "doctor": "ortlab.environment",
    "setup": "ortlab.environment",
}

__all__ = sorted([*_EXPORTS, "activations", "graphs"])


def __getattr__(name: str):
    if name in ("graphs", "activations"):  # ortlab.graphs is a callable module: graphs(run) and graphs.Stage
        return _import_module(f"ortlab.{name}")
    if name in _EXPORTS:
        value = getattr(_import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ortlab' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
