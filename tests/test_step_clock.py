"""The clock a step's speed is judged by on the CPU (ortlab.runs.clock, ortlab.engine.machine.StepClock): the CPU
time of the thread that runs the step, which another process busy on the same core leaves out while the wall time
counts its turns; the interval and Tune's noise by that clock narrow with steps on a busy machine; runs recorded
before it still read, judged by their wall time, and say so."""

import os
import random
import subprocess
import sys
import time

import pandas as pd
import pytest

from ortlab.comparison.recommend import recommend, spreads_of
from ortlab.comparison.speed import of_runs, ratio
from ortlab.engine.machine import StepClock
from ortlab.runs import clock, facts
from ortlab.runs.run import RunStatus, RunWriter, load_run, new_run_dir
from ortlab.tuning import measure
from ortlab.tuning.goals import parse_goals


def _work(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def _timed(n: int) -> dict[str, float]:
    c = StepClock(cpu=True)
    c.start()
    _work(n)
    return c.stop()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity (Linux)")
def test_a_busy_neighbour_on_the_same_core_moves_the_wall_time_not_the_steps_cpu_time():
    """This thread and a process spinning in Python pinned to one core: the step's wall time grows by the
    neighbour's turns, its CPU time stays what the step alone takes (the median of three, against a loaded
    machine's other work)."""
    before = os.sched_getaffinity(0)
    core = min(before)
    n = 400_000
    neighbour = None
    try:
        os.sched_setaffinity(0, {core})
        _work(n)  # warm
        alone = sorted(_timed(n)[clock.CPU] for _ in range(3))[1]
        neighbour = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{core}}})\n"
                                      "while 1: pass"])
        time.sleep(0.3)  # the neighbour is running
        shared = [_timed(n) for _ in range(3)]
    finally:
        if neighbour is not None:
            neighbour.kill()
            neighbour.wait()
        os.sched_setaffinity(0, before)
    cpu = sorted(s[clock.CPU] for s in shared)[1]
    wall = sorted(s[clock.WALL] for s in shared)[1]
    assert wall > 1.5 * cpu, shared  # the neighbour had about half the core
    assert 0.6 < cpu / alone < 1.6, (alone, shared)  # the step's own work, whoever else ran


def test_a_step_clock_off_the_cpu_gives_the_wall_time_only():
    c = StepClock(cpu=False)
    c.start()
    assert set(c.stop()) == {clock.WALL}


def _run(root, backend, cpu=None, wall=None, wait=None):
    """A finished run with these step times (seconds) and, optionally, the share of its time it waited for a core."""
    w = RunWriter(new_run_dir(root, backend), {"backend": backend, "device": "cpu", "config": {"steps": len(wall)},
                                                "machine": {"cores": 2, "cpu_wait": wait}})
    for i, t in enumerate(wall):
        row = {"step": i, "loss": 1.0, clock.WALL: t}
        if cpu is not None:
            row[clock.CPU] = cpu[i]
        w.step(row)
    w.finish(RunStatus.OK)
    return load_run(w.path)


def _busy(n, step, seed):
    """`n` steps of `step` seconds' CPU time (2 % spread) on a machine where others take 0-10x as long again."""
    rng = random.Random(seed)
    cpu = [step * rng.lognormvariate(0, 0.02) for _ in range(n)]
    return cpu, [c * (1 + 10 * rng.random()) for c in cpu]


def test_the_interval_by_cpu_time_narrows_with_steps_on_a_busy_machine(tmp_path):
    widths = {}
    for n in (20, 40):
        runs = [_run(tmp_path / f"{n}", b, *_busy(n, s, seed), wait=0.8)
                for b, s, seed in (("pytorch", 0.010, 1), ("ortmodule", 0.009, 2))]
        spreads = spreads_of(runs)
        assert {s.clock for s in spreads.values()} == {clock.CPU} and spreads["pytorch"].load == 0.0
        r = ratio(spreads["ortmodule"], spreads["pytorch"])
        widths[n] = r.high / r.low
        assert r.faster, r  # 10 % faster, told through the neighbours' noise
        walled = ratio(of_runs([runs[1]], clock=clock.WALL), of_runs([runs[0]], clock=clock.WALL))
        assert not walled.told and walled.high / walled.low > 10  # by wall time the load covers it
    assert widths[40] < widths[20] < 1.1


def test_old_runs_without_cpu_time_are_judged_by_wall_time_and_say_so(tmp_path):
    new = _run(tmp_path, "pytorch", *_busy(10, 0.01, 1))
    old = _run(tmp_path, "ortmodule", wall=[0.01] * 10)
    assert clock.column(new.metrics) == clock.CPU and clock.column(old.metrics) == clock.WALL
    s = new.summary()
    assert s["median_step_s"] == pytest.approx(pd.Series(new.metrics[clock.CPU].iloc[1:]).median())
    assert s["median_wall_s"] > s["median_step_s"] and s["step_clock"] == "CPU time"
    assert old.summary()["step_clock"] == "wall time" and "median_wall_s" not in old.summary()
    table = "\n".join(facts.text_table([s, old.summary()], ["new", "old"]))
    assert "step timed by" in table and "median step, wall time (ms)" in table
    spreads = spreads_of([new, old])  # one clock for both: the one they share
    assert {sp.clock for sp in spreads.values()} == {clock.WALL}
    r = recommend({"pytorch": new.summary(), "ortmodule": old.summary()}, {"ortmodule": "agree"}, spreads)
    assert "timed by wall time (other processes' turns count: a step's CPU time is recorded when it runs on one " \
        "thread: --threads 1, threads=1, or threads 1 in the Lab's Burst panel)" in r.line


def test_the_recommendation_and_tunes_noise_say_the_cpu_time(tmp_path):
    runs = [_run(tmp_path, b, *_busy(20, s, seed), wait=0.8) for b, s, seed in (("pytorch", 0.01, 1),
                                                                                 ("ortmodule", 0.008, 2))]
    r = recommend({run.backend: run.summary() for run in runs}, {"ortmodule": "agree"}, spreads_of(runs))
    assert r.backend == "ortmodule" and "timed by each step's CPU time on its thread (other processes do not " \
        "count)" in r.line
    assert r.busy and "measure again on a quiet one" not in r.line  # the neighbours did not decide it
    rows = [measure.figures(_run(tmp_path, "ortmodule", *_busy(8, 0.01, seed), wait=0.8), 3) for seed in (3, 4, 5)]
    assert {row["clock"] for row in rows} == {clock.CPU} and all(row["load"] == 0.0 for row in rows)
    merged, noise = measure.baseline(rows)
    assert merged["clock"] == clock.CPU and noise["time"] < 0.5  # three 8-step bursts, 3 of warm-up: Tune's
    walled = [{**row, "timed_ms": [t * 1000 for t in _busy(5, 0.01, i)[1]], "clock": clock.WALL, "load": 0.8}
              for i, row in enumerate(rows)]
    assert measure.baseline(walled)[1]["time"] > 1.0  # the same bursts by wall time: the neighbours' noise
    words = measure.noise_check(parse_goals("time"), walled, measure.baseline(walled)[1])
    assert words and "(timed by wall time)" in words[0] and "threads=1 (--threads 1) times each step" in words[0]


@pytest.mark.slow  # a real burst (its worker-free engine, the demo model): seconds on a loaded machine
def test_a_one_thread_cpu_burst_records_each_steps_cpu_time_beside_its_wall_time(demo_session):
    """One thread (OMP_NUM_THREADS=1 in a worker; here torch's setting): judged by CPU time; more threads spin for
    each other, whose CPU time counts the neighbours too: wall time."""
    import torch

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        run = demo_session.burst("pytorch", 3, progress=False)
        if (os.cpu_count() or 1) > 1:
            torch.set_num_threads(2)
            two = demo_session.burst("pytorch", 3, progress=False)
            assert clock.CPU not in two.metrics and two.summary()["step_clock"] == "wall time"
    finally:
        torch.set_num_threads(threads)
    m = run.metrics
    assert (m[clock.CPU] > 0).all() and (m[clock.WALL] > 0).all()
    assert run.summary()["step_clock"] == clock.SHORT[clock.CPU]


def test_a_noisy_baseline_by_cpu_time_says_its_clock():
    rows = [{"timed_ms": [10.0, 30.0, 12.0, 40.0, 9.0], "clock": clock.CPU, "load": 0.0, "steps_timed": 5,
             "device": "cpu"},
            {"timed_ms": [20.0, 11.0, 35.0, 10.0, 25.0], "clock": clock.CPU, "load": 0.0, "steps_timed": 5,
             "device": "cpu"}]
    words = measure.noise_check(parse_goals("time"), rows, measure.baseline(rows)[1])
    assert words and "(timed by CPU time, other processes excluded)" in words[0]
    assert "threads=1" not in words[0]  # already timed by CPU time
