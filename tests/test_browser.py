"""A real JupyterLab in a real browser (Debian's Chromium driven by Playwright): open the quickstart notebook,
run it, press Run in the Burst panel, watch the loss curve and results appear, change an option and see the
re-wrap notice. Screenshots go to a temporary folder; to docs/img/ with ORTLAB_UPDATE_SCREENSHOTS=1."""

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "ortlab-browser-test"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("chromium") is None,
                                reason="Debian's chromium is not installed "
                                "(scripts/ensure-chromium installs it as root)")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served(command: list[str], root: Path, env: dict[str, str], ready: str, what: str):
    """A notebook server (`command`, run in `root`, its output in root/server.log) while the block runs, entered
    once `ready` (a URL) answers; a server that ends or does not answer in 2 minutes fails the test with
    its log."""
    proc = subprocess.Popen(command, cwd=root, env=env,
                            stdout=open(root / "server.log", "wb"),  # noqa: SIM115 (open as long as the server runs)
                            stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(ready, timeout=2)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"{what} did not start:\n" + (root / "server.log").read_text()[-3000:])
            time.sleep(0.5)
    try:
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def chromium_page(p):
    """Debian's Chromium (no network of its own, no GPU) and a page 1400x1000 that waits up to 2 minutes."""
    browser = p.chromium.launch(
        executable_path=shutil.which("chromium"),
        args=["--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
              "--disable-component-update", "--disable-sync"])
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(120_000)
    return browser, page


def in_chromium(drive, tmp_path, server_log: Path) -> None:
    """`drive(page)` in a fresh Chromium page; on a failure the page's screenshot and the server's log's tail are
    printed before the error is raised again."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser, page = chromium_page(p)
        try:
            drive(page)
        except Exception:
            page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
            print(f"browser state at the failure: {tmp_path / 'failure.png'}\nserver log:\n"
                  + server_log.read_text()[-3000:])
            raise
        finally:
            browser.close()


def jupyter_root(root: Path, tracker: str) -> dict[str, str]:
    """`root` ready for a Jupyter server (JupyterLab, Notebook 7): the quickstart with its outputs cleared, as a new
    user would start after "Clear All Outputs", and settings of its own (the notebook tracker's `tracker`, no news
    pop-up); returns the server's environment, whose settings and layout are not ones an earlier run left."""
    import nbformat

    nb = nbformat.read(ROOT / "notebooks" / "01_quickstart.ipynb", as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.write(nb, root / "01_quickstart.ipynb")
    settings = root / ".settings"
    (settings / "@jupyterlab" / "notebook-extension").mkdir(parents=True)
    (settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings").write_text(tracker)
    (settings / "@jupyterlab" / "apputils-extension").mkdir(parents=True)
    (settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        '{"fetchNews": "false", "checkForUpdates": false}')
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), JUPYTER_PLATFORM_DIRS="1",
                JUPYTERLAB_SETTINGS_DIR=str(settings), JUPYTERLAB_WORKSPACES_DIR=str(root / ".workspaces"))


@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab")
    # every cell rendered (no windowing), the notebook's kernel started: no "Select Kernel" dialog
    env = jupyter_root(root, '{"windowingMode": "none", "autoStartDefaultKernel": true}')
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    with served(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root", f"--ServerApp.port={port}",
         "--ServerApp.ip=127.0.0.1", f"--ServerApp.token={TOKEN}", f"--ServerApp.root_dir={root}",
         "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        root, env, f"{base}/api/status?token={TOKEN}", "JupyterLab"):
        yield base


@pytest.fixture(scope="module")
def page(jupyterlab):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser, page = chromium_page(p)
        yield page
        browser.close()


@pytest.mark.timeout(900)
@pytest.mark.ort
def test_quickstart_lab_in_chromium(jupyterlab, page, tmp_path, shots_dir):
    shots_dir.mkdir(parents=True, exist_ok=True)
    try:
        _drive(jupyterlab, page, shots_dir)
    except Exception:
        page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
        print(f"browser state at the failure: {tmp_path / 'failure.png'}")
        raise


def small_png(path) -> None:
    """A screenshot as a 64-colour PNG: a fraction of the size, as readable (docs/img keeps them)."""
    from PIL import Image

    Image.open(path).convert("RGB").quantize(colors=64).save(path, optimize=True)


def lab_shot(page, lab, path) -> None:
    """The Lab as far as the notebook shows it, from its top (an element screenshot of a panel taller than the
    notebook's scrolling area is grey below it), as a small PNG."""
    lab.evaluate("e => e.scrollIntoView({block: 'start'})")
    box = lab.bounding_box()
    shown = page.locator(".jp-NotebookPanel-notebook >> visible=true").first.bounding_box()
    bottom = min(box["y"] + box["height"], shown["y"] + shown["height"])
    page.screenshot(path=str(path), clip={"x": box["x"], "y": box["y"], "width": box["width"],
                                          "height": max(1, bottom - box["y"])})
    small_png(path)


def run_all_cells(jupyterlab, page, notebook: str) -> None:
    """Open `notebook` in JupyterLab, start its kernel and run every cell."""
    page.goto(f"{jupyterlab}/lab/tree/{notebook}?token={TOKEN}")
    page.locator(".jp-Notebook .jp-Cell >> visible=true").first.wait_for()  # JupyterLab may restore other tabs
    select = page.locator(".jp-Dialog button >> visible=true", has_text="Select")
    try:  # JupyterLab may ask which kernel to start
        select.first.wait_for(timeout=15_000)
        select.first.click()
    except Exception:
        pass
    idle = page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle'] >> visible=true")
    deadline = time.monotonic() + 300  # a loaded machine starts a kernel slowly, and may ask which one late
    while select.count() or not idle.count():
        if select.count():
            select.first.click()
        if time.monotonic() > deadline:
            idle.first.wait_for(timeout=1)  # fails, saying what it waited for
        time.sleep(0.5)
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()


def start_burst(lab, steps: int) -> None:
    """In the Lab's Burst tab (shown): set the number of steps and press Run."""
    field = lab.locator(".widget-text", has_text="steps").locator("input").first
    field.fill(str(steps))
    field.press("Enter")
    lab.locator("button.widget-button", has_text="Run").first.click()


def _drive(jupyterlab, page, shots):
    run_all_cells(jupyterlab, page, "01_quickstart.ipynb")

    lab = page.locator(".jp-OutputArea .jupyter-widgets.widget-tab >> visible=true").first
    lab.wait_for()
    # the notebook's own comparison finishes: its check cell prints "ok ok True"
    page.locator(".jp-OutputArea-output pre", has_text="ok ok True").first.wait_for(timeout=300_000)
    lab.scroll_into_view_if_needed()

    lab.locator(".lm-TabBar-tab", has_text="Burst").first.click()
    start_burst(lab, 8)
    lab.locator("table", has_text="final loss").first.wait_for(timeout=300_000)
    lab.locator(".widget-html", has_text="ortmodule: ok").first.wait_for()
    # the Lab's static results (for an exported HTML: ortlab.widgets.static) are in the notebook, hidden by the
    # Lab's stylesheet: the Lab shows once
    assert page.locator(".ortlab-static").count() >= 1 and page.locator(".ortlab-static >> visible=true").count() == 0
    assert lab.locator("img >> visible=true").count() == 1  # the loss curve
    assert "first export" in lab.inner_text() or "reuse" in lab.inner_text()
    lab.scroll_into_view_if_needed()
    lab_shot(page, lab, shots / "lab-burst.png")

    lab.locator(".lm-TabBar-tab", has_text="Options").first.click()
    lab.locator(".jupyter-widget-Collapse-header, .p-Collapse-header, .lm-Collapse-header",
                has_text="ORTMODULE/Optimizations").first.click()
    level = lab.locator(".widget-dropdown", has_text="ORTMODULE_MEMORY_OPT_LEVEL").locator("select").first
    level.select_option("1")
    notice = lab.locator(".widget-html", has_text="re-wraps and re-exports").first
    notice.wait_for()
    assert "memory_opt_level" in notice.inner_text()
    assert "export ORTMODULE_MEMORY_OPT_LEVEL=1" in lab.inner_text()
    lab_shot(page, lab, shots / "lab-options.png")

    lab.locator(".lm-TabBar-tab", has_text="Log").first.click()
    lab.locator(".widget-html pre >> visible=true", has_text="ORTModule is enabled").first.wait_for()
    lab_shot(page, lab, shots / "lab-log.png")

    # save the graphs of the next burst, run it on ORTModule only, and look at them in the Graphs tab
    lab.locator(".lm-TabBar-tab", has_text="Options").first.click()
    lab.locator(".jupyter-widget-Collapse-header, .p-Collapse-header, .lm-Collapse-header",
                has_text="ORTMODULE/DebugOptions").first.click()
    lab.locator(".widget-checkbox >> visible=true", has_text="save_onnx").locator("input").first.check()
    lab.locator(".widget-html", has_text="export ORTMODULE_MEMORY_OPT_LEVEL=1").first.wait_for()
    lab.locator(".lm-TabBar-tab", has_text="Burst").first.click()
    lab.locator("button >> visible=true", has_text="ORTModule").first.click()
    stop = lab.locator("button.widget-button", has_text="Stop").first
    lab.locator("button.widget-button", has_text="Run").first.click()
    page.wait_for_function("b => !b.disabled", arg=stop.element_handle(), timeout=60_000)
    page.wait_for_function("b => b.disabled", arg=stop.element_handle(), timeout=300_000)
    lab.locator(".lm-TabBar-tab", has_text="Graphs").first.click()
    graphs = lab.locator(".widget-html >> visible=true", has_text="execution_model").first
    graphs.wait_for(timeout=60_000)
    assert "recompute" in lab.inner_text()  # memory_opt_level=1 adds recompute nodes
    lab.locator(".lm-TabBar-tab", has_text="Graphs").first.scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "lab-graphs.png"))  # the viewport: the whole panel is taller than a screen
    small_png(shots / "lab-graphs.png")
