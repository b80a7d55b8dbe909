"""The Lab in Jupyter Notebook 7 (`jupyter notebook`) in a real browser, Debian's Chromium driven by Playwright: the
quickstart notebook opened in Notebook 7's own page, run, a burst from the Burst panel with its verdict, a Stop at a
shown step, and the Report tab's page. Notebook 7 renders ipywidgets as JupyterLab does, through the same widget
manager; this is the proof, not the assumption. Screenshots go to a temporary folder; to docs/img/ with
ORTLAB_UPDATE_SCREENSHOTS=1."""

import shutil
import sys

import pytest

from tests.test_browser import TOKEN, _free_port, in_chromium, jupyter_root, served, small_png, start_burst

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("chromium") is None,
                                reason="Debian's chromium is not installed "
                                "(scripts/ensure-chromium installs it as root)")]


@pytest.fixture(scope="module")
def notebook7(tmp_path_factory):
    pytest.importorskip("notebook", reason="Jupyter Notebook 7 is not installed (the lab extra installs it)")
    root = tmp_path_factory.mktemp("notebook7")
    env = jupyter_root(root, '{"windowingMode": "none"}')  # every cell rendered (no windowing)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    with served(
        [sys.executable, "-m", "jupyter", "notebook", "--no-browser", "--allow-root", f"--ServerApp.port={port}",
         "--ServerApp.ip=127.0.0.1", f"--ServerApp.token={TOKEN}", f"--ServerApp.root_dir={root}"],
        root, env, f"{base}/api/status?token={TOKEN}", "Jupyter Notebook 7"):
        yield base, root


@pytest.mark.timeout(900)
@pytest.mark.ort
def test_the_lab_in_notebook7_runs_a_burst_stops_one_and_writes_a_report(notebook7, tmp_path, shots_dir):
    base, root = notebook7
    shots_dir.mkdir(parents=True, exist_ok=True)
    in_chromium(lambda page: _drive(page, base, shots_dir), tmp_path, root / "server.log")


def _run_all(page, base) -> None:
    """Open the quickstart in Notebook 7's notebook page, wait for its kernel, run every cell."""
    page.goto(f"{base}/notebooks/01_quickstart.ipynb?token={TOKEN}")
    page.locator(".jp-Notebook .jp-Cell >> visible=true").first.wait_for()
    idle = page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle'] >> visible=true")
    idle.first.wait_for(timeout=300_000)  # its kernel connected (a loaded machine starts one slowly)
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()


def _drive(page, base, shots):
    from playwright.sync_api import expect

    _run_all(page, base)
    lab = page.locator(".jp-OutputArea .jupyter-widgets.widget-tab >> visible=true").first
    lab.wait_for(timeout=300_000)
    lab.scroll_into_view_if_needed()
    lab.locator(".lm-TabBar-tab", has_text="Burst").first.click()

    # a burst of both backends: the results table, the loss curve, the verdict
    start_burst(lab, 6)
    lab.locator("table", has_text="final loss").first.wait_for(timeout=300_000)
    lab.locator(".widget-html", has_text="ortmodule: ok").first.wait_for()
    assert lab.locator("img >> visible=true").count() >= 1 and "verdict" in lab.inner_text()
    assert page.locator(".ortlab-static >> visible=true").count() == 0  # the static copy hidden where widgets render
    lab.evaluate("e => e.scrollIntoView({block: 'start'})")
    box = lab.bounding_box()
    page.screenshot(path=str(shots / "notebook7-lab-burst.png"), clip={
        "x": box["x"], "y": box["y"], "width": box["width"], "height": max(1, min(box["height"], 1000 - box["y"]))})
    small_png(shots / "notebook7-lab-burst.png")

    # a Stop at a shown step
    run = lab.locator("button.widget-button", has_text="Run").first
    expect(run).to_be_enabled(timeout=300_000)
    start_burst(lab, 400)
    page.wait_for_function("e => /step \\d+\\/\\d+/.test(e.innerText)", arg=lab.element_handle(), timeout=300_000)
    lab.locator("button.widget-button", has_text="Stop").first.click()
    page.wait_for_function("e => /stopped by you/.test(e.innerText)", arg=lab.element_handle(), timeout=300_000)
    expect(run).to_be_enabled(timeout=60_000)

    # the Report tab writes the newest comparison's page
    lab.locator(".lm-TabBar-tab", has_text="Report").first.click()
    lab.locator("button.widget-button >> visible=true", has_text="Write report").first.click()
    page.wait_for_function("e => /wrote \\S+[.]html/.test(e.innerText)", arg=lab.element_handle(), timeout=120_000)
    assert "the newest comparison" in lab.inner_text()
