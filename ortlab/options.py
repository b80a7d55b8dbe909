"""Every ORTModule option as typed data, validated values, and a scoped environment that is always restored.

The registry was read off onnxruntime-training 1.19.2's own source: `read_at` says when ORT reads each
variable, which decides what a change costs (a new worker process, a new ORTModule wrap, or nothing).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ortlab.common.enums import StrEnum
from ortlab.errors import InputError, did_you_mean


class OptionError(InputError):
    """A bad option name or value; the message names the option, the value and what is allowed."""


class ReadAt(StrEnum):
    """When ORT 1.19.2 reads an option, and so what a change to it needs."""

    IMPORT = "import"  # once per process: a change needs a new worker (in a notebook: a kernel restart)
    CONSTRUCTION = "construction"  # when ORTModule(...) is built: a change needs a new wrap
    EXPORT = "export"  # each time the model is exported: a change needs a new wrap to take effect
    RUNTIME = "runtime"  # when the feature first runs (e.g. the first Triton kernel)
    NEVER = "never"  # documented, but 1.19.2 never reads it


class Kind(StrEnum):
    BOOL = "bool"
    INT = "int"
    CHOICE = "choice"
    PATH = "path"
    TEXT = "text"


@dataclass(frozen=True)
class OptionSpec:
    """One ORTModule option as ortlab knows it: its name and variable, type, default, what it does, when ORT reads
    it (1.19.2 source) and whether it changes the exported graph."""

    name: str
    env: str | None  # None: a DebugOptions field with no environment variable
    kind: Kind
    default: Any
    description: str
    area: str
    read_at: ReadAt
    changes_graph: bool
    needs_cuda: bool = False
    choices: tuple[Any, ...] = ()
    minimum: int | None = None
    debug_option: bool = False  # also (or only) a DebugOptions constructor argument
    documented: bool = True  # appears in ORTModule_Training_Guidelines.md
    source: str = ""  # where 1.19.2 reads it

    @property
    def restart_note(self) -> str:
        """What a change of this option costs, from when ORT reads it (a new worker, a re-wrap, nothing)."""
        return {
            ReadAt.IMPORT: "read once when onnxruntime is imported: a change starts a new worker "
                           "(in-process: restart the kernel)",
            ReadAt.CONSTRUCTION: "read when ORTModule is constructed: a change re-wraps (and re-exports) the model",
            ReadAt.EXPORT: "read during export: a change re-wraps so that the model is exported again",
            ReadAt.RUNTIME: "read when the feature runs",
            ReadAt.NEVER: "documented but not read by onnxruntime-training 1.19.2: setting it has no effect",
        }[self.read_at]

    def to_dict(self) -> dict:
        """The spec as plain data (`ortlab options --json`)."""
        d = asdict(self)
        d["kind"], d["read_at"] = self.kind.value, self.read_at.value
        d["choices"] = list(self.choices)
        return d

    def parse(self, value: Any) -> Any:
        """The typed value for `value` (a Python value or its environment-variable text), or OptionError."""
        allowed = self.allowed()
        try:
            if self.kind is Kind.BOOL:
                if isinstance(value, bool):
                    return value
                text = str(value).strip().lower()
                if text in ("1", "true", "on", "yes"):
                    return True
                if text in ("0", "false", "off", "no"):
                    return False
                raise ValueError
            if self.kind is Kind.INT:
                if isinstance(value, bool):
                    raise ValueError
                number = int(str(value).strip()) if not isinstance(value, int) else value
                if self.minimum is not None and number < self.minimum:
                    raise ValueError
                if self.choices and number not in self.choices:
                    raise ValueError
                return number
            if self.kind is Kind.CHOICE:
                text = str(getattr(value, "name", value)).strip().upper()
                if text not in self.choices:
                    raise ValueError
                return text
            if value is None:
                raise ValueError
            return os.fspath(value) if self.kind is Kind.PATH else str(value)
        except (TypeError, ValueError):
            raise OptionError(f"option {self.name} ({self.env or 'DebugOptions'}): {value!r} is not allowed; "
                              f"allowed: {allowed}") from None

    def allowed(self) -> str:
        """The values the option takes, in words (`true/false`, the choices, a range)."""
        if self.kind is Kind.BOOL:
            return "true/false (or 1/0)"
        if self.choices:
            return ", ".join(map(str, self.choices))
        if self.kind is Kind.INT:
            return "an integer" + (f" >= {self.minimum}" if self.minimum is not None else "")
        return "a path" if self.kind is Kind.PATH else "text"

    def to_env(self, value: Any) -> str:
        """The environment-variable text of `value`."""
        if self.kind is Kind.BOOL:
            return "1" if value else "0"
        return str(value)


_OPT = "ORTMODULE/Optimizations"
_TRITON = "ORTMODULE/TritonOp"
_INSPECT = "ORTMODULE/RuntimeInspector"
_DEBUG = "ORTMODULE/DebugOptions"
_PYOP = "ORTMODULE/PythonOp (torch.autograd.Function)"
_RT = "ORTMODULE/RuntimeOptions"
_LOG_LEVELS = ("VERBOSE", "DEVINFO", "INFO", "WARNING", "ERROR", "FATAL")
_FALLBACK = (
    "DEFAULT",  # ORT's default: fall back for unsupported device, data, torch model and ONNX model
    "FALLBACK_DISABLE",
    "FALLBACK_FORCE_TORCH_FORWARD",
    "FALLBACK_FORCE_TORCH_BACKWARD",
    "FALLBACK_UNSUPPORTED_DEVICE",
    "FALLBACK_UNSUPPORTED_DATA",
    "FALLBACK_UNSUPPORTED_TORCH_MODEL",
    "FALLBACK_UNSUPPORTED_ONNX_MODEL",
    "FALLBACK_BAD_INITIALIZATION",
)

REGISTRY: tuple[OptionSpec, ...] = (
    # DebugOptions
    OptionSpec("log_level", "ORTMODULE_LOG_LEVEL", Kind.CHOICE, "WARNING",
               "ORTModule log level; INFO and DEVINFO add exporter and backend logs (captured in the run log)",
               _DEBUG, ReadAt.CONSTRUCTION, False, choices=_LOG_LEVELS, debug_option=True,
               source="ortmodule/options.py _LoggingOptions"),
    OptionSpec("save_onnx", None, Kind.BOOL, False,
               "Save the exported ONNX graph at every stage (torch_exported ... execution_model) into the run folder",
               _DEBUG, ReadAt.CONSTRUCTION, False, debug_option=True, source="ortmodule/options.py DebugOptions"),
    OptionSpec("onnx_prefix", None, Kind.TEXT, "model",
               "File name prefix of the saved ONNX graphs", _DEBUG, ReadAt.CONSTRUCTION, False, debug_option=True,
               documented=True, source="ortmodule/options.py DebugOptions"),
    OptionSpec("save_onnx_path", "ORTMODULE_SAVE_ONNX_PATH", Kind.PATH, "",
               "Folder for saved ONNX graphs (ortlab uses the run folder when empty)", _DEBUG, ReadAt.CONSTRUCTION,
               False, debug_option=True, source="ortmodule/options.py _SaveOnnxOptions"),
    # Runtime options read in options.py _override_from_env_vars (at construction)
    OptionSpec("onnx_opset_version", "ORTMODULE_ONNX_OPSET_VERSION", Kind.INT, 17,
               "ONNX opset the model is exported with", "ORTMODULE/ONNXOPSET", ReadAt.CONSTRUCTION, True,
               choices=(13, 14, 15, 16, 17), source="ortmodule/options.py"),
    OptionSpec("fallback_policy", "ORTMODULE_FALLBACK_POLICY", Kind.CHOICE, "DEFAULT",
               "When ORT fails, fall back to PyTorch (default: for unsupported device/data/models); "
               "FALLBACK_DISABLE makes failures visible", "ORTMODULE/FallbackToPytorch", ReadAt.CONSTRUCTION, False,
               choices=_FALLBACK, source="ortmodule/options.py, ortmodule/_fallback.py"),
    OptionSpec("fallback_retry", "ORTMODULE_FALLBACK_RETRY", Kind.BOOL, False,
               "After a fallback, retry ORT on the next call", "ORTMODULE/FallbackToPytorch", ReadAt.CONSTRUCTION,
               False, documented=False, source="ortmodule/_fallback.py"),
    OptionSpec("allow_autograd_checkpoint", "ORTMODULE_ALLOW_AUTOGRAD_CHECKPOINT", Kind.BOOL, False,
               "Allow exporting torch.utils.checkpoint as a PythonOp instead of failing", _PYOP, ReadAt.EXPORT, True,
               source="ortmodule/_custom_autograd_function_exporter.py"),
    OptionSpec("enable_custom_autograd", "ORTMODULE_ENABLE_CUSTOM_AUTOGRAD", Kind.BOOL, True,
               "Export torch.autograd.Function classes as PythonOp (off: inline them)", _PYOP, ReadAt.IMPORT, True,
               source="ortmodule/_custom_autograd_function.py (module level)"),
    OptionSpec("enable_compute_optimizer", "ORTMODULE_ENABLE_COMPUTE_OPTIMIZER", Kind.BOOL, True,
               "Compute optimizer (FLOP reduction by moving shrinking ops earlier); off for exact parity with PyTorch",
               _OPT, ReadAt.CONSTRUCTION, True, source="ortmodule/options.py"),
    OptionSpec("enable_sparse_optimizer", "ORTMODULE_ENABLE_SPARSE_OPTIMIZER", Kind.BOOL, True,
               "Documented switch for input-sparsity optimizations; 1.19.2 reads the label/embedding switches instead",
               _OPT, ReadAt.NEVER, False, source="(not read in 1.19.2)"),
    OptionSpec("enable_label_sparse_optimizer", "ORTMODULE_ENABLE_LABEL_SPARSE_OPTIMIZER", Kind.BOOL, True,
               "Label sparsity optimization (needs the compute optimizer)", _OPT, ReadAt.CONSTRUCTION, True,
               documented=False, source="ortmodule/options.py"),
    OptionSpec("enable_embedding_sparse_optimizer", "ORTMODULE_ENABLE_EMBEDDING_SPARSE_OPTIMIZER", Kind.BOOL, True,
               "Embedding input sparsity optimization (needs the compute optimizer)", _OPT, ReadAt.CONSTRUCTION, True,
               source="ortmodule/options.py"),
    OptionSpec("print_input_density", "ORTMODULE_PRINT_INPUT_DENSITY", Kind.BOOL, False,
               "Print the input data sparsity inspection per step", _INSPECT, ReadAt.CONSTRUCTION, False,
               source="ortmodule/options.py"),
    OptionSpec("print_memory_stats", "ORTMODULE_PRINT_MEMORY_STATS", Kind.BOOL, False,
               "Print CUDA memory per step and phase (uses torch.cuda)", _INSPECT, ReadAt.CONSTRUCTION, False,
               needs_cuda=True, source="ortmodule/options.py"),
    OptionSpec("cache_dir", "ORTMODULE_CACHE_DIR", Kind.PATH, "",
               "Cache the exported model here to skip export in later runs", _RT, ReadAt.CONSTRUCTION, False,
               source="ortmodule/options.py"),
    OptionSpec("use_efficient_attention", "ORTMODULE_USE_EFFICIENT_ATTENTION", Kind.BOOL, False,
               "Fuse attention and run PyTorch's efficient_attention ATen kernel", _OPT, ReadAt.IMPORT, True,
               needs_cuda=True, source="ortmodule/graph_optimizers/__init__.py (module level)"),
    OptionSpec("deepcopy_before_model_export", "ORTMODULE_DEEPCOPY_BEFORE_MODEL_EXPORT", Kind.BOOL, True,
               "Deep-copy the module before export (off lowers the memory peak)", _OPT, ReadAt.CONSTRUCTION, False,
               source="ortmodule/options.py"),
    OptionSpec("memory_opt_level", "ORTMODULE_MEMORY_OPT_LEVEL", Kind.INT, 0,
               "Memory optimizer: 0 user config only, 1 layer-wise recompute, 2 also compromised recompute",
               _OPT, ReadAt.CONSTRUCTION, True, choices=(0, 1, 2), source="ortmodule/options.py"),
    OptionSpec("memory_opt_config", "ORTMODULE_MEMORY_OPT_CONFIG", Kind.PATH, "",
               "JSON file listing the recompute plans to apply ('cluster:type:count')", _OPT, ReadAt.CONSTRUCTION, True,
               documented=False, source="ortmodule/options.py"),
    OptionSpec("enable_mem_efficient_grad_mgmt", "ORTMODULE_ENABLE_MEM_EFFICIENT_GRAD_MGMT", Kind.BOOL, False,
               "Hand each gradient to PyTorch as soon as ORT computes it (needs custom autograd)", _OPT,
               ReadAt.CONSTRUCTION, True, source="ortmodule/options.py"),
    OptionSpec("enable_zero_stage3", "ORTMODULE_ENABLE_ZERO_STAGE3", Kind.BOOL, False,
               "DeepSpeed ZeRO stage 3 support (experimental, cannot be turned off again)", "ORTMODULE/Experimental",
               ReadAt.CONSTRUCTION, True, documented=False, source="ortmodule/options.py"),
    OptionSpec("conv_algo_search", "ORTMODULE_CONV_ALGO_SEARCH", Kind.CHOICE, "HEURISTIC",
               "cuDNN convolution algorithm search", _RT, ReadAt.CONSTRUCTION, False, needs_cuda=True,
               choices=("HEURISTIC", "EXHAUSTIVE"), documented=False, source="ortmodule/options.py"),
    OptionSpec("skipcheck_policy", "ORTMODULE_SKIPCHECK_POLICY", Kind.TEXT,
               "SKIP_CHECK_DEVICE|SKIP_CHECK_BUILD_GRADIENT|SKIP_CHECK_EXECUTION_AGENT",
               "Which per-call checks to skip ('|'-separated SKIP_CHECK_* names)", _RT, ReadAt.CONSTRUCTION, False,
               documented=False, source="ortmodule/options.py"),
    OptionSpec("aten_sdpa_fallback", "ORTMODULE_ATEN_SDPA_FALLBACK", Kind.BOOL, False,
               "Export scaled_dot_product_attention as an ATen op (efficient kernel) instead of decomposing it",
               _OPT, ReadAt.IMPORT, True, needs_cuda=True, documented=False,
               source="ortmodule/_custom_op_symbolic_registry.py (module level)"),
    # Triton
    OptionSpec("use_triton", "ORTMODULE_USE_TRITON", Kind.BOOL, False,
               "Run some ops with OpenAI Triton kernels", _TRITON, ReadAt.CONSTRUCTION, True, needs_cuda=True,
               source="ortmodule/options.py"),
    OptionSpec("triton_config_file", "ORTMODULE_TRITON_CONFIG_FILE", Kind.PATH, "",
               "JSON file choosing which ops Triton runs", _TRITON, ReadAt.RUNTIME, True, needs_cuda=True,
               source="ort_triton/triton_op_executor.py"),
    OptionSpec("enable_tuning", "ORTMODULE_ENABLE_TUNING", Kind.BOOL, False,
               "Online tuning of ops with several implementations", _TRITON, ReadAt.CONSTRUCTION, False,
               needs_cuda=True, source="ortmodule/options.py"),
    OptionSpec("max_tuning_duration_ms", "ORTMODULE_MAX_TUNING_DURATION_MS", Kind.INT, 0,
               "Longest online tuning time in ms (0: no limit)", _TRITON, ReadAt.CONSTRUCTION, False, needs_cuda=True,
               minimum=0, source="ortmodule/options.py"),
    OptionSpec("tuning_results_path", "ORTMODULE_TUNING_RESULTS_PATH", Kind.PATH, "",
               "Where tuning results are saved (or read from, when tuning is off)", _TRITON, ReadAt.CONSTRUCTION, False,
               needs_cuda=True, source="ortmodule/options.py"),
    OptionSpec("use_flash_attention", "ORTMODULE_USE_FLASH_ATTENTION", Kind.BOOL, False,
               "Fuse attention into Triton's Flash Attention (needs use_triton and compute capability >= 8.0)",
               _TRITON, ReadAt.IMPORT, True, needs_cuda=True, source="ort_triton/kernel/__init__.py (module level)"),
    OptionSpec("triton_debug", "ORTMODULE_TRITON_DEBUG", Kind.BOOL, False,
               "Save Triton subgraphs and generated code under ./triton_debug", _TRITON, ReadAt.IMPORT, False,
               needs_cuda=True, source="ort_triton/triton_op_executor.py (module level)"),
)

SPECS: dict[str, OptionSpec] = {spec.name: spec for spec in REGISTRY}
_BY_ENV: dict[str, OptionSpec] = {spec.env: spec for spec in REGISTRY if spec.env}


def spec(key: str) -> OptionSpec:
    """The spec for a python name (`memory_opt_level`) or an environment variable (`ORTMODULE_MEMORY_OPT_LEVEL`)."""
    found = SPECS.get(key) or _BY_ENV.get(key) or SPECS.get(key.lower().removeprefix("ortmodule_"))
    if found is None:
        hint = did_you_mean(key.lower().removeprefix("ortmodule_"), SPECS) or "; see 'ortlab options' for the list"
        raise OptionError(f"unknown option {key!r}{hint}")
    return found


class Options(Mapping[str, Any]):
    """An immutable set of ORTModule option values; only values that differ from ORT's defaults are kept.

    Build from keyword arguments, a dict, or `KEY=VALUE` strings (python or environment names):
    `Options(memory_opt_level=1)`, `Options({"ORTMODULE_LOG_LEVEL": "INFO"})`, `Options.parse(["log_level=INFO"])`.
    """

    def __init__(self, values: Mapping[str, Any] | Iterable[str] | None = None, /, **kwargs: Any):
        items: dict[str, Any] = {}
        if isinstance(values, Options):
            items.update(values._values)
        elif isinstance(values, Mapping):
            items.update(values)
        elif isinstance(values, str):  # one assignment, not a sequence of characters
            items.update(_split_assignments([values]))
        elif isinstance(values, Iterable):
            items.update(_split_assignments(values))
        elif values is not None:
            raise OptionError(f"options {values!r} are not allowed; allowed: Options, a dict, keyword arguments, "
                              "or KEY=VALUE strings")
        items.update(kwargs)
        parsed: dict[str, Any] = {}
        for key, value in items.items():
            s = spec(key)
            typed = s.parse(value)
            if typed != s.default:
                parsed[s.name] = typed
            else:
                parsed.pop(s.name, None)
        self._values = dict(sorted(parsed.items()))

    @classmethod
    def parse(cls, assignments: Iterable[str]) -> Options:
        """The Options of `KEY=VALUE` texts (an option name or its ORTMODULE_* variable), as `--option` takes them."""
        return cls(list(assignments))

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Options:
        """The options the ORTMODULE_* variables of `environ` (default: this process's) set."""
        environ = os.environ if environ is None else environ
        return cls({k: v for k, v in environ.items() if k in _BY_ENV})

    def __getitem__(self, key: str) -> Any:
        s = spec(key)
        return self._values.get(s.name, s.default)

    def __contains__(self, key: object) -> bool:
        """Whether the option is set to a non-default value (as iteration and len() count)."""
        found = (SPECS.get(key) or _BY_ENV.get(key)) if isinstance(key, str) else None
        return found is not None and found.name in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Options) and self._values == other._values

    def __hash__(self) -> int:
        return hash(json.dumps(self._values, sort_keys=True))

    def __repr__(self) -> str:
        return "Options(" + ", ".join(f"{k}={v!r}" for k, v in self._values.items()) + ")"

    def replace(self, **changes: Any) -> Options:
        """These options with `changes` (option name=value) applied; a new Options."""
        return Options({**self._values, **changes})

    def overlaid(self, given: Options | Mapping[str, Any] | Iterable[str] | str | None) -> Options:
        """These options under `given`: every option `given` names wins, also when it names a default value
        (how a burst's options meet the ORTMODULE_* variables already set in the user's shell)."""
        chosen = Options(given)
        if isinstance(given, Mapping) and not isinstance(given, Options):
            named = {spec(k).name for k in given}
        elif isinstance(given, str | list | tuple):
            named = {spec(k).name for k in _split_assignments([given] if isinstance(given, str) else given)}
        else:
            named = set(chosen._values)
        return Options({**{k: v for k, v in self._values.items() if k not in named}, **chosen._values})

    def to_dict(self) -> dict[str, Any]:
        """{option name: value} of the options that differ from ORT's defaults."""
        return dict(self._values)

    def env(self) -> dict[str, str]:
        """The environment variables for these options (only the ones that differ from the defaults)."""
        return {SPECS[k].env: SPECS[k].to_env(v) for k, v in self._values.items() if SPECS[k].env}

    def export_lines(self) -> str:
        """The shell lines that reproduce these options outside ortlab."""
        return "\n".join(f"export {k}={v}" for k, v in self.env().items())

    def with_read_at(self, read_at: ReadAt) -> dict[str, Any]:
        """{option name: value} of these options that ORT reads at `read_at`."""
        return {k: v for k, v in self._values.items() if SPECS[k].read_at is read_at}

    def diff(self, other: Options) -> dict[str, tuple[Any, Any]]:
        """{option: (value here, value in other)} for every option whose value differs."""
        keys = set(self._values) | set(other._values)
        return {k: (self[k], other[k]) for k in sorted(keys) if self[k] != other[k]}

    @contextlib.contextmanager
    def applied(self, environ: dict[str, str] | None = None) -> Iterator[dict[str, str]]:
        """Set exactly these options in the environment (unsetting every other registry variable) and restore
        the environment as it was afterwards, also on exceptions and KeyboardInterrupt. Yields the environment."""
        environ = os.environ if environ is None else environ
        saved = {name: environ.get(name) for name in _BY_ENV}
        try:
            for name in _BY_ENV:
                environ.pop(name, None)
            environ.update(self.env())
            yield environ
        finally:
            for name, value in saved.items():
                if value is None:
                    environ.pop(name, None)
                else:
                    environ[name] = value


def _split_assignments(assignments: Iterable[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for text in assignments:
        if not isinstance(text, str) or "=" not in text:
            raise OptionError(f"{text!r} is not KEY=VALUE (for example memory_opt_level=1 or ORTMODULE_LOG_LEVEL=INFO)")
        key, value = text.split("=", 1)
        out[key.strip()] = value.strip()
    return out


def registry_table():
    """The registry as a pandas DataFrame (one row per option)."""
    import pandas as pd

    return pd.DataFrame([s.to_dict() for s in REGISTRY])


def by_area(specs: Iterable[OptionSpec] = REGISTRY) -> dict[str, list[OptionSpec]]:
    """{area: its specs}, each area once, in the order its first option appears (the registry follows ORT's
    source, where an area's options are spread over several places)."""
    out: dict[str, list[OptionSpec]] = {}
    for s in specs:
        out.setdefault(s.area, []).append(s)
    return out
