"""Bursts in the worker process: Stop, crashes, worker reuse, and the Jupyter-kernel hang it exists to avoid."""

import re
import threading
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from ortlab import InputError, Session, load_run

FACTORIES = str(Path(__file__).parent / "factories" / "slow_steps.py")


@pytest.mark.slow
@pytest.mark.ort
def test_worker_is_reused_and_import_time_option_starts_a_new_one(tmp_path):
    with Session(out=tmp_path) as s:
        a = s.burst("ortmodule", 2, progress=False)
        pid = s.worker_pid
        b = s.burst("ortmodule", 2, {"memory_opt_level": 1}, progress=False)  # construction-time: same worker
        assert s.worker_pid == pid and s.worker_starts == 1
        c = s.burst("ortmodule", 2, {"enable_custom_autograd": False}, progress=False)  # import-time
        assert s.worker_pid != pid and s.worker_starts == 2
    assert a.ok and b.ok and c.ok
    actions = s.transitions["action"].tolist()
    assert actions == ["wrap", "re-wrap", "new worker"]
    assert "import-time options changed: enable_custom_autograd True -> False" in s.transitions["reason"][2]
    assert c.meta["pid"] != a.meta["pid"]


def _stop_after(session, step):
    """A step callback that asks for a Stop once `step` is reported: the Stop lands mid-burst on any machine."""
    return lambda row: session.stop() if row["step"] == step else None


@pytest.mark.interrupt
def test_stop_ends_a_running_burst_cleanly(tmp_path):
    with Session(f"{FACTORIES}:slow", out=tmp_path) as s:
        run = s.burst("pytorch", 200, progress=False, on_step=_stop_after(s, 2))
        # The worker hears SIGINT during a later step (each sleeps 0.3 s first) and ends the burst itself.
        assert run.status == "interrupted", run.error
        assert "interrupted by the user" in run.error
        assert 3 <= len(run.metrics) < 200
        again = s.burst("pytorch", 2, progress=False)  # the same worker serves the next burst
        assert again.ok and s.worker_starts == 1


@pytest.mark.interrupt
def test_a_stop_as_a_burst_ends_still_ends_the_comparison(tmp_path):
    """A Stop (what a Ctrl-C is while a burst runs in the worker) asked at a burst's last step may find no step left
    to stop: that run is "ok" or "interrupted", and either way no burst after it starts (before, an "ok" one let
    the comparison go on, and a Ctrl-C during Tune's last guard step was lost: it ran to its end, exit 0)."""
    with Session("ortlab.demo:gpt", out=tmp_path) as s:
        last = lambda row: row["step"] == 2 and s.stop()  # noqa: E731
        c = s.compare(steps=3, backends="pytorch,compile", progress=False, on_step=last)
        assert s.stop_asked and c.pytorch is not None and len(c.pytorch.metrics) >= 1
        assert c.run("compile") is None and [r.backend for r in s.runs] == ["pytorch"]


@pytest.mark.slow
@pytest.mark.interrupt
def test_stop_kills_a_worker_that_does_not_listen(tmp_path):
    with Session(f"{FACTORIES}:deaf_after", {"step": 3}, out=tmp_path) as s:
        # Stop once step 2 is reported: batch 3 then ignores SIGINT and sleeps, so only terminate ends it.
        run = s.burst("pytorch", 50, progress=False, on_step=_stop_after(s, 2))
        assert run.status == "stopped" and "terminated" in run.error
        assert run.metrics["step"].tolist() == [0, 1, 2]  # the steps done are kept
        after = s.burst("pytorch", 2, progress=False)  # a new worker, with the reason recorded
        assert after.ok and s.worker_starts == 2


def test_a_crash_kills_the_worker_not_the_caller(tmp_path):
    with Session(f"{FACTORIES}:crash_at", {"step": 2}, out=tmp_path) as s:
        run = s.burst("pytorch", 5, progress=False)
    assert run.status == "crashed" and "SIGKILL" in run.error
    assert len(run.metrics) == 2
    assert load_run(run.path).status == "crashed"
    log = Path(re.search(r"the worker's in (\S+\.log)", run.error).group(1))  # a crashed worker's log is kept
    assert log.is_file() and log.parent == tmp_path and list(tmp_path.glob(".worker-*.log")) == [log]


def test_bad_factory_gives_a_clear_error(tmp_path):
    with (Session("ortlab.demo:nope", out=tmp_path) as s,
          pytest.raises(InputError, match=r"has no .nope.; callables there")):
        s.burst("pytorch", 1, progress=False)


def test_notebook_defined_factory_is_sent_by_value(tmp_path):
    def make():
        from ortlab.demo import gpt

        return gpt(n_layer=1, d_model=32)

    with Session(make, out=tmp_path) as s:
        run = s.burst("pytorch", 2, progress=False)
    assert run.ok and run.meta["model"]["parameters"] < 60_000


def test_unsendable_factory_says_how_to_fix_it(tmp_path):
    lock = threading.Lock()

    def make():
        with lock:
            from ortlab.demo import gpt

            return gpt()

    from ortlab import WorkloadError

    with pytest.raises(WorkloadError, match=r"cannot be sent to the worker process.*file\.py:name"):
        Session(make, out=tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.ort
def test_devinfo_burst_from_a_jupyter_kernel_completes(tmp_path):
    """The hang the worker exists for: ORTModule at DEVINFO prints ~270 KB at C level on a 4-layer GPT."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "import ortlab\n"
        f"run = ortlab.burst(backend='ortmodule', steps=2, options={{'log_level': 'DEVINFO'}}, out={str(tmp_path)!r},\n"
        "                   model_kwargs={'n_layer': 4, 'd_model': 128}, progress=False)\n"
        "print(run.status, len(run.log))")]
    NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    out = nb.cells[0].outputs[0]["text"].split()
    assert out[0] == "ok"
    assert int(out[1]) > 100_000  # the exporter's C-level output went to the run log, not the kernel
