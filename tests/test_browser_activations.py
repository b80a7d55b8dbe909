"""The Lab stays current in a real JupyterLab in Chromium: with "record activation statistics" switched on, one Run
of PyTorch and ORTModule, and the Activations tab shows their comparison and first divergence without a line of
code (a squeeze-and-excitation block, whose ORT gradients are wrong on the CPU: they diverge in the backward)."""

import pytest

from tests.test_browser import TOKEN, jupyterlab, page, run_all_cells, start_burst  # noqa: F401  (the same real JupyterLab and Chromium)
from tests.test_browser_verdict import _put_notebook

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
@pytest.mark.ort
def test_statistics_switch_run_then_activations_compare_shows_the_first_divergence(
        jupyterlab, page, tmp_path, shots_dir):  # noqa: F811
    _put_notebook(jupyterlab, "activations.ipynb")
    run_all_cells(jupyterlab, page, "activations.ipynb")
    lab = page.locator(".jp-OutputArea .jupyter-widgets.widget-tab >> visible=true").first
    lab.wait_for(timeout=120_000)
    try:
        lab.locator(".lm-TabBar-tab", has_text="Activations").first.click()
        lab.locator(".widget-html >> visible=true", has_text="no run with statistics yet").first.wait_for()
        lab.locator(".lm-TabBar-tab", has_text="Burst").first.click()
        lab.locator(".widget-checkbox >> visible=true", has_text="record activation statistics").locator(
            "input").first.check()
        start_burst(lab, 3)
        lab.locator(".widget-html b", has_text="ortmodule verdict:").first.wait_for(timeout=600_000)
        lab.locator(".lm-TabBar-tab", has_text="Activations").first.click()
        status = lab.locator(".widget-html >> visible=true", has_text="first divergence: step").first
        status.wait_for(timeout=120_000)  # shown by the tab itself after the burst
        assert "no run with statistics yet" not in lab.inner_text()
        lab.locator("button.widget-button >> visible=true", has_text="Compare").first.click()
        status.wait_for(timeout=120_000)
        text = status.inner_text()
        assert "pytorch" in text and "ortmodule" in text and "backward" in text, text
        assert lab.locator("img >> visible=true").count() >= 1  # the heatmap
        lab.screenshot(path=str(shots_dir / "lab-activations.png"))
    except Exception:
        page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
        print(f"browser state at the failure: {tmp_path / 'failure.png'}")
        raise
