"""The Lab beyond JupyterLab's widgets. Its last results where no widget front end runs (ortlab.widgets.static):
displayed beside its widgets as an output of their own, updated after every burst, hidden by the Lab's stylesheet
where the widgets render; slow: a notebook executed by nbclient and exported by `jupyter nbconvert --to html` shows
them, read in Chromium offline. And the Lab as one anywidget (ortlab.widgets.mirror), what marimo displays: the
real Lab's tree as JSON, an event from the browser done on the real widget, a trait change sent as its node."""

import base64
import json
import shutil
import subprocess
import sys

import pytest

from ortlab.widgets.mirror import ESM, Mirror
from ortlab.widgets.static import STATIC_CLASS, results_html

PNG = b"\x89PNG"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    from ortlab import Lab

    lab = Lab(out=tmp_path_factory.mktemp("lab"), in_process=True, cuda_available=False)
    yield lab
    lab.close()


def _images(text: str) -> list[bytes]:
    import re

    return [base64.b64decode(m) for m in re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", text)]


def test_no_burst_yet_says_so_and_names_the_model(lab):
    text = lab.static_html()
    assert f"class='{STATIC_CLASS}'" in text and "no burst yet" in text and "ortlab.demo:gpt" in text
    assert "<style" not in text  # the Lab's stylesheet hides the static results: it must not carry it


def test_the_lab_shows_its_widgets_then_static_results_that_each_burst_updates(lab):
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.display import display
    from IPython.utils.capture import capture_output

    InteractiveShell.instance()
    try:
        with capture_output() as shown:
            display(lab)
            lab.burst("pytorch", steps=3)
    finally:
        InteractiveShell.clear_instance()
    widgets, static, update = shown.outputs[0].data, shown.outputs[1], shown.outputs[-1]
    assert json.loads(json.dumps(widgets["application/vnd.jupyter.widget-view+json"]))["model_id"] == lab.model_id
    assert "text/html" not in widgets  # JupyterLab shows the widgets; the static results are the next output
    assert "no burst yet" in static.data["text/html"]
    # the update: the same display id, now with the burst's loss plot and facts
    text = update.data["text/html"]
    assert "pytorch: ok" in text and "final loss" in text and lab.runs[-1].path.name in text
    assert [img[:4] for img in _images(text)] == [PNG]
    assert "no burst yet" not in text


def test_the_labs_stylesheet_hides_the_static_results_where_the_widgets_render():
    from ortlab.widgets.layout import STYLE

    assert f".jp-OutputArea-child:has(.{STATIC_CLASS})" in STYLE and f".{STATIC_CLASS} {{ display: none" in STYLE


def test_results_html_of_runs_holds_their_plot_status_and_facts(demo_session):
    run = demo_session.burst("pytorch", 3)
    text = results_html("<b>model</b> demo", [run], "<b>pytorch: ok</b>", distances=PNG + b"x")
    assert text.index("pytorch: ok") < text.index("data:image/png") < text.index("final loss")
    assert [img[:4] for img in _images(text)] == [PNG, PNG]
    assert run.path.name in text


class Recorded(Mirror):
    """The mirror with what it sends kept (the comm outside a kernel sends nowhere)."""

    def send(self, content, buffers=None):
        self.__dict__.setdefault("sent", []).append(json.loads(json.dumps(content)))


def test_the_mirror_holds_the_real_labs_tree_as_json(lab):
    mirror = Recorded(lab)
    nodes = json.loads(json.dumps(mirror.nodes))  # plain JSON, as the browser gets it
    root = nodes[mirror.root]
    assert mirror.root == lab.model_id and root["kind"] == "tab" and "ortlab-lab" in root["classes"]
    assert root["titles"][:3] == ["Options", "Burst", "Log"] and "Report" in root["titles"]
    assert root["selected_index"] == lab.selected_index
    for node in nodes.values():  # every child is there, and every widget the Lab shows has a kind the renderer draws
        assert all(child in nodes for child in node.get("children", [])), node
        assert node["kind"] != "unknown", node
    panel = lab.burst_panel
    run = nodes[panel.run_button.model_id]
    assert (run["kind"], run["description"], run["button_style"], run["disabled"]) == ("button", "Run", "primary",
                                                                                       False)
    steps = nodes[panel.steps.model_id]
    assert (steps["kind"], steps["value"], steps["integer"]) == ("number", panel.steps.value, True)
    backend = nodes[panel.backend.model_id]
    assert backend["kind"] == "toggles" and backend["labels"][backend["index"]] == panel.backend.label
    assert nodes[panel.plot.model_id]["kind"] == "image"
    assert nodes[panel.plot.model_id]["layout"]["display"] == "none"  # hidden until it holds a figure


def test_an_event_from_the_browser_is_done_on_the_real_widget(lab):
    mirror = Recorded(lab)
    panel = lab.burst_panel
    mirror.handle({"event": "value", "id": panel.steps.model_id, "value": "7"})
    assert panel.steps.value == 7
    mirror.handle({"event": "value", "id": panel.steps.model_id, "value": -5})  # bounded: 1 at least
    assert panel.steps.value == 1 and mirror.sent[-1]["nodes"][panel.steps.model_id]["value"] == 1
    mirror.handle({"event": "index", "id": panel.precision.model_id, "value": 1})
    assert panel.precision.index == 1
    mirror.handle({"event": "value", "id": panel.overlay.model_id, "value": True})
    assert panel.overlay.value is True
    report = lab.extra_panels["Report"]
    mirror.handle({"event": "selected", "id": lab.model_id, "value": lab.titles.index("Report")})
    assert lab.selected_index == lab.titles.index("Report")
    report.result.value = ""
    mirror.handle({"event": "click", "id": report.button.model_id})  # Write report: what its click does
    assert report.result.value and (report.path is not None or "run a burst first" in report.result.value)
    mirror.handle({"event": "value", "id": "no such widget", "value": 1})  # nothing to do, nothing broken
    panel.steps.value, panel.overlay.value, panel.precision.index = 20, False, 0


def test_a_change_of_a_real_widget_is_sent_as_its_node(lab):
    mirror = Recorded(lab)
    panel = lab.burst_panel
    before = panel.status.value
    panel.status.value = "<b>pytorch: ok</b>"
    sent = mirror.sent[-1]
    assert sent["type"] == "nodes" and sent["nodes"][panel.status.model_id]["value"] == "<b>pytorch: ok</b>"
    assert mirror.nodes[panel.status.model_id]["value"] == "<b>pytorch: ok</b>"  # in place: a later view has it
    panel.plot.value = PNG + b"more"
    node = mirror.sent[-1]["nodes"][panel.plot.model_id]
    assert base64.b64decode(node["value"])[:4] == PNG
    import ipywidgets as W

    box, extra = lab.log_panel, W.HTML("<i>new</i>")  # a child added: its node comes with its parent's
    box.children = (*box.children, extra)
    assert {box.model_id, extra.model_id} <= set(mirror.sent[-1]["nodes"])
    extra.value = "<i>changed</i>"
    assert mirror.sent[-1]["nodes"][extra.model_id]["value"] == "<i>changed</i>"
    box.children = box.children[:-1]
    panel.status.value, panel.plot.value = before, b""


def test_the_renderer_ships_in_the_package_and_needs_no_network():
    text = ESM.read_text()
    assert "export default" in text and "render" in text
    import re

    assert "http" not in text and not re.search(r"^\s*import\b|\bimport\(", text, re.M)  # no CDN: works offline


def test_marimo_displays_the_lab_as_its_anywidget(lab):
    marimo = pytest.importorskip("marimo")
    from marimo._output.formatting import get_formatter

    formatter = get_formatter(lab)
    mime, data = formatter(lab)
    assert mime == "text/html" and "marimo-anywidget" in data, (marimo.__version__, data[:300])
    assert lab.mirror() is lab.mirror() and lab.mirror().target is lab


NOTEBOOK = [
    "import ortlab\nlab = ortlab.Lab(out='runs')\nlab",
    "comparison = lab.compare(steps=6)\nprint(comparison.verdict)",
]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_exported_html_shows_the_last_results_without_a_kernel(tmp_path):
    """Executed by nbclient (which keeps the widgets' state, as `jupyter nbconvert --execute` does), exported by
    `jupyter nbconvert --to html`: the static results hold the comparison's verdict, loss plot and facts; opened in
    Chromium with no network (the widgets' manager comes from a CDN), they are what a reader sees."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in NOTEBOOK])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    NotebookClient(nb, timeout=600, resources={"metadata": {"path": str(tmp_path)}}).execute()
    path = tmp_path / "lab.ipynb"
    nbformat.write(nb, path)
    lab_outputs = nb.cells[0].outputs
    assert [o.output_type for o in lab_outputs] == ["display_data", "display_data"]
    assert "application/vnd.jupyter.widget-view+json" in lab_outputs[0].data
    assert "pytorch" in lab_outputs[1].data["text/html"]  # updated by the second cell's comparison

    subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", str(path)], check=True,
                   capture_output=True, timeout=300)
    page = (tmp_path / "lab.html").read_text()
    import re

    found = re.search(rf"class=[\"']{STATIC_CLASS}[\"']", page)
    assert found, "the static results are in the page"
    static = page[found.start():page.index("</table>", found.start())]
    assert "final loss" in static and "verdict" in static
    assert len(_images(static)) >= 1 and all(img[:4] == PNG for img in _images(static))
    assert "no burst yet" not in page

    if shutil.which("chromium") is None:
        return
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--disable-gpu"])
        try:
            context = browser.new_context(offline=True)  # as a reader without the network: no CDN
            shown = context.new_page()
            shown.goto((tmp_path / "lab.html").as_uri())
            block = shown.locator(f".{STATIC_CLASS}").first
            block.wait_for(state="visible", timeout=30_000)
            text = block.inner_text()
            assert "verdict" in text and "final loss" in text
            plot = block.locator("img").first
            assert plot.evaluate("img => img.complete && img.naturalWidth > 100")
        finally:
            browser.close()
