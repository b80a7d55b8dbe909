"""The verdict on two run folders made anywhere (`ortlab judge`, `ortlab.judge_runs`): ORTModule's run from the ort
stack against torch.compile's from the newest torch, runs made by separate processes or machines.

The same procedure as a comparison in one process (ortlab.verdict.procedure), with another transport: the first
step's gradients come from the runs' own records (ortlab.verdict.record), and what must be computed again (the
float64 burst and step, fp32's spread, a noise pair, the statistics that localize a divergence) is computed in
this process from the runs' snapshot and batches, rebuilt by the run's model factory and checked against the
hashes both runs recorded. Two runs that did not start from the same snapshot, batches or settings are refused in
one line naming what differs. Neither run PyTorch's (ORTModule against torch.compile): each is judged against the
PyTorch run given as the reference, as a comparison judges each backend against PyTorch.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortlab.engine.backends import has, label
from ortlab.errors import InputError
from ortlab.runs import groups
from ortlab.runs.run import Run, RunStatus, load_run

if TYPE_CHECKING:
    from ortlab.compat.report import CheckReport
    from ortlab.engine.config import BurstConfig
    from ortlab.engine.session import Session
    from ortlab.engine.types import Float64
    from ortlab.options import Options
    from ortlab.verdict.judge import Verdict

SETTINGS = ("seed", "optimizer", "lr", "steps", "precision", "perturb", "sampler")  # what must agree in config


class JudgeError(InputError):
    """Two runs that cannot be judged together: the line names which run and what differs."""


@dataclass
class Judged:
    """One verdict from folders: the other backend's run against the PyTorch run."""

    pytorch: Run
    other: Run
    verdict: Any

    def title(self) -> str:
        """Which run against which, with the torch each ran on."""
        return (f"{_label(self.other)} ({self.other.path.name}) against {_label(self.pytorch)} "
                f"({self.pytorch.path.name}):")

    def to_dict(self) -> dict[str, Any]:
        return {"pytorch": str(self.pytorch.path), "other": str(self.other.path), "backend": self.other.backend,
                "torch": {"pytorch": _torch(self.pytorch), "other": _torch(self.other)},
                "verdict": self.verdict.to_dict()}

    def __str__(self) -> str:
        return "\n".join([self.title(), *(f"  {line}" for line in self.verdict.lines())])


def judge_runs(first: str | Path | Run, second: str | Path | Run, reference: str | Path | Run | None = None,
               out: str | Path | None = None, float64: Float64 | str = "auto") -> list[Judged]:
    """The verdict on two run folders made by any process on any stack, as Session.compare gives it in one: the
    non-PyTorch run against the PyTorch one, or (neither PyTorch's) each against `reference`, a PyTorch run of
    the same start. Each verdict is written to its run's folder (verdict.json). `out`: where the bursts the
    verdict may need (a noise pair, the statistics that localize a divergence) go (default: beside the judged
    run). `float64`: whether the float64 burst runs (ortlab.verdict.cost: "auto", "burst", "first-step"). Raises
    JudgeError (one line) when the runs cannot be judged together."""
    from ortlab.engine.types import Float64

    float64 = Float64(float64)  # a bad mode is refused before any run is read
    runs = [_load(r) for r in (first, second)]
    ref = _load(reference) if reference is not None else None
    chosen = pairs(runs, ref)
    for pytorch, other in chosen:  # every refusal before any verdict
        if pytorch.status == RunStatus.OK and other.status == RunStatus.OK:
            comparable(pytorch, other)
    sessions: dict[str, Any] = {}  # one per start: its model built once, its float64 burst run once
    return [Judged(pytorch, other, _judge(pytorch, other, out, sessions, float64)) for pytorch, other in chosen]


def pairs(runs: list[Run], reference: Run | None) -> list[tuple[Run, Run]]:
    """(PyTorch run, other run) to judge: the non-PyTorch run against the PyTorch one, or both against the
    reference."""
    from ortlab.engine.backends import BACKENDS
    from ortlab.runs.groups import references

    pytorch = references(runs, BACKENDS)
    if reference is not None and not has(reference.backend, "reference"):
        raise JudgeError(f"--reference {reference.path.name} is a {_label(reference)} run: the reference is a "
                         "PyTorch run of the same start")
    if len(pytorch) == 2:
        raise JudgeError(f"both runs are PyTorch's ({runs[0].path.name}, {runs[1].path.name}): judge an ORTModule or "
                         "torch.compile run against a PyTorch one")
    if len(pytorch) == 1:
        if reference is not None:
            raise JudgeError(f"{pytorch[0].path.name} is already a PyTorch run: --reference is for two runs neither "
                             "of which is PyTorch's")
        other = runs[1] if runs[0] is pytorch[0] else runs[0]
        return [(pytorch[0], other)]
    if reference is None:
        raise JudgeError(f"neither run is PyTorch's ({runs[0].path.name}: {_label(runs[0])}, {runs[1].path.name}: "
                         f"{_label(runs[1])}): name a PyTorch parity run of the same start with --reference RUN")
    return [(reference, runs[0]), (reference, runs[1])]


def comparable(pytorch: Run, other: Run) -> None:
    """JudgeError naming what differs, unless both runs recorded the same start: snapshot, batches, settings."""
    from ortlab.verdict import record

    recorded = []
    for run in (pytorch, other):
        found = record.read(run)
        if found is None:
            why = ("it was not a parity burst" if not run.meta.get("config", {}).get("parity")
                   else f"it has no {record.FILE} (made by an ortlab that did not record one)")
            raise JudgeError(f"{run.path.name} cannot be judged from its folder: {why}; burst again with --parity")
        if not record.has_first_step(run):
            raise JudgeError(f"{run.path.name} has neither {record.SUMMARY} nor {record.GRADIENTS} (its first step's "
                             "gradients): burst again with --parity")
        recorded.append(found)
    a, b = recorded
    names = f"{pytorch.path.name} and {other.path.name}"
    if a["snapshot"] != b["snapshot"]:
        raise JudgeError(f"{names} did not start from the same snapshot (SHA-256 {a['snapshot'][:12]} vs "
                         f"{b['snapshot'][:12]}): burst both from one model, seed and snapshot file")
    ca, cb = pytorch.meta.get("config", {}), other.meta.get("config", {})
    for key in SETTINGS:
        if ca.get(key) != cb.get(key):
            raise JudgeError(f"{names} did not start alike: {key} {ca.get(key)!r} vs {cb.get(key)!r}")
    for step, (x, y) in enumerate(zip(a["batches"], b["batches"], strict=False)):
        if x != y:
            raise JudgeError(f"{names} did not train on the same batches: step {step}'s differs (SHA-256 {x[:12]} "
                             f"vs {y[:12]})")


def _judge(pytorch: Run, other: Run, out: str | Path | None, sessions: dict[str, Any],
           float64: Float64 | str = "auto") -> Any:
    from ortlab.engine.config import made_elsewhere
    from ortlab.engine.session import Session
    from ortlab.verdict import procedure
    from ortlab.verdict.judge import NOT_JUDGED, NOT_WRITTEN, written

    if pytorch.status != RunStatus.OK or other.status != RunStatus.OK:
        return procedure.judge(None, pytorch, other)
    rebuild = (pytorch.meta.get("model") or {}).get("rebuild") or {}
    if not rebuild.get("ref"):
        raise JudgeError(f"{pytorch.path.name}'s model was given as a callable (a notebook's factory), which no "
                         "other process can build: give it as module:callable or file.py:callable, or judge in the "
                         "session that made both runs (Session.judge)")
    from ortlab.workload import ModelRef

    given = out
    out = Path(out) if out is not None else other.path.parent
    snapshot = _snapshot_file(pytorch, other, rebuild)
    key = json.dumps([rebuild["ref"], rebuild.get("seed") or 0, snapshot, str(out)], sort_keys=True, default=str)
    if key not in sessions:
        sessions[key] = Session(ModelRef.from_dict(rebuild["ref"]), seed=rebuild.get("seed") or 0, out=out,
                                in_process=True, snapshot=snapshot, float64=float64)
    session = sessions[key]
    # its evidence bursts: where asked, else under the run judged (ortlab's own runs, not the user's)
    transport = Recorded(session, pytorch, other, Path(given) if given is not None else groups.own_folder(other.path))
    transport.check_start()
    with made_elsewhere():  # the other run's backend may not run here (ORTModule on the current stack)
        verdict = procedure.judge(transport, pytorch, other)
    if verdict.status != NOT_JUDGED or verdict.gradients:
        verdict.notes.append(f"judged from two run folders: {_label(other)} on torch {_torch(other)}, PyTorch on "
                             f"torch {_torch(pytorch)}; float64 here on torch {_torch(None)}")
        if not any(n.startswith(NOT_WRITTEN) for n in verdict.notes):
            written(verdict, other)
    return verdict


def _snapshot_file(pytorch: Run, other: Run, rebuild: dict[str, Any]) -> str | None:
    """The snapshot to judge from: one a run folder holds (record.SNAPSHOT), else the file the runs were made from
    when it is here, else None (the factory builds it again; checked by its hash)."""
    from ortlab.verdict import record

    for run in (pytorch, other):
        if (run.path / record.SNAPSHOT).is_file():
            return str(run.path / record.SNAPSHOT)
    given = rebuild.get("snapshot")
    return given if given and Path(given).is_file() else None


class Recorded:
    """The driver procedure.judge asks for evidence (ortlab.verdict.driver.Driver): the first steps from the runs'
    records, the rest from an in-process session of the runs' model here (its bursts written to `out`)."""

    def __init__(self, session: Session, pytorch: Run, other: Run, out: Path):
        from ortlab.verdict import record

        self.session, self.pytorch, self.other, self.out = session, pytorch, other, Path(out)
        self.steps = (record.first_step(pytorch), record.first_step(other))

    @property
    def shell_options(self) -> Options | None:
        return self.session.shell_options

    @property
    def float64(self) -> Float64 | str:
        return self.session.float64

    def check_start(self) -> None:
        """JudgeError unless this process builds the snapshot and batches the runs recorded."""
        from ortlab.engine.config import BurstConfig
        from ortlab.verdict import record

        engine = self.session._local_engine()
        wanted = record.read(self.pytorch)
        if wanted is None:  # checked when the pair was made: a folder changed since
            raise JudgeError(f"{self.pytorch.path.name} no longer holds {record.FILE}")
        here = record.snapshot_hash(engine.initial)
        if here != wanted["snapshot"]:
            raise JudgeError(f"this process builds another starting snapshot of {engine.ref.describe()} than "
                             f"{self.pytorch.path.name} recorded (SHA-256 {here[:12]} vs {wanted['snapshot'][:12]}, "
                             f"torch {_torch(None)} here) and neither folder holds {record.SNAPSHOT}: judge where the "
                             "runs were made, or burst from a snapshot file")
        cfg = BurstConfig.from_dict(self.pytorch.meta["config"])
        batches = record.batch_hashes(engine.workload, engine._feed(cfg), len(wanted["batches"]))
        for step, (x, y) in enumerate(zip(batches, wanted["batches"], strict=True)):
            if x != y:
                raise JudgeError(f"this process's batch of step {step} differs from the one {self.pytorch.path.name} "
                                 f"trained on (SHA-256 {x[:12]} vs {y[:12]}): judge where the runs were made")

    def evidence_burst(self, config: BurstConfig) -> Run:
        """An evidence burst here (a noise pair, localizing statistics), written to `out`; BackendUnavailable for
        a backend that does not run here."""
        from ortlab.engine.backends import check_available
        from ortlab.engine.types import Device

        check_available(config.backend)
        return self.session.evidence_burst(replace(config, out=str(self.out.expanduser().resolve()),
                                                   device=Device.AUTO))

    def check(self, fixes: Any = "auto", options: Options | dict | None = None) -> CheckReport:
        return self.session.check(fixes, options)

    def evidence(self, task: str, config: BurstConfig, what: str, progress: Callable | None = None,
                 **kwargs: Any) -> dict[str, Any]:
        """The gradient check of the recorded first steps (float64 computed here; with `burst` the float64 burst:
        what tasks.gradient_check gives in the runs' own process); any other task from the session here."""
        from ortlab.verdict import tasks

        if task == tasks.GRADIENT_CHECK:
            return evidence(self.session._local_engine(), config, kwargs.get("fixes", ()), *self.steps,
                            kwargs.get("burst", False), kwargs.get("float64", "auto"), kwargs.get("peak"))
        return self.session.evidence(task, config, what, progress, **kwargs)


def evidence(engine: Any, cfg: Any, fixes: tuple[str, ...], pt: Any, other: Any, burst: bool = False,
             float64: str = "auto", peak: dict[str, Any] | None = None) -> dict[str, Any]:
    """tasks.gradient_check for two first steps recorded elsewhere: judged here against float64 of the engine's
    snapshot and first batch (the float64 burst's first step when `burst` and `float64` with its estimated need
    allow it: ortlab.verdict.cost)."""
    import torch

    from ortlab.engine import precision
    from ortlab.options import Options
    from ortlab.verdict import reference
    from ortlab.verdict.gradients import judged_steps
    from ortlab.workload import to_device

    reference_run, first64, error = None, True, None
    engine.model.to("cpu")  # where the recorded gradients are
    if burst:
        from ortlab.verdict.tasks import float64_burst_fits

        burst, error = float64_burst_fits(engine, cfg, float64, peak)
    if burst:
        done = engine.__dict__.setdefault("_float64_bursts", {})  # both runs against one reference: run once
        key = (cfg.optimizer, cfg.lr, cfg.steps, cfg.seed, cfg.sampler)
        if key not in done:
            try:
                done[key] = (*reference.burst(engine.workload, engine._feed(cfg), engine.initial, cfg.optimizer,
                                              cfg.lr, cfg.steps, cfg.seed), None)
            except reference.NoFloat64 as e:
                done[key] = (None, True, str(e))
        reference_run, first64, error = done[key]
    engine.initial.restore(engine.model)
    device = torch.device("cpu")
    batches = [to_device(b, device) for b in engine.workload.micro_batches(engine._feed(cfg).batch, 0)]
    engine.model.train()
    with Options(enable_compute_optimizer=False).applied(), precision.autocast(cfg.precision, device):
        check = judged_steps(engine.workload, batches, cfg.seed, fixes, pt, other, exact=first64 or True)
    out = {**check.to_dict(), "exported": 0}
    if precision.note(cfg.precision):
        out["notes"] = [*out.get("notes", []), precision.note(cfg.precision)]
    if reference_run is not None or error is not None:
        out["float64"] = reference_run if error is None else {"error": error}
    return out


def _load(run: str | Path | Run) -> Run:
    return run if isinstance(run, Run) else load_run(run)


def _label(run: Run) -> str:
    return label(run.backend)


def _torch(run: Run | None) -> str:
    """The torch a run trained on (its meta's versions), or this process's."""
    if run is None:
        import torch

        return torch.__version__
    return run.versions.get("torch", "?")


__all__ = ["JudgeError", "Judged", "judge_runs"]


def judge_folder(run: str | Path | Run, float64: str = "auto") -> Verdict:
    """`ortlab judge RUN` of a distributed parity run's folder: judged again here against one process of the same
    global batch, by an in-process session of its model rebuilt from rank 0's record (its snapshot.pt, else its
    factory, checked by the snapshot's SHA-256), and written to its verdict.json. JudgeError (one line) when it
    cannot be."""
    from ortlab.engine.session import Session
    from ortlab.verdict import record
    from ortlab.verdict.judge import written
    from ortlab.verdict.sharded import judge
    from ortlab.workload import ModelRef

    run = run if isinstance(run, Run) else load_run(run)
    ranks = sorted(run.ranks, key=lambda r: int(r.path.name))
    if not ranks:
        raise JudgeError(f"{run.path.name} is not a distributed run (no ranks/ folder): judge two run folders, "
                         "RUN RUN")
    rebuild = (ranks[0].meta.get("model") or {}).get("rebuild") or {}
    kept = record.read(ranks[0])
    if not rebuild.get("ref") or kept is None:
        why = ("its model was given as a callable (a notebook's factory), which no other process can build"
               if kept is not None else "its rank 0 recorded no judge.json (not a parity burst: burst again with "
                                        "--parity)")
        raise JudgeError(f"{run.path.name} cannot be judged from its folder: {why}")
    snapshot = ranks[0].path / record.SNAPSHOT
    with Session(ModelRef.from_dict(rebuild["ref"]), seed=rebuild.get("seed") or 0, out=run.path.parent,
                 in_process=True, float64=float64,
                 snapshot=str(snapshot) if snapshot.is_file() else rebuild.get("snapshot")) as session:
        here = record.snapshot_hash(session._local_engine().initial)
        if here != kept["snapshot"]:
            raise JudgeError(f"this process builds another starting snapshot than {run.path.name}'s ranks trained "
                             f"from (SHA-256 {here[:12]} vs {kept['snapshot'][:12]}): judge where the run was made")
        verdict = judge(session, run)
    return written(verdict, run)
