"""The engine's plain types, errors and contracts: a leaf that imports nothing from ortlab.engine, so that the
loop, the config, the backends and the collectors can all name them without importing each other.

`Backend` and `Collector` are the two contracts a burst is built of (the loop calls them, the registries in
`ortlab.engine.backends` and `ortlab.engine.collectors` name them); the `str` Enums are the closed sets a burst
is asked with, which widgets and the CLI read instead of retyping (their values are what runs on disk say).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ortlab.common.enums import StrEnum
from ortlab.errors import InputError, did_you_mean


class BurstError(InputError):
    """A burst that cannot start as asked (bad argument, device or optimizer not available here)."""


class Choice(StrEnum):
    """A closed set a burst is asked with: `Kind(value)` turns a user's plain string into the member, and a value
    outside the set raises a BurstError naming the set and what it allows (the class's name, lower case)."""

    @classmethod
    def _missing_(cls, value: object) -> Choice:
        raise BurstError(f"{cls.__name__.lower()} {value!r} is not allowed; allowed: {', '.join(cls)}{cls._besides()}"
                         + did_you_mean(str(value), list(cls)))

    @classmethod
    def _besides(cls) -> str:
        """What else is allowed where the set is asked for (said after the members)."""
        return ""

    def __repr__(self) -> str:  # the plain string, as the messages and a BurstConfig's repr have always shown it
        return repr(self.value)


class Optimizer(Choice):
    AUTO = "auto"  # the workload's own optimizer and scheduler when it brings them (a Trainer's), else adamw
    ADAMW = "adamw"
    SGD = "sgd"
    FUSED_ADAM = "fused_adam"  # ORT's, CUDA only
    FP16_OPTIMIZER = "fp16_optimizer"  # refused: ortlab trains fp16 with torch.autocast + GradScaler
    ZERO1 = "zero1"  # AdamW sharded across ranks


class Strategy(Choice):
    """How the ranks of a burst share the model (ortlab.engine.ranks); what each is judged against:
    docs/distributed.md."""

    SINGLE = "single"  # one process
    DDP = "ddp"  # every rank holds the model; DistributedDataParallel averages the gradients
    ZERO1 = "zero1"  # DDP with AdamW's state sharded over the ranks (torch's ZeroRedundancyOptimizer)
    FSDP2 = "fsdp2"  # torch.distributed.fsdp.fully_shard per block, then the root: parameters sharded


class Precision(Choice):
    FP32 = "fp32"
    FP16 = "fp16"  # CUDA only: torch.autocast float16 + GradScaler
    BF16 = "bf16"  # torch.autocast bfloat16, no GradScaler (CPU and CUDA; ORTModule: CUDA only)


class Device(Choice):
    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"


class Evidence(Choice):
    """What a parity burst keeps of its first step's gradients (ortlab.runs.evidence): a summary a parameter, or them
    whole too."""

    SUMMARY = "summary"
    FULL = "full"


class Float64(Choice):
    """Whether a verdict spends its float64 burst (ortlab.verdict.cost): where it is cheap and fits, always, never."""

    AUTO = "auto"
    BURST = "burst"
    FIRST_STEP = "first-step"


class Sampler(Choice):
    """How a workload's dataset is shared among ranks (ortlab.engine.sampling); None: in order."""

    DISTRIBUTED = "distributed"
    LOAD_BALANCING = "load_balancing"

    @classmethod
    def _besides(cls) -> str:
        return " (or None: a dataset in order)"


@dataclass
class Transition:
    """One row of the transition table: what happened before a burst's first step (a new worker, a wrap, a
    compile), or when the backend built its module again mid-burst."""

    run: str
    step: int
    action: str  # "new worker", "wrap", "re-wrap", "reuse", "re-export", "rebuild gradient graph", "compile" ...
    reason: str
    changes: dict[str, Any]
    ort_exported: bool | None = None  # ORTModule: filled from ORT's own state after the step

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "step": self.step, "action": self.action, "reason": self.reason,
                "changes": self.changes, "ort_exported": self.ort_exported}


class Config(Protocol):
    """What a backend or a collector reads of the burst's BurstConfig (ortlab.engine.config; a Protocol: this
    module imports nothing from the engine). The type checker holds BurstConfig to it."""

    @property
    def backend(self) -> str: ...

    @property
    def steps(self) -> int: ...

    @property
    def seed(self) -> int: ...

    @property
    def parity(self) -> bool: ...

    @property
    def collect(self) -> dict[str, dict[str, Any]]: ...

    @property
    def compile(self) -> dict[str, Any]: ...

    @property
    def fixes(self) -> str | tuple[str, ...]: ...

    @property
    def distributed(self) -> bool: ...

    def effective_options(self) -> Any: ...


class Burst(Protocol):
    """What a backend reads and sets of one running burst (ortlab.engine.loop._Burst): its config, folder, writer,
    options, collectors and exit stack; the module that trains, its status and stage, its own state and records."""

    @property
    def cfg(self) -> Config: ...

    @property
    def path(self) -> Path: ...

    @property
    def writer(self) -> Any: ...

    @property
    def options(self) -> Any: ...

    @property
    def collectors(self) -> dict[str, Collector]: ...

    @property
    def stack(self) -> ExitStack: ...

    @property
    def first_inputs(self) -> Any: ...

    @property
    def extra(self) -> dict[str, Any]: ...

    @property
    def transitions(self) -> list[Transition]: ...

    runner: Any
    state: Any
    stage: str
    # an ortlab.runs.run.RunStatus (ortlab.runs.run is not imported here: it reaches the verdict, which reaches the
    # engine)
    status: str


class Engine(Protocol):
    """What a backend reads of the running engine (ortlab.engine.loop.Engine): the model and its workload, and a
    transition the worker left for the next wrap."""

    @property
    def model(self) -> Any: ...

    @property
    def workload(self) -> Any: ...

    pending_transition: Transition | None


@runtime_checkable
class Backend(Protocol):
    """What a burst asks of the backend it trains on, in this order: `begin` (before the collectors start),
    `wrap` (at step 0: the module that trains), `forward` (a context around every step's forward), `after_step`,
    `where_failed` (when the burst failed), `outcome` (as the burst ends, before the collectors finish: what the
    run's status and record must say), `finish` (after the collectors, inside the run's captured output) and
    `write` (its own files). Outside a burst: `gradient_runner`, the module the verdict's first-step gradient
    check runs through. What collectors read of the ORTModule it trains (none: None and {}): `ort_internals`
    (ORT's state of it, an `ortlab._ort.Wrap`: stage graphs, profiler, plans, input accessors) and
    `graph_input_shapes` (the shape of each input of its graph for a batch): no collector reaches into a backend.
    What is data rather than behaviour (ONNX stages, import-time options) and the adapters its collectors ask (time
    source, memory account, statistics taps) are on its registry entry (ortlab.engine.backends.Registered)."""

    name: str

    def begin(self, engine: Engine, b: Burst) -> None: ...

    def wrap(self, engine: Engine, b: Burst, inputs: Any) -> Any: ...

    def forward(self, engine: Engine, b: Burst, step: int, inputs: Any) -> AbstractContextManager[None]: ...

    def after_step(self, engine: Engine, b: Burst, step: int, inputs: Any, row: dict[str, Any]) -> None: ...

    def where_failed(self, engine: Engine, b: Burst, error: BaseException) -> str | None: ...

    def outcome(self, engine: Engine, b: Burst) -> None: ...

    def finish(self, engine: Engine, b: Burst) -> None: ...

    def write(self, engine: Engine, b: Burst) -> None: ...

    def gradient_runner(self, engine: Engine, cfg: Config, fixes: tuple[str, ...],
                        batch: tuple[Any, Any]) -> tuple[Any, bool]: ...

    def ort_internals(self) -> Any: ...

    def graph_input_shapes(self, inputs: Any) -> dict[str, list[int]]: ...


class Collector:
    """What a collector implements; every method is optional. `changes_graph = True` means its instrumentation
    is part of the exported graph, so a burst with it needs its own ORTModule wrap (`graph_key` names it).
    `times_phases = True`: the engine also calls `phase` as each step's forward, backward and optimizer begin and
    as the step ends (only such collectors: the others cost nothing there)."""

    changes_graph = False
    graph_key: str | None = None
    times_phases = False

    def start(self, engine: Engine, cfg: Config, run_dir: Path) -> None:
        """Before the first step and before the backend wraps the model."""

    def step_begin(self, step: int) -> None: ...

    def step_end(self, step: int) -> None: ...

    def phase(self, step: int, name: str) -> None:
        """With times_phases: "forward", "backward", "optimizer" as each begins, "end" once the step's loss is
        read (the step's time as the engine measures it ends there); a recorded loop (ortlab.record): "loop" as
        each iteration begins, "end" at its rec.step()."""

    def finish(self, engine: Engine, cfg: Config, run_dir: Path, status: str) -> None:
        """Always called (also after a failure): write results into run_dir and undo any global change."""


# The adapters a backend's registry entry names for the collectors (ortlab.engine.backends.Registered): what each
# collector asks of them. Their implementations live with their collectors (ortlab.timing.sources,
# ortlab.account.sources, ortlab.activations.taps), above the engine; the entries reach them by typed reference
# (ortlab.engine.refs.Ref), which the type checker holds to these.


class TimeAdapter(Protocol):
    """How collector "time" profiles a backend's steps (ortlab.timing.sources.TimeSource); one per burst."""

    def start(self, collector: Any, run_dir: Path) -> None: ...

    def step_begin(self, step: int) -> None: ...

    def phase(self, step: int, name: str) -> None: ...

    def step_end(self, step: int) -> None: ...

    def stop(self) -> None: ...

    def close(self) -> None: ...

    def result(self, run_dir: Path) -> dict[str, Any]: ...

    def discard(self, run_dir: Path) -> None: ...


class MemoryAdapter(Protocol):
    """What collector "memory" accounts of a backend (ortlab.account.sources.Account): memory.json's data."""

    saves_graphs: bool  # it reads the graphs ORT saves: a burst with collector "memory" saves them (save_onnx)

    def before(self, engine: Any, cfg: Any) -> dict[str, Any] | None: ...

    def after(self, engine: Any, cfg: Any, run_dir: Path, status: str) -> dict[str, Any] | None: ...


class TapsAdapter(Protocol):
    """How collector "stats" observes a backend's tensors (ortlab.activations.taps.Hooks)."""

    in_graph: bool
    hooks_stay: bool
    copy_observed: bool

    def prepare(self) -> None: ...

    def hook(self, fn: Callable[..., Any]) -> Callable[..., Any]: ...
