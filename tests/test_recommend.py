"""Which backend to train with: faster per step beyond the noise with the same numerics, and after how many steps;
"can't tell at this length" inside the noise, with the steps that would tell; or PyTorch, with each other backend's
reason."""

import math
import random

import pytest

from ortlab.comparison.recommend import recommend
from ortlab.comparison.speed import spread


def _ok(step_s, startup_s=0.0, **extra):
    return {"status": "ok", "median_step_s": step_s, "startup_s": startup_s, **extra}


def _steps(median_s, n=20, sd=0.02, seed=0):
    """`n` step times around `median_s`, spread by `sd` (log scale), the first two slow (warm-up)."""
    rng = random.Random(seed)
    return [median_s * 5, median_s * 2] + [median_s * rng.lognormvariate(0, sd) for _ in range(n - 2)]


def _spreads(**medians):
    return {b: spread([_steps(m, seed=i)]) for i, (b, m) in enumerate(medians.items())}


def test_a_faster_backend_that_agrees_is_recommended_with_its_break_even():
    r = recommend({"pytorch": _ok(0.100), "ortmodule": _ok(0.080, startup_s=10.0)}, {"ortmodule": "agree"},
                  _spreads(pytorch=0.100, ortmodule=0.080))
    assert r.told and r.backend == "ortmodule" and 450 < r.break_even_steps < 550  # 10 s / ~20 ms per step
    assert r.line.startswith("recommendation: train with ORTModule: 1.2")
    assert "faster per step than PyTorch (step time 0.8" in r.line and "99% interval" in r.line
    assert f"paid back after {r.break_even_steps} steps" in r.line and "steps after warm-up" in r.line


def test_the_fastest_of_two_that_agree_wins():
    summaries = {"pytorch": _ok(0.100), "ortmodule": _ok(0.090, 5.0), "compile": _ok(0.050, 30.0)}
    r = recommend(summaries, {"ortmodule": "agree", "compile": "agree"},
                  _spreads(pytorch=0.100, ortmodule=0.090, compile=0.050))
    assert r.backend == "compile" and 550 < r.break_even_steps < 650


def test_stay_on_pytorch_names_each_reason():
    summaries = {"pytorch": _ok(0.100), "ortmodule": _ok(0.210, 5.0), "compile": _ok(0.050, 30.0)}
    r = recommend(summaries, {"ortmodule": "agree", "compile": "diverged"},
                  _spreads(pytorch=0.100, ortmodule=0.210, compile=0.050))
    assert r.backend == "pytorch" and r.told and r.break_even_steps is None
    assert r.line.startswith("recommendation: stay on PyTorch: ORTModule is 2.1")
    assert "slower); torch.compile trains a different model (verdict: diverged)" in r.line


def test_a_difference_inside_the_noise_is_said_with_the_steps_that_would_tell():
    rng = random.Random(1)

    def noisy(median_s, n):
        return [median_s * rng.lognormvariate(0, 0.3) for _ in range(n)]

    summaries = {"pytorch": _ok(0.100), "ortmodule": _ok(0.085, 1.0)}
    r = recommend(summaries, {"ortmodule": "agree"}, {"pytorch": spread([noisy(0.100, 10)]),
                                                      "ortmodule": spread([noisy(0.085, 10)])})
    assert not r.told and r.backend == "pytorch" and r.break_even_steps is None
    assert r.line.startswith("recommendation: can't tell at this length: ORTModule is ")
    assert f"about {r.more_steps} more steps per backend would tell" in r.line and r.more_steps > 10
    # that many more steps of the same machine tell it
    n = 10 + r.more_steps
    told = recommend(summaries, {"ortmodule": "agree"}, {"pytorch": spread([noisy(0.100, n)]),
                                                         "ortmodule": spread([noisy(0.085, n)])})
    assert told.told and told.backend == "ortmodule", told.line


def test_identical_bursts_never_name_opposite_winners():
    """100 pairs of identical comparisons (each backend's steps drawn alike, 10 steps, a 30 % spread per step and a
    slow warm-up): no pair names ORTModule in one and PyTorch in the other."""
    rng = random.Random(7)

    def burst(median_s):
        return [median_s * 4, *(median_s * rng.lognormvariate(0, 0.3) for _ in range(9))]

    answers = []
    for _ in range(200):
        r = recommend({"pytorch": _ok(0.02), "ortmodule": _ok(0.021, 1.0)}, {"ortmodule": "agree"},
                      {"pytorch": spread([burst(0.020)]), "ortmodule": spread([burst(0.021)])})
        answers.append("can't tell" if not r.told else r.backend)
    pairs = list(zip(answers[::2], answers[1::2], strict=True))
    assert not [p for p in pairs if set(p) == {"pytorch", "ortmodule"}]
    assert answers.count("can't tell") > 150  # 5 % apart: inside a 10-step burst's noise


def test_a_busy_machine_cannot_be_outwaited_and_a_failed_reference_recommends_nothing_new():
    loaded = {b: spread([_steps(m, seed=i)], loads=[0.8]) for i, (b, m) in enumerate((("pytorch", 0.1),
                                                                                        ("ortmodule", 0.05)))}
    r = recommend({"pytorch": _ok(0.1, busy="it waited for a core 80% of the time"), "ortmodule": _ok(0.05)},
                  {"ortmodule": "agree"}, loaded)
    assert r.busy and not r.told and r.more_steps is None
    assert "more steps would not tell while other work takes the cores: the machine is busy, measure again on a " \
           "quiet one; until then PyTorch" in r.line and r.line.count("busy") == 1
    r = recommend({"pytorch": {"status": "failed"}, "ortmodule": _ok(0.05)}, {"ortmodule": "agree"})
    assert r.backend == "pytorch" and "did not finish" in r.reason


def test_repeated_bursts_add_their_spread():
    one = spread([_steps(0.1, seed=1)])
    three = spread([_steps(0.1, seed=1), _steps(0.13, seed=2), _steps(0.08, seed=3)])
    assert one.bursts == 1 and one.between == 0 and three.bursts == 3 and three.between > 0.05
    assert three.error > one.error


def test_a_faster_backend_whose_numerics_were_not_judged_or_that_fell_back_is_not_recommended():
    r = recommend({"pytorch": _ok(0.1), "ortmodule": _ok(0.05)}, {"ortmodule": "not judged"})
    assert r.backend == "pytorch" and "ORTModule's numerics were not judged" in r.reason
    r = recommend({"pytorch": _ok(0.1), "ortmodule": {"status": "fallback", "median_step_s": 0.05}}, {})
    assert r.backend == "pytorch" and r.reason == "ORTModule fell back to PyTorch"


@pytest.mark.ort
@pytest.mark.slow
def test_compare_on_the_demo_gives_the_recommendation_with_its_interval(tmp_path, capsys):
    """`ortlab compare --steps 10`: the decision table's step-time ratio with its interval and the recommendation from
    the same figures, in the JSON as in the text; a winner only when the interval leaves 1."""
    import json

    from ortlab.cli import main

    main(["compare", "--steps", "10", "--backends", "both", "--in-process", "--out", str(tmp_path), "--json"])
    data = json.loads(capsys.readouterr().out)
    r, ratio = data["recommendation"], data["recommendation"]["ratios"]["ortmodule"]
    assert ratio["low"] <= ratio["value"] <= ratio["high"] and ratio["steps"] == 8  # 10 steps, 2 of warm-up
    assert r["told"] == ratio["told"] and r["backend"] == ("ortmodule" if ratio["high"] < 1 else "pytorch")
    assert r["line"].startswith("recommendation: " + ("can't tell at this length: " if not r["told"] else ""))
    ortmodule = next(row for row in data["decision"] if row["backend"] == "ortmodule")
    assert ortmodule["step time vs PyTorch (99% interval)"].startswith(f"{ratio['value']:.2f}x (")
    assert ortmodule["steps to break even"] == ("can't tell" if not r["told"] else ortmodule["steps to break even"])


@pytest.mark.parametrize(("steps", "within", "load"),
                         [(27, 0.12, 0.0), (8, 0.05, 0.0), (50, 0.2, 0.02), (10, 0.4, 0.0)])
def test_the_steps_said_to_tell_are_the_fewest_that_tell_under_the_same_interval(steps, within, load):
    """`more_steps` answers with the interval `ratio` draws (Student's t): that many more steps, each backend's
    within-spread shrinking as 1/sqrt(steps), tell the difference, and one fewer (before rounding) does not."""
    from ortlab.comparison.speed import Spread, ratio

    def at(n):
        shrink = math.sqrt(steps / n)
        return ratio(Spread(0.08, n, within * shrink, load=load), Spread(0.10, n, within * shrink, load=load))

    r = at(steps)
    assert not r.told and r.more_steps, r
    assert at(steps + r.more_steps).told, (r, at(steps + r.more_steps))
    if r.more_steps < 100:  # below 100 the count is exact, not rounded up
        assert r.more_steps == 1 or not at(steps + r.more_steps - 1).told
