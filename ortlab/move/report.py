"""The move, written out: for an ORTModule run and a torch.compile run (typically on the newest torch, made by
another process), what each option the ORTModule run used becomes (ortlab.move.mapping), both sides' measured
figures as their run folders recorded them (step time after start-up, start-up, memory, torch and stack), and the
verdict on each: read from its verdict.json, or judged now by `ortlab.judge_runs` against a PyTorch reference.
A figure a run did not record is said missing, never estimated."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortlab.engine.backends import BACKENDS, has, label
from ortlab.errors import InputError
from ortlab.move import ranks
from ortlab.move.mapping import Fit, equivalent
from ortlab.runs import facts
from ortlab.runs.run import Run, RunStatus, load_run

# The figures compared side by side: (key in a side's dict, label, unit, format)
FIGURES = (("median_step_s", "median step after start-up", "ms", 1000.0),
           ("startup_s", "start-up (ORT's export and session / torch.compile's compile)", "s", 1.0),
           ("saved_for_backward_mb", "kept for backward", "MB", 1.0),
           ("activation_peak_mb", "activation peak (ORT's graph)", "MB", 1.0),
           ("peak_mem_mb", "peak resident set", "MB", 1.0))  # on CUDA: the allocator's (ortlab.runs.facts)
# What a run that fell back to PyTorch cannot show of its backend (its figures would be PyTorch's under its name).
_PYTORCHS = ("median_step_s", "startup_s", "saved_for_backward_mb", "activation_peak_mb")


NOT_RECORDED = "not recorded"  # a run's stack when it was made before runs recorded theirs: said, not guessed


class MoveError(InputError):
    """Two runs that do not make a move: the line names the runs and what is needed."""


@dataclass
class Side:
    """One side of the move, as its run folder recorded it."""

    run: str
    path: str
    backend: str
    status: RunStatus | str  # the run's (RunStatus; a string read from an older run)
    torch: str | None
    python: str | None
    stack: str  # the stack the run recorded making it on (meta.json "stack"); NOT_RECORDED for a run made before
    device: str | None
    figures: dict[str, float | None]
    steps: int = 0
    busy: str | None = None
    error: str | None = None  # what failed, or why ORTModule fell back to PyTorch
    verdict: str | None = None  # agree, diverged, not judged... (verdict.json's status)
    evidence: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)  # torch.compile's mode, fullgraph, graph breaks
    strategy: str | None = None  # a distributed run's (ddp, zero1, fsdp2); None: one process
    world_size: int = 1

    def to_dict(self) -> dict[str, Any]:
        """The side as plain data."""
        return dict(self.__dict__)

    @property
    def where(self) -> str:
        """Its stack in words: "ort stack", or "stack not recorded" (a run made before runs recorded it)."""
        return f"stack {NOT_RECORDED}" if self.stack == NOT_RECORDED else f"{self.stack} stack"


@dataclass
class MoveReport:
    """`move_report(...)`'s answer: the two sides, each option's equivalent, ratios, the verdict and what is
    missing. `to_dict()` is the JSON `ortlab move --json` prints; `str()` the text."""

    ortmodule: Side
    target: Side
    options: list[dict[str, Any]]
    ratios: dict[str, float | None]
    verdict: dict[str, Any]
    recomputed: list[str]
    missing: list[str]
    conclusion: str
    memory: dict[str, Any] = field(default_factory=dict)  # ORT's recompute against torch.compile's budget
    ranks: list[dict[str, Any]] = field(default_factory=list)  # a distributed move, rank by rank (ortlab.move.ranks)

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data (`ortlab move --json`)."""
        return {"from": self.ortmodule.to_dict(), "to": self.target.to_dict(), "options": self.options,
                "ratios": self.ratios, "verdict": self.verdict, "recomputed": self.recomputed,
                "missing": self.missing, "conclusion": self.conclusion, "memory": self.memory, "ranks": self.ranks}

    def table(self) -> list[dict[str, Any]]:
        """The measured figures, one row per figure, one column per side (None: not recorded)."""
        return [{"figure": facts.title(key, {"device": self.ortmodule.device}) if key == "peak_mem_mb"
                 else f"{label} ({unit})", "ORTModule": _scaled(self.ortmodule.figures.get(key), scale),
                 "torch.compile": _scaled(self.target.figures.get(key), scale)}
                for key, label, unit, scale in FIGURES]

    def lines(self) -> list[str]:
        """The report as text lines: the figures side by side, each option's equivalent, the verdict."""
        o, t = self.ortmodule, self.target
        out = [f"the move: ORTModule ({o.run}, torch {o.torch or '?'}, {o.where}) -> torch.compile "
               f"({t.run}, torch {t.torch or '?'}, {t.where})", ""]
        width = max(len(r["figure"]) for r in self.table())
        out.append(f"{'measured':<{width}}  {'ORTModule':>12}  {'torch.compile':>13}")
        for row in self.table():
            out.append(f"{row['figure']:<{width}}  {_cell(row['ORTModule']):>12}  {_cell(row['torch.compile']):>13}")
        if self.ranks:
            out += ["", *ranks.lines(self.ranks, _job(o), _job(t))]
        out.append("")
        out.append("what each option becomes:")
        for entry in self.options:
            value = "" if entry["value"] is None else f"={entry['value']}"
            by = "" if entry.get("set_by", "the run") == "the run" else f" (set by {entry['set_by']})"
            out.append(f"  {entry['option']}{value}{by} -> {entry['becomes']} [{entry['fit']}]")
            if entry["why"]:
                out.append(f"      {entry['why']}")
            for line in entry["snippet"].splitlines():
                out.append(f"      | {line}")
        if self.recomputed:
            out.append(f"ORTModule recomputed in backward: {', '.join(self.recomputed)} (checkpoint these modules)")
        if self.memory.get("line"):
            out.append(f"memory: {self.memory['line']}")
        if self.memory.get("command"):
            out.append(f"  measure it: {self.memory['command']}")
        out.append("")
        for side in (o, t):
            name = "ORTModule" if side is o else "torch.compile"
            shown = side.evidence if side.evidence and side.evidence.startswith(str(side.verdict)) else (
                f"{side.verdict} ({side.evidence})" if side.evidence else side.verdict or "not judged")
            out.append(f"verdict, {name}: {shown}")
        if self.verdict.get("note"):
            out.append(self.verdict["note"])
        for missing in self.missing:
            out.append(f"missing: {missing}")
        for side in (o, t):
            if side.busy:
                out.append(f"busy machine during {side.run}: {side.busy} (its timings are not representative)")
        out.append(self.conclusion)
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def move_report(ortmodule_run: str | Path | Run, target_run: str | Path | Run,
                reference_run: str | Path | Run | None = None, verdict: Any = None) -> MoveReport:
    """The move from `ortmodule_run` to `target_run` (a torch.compile run; the two in either order), as plain data.
    `reference_run`: a PyTorch parity run of the same start, to judge both now (ortlab.judge_runs) when a side has
    no verdict.json. `verdict`: verdicts already made ({backend: Verdict, its dict or its status}, or
    judge_runs' list) instead of the runs' own. MoveError (one line) when the runs do not make a move."""
    ort, target = _sides(_load(ortmodule_run), _load(target_run))
    given = _given_verdicts(verdict)
    note = None
    if reference_run is not None and not given and not all(_recorded(r) for r in (ort, target)):
        from ortlab import judge_runs

        judged = judge_runs(ort, target, reference_run)
        given = {j.other.backend: j.verdict for j in judged}
        note = f"judged now against {_load(reference_run).path.name} (ortlab.judge_runs)"
    o, t = _side(ort, given.get(ort.backend)), _side(target, given.get(target.backend))
    if note is None:
        note = ("verdicts as given" if given else "verdicts from the runs' verdict.json" if o.verdict or t.verdict
                else "not judged: neither run has a verdict; give a PyTorch parity run of the same start "
                     "(--reference RUN) to judge both")
    options = _options(ort)
    ratios = {key: (t.figures[key] / o.figures[key] if o.figures.get(key) and t.figures.get(key) is not None
                    else None) for key, *_ in FIGURES}
    missing = [f"{side.run} ({_name(side)}) {side.status}: {side.error or 'no error recorded'}; its figures are "
               + ("PyTorch's, so not shown" if side.status == RunStatus.FALLBACK else "a partial run's")
               for side in (o, t) if side.status != RunStatus.OK]
    missing += [f"{label} of {side.run} ({_name(side)}): not recorded"
                for side in (o, t) if side.status != RunStatus.FALLBACK
                for key, label, *_ in FIGURES
                if side.figures.get(key) is None and not (key == "activation_peak_mb" and side is t)]
    return MoveReport(o, t, options, ratios, {"from": o.verdict, "to": t.verdict, "note": note},
                      recomputed(ort), missing, _conclusion(o, t, ratios), memory_equivalent(ort, target, o, t),
                      ranks.mapped(ranks.rank_rows(ort), ranks.rank_rows(target)))


def print_move(comparison: Any) -> None:
    """After `ortlab compare` ran both ORTModule and torch.compile: print their move report (nothing otherwise)."""
    ort = comparison.run(comparison.headline) if comparison.headline else None  # the backend with ONNX stages
    target = next((comparison.run(b) for b in comparison.others if b != comparison.headline), None)
    if ort is not None and target is not None:
        print()
        print(move_report(ort, target))


def _load(run: str | Path | Run) -> Run:
    return run if isinstance(run, Run) else load_run(run)


def _sides(a: Run, b: Run) -> tuple[Run, Run]:
    """(the ORTModule run, the torch.compile run): the move is from the backend with ONNX stages to any other that
    is not the reference (the registry says which is which)."""
    ort = [r for r in (a, b) if has(r.backend, "onnx_stages")]
    if len(ort) == 2:
        raise MoveError(f"both runs are ORTModule's ({a.path.name}, {b.path.name}): the move compares an ORTModule "
                        "run with a torch.compile run")
    if not ort:
        raise MoveError(f"neither run is ORTModule's ({a.path.name}: {a.backend}, {b.path.name}: {b.backend}): the "
                        "move starts from an ORTModule run (burst one on the ort stack)")
    other = b if ort[0] is a else a
    if has(other.backend, "reference") or other.backend not in BACKENDS:
        hint = " (a PyTorch run goes with --reference)" if has(other.backend, "reference") else ""
        raise MoveError(f"{other.path.name} is a {other.backend} run: the move is to torch.compile; give a compile "
                        f"run{hint}")
    return ort[0], other


def _job(side: Side) -> str:
    """A side's job in words: "ORTModule ddp, 2 ranks" (one process: its backend alone)."""
    name = "ORTModule" if has(side.backend, "onnx_stages") else label(side.backend)
    return f"{name} {side.strategy}, {side.world_size} ranks" if side.strategy else f"{name}, one process"


def _name(side: Side) -> str:
    return label(side.backend)


def _recorded(run: Run) -> bool:
    return bool(run.read_json("verdict.json"))


def _given_verdicts(verdict: Any) -> dict[str, Any]:
    if verdict is None:
        return {}
    if isinstance(verdict, list):  # judge_runs' answer
        return {j.other.backend: j.verdict for j in verdict}
    if isinstance(verdict, dict):
        return dict(verdict)
    raise MoveError(f"verdict {type(verdict).__name__} is not allowed; allowed: a dict of backend to verdict, or "
                    "judge_runs' list")


def _status(verdict: Any) -> tuple[str | None, str | None]:
    if verdict is None:
        return None, None
    if isinstance(verdict, str):
        return verdict, None
    data = verdict if isinstance(verdict, dict) else verdict.to_dict()
    return data.get("status"), data.get("headline") or None


def _side(run: Run, given: Any) -> Side:
    summary = run.summary()
    versions = run.versions
    status, evidence = _status(given) if given is not None else (summary.get("verdict"),
                                                                 summary.get("verdict_evidence"))
    settings = {}
    compiled = run.read_json("compile.json") or {}
    if compiled:
        settings = {**(compiled.get("settings") or {}), "graph_breaks": summary.get("graph_breaks"),
                    "recompiles": summary.get("recompiles")}
    return Side(run=run.path.name, path=str(run.path), backend=run.backend, status=run.status,
                torch=versions.get("torch"), python=versions.get("python"),
                stack=(run.meta.get("stack") or {}).get("name") or NOT_RECORDED,
                device=run.meta.get("device"), error=run.error,
                figures={key: None if run.status == RunStatus.FALLBACK and key in _PYTORCHS else summary.get(key)
                         for key, *_ in FIGURES},
                steps=summary.get("steps", 0), busy=summary.get("busy"), verdict=status,
                evidence=evidence if isinstance(evidence, str) else None, settings=settings,
                strategy=run.meta.get("strategy") if run.meta.get("ranks") else None,
                world_size=int(run.meta.get("world_size") or 1))


def _options(run: Run) -> list[dict[str, Any]]:
    """Each option the ORTModule run used (its effective options: the user's, and ortlab's own, said as such:
    save_onnx for the memory account, the compute optimizer off in parity mode), and the settings that move with
    it: the wrap, the fallback policy (ORT's default is a policy too), the optimizer and the precision."""
    config = run.meta.get("config") or {}
    asked = dict(config.get("options") or {})
    effective = dict(run.meta.get("effective_options") or asked)
    effective.setdefault("fallback_policy", "DEFAULT")
    optimizer = config.get("optimizer") or "auto"
    if optimizer == "auto" and run.meta.get("optimizer"):  # the workload's own, or AdamW: its class as it ran
        optimizer = f"auto ({run.meta['optimizer']})"
    rows = [("wrap", None), ("optimizer", optimizer),
            ("precision", config.get("precision") or "fp32"), *sorted(effective.items())]
    out = []
    for option, value in rows:
        by = ("ortlab, for parity: exact PyTorch compute" if option == "enable_compute_optimizer"
              and option not in asked else "ortlab, for the memory account, which reads the saved graph"
              if option == "save_onnx" and option not in asked else "ORT's default"
              if option == "fallback_policy" and option not in asked else "the run")
        out.append({**equivalent(option, value).to_dict(), "option": option, "value": value, "set_by": by})
    return out


def recomputed(run: Run) -> list[str]:
    """The modules whose ops ORT recomputed in backward (its memory optimizer's plans, read off the execution
    graph's node names in the run's memory account), as dotted paths up to the repeated block (`blocks.1`)."""
    from ortlab.graphs.names import module_scope

    timeline = (run.memory or {}).get("timeline") or {}
    found: dict[str, None] = {}
    for node in timeline.get("node") or []:
        scope = module_scope(node) if "_recompute" in node else ""  # ORT's own fusions name no module
        if scope:
            parts = scope.split(".")
            block = next((i for i, p in enumerate(parts) if p.isdigit()), None)  # blocks.1.attn -> blocks.1
            found[".".join(parts[: block + 1] if block is not None else parts[:1])] = None
    return list(found)


def memory_equivalent(ort: Run, target: Run, o: Side, t: Side) -> dict[str, Any]:
    """ORTModule's recompute (memory_opt_level, memory_opt_config) against torch.compile's activation memory budget:
    both measured when the target ran with a budget, else the command that measures it; {} when neither side
    recomputed. `recompute`: ORT's setting, `budget`: the target's, `measured`, `line`, `command` (or None)."""
    effective = (ort.meta.get("effective_options") or (ort.meta.get("config") or {}).get("options") or {})
    level, plans = effective.get("memory_opt_level"), effective.get("memory_opt_config")
    recompute = ", ".join(([f"memory_opt_level={level}"] if level not in (None, 0, "0") else [])
                          + ([f"memory_opt_config={plans}"] if plans else [])) or None
    budget = t.settings.get("memory_budget")
    if recompute is None and budget is None:
        return {}
    kept_o, kept_t = (side.figures.get("saved_for_backward_mb") for side in (o, t))
    ort_words = f"ORTModule with {recompute}" if recompute else "ORTModule without recompute"
    if budget is not None:
        line = (f"the equivalent measured: torch.compile with activation_memory_budget={budget:g} kept {_mb(kept_t)} "
                f"for backward, {ort_words} kept {_mb(kept_o)}")
        return {"recompute": recompute, "budget": budget, "measured": True, "line": line, "command": None}
    if kept_o is not None and kept_t is not None and kept_t <= kept_o:
        line = (f"{ort_words} kept {_mb(kept_o)} for backward, torch.compile without an activation memory budget "
                f"{_mb(kept_t)}: no budget needed to keep as little")
        return {"recompute": recompute, "budget": None, "measured": False, "line": line, "command": None}
    suggested = _budget_for(level, kept_o, kept_t)
    line = (f"the equivalent was not measured: {ort_words} kept {_mb(kept_o)} for backward, torch.compile without an "
            f"activation memory budget {_mb(kept_t)}; run torch.compile with activation_memory_budget={suggested:g} "
            "and give that run to the move")
    return {"recompute": recompute, "budget": None, "measured": False, "line": line,
            "command": _budget_command(target, suggested), "suggested_budget": suggested}


def _mb(value: float | None) -> str:
    return "an unrecorded amount" if value is None else f"{value:.3g} MB"


def _budget_for(level: Any, kept_o: float | None, kept_t: float | None) -> float:
    """The budget to try: ORTModule's kept-for-backward over torch.compile's (the share to keep) when both were
    recorded, else the mapping's (0.5 for memory_opt_level=1, 0.2 for 2)."""
    if kept_o is not None and kept_t:
        return min(1.0, max(0.01, round(kept_o / kept_t, 2)))
    return 0.2 if str(level) == "2" else 0.5


def _budget_command(target: Run, budget: float) -> str:
    """The target run's command again (recorded, or built from its config) with --compile-memory-budget; for a
    notebook's model (no command), its Python call with the setting."""
    import shlex

    from ortlab.runs.provenance import command, python_call

    words = shlex.split(command([target]) or "")
    if not words:
        call = python_call(target) or "ortlab.burst(..., backend='compile')"
        return call[:-1] + f", compile={{'memory_budget': {budget:g}}})"
    if "--compile-memory-budget" in words:
        at = words.index("--compile-memory-budget")
        del words[at:at + 2]
    return shlex.join([*words, "--compile-memory-budget", f"{budget:g}"])


def _conclusion(o: Side, t: Side, ratios: dict[str, float | None]) -> str:
    same = o.verdict == "agree" and t.verdict == "agree"
    words = []
    step = ratios.get("median_step_s")
    if step is not None:
        words.append(f"a step takes {step:.2f}x ORTModule's time" if abs(step - 1) >= 0.005 else "a step takes "
                     "ORTModule's time")
    kept = ratios.get("saved_for_backward_mb")
    if kept is not None:
        budget = t.settings.get("memory_budget")
        words.append(f"{kept:.2f}x the memory kept for backward" + (
            f" (activation_memory_budget={budget:g})" if budget is not None else ""))
    startup = ratios.get("startup_s")
    if startup is not None:
        words.append(f"{startup:.2f}x the start-up")
    figures = ", ".join(words) if words else "no figure recorded on both sides"
    numerics = ("both train the same model as PyTorch" if same else
                "not judged on both sides" if not (o.verdict and t.verdict) else
                f"numerics differ: ORTModule {o.verdict}, torch.compile {t.verdict}")
    where = f" (measured in separate processes: torch {o.torch} and torch {t.torch})" if o.torch != t.torch else ""
    if o.strategy or t.strategy:
        where += f" ({_job(o)} -> {_job(t)})"
    return f"move: on torch.compile {figures}{where}; {numerics}"


def _scaled(value: float | None, scale: float) -> float | None:
    return None if value is None else value * scale


def _cell(value: float | None) -> str:
    return "missing" if value is None else f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


__all__ = ["FIGURES", "Fit", "MoveError", "MoveReport", "Side", "memory_equivalent", "move_report", "print_move",
           "recomputed"]
