"""What the Lab says stays true: no time left after a Stop or the end, "stopped" for a user's Stop, the Burst tab's
checkbox named where graphs are missing, one Stop button, what a compile burst does while it compiles, whole steps
on the loss plot. Panels are built and read without a browser."""

import pytest

from ortlab.engine.progress import Pace
from ortlab.runs.run import RunStatus, RunWriter, load_run, new_run_dir


def test_an_estimate_is_shown_only_while_it_means_something():
    pace = Pace(20, "pytorch")
    for _ in range(6):
        pace.step({"step_time_s": 0.001})
    assert pace.line().startswith("pytorch: step 6/20 · ") and "left" not in pace.line()  # not "~0 s left"
    slow = Pace(20, "pytorch")
    for _ in range(6):
        slow.step({"step_time_s": 0.5})
    assert slow.line().endswith("~7 s left")
    slow.end("stopped")
    assert slow.line().startswith("pytorch: stopped at step 6/20 · ") and "left" not in slow.line()
    assert slow.left() is None
    done = Pace(3)
    for _ in range(3):
        done.step({"step_time_s": 2.0})
    done.end()
    assert done.line().startswith("finished at step 3/3") and "left" not in done.line()


def _tune_panel(tmp_path, **scripted):
    from ortlab.widgets.tune import TunePanel
    from tests.test_tune import Scripted

    panel = TunePanel(Scripted(tmp_path, **scripted), budget=60, steps=5)
    panel.run(wait=True, only=["enable_compute_optimizer"])
    return panel


def test_tune_says_finished_or_stopped_when_it_ends_not_a_time_left(tmp_path):
    panel = _tune_panel(tmp_path / "done")
    assert panel.pace.value and "finished" in panel.pace.value and "left" not in panel.pace.value
    stopped = _tune_panel(tmp_path / "stopped", stop_after=2)
    assert stopped.result.stopped and "stopped" in stopped.pace.value and "left" not in stopped.pace.value


def test_a_stopped_run_reads_stopped_in_the_log(tmp_path):
    from ortlab.widgets.log_panel import LogPanel

    path = new_run_dir(tmp_path, "pytorch")
    writer = RunWriter(path, {"backend": "pytorch", "config": {"steps": 9}})
    writer.step({"step": 0, "loss": 1.0})
    writer.finish(RunStatus.INTERRUPTED)  # what a Stop honoured after a step writes
    run = load_run(path)
    assert run.status == "interrupted"
    panel = LogPanel(lambda: [run])
    assert panel.run.options[0][0] == f"{path.name} (stopped)"


def test_the_graphs_tab_names_the_burst_tabs_checkbox(tmp_path):
    from ortlab.widgets.burst_panel import SAVE_GRAPHS
    from ortlab.widgets.graphs import GraphsPanel

    panel = GraphsPanel(lambda: [])
    assert SAVE_GRAPHS in panel.status.value and "save_onnx" not in panel.status.value
    path = new_run_dir(tmp_path, "ortmodule")
    RunWriter(path, {"backend": "ortmodule", "config": {}, "effective_options": {}}).finish(RunStatus.OK)
    panel = GraphsPanel(lambda: [load_run(path)])
    assert SAVE_GRAPHS in panel.status.value and "options=" not in panel.status.value, panel.status.value


def test_stop_looks_the_same_in_burst_and_tune(tmp_path):
    from ortlab.engine.session import Session
    from ortlab.options import Options
    from ortlab.widgets.burst_panel import BurstPanel
    from ortlab.widgets.tune import TunePanel

    session = Session(out=str(tmp_path), in_process=True)
    burst, tune = BurstPanel(session, Options), TunePanel(session)
    assert burst.stop_button.button_style == tune.stop_button.button_style == "warning"
    assert burst.stop_button.icon == tune.stop_button.icon == "stop"


def test_a_compile_burst_says_it_is_compiling_and_for_how_long():
    from ortlab.widgets.burst_panel import first_step

    assert first_step("compile", 37.2) == "compiling (torch.compile's first step) ... 37 s"
    assert first_step("ortmodule", 3).startswith("exporting to ONNX (ORTModule's first step) ... ")
    assert first_step("pytorch", 1) == "running PyTorch ... 1 s"


@pytest.mark.parametrize("steps", [3, 6, 20])
def test_the_loss_plot_counts_whole_steps(steps):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from ortlab.common.plots import loss_figure

    fig = loss_figure({"pytorch": [1.0 / (i + 1) for i in range(steps)]})
    FigureCanvasAgg(fig).draw()
    ticks = [t for t in fig.axes[0].get_xticks() if 0 <= t <= steps - 1]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
