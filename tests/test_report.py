"""A report a user can hand on, from real runs: `ortlab report` on the demo's comparison opened in Chromium with
every section shown and no request leaving the page; a diverged comparison's page with its verdict and first
divergence; `ortlab time A B --diff` naming the largest change; the per-node overlays loaded by Google Model
Explorer's own ONNX adapter and node-data classes. Screenshots go to a temporary folder; to docs/img/ with
ORTLAB_UPDATE_SCREENSHOTS=1."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ortlab.cli import main
from ortlab.runs.run import COMMAND, load_run

ROOT = Path(__file__).resolve().parents[1]
GOLDEN_RUNS = ROOT / "tests" / "golden" / "runs"
SECTIONS = ("what was run", "summary", "verdict", "loss curves", "where the time goes", "what changed in the time",
            "memory", "first divergence", "exported graphs", "recompute plans", "tuning", "how to reproduce")


def _sums(run: Path) -> tuple[dict, set]:
    data = json.loads((run / "time.json").read_text())
    sums: dict = {}
    for r in data["modules"]:
        sums[r["module"], r["phase"]] = sums.get((r["module"], r["phase"]), 0.0) + r["s"] * 1e3
    timed = {p["phase"] for p in data["parts"] if p["kind"] == "kernels" and p["s"] > 0}
    return sums, timed


def _largest(a: Path, b: Path) -> tuple[str, str]:
    """The module and phase whose time changed most, from the two time.json files themselves."""
    (sa, ta), (sb, tb) = _sums(a), _sums(b)
    keys = [k for k in {*sa, *sb} if k[1] in ta & tb]
    return max(keys, key=lambda k: abs(sb.get(k, 0.0) - sa.get(k, 0.0)))


def test_time_diff_of_two_recorded_runs_names_the_largest_change(capsys):
    pytorch, ortmodule = sorted(GOLDEN_RUNS.iterdir())
    assert main(["time", str(pytorch), str(ortmodule), "--diff"]) == 0
    out = capsys.readouterr().out
    module, phase = _largest(pytorch, ortmodule)
    line = next(x for x in out.splitlines() if x.startswith("largest change:"))
    assert f"module {module} ({phase})" in line, (line, module, phase)
    assert "matched by module only" in out  # PyTorch's ops and ORT's nodes: two profilers


def test_a_run_against_itself_has_no_change(capsys):
    pytorch = sorted(GOLDEN_RUNS.iterdir())[0]
    from ortlab.timing.diff import time_diff

    diff = time_diff(pytorch, pytorch)
    assert diff.largest is None and set(diff.rows["change"]) == {"same"}
    assert "largest change: none" in diff.report()


def test_bad_input_is_one_line(capsys, tmp_path):
    pytorch = sorted(GOLDEN_RUNS.iterdir())[0]
    assert main(["time", str(pytorch), "--diff"]) == 2
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert main(["graphs", str(pytorch), "--overlay", "time"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and "two runs" in err[0] and "does not exist" in err[1] and "pytorch burst" in err[2], err


def test_a_run_records_the_command_that_made_it(tmp_path, capsys):
    argv = ["burst", "--backend", "pytorch", "--steps", "2", "--no-memory", "--in-process", "--out", str(tmp_path)]
    assert main(argv) == 0
    assert COMMAND not in os.environ  # only while the command runs
    run = load_run(next(tmp_path.glob("*-pytorch")))
    assert run.meta["command"] == "ortlab " + " ".join(argv) and run.meta["cwd"] == os.getcwd()
    from ortlab import report

    page = report(tmp_path).read_text()
    assert f"<pre>ortlab burst --backend pytorch --steps 2 --no-memory --in-process --out {tmp_path}</pre>" in page


# -- real comparisons (ORTModule exports: the slow tier)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo's comparison, profiled and with statistics, made by `ortlab compare` as a user would."""
    out = tmp_path_factory.mktemp("runs")
    done = subprocess.run([sys.executable, "-m", "ortlab.cli", "compare", "--backends", "both", "--steps", "5",
                           "--collect", "time", "--collect", "stats", "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    pytorch, ortmodule = (next(out.glob(f"*-{b}")) for b in ("pytorch", "ortmodule"))
    return out, pytorch, ortmodule


@pytest.fixture(scope="module")
def diverged(tmp_path_factory):
    """A model ORTModule trains differently (its squeeze-and-excitation block's gradient is wrong)."""
    from ortlab import Session

    out = tmp_path_factory.mktemp("diverged")
    with Session("ortlab.demo.divergence:squeeze_excite", out=out, in_process=True) as s:
        comparison = s.compare(steps=2, parity=True, progress=False, collect={"stats": {}})
    assert comparison.verdict.diverged, comparison.verdict
    return out, comparison


@pytest.mark.ort
@pytest.mark.slow
def test_time_diff_of_the_demo_names_the_largest_change(demo):
    _, pytorch, ortmodule = demo
    done = subprocess.run([sys.executable, "-m", "ortlab.cli", "time", str(pytorch), str(ortmodule), "--diff"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    module, phase = _largest(pytorch, ortmodule)
    assert f"largest change: module {module} ({phase})" in done.stdout, done.stdout


@pytest.fixture(scope="module")
def model_explorer():
    """Model Explorer and its ONNX adapter in their side folder (requirements-report.lock), installed once."""
    folder = os.environ.get("ORTLAB_REPORT_PACKAGES")
    if not folder:
        done = subprocess.run([sys.executable, str(ROOT / "scripts" / "side_packages.py"), "--lock",
                               "requirements-report.lock"], capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            pytest.skip(f"Model Explorer's side folder could not be installed: {done.stderr[-500:]}")
        folder = done.stdout.strip()
    return folder


@pytest.mark.ort
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["time", "memory", "stats"])
def test_model_explorer_loads_the_overlay(demo, model_explorer, kind, tmp_path):
    from ortlab.reporting.overlay import overlay

    _, pytorch, ortmodule = demo
    path = tmp_path / f"{kind}.json"
    assert main(["graphs", str(ortmodule), "--overlay", kind, "--out", str(path)]) == 0
    o = overlay(ortmodule, kind)
    node = max(o.values, key=o.values.get)
    if kind == "time":  # ORT's profiler's time of that node, as time.json has it
        expected = sum(n["s"] * 1e3 for n in json.loads((ortmodule / "time.json").read_text())["nodes"]
                       if n["node"] == node)
    elif kind == "memory":  # the account's peak is the largest value, at its peak node
        account = json.loads((ortmodule / "memory.json").read_text())
        node, expected = account["peak_node"], account["peak_activation_bytes"] / 2**20
    else:  # the node's module: its worst statistic against PyTorch's run
        from ortlab import compare
        from ortlab.graphs import load
        from ortlab.timing.profile import module_of

        table = compare(pytorch, ortmodule).table.dropna(subset=["score"])
        module = module_of(node, set(table["module"]))
        phase = "forward" if load(ortmodule).stage().nodes_by_name[node].kind == "forward" else "backward"
        rows = table[(table["module"] == module) & (table["phase"] == phase)]
        expected = max(r[f"rel_{r['worst']}"] for _, r in rows.iterrows())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([model_explorer, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "scripts" / "model_explorer_load.py"),
                           str(o.stage_file), str(path), node], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded["graphs"] == loaded["data_graphs"] == [o.graph]  # the ONNX adapter's graph id
    assert loaded["missing"] == []  # every node the data names is a node Model Explorer drew
    assert loaded["value"] == pytest.approx(expected, rel=1e-9), (node, loaded["value"], expected)


def _open(page, path: Path):
    """Open the page from disk; every request other than the file itself and data: URLs fails the test."""
    outside: list[str] = []
    target = path.resolve().as_uri()

    def route(r):
        url = r.request.url
        if url == target or url.startswith("data:"):
            r.continue_()
        else:
            outside.append(url)
            r.abort()

    page.route("**/*", route)
    page.goto(target)
    return outside


@pytest.fixture(scope="module")
def browser():
    if shutil.which("chromium") is None:
        pytest.skip("Debian's chromium is not installed (scripts/ensure-chromium installs it as root)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=shutil.which("chromium"),
                              args=["--disable-gpu", "--no-first-run", "--disable-background-networking",
                                    "--disable-component-update", "--disable-sync"])
        yield b
        b.close()


@pytest.mark.ort
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_report_of_the_demos_comparison_in_chromium(demo, browser, tmp_path, shots_dir):
    _, pytorch, ortmodule = demo
    path = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-m", "ortlab.cli", "report", str(pytorch), str(ortmodule),
                           "--out", str(path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert path.stat().st_size < 2 * 2**20  # the demo's page stays under 2 MB
    page = browser.new_page(viewport={"width": 1100, "height": 1400})
    outside = _open(page, path)
    for title in SECTIONS:
        section = page.locator(f"section#{title.replace(' ', '-')}")
        assert section.locator("h2").inner_text() == title and section.is_visible(), title
        assert len(section.inner_text()) > len(title) + 10, f"section {title!r} is empty"
    for img in page.locator("img").all():  # every figure drew (a data URI that decodes)
        assert img.evaluate("i => i.complete && i.naturalWidth > 0"), img.get_attribute("alt")
    assert page.locator("img").count() >= 3
    text = page.inner_text("body")
    assert "ortmodule verdict: agree" in text
    assert "largest change: module" in page.locator("section#what-changed-in-the-time").inner_text()
    reproduce = page.locator("section#how-to-reproduce").inner_text()
    assert "ortlab compare --backends both --steps 5 --collect time --collect stats" in reproduce
    assert "torch 2.6.0" in page.locator("section#what-was-run").inner_text()
    shots_dir.mkdir(parents=True, exist_ok=True)
    top = page.locator("section#summary").bounding_box()["y"] - 10  # the summary, the verdict, the loss curves
    page.screenshot(path=str(shots_dir / "report.png"), full_page=True,
                    clip={"x": 0, "y": top, "width": 1100, "height": 1150})
    assert outside == [], outside
    page.close()


@pytest.mark.ort
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_diverged_comparisons_page_shows_its_verdict_and_first_divergence(diverged, browser, tmp_path):
    from ortlab import report

    _, comparison = diverged
    path = report(comparison, out=tmp_path / "diverged.html")
    page = browser.new_page()
    outside = _open(page, path)
    verdict = page.locator("section#verdict .diverged").first
    assert "DIVERGED" in verdict.inner_text() and verdict.is_visible()
    assert verdict.evaluate("e => getComputedStyle(e).color") == "rgb(204, 0, 0)"  # red, never a success's green
    first = page.locator("section#first-divergence .first")
    assert first.is_visible() and "first divergence: step" in first.inner_text()
    from ortlab import compare

    assert str(compare(comparison).first) in first.inner_text()  # the same as ortlab.compare says
    assert outside == [], outside
    page.close()


@pytest.mark.ort
@pytest.mark.slow
def test_the_labs_report_button_and_overlay(demo, tmp_path, monkeypatch):
    from ortlab.widgets.graphs import GraphsPanel
    from ortlab.widgets.report import ReportPanel

    out, pytorch, ortmodule = demo
    runs = [load_run(pytorch), load_run(ortmodule)]
    monkeypatch.chdir(tmp_path)
    panel = ReportPanel(lambda: runs)
    assert "pytorch" in panel.about.value and "ortmodule" in panel.about.value
    path = panel.write()
    assert path.parent == out and path.is_file() and path.name in panel.result.value
    assert "ortmodule verdict: agree" in path.read_text()

    graphs = GraphsPanel(lambda: runs)
    graphs.run_picker.value = str(ortmodule)
    graphs.overlay.picker.value = "time"
    o = graphs.overlay.current
    assert o is not None and o.kind == "time", graphs.overlay.line.value
    node = max(o.values, key=o.values.get)
    graphs.search_box.value = node
    graphs.search()
    assert graphs.matches.value == node
    svg = graphs.neighbourhood.value
    assert f'fill="{o.color(node)}"' in svg and f"{o.values[node]:.4g}" in svg  # the node coloured, its value shown
    assert o.color(node) in graphs.overlay.top.value
    graphs.overlay.picker.value = "none"
    assert f'fill="{o.color(node)}"' not in graphs.neighbourhood.value
    graphs.close()
