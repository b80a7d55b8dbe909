"""ortlab.tune: the goals' decisions, the pruning, the strategy and the search loop on a scripted session (where
timing would matter: no timer decides a test); real ORTModule bursts for the memory goal, the rejection of a
candidate that changes the model, and a model that does not run."""

import json
import os
import signal
import time

import pandas as pd
import pytest

from ortlab import Session
from ortlab.comparison.speed import relative_noise, spread
from ortlab.runs.run import RunWriter, load_run, new_run_dir
from ortlab.tuning import TuneError, search
from ortlab.tuning.goals import BETTER, MISSES, SAME, WORSE, decide, parse_goals
from ortlab.tuning.space import Candidate, combined, singles
from ortlab.tuning.strategy import EVERY, FIRST, choose
from ortlab.verdict.judge import Verdict

PLANS = pd.DataFrame({"plan": [1, 2], "cluster_id": ["BiasGelu+:1:-1", "FusedMatMul+:1:-1"], "type": [1, 1]})


# -- goals


def test_goals_in_olives_vocabulary_and_bad_ones_in_one_line():
    g = parse_goals(["time", "memory: percent-max-degradation 10"])
    assert g.objectives == ("time",) and str(g.rules[0]) == "memory: percent-max-degradation 10"
    assert parse_goals("both").objectives == ("time", "memory")
    assert parse_goals("rss: percent-min-improvement 5").objectives == ("rss",)
    for bad in ("speed", "time: percent-min-improvment 5", "time: threshold x", "gpu: threshold 1"):
        with pytest.raises(TuneError, match="is not allowed; allowed: time, memory, both") as e:
            parse_goals(bad)
        assert "\n" not in str(e.value)
    with pytest.raises(TuneError, match="name nothing to improve"):
        parse_goals("memory: percent-max-degradation 10")


def test_a_difference_within_the_baselines_noise_is_no_change():
    g = parse_goals("time")
    base, noise = {"time": 100.0, "memory": 10.0}, {"time": 0.05, "memory": 0.0}
    assert decide(g, base, {"time": 96.0, "memory": 10.0}, noise)[0] == SAME  # -4%, noise 5%
    assert decide(g, base, {"time": 104.0, "memory": 10.0}, noise)[0] == SAME
    assert decide(g, base, {"time": 90.0, "memory": 12.0}, noise)[0] == BETTER
    assert decide(g, base, {"time": 110.0, "memory": 10.0}, noise)[0] == WORSE
    # Olive's conditions, relative to the baseline, the noise respected
    strict = parse_goals(["time: percent-min-improvement 5", "memory: percent-max-degradation 10"])
    assert decide(strict, base, {"time": 94.0, "memory": 10.5}, noise)[0] == BETTER
    outcome, why = decide(strict, base, {"time": 94.0, "memory": 12.0}, noise)
    assert outcome == MISSES and "memory: percent-max-degradation 10: not met" in why[0]
    assert decide(strict, base, {"time": 96.0, "memory": 10.0}, noise)[0] == MISSES  # within the noise
    assert decide(parse_goals("time: threshold 95"), base, {"time": 94.0}, noise)[0] == BETTER
    assert decide(parse_goals("memory: min-improvement 1"), base, {"memory": 9.5}, noise)[0] == MISSES


# -- the space and its pruning


def test_pruned_before_running_with_the_reason():
    kept, pruned = singles(cuda=False, plans=PLANS)
    names = {c.name for c in kept}
    reasons = {p.name: p.reason for p in pruned}
    assert {"memory_opt_level=1", "enable_compute_optimizer=False", "plan 1: BiasGelu+"} <= names
    assert reasons["use_triton=True"] == "needs CUDA; this machine has no CUDA GPU"
    assert "never reads it" in reasons["enable_sparse_optimizer=False"]
    assert "has none, so it equals level 1" in reasons["memory_opt_level=2"]  # no type-2 plan in this model
    assert next(c for c in kept if c.name == "plan 1: BiasGelu+").plans == ("BiasGelu+:1:-1",)
    assert next(c for c in kept if c.name == "enable_custom_autograd=False").restart  # read at import
    on_cuda = {c.name for c in singles(cuda=True, plans=PLANS)[0]}
    assert "use_triton=True" in on_cuda
    none = pd.DataFrame({"plan": [], "cluster_id": [], "type": []})
    kept, pruned = singles(cuda=False, plans=none, only=["memory_opt_level", "plans"])
    assert kept == [] and all("no recompute plan exists for this model" in p.reason for p in pruned)
    with pytest.raises(TuneError, match="'log_level' is not searched by tune; allowed: enable_compute_optimizer"):
        singles(False, PLANS, only=["log_level"])


def test_combinations_that_cannot_work_are_pruned():
    level = Candidate("memory_opt_level=1", {"memory_opt_level": 1}, knobs=("memory_opt_level=1",))
    plan = Candidate("plan 1", {}, ("BiasGelu+:1:-1",), knobs=("plan 1",))
    off = Candidate("co off", {"enable_compute_optimizer": False}, knobs=("co off",))
    label = Candidate("label off", {"enable_label_sparse_optimizer": False}, knobs=("label off",))
    grads = Candidate("grads", {"enable_mem_efficient_grad_mgmt": True}, knobs=("grads",))
    autograd = Candidate("autograd off", {"enable_custom_autograd": False}, knobs=("autograd off",))
    assert "one of them" in combined([level, plan]).reason
    assert "acts only with enable_compute_optimizer=True" in combined([off, label]).reason  # it adds nothing
    assert "acts only with enable_custom_autograd=True" in combined([grads, autograd]).reason
    both = combined([off, level])
    assert both.options == {"enable_compute_optimizer": False, "memory_opt_level": 1}
    assert both.knobs == ("co off", "memory_opt_level=1")


# -- the strategy


def test_strategy_fits_the_budget_and_says_why():
    kept, _ = singles(cuda=False, plans=PLANS)
    memory, time = parse_goals("memory"), parse_goals("time")
    every = choose(kept, memory, cost_s=10, budget_s=60 * 60)
    assert every.name == EVERY and every.order == kept and "holds all" in every.reason
    few = choose(kept, memory, cost_s=60, budget_s=4 * 60 + 30, spent_s=30)
    assert few.name == FIRST and len(few.order) == 3 and "3 most likely to improve memory" in few.reason
    assert few.order[0].name == "memory_opt_level=1" and few.order[1].name.startswith("plan ")
    assert {p.name for p in few.left_out} == {c.name for c in kept} - {c.name for c in few.order}
    assert choose(kept, time, cost_s=60, budget_s=150).order[0].name == "enable_compute_optimizer=False"
    assert not any(c.restart for c in choose(kept, time, cost_s=60, budget_s=300).order)  # a fresh worker last
    with pytest.raises(TuneError, match=r"budget 1 min is too small for one candidate.*at least 2\.5 min"):
        choose(kept, memory, cost_s=90, budget_s=60, spent_s=60)


def test_the_budget_lines_count_the_same_candidates():
    """The strategy's reason and each left-out candidate's reason say one count: how many candidates run."""
    import re

    kept, _ = singles(cuda=False, plans=PLANS)
    time = parse_goals("time")
    for budget_s in (70, 130, 150, 190):
        chosen = choose(kept, time, cost_s=20, budget_s=budget_s, spent_s=30)
        counts = {re.search(r"holds (\d+) of (?:the )?(\d+)", line).groups()
                  for line in [chosen.reason, *(p.reason for p in chosen.left_out)]}
        assert counts == {(str(len(chosen.order)), str(len(kept)))}, (chosen.reason, chosen.left_out[0].reason)


def test_a_failed_candidate_says_a_whole_sentence_and_keeps_the_whole_message(tmp_path, clock):
    """torch's "zeros() received an invalid combination of arguments - got (...), but expected one of:" and the
    signatures after it: the one-line reason ends at a clause, not at "expected one of"; tune.json keeps it all.
    (torch 2.6's message, as written; torch 2.14 says it in one line.)"""
    from ortlab.compat.errors import root_message

    error = TypeError(
        "zeros() received an invalid combination of arguments - got (list, dtype=torch.dtype, device=dict, ), but "
        "expected one of:\n * (tuple of ints size, *, tuple of names names, torch.dtype dtype = None, torch.layout "
        "layout = None, torch.device device = None, bool pin_memory = False, bool requires_grad = False)\n * (tuple "
        "of ints size, *, Tensor out = None, torch.dtype dtype = None, torch.layout layout = None, torch.device device"
        " = None, bool pin_memory = False, bool requires_grad = False)\n")
    line = root_message(error)
    assert line.startswith("TypeError: zeros() received an invalid combination of arguments")
    assert not line.rstrip(":").endswith("expected one of") and "\n" not in line, line
    whole = f"{type(error).__name__}: {error}"

    class Failing(Scripted):
        def burst(self, backend="ortmodule", steps=20, options=None, **kwargs):
            run = super().burst(backend, steps, options, **kwargs)
            if (options or {}).get("enable_mem_efficient_grad_mgmt"):  # as the engine writes a failed burst
                meta = json.loads((run.path / "meta.json").read_text())
                meta.update(status="failed", error=f"ortmodule burst failed in ORT's post-export processing at "
                                                   f"step 0: {line}")
                (run.path / "meta.json").write_text(json.dumps(meta))
                (run.path / "log.txt").write_text(f"[ortlab] {meta['error']}\nTraceback (most recent call last):\n"
                                                  f'  File "x.py", line 1, in <module>\n{whole}\n')
                run = load_run(run.path)
            return run

    t = search.tune(clock(Failing(tmp_path)), "time", budget=60, only=["enable_mem_efficient_grad_mgmt"])
    row = t.rows[-1]
    error = json.loads((tmp_path / row["run"] / "meta.json").read_text())["error"]
    assert row["outcome"] == "failed" and row["reasons"] == [f"the burst ended failed: {error} (the whole message: "
                                                             f"{row['run']}/log.txt, tune.json)"]
    saved = json.loads((t.path / "tune.json").read_text())["rows"][-1]
    assert saved["error"] == error.removesuffix(line) + whole.strip() and " * (" in saved["error"]


# -- the search on a scripted session


class Scripted(Session):
    """A session whose bursts write run folders with scripted figures: step time and accounted activation peak
    per option, a verdict per option. The clock advances by `cost` per burst."""

    def __init__(self, out, times=None, memory=None, diverge=(), noise=(100.0, 103.0, 101.0), cost=10.0,
                 stop_after=None):
        super().__init__(out=out, in_process=True)
        self.times, self.memory, self.diverge = times or {}, memory or {}, set(diverge)
        self.noise, self.cost, self.now, self.stop_after = list(noise), cost, 0.0, stop_after
        self.bursts: list[tuple[str, dict, bool]] = []
        self.ended = None  # the next burst's status, when not its own

    def burst(self, backend="ortmodule", steps=20, options=None, *, name=None, collect=None, parity=False,
              progress=True, **_):
        from ortlab.options import Options

        self.now += self.cost
        options = Options(options or {})
        self.bursts.append((backend, options.to_dict(), parity))
        key = ",".join(f"{k}={v}" for k, v in options.to_dict().items() if k != "memory_opt_config") or "default"
        if "memory_opt_config" in options:
            key = "plans"
        stopped = self.stop_after is not None and len(self.bursts) > self.stop_after
        ms = self.times.get(key, self.noise.pop(0) if key == "default" and self.noise else 100.0)
        path = new_run_dir(self.out, backend, name)
        w = RunWriter(path, {"backend": backend, "device": "cpu", "config": {"parity": parity},
                             "effective_options": options.to_dict()})
        for step in range(steps):
            w.step({"step": step, "loss": 1.0, "step_time_s": ms / 1000, "peak_mem_mb": 500.0})
        w.finish(self.ended or ("stopped" if stopped else "ok"))
        (path / "memory.json").write_text(json.dumps({"peak_activation_bytes": self.memory.get(key, 8.0) * 2**20}))
        if collect and "plans" in collect:
            (path / "plans.json").write_text(json.dumps({"plans": PLANS.to_dict(orient="records"), "dims": {}}))
        run = load_run(path)
        self.runs.append(run)
        return run

    def judge(self, pytorch, run, **_):
        key = ",".join(f"{k}={v}" for k, v in run.meta["effective_options"].items())
        if key in self.diverge:
            return Verdict("diverged", "DIVERGED: losses differ", causes=[{"text": f"{key} changes the model"}])
        return Verdict("agree", "agree")


@pytest.fixture
def clock(monkeypatch):
    def install(session):
        monkeypatch.setattr(search, "_clock", lambda: session.now)
        return session

    return install


def test_time_goal_one_knob_at_a_time_then_the_winners_combined(tmp_path, clock):
    s = clock(Scripted(tmp_path, times={"enable_compute_optimizer=False": 80.0,
                                        "enable_mem_efficient_grad_mgmt=True": 90.0,
                                        "enable_compute_optimizer=False,enable_mem_efficient_grad_mgmt=True": 70.0,
                                        "deepcopy_before_model_export=False": 98.0}))
    events = []
    t = search.tune(s, "time", budget=60, only=["enable_compute_optimizer", "enable_mem_efficient_grad_mgmt",
                                                "deepcopy_before_model_export"], on_progress=events.append)
    table = t.table.set_index("candidate")
    # the baseline is the defaults, three times, and once more before each gain is confirmed back to back: its
    # noise is ortlab.comparison.speed's (the one `ortlab compare` uses): here the spread of its repeats' medians
    # (every step of a scripted burst takes the same time, on a machine without load), 5 steps timed per burst
    assert table.loc["baseline", "repeats"] == 3 + 3 and table.loc["baseline", "median_step_ms"] == 100.0
    repeats = spread([[ms] * 5 for ms in (100.0, 103.0, 101.0, 100.0, 100.0, 100.0)], warmup=0)
    assert t.noise["time"] == pytest.approx(relative_noise(repeats)) and 0.05 < t.noise["time"] < 0.07
    assert "noise over 6 repeats" in table.loc["baseline", "reasons"]
    assert "confirmed back to back" in table.loc["enable_compute_optimizer=False", "reasons"]
    deepcopy = table.loc["deepcopy_before_model_export=False"]
    assert deepcopy["outcome"] == SAME and "within the baseline's noise" in deepcopy["reasons"]  # -2%
    assert deepcopy["time_change_pct"] == pytest.approx(-2.0) and deepcopy["inside_noise"] == "time"  # as measured
    combo = "enable_compute_optimizer=False + enable_mem_efficient_grad_mgmt=True"
    assert table.loc[combo, "outcome"] == BETTER and t.best_name == combo
    assert t.best.to_dict() == {"enable_compute_optimizer": False, "enable_mem_efficient_grad_mgmt": True}
    assert "export ORTMODULE_ENABLE_COMPUTE_OPTIMIZER=0" in t.export_lines()
    assert "ortlab.wrap(model, options=ortlab.Options(enable_compute_optimizer=False" in t.wrap_call()
    assert t.strategy.name == EVERY and "holds all 3" in t.strategy.reason
    # the guard: one PyTorch parity reference, a parity burst per setting
    assert [b for b in s.bursts if b[0] == "pytorch"] == [("pytorch", {}, True)]
    assert sum(1 for b in s.bursts if b[2]) == 1 + 1 + 4
    saved = json.loads((t.path / "tune.json").read_text())
    assert saved["best"] == combo and saved["strategy"]["name"] == EVERY and len(saved["rows"]) == 5
    assert any(e["phase"] == "strategy" for e in events) and "best for time" in events[-1]["text"]
    assert len(t.pareto().axes) == 1


def test_none_beats_the_baseline_beyond_its_noise(tmp_path, clock):
    s = clock(Scripted(tmp_path, times={"enable_compute_optimizer=False": 99.0}))
    t = search.tune(s, "time", budget=60, only=["enable_compute_optimizer"])
    assert not t.improved and t.best == t.base_options and t.export_lines() == ""
    assert t.headline().startswith("no setting beats the baseline on time beyond its noise")


def test_a_diverging_candidate_is_rejected_with_its_cause(tmp_path, clock):
    s = clock(Scripted(tmp_path, memory={"memory_opt_level=1": 4.0, "plans": 6.0},
                       diverge={"memory_opt_level=1"}))
    t = search.tune(s, "memory", budget=60, only=["memory_opt_level", "plans"])
    row = t.table.set_index("candidate").loc["memory_opt_level=1"]
    assert row["outcome"] == "rejected" and row["cause"] == "losses differ; memory_opt_level=1 changes the model"
    assert t.best_name == "plan 1: BiasGelu+" and "memory_opt_config" in t.best
    assert "rejected memory_opt_level=1: losses differ; memory_opt_level=1 changes the model" in str(t)


def test_the_budget_decides_what_runs_and_a_stop_keeps_what_was_measured(tmp_path, clock):
    four = ["enable_compute_optimizer", "enable_embedding_sparse_optimizer", "enable_label_sparse_optimizer",
            "deepcopy_before_model_export"]
    # 3 baseline bursts + reference + guard = 150 s; a candidate (burst + guard) 60 s: 3 of 4 fit, 1 kept to combine
    t = search.tune(clock(Scripted(tmp_path, cost=30.0)), "time", budget=5.5, only=four)
    assert t.strategy.name == FIRST and [c.name for c in t.strategy.order] == [
        "enable_compute_optimizer=False", "enable_embedding_sparse_optimizer=False"]
    assert len(t.rows) == 1 + 2 and not t.budget_spent
    assert sum("over the budget: the budget (5.5 min) holds 2 of the 4 candidates" in p.reason for p in t.pruned) == 2
    # every one alone fits by the estimate, but confirming two gains (two bursts each) spends the budget
    fast = {"enable_compute_optimizer=False": 80.0, "enable_mem_efficient_grad_mgmt=True": 85.0,
            "deepcopy_before_model_export=False": 90.0}
    t = search.tune(clock(Scripted(tmp_path, times=fast, cost=30.0)), "time", budget=6.5,
                    only=["enable_compute_optimizer", "enable_mem_efficient_grad_mgmt", "deepcopy_before_model_export"])
    assert t.strategy.name == EVERY and len(t.rows) == 1 + 2 and t.budget_spent
    assert t.best_name == "enable_compute_optimizer=False"
    assert [p.name for p in t.pruned if p.reason.startswith("not run: the budget (6.5 min) ran out")] == [
        "enable_mem_efficient_grad_mgmt=True"]
    stop = clock(Scripted(tmp_path, stop_after=7))
    t = search.tune(stop, "time", budget=60, only=["enable_compute_optimizer", "deepcopy_before_model_export"])
    assert t.stopped and t.rows[-1]["outcome"] == "stopped" and len(t.rows) == 3
    assert json.loads((t.path / "tune.json").read_text())["stopped"]


class CtrlC(Scripted):
    """A Scripted session whose user presses Ctrl-C once, during the `at`-th burst (counted from 1) or the `judge`-th
    verdict: SIGINT to this process, as a terminal sends it. A burst ends "interrupted" as the engine's does (its
    KeyboardInterrupt or the Stop it was turned into); a verdict is whatever the search makes of it."""

    def __init__(self, out, at=None, judge=None, **kwargs):
        super().__init__(out, **kwargs)
        self.at, self.judge_at, self.judges, self.after = at, judge, 0, []

    def _press(self) -> bool:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(100):  # the handler runs at the next bytecode boundary; these give it many
                time.sleep(0.001)
        except KeyboardInterrupt:
            return True
        return self._stop_requested.is_set()  # a handler that turned it into a Stop

    def burst(self, backend="ortmodule", steps=20, options=None, **kwargs):
        if self.at is not None and len(self.bursts) > self.at - 1:
            self.after.append(("burst", backend))
        pressed = self.at is not None and len(self.bursts) == self.at - 1 and self._press()
        self.ended = "interrupted" if pressed else None
        return super().burst(backend, steps, options, **kwargs)

    def judge(self, pytorch, run, **kwargs):
        self.judges += 1
        if self.judge_at is not None and self.judges > self.judge_at:
            self.after.append(("judge", run.path.name))
        if self.judges == self.judge_at:  # as in a real verdict, a KeyboardInterrupt goes through it
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(100):
                time.sleep(0.001)
        return super().judge(pytorch, run, **kwargs)


FAST = {"enable_compute_optimizer=False": 80.0, "enable_mem_efficient_grad_mgmt=True": 85.0}
TWO = ["enable_compute_optimizer", "enable_mem_efficient_grad_mgmt"]


# (where Ctrl-C lands, the session's keywords, what the stop line names, the rows kept)
PHASES = [
    ("baseline", {"at": 2}, "during the baseline", ["baseline"]),
    ("guard reference", {"at": 4}, "during the guard", ["baseline"]),
    ("guard burst", {"at": 5}, "during the baseline's verdict", ["baseline"]),
    ("baseline verdict", {"judge": 1}, "during the baseline's verdict", ["baseline"]),
    ("candidate", {"at": 6}, "during the burst of candidate 1/2", ["baseline", "enable_compute_optimizer=False"]),
    ("candidate verdict", {"judge": 2}, "during the verdict of candidate 1/2",
     ["baseline", "enable_compute_optimizer=False"]),
    ("combination", {"at": 14}, "during the burst of the combination", None),
]


@pytest.mark.parametrize(("phase", "keywords", "during", "rows"), PHASES, ids=[p[0] for p in PHASES])
def test_ctrl_c_at_any_phase_stops_there_and_keeps_what_was_measured(tmp_path, clock, phase, keywords, during,
                                                                      rows):
    """Ctrl-C in the baseline, the guard, a verdict, a candidate or the combination: the search ends there (no
    burst or verdict after it), tune.json says stopped with what was measured, and nothing reads as a result for
    what was not measured."""
    s = clock(CtrlC(tmp_path, times=FAST, **keywords))
    t = search.tune(s, "time", budget=60, only=TWO)
    assert t.stopped and t.headline().startswith(f"stopped {during}"), (t.headline(), t.log)
    assert s.after == [], f"ran after the Ctrl-C: {s.after}"
    saved = json.loads((t.path / "tune.json").read_text())
    assert saved["stopped"] and saved["stopped_during"] == t.stopped_during
    assert [r["candidate"] for r in saved["rows"]][:len(rows or [])] == (rows or [])
    if rows is None:  # the combination's phase: both winners measured and kept
        assert {r["candidate"] for r in saved["rows"]} >= {"baseline", *FAST}
    line = t.headline()
    assert line.startswith("stopped during") and "no setting beats" not in line and "not run" in line, line
    if phase in ("guard burst", "baseline verdict"):
        assert saved["baseline_verdict"] is None or saved["baseline_verdict"]["verdict"] == "not judged"
        assert all(r["candidate"] == "baseline" for r in saved["rows"])
    if phase == "candidate verdict":
        assert saved["rows"][-1]["outcome"] == "stopped" and "verdict" in "; ".join(saved["rows"][-1]["reasons"])
    for p in t.path.parent.glob("*"):  # every burst that ran is kept: none left "running"
        if (p / "meta.json").exists():
            assert load_run(p).status in ("ok", "interrupted"), p


def test_steps_too_few_to_tell_a_time_change_are_said_up_front_and_a_noisy_baseline_after_it(tmp_path, clock):
    from ortlab.tuning import Tuner

    # memory needs no timed steps: the account is exact
    assert Tuner(Scripted(tmp_path), "memory", 10, steps=4, warmup=2).warnings == []
    few = Tuner(Scripted(tmp_path), "time", 10, steps=6, warmup=2)
    assert len(few.warnings) == 1 and "a time change under about" in few.warnings[0]
    assert Tuner(Scripted(tmp_path), "time", 10, steps=20, warmup=3).warnings == []
    # a baseline whose repeats differ by 2x: said before any candidate runs, as a progress line and a note
    s = clock(Scripted(tmp_path, noise=(100.0, 200.0, 100.0)))
    events = []
    t = search.tune(s, "time", budget=60, only=["enable_compute_optimizer"], on_progress=events.append)
    warned = [e["text"] for e in events if e["phase"] == "warning"]
    assert len(warned) == 1 and "the baseline's step time noise is" in warned[0] and warned[0] in [
        f"warning: {n}" for n in t.notes]
    assert [e["phase"] for e in events].index("warning") < [e["phase"] for e in events].index("candidate")


@pytest.mark.ort
def test_bad_input_is_one_line(tmp_path, capsys):
    from ortlab.cli import main

    for argv, text in ((["--goal", "fast"], "ortlab tune: goal 'fast' is not allowed"),
                       (["--budget", "0"], "ortlab tune: argument --budget: '0' is not a finite number > 0"),
                       (["--only", "log_level"], "ortlab tune: option 'log_level' is not searched by tune"),
                       (["--steps", "3"], "ortlab tune: steps 3 is not allowed; allowed: a whole number >= warmup"),
                       (["--steps", "5", "--warmup", "3"], "ortlab tune: steps 5 with warm-up 3 leave 2 timed steps: "
                                                           "too few to tell any time change; allowed: steps >= warmup "
                                                           "+ 3 (6) for a time goal")):
        try:
            code = main(["tune", *argv, "--out", str(tmp_path)])
        except SystemExit as e:  # argparse's own errors
            code = e.code
        err = capsys.readouterr().err
        assert code == 2
        assert err.startswith(text) and err.count("\n") == 1, err


def test_panel_shows_the_table_the_figure_and_the_best(tmp_path, clock):
    from ortlab.widgets.tune import TunePanel

    s = clock(Scripted(tmp_path, memory={"memory_opt_level=1": 4.0}))
    panel = TunePanel(s)
    panel.goal.value = "memory"
    panel.run(wait=True, only=["memory_opt_level"])
    assert panel.result.best_name == "memory_opt_level=1"
    assert "memory_opt_level=1" in panel.table.value and panel.plot.value
    assert "export ORTMODULE_MEMORY_OPT_LEVEL=1" in panel.best.value and "best for memory" in panel.status.value
    panel.conditions.value = "time: percent-min-improvment 5"
    panel.run(wait=True)
    assert "is not allowed" in panel.status.value


@pytest.mark.ort
def test_the_lab_has_a_tune_tab_over_its_session(tmp_path):
    from ortlab import Lab
    from ortlab.widgets.tune import TunePanel

    lab = Lab(out=tmp_path, in_process=True, cuda_available=False)
    try:
        panel = lab.extra_panels["Tune"]
        assert "Tune" in lab.titles and isinstance(panel, TunePanel) and panel.session is lab.session
    finally:
        lab.close()

# -- real ORTModule bursts

SMALL = ["--steps", "4", "--warmup", "2", "--repeats", "2", "--guard-steps", "2", "--budget", "60"]


@pytest.mark.slow
@pytest.mark.ort
def test_memory_goal_on_the_demo_finds_a_recompute_setting_that_agrees_and_reproduces(tmp_path, capsys):
    from ortlab.cli import main

    assert main(["tune", "--goal", "memory", "--only", "memory_opt_level", "--only", "plans", "--plans", "1",
                 *SMALL, "--out", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = {r["candidate"]: r for r in data["rows"]}
    base, best = rows["baseline"], rows[data["best"]]
    assert data["baseline_verdict"]["verdict"] == "agree"
    assert best["verdict"] == "agree" and best["outcome"] == BETTER
    assert best["activation_mb"] < base["activation_mb"] and best["exact"]
    assert data["best_options"].get("memory_opt_level") or data["best_options"].get("memory_opt_config")
    assert any("has none, so it equals level 1" in p["reason"] for p in data["pruned"])  # no type-2 plan
    assert data["noise"]["memory"] == 0  # the account is exact: the repeats agree to the byte
    assert "ORTMODULE_MEMORY_OPT" in data["export_lines"] and (tmp_path / data["path"] / "tune.json").is_file()
    # the best setting again, as a plain burst in a new session: the same accounted figures
    with Session(out=tmp_path / "again", in_process=True) as s:
        run = s.burst("ortmodule", 4, data["best_options"], collect={"memory": {}}, progress=False)
    assert run.memory["peak_activation_bytes"] / 2**20 == pytest.approx(best["activation_mb"])


@pytest.mark.slow
@pytest.mark.ort
def test_a_candidate_that_changes_the_model_is_rejected_with_its_cause(tmp_path):
    from ortlab.tuning import tune

    t = tune("tests.factories.tune:flipped", "time", 60, steps=5, warmup=2, repeats=2, guard_steps=2,
             only=["deepcopy_before_model_export"], out=tmp_path, in_process=True)
    row = t.table.set_index("candidate").loc["deepcopy_before_model_export=False"]
    assert t.baseline_verdict["verdict"] == "agree"
    assert row["verdict"] == "diverged" and row["outcome"] == "rejected" and row["cause"]
    assert not t.improved and "rejected deepcopy_before_model_export=False" in str(t)
    greyed = [c for c in t.pareto().axes[0].collections if c.get_label().startswith("rejected")]
    assert greyed and len(greyed[0].get_offsets()) == 1


@pytest.mark.slow
@pytest.mark.ort
def test_a_model_that_does_not_run_on_ortmodule_points_to_check(tmp_path):
    from ortlab.tuning import tune

    with pytest.raises(TuneError, match=r"does not run on ORTModule .*see `ortlab check --model ortlab.demo:gpt "
                                        r"--model-arg attention=\"mha\"`.*what was measured is kept in") as e:
        tune("ortlab.demo:gpt", "time", 10, model_kwargs={"attention": "mha"}, steps=5, warmup=2, repeats=1,
             out=tmp_path, in_process=True)
    assert "\n" not in str(e.value)


@pytest.mark.slow
@pytest.mark.ort
def test_stop_during_a_candidate_keeps_what_was_measured(tmp_path):
    """A Stop from the candidate's second step (a step callback, no timer): that burst ends, nothing later runs,
    the baseline and the stopped candidate stay in the result and in tune.json."""
    from ortlab.tuning import Tuner

    phase = {}

    def on_step(row):
        if phase.get("now") == "candidate" and row["step"] == 1:
            tuner.stop()

    tuner = Tuner(None, "time", 30, steps=5, warmup=2, repeats=1, guard_steps=2, out=tmp_path, in_process=True,
                  only=["enable_compute_optimizer", "deepcopy_before_model_export"], on_step=on_step,
                  on_progress=lambda e: phase.update(now=e["phase"]))
    t = tuner.run()
    assert t.stopped and [r["candidate"] for r in t.rows] == ["baseline", "enable_compute_optimizer=False"]
    assert t.rows[-1]["outcome"] == "stopped" and t.rows[-1]["status"] in ("stopped", "interrupted")
    assert t.rows[0]["median_step_ms"] > 0 and not t.improved
    saved = json.loads((t.path / "tune.json").read_text())
    assert saved["stopped"] and len(saved["rows"]) == 2


@pytest.mark.slow
@pytest.mark.interrupt
@pytest.mark.ort
@pytest.mark.parametrize(("after", "in_process"), [("guard:", False), ("verdict:", False), ("candidate 1/", True)])
def test_ctrl_c_ends_the_cli_with_130_and_says_what_was_and_was_not_measured(tmp_path, after, in_process):
    """The terminal's Ctrl-C (SIGINT to `ortlab tune`) once its progress shows `after`: exit 130, an interrupt line
    that names what was measured and what was not, tune.json stopped, no candidate after it."""
    import subprocess
    import sys
    import threading

    proc = subprocess.Popen([sys.executable, "-m", "ortlab.cli", "tune", "--only", "enable_compute_optimizer",
                             "--only", "deepcopy_before_model_export", *SMALL, "--steps", "5", "--repeats", "1",
                             "--out",
                             str(tmp_path), *(["--in-process"] if in_process else [])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err: list[str] = []

    def read():  # the progress lines as they come; SIGINT at the first that shows the phase
        for line in proc.stderr:
            err.append(line)
            if after in line and proc.poll() is None and not any(after in e for e in err[:-1]):
                proc.send_signal(signal.SIGINT)

    reader = threading.Thread(target=read)
    reader.start()
    out = proc.stdout.read()
    proc.wait(timeout=600)
    reader.join()
    text = "".join(err)
    assert proc.returncode == 130, (out, text)
    saved = json.loads(next(tmp_path.glob("*-tune/tune.json")).read_text())
    assert saved["stopped"] and saved["stopped_during"], saved
    interrupted = [line for line in err if line.startswith("ortlab tune: interrupted")]
    assert len(interrupted) == 1 and "not run" in interrupted[0] and "tune.json" in interrupted[0], text
    assert "no setting beats" not in out + text and "best for" not in out + text
    last = err.index(next(line for line in err if after in line))
    assert not any(line.startswith(("ortlab tune: candidate 2/", "ortlab tune: candidate combination"))
                   for line in err[last:]), text
    if after != "candidate 1/":
        assert [r["candidate"] for r in saved["rows"]] == ["baseline"]
    for run in tmp_path.glob("**/meta.json"):  # every burst it started ended, and says how (its own: ortlab-runs/)
        assert json.loads(run.read_text())["status"] in ("ok", "interrupted", "stopped"), run


def test_pareto_names_never_overlap_nor_leave_the_axes():
    """Twelve settings, several close together and at the edges: every name is inside the axes and overlaps no
    other (a name with no free place is numbered and listed under the axes)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from ortlab.tuning.figures import pareto_figure

    rows = [("baseline", "baseline", 100.0, 8.0)] + [
        (f"enable_some_long_option_name_{i}=False", "no change" if i % 3 else "rejected", 100.0 + (i % 4) * 0.3,
         8.0 + (i // 4) * 0.02) for i in range(11)]
    frame = pd.DataFrame(rows, columns=["candidate", "outcome", "median_step_ms", "activation_mb"])
    fig = pareto_figure(frame, best="enable_some_long_option_name_1=False")
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    ax = fig.axes[0]
    box = ax.get_window_extent(renderer)
    texts = [t.get_window_extent(renderer) for t in ax.texts]
    assert len(texts) == len(set(zip(frame["median_step_ms"], frame["activation_mb"], strict=True)))  # one per point
    for i, t in enumerate(texts):
        assert box.x0 - 1 <= t.x0 and t.x1 <= box.x1 + 1 and box.y0 - 1 <= t.y0 and t.y1 <= box.y1 + 1
        assert not any(t.overlaps(other) for other in texts[i + 1:])


def test_the_panel_shows_each_change_as_measured_and_says_when_the_noise_covers_it(tmp_path, clock):
    from ortlab.widgets.tune import TunePanel

    s = clock(Scripted(tmp_path, times={"enable_compute_optimizer=False": 80.0,
                                        "deepcopy_before_model_export=False": 98.0}))
    panel = TunePanel(s)
    panel.run(wait=True, only=["enable_compute_optimizer", "deepcopy_before_model_export"])
    shown = panel.table.value
    row = panel.result.table.set_index("candidate").loc["deepcopy_before_model_export=False"]
    change = f"{row['time_change_pct']:+.1f}%"
    assert row["time_change_pct"] < -1 and f">{change} (in noise)<" in shown  # not a 0 beside the reason's change
    assert f"({change}) (within the baseline&#x27;s noise" in shown
    assert "None" not in shown and "NaN" not in shown and "median_step_ms" not in shown
    assert "median step after warm-up (ms)" in shown and "step time change" in shown
