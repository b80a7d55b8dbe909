"""What collector "memory" accounts for a backend: one adapter per kind of account, which a backend's registry
entry names (`ortlab.engine.backends.Registered.memory`), so that the collector never asks what kind of backend it
serves. `Autograd`: what autograd saves in one step of the model on the first batch, taken before the burst's
first step; `AutogradRunner`: the same through the burst's own module (a compiled one), after the burst;
`Graph`: the execution graph the backend's ORT wrap ran, which ORT writes only when the burst saves its graphs.
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

from ortlab.account.collector import random_state_kept, untouched
from ortlab.engine.backends import label
from ortlab.runs.memory import AUTOGRAD, COUNTS, GRAPH, missing
from ortlab.runs.run import RunStatus


class Account:
    """What collector "memory" asks of a backend's memory account; each method returns memory.json's data, or
    None where this account takes nothing then."""

    saves_graphs = False  # it reads the graphs ORT saves: a burst with collector "memory" saves them (save_onnx)

    def before(self, engine: Any, cfg: Any) -> dict[str, Any] | None:
        """In the collector's start, before the first step."""
        return None

    def after(self, engine: Any, cfg: Any, run_dir: Path, status: str) -> dict[str, Any] | None:
        """In the collector's finish (any status): None keeps what `before` took."""
        return None


class Autograd(Account):
    """What autograd saves in one step of the model, taken before the burst."""

    def before(self, engine: Any, cfg: Any) -> dict[str, Any] | None:
        return _autograd(engine, cfg)


class AutogradRunner(Account):
    """What autograd saves through the burst's own module (its compiled graphs), taken after a burst that ended
    well."""

    def after(self, engine: Any, cfg: Any, run_dir: Path, status: str) -> dict[str, Any] | None:
        if engine.runner is not None and status == RunStatus.OK:
            return _autograd(engine, cfg, runner=engine.runner)
        return None


class Graph(Account):
    """The execution graph the backend's ORT wrap ran (ORT writes it only when the burst saves its graphs)."""

    saves_graphs = True

    def after(self, engine: Any, cfg: Any, run_dir: Path, status: str) -> dict[str, Any] | None:
        return _graph(engine, cfg, run_dir, status)


# ORTModule -> its execution model: ORT writes the graphs only when it exports, and a later burst that reuses
# the wrap has none of its own.
_GRAPHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

NO_SAVE_ONNX = ("ORT writes its execution graph only when the burst saves its graphs: run it with save_onnx on "
                "(options={'save_onnx': True}; CLI: ortlab burst --save-graphs; the Lab: 'save exported graphs')")

def _autograd(engine, cfg, runner: Any = None) -> dict[str, Any]:
    from ortlab.account.torch_account import torch_memory
    from ortlab.compat.errors import root_message
    from ortlab.engine import precision
    from ortlab.engine.config import resolve_device

    device = resolve_device(cfg.device)
    try:
        with untouched(engine.model), precision.autocast(cfg.precision, device):
            account = torch_memory(engine.workload, device=str(device), runner=runner)
    except Exception as e:  # the account must not cost the burst
        return missing(AUTOGRAD, f"autograd's account failed: {type(e).__name__}: {root_message(e)}")
    counts = COUNTS[AUTOGRAD] if runner is None else (
        f"{label(cfg.backend)}: the storages its compiled graphs save for backward in one step on the first batch; "
        "parameters, inputs and what the loss saves apart")
    return {"kind": AUTOGRAD, "counts": counts, **account.to_dict()}


def _graph(engine, cfg, run_dir: Path, status: str) -> dict[str, Any]:
    from ortlab.account.build import account_of
    from ortlab.compat.errors import root_message
    from ortlab.runs.run import load_run

    if not cfg.effective_options()["save_onnx"]:
        return missing(GRAPH, NO_SAVE_ONNX)
    internals = engine.current.ort_internals()  # a backend whose memory account is its ORT wrap's graph
    if internals is None:
        return missing(GRAPH, f"the burst ended ({status}) before ORTModule wrapped the model: no execution graph")
    ort_module = internals.ort_module
    if status == RunStatus.FALLBACK:
        return missing(GRAPH, "ORTModule fell back to PyTorch: no ORT execution graph ran in this burst")
    path = internals.stage_path("execution_model")
    note = None
    if path is not None:
        _GRAPHS[ort_module] = path
    elif ort_module in _GRAPHS and _GRAPHS[ort_module].is_file():
        path = _GRAPHS[ort_module]
        note = f"ORT did not export in this burst: the graph is that of the burst whose ORTModule it reused, {path}"
    else:
        return missing(GRAPH, "ORT saved no execution graph for this burst: it ended before ORT built its session, "
                              "or it reused the ORTModule of an earlier burst that did not save its graphs")
    try:
        with random_state_kept():
            inputs, _ = engine.feed.batch(0)  # this burst's first batch (its sampler's, its rank's)
        info = internals.post_export()
        account = account_of(path, load_run(run_dir), input_shapes=engine.current.graph_input_shapes(inputs),
                             user_inputs=None if info is None else info.user_inputs)
    except Exception as e:  # the account must not cost the burst
        return missing(GRAPH, f"the account of {path.name} failed: {type(e).__name__}: {root_message(e)}")
    data = {"kind": GRAPH, "counts": COUNTS[GRAPH], **account.to_dict(timeline=True)}
    if note:
        data["note"] = note
    return data
