"""What a burst is asked to do (`BurstConfig`), checked before anything starts, and the device and optimizer it
resolves to."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from typing import Any

from ortlab.engine.backends import check_available, checked_settings, registered
from ortlab.engine.collectors import check as check_collectors
from ortlab.engine.types import BurstError, Choice, Device, Evidence, Optimizer, Precision, Sampler, Strategy
from ortlab.options import Options

__all__ = ["BurstConfig", "BurstError", "backend_strategies", "make_optimizer", "optimizer_for", "resolve_device",
           "strategy_spec"]

SEED_MAX = 2**32 - 1  # numpy's seeds are 32-bit
CHOICES: dict[str, type[Choice]] = {"optimizer": Optimizer, "precision": Precision, "device": Device,
                                     "evidence": Evidence}
_ELSEWHERE: ContextVar[bool] = ContextVar("ortlab_config_elsewhere", default=False)


@contextlib.contextmanager
def made_elsewhere() -> Iterator[None]:
    """Configs read back from runs made by another process (ortlab.verdict.folders): a backend that cannot run
    here (ORTModule on the current stack) is no error while reading them (a burst of it still fails, saying why)."""
    token = _ELSEWHERE.set(True)
    try:
        yield
    finally:
        _ELSEWHERE.reset(token)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class BurstConfig:
    backend: str = "ortmodule"
    steps: int = 20
    options: Options = field(default_factory=Options)
    # the closed sets (engine.types) are members of their Enum once the config exists; a plain string is taken
    # and turned into its member, and to_dict() writes the plain strings
    optimizer: Optimizer = Optimizer.AUTO  # the workload's own (Workload.optimizer) when it brings one, else adamw
    lr: float = 1e-3
    seed: int = 0
    precision: Precision = Precision.FP32
    device: Device = Device.AUTO
    parity: bool = False
    out: str = "runs"
    name: str | None = None
    collect: dict[str, dict[str, Any]] = field(default_factory=dict)  # collector name -> its keyword arguments
    # several processes (ortlab.engine.launch): ranks per machine, machines, this machine's index, rendezvous
    nproc: int = 1
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    save_checkpoint: bool = False
    # how the ranks share the model (ortlab.engine.ranks): single, ddp, zero1, fsdp2; None: single for one process,
    # ddp for several (zero1 with optimizer zero1). FSDP2 reshards each block's parameters after its forward unless
    # told not to; sync_batchnorm normalizes BatchNorm over every rank's samples (the fix the verdict verifies)
    strategy: Strategy | None = None
    reshard_after_forward: bool = True
    sync_batchnorm: bool = False
    sampler: Sampler | None = None  # for a workload with a dataset (ortlab.engine.sampling)
    # compatibility fixes for ORTModule bursts (ortlab.compat.registry): "auto" (what `ortlab check` recommends
    # for this model), fix names, or () for none; a PyTorch burst runs the model as written
    fixes: str | tuple[str, ...] = ()
    # the initial parameters times (1 + perturb): a PyTorch run from a start 1e-7 away is the noise pair a
    # comparison's losses and end state are judged against (ortlab.verdict)
    perturb: float = 0.0
    # torch.compile's settings for a compile burst: mode, dynamic, fullgraph, backend, memory_budget
    # (engine.backends.compiled)
    compile: dict[str, Any] = field(default_factory=dict)
    # what a parity burst records of its first step's gradients for a verdict elsewhere (ortlab.runs.evidence):
    # "summary" (a fixed-size summary per parameter: ortlab.runs.sketch) or "full" (every gradient too: 4 bytes a
    # parameter on disk)
    evidence: Evidence = Evidence.SUMMARY
    # the CPU threads a step runs on (torch's intra-op threads, and ORT's session's with one): None leaves torch's,
    # fitted to the cores this process gets (ortlab.engine.machine.fit_threads); 1 times each step by its thread's
    # CPU time, which other processes do not count (ortlab.runs.clock). Ignored on CUDA (said in the run's meta)
    threads: int | None = None

    def __post_init__(self):
        registered(self.backend)
        for name, choice in CHOICES.items():  # Choice(value): the member, or a BurstError naming what is allowed
            object.__setattr__(self, name, choice(getattr(self, name)))
        if self.sampler is not None:
            object.__setattr__(self, "sampler", Sampler(self.sampler))
        if self.sampler == Sampler.LOAD_BALANCING:
            from ortlab.stacks.table import ortmodule_unavailable

            if ortmodule_unavailable():  # the sampler is onnxruntime-training's
                raise BurstError(f"sampler 'load_balancing' is onnxruntime-training's, which is not here "
                                 f"({ortmodule_unavailable()}); use 'distributed', or the ort stack")
        if not _whole(self.steps) or self.steps < 1:
            raise BurstError(f"steps {self.steps!r} is not allowed; allowed: a whole number >= 1")
        if self.threads is not None and (not _whole(self.threads) or self.threads < 1):
            raise BurstError(f"threads {self.threads!r} is not allowed; allowed: a whole number >= 1 (1: each step "
                             "timed by its CPU time), or None (torch's threads, fitted to the cores)")
        if not (isinstance(self.lr, int | float) and not isinstance(self.lr, bool) and math.isfinite(self.lr)
                and self.lr > 0):
            raise BurstError(f"lr {self.lr!r} is not allowed; allowed: a finite number > 0")
        if not (isinstance(self.perturb, int | float) and not isinstance(self.perturb, bool)
                and math.isfinite(self.perturb) and 0 <= self.perturb < 1e-2):
            raise BurstError(f"perturb {self.perturb!r} is not allowed; allowed: a number from 0 to 0.01")
        if not _whole(self.seed) or not 0 <= self.seed <= SEED_MAX:
            raise BurstError(f"seed {self.seed!r} is not allowed; allowed: a whole number from 0 to {SEED_MAX}")
        if not isinstance(self.options, Options):
            object.__setattr__(self, "options", Options(self.options))
        if not isinstance(self.collect, dict):
            raise BurstError(f"collect {self.collect!r} is not allowed; allowed: a dict of collector name -> settings")
        from ortlab.compat.registry import parse

        object.__setattr__(self, "fixes", parse(self.fixes))
        if not isinstance(self.compile, dict):
            raise BurstError(f"compile {self.compile!r} is not allowed; allowed: a dict of mode, dynamic, fullgraph, "
                             "backend, memory_budget")
        for name, value in checked_settings(self).items():  # each backend's own settings, by its entry
            object.__setattr__(self, name, value)
        check_collectors(self)  # known, serving this backend, settings inside the burst: said before anything starts
        self._check_ranks()
        if not _ELSEWHERE.get():
            check_available(self.backend)  # ORTModule on the current stack: why not, and where it runs, in one line
            self._check_precision()

    def _check_precision(self) -> None:
        """A precision this device or backend cannot train in, refused as the config is made: the one check, which
        a comparison, a launch of ranks and the worker's burst all rely on (fp32 trains anywhere: no torch import)."""
        if self.precision is not Precision.FP32:
            from ortlab.engine import precision

            precision.check(self.precision, resolve_device(self.device), self.backend)

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes

    @property
    def distributed(self) -> bool:
        """Whether the burst runs as ranks started by torch's elastic launcher (ortlab.engine.launch)."""
        return self.world_size > 1

    def _check_ranks(self) -> None:
        for label, value in (("nproc", self.nproc), ("nnodes", self.nnodes)):
            if not _whole(value) or value < 1:
                raise BurstError(f"{label} {value!r} is not allowed; allowed: a whole number >= 1")
        if not _whole(self.node_rank) or not 0 <= self.node_rank < self.nnodes:
            raise BurstError(f"node_rank {self.node_rank!r} is not allowed; allowed: a whole number from 0 to "
                             f"nnodes - 1 ({self.nnodes - 1})")
        if self.rdzv_endpoint is not None:
            host, _, port = str(self.rdzv_endpoint).rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise BurstError(f"rdzv_endpoint {self.rdzv_endpoint!r} is not allowed; allowed: HOST:PORT of the "
                                 "machine with node_rank 0, e.g. 10.0.0.1:29500")
        elif self.nnodes > 1:
            raise BurstError("nnodes > 1 needs rdzv_endpoint HOST:PORT (the machine with node_rank 0, a free port) "
                             "so that the launches on every machine find each other")
        if self.threads not in (None, 1) and self.distributed:
            raise BurstError(f"threads {self.threads} with {self.world_size} ranks is not allowed: each rank runs on "
                             "one thread (OMP_NUM_THREADS=1, as torchrun); allowed: threads 1 or None")
        if not isinstance(self.save_checkpoint, bool):
            raise BurstError(f"save_checkpoint {self.save_checkpoint!r} is not allowed; allowed: True or False")
        if self.optimizer is Optimizer.ZERO1 and not self.distributed:
            raise BurstError("optimizer 'zero1' shards AdamW across processes and needs nproc * nnodes >= 2; "
                             f"with one process use one of: {', '.join(o for o in Optimizer if o != Optimizer.ZERO1)}")
        self._check_strategy()
        if self.save_checkpoint and not self.distributed:
            raise BurstError("save_checkpoint is for bursts of several processes (nproc * nnodes >= 2); a "
                             "single-process burst's weights: ortlab.runs.snapshot.Snapshot")

    def _check_strategy(self) -> None:
        """The strategy resolved and refused in one line where it cannot run, before any rank starts. The one place
        that says what optimizer zero1 means: strategy zero1 with AdamW (torch's ZeroRedundancyOptimizer)."""
        strategy = self.strategy
        if strategy is None:
            strategy = (Strategy.ZERO1 if self.optimizer is Optimizer.ZERO1 else
                        Strategy.DDP if self.distributed else Strategy.SINGLE)
        strategy = Strategy(strategy)
        if strategy is Strategy.ZERO1 and self.optimizer in (Optimizer.AUTO, Optimizer.ADAMW):
            object.__setattr__(self, "optimizer", Optimizer.ZERO1)
        elif (strategy is Strategy.ZERO1) != (self.optimizer is Optimizer.ZERO1):
            raise BurstError(f"strategy {str(strategy)!r} with optimizer {str(self.optimizer)!r} is not allowed: "
                             "zero1 shards AdamW's state (optimizer zero1 is strategy zero1 with AdamW); allowed: "
                             "strategy zero1 with optimizer auto, adamw or zero1, or another strategy")
        object.__setattr__(self, "strategy", strategy)
        if strategy is Strategy.SINGLE and self.distributed:
            raise BurstError(f"strategy 'single' is one process, not {self.world_size} ranks (nproc * nnodes); "
                             "allowed with several: ddp, zero1, fsdp2")
        if strategy is not Strategy.SINGLE and not self.distributed:
            raise BurstError(f"strategy {str(strategy)!r} shares the model across processes and needs nproc * nnodes "
                             ">= 2; with one process: strategy single")
        for name in ("reshard_after_forward", "sync_batchnorm"):
            if not isinstance(getattr(self, name), bool):
                raise BurstError(f"{name} {getattr(self, name)!r} is not allowed; allowed: True or False")
        allowed = registered(self.backend).strategies
        if strategy not in allowed:
            raise BurstError(f"strategy {str(strategy)!r} cannot run backend {self.backend!r} (its ranks take "
                             f"{', '.join(allowed)}: what its guidelines support); use one of those, or another "
                             "backend")
        if strategy is Strategy.FSDP2:
            self._check_fsdp2()

    def _check_fsdp2(self) -> None:
        if self.save_checkpoint:
            raise BurstError("save_checkpoint with strategy 'fsdp2' is not supported yet (its parameters are "
                             "sharded); allowed: save_checkpoint with ddp or zero1")
        if self.precision == Precision.FP16:
            raise BurstError("precision 'fp16' with strategy 'fsdp2' is not supported (its GradScaler does not "
                             "take sharded gradients); allowed: fp32 or bf16")
        if _ELSEWHERE.get():
            return
        missing = fully_shard_missing()
        if missing:
            raise BurstError(f"strategy 'fsdp2' needs torch.distributed.fsdp.fully_shard, which this torch lacks "
                             f"({missing}); use ddp or zero1, or a stack with torch 2.6 or newer")
        if resolve_device(self.device).type == "cpu" and fsdp2_cpu_missing():
            raise BurstError(f"strategy 'fsdp2' on the CPU fails on this torch ({fsdp2_cpu_missing()}); use ddp or "
                             "zero1 here, device cuda, or the current stack")

    def effective_options(self) -> Options:
        """The options ORT runs with: parity mode turns the compute optimizer off (exact PyTorch compute); the
        memory account of a backend's execution graph reads the graph ORT saves (save_onnx on)."""
        options = self.options.replace(enable_compute_optimizer=False) if self.parity else self.options
        graph = registered(self.backend).memory.resolve().saves_graphs
        if graph and "memory" in self.collect and not options["save_onnx"]:
            options = options.replace(save_onnx=True)
        return options

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["options"] = self.options.to_dict()
        for name in (*CHOICES, "sampler", "strategy"):  # plain strings, as runs on disk have always said
            d[name] = None if d[name] is None else str(d[name])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BurstConfig:
        return cls(**{**d, "options": Options(d.get("options") or {})})


def backend_strategies(value: Any, backends: Sequence[str]) -> dict[str, Strategy | None]:
    """Each compared backend's strategy from one value: None (each its default: ddp for several ranks), a strategy
    for all ("ddp"), or per backend ("ortmodule=ddp,compile=fsdp2"; a bare one is the rest's: "fsdp2,ortmodule=ddp";
    or a dict). BurstError in one line for a strategy or backend that is not one of these."""
    if value is None or isinstance(value, Strategy):
        return dict.fromkeys(backends, value)
    pairs = list(value.items()) if isinstance(value, dict) else [
        tuple(part.strip().split("=", 1)) if "=" in part else (None, part.strip())
        for part in str(value).split(",") if part.strip()]
    rest: Strategy | None = None
    out: dict[str, Strategy | None] = {}
    for backend, name in pairs:
        try:
            strategy = Strategy(str(name).strip())
        except ValueError:
            raise BurstError(f"strategy {name!r} (in {value!r}) is not allowed; allowed: "
                             f"{', '.join(map(str, Strategy))}, for all backends or as BACKEND=STRATEGY, e.g. "
                             "ortmodule=ddp,compile=fsdp2") from None
        if backend is None:
            rest = strategy
        elif str(backend).strip() not in backends:
            raise BurstError(f"strategy {backend}={name} names backend {str(backend).strip()!r}, which is not compared "
                             f"here; allowed: {', '.join(backends)}")
        else:
            out[str(backend).strip()] = strategy
    return {b: out.get(b, rest) for b in backends}


def strategy_spec(text: str) -> str:
    """`--strategy` of `ortlab compare` checked for its words (a strategy, or BACKEND=STRATEGY pairs naming
    ortlab's backends); which backends it may name is checked again against those compared."""
    from ortlab.engine.backends import BACKENDS

    backend_strategies(text, list(BACKENDS))
    return text


def fully_shard_missing() -> str | None:
    """Why torch.distributed.fsdp.fully_shard (FSDP2) cannot be imported here, or None."""
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError as e:
        import torch

        return f"torch {torch.__version__}: {e}"
    return None


def fsdp2_cpu_missing() -> str | None:
    """Why FSDP2 cannot gather on the CPU here, or None: torch 2.6's fully_shard records an event on its CPU stream,
    which that torch's CPU streams lack (its first forward fails)."""
    import torch

    if hasattr(torch.cpu.Stream, "record_event"):
        return None
    return f"torch {torch.__version__}: torch.cpu.Stream has no record_event, which fully_shard's forward calls"


def resolve_device(requested: Device | str):
    import torch

    if requested == "cuda" and not torch.cuda.is_available():
        raise BurstError("device 'cuda' is not available here: torch sees no CUDA GPU; use device='cpu' or 'auto'")
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def optimizer_for(workload: Any, model: Any, name: Optimizer | str, lr: float, device: Any) -> tuple[Any, Any]:
    """The optimizer and scheduler a burst trains `model` with: the workload's own (`Workload.optimizer`) for
    `name` "auto" when it brings one, else ortlab's `name` (make_optimizer) without a scheduler."""
    if workload.optimizer is not None and name == "auto":
        made = workload.optimizer(model)
        return made if isinstance(made, tuple) else (made, None)
    return make_optimizer(name, model.parameters(), lr, device), None


def make_optimizer(name: Optimizer | str, params, lr: float, device):
    import torch

    if name in ("adamw", "auto"):  # "auto" here: the workload brought no optimizer of its own
        return torch.optim.AdamW(params, lr=lr)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "zero1":  # inside a rank (ortlab.engine.ranks): the process group exists
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(list(params), optimizer_class=torch.optim.AdamW, lr=lr)
    if device.type != "cuda":
        raise BurstError(f"optimizer {name!r} is not available on the CPU: ORT's {name} runs CUDA kernels only; "
                         "use adamw or sgd here")
    if name == "fused_adam":
        from onnxruntime.training.optim import FusedAdam

        return FusedAdam(params, lr=lr)
    raise BurstError("optimizer 'fp16_optimizer' wraps a DeepSpeed or Apex optimizer; ortlab trains with "
                     "torch.autocast + GradScaler for fp16 instead (precision='fp16')")
