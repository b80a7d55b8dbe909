"""The one adapter to onnxruntime-training's private internals: nothing else in ortlab names them.

ORTModule keeps what ortlab shows (why it exported, its post-export model info, the memory optimizer's plans,
its init overhead, where it saved the stage graphs) in private attributes that move between releases. Every
such access is here, behind a small typed surface, so that an ORT upgrade touches this file only. When
something moved, `OrtInternalsError` names what is missing and which versions ortlab supports.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ortlab.errors import OrtlabError

SUPPORTED = "onnxruntime-training 1.19.x (tested with 1.19.2)"
ORIGINAL_MODULE = "_original_module"  # ORTModule's name for the user's module: exported names start with it


class OrtInternalsError(OrtlabError, RuntimeError):
    """ORTModule's private state is not where ortlab expects it (another onnxruntime-training version)."""


@functools.cache
def ort_version() -> str | None:
    import importlib.metadata as md

    try:
        return md.version("onnxruntime-training")
    except md.PackageNotFoundError:
        return None


@functools.cache
def check_version() -> None:
    """Once per process: say when the installed ORT is not the one these internals were read from (they may
    have moved; each access below still names what is missing if they did)."""
    version = ort_version()
    if version is not None and not version.startswith("1.19."):
        import warnings

        warnings.warn(f"onnxruntime-training {version} is installed; ortlab supports {SUPPORTED}: ORTModule's "
                      "internals may have moved", RuntimeWarning, stacklevel=3)


def _missing(what: str) -> OrtInternalsError:
    return OrtInternalsError(f"onnxruntime-training {ort_version() or '(not installed)'} has no {what}; "
                             f"ortlab supports {SUPPORTED}")


def _get(obj: Any, attr: str, what: str) -> Any:
    try:
        return getattr(obj, attr)
    except AttributeError:
        raise _missing(f"{what} ({attr})") from None


def _private(module: str, name: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        raise _missing(f"{module}.{name}") from None


# --------------------------------------------------------------------------- one ORTModule wrap


@dataclass(frozen=True)
class PostExportInfo:
    """What ORT's GraphTransitionManager knows about the exported graph's inputs and outputs."""

    graph_input_names: list[str]
    graph_inputs_requiring_grad: list[str]
    user_inputs: list[str]
    user_inputs_requiring_grad: list[str]
    dynamic_axes: dict[str, dict[str, str]]  # input name -> {axis index: symbolic dimension name}
    output_schema: str
    input_accessors: dict[str, Callable[[tuple, dict], Any]]  # user input name -> (args, kwargs) -> its tensor

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "input_accessors"}  # no functions


@dataclass(frozen=True)
class PlanSummary:
    """One recompute plan as ORT's memory observer holds it."""

    cluster_id: str
    saving_expr: str  # simplified symbolic saving, in bytes
    raw_expr: str
    frequency: int
    ort_saving: Any  # ORT's own evaluation at the dims it saw first (a number, or a string when it could not)


@dataclass(frozen=True)
class MemoryObserver:
    """ORT's memory observer of a wrap: the recompute plans it found and the settings it ran with."""

    enabled: bool
    dims: dict[str, int]  # symbolic dimension -> the value ORT saw in its first batch
    plans: list[PlanSummary]
    memory_opt_level: int
    probe_config: str
    config_path: str


class Wrap:
    """ORT's private state of one ORTModule, in one mode (training or eval)."""

    def __init__(self, ort_module: Any, training: bool = True):
        check_version()
        self.ort_module = ort_module
        torch_module = _get(ort_module, "_torch_module", "ORTModule._torch_module")
        managers = _get(torch_module, "_execution_manager", "ORTModule's execution manager")
        self.manager = managers(training)

    @property
    def _gtm(self) -> Any:
        return getattr(self.manager, "_graph_transition_manager", None)

    def exported_model(self) -> Any:
        """ORT's record of the last export (a new object after every export; None before the first)."""
        return getattr(self._gtm, "_exported_model_info", None)

    def training_model(self) -> Any:
        """The training graph ORT built and runs (ONNX: forward, YieldOp, gradient nodes); None before a run."""
        return getattr(getattr(self.manager, "_onnx_models", None), "optimized_model", None)

    def graph_inputs_read(self) -> set[str] | None:
        """The inputs of the exported graph that some node reads (a user input the trace consumed in Python is
        pruned or left unread: its value was baked in); None before the first export."""
        model = getattr(self.exported_model(), "exported_model", None)
        if model is None:
            return None
        read = {name for node in model.graph.node for name in node.input}
        return {i.name for i in model.graph.input if i.name in read}

    def post_export(self) -> PostExportInfo | None:
        info = getattr(self._gtm, "_post_export_processed_model_info", None)
        if info is None:
            return None
        return PostExportInfo(
            graph_input_names=list(info.onnx_graph_input_names),
            graph_inputs_requiring_grad=list(info.onnx_graph_input_names_require_grad),
            user_inputs=list(info.onnx_graph_input_names_user_defined),
            user_inputs_requiring_grad=list(info.onnx_graph_input_names_require_grad_user_defined),
            dynamic_axes={k: {str(d): str(n) for d, n in v.items()}
                          for k, v in info.onnx_graph_input_dynamic_axes_map.items()},
            output_schema=str(info.module_forward_output_schema),
            input_accessors=dict(info.onnx_graph_input_data_accessor_user_defined),
        )

    def set_onnx_save_path(self, path: Path) -> None:
        """Point this wrap's stage graphs at `path` (ORT keeps one DebugOptions per ORTModule)."""
        save = _get(_get(self.manager, "_debug_options", "DebugOptions of the execution manager"),
                    "save_onnx_models", "DebugOptions.save_onnx_models")
        save._path = str(path)

    def stage_path(self, stage: str) -> Path | None:
        """Where ORT saved a stage graph of this wrap (save_onnx on), if it did."""
        name_of = _private("onnxruntime.training.ortmodule._onnx_models", "_get_onnx_file_name")
        save = _get(self.manager, "_debug_options", "DebugOptions of the execution manager").save_onnx_models
        if not save.save:
            return None
        path = Path(save.path) / name_of(save.name_prefix, stage, _get(self.manager, "_export_mode", "export mode"))
        return path if path.is_file() else None

    def init_overhead(self) -> dict[str, float]:
        """ORT's first-time initialization breakdown in seconds (export, graph building, session creation ...)."""
        phases = _private("onnxruntime.training.ortmodule._logger", "ORTModuleInitPhase")
        not_recorded = _private("onnxruntime.training.ortmodule._logger", "TimeTracker").NOT_RECORD
        tracker = _get(self.manager, "time_tracker", "execution manager time tracker")
        seconds = {phase.to_string(): tracker._get_duration(phase) for phase in phases}
        return {name: round(s, 4) for name, s in seconds.items() if s != not_recorded}

    def fallback(self) -> BaseException | None:
        """The exception that made ORTModule fall back to PyTorch, if it did."""
        return getattr(getattr(self.ort_module, "_fallback_manager", None), "_exception", None)

    def end_profiling(self) -> tuple[Path | None, int]:
        """Stop ORT's profiler of this wrap's session (`profile_sessions`; it cannot restart): (its JSON file or
        None when it did not profile, the profiler's start in ns since the epoch: the file's timestamps' base)."""
        agent = _get(self.manager, "_execution_agent", "execution agent of the execution manager")
        if agent is None:
            return None, 0
        session = _get(agent, "_inference_session", "the execution agent's InferenceSession")
        if not session.get_session_options().enable_profiling:
            return None, 0
        start = int(session.get_profiling_start_time_ns())
        path = session.end_profiling()
        return (Path(path) if path else None), start

    def python_ops(self) -> dict[str, str]:
        """The exported graph's PythonOp nodes: node name -> the autograd.Function it runs (func_name)."""
        model = getattr(self.exported_model(), "exported_model", None)
        if model is None:
            return {}
        return {node.name: a.s.decode() for node in model.graph.node if node.op_type == "PythonOp"
                for a in node.attribute if a.name == "func_name"}

    def memory_observer(self) -> MemoryObserver:
        inspector = _get(self.manager, "_runtime_inspector", "runtime inspector")
        observer = _get(inspector, "memory_ob", "memory observer")
        runtime = _get(self.manager, "_runtime_options", "runtime options")
        plans = [PlanSummary(str(cluster_id), str(s.simplified_symbolic_saving_expr), str(s.raw_symbolic_saving_str),
                             int(s.freq), s.evaluated_saving)
                 for cluster_id, s in _get(observer, "cluster_id_combination_to_saving_symbolics_map",
                                           "memory observer plans").items()]
        return MemoryObserver(enabled=bool(observer.is_enabled()), plans=plans,
                              dims={str(k): int(v) for k, v in observer.symbolic_dim_name_to_value_map.items()},
                              memory_opt_level=int(runtime.memory_optimization_level),
                              probe_config=str(runtime.recompute_probe_config),
                              config_path=runtime.memory_optimizer_config_file_path or "")


# --------------------------------------------------------------------------- process-wide


def exporting_flag() -> list:
    """ORT's own "exporting now" flag (a one-element list it sets around export): hooks must not count steps
    then. A stand-in that stays False when this ORT has none."""
    try:
        return _private("onnxruntime.training.utils.hooks._subscriber_manager", "ORT_NO_INCREASE_GLOBAL_STEP")
    except OrtInternalsError:
        return [False]


_PROFILE_PREFIX: list[str | None] = [None]  # where sessions ORTModule creates now write ORT's profile (None: off)
_SESSION_THREADS: list[int | None] = [None]  # intra-op threads of the sessions ORTModule creates (session_threads)


def profile_sessions(prefix: str | None) -> None:
    """Sessions ORTModule creates from now on run ORT's profiler into `<prefix>_<time>.json` (None: off); its
    session options come from one private method (`_get_session_config`), patched once per process."""
    if prefix is not None:
        _patch_session_config()
    _PROFILE_PREFIX[0] = prefix


def session_threads(threads: int | None) -> None:
    """Sessions ORTModule creates from now on use `threads` intra-op threads (None: ORT's default, its count of
    physical cores, which ignores a CPU affinity or a container's quota: its pool then spins against torch's)."""
    if threads is not None:
        _patch_session_config()
    _SESSION_THREADS[0] = threads


@functools.cache
def _patch_session_config() -> None:
    manager = _private("onnxruntime.training.ortmodule._graph_execution_manager", "GraphExecutionManager")
    original = manager.__dict__.get("_get_session_config")
    if original is None:
        raise _missing("GraphExecutionManager._get_session_config")

    @functools.wraps(original)
    def session_config(self):
        options, providers, provider_options = original(self)
        if _PROFILE_PREFIX[0] is not None:
            options.enable_profiling = True
            options.profile_file_prefix = _PROFILE_PREFIX[0]
        if _SESSION_THREADS[0] is not None and not options.intra_op_num_threads:
            options.intra_op_num_threads = _SESSION_THREADS[0]
        return options, providers, provider_options

    manager._get_session_config = session_config


KNOWN_BUG_LABEL_HOOK = (
    "onnxruntime-training 1.19.2 fails every export with \"TypeError: 'NoneType' object is not iterable\" when "
    "the embedding sparse optimizer is off (ORTMODULE_ENABLE_COMPUTE_OPTIMIZER=0 or "
    "ORTMODULE_ENABLE_EMBEDDING_SPARSE_OPTIMIZER=0): GraphTransitionManager._add_check_label_sparsity_hook returns "
    "None instead of an empty list. ortlab makes it return [] so that these options can be used."
)


def patch_label_hook_bug() -> None:
    """Work around the 1.19.2 export crash described in KNOWN_BUG_LABEL_HOOK (a no-op when already patched)."""
    gtm = _private("onnxruntime.training.ortmodule._graph_transition_manager", "GraphTransitionManager")
    original = gtm.__dict__.get("_add_check_label_sparsity_hook")
    if original is None:
        raise _missing("GraphTransitionManager._add_check_label_sparsity_hook")
    if getattr(original, "_ortlab_patched", False):
        return
    inner = original.__func__

    def fixed(*args, **kwargs):
        return inner(*args, **kwargs) or []

    fixed._ortlab_patched = True
    gtm._add_check_label_sparsity_hook = staticmethod(fixed)
    gtm.__dict__["_add_check_label_sparsity_hook"]._ortlab_patched = True


# Function names in ORT's traceback -> the stage a person would name (most specific first).
FAILURE_STAGES = (
    ("symbolic_shape_infer", "ORT's symbolic shape inference after export"),
    ("_get_exported_model", "the export to ONNX"),
    ("_export_model", "the export to ONNX"),
    ("_post_export_process", "ORT's post-export processing"),
    ("_build_graph", "ORT's graph building (gradient graph)"),
    ("_initialize_graph_builder", "ORT's graph builder initialization"),
    ("_create_execution_agent", "ORT's session creation"),
    ("_detect_from_inputs", "ORT's runtime detection"),
)


# --- building one, and reading a user's own (the recorder)


def new_ortmodule(module: Any, log_level: str = "WARNING", **debug: Any) -> Any:
    """A new ORTModule over `module` (the one place ortlab builds one): DebugOptions(log_level, **debug)."""
    from onnxruntime.training.ortmodule import DebugOptions, LogLevel, ORTModule

    patch_label_hook_bug()
    return ORTModule(module, DebugOptions(log_level=LogLevel[log_level], **debug))


def is_ortmodule(model: Any) -> bool:
    """Whether `model` is an ORTModule, without importing ORT where nothing did (no model can be one then)."""
    module = sys.modules.get("onnxruntime.training.ortmodule")
    return module is not None and isinstance(model, getattr(module, "ORTModule", ()))


def inner_module(ort_module: Any) -> Any:
    """The user's torch module inside an ORTModule."""
    return ort_module.module


def log_level(ort_module: Any) -> str:
    """The log level an ORTModule was built with (its DebugOptions, or ORTMODULE_LOG_LEVEL)."""
    debug = _get(Wrap(ort_module, True).manager, "_debug_options", "DebugOptions of the execution manager")
    return str(getattr(debug.log_level, "name", debug.log_level))


def onnx_save_settings(ort_module: Any) -> tuple[bool, str, str]:
    """(save_onnx, the folder ORT writes stage graphs into, their name prefix)."""
    save = Wrap(ort_module, True).manager._debug_options.save_onnx_models
    return bool(save.save), str(save.path), str(save.name_prefix)


@functools.cache
def load_balancing_samplers() -> tuple[type, type]:
    """ORT's `LoadBalancingDistributedSampler` and `LoadBalancingDistributedBatchSampler`, loaded from their file
    (the package's init would import ORTModule: seconds, and its import-time options, even in a PyTorch burst)."""
    spec = importlib.util.find_spec("onnxruntime")
    path = Path(spec.origin).parent / "training" / "utils" / "data" / "sampler.py" if spec and spec.origin else None
    if path is None or not path.is_file():
        module = importlib.import_module("onnxruntime.training.utils.data")
    else:
        file_spec = importlib.util.spec_from_file_location("ortlab._ort_sampler", path)
        module = importlib.util.module_from_spec(file_spec)
        file_spec.loader.exec_module(module)
    return (_get(module, "LoadBalancingDistributedSampler", "the load-balancing sampler"),
            _get(module, "LoadBalancingDistributedBatchSampler", "the load-balancing batch sampler"))


# --- activations (the stats collector's PythonOps)


def export_unsafe(function: type) -> None:
    """ORT runs the PythonOps of `function` (an autograd.Function that saves no tensor, marks nothing dirty, changes
    nothing in place) in its unsafe mode from the next export on: no Function.apply bookkeeping (tens of us less
    per op and step on the demo), as ORT runs its own memory-efficient gradient op. Idempotent."""
    module = "onnxruntime.training.ortmodule._custom_autograd_function_exporter"
    handlers = _private(module, "_SpecialCustomFunctionHandler")
    default_export = _private(module, "_default_export")
    qualified = _private(module, "get_fully_qualified_class_name")(function)
    onnx_dtype = _private(module, "pytorch_type_to_onnx_dtype")

    def export(g, n, *args, **kwargs):
        outputs = list(n.outputs())
        return default_export(_UnsafeOps(g), qualified, function, n.cconv(), n.outputsSize(),
                              [onnx_dtype(o.type().scalarType()) for o in outputs],
                              [o.type().dim() for o in outputs], *args, **kwargs)

    _get(handlers, "add_handler", "exporter's handler registry")(qualified, export)


class _UnsafeOps:
    """The exporter's graph context, adding safe_run_mode=0 to the PythonOp nodes it makes."""

    def __init__(self, g: Any):
        self._g = g

    def op(self, kind: str, *args: Any, **attrs: Any) -> Any:
        if kind == "com.microsoft::PythonOp":
            attrs["safe_run_mode_i"] = 0
        return self._g.op(kind, *args, **attrs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._g, name)


def failing_node(exc: BaseException | None) -> tuple[str, str] | None:
    """(name, op type) of the graph node ORT's Python was processing when `exc` (or an error it wraps) was raised:
    the outermost traceback frame holding a `node` (shape inference takes them one at a time), or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            node = frame.f_locals.get("node") if "onnxruntime" in frame.f_code.co_filename else None
            if isinstance(getattr(node, "op_type", None), str) and isinstance(getattr(node, "name", None), str):
                return node.name, node.op_type
            tb = tb.tb_next
        exc = exc.__cause__ or exc.__context__
    return None


# --- compatibility checks (ortlab.compat): ORTModule's export set-up and its gradient builder, one graph at a time


def register_export_symbolics(opset: int) -> None:
    """Register the exporter symbolics ORTModule registers when it wraps a model (contrib ops, ATen mappings,
    gradients): ortlab's own export then sees the operators ORTModule's does."""
    import onnxruntime.training.ortmodule  # noqa: F401  (enables custom autograd.Function export: PythonOp)
    from onnxruntime.tools import pytorch_export_contrib_ops

    pytorch_export_contrib_ops.register()
    _private("onnxruntime.training.ortmodule._custom_op_symbolic_registry", "CustomOpSymbolicRegistry").register_all(
        opset)
    _private("onnxruntime.training.ortmodule._custom_gradient_registry", "CustomGradientRegistry").register_all()


class GradientBuildError(OrtlabError, RuntimeError):
    """ORT's graph builder loaded the model but could not build its gradient graph (ORT's message)."""


def gradient_graph(model_bytes: bytes, trained: list[str]) -> bytes:
    """ORT's gradient graph of an ONNX model whose inputs `trained` require gradients, by ORTModule's own graph
    builder. ORT's error when it cannot load the model; GradientBuildError when it has no gradient for it."""
    from onnxruntime.capi import _pybind_state as C

    config = _get(C, "OrtModuleGraphBuilderConfiguration", "ORTModule's graph builder configuration")()
    config.initializer_names = config.initializer_names_to_train = list(trained)
    config.input_names_require_grad, config.build_gradient_graph, config.loglevel = [], True, C.Severity.FATAL
    config.enable_caching = config.use_memory_efficient_gradient = False
    builder = _get(C, "OrtModuleGraphBuilder", "ORTModule's graph builder")()
    builder.initialize(model_bytes, config)
    try:
        builder.build(C.TrainingGraphTransformerConfiguration())
    except Exception as e:
        raise GradientBuildError(str(e)) from None
    return builder.get_gradient_model()
