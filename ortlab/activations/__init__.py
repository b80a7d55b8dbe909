"""Activation statistics for convergence parity: collect them in any burst (`collect={"stats": {...}}`), read
ORT's StatisticsSubscriber dumps, compare runs and find the first divergence, its noise floor, and the
ORTModule option that causes it.

    with ortlab.Session() as s:
        c = s.compare(steps=20, parity=True, collect={"stats": {}})
    diff = ortlab.activations.compare(c)     # or compare(run_a, run_b), compare("pt_out", "ort_out")
    diff.first                               # Divergence(step, phase, name, module, metric, ..., previous)
    diff.heatmap()                           # matplotlib figure: tensor x step

No public name here is also a submodule's name (importing the submodule would rebind the attribute):
`compare` lives in `diff`, `bisect` in `bisection`, `tap` in `pythonop`.
"""

from ortlab.common.lazy import lazy as _lazy

# name -> module, loaded on first use: `import ortlab.activations` imports neither torch, pandas nor
# matplotlib.
_EXPORTS = {
    "compare": "ortlab.activations.diff",
    "load": "ortlab.activations.diff",
    "ActivationDiff": "ortlab.activations.results",
    "Divergence": "ortlab.activations.results",
    "NonFinite": "ortlab.activations.results",
    "Tolerances": "ortlab.activations.results",
    "noise_floor": "ortlab.activations.noise",
    "NoiseFloor": "ortlab.activations.noise",
    "bisect": "ortlab.activations.bisection",
    "BisectResult": "ortlab.activations.bisection",
    "tap": "ortlab.activations.pythonop",
    "StatsCollector": "ortlab.activations.collect",
    "read_stats": "ortlab.activations.table",
    "read_dump": "ortlab.activations.legacy",
    "merge": "ortlab.activations.legacy",
    "ActivationsError": "ortlab.activations.errors",
    "DumpError": "ortlab.activations.errors",
    "FailedBurstError": "ortlab.activations.errors",
    "StatsError": "ortlab.activations.errors",
    "StatsFileError": "ortlab.activations.errors",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = _lazy(__name__, _EXPORTS, globals())
