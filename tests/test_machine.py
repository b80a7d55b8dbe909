"""The machine a burst runs on (cores, threads, a busy machine named) and the Stop grace that tells a stuck process
from a slow one by its progress, not by a fixed time."""

import json
import os
import subprocess
import sys
import time

import pytest

from ortlab.engine import grace as grace_module
from ortlab.engine.grace import StopGrace, session_cpu_seconds
from ortlab.engine.machine import Contention, available_cores, cpu_wait_seconds
from ortlab.runs.busy import BUSY_WAIT, busy


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def _wait_cpu(pid: int, seconds: float) -> None:
    deadline = time.monotonic() + 120
    while (session_cpu_seconds(pid) or 0) < seconds:
        assert time.monotonic() < deadline, "the busy child used no CPU time"
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def _check_every_call(monkeypatch):
    monkeypatch.setattr(grace_module, "CHECK_EVERY_S", 0.0)  # read /proc on every expired() call


def test_a_stuck_process_expires_after_its_quiet_time_a_busy_one_does_not():
    stuck, spinning = _child("import time; time.sleep(600)"), _child("while True: pass")
    try:
        clock = FakeClock()
        quiet, busy_grace = StopGrace(stuck.pid, clock=clock), StopGrace(spinning.pid, clock=clock)
        quiet.start()
        busy_grace.start()
        _wait_cpu(spinning.pid, grace_module.MIN_CPU_S * 1.5)
        clock.now += grace_module.QUIET_S / 2
        assert not quiet.expired() and not busy_grace.expired()  # the spinning child's CPU time: progress
        clock.now += grace_module.QUIET_S / 2 + 1
        assert quiet.expired() and "no progress" in quiet.reason
        assert not busy_grace.expired()
        clock.now += grace_module.CEILING_S
        assert busy_grace.expired() and "still running" in busy_grace.reason
    finally:
        for p in (stuck, spinning):
            p.kill()
            p.wait()


def test_a_message_is_progress():
    stuck = _child("import time; time.sleep(600)")
    try:
        clock = FakeClock()
        g = StopGrace(stuck.pid, clock=clock)
        assert not g.expired()  # not started: no Stop asked for
        g.start()
        clock.now += grace_module.QUIET_S - 1
        g.progress()
        clock.now += grace_module.QUIET_S - 1
        assert not g.expired()
    finally:
        stuck.kill()
        stuck.wait()


def test_cores_and_a_busy_machine_named():
    assert available_cores() >= 1
    assert busy({"cores": 2, "load": 6.0, "cpu_wait": 0.02}) is None  # measured: the load average is history
    assert busy({"cores": 2, "load": 0.1, "cpu_wait": 0.35}) == "it waited for a core 35% of the time"
    assert "load average 6.0 on 2 cores" in busy({"cores": 2, "load": 6.0})  # a run that did not measure it
    assert busy(None) is None


def test_the_wait_for_a_core_is_measured_against_a_competitor():
    """This process and a spinning one on the same core: this one waits for it about half the time."""
    if not hasattr(os, "sched_setaffinity") or cpu_wait_seconds() is None:
        pytest.skip("no CPU affinity or schedstat here")
    before = os.sched_getaffinity(0)
    core = {min(before)}
    spinner = _child("while True: pass")
    try:
        os.sched_setaffinity(spinner.pid, core)
        os.sched_setaffinity(0, core)
        contention = Contention()
        end = cpu_wait_seconds() + 0.5
        while cpu_wait_seconds() < end:  # spin until half a second of waiting has been counted
            pass
        assert contention.share() > BUSY_WAIT
    finally:
        os.sched_setaffinity(0, before)
        spinner.kill()
        spinner.wait()


def test_more_ranks_than_cores_warns_once_in_one_cli_line(tmp_path):
    ranks = available_cores() + 1
    r = subprocess.run([sys.executable, "-c", f"""
import warnings, sys
from ortlab.cli import _warnings_in_one_line
from ortlab.engine.machine import warn_oversubscribed
_warnings_in_one_line("ortlab burst")
warn_oversubscribed({ranks}); warn_oversubscribed({ranks})
"""], capture_output=True, text=True, check=True)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ortlab burst: warning: {ranks} ranks on "), r.stderr


def test_a_second_stop_expires_the_grace_at_once():
    stuck = _child("import time; time.sleep(600)")
    try:
        again = []
        g = StopGrace(stuck.pid, clock=FakeClock(), again=lambda: bool(again))
        g.start()
        assert not g.expired()
        again.append(True)
        assert g.expired() and "asked for again" in g.reason
    finally:
        stuck.kill()
        stuck.wait()


@pytest.mark.slow
@pytest.mark.parametrize("omp", ["1", None])
@pytest.mark.ort
def test_a_run_records_the_threads_of_torch_and_of_orts_sessions(tmp_path, omp):
    """OMP_NUM_THREADS sets torch's threads; ORT's pool gets the cores this process may use when they are fewer than
    the host's (else ORT keeps its default: null), and one thread when torch's step runs on one."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if omp:
        env["OMP_NUM_THREADS"] = omp
    done = subprocess.run([sys.executable, "-m", "ortlab.cli", "burst", "--backend", "ortmodule", "--steps", "1",
                           "--in-process", "--json", "--out", str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    runs = [p for p in tmp_path.iterdir() if p.name.endswith("-ortmodule")]
    machine = json.loads((runs[0] / "meta.json").read_text())["machine"]
    if omp:
        assert machine["threads"] == 1 and machine["threads_from"] == "OMP_NUM_THREADS", machine
    expected = None if available_cores() == (os.cpu_count() or 1) else available_cores()
    expected = 1 if omp == "1" else expected  # the step on one thread: ORT's session too (its CPU time counts all)
    assert "ort_threads" in machine and machine["ort_threads"] == expected, machine
