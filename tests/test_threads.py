"""The burst's `threads` setting (BurstConfig.threads, --threads, Session.burst/compare(threads=), Tune's default of
one thread on the CPU): refused in one line where it cannot be, applied for the burst and restored after, recorded in
the run's meta; with one thread ORTModule's session runs on one thread too, so the step's CPU time counts its work."""

import pytest
import torch

from ortlab.cli import build_parser
from ortlab.engine.config import BurstConfig, BurstError
from ortlab.engine.machine import fit_threads
from ortlab.errors import InputError
from ortlab.runs import clock


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_a_bad_threads_setting_is_refused_in_one_line_naming_what_is_allowed(bad):
    with pytest.raises(BurstError) as e:
        BurstConfig(backend="pytorch", threads=bad)
    assert isinstance(e.value, InputError)
    text = str(e.value)
    assert "\n" not in text and text.startswith(f"threads {bad!r} is not allowed") and "whole number >= 1" in text


def test_threads_is_kept_in_the_config_and_old_configs_read_as_none():
    cfg = BurstConfig(backend="pytorch", threads=1)
    assert cfg.to_dict()["threads"] == 1 and BurstConfig.from_dict(cfg.to_dict()).threads == 1
    old = {k: v for k, v in cfg.to_dict().items() if k != "threads"}  # a run recorded before the setting
    assert BurstConfig.from_dict(old).threads is None


def test_ranks_keep_their_one_thread():
    assert BurstConfig(backend="pytorch", nproc=2, threads=1).threads == 1
    with pytest.raises(BurstError, match=r"threads 2 with 2 ranks is not allowed: each rank runs on one thread.*"
                                         r"allowed: threads 1 or None"):
        BurstConfig(backend="pytorch", nproc=2, threads=2)


def test_a_comparison_refuses_a_bad_threads_setting_before_any_burst(tmp_path):
    from ortlab import Session

    with Session(out=tmp_path, in_process=True) as s, pytest.raises(BurstError, match="threads 0 is not allowed"):
        s.compare(3, backends="pytorch,compile", threads=0)
    assert not list(tmp_path.iterdir())  # no run folder: refused before anything ran


@pytest.mark.parametrize("command", ["burst", "compare", "tune"])
def test_the_cli_takes_threads_and_refuses_a_bad_one(command, capsys):
    assert build_parser().parse_args([command, "--threads", "1"]).threads == 1
    assert build_parser().parse_args([command]).threads is None
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--threads", "0"])
    assert "--threads: '0' is not a whole number >= 1" in capsys.readouterr().err


def test_fit_threads_sets_the_setting_on_the_cpu_and_leaves_cuda_alone():
    before = torch.get_num_threads()
    try:
        machine = fit_threads(1, "cpu")
        assert torch.get_num_threads() == 1 and machine["threads"] == 1
        assert machine["threads_from"] == "threads setting" and "threads_note" not in machine
        torch.set_num_threads(before)
        machine = fit_threads(1, "cuda")
        assert machine["threads_from"] != "threads setting" and machine["threads"] == torch.get_num_threads()
        assert machine["threads_note"].startswith("threads 1 ignored: the step runs on cuda")
    finally:
        torch.set_num_threads(before)


def test_tune_times_its_candidates_on_one_thread_on_the_cpu_unless_told(tmp_path):
    from ortlab.tuning.search import ONE_THREAD, Tuner

    if torch.cuda.is_available():
        pytest.skip("Tune's default is for the CPU")
    default = Tuner(out=tmp_path, in_process=True)
    assert default.one_thread and default.burst_kwargs["threads"] == 1
    assert "timed on one thread by its CPU time" in ONE_THREAD
    told = Tuner(out=tmp_path, in_process=True, threads=2)
    assert not told.one_thread and told.burst_kwargs["threads"] == 2


def test_the_wall_time_advice_names_the_setting():
    words = clock.said(clock.WALL, "cpu")
    assert "--threads 1" in words and "threads=1" in words
    assert "threads" not in clock.said(clock.WALL, "cuda")


@pytest.mark.slow  # a real ORTModule burst of the demo in this process: seconds on a loaded machine
@pytest.mark.ort
def test_threads_1_runs_torch_and_orts_session_on_one_thread_and_times_the_steps_by_cpu_time(demo_session):
    before = torch.get_num_threads()
    if before == 1:
        torch.set_num_threads(2)  # the setting, not the process's own one thread, must make it one
    try:
        several = demo_session.burst("ortmodule", 2, progress=False).meta["machine"]["threads"] > 1
        run = demo_session.burst("ortmodule", 4, threads=1, progress=False)
        assert torch.get_num_threads() == (before if before > 1 else 2)  # the setting held for the burst only
    finally:
        torch.set_num_threads(before)
    assert run.status == "ok", run.error
    machine = run.meta["machine"]
    assert machine["threads"] == 1 and machine["threads_from"] == "threads setting" and machine["ort_threads"] == 1
    assert run.meta["config"]["threads"] == 1
    m = run.metrics
    assert clock.CPU in m and (m[clock.CPU] > 0).all() and run.summary()["step_clock"] == clock.SHORT[clock.CPU]
    assert (m[clock.CPU] <= m[clock.WALL] * 1.05 + 0.002).all()  # one thread's CPU time fits in its wall time
    agent = demo_session._local_engine().backends["ortmodule"].wrapper.ort_module._torch_module._execution_manager(
        True)._execution_agent  # ORT's private state, read here only to check the session ORT built
    assert agent._inference_session.get_session_options().intra_op_num_threads == 1
    if several:  # the burst before ran on several threads: its session could not serve this one, built anew
        row = run.read_json("transitions.json")[0]
        assert row["action"] == "re-wrap" and row["changes"]["ort_threads"]["new"] == 1, row


@pytest.mark.slow  # a Lab and a real PyTorch burst of the demo in this process
def test_the_burst_panels_threads_control_reaches_the_burst(tmp_path):
    from ortlab.widgets.lab import Lab

    lab = Lab(out=tmp_path, in_process=True, cuda_available=False)
    try:
        panel = lab.burst_panel
        assert panel.threads.value == 0  # torch's threads, as a burst without the setting
        panel.backend.value, panel.steps.value, panel.threads.value = "pytorch", 2, 1
        panel.run_button.click()
        panel.wait(300)
        run = lab.runs[-1]
    finally:
        lab.close()
    assert run.meta["machine"]["threads_from"] == "threads setting" and run.meta["config"]["threads"] == 1
    assert clock.CPU in run.metrics
