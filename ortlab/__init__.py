"""ortlab: explore ONNX Runtime's ORTModule interactively: options, bursts beside PyTorch, runs on disk."""

from ortlab.common import quiet as _quiet
from ortlab.common.lazy import lazy as _lazy

__version__ = "0.1.0"
_quiet.install()  # third-party warnings that say nothing about a run (ortlab/common/quiet.py)


# name -> "module" or "module:attribute"; loaded on first use, so that `import ortlab` imports neither torch nor
# onnxruntime.
_EXPORTS = {
    "Options": "ortlab.options",
    "OptionError": "ortlab.options",
    "OptionSpec": "ortlab.options",
    "REGISTRY": "ortlab.options",
    "registry_table": "ortlab.options",
    "Session": "ortlab.engine.session",
    "burst": "ortlab.engine.calls",
    "session": "ortlab.engine.calls",
    "check": "ortlab.engine.calls",
    "judge": "ortlab.verdict.judge",
    "Verdict": "ortlab.verdict.judge",
    "judge_runs": "ortlab.verdict.folders",
    "judge_logs": "ortlab.verdict.debug_logs:compare",
    "compare_stacks": "ortlab.comparison.cross_stack",
    "move_report": "ortlab.move.report",
    "MoveReport": "ortlab.move.report",
    "repro": "ortlab.verdict.repro",
    "Localization": "ortlab.verdict.localize",
    "CheckReport": "ortlab.compat.report",
    "FIXES": "ortlab.compat.registry",
    "WorkerError": "ortlab.engine.client",
    "BurstError": "ortlab.engine.config",
    "InputError": "ortlab.errors",
    "OrtlabError": "ortlab.errors",
    "Workload": "ortlab.workload",
    "WorkloadError": "ortlab.workload",
    "imbalance": "ortlab.engine.balance",
    "imbalance_table": "ortlab.engine.balance",
    "sampler_comparison": "ortlab.engine.balance",
    "sampler_figure": "ortlab.engine.balance",
    "Run": "ortlab.runs.run",
    "load_run": "ortlab.runs.run",
    "list_runs": "ortlab.reporting.listing",
    "Comparison": "ortlab.comparison.summary",
    "Snapshot": "ortlab.runs.snapshot",
    "Lab": "ortlab.widgets.lab",
    "compare": "ortlab.activations",
    "tap": "ortlab.activations",
    "bisect": "ortlab.activations",
    "plans": "ortlab.recompute",
    "plan_sweep": "ortlab.recompute",
    "what_if": "ortlab.recompute",
    "tune": "ortlab.tuning",
    "Tuning": "ortlab.tuning",
    "load_graphs": "ortlab.graphs:load",
    "memory": "ortlab.account:memory",
    "torch_memory": "ortlab.account:torch_memory",
    "time": "ortlab.timing.table",
    "report": "ortlab.reporting",
    "record": "ortlab.integrations.recorder",
    "Recorder": "ortlab.integrations.recorder",
    "wrap": "ortlab.wrapping",
    "WrapError": "ortlab.wrapping",
    "OrtModuleFailed": "ortlab.wrapping",
    "doctor": "ortlab.engine.diagnosis",
    "setup": "ortlab.stacks.environment",
}

# Subpackages reachable as attributes (`ortlab.graphs.load(run)`); no public name above equals a submodule's name
# (importing the submodule would rebind the attribute), which tests/test_api.py checks.
_PACKAGES = ("account", "activations", "compat", "graphs", "hf", "lightning", "recompute", "tuning", "verdict")

__all__ = sorted([*_EXPORTS, *_PACKAGES])

__getattr__, __dir__ = _lazy(__name__, _EXPORTS, globals(), packages=_PACKAGES)
