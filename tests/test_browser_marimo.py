"""The Lab in a marimo notebook in a real browser: `marimo edit` headless on notebooks/lab_marimo.py, Debian's
Chromium driven by Playwright. marimo renders anywidget, not ipywidgets' containers: the Lab shows as its anywidget
mirror (ortlab.widgets.mirror), and a burst (Run), a Stop and the Report tab work through it. Screenshots go to a
temporary folder; to docs/img/ with ORTLAB_UPDATE_SCREENSHOTS=1."""

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.test_browser import _free_port, in_chromium, served, small_png

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("chromium") is None,
                                reason="Debian's chromium is not installed "
                                "(scripts/ensure-chromium installs it as root)")]


@pytest.fixture(scope="module")
def marimo_edit(tmp_path_factory):
    pytest.importorskip("marimo")
    root = tmp_path_factory.mktemp("marimo")
    shutil.copy(ROOT / "notebooks" / "lab_marimo.py", root / "lab_marimo.py")
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
               XDG_CONFIG_HOME=str(root / ".config"), XDG_STATE_HOME=str(root / ".state"),  # marimo's defaults
               XDG_CACHE_HOME=str(root / ".cache"))
    base = f"http://127.0.0.1:{port}"
    with served(
        [sys.executable, "-m", "marimo", "edit", "--headless", "--no-token", "--skip-update-check", "--no-sandbox",
         "--host", "127.0.0.1", "--port", str(port), "lab_marimo.py"],
        root, env, f"{base}/health", "marimo"):
        yield base, root


@pytest.mark.timeout(900)
@pytest.mark.ort
def test_the_lab_in_marimo_runs_a_burst_stops_one_and_writes_a_report(marimo_edit, tmp_path, shots_dir):
    base, root = marimo_edit
    shots_dir.mkdir(parents=True, exist_ok=True)
    in_chromium(lambda page: _drive(page, base, root, shots_dir), tmp_path, root / "server.log")


def _button(lab, name: str):
    return lab.locator("button.m-button", has_text=re.compile(rf"^\W*{name}$")).first


def _steps(lab, steps: int) -> None:
    field = lab.locator("label.m-field", has_text="steps").locator("input").first
    field.fill(str(steps))
    field.press("Enter")
    field.evaluate("e => e.blur()")


def _drive(page, base, root, shots):
    from playwright.sync_api import expect

    page.goto(base)
    lab = page.locator(".ortlab-m").first
    run_all = page.locator("button[data-testid=run-button]").last  # the notebook's cells, when not run on opening
    run_all.wait_for()
    try:
        lab.wait_for(timeout=10_000)
    except Exception:
        run_all.click()
    lab.wait_for(timeout=300_000)  # the kernel runs the notebook: ortlab imported, the Lab built
    lab.locator(".m-tabbar button", has_text="Burst").first.click()

    # a burst of both backends: the results table, the loss plot, the verdict
    _steps(lab, 6)
    _button(lab, "Run").click()
    lab.locator("table", has_text="final loss").first.wait_for(timeout=300_000)
    page.wait_for_function("e => /ortmodule: ok/.test(e.innerText)", arg=lab.element_handle(), timeout=60_000)
    assert lab.locator("img >> visible=true").count() >= 1  # the loss curve
    assert "verdict" in lab.inner_text()
    lab.evaluate("e => e.scrollIntoView({block: 'start'})")
    box = lab.bounding_box()  # the Lab as far as the window shows it (below it marimo's own controls float)
    page.screenshot(path=str(shots / "marimo-lab-burst.png"), clip={
        "x": box["x"], "y": box["y"], "width": box["width"], "height": max(1, min(box["height"], 1000 - box["y"]))})
    small_png(shots / "marimo-lab-burst.png")

    # a Stop: a long burst stopped once its steps show
    expect(_button(lab, "Run")).to_be_enabled(timeout=300_000)  # the first burst judged and ended
    _steps(lab, 400)
    _button(lab, "Run").click()
    stop = _button(lab, "Stop")
    page.wait_for_function("e => /step \\d+\\/\\d+/.test(e.innerText)", arg=lab.element_handle(), timeout=300_000)
    stop.click()
    page.wait_for_function("e => /stopped by you/.test(e.innerText)", arg=lab.element_handle(), timeout=300_000)
    expect(_button(lab, "Run")).to_be_enabled(timeout=60_000)  # the burst ended: Run again

    # the Report tab writes the newest comparison's page
    lab.locator(".m-tabbar button", has_text="Report").first.click()
    _button(lab, "Write report").click()
    page.wait_for_function("e => /wrote \\S+[.]html/.test(e.innerText)", arg=lab.element_handle(), timeout=120_000)
    assert "the newest comparison" in lab.inner_text()
