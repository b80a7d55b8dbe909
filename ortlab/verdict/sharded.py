"""A distributed run judged against one process of the same global batch: does the sharded run (DDP, ZeRO-1, FSDP2)
train the model one process trains on what all its ranks saw?

The reference is one PyTorch process, fp32 and the float64 arbiter as every verdict has them
(ortlab.verdict.reference), training the global batch (each step's ranks' batches concatenated in rank order) from
the same snapshot. The evidence is the verdict's own (ortlab.verdict.judge): each step's global loss (the ranks'
losses combined as the loss's reduction implies: the mean of equal shares of a mean-reduced loss, the sum of a
sum-reduced one), the first step's gradients after the ranks' reduction (rank 0's; FSDP2's shards were gathered as
the rank recorded them) and the end state (rank 0's, every other rank's checked equal to it).
Where they differ for a distributed reason, the cause is named: BatchNorm's statistics per rank (its fix,
SyncBatchNorm, verified by bursting again with it), a sum-reduced loss meeting the gradients' averaging, a rank that
saw other data than its share of the global batch, parameters out of sync.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from ortlab.engine.backends import label
from ortlab.runs.run import Run, RunStatus, load_run, write_json

if TYPE_CHECKING:
    from ortlab.verdict.driver import Driver
    from ortlab.verdict.judge import Verdict

TASK = f"{__name__}:reference"
AHEAD = f"{__name__}:ahead"  # the replays made while the ranks run (Session.burst), for the run judged first
MEMBERS = f"{__name__}:members"  # fp32's spread on the global batch (ortlab.verdict.ensemble), where it is wanted
AGAINST = "against one process of the same global batch"
REFERENCE_FOLDER = "one-process"  # in the distributed run's folder: the reference's end state (final_state.json)
KIND = "distributed"  # a cause's kind
CACHE = "_one_process"  # on the engine: the last replays (`replays`), one reference's memory
REPLAYS_FILE = "replays.json"  # in REFERENCE_FOLDER: the replays' key and the run they were made for


class GlobalFeed:
    """The batches one process of the global batch trains on: step t's is every rank's batch of step t
    (ortlab.engine.sampling.Feed, with the run's sampler and seed) concatenated in rank order."""

    def __init__(self, workload: Any, sampler: Any, world: int, seed: int):
        from ortlab.engine.sampling import Feed

        self.shares = [Feed(workload, sampler, world, r, seed) for r in range(world)]

    def batch(self, step: int) -> Any:
        return concatenated([share.batch(step) for share in self.shares])

    def load(self, step: int) -> None:
        return None


def concatenated(parts: list[Any]) -> Any:
    """Batches of the same structure (tensors, tuples, lists, dicts) joined along their first dimension; a value
    that is no tensor must be the same in every part."""
    import torch

    first = parts[0]
    if isinstance(first, torch.Tensor):
        return first if first.dim() == 0 else torch.cat(parts)
    if isinstance(first, dict):
        return type(first)({k: concatenated([p[k] for p in parts]) for k in first})
    if isinstance(first, tuple | list):
        return type(first)(concatenated([p[i] for p in parts]) for i in range(len(first)))
    if any(p != first for p in parts[1:]):
        raise ValueError(f"the ranks' batches hold different {type(first).__name__} values ({first!r}, ...): no "
                         "global batch joins them")
    return first


def reference(engine: Any, cfg: Any, ranks: list[str], losses: list[list[float]] | None = None,
              float64: str = "auto", run: str = "") -> dict[str, Any]:
    """The task run where the model is (Engine.task): the one-process replays of `cfg`'s global batch (`replays`,
    once for every run of one reference; float64's only where the ranks' global `losses` and rank 0's end state are
    not allclose to fp32's) and rank 0's first step judged against them, with what names a distributed cause: each
    rank's batches against its share, the loss's reduction, the model's BatchNorm modules."""
    from ortlab.verdict import state

    one, reused = replays(engine, cfg, float64, run)
    made = [] if reused else ["fp32"]
    if one.get("float64_for") == "":  # made ahead, while this run's ranks trained: for it
        one["float64_for"] = run
        made.append("float64")
    combined = _combined(losses or [], "sum" if one["reduction"] == "sum" else "mean")
    if "float64" not in one and not _allclose(combined, one["fp32"], state.read(Path(ranks[0])) or {}):
        arbiter(engine, cfg, one, float64, run)
        made.append("float64")
    out: dict[str, Any] = {"other_data": _other_data(engine.workload, cfg, ranks),
                           **{k: one[k] for k in ("reduction", "batch_norms", "fp32", "float64") if k in one},
                           "replays": {"key": one["key"], "for": one["for"], "made": made,
                                       "float64_for": one.get("float64_for")}}
    out["gradients"] = judged(engine, cfg, one, ranks[0], combined[0] if combined else None)
    return out


def replay_key(cfg: Any, float64: str = "auto") -> str:
    """What the one-process replays depend on besides the engine's snapshot and model: the global batches (sampler,
    seed, world size) and what shapes training (optimizer, lr, steps, precision, device), and the float64 mode. Not
    the backend, the strategy, SyncBatchNorm or the fixes: those shape the ranks, not one process."""
    return json.dumps({"sampler": None if cfg.sampler is None else str(cfg.sampler), "seed": cfg.seed,
                       "world": cfg.world_size, "optimizer": _optimizer(cfg), "lr": cfg.lr, "steps": cfg.steps,
                       "precision": str(cfg.precision), "device": str(cfg.device), "float64": str(float64)},
                      sort_keys=True)


def _optimizer(cfg: Any) -> str:
    return "adamw" if str(cfg.optimizer) == "zero1" else str(cfg.optimizer)  # zero1: AdamW, sharded


def replays(engine: Any, cfg: Any, float64: str = "auto", run: str = "") -> tuple[dict[str, Any], bool]:
    """(the one-process reference of `cfg`'s global batch from the engine's snapshot, whether it was reused): one
    fp32 process (in the ranks' precision, on the CPU, where the ranks' records are), with the loss's reduction
    and the model's BatchNorm modules; the float64 arbiter is added by `arbiter` where a run needs it. Kept on the
    engine for the last `replay_key` only (one reference's memory: a comparison judges its backends back to
    back), so that every backend, and a fix's verifying burst, is judged against the replays made for the first
    (`run`, its "for")."""
    import torch
    from torch.nn.modules.batchnorm import _BatchNorm

    from ortlab.engine import precision
    from ortlab.verdict import reference as ref

    key = replay_key(cfg, float64)
    kept = engine.__dict__.get(CACHE)
    if kept is not None and kept["key"] == key:
        if kept["for"] or not run:
            return kept, True
        kept["for"] = run  # made ahead, while this run's ranks trained: for it
        return kept, False
    engine.__dict__.pop(CACHE, None)  # the one before: its memory back before the new replays
    engine.model.to("cpu")  # where the recorded gradients are
    feed = GlobalFeed(engine.workload, cfg.sampler, cfg.world_size, cfg.seed)
    one: dict[str, Any] = {"key": key, "for": run, "reduction": _reduction(engine, feed), "first64": True,
                           "batch_norms": [n for n, m in engine.model.named_modules()
                                           if isinstance(m, _BatchNorm) and not isinstance(m, torch.nn.SyncBatchNorm)]}
    with precision.autocast(cfg.precision, torch.device("cpu")):  # the ranks' precision (none at all in fp32)
        one["fp32"], one["first"] = ref.replay(engine.workload, feed, engine.initial, _optimizer(cfg), cfg.lr,
                                               cfg.steps, cfg.seed, float64=False)
    engine.__dict__[CACHE] = one
    return one, False


def ahead(engine: Any, cfg: Any, float64: str = "auto", arbiter64: bool = False) -> dict[str, Any]:
    """The task that makes the replays (`replays`; with `arbiter64`, the float64 one too: `arbiter`) while a burst's
    ranks run, for whichever run is judged first against them: their key. One thread, as each rank has
    (ortlab.engine.launch.RANK_ENV): the ranks keep the other cores."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = replays(engine, cfg, float64)[0]
        if arbiter64 and "float64" not in one:
            arbiter(engine, cfg, one, float64)
    finally:
        torch.set_num_threads(threads)
    return {"key": one["key"]}


def arbiter(engine: Any, cfg: Any, one: dict[str, Any], float64: str = "auto", run: str = "") -> None:
    """The float64 replay of the same global batches added to `one` (`replays`; made for `run`, its
    "float64_for"), where `float64` and its estimated memory allow (ortlab.verdict.cost), else the reason."""
    from ortlab.verdict import reference as ref
    from ortlab.verdict.tasks import float64_burst_fits

    one["float64_for"] = run
    fits, error = float64_burst_fits(engine, cfg, float64, None)
    if fits:
        feed = GlobalFeed(engine.workload, cfg.sampler, cfg.world_size, cfg.seed)
        try:
            one["float64"], one["first64"] = ref.burst(engine.workload, feed, engine.initial, _optimizer(cfg),
                                                       cfg.lr, cfg.steps, cfg.seed)
        except ref.NoFloat64 as e:
            one["float64"] = {"error": str(e)}
    elif error:
        one["float64"] = {"error": error}
    else:
        one["float64"] = None  # not asked for (--float64 first-step): fp32's own replay is the yardstick


def _allclose(losses: list[float], fp32: dict[str, Any], end: dict[str, Any]) -> bool:
    """The fast path, as for one process (ortlab.verdict.procedure): the ranks' global losses and rank 0's end
    state equal to one fp32 process's up to rounding of the last bits (no float64 replay is needed to judge them)."""
    from ortlab.verdict import state
    from ortlab.verdict.exact import close_numbers

    reference = fp32["losses"]
    if not reference or len(losses) < len(reference) or not close_numbers(losses[:len(reference)], reference):
        return False
    return state.close(fp32["state"], end)


def members(engine: Any, cfg: Any, hints: dict[str, Any] | None = None) -> dict[str, Any]:
    """The task for fp32's spread: the verdict's ensemble (ortlab.verdict.ensemble.burst_members: fp32 runs of the
    one process whose rounding differs at every step, `hints` where they start and stop) on `cfg`'s global batch,
    in the ranks' precision on the CPU, as the replays ran."""
    import torch

    from ortlab.engine import precision
    from ortlab.verdict.ensemble import burst_members

    engine.model.to("cpu")
    feed = GlobalFeed(engine.workload, cfg.sampler, cfg.world_size, cfg.seed)
    with precision.autocast(cfg.precision, torch.device("cpu")):
        out = burst_members(engine.workload, feed, engine.initial, _optimizer(cfg), cfg.lr, cfg.steps, cfg.seed, (),
                            hints)
    engine.initial.restore(engine.model)
    return out


def judged(engine: Any, cfg: Any, one: dict[str, Any], rank0: str, loss0: float | None) -> dict[str, Any]:
    """Rank 0's recorded first step (its folder `rank0`; its loss the global `loss0`) judged against the
    replays' first steps (`one`: `replays`), fp32's and float64's: the gradient check's plain data."""
    import torch

    from ortlab.engine import precision
    from ortlab.verdict import record
    from ortlab.verdict.gradients import Step, judged_steps
    from ortlab.workload import to_device

    recorded = record.first_step(SimpleNamespace(path=Path(rank0)))
    if recorded is None:
        return {"agree": None, "error": "rank 0 recorded no first step", "worst": [], "skipped": True}
    workload = engine.workload
    engine.model.to("cpu")
    engine.initial.restore(engine.model)
    engine.model.train()
    feed = GlobalFeed(workload, cfg.sampler, cfg.world_size, cfg.seed)
    batches = [to_device(b, torch.device("cpu")) for b in workload.micro_batches(feed.batch, 0)]
    rank = Step(loss0 if loss0 is not None else recorded.loss, recorded.grads)
    check = judged_steps(workload, batches, cfg.seed, (), one["first"], rank, exact=one["first64"])
    out = {**check.to_dict(), "exported": 0}
    if precision.note(cfg.precision):
        out["notes"] = [*out.get("notes", []), precision.note(cfg.precision)]
    return out


def _other_data(workload: Any, cfg: Any, ranks: list[str]) -> list[dict[str, Any]]:
    """Each rank whose recorded batches (its judge.json) are not its share of the global batch: the first step."""
    from ortlab.engine.sampling import Feed
    from ortlab.verdict import record

    found = []
    for r, folder in enumerate(ranks):
        kept = record.read(SimpleNamespace(path=Path(folder)))
        if kept is None:
            continue
        share = record.batch_hashes(workload, Feed(workload, cfg.sampler, cfg.world_size, r, cfg.seed),
                                    len(kept["batches"]))
        step = next((t for t, (a, b) in enumerate(zip(share, kept["batches"], strict=False)) if a != b), None)
        if step is not None:
            found.append({"rank": r, "step": step, "saw": kept["batches"][step][:12], "share": share[step][:12]})
    return found


def _reduction(engine: Any, feed: GlobalFeed) -> str:
    """How the loss reduces over a batch's samples, measured on the first step's batches with the model in eval mode
    (each sample's output its own): "mean" when the global batch's loss is the mean of the ranks', "sum" when
    their sum, else "unknown"."""
    import torch

    workload, model = engine.workload, engine.model
    engine.initial.restore(model)
    model.eval()
    try:
        with torch.no_grad():
            whole = float(workload.forward_loss(model, *feed.batch(0)))
            parts = [float(workload.forward_loss(model, *share.batch(0))) for share in feed.shares]
    except Exception:
        return "unknown"
    finally:
        model.train()
    for name, combined in (("mean", sum(parts) / len(parts)), ("sum", sum(parts))):
        if math.isclose(whole, combined, rel_tol=1e-4, abs_tol=1e-7):
            return name
    return "unknown"


@dataclass
class Side:
    """One side of the judgement as the verdict reads a run: status, backend (what the headline calls it), losses,
    the folder holding its final_state.json, meta."""

    status: str
    backend: str
    losses: list[float]
    path: Path
    meta: dict[str, Any] = field(default_factory=dict)


def judge(driver: Driver, run: Run, verify: bool = True) -> Verdict:
    """The Verdict on distributed `run` against one process of the same global batch (module docstring); with
    `verify`, a cause's fix is verified by bursting again with it (through `driver`) and judging that run."""
    from ortlab.engine.config import BurstConfig
    from ortlab.verdict import ensemble
    from ortlab.verdict.judge import NOT_JUDGED, Verdict
    from ortlab.verdict.judge import judge as decide

    cfg = BurstConfig.from_dict(run.meta["config"])
    ranks = sorted(load_run(run.path).ranks, key=lambda r: int(r.path.name))
    why = _unjudgeable(run, cfg, ranks)
    if why:
        return Verdict(NOT_JUDGED, f"not judged {AGAINST}: {why}")
    losses = [[float(x) for x in r.losses] for r in ranks]
    kept = driver.evidence(TASK, cfg, f"judging the {cfg.strategy} run {AGAINST}", ranks=[str(r.path) for r in ranks],
                           losses=losses, float64=str(driver.float64), run=str(run.path))
    reduction = kept["reduction"]
    combined = _combined(losses, "sum" if reduction == "sum" else "mean")
    gradients = kept["gradients"]
    if reduction == "sum" and combined:
        gradients = {**gradients, "loss_ortmodule": combined[0]}
    folder = run.path / REFERENCE_FOLDER
    folder.mkdir(exist_ok=True)
    write_json(folder / "final_state.json", kept["fp32"]["state"])
    made = kept.get("replays") or {}
    write_json(folder / REPLAYS_FILE, {"key": made.get("key"), "made": made.get("made") or [],
                                       **{k: Path(made[k]).name for k in ("for", "float64_for") if made.get(k)}})
    parity = {"config": {"parity": True}}
    one = Side(RunStatus.OK, "pytorch", list(kept["fp32"]["losses"]), folder, parity)
    who = f"{label(run.backend)} {cfg.strategy} ({cfg.world_size} ranks)"
    ranked = Side(RunStatus.OK, who, combined, ranks[0].path, {**ranks[0].meta, **parity})
    float64 = kept.get("float64")
    verdict = decide(one, ranked, gradients, None, [], float64)
    if float64 and not float64.get("error") and ensemble.wanted(verdict):  # one fp32 process does not settle it
        spread = _members(driver, cfg, ensemble.hints(gradients, verdict, one, ranked, float64))
        verdict = decide(one, ranked, gradients, None, [], float64, spread)
    causes = _causes(run, cfg, ranks, kept, verdict)
    if causes and verify:
        causes = [_verified(driver, run, cfg, c) for c in causes]
    if causes:
        verdict.causes = causes + verdict.causes
    verdict.headline += f" ({AGAINST}, {cfg.world_size} ranks, {cfg.strategy})"
    verdict.notes.append(f"reference: one PyTorch process (fp32, and float64 as the arbiter where the ranks are not "
                         "allclose to it) training each step's "
                         f"{cfg.world_size} rank batches concatenated in rank order; the ranks' losses combined as "
                         f"the {reduction if reduction != 'unknown' else 'mean (the reduction not measured)'} "
                         "of their shares" + ("" if "fp32" in (made.get("made") or []) else  # another run's
                                              f" (the replays made for {Path(made.get('for') or run.path).name})"))
    return verdict


def _members(driver: Driver, cfg: Any, hints: dict[str, Any]) -> dict[str, Any]:
    """fp32's spread on the global batch (`members`, where the model is); a failure is the ensemble not run, with
    its reason (the verdict says so and keeps one fp32 process as the yardstick)."""
    try:
        return driver.evidence(MEMBERS, cfg, f"running fp32's spread {AGAINST}", hints=hints)
    except Exception as e:
        from ortlab.compat.errors import root_message

        return {"error": root_message(e)}


def _unjudgeable(run: Run, cfg: Any, ranks: list[Run]) -> str | None:
    """Why the run cannot be judged against one process, or None."""
    if not cfg.distributed:
        return "it ran in one process"
    if run.status != RunStatus.OK:
        return f"the run ended {run.status}"
    if not cfg.parity:
        return "it was not a parity burst (burst again with --parity)"
    if len(ranks) != cfg.world_size:
        return (f"this folder holds {len(ranks)} of its {cfg.world_size} ranks (a job on several machines: judge "
                "it where every rank's folder is)")
    bad = [r for r in ranks if r.status != RunStatus.OK or not (r.path / "final_state.json").is_file()]
    if bad:
        return f"rank {bad[0].path.name} ended {bad[0].status} without its end state"
    return None


def _combined(losses: list[list[float]], how: str) -> list[float]:
    steps = min(len(ls) for ls in losses)
    per = [[ls[t] for ls in losses] for t in range(steps)]
    return [sum(v) if how == "sum" else sum(v) / len(v) for v in per]


def _causes(run: Run, cfg: Any, ranks: list[Run], kept: dict[str, Any], verdict: Verdict) -> list[dict[str, Any]]:
    """The distributed causes the evidence points to (each named where it is, whatever the verdict: a rank that saw
    other data or ranks out of sync are wrong even where the numbers happen to agree)."""
    from ortlab.verdict import state

    out: list[dict[str, Any]] = []
    seen_other = kept.get("other_data") or []
    if len(seen_other) == cfg.world_size and {s["step"] for s in seen_other} == {0}:  # every rank, from the start
        out.append({"kind": KIND, "cause": "other data", "text": "this process builds other batches than every "
                    "rank trained on from step 0 (data that depends on the machine or the torch that makes it): "
                    "judge where the run was made"})
        seen_other = []
    for seen in seen_other:
        out.append({"kind": KIND, "cause": "other data", "text": f"rank {seen['rank']} saw other data than its "
                    f"share of the global batch from step {seen['step']} (its batch's SHA-256 {seen['saw']}, its "
                    f"share's {seen['share']}): a rank's data must depend on the step and its rank only"})
    drift = run.meta.get("out_of_sync")
    ends = [state.read(r.path) or {} for r in ranks]
    # parameters only: DDP broadcasts buffers from rank 0 before each forward, after which each rank's own forward
    # updates them (BatchNorm's running statistics differ at the end by design)
    apart = sorted({n for e in ends[1:] for n, v in e.items() if v.get("kind") != "buffer" and v != ends[0].get(n)})
    if drift or apart:
        where = (f"from step {drift['step']}, {drift['parameter']} first" if drift else
                 f"at the end, {apart[0]}{f' and {len(apart) - 1} more' if len(apart) > 1 else ''}")
        out.append({"kind": KIND, "cause": "out of sync", "text": f"parameters out of sync: the ranks hold "
                    f"different values ({where}): something changed one rank's weights outside the optimizer's step"})
    if not verdict.diverged:
        return out
    if kept.get("reduction") == "sum":
        out.append({"kind": KIND, "cause": "reduction", "text": f"the loss is sum-reduced and the ranks' gradients "
                    f"are averaged: each is 1/{cfg.world_size} of one process's on the global batch; fix: a "
                    f"mean-reduced loss (or the sum times the world size, {cfg.world_size})"})
    norms = kept.get("batch_norms") or []
    if norms and not cfg.sync_batchnorm:
        out.append({"kind": KIND, "cause": "batch norm", "fix": {"sync_batchnorm": True},
                    "text": f"per-rank normalization statistics: {len(norms)} BatchNorm module"
                    f"{'s' if len(norms) > 1 else ''} ({', '.join(norms[:3])}{', ...' if len(norms) > 3 else ''}) "
                    f"normalize each rank's share (1/{cfg.world_size}) of the batch by its own mean and variance, one "
                    "process the global batch's; fix: SyncBatchNorm (sync_batchnorm=True, --sync-batchnorm)"})
    return out


def _verified(driver: Driver, run: Run, cfg: Any, cause: dict[str, Any]) -> dict[str, Any]:
    """A cause with a fix, verified: the same burst again with the fix, judged the same way."""
    if not cause.get("fix"):
        return cause
    try:
        again = driver.evidence_burst(replace(cfg, name=f"fixed-{cause['cause'].replace(' ', '-')}", collect={},
                                                   **cause["fix"]))
    except Exception as e:
        from ortlab.compat.errors import root_message

        return {**cause, "text": f"{cause['text']} (not verified: {root_message(e)})"}
    from ortlab.verdict.judge import written

    fixed = written(judge(driver, again, verify=False), again)
    words = "verified: with it the run agrees" if not fixed.diverged and fixed.status != "not judged" else \
        f"not verified: with it the run still {fixed.headline[:160]}"
    return {**cause, "verified": not fixed.diverged and fixed.status != "not judged", "run": str(again.path),
            "text": f"{cause['text']} ({words}; {again.path.name})"}
