"""What differs between the backends a burst trains on (PyTorch eager, ORTModule, torch.compile), behind one
contract (`ortlab.engine.types.Backend`): the engine's loop, the collectors, the session and the views ask a
backend, or its registry entry, and never compare its name.

`BACKENDS` is the registry, modelled on torch._dynamo's: a name, where its class is (loaded on first use:
ORTModule's and torch.compile's imports cost seconds) and what is data rather than behaviour (its label, whether
it exports ONNX stages or reads options at import, its settings' check). What the collectors do differently for
it is in its adapters, as treescope registers them: where collector "time" reads its step time
(ortlab.timing.sources), what collector "memory" accounts (ortlab.account.sources) and how collector "stats" taps
it (ortlab.activations.taps). Each is a typed reference (`ortlab.engine.refs.Ref`): "module:Class" loaded on first
use, which the engine names without importing (those packages import the engine), and whose contract (the adapter
Protocols of ortlab.engine.types) the type checker holds it to (tests/test_types.py). A fourth backend is one
module and one line here, with the adapters it declares.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ortlab.common.enums import StrEnum
from ortlab.engine.refs import Ref
from ortlab.engine.types import Burst, BurstError, Config, Engine, MemoryAdapter, TapsAdapter, TimeAdapter
from ortlab.errors import did_you_mean
from ortlab.stacks.table import STACKS, Stack, StackError, parse_stack, running


@dataclass(frozen=True)
class Registered:
    """One backend in the registry."""

    name: str  # what a burst, a run's meta.json and the CLI call it
    target: Ref[Callable[[Any], Backend]]  # its class (a Backend below), built with the engine's model
    label: str  # what views show
    reference: bool = False  # the backend every other one is compared with (PyTorch)
    onnx_stages: bool = False  # it exports ONNX graphs through an ORT wrap (`.wrapper`): graphs, recompute plans
    import_options: bool = False  # it reads some options once per process, at import: a worker per set of them
    compat: bool = False  # ortlab check, its fixes and repro serve it (they export again through ORTModule)
    # its adapters: collector "time"'s source, collector "memory"'s account, collector "stats"'s taps
    time_source: Ref[type[TimeAdapter]] = Ref("ortlab.timing.sources:TorchProfiler")
    memory: Ref[type[MemoryAdapter]] = Ref("ortlab.account.sources:Autograd")
    stats_taps: Ref[type[TapsAdapter]] = Ref("ortlab.activations.taps:Hooks")
    # (a BurstConfig field of its own, the function checking it: given -> checked, defaults filled in)
    settings: tuple[str, Ref[Callable[[dict[str, Any]], Mapping[str, object]]]] | None = None
    # why it cannot run in this process (None: it can), asked before a burst starts
    unavailable: Ref[Callable[[], str | None]] | None = None
    # what it needs on this machine (`ortlab doctor`): an ortlab.engine.diagnosis.Machine -> its BackendStatus (Any
    # here: diagnosis reads this registry, and naming its types would close a circle)
    health: Ref[Callable[[Any], Any]] | None = None
    autocast_cpu: bool = True  # it trains under torch.autocast bfloat16 on the CPU (ORT 1.19.2: no bf16 CPU MatMul)
    # how its ranks may share the model (engine.types.Strategy); ORTModule: what ORT's guidelines support (DDP, ZeRO-1
    # around it), not FSDP2
    strategies: tuple[str, ...] = ("single", "ddp", "zero1", "fsdp2")

    def imports(self, options: Any) -> Any:
        """The import-time options a process must have been started with to run this backend with `options`
        (an Options); None: any process serves it."""
        from ortlab.options import Options, ReadAt

        return Options(options.with_read_at(ReadAt.IMPORT)) if self.import_options else None

    def adapter(self, concern: str) -> Any:
        """The class of this backend's adapter for `concern` ("time_source", "memory", "stats_taps"), by name;
        typed code reads the field itself (`entry.memory.resolve()`)."""
        if concern not in ADAPTERS:
            raise BurstError(f"adapter {concern!r} is not known; known: {', '.join(ADAPTERS)}"
                             f"{did_you_mean(concern, ADAPTERS)}")
        return getattr(self, concern).resolve()


ADAPTERS = ("time_source", "memory", "stats_taps")  # the concerns a backend declares an adapter for


BACKENDS: dict[str, Registered] = {r.name: r for r in (
    Registered("pytorch", Ref("ortlab.engine.backends.eager:Eager"), "PyTorch", reference=True,
               health=Ref("ortlab.engine.diagnosis:pytorch_health")),
    Registered("ortmodule", Ref("ortlab.engine.backends.ort:OrtBackend"), "ORTModule", onnx_stages=True,
               compat=True, import_options=True, time_source=Ref("ortlab.timing.sources:OrtProfiler"),
               memory=Ref("ortlab.account.sources:Graph"), stats_taps=Ref("ortlab.activations.taps:GraphTaps"),
               unavailable=Ref("ortlab.stacks.table:ortmodule_line"),
               health=Ref("ortlab.engine.diagnosis:ortmodule_health"), autocast_cpu=False,
               strategies=("single", "ddp", "zero1")),
    Registered("compile", Ref("ortlab.engine.backends.compiled:Compiled"), "torch.compile",
               time_source=Ref("ortlab.timing.sources:TorchProfilerFused"),
               memory=Ref("ortlab.account.sources:AutogradRunner"),
               stats_taps=Ref("ortlab.activations.taps:CompiledHooks"),
               settings=("compile", Ref("ortlab.engine.backends.compiled:settings")),
               health=Ref("ortlab.engine.diagnosis:compile_health")),
)}
REFERENCE = next(r.name for r in BACKENDS.values() if r.reference)  # "pytorch"
# The registered backends as a closed set of names (a str Enum: widgets and the CLI list it, runs keep the strings)
BackendName = StrEnum("BackendName", {name.upper(): name for name in BACKENDS})  # type: ignore[misc]  # members: the registry's, not literals


def registered(name: str) -> Registered:
    """The registry entry of a backend; an unknown name raises naming the known ones."""
    if name not in BACKENDS:
        raise BurstError(f"backend {name!r} is not allowed; allowed: {', '.join(BACKENDS)}"
                         f"{did_you_mean(name, BACKENDS)}")
    return BACKENDS[name]


def names() -> tuple[str, ...]:
    return tuple(BACKENDS)


class BackendUnavailable(BurstError):
    """A backend asked for that cannot run in this process (ORTModule on the current stack): why, and where it runs."""


def unavailable(name: str) -> str | None:
    """Why the registered backend `name` cannot run in this process, in one line with where it can (None: it can)."""
    check = registered(name).unavailable
    return None if check is None else check.resolve()()


def check_available(name: str) -> None:
    """Raise BackendUnavailable, in one line, for a backend that cannot run here."""
    why = unavailable(name)
    if why is not None:
        raise BackendUnavailable(why)


def default_backends() -> tuple[str, ...]:
    """What a comparison trains when not told: PyTorch and ORTModule where ORTModule runs (the ort stack), else
    PyTorch and torch.compile."""
    return (REFERENCE, "ortmodule") if unavailable("ortmodule") is None else (REFERENCE, "compile")


def has(name: str | None, flag: str) -> bool:
    """Whether the backend `name` has one of its entry's flags (reference, onnx_stages, import_options, compat);
    False for a name not registered here (an old run's)."""
    return name in BACKENDS and bool(getattr(BACKENDS[name], flag))


def label(name: str) -> str:
    """What a view calls a backend (its name when it is not registered here: an old run)."""
    return BACKENDS[name].label if name in BACKENDS else name


def checked_settings(cfg: Config) -> dict[str, Any]:
    """Each backend's own settings in `cfg` (torch.compile's: the field compile) checked by its entry, defaults
    filled in: field -> value. A bad one raises naming it and what is allowed."""
    out = {}
    for entry in BACKENDS.values():
        if entry.settings is not None:
            field, check = entry.settings
            out[field] = check.resolve()(getattr(cfg, field))
    return out


# The names that stand for several backends in a comparison (--backend, parse_backends), and what each means
ALIASES = {"both": "PyTorch and ORTModule", "all": "every backend that runs here"}


def aliased(value: str) -> tuple[str, ...] | None:
    """The backends an alias (ALIASES) stands for; None: `value` is not one."""
    if value == "both":
        return REFERENCE, "ortmodule"
    if value == "all":
        return tuple(n for n in BACKENDS if unavailable(n) is None)
    return None


@dataclass(frozen=True)
class Placed:
    """A backend and the stack its worker runs on (None: the value did not name one)."""

    backend: str
    stack: Stack | None = None

    def __str__(self) -> str:
        return self.backend if self.stack is None else f"{self.backend}@{self.stack}"


def named_backends(value: str | Sequence[str]) -> tuple[Placed, ...]:
    """The one reader of BACKEND[@STACK] words (`ortlab burst --backend`, `ortlab compare --backends`,
    Session.compare, compare_stacks): "both" or "all" alone (ALIASES), or a comma list or sequence of backends, each
    optionally on a stack ("pytorch,ortmodule@ort,compile@current"); each backend with the stack it names (None:
    none), in order. A bad part raises in one line naming it and what is allowed: BurstError for a backend,
    StackError for a stack, or a stack the stacks' table does not run that backend on."""
    if isinstance(value, str):
        expanded = aliased(value.strip())
        if expanded is not None:
            return tuple(Placed(name) for name in expanded)
        value = value.split(",")
    out = []
    for item in (v.strip() for v in value if v.strip()):
        name, at, stack_name = (part.strip() for part in item.partition("@"))
        if name in ALIASES:
            raise BurstError(f"{item!r}: {name} stands for several backends ({ALIASES[name]}): give it alone, or name "
                             "each backend, optionally on its stack, e.g. pytorch,ortmodule@ort,compile@current")
        if name not in BACKENDS:
            where = f" (in {item!r})" if at else ""
            raise BurstError(f"backend {name!r}{where} is not allowed; allowed: {', '.join(BACKENDS)}, each "
                             f"optionally @STACK ({', '.join(Stack)}), or {' or '.join(ALIASES)} alone"
                             f"{did_you_mean(name, (*BACKENDS, *ALIASES))}")
        if at and not stack_name:
            raise StackError(f"{item!r} names no stack after '@'; allowed: {', '.join(Stack)}")
        stack = parse_stack(stack_name) if at else None
        if stack is not None and stack not in running(name):
            on = " and ".join(running(name))
            raise StackError(f"{item!r}: {label(name)} runs on the {on} stack only (the {stack} stack runs "
                             f"{STACKS[stack].runs}); use {name}@{running(name)[0]}")
        out.append(Placed(name, stack))
    return tuple(out)


def parse_backends(value: Any) -> tuple[str, ...]:
    """"both" (PyTorch and ORTModule), "all" (every backend that runs here), "pytorch,compile", a sequence, or
    None (default_backends) -> the backends of a comparison in one process, PyTorch first (every other is compared
    with it); read by named_backends, so a bad name raises naming what is allowed; one placed on a stack points at
    compare_stacks, one that cannot run here (BackendUnavailable) says why and where it runs."""
    if value is None:
        return default_backends()
    placed = named_backends(value)
    if any(p.stack is not None for p in placed):  # a backend placed on a stack: not one process's
        named = ",".join(map(str, placed))
        raise BurstError(f"backend {str(next(p for p in placed if p.stack))!r} names a stack: a comparison across "
                         f"stacks runs each backend in its stack's worker: ortlab.compare_stacks(model, {named!r}) "
                         "(the CLI: ortlab compare --backends ...)")
    names = tuple(dict.fromkeys(p.backend for p in placed))
    for name in names:
        check_available(name)
    if len(names) < 2:
        raise BurstError(f"a comparison needs two backends or more, not {', '.join(names) or 'none'}; e.g. "
                         "pytorch,ortmodule,compile")
    return (REFERENCE, *(n for n in names if n != REFERENCE))


@dataclass(frozen=True)
class Alone:
    """One module of the model on a backend for one forward and backward, the rest of the model in PyTorch: what
    the localizer asks of a backend, so that it searches ORTModule and torch.compile alike."""

    who: str  # whose gradients a localization names: "ORT", "torch.compile"
    wrap: Callable[[Any], Any]  # the module -> what runs in its place (an ORTModule, a compiled module)
    ran: Callable[[Any], None]  # after the pass: raises when that did not run on the backend (fell back, never called)
    around: Callable[[Any], contextlib.AbstractContextManager[Any]]  # the model -> what each try runs inside
    # an aten op -> a callable running that one op on the backend (ortlab.verdict.ops); None: the backend runs whole
    # graphs only (ORTModule)
    op: Callable[[Any], Callable[..., Any]] | None = None
    # (an aten op, a test that runs `op(that op)` and says whether it agrees) -> which part of the backend makes it
    # disagree, as plain data (torch.compile: CompilerBisector's backend, subsystem, application); None: not known
    bisect: Callable[[Any, Callable[[Callable[..., Any]], bool]], dict[str, Any] | None] | None = None
    # the runner after its pass -> (the training graph it ran, an ONNX ModelProto with its gradient nodes; the names
    # of the graph inputs that are the module's own inputs, in order) (ortlab.verdict.graph_nodes); None: no graph
    graph: Callable[[Any], tuple[Any, list[str]]] | None = None


class Backend:
    """The default: train the model as it is (PyTorch eager). One instance per Engine: it may keep what it built
    for earlier bursts (an ORTModule, a compiled module). The methods are the contract's
    (ortlab.engine.types.Backend)."""

    name = "pytorch"

    def __init__(self, model: Any):
        self.model = model  # the engine's model, which every burst of this backend trains

    def begin(self, engine: Engine, b: Burst) -> None:
        """Before the collectors start and the first step."""

    def wrap(self, engine: Engine, b: Burst, inputs: Any) -> Any:
        """At step 0: the module that trains (the model itself here); transitions rows go into b.transitions."""
        return engine.model

    @contextlib.contextmanager
    def forward(self, engine: Engine, b: Burst, step: int, inputs: Any) -> Iterator[None]:
        """Around each step's forward (the code after the forward runs only when it succeeded)."""
        yield

    def after_step(self, engine: Engine, b: Burst, step: int, inputs: Any, row: dict[str, Any]) -> None:
        """After each step's optimizer update: add to the step's row."""

    def where_failed(self, engine: Engine, b: Burst, error: BaseException) -> str | None:
        """Where inside the backend a failure came from (None: the burst's own stage names it)."""
        return None

    def outcome(self, engine: Engine, b: Burst) -> None:
        """As the burst ends (any status), before the collectors finish."""

    def finish(self, engine: Engine, b: Burst) -> None:
        """After the collectors finished, inside the run's captured output."""

    def write(self, engine: Engine, b: Burst) -> None:
        """The backend's own files in the run folder, after the output capture closed."""

    def gradient_runner(self, engine: Engine, cfg: Config, fixes: tuple[str, ...],
                        batch: tuple[Any, Any]) -> tuple[Any, bool]:
        """The module the verdict's first-step gradient check runs through (ortlab.verdict.gradients) from the
        initial snapshot, and whether building it exports a graph (None: the check builds a fresh ORTModule)."""
        return engine.model, False

    def alone(self, cfg: Config, fixes: tuple[str, ...], log: Any) -> Alone | None:
        """How the localizer (ortlab.verdict.localize) runs one module of the model on this backend for a step,
        the rest in PyTorch; None: it is the reference, nothing of it is localized."""
        return None

    def ort_internals(self) -> Any:
        """ORT's state of the ORTModule this backend trains now (ortlab._ort.Wrap), what collectors read of ORT;
        None: it trains none (or has not wrapped yet)."""
        return None

    def graph_input_shapes(self, inputs: Any) -> dict[str, list[int]]:
        """The concrete shape of each input of the graph this backend runs, for these inputs ({}: no graph)."""
        return {}


def make(name: str, model: Any) -> Backend:
    """The backend `name` for the engine's model (one per Engine)."""
    return registered(name).target.resolve()(model)
