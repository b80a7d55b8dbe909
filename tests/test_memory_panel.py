"""The Lab's Memory panel without a browser: set values, read what it shows. Runs are folders with the
memory.json a burst's collector writes, from accounts of hand-built graphs (fast); one real comparison in the
Lab (slow)."""

import pytest

from ortlab.account import memory, torch_memory
from ortlab.runs.run import load_run
from ortlab.widgets.memory import MemoryPanel
from tests.test_account import (
    autograd_record,
    fake_run,
    graph_record,
    recompute_graph,
    tiny_training_graph,
    torch_input,
    torch_module,
)


@pytest.fixture
def runs(tmp_path):
    """An ORTModule run at level 1 (the recompute graph), a PyTorch run then an ORTModule run (a comparison),
    an ORTModule run without an account (save_onnx off), as a session would list them, oldest first."""
    from ortlab.runs.memory import GRAPH, missing

    recompute = memory(recompute_graph(tmp_path / "r_execution_model_training.onnx"))
    tiny = memory(tiny_training_graph(tmp_path / "t_execution_model_training.onnx"), dims={"batch": 2})
    saved = torch_memory(torch_module(), torch_input())
    folders = [
        fake_run(tmp_path / "20260101-000000-ortmodule", "ortmodule", graph_record(recompute),
                 {"save_onnx": True, "memory_opt_level": 1}),
        fake_run(tmp_path / "20260101-000001-pytorch", "pytorch", autograd_record(saved), peak_mem_mb=600),
        fake_run(tmp_path / "20260101-000002-ortmodule", "ortmodule", graph_record(tiny), {"save_onnx": True},
                 peak_mem_mb=600),
        fake_run(tmp_path / "20260101-000003-ortmodule", "ortmodule",
                 missing(GRAPH, "ORT writes its execution graph only when the burst saves its graphs")),
    ]
    return [load_run(f) for f in folders]


def test_nothing_is_shown_until_there_is_an_account(runs):
    shown: list = []
    panel = MemoryPanel(lambda: shown)
    assert panel.timeline.value == b"" and panel.timeline.layout.display == "none"
    assert panel.peak.value == "" and panel.backends.value == ""
    assert "no ORTModule run with a memory account yet" in panel.status.value
    shown.append(runs[3])  # an ORTModule run whose burst saved no graph: the reason is shown
    panel.refresh()
    assert "saves its graphs" in panel.status.value and panel.timeline.layout.display == "none"
    assert repr(panel) == "MemoryPanel(runs=0, shown=[])"


def test_pick_one_run_then_a_second_beside_it(runs):
    shown = list(runs)
    panel = MemoryPanel(lambda: shown)
    # the newest ORTModule run with a graph account is picked; the one without an account is not listed; each is
    # named by what sets it apart (an option set for one of them), never by an option nobody set
    assert [label for label, _ in panel.a.options] == [
        "default options (20260101-000002-ortmodule)", "memory_opt_level=1 (20260101-000000-ortmodule)"]
    assert panel.a.value == str(runs[2].path) and panel.b.value == ""
    assert panel.timeline.value[:4] == b"\x89PNG" and panel.timeline.layout.display is None
    one = panel.timeline.value
    assert "peak 0.00 MB" in panel.peak.value and "ReluGrad" in panel.peak.value and "<table" in panel.peak.value
    assert panel.peak.value.count("</tr>") == 1 + 4  # the header and the four buffers alive at the peak
    panel.top_n.value = 2
    assert panel.peak.value.count("</tr>") == 1 + 2
    panel.b.value = str(runs[0].path)
    assert panel.timeline.value != one and panel.peak.value.count("<p ") == 2
    assert "memory_opt_level=1" in panel.peak.value and "memory_efficient" in panel.peak.value
    labels = [label for label, _ in panel.accounts()]
    assert labels == ["default options", "memory_opt_level=1"]
    assert repr(panel) == "MemoryPanel(runs=2, shown=['20260101-000002-ortmodule', '20260101-000000-ortmodule'])"
    panel.refresh()  # a refresh after another burst keeps the choice
    assert (panel.a.value, panel.b.value) == (str(runs[2].path), str(runs[0].path))


def test_pytorch_beside_ortmodule_for_the_last_comparison(runs):
    panel = MemoryPanel(lambda: runs)
    text = panel.backends.value
    assert "PyTorch vs ORTModule activation memory" in text
    assert "20260101-000001-pytorch" in text and "20260101-000002-ortmodule" in text
    assert "kept for backward (MB)" in text and "peak resident set (MB, the whole process)" in text
    assert "autograd saves" in text and "execution graph" in text and ">600</td>" in text
    assert "ORTModule keeps" in text and "the bytes PyTorch keeps for backward" in text


def test_a_damaged_account_is_named_not_raised(runs):
    (runs[2].path / "memory.json").write_text("{not json")
    panel = MemoryPanel(lambda: runs)
    assert [p for _, p in panel.a.options] == [str(runs[0].path)]
    assert panel.timeline.value[:4] == b"\x89PNG"


def test_the_lab_has_a_memory_tab(tmp_path):
    from ortlab import Lab

    lab = Lab(out=tmp_path, in_process=True, cuda_available=False)
    try:
        assert "Memory" in lab.titles and isinstance(lab.extra_panels["Memory"], MemoryPanel)
        assert lab.burst_panel.account_memory.value is True
        assert lab.extra_panels["Memory"].timeline.layout.display == "none"
    finally:
        lab.close()


@pytest.mark.slow
@pytest.mark.ort
def test_a_comparison_in_the_lab_shows_in_the_memory_tab(tmp_path):
    """The Burst panel's defaults account both backends; the Memory tab then draws the ORTModule run and puts
    PyTorch beside it; the results table has the accounted columns."""
    from ortlab import Lab

    lab = Lab(out=tmp_path, in_process=True, cuda_available=False)
    try:
        panel = lab.burst_panel
        panel.steps.value = 2
        panel.run_button.click()
        panel.wait(600)
        pytorch, ortmodule = lab.runs[-2:]
        assert pytorch.ok and ortmodule.ok, (pytorch.error, ortmodule.error)
        assert pytorch.memory["kind"] == "autograd" and ortmodule.memory["kind"] == "graph"
        assert "kept for backward (MB)" in panel.results.value and "peak resident set (MB)" in panel.results.value
        view = lab.extra_panels["Memory"]
        assert view.a.value == str(ortmodule.path) and view.timeline.value[:4] == b"\x89PNG"
        assert "PyTorch vs ORTModule activation memory" in view.backends.value
        assert "blocks." in view.peak.value  # the largest tensors at the peak, named by module
    finally:
        lab.close()
