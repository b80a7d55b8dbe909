"""The Activations panel without a browser: set values, click, check what it shows."""

from __future__ import annotations

from pathlib import Path

import pytest

from ortlab import Session
from ortlab.widgets.activations import ActivationsPanel

FACTORIES = Path(__file__).parent / "factories" / "activations.py"
STATS = {"stats": {}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    with Session(f"{FACTORIES}:injected", {"step": None}, out=out, in_process=True) as s:
        c = s.compare(3, parity=True, progress=False, collect=STATS)
        plain = s.burst("pytorch", 1, progress=False)  # no statistics: not offered
    with Session(f"{FACTORIES}:injected", {"step": 1}, out=out, in_process=True) as s:
        injected = s.burst("pytorch", 3, parity=True, progress=False, collect=STATS)
    return [c.pytorch, c.ortmodule, plain, injected]


@pytest.mark.slow  # its runs export with ORTModule
@pytest.mark.ort
def test_panel_compares_and_highlights_the_first_divergence(runs):
    pt, ort, _, injected = runs
    panel = ActivationsPanel(lambda: runs)
    assert len(panel.a.options) == 3
    assert panel.a.value == str(injected.path) and panel.b.value == str(ort.path)  # newest of each backend
    panel.a.value = str(pt.path)
    panel.compare_button.click()
    assert "no divergence beyond tolerance" in panel.status.value
    assert bytes(panel.heatmap.value).startswith(b"\x89PNG")
    labels = [label for label, _ in panel.tensor.options]
    assert labels[0] == "tok" and labels[-1] == "grad tok" and "grad blocks.1.mlp.0" in labels

    panel.b.value = str(injected.path)
    diff = panel.compare()
    assert diff.first.name == "blocks.1.mlp.0"
    assert "first divergence: step 1, forward: blocks.1.mlp.0" in panel.status.value
    assert "#c00" in panel.status.value
    assert panel.tensor.value == ("forward", "blocks.1.mlp.0")
    assert bytes(panel.tensor_plot.value).startswith(b"\x89PNG")
    before = bytes(panel.tensor_plot.value)
    panel.tensor.value = ("backward", "head")
    assert bytes(panel.tensor_plot.value) != before and "mean of a" in panel.tensor_stats.value
    assert repr(panel) == "ActivationsPanel(runs=3, first divergence: 'blocks.1.mlp.0' at step 1)"


def test_errors_stay_inside_the_panel(tmp_path, capsys):
    panel = ActivationsPanel()
    panel.a_path.value, panel.b_path.value = str(tmp_path / "missing"), str(tmp_path)
    assert panel.compare() is None
    assert "#c00" in panel.status.value and "does not exist" in panel.status.value
    assert capsys.readouterr().err == ""
    empty = ActivationsPanel()
    assert "no run with statistics yet" in empty.status.value and "record activation statistics" in empty.status.value
    empty.compare_button.click()
    assert "choose two runs" in empty.status.value
    assert repr(empty) == "ActivationsPanel(runs=0, first divergence: not compared)"


def test_the_lab_has_an_activations_tab(tmp_path):
    from ortlab.widgets.lab import Lab

    lab = Lab(out=str(tmp_path), in_process=True)
    try:
        assert isinstance(lab.extra_panels["Activations"], ActivationsPanel)
        assert "Activations" in lab.titles
    finally:
        lab.close()
