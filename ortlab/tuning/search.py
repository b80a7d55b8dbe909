"""`ortlab.tune`: the search. The defaults first, repeated to measure their noise; the pruned space; each candidate
measured with the burst engine from the session's one snapshot and guarded by the verdict; the winners combined;
tune.json rewritten after every candidate, so that a Stop (or an error) keeps what was measured. Ctrl-C is a Stop
wherever it lands (a burst, a verdict, the search's own work): the search ends there, and the result says where
(`Tuning.stopped_during`), what was measured and what was not.

The guard: every setting also runs a short burst in parity mode (dropout off, the same seeds) judged against one
PyTorch parity burst with `Session.judge`; a candidate whose verdict is `diverged` is rejected with its cause.
Parity mode turns ORT's compute optimizer off, so what that optimizer changes is not judged (said in the notes).
"""

from __future__ import annotations

import datetime as _dt
import re
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ortlab.options import Options
from ortlab.runs.run import RunStatus
from ortlab.tuning import measure, space
from ortlab.tuning.errors import TuneError
from ortlab.tuning.goals import BETTER, parse_goals
from ortlab.tuning.result import BASELINE, FILE, Tuning
from ortlab.tuning.strategy import choose
from ortlab.verdict.judge import VerdictStatus

STOPPED = (RunStatus.STOPPED, RunStatus.INTERRUPTED)  # a user's Stop (ortlab.runs.run.ENDED_EARLY)
_clock = time.monotonic  # the budget's clock (a test replaces it)
ONE_THREAD = ("timed on one thread by its CPU time: other processes on the machine do not count (threads=1, Tune's "
              "default on the CPU; set threads to choose)")


class Tuner:
    """One tuning of one model: `run()` returns the Tuning, `stop()` (another thread, a widget's button) ends it
    after the burst in progress and keeps what was measured. `on_progress(event)` gets a dict with "phase" and "text"
    (and "candidate" where one is concerned) for every step of the search."""

    def __init__(self, session_or_model: Any = None, goal: Any = "time", budget: float = 10.0, *, steps: int = 8,
                 warmup: int = 3, repeats: int = 3, guard_steps: int = 3, only: Any = None,
                 options: Mapping[str, Any] | Options | None = None, top_plans: int = space.PLANS_TRIED,
                 model_kwargs: Mapping[str, Any] | None = None, out: str | Path = "runs", in_process: bool = False,
                 on_progress: Callable[[dict], None] | None = None, **burst_kwargs: Any):
        from ortlab.engine.session import Session

        self.goals = parse_goals(goal)
        _check_numbers(budget, steps, warmup, repeats, guard_steps)
        self.warnings = measure.steps_check(self.goals, steps, warmup, repeats)  # too few steps: said up front
        self.budget_s = float(budget) * 60
        self.steps, self.warmup, self.repeats, self.guard_steps = steps, warmup, repeats, guard_steps
        self.only, self.top_plans = only, top_plans
        space.singles(False, None, only)  # a bad option name fails here, before anything runs
        self.base = Options(options or {})
        self.on_progress = on_progress
        # on the CPU, one thread unless the user chose: each step timed by its thread's CPU time, so that the noise
        # candidates are ranked against is the model's, not other processes' (ortlab.runs.clock)
        self.one_thread = "threads" not in burst_kwargs and _on_cpu(burst_kwargs.get("device", "auto"))
        self.burst_kwargs = {**burst_kwargs, "threads": 1} if self.one_thread else burst_kwargs
        self._own = not isinstance(session_or_model, Session)
        self.session = (Session(session_or_model, dict(model_kwargs or {}), out=out, in_process=in_process)
                        if self._own else session_or_model)
        self._stopped = threading.Event()
        self.result: Tuning | None = None
        self._doing = "the start"  # what the search is doing: where a Stop lands

    def stop(self) -> None:
        """End the search after the burst in progress (which ends after its current step); the result keeps
        every candidate measured so far."""
        self._stopped.set()
        self.session.stop()

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def run(self) -> Tuning:
        """Measure the baseline, prune, search, combine; the Tuning (also in `<out>/<stamp>-tune/tune.json`, its
        bursts in `<out>/<stamp>-tune/ortlab-runs/`: measurements, not the user's runs)."""
        folder = Path(self.session.out).expanduser().resolve() / f"{_dt.datetime.now():%Y%m%d-%H%M%S}-tune"
        folder.mkdir(parents=True, exist_ok=True)
        self.result = result = Tuning(goals=self.goals, path=folder, budget_min=self.budget_s / 60,
                                      base_options=self.base)
        self._started = _clock()
        if self.one_thread:
            result.notes.append(ONE_THREAD)
            self._say("clock", ONE_THREAD)
        for text in self.warnings:
            self._warn(result, text)
        try:
            with self.session.asking(folder, "tune"):  # its bursts: in <folder>/ortlab-runs, not the user's runs
                self._search(result)
        except KeyboardInterrupt:  # Ctrl-C outside a burst (a verdict, the search's own work): a Stop there
            self._stopped.set()
        except TuneError as e:
            if result.runs:  # nothing measured is lost: say where it is
                result.save()
                raise TuneError(f"{e} (what was measured is kept in {folder / FILE})") from None
            raise
        finally:
            result.elapsed_s = _clock() - self._started
            result.stopped = result.stopped or self.stopped
            if result.stopped and not result.stopped_during:
                result.stopped_during = self._doing
            result.finish()
            result.save()
            self._say("done", result.headline())
            if self._own:
                self.session.close()
        return result

    # -- the steps

    def _search(self, result: Tuning) -> None:
        cost = self._baseline(result)
        if cost is None:
            return
        first = result.runs[f"{BASELINE} 1"]
        cuda = str(first.meta.get("device", "")).startswith("cuda")
        plans = _plans(first)
        singles, pruned = space.singles(cuda, plans, self.only, self.top_plans)
        if self.session.in_process:
            keep = [c for c in singles if not c.restart]
            pruned += [space.Pruned(c.name, "read at import: it needs a fresh worker, which an in-process session "
                                            "cannot start") for c in singles if c.restart]
            singles = keep
        result.pruned += pruned
        for p in pruned:
            self._say("pruned", f"pruned {p.name}: {p.reason}", candidate=p.name)
        strategy = choose(singles, self.goals, cost, self.budget_s, self._elapsed())
        result.strategy = strategy
        result.pruned += strategy.left_out
        self._say("strategy", f"strategy: {strategy.name} ({strategy.reason})")
        for i, candidate in enumerate(strategy.order, 1):
            if not self._go_on(result, candidate, cost, f"{i}/{len(strategy.order)}"):
                return
            self._candidate(result, candidate, f"{i}/{len(strategy.order)}")
        self._combine(result, cost)

    def _baseline(self, result: Tuning) -> float | None:
        """The defaults, `repeats` times (the first also reads the recompute plans), and their guard; the cost of
        one candidate (seconds), None when stopped."""
        rows = []
        started = _clock()
        for k in range(1, self.repeats + 1):
            self._say("baseline", f"baseline {k}/{self.repeats}: the defaults", candidate=BASELINE)
            self._doing = f"the baseline (burst {k} of {self.repeats})"
            collect = {**measure.COLLECT, "plans": {}} if k == 1 else measure.COLLECT
            run = self._burst("ortmodule", self.steps, self.base, f"tune-baseline-{k}", collect)
            result.runs[f"{BASELINE} {k}"] = run
            if run.status in STOPPED:
                return self._stop(result)
            if run.status != RunStatus.OK:
                raise TuneError(f"model {self.session.ref.describe()} does not run on ORTModule with these options "
                                f"(the baseline burst ended {run.status}: {_first_line(run.error)}); see `ortlab check"
                                f"{_model_flag(self.session)}`, which names every blocker and its fix")
            rows.append(measure.figures(run, self.warmup))
            self._baseline_rows = rows
            if k == 1:
                first_s = _clock() - started
            result.save_baseline(rows)
        if self.stopped:
            return self._stop(result)
        for text in measure.noise_check(self.goals, rows, result.noise):
            self._warn(result, text)
        self._say("guard", "guard: a PyTorch burst in parity mode, the reference of every verdict")
        self._doing = "the guard (its PyTorch reference burst)"
        self.reference = self._burst("pytorch", self.guard_steps, self.base, "tune-reference", {}, parity=True)
        result.runs["pytorch reference"] = self.reference
        if self.reference.status in STOPPED or self.stopped:
            return self._stop(result)
        self._say("verdict", "verdict: the baseline in parity mode, judged against the reference")
        self._doing = "the baseline's verdict"
        guard_started = _clock()
        guard = self._guard(self.base, "tune-guard-baseline")
        guard_s = _clock() - guard_started
        result.baseline_verdict = guard
        result.save()
        if guard["status"] in STOPPED:
            return self._stop(result)
        if guard["verdict"] == "diverged":
            raise TuneError(f"with these options ORTModule trains another model than PyTorch ({guard['cause']}); "
                            f"tuning cannot fix that: see `ortlab check{_model_flag(self.session)}` and --fix auto")
        self._cost = first_s + guard_s
        return self._cost

    def _guard(self, options: Options, name: str) -> dict[str, Any]:
        """A parity burst with these options judged against the PyTorch reference: verdict, cause, the run. A Stop
        during it: "not judged", status "stopped"."""
        run = self._burst("ortmodule", self.guard_steps, options, name, {}, parity=True)
        if run.status in STOPPED or self.stopped:
            return {"verdict": VerdictStatus.NOT_JUDGED, "cause": "stopped during its guard's parity burst",
                    "run": str(run.path), "status": RunStatus.STOPPED}
        if run.status != RunStatus.OK:
            return {"verdict": VerdictStatus.NOT_JUDGED,
                    "cause": f"the guard burst ended {run.status}: {_first_line(run.error)}",
                    "run": str(run.path), "status": run.status}
        try:
            verdict = self.session.judge(self.reference, run)
        except KeyboardInterrupt:  # Ctrl-C: the verdict was not reached
            self._stopped.set()
        if self.stopped:  # a Stop during the verdict: its evidence may be cut short, so it is no verdict
            return {"verdict": VerdictStatus.NOT_JUDGED, "cause": "stopped during its verdict", "run": str(run.path),
                    "status": RunStatus.STOPPED}
        cause = None
        if verdict.diverged:  # what diverged (the headline), then the first cause the verdict names
            cause = "; ".join([verdict.headline.removeprefix("DIVERGED: "), *(c["text"] for c in verdict.causes[:1])])
        return {"verdict": verdict.status, "headline": verdict.headline, "cause": cause, "run": str(run.path),
                "status": run.status}

    def _candidate(self, result: Tuning, candidate: space.Candidate, where: str) -> dict[str, Any]:
        """Measure one candidate, guard it, decide; its row (also written to tune.json)."""
        i = len(result.rows) + 1
        plan_file = None
        if candidate.plans:
            from ortlab.recompute import write_config

            plan_file = write_config(list(candidate.plans), result.path / f"plans-{i}.json")
        options = space.options_of(candidate, self.base, plan_file)
        restart = " (a fresh worker: read at import)" if candidate.restart else ""
        self._say("candidate", f"candidate {where}: {candidate.name}{restart}", candidate=candidate.name)
        what = (f"the combination {candidate.name}" if where == "combination"
                else f"candidate {where} ({candidate.name})")
        self._doing = f"the burst of {what}"
        run = self._burst("ortmodule", self.steps, options, f"tune-{i}", measure.COLLECT)
        result.runs[candidate.name] = run
        row = {"candidate": candidate.name, "options": {k: v for k, (v, _) in options.diff(self.base).items()},
               "knobs": list(candidate.knobs),
               "restart": candidate.restart, "status": run.status, "run": str(run.path),
               **measure.figures(run, self.warmup)}
        if run.status in STOPPED:
            result.stopped = True
            row.update(outcome="stopped", reasons=["stopped before it finished"])
        elif run.status != RunStatus.OK:
            error = _whole_error(run)
            where = f" (the whole message: {run.path / 'log.txt'}, tune.json)" if error != run.error else ""
            row.update(outcome="failed", reasons=[f"the burst ended {run.status}: {_first_line(run.error)}{where}"],
                       error=error)
        elif self.stopped:
            result.stopped = True
            row.update(outcome="stopped", reasons=["stopped before its guard: not judged"])
        else:
            self._doing = f"the verdict of {what}"
            guard = self._guard(options, f"tune-guard-{i}")
            row.update(verdict=guard["verdict"], cause=guard["cause"], guard_run=guard["run"])
            if guard["status"] in STOPPED:
                result.stopped = True
                row.update(outcome="stopped", reasons=[f"{guard['cause']}: not judged"])
            elif guard["verdict"] == "diverged":
                row.update(outcome="rejected", reasons=[f"verdict diverged: {guard['cause']}"])
            elif guard["verdict"] != VerdictStatus.AGREE:
                row.update(outcome="not judged", reasons=[guard["cause"] or guard.get("headline", "")])
            else:
                result.decide(row)
                if row["outcome"] == BETTER and set(self.goals.objectives) - {"memory"}:
                    self._doing = f"the confirmation of {what}"
                    self._confirm(result, row, options, i)
        result.add(row, candidate)
        self._say("measured", f"  {candidate.name}: {row['outcome']}: {'; '.join(row['reasons'])}",
                  candidate=candidate.name)
        return row

    def _confirm(self, result: Tuning, row: dict[str, Any], options: Options, i: int) -> None:
        """A time (or resident set) gain is measured again back to back: the baseline once more (its noise grows
        with its repeats), then the candidate, whose figures become the median of its two bursts. The memory
        account is exact and needs no second look."""
        if self._elapsed() + self._cost > self.budget_s:
            row["reasons"].append("not confirmed: the budget ran out")
            return
        self._say("confirm", f"  confirming {row['candidate']}: the baseline again, then the candidate, back to back",
                  candidate=row["candidate"])
        again = self._burst("ortmodule", self.steps, self.base, f"tune-baseline-again-{i}", measure.COLLECT)
        if again.status != RunStatus.OK or self.stopped:
            return self._unconfirmed(result, row, again)
        self._baseline_rows.append(measure.figures(again, self.warmup))
        result.save_baseline(self._baseline_rows)
        second = self._burst("ortmodule", self.steps, options, f"tune-{i}-again", measure.COLLECT)
        if second.status != RunStatus.OK or self.stopped:
            return self._unconfirmed(result, row, second)
        both = [dict(row), measure.figures(second, self.warmup)]
        merged, _ = measure.baseline(both)
        row.update({k: merged[k] for k in ("median_step_ms", "rss_mb")}, confirmed=True, run_again=str(second.path))
        result.decide(row)
        row["reasons"].append("confirmed back to back with the baseline (the median of two bursts)")

    def _combine(self, result: Tuning, cost: float) -> None:
        """Greedy: the best winner, with each next winner added when the combination is better still."""
        winners = result.winners()
        if len(winners) < 2:
            return
        current, best = [winners[0][0]], winners[0][1]["score"]
        for candidate, _row in winners[1:]:
            trial = space.combined([*current, candidate])
            if isinstance(trial, space.Pruned):
                result.pruned.append(trial)
                self._say("pruned", f"pruned {trial.name}: {trial.reason}", candidate=trial.name)
                continue
            if not self._go_on(result, trial, cost, "combination"):
                return
            row = self._candidate(result, trial, "combination")
            if row.get("outcome") == BETTER and row["score"] > best:
                current, best = [*current, candidate], row["score"]

    def _unconfirmed(self, result: Tuning, row: dict[str, Any], run: Any) -> None:
        if run.status in STOPPED or self.stopped:
            result.stopped = True
            row["reasons"].append("not confirmed: stopped during its confirmation")
        else:
            row["reasons"].append(f"not confirmed: the confirming burst ended {run.status}")

    # -- helpers

    def _stop(self, result: Tuning) -> None:
        """The search ends here: where it was, kept with what was measured."""
        result.stopped = True
        result.stopped_during = result.stopped_during or self._doing
        return None

    def _go_on(self, result: Tuning, candidate: space.Candidate, cost: float, where: str) -> bool:
        if self.stopped or result.stopped:
            result.stopped = True
            return False
        if self._elapsed() + cost > self.budget_s:
            result.pruned.append(space.Pruned(candidate.name, f"not run: the budget ({self.budget_s / 60:g} min) "
                                                              f"ran out ({self._elapsed() / 60:.1f} min spent)"))
            self._say("budget", f"budget spent: {candidate.name} ({where}) and later ones not run")
            result.budget_spent = True
            return False
        return True

    def _burst(self, backend: str, steps: int, options: Options, name: str, collect: dict, parity: bool = False):
        run = self.session.burst(backend, steps, options, name=name, collect=collect, parity=parity,
                                 progress=False, **self.burst_kwargs)
        if self.session.stop_asked:  # a Ctrl-C as the burst ended: no step left to stop, the tuning stops all the same
            self._stopped.set()
        return run

    def _elapsed(self) -> float:
        return _clock() - self._started

    def _warn(self, result: Tuning, text: str) -> None:
        """A warning: in the progress (phase "warning"), the log and the result's notes."""
        result.notes.append(text)
        self._say("warning", f"warning: {text}")

    def _say(self, phase: str, text: str, **extra: Any) -> None:
        if self.result is not None:
            self.result.log.append(text)
        if self.on_progress:
            self.on_progress({"phase": phase, "text": text, **extra})


def tune(model: Any = None, goal: Any = "time", budget: float = 10.0, **kwargs: Any) -> Tuning:
    """Which ORTModule options make `model` (a factory or a Session; default: the demo) fastest or smallest: the
    defaults measured first and repeated for their noise, one knob at a time, then the winners combined within
    `budget` minutes; every candidate guarded by the verdict. `goal`: "time", "memory", "both" and Olive-style
    conditions ("time: percent-min-improvement 5"). Keywords: steps, warmup, repeats, guard_steps, only (the
    options to search, or "plans"), options (kept for every burst), top_plans, model_kwargs, out, in_process,
    on_progress, and burst keywords (fixes, lr, threads: on the CPU 1 unless given, each step timed by its CPU time,
    ...). Returns a Tuning (table, pareto(), best, export lines)."""
    return Tuner(model, goal, budget, **kwargs).run()


def _on_cpu(device: Any) -> bool:
    """Whether bursts on `device` ("auto", "cpu", "cuda") run on the CPU here."""
    from ortlab.engine.config import resolve_device

    try:
        return resolve_device(str(device)).type == "cpu"
    except Exception:  # a device that is not here: the first burst says why
        return False


def _plans(run):
    from ortlab.recompute import plans

    try:
        return plans(run)
    except Exception:  # no plans: the recompute candidates are pruned with this reason
        return None


def _first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0] if lines else "no reason given"


_EXCEPTION = re.compile(r"(?P<type>\w+(?:Error|Exception|Warning)): (?P<message>.+)$")
_TRACEBACK_END = ("Traceback", "The above exception", "During handling", "[ortlab]")


def _whole_error(run) -> str | None:
    """A failed burst's error with the whole of its exception's message: the run records one line of it (cut at a
    clause), its log.txt the traceback, whose last lines are the message in full (torch's list of signatures)."""
    found = _EXCEPTION.search(run.error or "")
    if found is None:
        return run.error
    start = f"{found['type']}: {found['message']}"
    lines = run.log.splitlines()
    first = max((i for i, line in enumerate(lines) if line.startswith(start)), default=None)
    if first is None:
        return run.error
    end = next((i for i in range(first + 1, len(lines)) if not lines[i].strip() or lines[i].startswith(_TRACEBACK_END)),
               len(lines))
    whole = "\n".join(lines[first:end])
    return run.error if whole == start else run.error[:found.start()] + whole


def _model_flag(session) -> str:
    import json

    ref = session.ref
    if ref.kind not in ("import", "file"):
        return ""
    return f" --model {ref.label}" + "".join(f" --model-arg {k}={json.dumps(v)}" for k, v in ref.kwargs)


def _check_numbers(budget: Any, steps: Any, warmup: Any, repeats: Any, guard_steps: Any) -> None:
    if isinstance(budget, bool) or not isinstance(budget, int | float) or not budget > 0 or budget != budget:
        raise TuneError(f"budget {budget!r} is not allowed; allowed: minutes > 0")
    for name, value, low in (("warmup", warmup, 1), ("repeats", repeats, 1), ("guard_steps", guard_steps, 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise TuneError(f"{name} {value!r} is not allowed; allowed: a whole number >= {low}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < warmup + 2:
        raise TuneError(f"steps {steps!r} is not allowed; allowed: a whole number >= warmup + 2 ({warmup + 2}): "
                        "the median is taken over the steps after the warm-up")
