"""Activation statistics for convergence parity: collect them in any burst (`collect={"stats": {...}}`), read
ORT's StatisticsSubscriber dumps, compare runs and find the first divergence, its noise floor, and the ORTModule
option that causes it.

    with ortlab.Session() as s:
        c = s.compare(steps=20, parity=True, collect={"stats": {}})
    diff = ortlab.activations.compare(c)     # or compare(run_a, run_b), compare("pt_out", "ort_out")
    diff.first                               # Divergence(step, phase, name, module, metric, ..., previous)
    diff.heatmap()                           # matplotlib figure: tensor x step
"""

from importlib import import_module as _import_module

# Bound now, not lazily: the functions compare and bisect share their modules' names, and a submodule import
# would otherwise replace the function on the package. These modules need numpy only.
from ortlab.activations.bisect import BisectResult, bisect
from ortlab.activations.compare import ActivationDiff, Divergence, NonFinite, Tolerances, compare, load
from ortlab.activations.noise import NoiseFloor, noise_floor

# name -> module, loaded on first use: `import ortlab.activations` imports neither torch nor matplotlib.
_EXPORTS = {
    "tap": "ortlab.activations.collect",
    "StatsCollector": "ortlab.activations.collect",
    "read_stats": "ortlab.activations.table",
    "read_dump": "ortlab.activations.legacy",
    "merge": "ortlab.activations.legacy",
    "DumpError": "ortlab.activations.legacy",
}

__all__ = sorted([*_EXPORTS, "register_cli", "ActivationDiff", "BisectResult", "Divergence", "NoiseFloor",
                  "NonFinite", "Tolerances", "bisect", "compare", "load", "noise_floor"])


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(_import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ortlab.activations' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))


def register_cli(subparsers) -> None:
    """Add `diff`, `merge` and `bisect` to ortlab's command line."""
    from ortlab.activations.cli import register

    register(subparsers)
