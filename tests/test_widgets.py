"""The Lab's panels without a browser: set values, click buttons, read what they show."""

import html

import pytest

from ortlab import Lab, Options
from ortlab.widgets.options_panel import OptionsPanel


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    lab = Lab(out=tmp_path_factory.mktemp("lab"), in_process=True, cuda_available=False)
    yield lab
    lab.close()


def test_options_panel_controls_and_export_lines():
    panel = OptionsPanel(cuda_available=False)
    assert repr(panel) == "OptionsPanel(32 options, changed=[], invalid=[])"
    assert "all defaults" in panel.export_lines.value
    panel.controls["memory_opt_level"].value = 1
    panel.controls["log_level"].value = "INFO"
    assert panel.options == Options(memory_opt_level=1, log_level="INFO")
    assert "export ORTMODULE_MEMORY_OPT_LEVEL=1" in panel.export_lines.value
    assert "changed" in panel.status["memory_opt_level"].value
    panel.reset()
    assert panel.options == Options()


def test_cuda_options_are_disabled_on_cpu_with_the_reason():
    panel = OptionsPanel(cuda_available=False)
    assert panel.controls["use_triton"].disabled and "needs CUDA" in panel.status["use_triton"].value
    assert not panel.controls["memory_opt_level"].disabled
    assert not OptionsPanel(cuda_available=True).controls["use_triton"].disabled


def test_invalid_input_is_shown_at_the_control():
    panel = OptionsPanel(cuda_available=True)
    panel.controls["max_tuning_duration_ms"].value = "-5"
    assert "max_tuning_duration_ms" in panel.errors
    assert "allowed" in panel.status["max_tuning_duration_ms"].value
    assert "invalid" in panel.notice.value and "max_tuning_duration_ms" not in panel.options
    panel.controls["max_tuning_duration_ms"].value = "250"
    assert not panel.errors and panel.options["max_tuning_duration_ms"] == 250


def test_rewrap_notice_follows_the_last_ortmodule_burst():
    panel = OptionsPanel(cuda_available=False)
    assert "first export" in panel.notice.value
    panel.reference = Options()
    panel._refresh()
    assert "reuses the ORTModule" in panel.notice.value
    panel.controls["memory_opt_level"].value = 2
    assert "re-wraps and re-exports" in panel.notice.value and "memory_opt_level" in panel.notice.value
    panel.controls["enable_custom_autograd"].value = False
    assert "new worker" in panel.notice.value


def test_the_strategy_is_offered_with_ranks_and_reaches_the_burst(lab):
    """The strategy control wakes with more than one process, and what it says reaches the burst: a strategy the
    settings rule out is refused in one line inside the panel before any rank starts."""
    panel = lab.burst_panel
    backend, steps = panel.backend.value, panel.steps.value  # the module's lab: what the next tests find
    assert panel.strategy.disabled and panel.strategy.value == "ddp"
    assert list(panel.strategy.options) == ["ddp", "zero1", "fsdp2"]
    panel.backend.value, panel.steps.value, panel.nproc.value = "pytorch", 1, 2
    assert not panel.strategy.disabled
    panel.strategy.value, panel.optimizer.value = "zero1", "sgd"  # zero1 shards AdamW's state
    made = len(lab.runs)
    try:
        panel.run_button.click()
        panel.wait(60)
    finally:
        panel.nproc.value, panel.strategy.value, panel.optimizer.value = 1, "ddp", "auto"
        panel.backend.value, panel.steps.value = backend, steps
    assert panel.strategy.disabled
    status = html.unescape(panel.status.value)
    assert "strategy 'zero1' with optimizer 'sgd' is not allowed" in status and len(lab.runs) == made


@pytest.mark.slow
@pytest.mark.ort
def test_burst_panel_runs_both_backends_and_shows_results(lab):
    panel = lab.burst_panel
    panel.steps.value = 3
    panel.run_button.click()
    panel.wait(300)
    assert "pytorch: ok" in panel.status.value and "ortmodule: ok" in panel.status.value
    assert panel.progress.value == 6
    assert panel.plot.value[:4] == b"\x89PNG"
    assert "final loss" in panel.results.value and "first export" in panel.transitions.value
    assert [r.backend for r in lab.runs[-2:]] == ["pytorch", "ortmodule"]
    assert "reuses the ORTModule" in lab.options_panel.notice.value
    assert repr(panel) == "BurstPanel(backend='both', steps=3, parity=True, running=False)"


@pytest.mark.interrupt
def test_stop_button_stops_a_running_burst(lab):
    import threading

    panel = lab.burst_panel
    panel.backend.value, panel.steps.value = "pytorch", 100_000
    three_steps = threading.Event()
    watch = lambda change: three_steps.set() if change["new"] >= 3 else None  # noqa: E731
    panel.progress.observe(watch, "value")
    try:
        panel.run_button.click()
        assert three_steps.wait(300), "the burst did not reach step 3"
        panel.stop_button.click()
        panel.wait(300)
    finally:
        panel.progress.unobserve(watch, "value")
    assert not panel.running
    assert lab.runs[-1].status in ("interrupted", "stopped")
    # the user's own Stop reads as one, in grey, not as a failure in red
    assert "stopped by you after step" in panel.status.value and "#c00" not in panel.status.value
    assert 3 <= len(lab.runs[-1].metrics) < 100_000
    assert "step " in panel.pace.value and "/100000" in panel.pace.value
    # what the line says once stopped: where, and no time left (tests/test_stale_words.py has the other stale words)
    assert "stopped at step" in panel.pace.value and "left" not in panel.pace.value, panel.pace.value


def test_errors_stay_inside_the_panel(lab, capsys):
    panel = lab.burst_panel
    panel.backend.value, panel.steps.value = "pytorch", 1
    panel.precision.value = "fp16"  # needs CUDA
    panel.run_button.click()
    panel.wait(60)
    panel.precision.value = "fp32"
    status = panel.status.value
    assert "precision &#x27;fp16&#x27; needs CUDA" in status or "precision 'fp16' needs CUDA" in status
    assert capsys.readouterr().out == ""


@pytest.mark.slow
@pytest.mark.ort
def test_log_panel_filters(lab):
    lab.burst("ortmodule", 1, progress=False)  # a run of its own with ORT's log: no leaning on earlier tests
    log = lab.log_panel
    log.refresh()
    assert log.run.options and repr(log).startswith("LogPanel(runs=")
    everything = len(log.records())
    log.level.value = "ERROR and above"
    assert len(log.records()) <= everything
    log.level.value = "all"
    log.search.value = "no such text anywhere"
    assert log.records() == [] and "no log records match" in log.view.value
    log.search.value = ""


def test_lab_repr_is_short_and_deterministic(lab):
    assert repr(lab).startswith("Lab(model='ortlab.demo:gpt', tabs=[Options, Burst, Log")


def test_the_backends_offered_are_the_ones_that_run_here(lab):
    """On the ort stack: PyTorch, ORTModule, torch.compile, both (PyTorch and ORTModule) and all. On the current
    stack ORTModule is not offered, both is PyTorch and torch.compile, and ORTModule's own tabs say why and where."""
    import html

    from ortlab.engine.backends import default_backends, unavailable

    offered = [value for _, value in lab.burst_panel.backend.options]
    shown = dict((value, label) for label, value in lab.burst_panel.backend.options)
    assert lab.burst_panel.choices["both"] == list(default_backends())
    if unavailable("ortmodule") is None:  # "both" means what the CLI's --backend both means: PyTorch and ORTModule
        assert offered == ["pytorch", "ortmodule", "compile", "both", "all"] and shown["both"] == "both"
        assert lab.burst_panel.choices["both"] == ["pytorch", "ortmodule"] and lab.ortmodule_missing is None
    else:
        from ortlab.widgets.burst_panel import elsewhere_choices  # ORTModule in the ort stack's worker, if ready

        assert offered == ["pytorch", "compile", "both", *elsewhere_choices()]
        assert lab.burst_panel.choices["both"] == ["pytorch", "compile"]
        assert shown["both"] == "PyTorch + torch.compile"  # not "both", which means PyTorch and ORTModule
        for title in ("Recompute", "Tune"):
            shown = html.unescape(lab.children[lab.titles.index(title)].children[-1].value)
            assert f"The {title} tab is ORTModule's. ORTModule does not run here" in shown, shown
            assert "ORTLAB_STACK=ort" in shown
        assert "These options are ORTModule's" in html.unescape(lab.options_panel.children[1].value)


def test_every_tab_starts_with_the_models_name_and_its_rows_wrap(lab):
    import ipywidgets as W

    assert "ortlab.demo:gpt" in lab.header.value and "ortlab-lab" in lab._dom_classes
    for panel in lab.children:
        if isinstance(panel, W.Box):
            assert panel.children[0] is lab.header
    rows = [c for c in lab.burst_panel.children if isinstance(c, W.HBox)]
    assert rows and all(r.layout.flex_flow == "row wrap" for r in rows)
    boxes = [c for r in rows for c in r.children if isinstance(c, W.Checkbox)]
    assert {b.description for b in boxes} >= {"profile where the time goes", "overlay earlier runs"}
    assert all(b.layout.width == "auto" and not b.indent for b in boxes)  # as wide as its label


@pytest.mark.slow
@pytest.mark.ort
def test_burst_panel_records_statistics_and_graphs_without_code(lab):
    panel = lab.burst_panel
    panel.backend.value, panel.steps.value = "both", 2
    panel.record_stats.value, panel.save_graphs.value = True, True
    try:
        panel.run_button.click()
        panel.wait(600)
    finally:
        panel.record_stats.value, panel.save_graphs.value = False, False
    pytorch, ortmodule = lab.runs[-2:]
    assert pytorch.ok and ortmodule.ok, (pytorch.error, ortmodule.error)
    assert (pytorch.path / "stats.npz").is_file() and (ortmodule.path / "stats.npz").is_file()
    assert list((ortmodule.path / "onnx").glob("*_execution_model_training.onnx"))
    assert ortmodule.meta["config"]["collect"] == {"memory": {}, "stats": {}}  # the memory account: on by default
    assert "ortmodule verdict:" in panel.status.value and "recommendation: " in panel.status.value  # after the verdict


def test_figure_areas_show_nothing_until_they_hold_a_figure(lab):
    """An empty Image is a broken-image icon in JupyterLab: every figure area of every tab starts hidden."""
    import ipywidgets as W

    def images(widget):
        if isinstance(widget, W.Image):
            yield widget
        for child in getattr(widget, "children", ()):
            yield from images(child)

    found = [img for panel in lab.children for img in images(panel)]
    assert len(found) >= 5
    for img in found:
        if not img.value:
            assert img.layout.display == "none", img
    from ortlab.widgets.images import figure_area

    area = figure_area()
    area.value = b"\x89PNG\r\n\x1a\n"
    assert area.layout.display is None
    area.value = b""
    assert area.layout.display == "none"


@pytest.mark.slow
@pytest.mark.ort
def test_the_check_button_and_a_fallback_that_is_not_green(tmp_path):
    """Check lists the blockers and chooses the fixes; a burst that fell back is shown as such, not in green."""
    from pathlib import Path

    model = str(Path(__file__).parent / "factories" / "compat.py") + ":fixable"
    lab = Lab(model, out=tmp_path, in_process=True, cuda_available=False)
    panel = lab.burst_panel
    panel.backend.value, panel.steps.value = "ortmodule", 2
    panel.run(wait=True)
    assert panel.last_runs[0].status == "fallback"
    assert "#d35400" in panel.status.value and "#080" not in panel.status.value
    assert "fallback" in panel.results.value
    panel.check(wait=True)
    assert panel.last_check.status == "fixed" and "diff" in panel.check_result.value
    assert panel.fixes.value == "auto"  # Check chose the fixes for the next Run
    panel.run(wait=True)
    assert panel.last_runs[0].ok and "diff, cumsum-int64" in panel.results.value
    lab.close()


@pytest.mark.slow
def test_earlier_runs_are_overlaid_and_named_by_what_sets_them_apart(lab):
    panel = lab.burst_panel
    panel.backend.value, panel.steps.value = "pytorch", 3
    panel.run(wait=True)
    panel.steps.value, panel.overlay.value = 4, True
    try:
        panel.run(wait=True)
    finally:
        panel.overlay.value = False
    assert panel.last_runs[0].ok
    earlier = [label for label in panel._earlier if label.startswith("earlier: pytorch")]
    assert any(label.startswith("earlier: pytorch · steps 3") for label in earlier), earlier  # named by its steps
    assert panel.plot.value[:4] == b"\x89PNG" and panel.save_plot.save().suffix == ".png"
