"""The kernel-side session that drives bursts in a worker process (or in this process).

ORTModule at log level INFO/DEVINFO prints hundreds of KB at C level while holding the GIL, which hangs a
Jupyter kernel whose output pipe fills; some options are read only at import; ORT can crash. So bursts run in
a worker that ortlab starts (ortlab.engine.worker): the kernel stays responsive, Stop can kill it, and a crash
takes only the worker. A worker is kept while it can serve the next burst (same model, same import-time options).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortlab.engine import messages as m
from ortlab.engine.backends import parse_backends
from ortlab.engine.client import Client, WorkerError
from ortlab.engine.progress import Bar, chain
from ortlab.engine.types import Device, Evidence, Float64, Optimizer, Precision, Sampler, Strategy
from ortlab.judging import verdicts
from ortlab.options import Options
from ortlab.runs import groups
from ortlab.runs.run import ENDED_EARLY, Run, RunStatus, load_run

if TYPE_CHECKING:
    from ortlab.comparison.summary import Comparison
    from ortlab.engine.config import BurstConfig

__all__ = ["Session", "WorkerError"]


CHECKED = ("precision", "device", "optimizer", "nproc", "nnodes", "node_rank", "rdzv_endpoint", "save_checkpoint",
           "reshard_after_forward", "sync_batchnorm", "threads")  # Session.burst's keywords BurstConfig checks first


def checked(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The burst keywords of `kwargs` that BurstConfig checks (a comparison's backends, each before any burst)."""
    return {k: kwargs[k] for k in CHECKED if k in kwargs}


@dataclass
class Session:
    """Drives bursts of one model. Keeps a worker process alive while it can serve the next burst; keeps every
    run it made and the transition table (why ORTModule exported, re-wrapped, or a new worker started).

    `in_process=True` runs bursts in this process instead: fine for scripts and tests, but inside a Jupyter
    kernel ORTModule at log level INFO/DEVINFO can hang the kernel (C-level output fills its pipe), an ORT
    crash kills the kernel, and import-time options cannot change.
    """

    model: Any = None
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    out: str | Path = "runs"
    in_process: bool = False
    seed: int = 0
    snapshot: str | Path | None = None
    runs: list[Run] = field(default_factory=list)
    transition_rows: list[dict[str, Any]] = field(default_factory=list)
    # ORTMODULE_* variables set in the shell that started Python: every burst starts from them, and the options
    # a burst names win. None: read them from os.environ now.
    shell_options: Options | None = None
    # the stack its workers run on ("ort", "current": ortlab.engine.stack_env starts that stack's Python); None:
    # this process's. Another stack's bursts need a worker (not in_process) and a model given by import path.
    stack: str | None = None
    # the verdict's float64 burst (its losses and end state against float64): "auto" runs it where its estimated
    # need is small (at most 2 GB) and fits the free memory, "burst" always, "first-step" never (ortlab.verdict.cost)
    float64: Float64 | str = "auto"

    def __post_init__(self):
        from ortlab.workload import ModelRef

        self.float64 = Float64(self.float64)  # a bad mode is refused before any worker starts

        self.ref = ModelRef.of(self.model, **self.model_kwargs)
        if self.shell_options is None:
            self.shell_options = Options.from_environ()
        self._client = Client(self.ref, self.seed, self.snapshot, self.out, self.stack)  # the worker
        self._engine = None
        self._lock = threading.Lock()
        self._stop_requested = threading.Event()
        self._force_stop = False  # a second Stop (Ctrl-C) while the first is being honoured: end the burst now
        self._judging = False  # a verdict is being reached: its evidence bursts do not clear a Ctrl-C
        self._interrupted = False  # a Ctrl-C (not a Stop from another thread) since the current call began
        self._asking = threading.local()  # .now: (folder, purpose) while this thread's bursts are ortlab's own

    # -- public

    def _shell_options(self) -> Options:
        """The shell's ORTMODULE_* options (read in __post_init__ when none were given)."""
        if self.shell_options is None:
            self.shell_options = Options.from_environ()
        return self.shell_options

    def burst(self, backend: str = "ortmodule", steps: int = 20, options: Options | dict | None = None, *,
              optimizer: Optimizer | str = "auto", lr: float = 1e-3, seed: int = 0,
              precision: Precision | str = "fp32", device: Device | str = "auto",
              parity: bool = False, name: str | None = None, progress: bool = True,
              on_step: Callable[[dict], None] | None = None, collect: dict[str, dict] | None = None,
              nproc: int = 1, nnodes: int = 1, node_rank: int = 0, rdzv_endpoint: str | None = None,
              save_checkpoint: bool = False, sampler: Sampler | str | None = None, fixes: Any = (),
              perturb: float = 0.0, compile: dict[str, Any] | None = None, evidence: Evidence | str = "summary",
              strategy: Strategy | str | None = None, reshard_after_forward: bool = True,
              sync_batchnorm: bool = False, threads: int | None = None) -> Run:
        """Run one burst and return its Run. Ctrl-C (KeyboardInterrupt) ends it cleanly with the steps done kept.

        nproc > 1 (or nnodes > 1) runs it as ranks started by torch's elastic launcher (ortlab.engine.launch):
        nproc per machine, nnodes machines meeting at rdzv_endpoint HOST:PORT, this one being node_rank.
        `sampler` ("distributed" or "load_balancing", for a workload with a dataset) chooses how the dataset is
        shared among the ranks (ortlab.engine.sampling); ortlab.engine.balance reports how evenly they were loaded.
        `strategy` (single, ddp, zero1, fsdp2; None: single for one process, ddp for several) is how the ranks share
        the model (ortlab.engine.ranks; FSDP2 `reshard_after_forward` or not); `sync_batchnorm` normalizes
        BatchNorm over every rank's samples. A distributed parity burst is judged against one process of the same
        global batch (ortlab.verdict.sharded: its verdict.json).
        `fixes` ("auto", fix names, or none) are ortlab's compatibility fixes for an ORTModule burst
        (ortlab.compat.registry; `Session.check` says which the model needs); the run records which it applied.
        A burst whose ORTModule fell back to PyTorch ends with status "fallback", never "ok". `compile`: the
        settings of a backend="compile" burst (mode, dynamic, fullgraph, backend, memory_budget:
        ortlab.engine.backends.compiled).
        `perturb`: the initial parameters times (1 + perturb), for a noise reference. `evidence`: what a parity
        burst records of its first step's gradients for a verdict elsewhere ("summary": a fixed size a parameter;
        "full": every gradient too). `threads`: the CPU threads each step runs on, for this burst (None: torch's,
        fitted to the cores; 1: each step timed by its thread's CPU time, which other processes do not count, with
        ORTModule's session on one thread too; ignored on CUDA)."""
        from ortlab.engine.config import BurstConfig

        asked = getattr(self._asking, "now", None)
        out = groups.own_folder(asked[0]) if asked else Path(self.out).expanduser().resolve()
        cfg = BurstConfig(backend=backend, steps=steps, options=self._shell_options().overlaid(options),
                          optimizer=Optimizer(optimizer), lr=lr, seed=seed, precision=Precision(precision),
                          device=Device(device), parity=parity, out=str(out), name=name, collect=collect or {},
                          nproc=nproc, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint,
                          save_checkpoint=save_checkpoint, sampler=None if sampler is None else Sampler(sampler),
                          fixes=fixes, perturb=perturb, compile=compile or {}, evidence=Evidence(evidence),
                          strategy=None if strategy is None else Strategy(strategy),
                          reshard_after_forward=reshard_after_forward, sync_batchnorm=sync_batchnorm,
                          threads=threads)
        run = self._burst(cfg, on_step, progress)
        if asked:  # ortlab's own: kept under what asked for it, not among the user's runs
            groups.mark_asked(run, *asked)
            return run
        self.runs.append(run)
        self.transition_rows.extend(run.read_json("transitions.json", []))
        # against one process of the same global batch (its verdict.json, said by summaries): where every rank's
        # folder is here (a job on several machines keeps each machine's ranks on it)
        if cfg.distributed and cfg.parity and cfg.nnodes == 1 and run.status == RunStatus.OK:
            self._judged(lambda: verdicts().judge_distributed(self, run))
        return run

    @contextlib.contextmanager
    def asking(self, folder: str | Path, purpose: str) -> Iterator[Path]:
        """While it lasts, this thread's bursts are ortlab's own, made for `purpose` ("tune", "plans") of `folder`
        (a tuning's, a plan sweep's): written under its ortlab-runs/ folder (ortlab.runs.groups.OWN), marked so in
        meta.json, and not kept among the session's runs (the user's). Yields that folder."""
        previous = getattr(self._asking, "now", None)
        self._asking.now = (Path(folder).expanduser().resolve(), purpose)
        try:
            yield groups.own_folder(self._asking.now[0])
        finally:
            self._asking.now = previous

    def _burst(self, cfg: BurstConfig, on_step: Callable[[dict], None] | None = None, progress: bool = False) -> Run:
        """Run a burst without keeping it among the session's runs (the evidence a verdict is made of). Within a
        verdict, a Ctrl-C ends the verdict (KeyboardInterrupt): the evidence bursts after it do not start."""
        if self._judging and self._interrupted:
            raise KeyboardInterrupt
        bar = Bar(cfg) if progress else None
        callback = chain(on_step, bar.update if bar else None)
        try:
            with self._lock, self._ctrl_c_stops(active=not self.in_process or cfg.distributed):
                self._stop_requested.clear()
                self._force_stop = False
                if not self._judging:
                    self._interrupted = False
                try:
                    if cfg.distributed:
                        with self._reference_ahead(cfg):
                            path = self._run_ranks(cfg, callback)
                    elif self.in_process:
                        path = self._run_in_process(cfg, callback)
                    else:
                        path = self._run_in_worker(cfg, callback)
                except WorkerError:
                    if self._interrupted:  # Ctrl-C while the worker started: an interruption, not its failure
                        raise KeyboardInterrupt from None
                    raise
        finally:
            if bar:
                bar.close()
        run = load_run(path)
        if self._judging and run.status in ENDED_EARLY and (self._interrupted or not self._stop_requested.is_set()):
            self._interrupted = True  # in this process a Ctrl-C ends the burst itself ("interrupted"), unasked
            raise KeyboardInterrupt
        return run

    def compare(self, steps: int = 20, options: Options | dict | None = None, *,
                backends: Any = None, **kwargs) -> Comparison:
        """The Comparison of PyTorch and the other `backends` ("ortmodule", "compile"; or "both", "all", or
        "a,b,c"; None: ORTModule on the ort stack, torch.compile on the current one) from the same snapshot: their
        differences, and the verdict on each against PyTorch (Session.judge:
        agree or diverged, the evidence and the causes). `strategy` (with nproc > 1): one for all, or each
        backend's ("ortmodule=ddp,compile=fsdp2", or a dict). A Stop (or Ctrl-C) ends the comparison: the bursts
        after it do not start."""
        from ortlab.comparison import drift
        from ortlab.comparison.summary import Comparison
        from ortlab.engine.config import BurstConfig, backend_strategies

        chosen = parse_backends(backends)
        strategies = backend_strategies(kwargs.pop("strategy", None), chosen)
        for backend in chosen:  # what one backend cannot train as asked (BurstConfig's check): said before any burst
            BurstConfig(backend=backend, **checked(kwargs), strategy=strategies[backend])
        runs: dict[str, Run] = {}
        for backend in chosen:
            runs[backend] = self.burst(backend, steps, options, **kwargs, strategy=strategies[backend])
            if runs[backend].status in ENDED_EARLY or self.stop_asked:  # a Stop as it ended found no step left
                break
        reference = runs[chosen[0]]  # PyTorch: parse_backends puts the registry's reference first
        drift.after(self, runs, steps, options, {**kwargs, "strategy": strategies[reference.backend]},
                    stopped=self.stop_asked)  # on the CPU: PyTorch timed again (the machine drifts)
        for run in runs.values():
            if run is not reference and run.status not in ENDED_EARLY:
                self.judge(reference, run)
        return Comparison(runs=dict(runs), backends=chosen)

    def check(self, fixes: Any = "auto", options: Options | dict | None = None):
        """Will the model train on ORTModule? Every blocker at once, with its module and source line, the fixes
        that remove them (verified by exporting again) and one ORTModule training step: a CheckReport, also
        written to `<out>/<stamp>-check/check.json`. `fixes`: "auto", "none" or fix names (ortlab.compat)."""
        from ortlab.engine.backends import check_available

        check_available("ortmodule")  # the current stack: why not, and where it runs, in one line
        from ortlab.compat.check import CheckReport
        from ortlab.compat.registry import parse

        fixes = parse(fixes)  # bad names fail here, before a worker starts
        options = self._shell_options().overlaid(options)
        out = str(Path(self.out).expanduser().resolve())
        if self.in_process:
            with self._lock:
                return self._local_engine().check(fixes, options, out)
        return CheckReport.from_dict(self._request(m.RunCheck(fixes, options.to_dict(), out), options,
                                                   "checking the model"))

    def judge(self, pytorch: Run, ortmodule: Run, **_: Any):
        """Did the other backend (ORTModule, torch.compile) train the same model as PyTorch? Returns the Verdict on
        two runs of this session from the same snapshot (ortlab.verdict.procedure): their first step's gradients and,
        in parity mode, their losses and end states, each judged by its distance to the same computation in float64
        PyTorch beside PyTorch fp32's; when they diverge, the causes `check` names (ORTModule) or else one step of
        statistics on both backends. Written to the other run's folder (verdict.json); the evidence runs are kept
        in its ortlab-runs/ folder, not added to `runs`. Ctrl-C ends it (KeyboardInterrupt: no verdict); a Stop
        from another thread does not."""
        return self._judged(lambda: verdicts().judge(self, pytorch, ortmodule))

    def _judged(self, reach: Callable[[], Any]) -> Any:
        """A verdict reached on this session: Ctrl-C ends it (KeyboardInterrupt: no verdict)."""
        self._interrupted, self._judging = False, True
        try:
            verdict = reach()
        finally:
            self._judging = False
        if self._interrupted:  # a Ctrl-C the evidence swallowed (e.g. a failed request): no verdict
            raise KeyboardInterrupt
        return verdict

    def gradient_check(self, options: Options | dict | None = None, fixes: Any = (), *, parity: bool = True,
                       seed: int = 0) -> dict[str, Any]:
        """The first batch's gradients on PyTorch (the model as written) and on a fresh ORTModule with these
        options and fixes, from the initial snapshot, every dropout off, judged against float64 where they are not
        allclose (ortlab.verdict.gradients): a dict with "agree", the worst parameters, the losses. The evidence
        bisect judges a toggled option by."""
        return verdicts().gradient_check(self, options, fixes, parity, seed)

    # -- the verdict's driver (ortlab.verdict.driver.Driver): what its procedure asks of this session

    def evidence_burst(self, config: BurstConfig) -> Run:
        """A burst of `config` that is a verdict's evidence (a noise pair, localizing statistics): not kept among
        the session's runs; marked as ortlab's own when it is written under a run's ortlab-runs/ folder."""
        run = self._burst(config)
        if Path(config.out).name == groups.OWN:
            groups.mark_asked(run, Path(config.out).parent, "evidence")
        return run

    def evidence(self, task: str, config: BurstConfig, what: str, progress: Callable | None = None,
                 **kwargs: Any) -> dict[str, Any]:
        """What `task` ("module:function") computes on the model for `config` (Engine.task), in this process or in
        the worker; `what` names it while it runs, `progress(count, row)` for each step it reports."""
        told = {"progress": progress} if progress is not None else {}
        if self.in_process:
            with self._lock:
                return self._local_engine().task(task, config, **kwargs, **told)
        on_tried = (lambda msg: progress(msg.count, msg.row)) if progress else None
        return self._request(m.RunTask(task, config.to_dict(), kwargs, progress is not None),
                             config.effective_options(), what, on_tried)

    def localize(self, options: Options | dict | None = None, fixes: Any = (), *, seed: int = 0,
                 progress: Callable[[int, Any], None] | None = None, repro: str | Path | None = None,
                 known: dict[str, Any] | None = None, origin: str = "", backend: str = "ortmodule",
                 compile: dict[str, Any] | None = None):
        """The smallest module whose run alone on `backend` ("ortmodule" with `options` and `fixes`, "compile"
        with its settings `compile`; the rest of the model in PyTorch, the initial snapshot, the first batch, every
        dropout off) reproduces the gradient divergence against float64, and the first op inside it beyond
        float64's rounding (torch.compile): a Localization (ortlab.verdict.localize; its `ops`:
        ortlab.verdict.ops), found by bisecting the module tree in the worker that holds the model.
        `progress(tried, row)` after each module tried; `repro`: a folder to write its regression test into
        (ortlab.verdict.repro); `known`: a localization made before (its dict), reused."""
        return verdicts().localize_module(self, options, fixes, seed, progress, repro, known, origin, backend,
                                          compile)

    def _local_engine(self):
        if self._engine is None:
            from ortlab.engine.loop import Engine

            self._engine = Engine(self.ref, seed=self.seed, import_options=Options.from_environ(),
                                  snapshot=self.snapshot)
        return self._engine

    def _request(self, msg: Any, options: Options | None, what: str, on_tried: Callable | None = None) -> Any:
        """Send one request to a worker for these options and wait for its answer (Checked), Ctrl-C honoured;
        `on_tried(msg)` for each Tried on the way (the localizer's progress)."""
        with self._lock:
            return self._client.request(msg, options, what, self.stop, on_tried)

    def stop(self) -> None:
        """Stop the running burst: it ends cleanly after the step it is in, keeping its steps; a worker that shows
        no progress after the request (stuck in C++, e.g.) is terminated (ortlab.engine.grace). Asked again while
        the first request is being honoured: the burst is ended now."""
        if self._stop_requested.is_set():
            self._force_stop = True
        self._stop_requested.set()  # in-process bursts and ranks check it after every step
        if not self.in_process:
            self._client.interrupt()

    @property
    def stop_asked(self) -> bool:
        """A Stop or Ctrl-C came during the last burst: one that came as it ended found no step left to stop (the
        run is "ok"), and what runs bursts in a row must end all the same."""
        return self._stop_requested.is_set()

    def _ctrl_c(self) -> None:
        self._interrupted = True
        self.stop()

    @contextlib.contextmanager
    def _ctrl_c_stops(self, active: bool) -> Iterator[None]:
        """While a burst runs in a worker or as ranks, Ctrl-C (SIGINT in the main thread: a terminal, a Jupyter
        kernel's interrupt) is a Stop request, not an exception: a KeyboardInterrupt raised while a message from the
        worker is half read, or in a step callback, would leave the burst running behind a broken pipe."""
        if not active or threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGINT, lambda signum, frame: self._ctrl_c())
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    @property
    def transitions(self):
        """Why ORTModule exported, re-wrapped, or a new worker started, over every burst of this session (DataFrame)."""
        import pandas as pd

        columns = ["run", "step", "action", "reason", "changes", "ort_exported"]
        return pd.DataFrame(self.transition_rows, columns=columns)

    @property
    def worker_pid(self) -> int | None:
        """The worker process's id while it runs, else None."""
        return self._client.pid

    @property
    def worker_starts(self) -> int:
        """How many worker processes this session started."""
        return self._client.starts

    def close(self) -> None:
        """End the worker process (also at the end of a `with` block; its log goes with it); the runs stay."""
        self._client.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        with contextlib.suppress(Exception):  # at interpreter exit anything may be gone already
            self.close()

    def __repr__(self) -> str:
        mode = "in-process" if self.in_process else f"worker pid {self.worker_pid}" if self.worker_pid else "no worker"
        return f"Session(model={self.ref.describe()!r}, runs={len(self.runs)}, {mode})"

    # -- in process

    def _run_in_process(self, cfg, callback) -> Path:
        return self._local_engine().run(cfg, on_step=callback, should_stop=self._stop_requested.is_set)

    # -- in a worker

    def _run_in_worker(self, cfg, callback) -> Path:
        return self._client.run(cfg, callback, self._stop_requested, lambda: self._force_stop)

    # -- ranks

    @contextlib.contextmanager
    def _reference_ahead(self, cfg: BurstConfig) -> Iterator[None]:
        """While a distributed parity burst's ranks start and train, its verdict's one-process reference is made
        where the model is (the worker, or this process's engine: verdicts().reference_ahead), since it depends on
        the snapshot and the config alone: the ranks' start (seconds of launcher, imports and rendezvous) hides it.
        Its thread uses the worker without the lock, which the burst holds until the thread ends: nothing else
        asks the worker meanwhile. Each task after the first starts only while the ranks still run. A failure
        costs nothing but the time: the verdict makes it again."""
        tasks = verdicts().reference_ahead(cfg, str(self.float64)) if cfg.parity and cfg.nnodes == 1 else []
        if not tasks:
            yield
            return
        ended = threading.Event()

        def make() -> None:
            with contextlib.suppress(Exception):
                for i, (task, kwargs) in enumerate(tasks):
                    if i and ended.is_set():
                        return
                    if self.in_process:
                        self._local_engine().task(task, cfg, **kwargs)
                    else:
                        self._client.request(m.RunTask(task, cfg.to_dict(), kwargs, False), cfg.effective_options(),
                                             "replaying one process", lambda: None)

        thread = threading.Thread(target=make, name="ortlab-reference-ahead", daemon=True)
        thread.start()
        try:
            yield
        finally:
            ended.set()
            thread.join()

    def _run_ranks(self, cfg, callback) -> Path:
        from ortlab.engine import launch

        return launch.run(self.ref, self.seed, self.snapshot, cfg, callback, self._stop_requested.is_set,
                          lambda: self._force_stop, self.stack)
