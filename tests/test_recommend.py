"""Which backend to train with: faster per step with the same numerics, and after how many steps; or PyTorch, with
each other backend's reason."""

from ortlab.recommend import recommend


def _ok(step_s, startup_s=0.0, **extra):
    return {"status": "ok", "median_step_s": step_s, "startup_s": startup_s, **extra}


def test_a_faster_backend_that_agrees_is_recommended_with_its_break_even():
    r = recommend({"pytorch": _ok(0.100), "ortmodule": _ok(0.080, startup_s=10.0)}, {"ortmodule": "agree"})
    assert (r.backend, r.break_even_steps) == ("ortmodule", 500)  # 10 s / 20 ms saved per step
    assert r.line == ("recommendation: train with ORTModule: 1.25x faster per step than PyTorch, same numerics "
                      "(verdict: agree); its start-up (10.0 s) is paid back after 500 steps")


def test_the_fastest_of_two_that_agree_wins():
    summaries = {"pytorch": _ok(0.100), "ortmodule": _ok(0.090, 5.0), "compile": _ok(0.050, 30.0)}
    r = recommend(summaries, {"ortmodule": "agree", "compile": "agree"})
    assert (r.backend, r.break_even_steps) == ("compile", 600)


def test_stay_on_pytorch_names_each_reason():
    summaries = {"pytorch": _ok(0.100), "ortmodule": _ok(0.210, 5.0), "compile": _ok(0.050, 30.0)}
    r = recommend(summaries, {"ortmodule": "agree", "compile": "diverged"})
    assert r.backend == "pytorch" and r.break_even_steps is None
    assert r.line == ("recommendation: stay on PyTorch: ORTModule is 2.10x PyTorch's step time (no faster); "
                      "torch.compile trains a different model (verdict: diverged)")


def test_a_faster_backend_whose_numerics_were_not_judged_or_that_fell_back_is_not_recommended():
    r = recommend({"pytorch": _ok(0.1), "ortmodule": _ok(0.05)}, {"ortmodule": "not judged"})
    assert r.backend == "pytorch" and "ORTModule's numerics were not judged" in r.reason
    r = recommend({"pytorch": _ok(0.1), "ortmodule": {"status": "fallback", "median_step_s": 0.05}}, {})
    assert r.backend == "pytorch" and r.reason == "ORTModule fell back to PyTorch"


def test_a_busy_machine_is_named_and_a_failed_reference_recommends_nothing_new():
    r = recommend({"pytorch": _ok(0.1, busy="load 3.1"), "ortmodule": _ok(0.05)}, {"ortmodule": "agree"})
    assert r.busy and r.line.endswith("timed on a busy machine: measure again on a quiet one")
    r = recommend({"pytorch": {"status": "failed"}, "ortmodule": _ok(0.05)}, {"ortmodule": "agree"})
    assert r.backend == "pytorch" and "did not finish" in r.reason
