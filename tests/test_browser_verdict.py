"""A diverged comparison in a real JupyterLab in Chromium: the Lab runs PyTorch and ORTModule on a model whose ORT
gradients are wrong (a squeeze-and-excitation block) and shows the verdict in red, never as a success."""

import json
import urllib.request

import pytest

from tests.test_browser import TOKEN, jupyterlab, page, run_all_cells, start_burst  # noqa: F401  (the same real JupyterLab and Chromium)

pytestmark = pytest.mark.slow

NOTEBOOK = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                       "source": 'import ortlab\nlab = ortlab.Lab("ortlab.demo.divergence:squeeze_excite", '
                                 'out="runs")\nlab'}],
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


def _put_notebook(base: str, name: str) -> None:
    body = json.dumps({"type": "notebook", "content": NOTEBOOK}).encode()
    request = urllib.request.Request(f"{base}/api/contents/{name}?token={TOKEN}", data=body, method="PUT",
                                     headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=30)


@pytest.mark.timeout(900)
@pytest.mark.ort
def test_a_diverged_comparison_is_shown_red_in_the_lab(jupyterlab, page, tmp_path, shots_dir):  # noqa: F811
    _put_notebook(jupyterlab, "verdict.ipynb")
    run_all_cells(jupyterlab, page, "verdict.ipynb")
    lab = page.locator(".jp-OutputArea .jupyter-widgets.widget-tab >> visible=true").first
    lab.wait_for(timeout=120_000)
    lab.locator(".lm-TabBar-tab", has_text="Burst").first.click()
    start_burst(lab, 3)
    verdict = lab.locator(".widget-html b", has_text="ortmodule verdict:").first
    try:
        verdict.wait_for(timeout=600_000)
        text = verdict.inner_text()
        assert "DIVERGED" in text and "fc2" in text, text
        color = verdict.evaluate("e => getComputedStyle(e).color")
        assert color == "rgb(204, 0, 0)", color  # red (#c00), not the green of an ok status
        assert "global-avg-pool" in lab.inner_text()  # the cause names its fix
        lab.screenshot(path=str(shots_dir / "lab-verdict.png"))
    except Exception:
        page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
        print(f"browser state at the failure: {tmp_path / 'failure.png'}")
        raise
