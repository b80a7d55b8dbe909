"""How a verdict is reached for two runs of one session (burst, Session.compare, the Lab, bisect share it): the
evidence gathered in the session's worker (the first step's gradients; in parity mode, unless the fast path says
the runs are allclose, the same burst in float64 PyTorch, and where one PyTorch fp32 run does not settle the
losses or the end state, fp32's spread: ortlab.verdict.ensemble), judged (ortlab.verdict.judge), and on a
divergence its causes named: what `ortlab check` finds (ORTModule), else where activation statistics first differ.

The session is only a driver here (ortlab.verdict.driver.Driver: a Session, or the runs' records in
ortlab.verdict.folders): evidence bursts, `check`, the gradient evidence, fp32's spread and the localization,
each one call.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ortlab.engine.backends import has, unavailable
from ortlab.errors import InputError
from ortlab.runs import groups
from ortlab.runs.run import RunStatus
from ortlab.verdict import tasks
from ortlab.verdict.judge import written

if TYPE_CHECKING:
    from ortlab.engine.config import BurstConfig
    from ortlab.runs.run import Run
    from ortlab.verdict.driver import Driver
    from ortlab.verdict.judge import Verdict
    from ortlab.verdict.localize import Localization

NOISE_PERTURBATION = 1e-7  # the noise pair's start (only without float64): the parameters times (1 + this)


def judge(session: Driver | None, pytorch: Run, other: Run) -> Verdict:
    """The Verdict on `other` (ORTModule, torch.compile) against `pytorch`, both runs of `session` from the same
    snapshot, written to the other run's folder (verdict.json); the evidence runs are kept under it (ortlab-runs/),
    not added to the session's runs."""
    from ortlab.engine.config import BurstConfig
    from ortlab.verdict.judge import NOT_JUDGED, Verdict
    from ortlab.verdict.judge import judge as decide

    if pytorch.status != RunStatus.OK or other.status != RunStatus.OK or session is None:
        return written(decide(pytorch, other), other)
    if (other.meta.get("config") or {}).get("nproc", 1) * (other.meta.get("config") or {}).get("nnodes", 1) > 1:
        return judge_distributed(session, other)  # its ranks against one process of the same global batch
    own = str(groups.own_folder(other.path))  # its evidence bursts: kept under the run judged, not the user's
    pt_config = replace(BurstConfig.from_dict(pytorch.meta["config"]), out=own)
    config = replace(BurstConfig.from_dict(other.meta["config"]), out=own)
    fixes = tuple((other.meta.get("fixes") or {}).get("applied") or ())
    burst = config.parity and not _allclose(pytorch, other)
    evidence = gradient_evidence(session, config, fixes, burst, _peak(pytorch), pytorch.meta.get("model"))
    float64 = evidence.pop("float64", None)
    noise = None
    if burst and (float64 is None or float64.get("error")):  # today's evidence: a PyTorch pair from a perturbed start
        noise = session.evidence_burst(replace(pt_config, perturb=NOISE_PERTURBATION, name="pytorch-noise",
                                                    collect={}))
        if noise.status != RunStatus.OK:
            return written(Verdict(NOT_JUDGED, f"not judged: the noise burst ended {noise.status}"), other)
    verdict = decide(pytorch, other, evidence, noise, float64=float64)
    members = None
    if noise is None and float64 and not float64.get("error") and wanted(verdict):
        members = ensemble_evidence(session, config, fixes, hints(evidence, verdict, pytorch, other, float64))
        verdict = decide(pytorch, other, evidence, noise, float64=float64, ensemble=members)
    if verdict.diverged:  # name the causes: what check finds (not needed for buffers alone), else where statistics
        # first differ; both need the backend, which may not run where runs made elsewhere are judged
        absent = unavailable(config.backend)
        explained = not (verdict.losses or {}).get("diverged") and evidence.get("agree") is not False
        found = check_causes(session, config.options, fixes, evidence) if has(config.backend, "compat") and \
            not explained and not absent else []
        inside = None
        if not verdict.causes and not found and not absent:  # a backend whose tries cost a compile, not an
            # export, is searched down to the module and the op; ORTModule's statistics say where to look
            if not has(config.backend, "compat") and evidence.get("agree") is False:
                inside = module_cause(session, config, fixes)
            found.append(inside or localize(session, pt_config, config))
        if found:
            verdict = decide(pytorch, other, evidence, noise, found, float64, members)
        if absent:
            verdict.notes.append(f"causes not looked for here: {absent}")
        if evidence.get("agree") is False and not has(config.backend, "reference"):  # the script that shows it
            # (ORTModule: the minifier, one export per try, is the user's next step, not part of every verdict)
            what = "a script that shows it" if inside else "shrink it to the smallest module and a script that shows it"
            verdict.notes.append(f"{what}: ortlab repro {other.path}")
    return written(verdict, other)


def judge_distributed(session: Driver, run: Run) -> Verdict:
    """The Verdict on a distributed parity run against one process of the same global batch
    (ortlab.verdict.sharded), written to its folder (verdict.json); once judged, read back from there."""
    from ortlab.verdict.judge import FILE, NOT_JUDGED, Verdict
    from ortlab.verdict.sharded import AGAINST, judge

    kept = run.read_json(FILE)
    if kept and AGAINST in kept.get("headline", ""):
        return Verdict.from_dict(kept)
    try:
        verdict = judge(session, run)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # the evidence could not be gathered: said, never the run lost (nor an agreement)
        from ortlab.compat.errors import root_message

        verdict = Verdict(NOT_JUDGED, f"not judged {AGAINST}: {root_message(e)}")
    return written(verdict, run)


def reference_ahead(config: BurstConfig, float64: str) -> list[tuple[str, dict[str, Any]]]:
    """The tasks that make a distributed parity burst's one-process replays ahead of its verdict, while its ranks
    run (ortlab.verdict.sharded.ahead), with their arguments: the fp32 replay, then the float64 one."""
    from ortlab.verdict.sharded import AHEAD

    if not (config.distributed and config.parity):
        return []
    return [(AHEAD, {"float64": float64}), (AHEAD, {"float64": float64, "arbiter64": True})]


def gradient_check(session: Driver, options: Any = None, fixes: Any = (), parity: bool = True, seed: int = 0
                   ) -> dict[str, Any]:
    """The first batch's gradients on PyTorch and on a fresh ORTModule with these options and fixes (judged against
    float64 where they are not allclose): the evidence bisect judges a toggled option by."""
    from ortlab.compat.registry import parse
    from ortlab.engine.config import BurstConfig

    config = BurstConfig(backend="ortmodule", steps=1, options=_shell(session).overlaid(options),
                         parity=parity, seed=seed, fixes=parse(fixes))
    return gradient_evidence(session, config, tuple(config.fixes))


def step_gradients(workload: Any, fixes: Any, log: Any, runner: Any, batch: Any) -> Any:
    """`ortlab check`'s training step judged as the verdict judges a first step (ortlab.verdict.gradients): `runner`
    (a fresh ORTModule) beside PyTorch on one batch, against float64 where they are not allclose."""
    from ortlab.verdict.gradients import first_step

    return first_step(workload, fixes, log=log, runner=runner, batch=batch)


def gradient_words(row: dict[str, Any]) -> str:
    """A gradient row of that judgement in words (ortlab.verdict.gradients.describe)."""
    from ortlab.verdict.gradients import describe

    return describe(row)


def gradient_evidence(session: Driver, config: BurstConfig, fixes: tuple[str, ...], burst: bool = False,
                      peak: dict[str, Any] | None = None, model: dict[str, Any] | None = None) -> dict[str, Any]:
    """The gradient check for `config`'s backend (and with `burst`, the float64 burst where the session's float64
    mode and its estimated need allow: ortlab.verdict.cost; `peak`, the PyTorch burst's peak memory) from the
    session's engine; a failure is a skipped check with its reason, never a lost verdict (nor an agreement); killed
    for memory, the reason says what the float64 burst needs (`model`: the run's description, its parameter
    counts) and the verdict that fits."""
    from ortlab.engine.types import Optimizer, Strategy

    try:
        if config.distributed:  # one process: the model as a rank would start it
            config = replace(config, nproc=1, nnodes=1, node_rank=0, rdzv_endpoint=None, optimizer=Optimizer.ADAMW,
                             save_checkpoint=False, sampler=None, strategy=Strategy.SINGLE)
        return session.evidence(tasks.GRADIENT_CHECK, config, "comparing first-step gradients", fixes=fixes,
                                burst=burst, float64=str(session.float64), peak=peak)
    except Exception as e:
        from ortlab.compat.errors import root_message
        from ortlab.engine.client import WorkerOutOfMemory

        error = root_message(e)
        if isinstance(e, WorkerOutOfMemory) and burst:
            error += _cheaper(config, model or {})
        return {"agree": None, "error": error, "worst": [], "skipped": True}


def _cheaper(config: BurstConfig, model: dict[str, Any]) -> str:
    """After the worker was killed for memory during the float64 burst: what it needed, and the verdict that fits."""
    from ortlab.verdict import cost

    weights, trained = model.get("parameters"), model.get("trainable_parameters")
    if not weights or not trained:
        return "; --float64 first-step judges without the float64 burst"
    estimate = cost.need(weights, trained, str(config.optimizer))
    return (f"; the float64 burst needs about {estimate.bytes / 1e9:.1f} GB more than training, without its "
            "activations: --float64 first-step judges the first step's gradients against float64 block by block "
            "and the losses and end state against fp32's spread, within training's memory")


def ensemble_evidence(session: Driver, config: BurstConfig, fixes: tuple[str, ...], given: dict[str, Any] | None = None
                      ) -> dict[str, Any]:
    """fp32 runs of the burst's steps whose rounding differs (ortlab.verdict.ensemble), from the session's engine
    (`given`: ensemble.hints); a failure is an ensemble not run, with its reason."""
    from ortlab.engine.types import Optimizer, Strategy

    try:
        if config.distributed:
            config = replace(config, nproc=1, nnodes=1, node_rank=0, rdzv_endpoint=None, optimizer=Optimizer.ADAMW,
                             save_checkpoint=False, sampler=None, strategy=Strategy.SINGLE)
        return session.evidence(tasks.ENSEMBLE, config, "running fp32's spread", fixes=fixes, hints=given)
    except Exception as e:
        from ortlab.compat.errors import root_message

        return {"error": root_message(e)}


def wanted(verdict: Any) -> bool:
    """Whether fp32's spread could change the verdict (ortlab.verdict.ensemble.wanted)."""
    from ortlab.verdict.ensemble import wanted as needs

    return needs(verdict)


def hints(evidence: dict[str, Any], verdict: Any, pytorch: Any, other: Any, float64: dict[str, Any]
          ) -> dict[str, Any]:
    """What the ensemble can start from and stop at (ortlab.verdict.ensemble.hints)."""
    from ortlab.verdict.ensemble import hints as given

    return given(evidence, verdict, pytorch, other, float64)


def check_causes(session: Driver, options: Any, applied: tuple[str, ...], evidence: dict[str, Any] | None = None
                 ) -> list[dict[str, Any]]:
    """What `check` finds that the applied fixes did not remove, as causes (with the fixes that remove them). A
    wrong gradient is named as the verdict's own evidence names it (`evidence`: its gradient check), so that the
    cause and the headline speak of one parameter (ORT's wrong gradients can differ from one run to the next)."""
    try:
        report = session.check("auto", options)
    except Exception as e:  # a cause not named is no reason to lose the verdict
        from ortlab.compat.errors import root_message

        return [{"kind": "check", "text": f"ortlab check could not run: {root_message(e)}"}]
    found = [b for b in report.blockers if not set(b.fixes) & set(applied)]
    if not found:
        return []
    new = [f for f in report.fixes if f not in applied]
    return [{"kind": "check", "text": f"ortlab check: {_line(b, evidence)}", "blocker": _located(b, evidence).to_dict()}
            for b in found] + (
        [{"kind": "fix", "text": f"fixes {', '.join(new)} remove this: burst with fixes=\"auto\" (--fix auto)",
          "fixes": new}] if new else [])


def _worst(blocker: Any, evidence: dict[str, Any] | None) -> dict[str, Any] | None:
    """The verdict's worst gradient, when the blocker is a wrong gradient and the verdict's gradients diverged."""
    from ortlab.compat.blockers import WRONG_GRADIENT

    worst = ((evidence or {}).get("worst") or [{}])[0]
    if blocker.kind != WRONG_GRADIENT or evidence is None or evidence.get("agree") is not False or \
            not worst.get("parameter"):
        return None
    return worst


def _located(blocker: Any, evidence: dict[str, Any] | None) -> Any:
    """A wrong-gradient blocker located by the verdict's worst parameter (check's own step can find another: ORT's
    wrong gradients differ from one run to the next): at the module holding the operator nearest to it, when the
    graph holds it in several, else at the parameter's module."""
    worst = _worst(blocker, evidence)
    if worst is None:
        return blocker
    return replace(blocker, module=_nearest(worst.get("module") or "", blocker.modules) or worst.get("module") or None)


def _nearest(module: str, candidates: list[str]) -> str | None:
    """The candidate module path sharing the longest leading path with `module` (the first such in graph order)."""
    def shared(path: str) -> int:
        n = 0
        for a, b in zip(module.split("."), path.split("."), strict=False):
            if a != b:
                break
            n += 1
        return n

    return max(candidates, key=shared) if candidates else None


def _line(blocker: Any, evidence: dict[str, Any] | None) -> str:
    """The blocker's line, naming the verdict's worst parameter for a wrong gradient (as the headline does), and
    the module holding the operator nearest to it."""
    worst = _worst(blocker, evidence)
    located = _located(blocker, evidence)
    line = located.line()
    if worst is None:
        return line
    if len(blocker.modules) > 1:
        line = line.replace(f"(module {located.module}", f"(module {located.module}, the nearest to it of the "
                                                          f"{len(blocker.modules)} that hold it", 1)
    return line.replace(f"{blocker.kind}: ", f"{blocker.kind} of {worst['parameter']}: ", 1)


def localize(session: Driver, pt_config: BurstConfig, config: BurstConfig) -> dict[str, Any]:
    """One step with activation statistics on both backends, and the first divergence between them. A search that
    fails (a backend that does not run here, a run that recorded no statistics) is a cause not found, said in
    its text: never the verdict lost."""
    try:
        return _localized(session, pt_config, config)
    except KeyboardInterrupt:
        raise
    except Exception as e:
        from ortlab.compat.errors import root_message

        return {"kind": "localized", "text": f"could not localize: {root_message(e)}"}


def _localized(session: Driver, pt_config: BurstConfig, config: BurstConfig) -> dict[str, Any]:
    from ortlab.activations import compare

    stats: dict[str, Any] = {"steps": 1, "parity": True, "collect": {"stats": {}}, "nproc": 1, "nnodes": 1,
                             "node_rank": 0, "rdzv_endpoint": None, "save_checkpoint": False, "strategy": "single"}
    try:
        pt = session.evidence_burst(replace(pt_config, name="localize-pytorch", **stats))
        other = session.evidence_burst(replace(config, name=f"localize-{config.backend}", **stats))
    except InputError as e:  # a backend that does not run where the verdict is reached (ortlab.verdict.folders)
        return {"kind": "localized", "text": f"could not localize: {e}"}
    if not (pt.ok and other.ok):
        return {"kind": "localized", "text": f"could not localize: the statistics bursts ended {pt.status} and "
                                             f"{other.status}"}
    first = compare(pt, other).first
    if first is None:
        return {"kind": "localized", "text": "one step's statistics agree on both backends: the difference "
                "builds up over steps", "runs": [pt.path.name, other.path.name]}
    return {"kind": "localized", "text": f"first divergence (activation statistics, one step): {first}",
            "step": first.step, "tensor": first.name, "runs": [pt.path.name, other.path.name]}


def module_cause(session: Driver, config: BurstConfig, fixes: tuple[str, ...]) -> dict[str, Any] | None:
    """The verdict's cause from the smallest module that reproduces the gradient divergence on `config`'s backend
    and the first op inside it beyond float64's rounding (ortlab.verdict.localize, ortlab.verdict.ops); None when
    no module reproduces it or the search failed (the statistics then say where to look)."""
    from ortlab.verdict.localize import LOCALIZED

    try:
        found = localize_module(session, config.options, fixes, config.seed, backend=config.backend,
                                compile=config.compile)
    except KeyboardInterrupt:
        raise
    except Exception:
        return None
    if not found.found:
        return None
    first = (found.ops or {}).get("first_index")
    return {"kind": "localized", "text": found.text, "module": found.path, "op": first, LOCALIZED: found.to_dict()}


def localize_module(session: Driver, options: Any = None, fixes: Any = (), seed: int = 0, progress: Any = None,
                    repro: Any = None, known: dict[str, Any] | None = None, origin: str = "",
                    backend: str = "ortmodule", compile: dict[str, Any] | None = None) -> Localization:
    """Session.localize: the smallest module whose run alone on `backend` (ORTModule with `fixes`, torch.compile
    with its settings `compile`) reproduces the gradient divergence against float64 (ortlab.verdict.localize),
    and the ops inside it judged (ortlab.verdict.ops), asked of the session's worker or in-process engine."""
    from ortlab.compat.registry import AUTO, FixError, parse
    from ortlab.engine.backends import has, registered
    from ortlab.engine.config import BurstConfig
    from ortlab.verdict.localize import Localization, Tried

    if has(registered(backend).name, "reference"):
        raise InputError(f"backend {backend!r} is the reference every other is judged against: localize takes "
                         "ortmodule or compile")
    if parse(fixes) == AUTO:
        raise FixError("localize takes the fixes the ORTModule run applied, by name (its meta.json says which), "
                       "not 'auto'")
    config = BurstConfig(backend=backend, steps=1, options=_shell(session).overlaid(options), parity=True,
                         seed=seed, fixes=parse(fixes), compile=dict(compile or {}))
    fixes, folder = tuple(config.fixes), str(repro) if repro is not None else None
    told = (lambda n, row: progress(n, Tried(**row))) if progress else None
    return Localization.from_dict(session.evidence(tasks.LOCALIZE, config, "localizing the divergence", told,
                                                   fixes=fixes, repro=folder, known=known, origin=origin))


def _peak(run: Run) -> dict[str, Any] | None:
    """The run's peak memory: {"bytes": its steps' largest peak_mem_mb (the CUDA allocator's, or the process's
    resident set), "device": where it was measured ("cuda", "cpu")}; None where it recorded none."""
    try:
        peak = run.metrics["peak_mem_mb"].max()
    except (KeyError, AttributeError, TypeError, ValueError):
        return None
    if peak != peak:
        return None
    return {"bytes": float(peak) * 2**20, "device": str(run.meta.get("device") or "cpu").partition(":")[0]}


def _shell(session: Driver) -> Any:
    """The options the session's bursts start from."""
    from ortlab.options import Options

    return session.shell_options if session.shell_options is not None else Options.from_environ()


def _allclose(pytorch: Any, other: Any) -> bool:
    """The fast path: the two runs' losses and end states equal up to rounding of the last bits (no float64 burst
    is needed to judge them)."""
    from ortlab.verdict import state
    from ortlab.verdict.exact import close_numbers

    pt, ot = pytorch.losses, other.losses
    if not pt or len(pt) != len(ot) or not close_numbers(ot, pt):
        return False
    return state.close(state.read(pytorch.path) or {}, state.read(other.path) or {})
