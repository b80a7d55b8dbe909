"""Exported graphs: stage files written by the real ORTModule in this test, read back, diffed, searched, drawn,
served with netron, and shown in the Graphs panel without a browser."""

import argparse
import json
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import onnx
import pytest

from ortlab import Session
from ortlab.graphs import STAGES, GraphsError, graphs, module_scope, register_cli


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """One ortlab burst with save_onnx, one with the memory optimizer on as well (recompute nodes), and a
    folder written by a plain ORTModule (not ortlab) that also ran in eval mode (inference stages)."""
    import torch
    from onnxruntime.training.ortmodule import DebugOptions, ORTModule

    out = tmp_path_factory.mktemp("graphs")
    with Session(out=out / "runs", in_process=True) as s:
        plain = s.burst("ortmodule", 1, {"save_onnx": True}, progress=False)
        memopt = s.burst("ortmodule", 1, {"save_onnx": True, "memory_opt_level": 1}, progress=False)
        pytorch = s.burst("pytorch", 1, progress=False)
    folder = out / "not_ortlab"
    folder.mkdir()
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    ort = ORTModule(mlp, DebugOptions(save_onnx=True, onnx_prefix="my_mlp", save_path=str(folder)))
    x = torch.randn(4, 8)
    ort(x).sum().backward()
    ort.eval()
    with torch.no_grad():
        ort(x)
    assert plain.ok and memopt.ok
    return {"plain": plain, "memopt": memopt, "pytorch": pytorch, "folder": folder}


def onnx_graph(path):
    return onnx.load(str(path)).graph


def test_five_training_stages_per_run_and_per_mode_in_any_folder(exported):
    g = graphs(exported["plain"])
    assert g.modes == ["training"] and g.stages("training") == list(STAGES)
    assert g.folder == exported["plain"].path / "onnx"
    other = graphs(exported["folder"])  # written by ORTModule directly, with its own prefix
    assert other.prefix == "my_mlp" and other.modes == ["training", "inference"]
    assert other.stages("training") == list(STAGES)
    # ORT 1.19.2 builds no gradient graph in eval mode, so it writes no optimized_pre_grad stage there
    assert other.stages("inference") == ["torch_exported", "post_processed", "optimized", "execution_model"]
    assert len(other.summary()) == 9


def test_histograms_match_onnx_counts(exported):
    g = graphs(exported["memopt"])
    for name in g.stages():
        stage = g.stage(name)
        nodes = onnx_graph(stage.path).node
        expected = Counter(f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in nodes)
        assert stage.histogram().to_dict() == dict(expected), name
        assert stage.node_count == len(nodes)
    hist = g.stage("execution_model").histogram()
    assert hist["com.microsoft::YieldOp"] == 1 and hist["com.microsoft::FusedMatMul"] > 0
    assert hist["org.pytorch.aten::ATen"] >= 1  # the embedding runs as an ATen op
    assert list(hist) == sorted(hist, reverse=True)  # most frequent first


def test_inputs_outputs_and_size(exported):
    run = exported["plain"]
    stage = graphs(run).stage("torch_exported")
    inputs = stage.inputs
    users = inputs[inputs["role"] == "user input"]
    params = inputs[inputs["role"] == "parameter"]
    assert users["name"].tolist() == run.ort["post_export"]["user_inputs"] == ["idx"]
    assert users.iloc[0]["dtype"] == "int64" and users.iloc[0]["rank"] == 2
    assert users.iloc[0]["shape"] == "[idx_dim0, idx_dim1]"  # dynamic axes
    assert set(params["dtype"]) == {"float32"} and params["requires_grad"].all()
    size = stage.size()
    assert size["parameter_elements"] == run.meta["model"]["parameters"]  # every parameter is a graph input
    assert size["parameter_bytes"] == 4 * size["parameter_elements"]
    assert size["file_bytes"] == stage.path.stat().st_size
    outputs = graphs(run).stage("optimized").outputs
    assert set(outputs["role"]) == {"gradient"}  # the training graph returns the gradients; the loss goes via YieldOp
    assert len(outputs) == len(params)


def test_diff_finds_what_the_gradient_graph_added(exported):
    g = graphs(exported["plain"])
    d = g.diff("optimized_pre_grad", "optimized")
    before, after = onnx_graph(g.files["training", "optimized_pre_grad"]), onnx_graph(g.files["training", "optimized"])
    new_names = {n.name for n in after.node} - {n.name for n in before.node}
    assert set(d.added["name"]) == new_names and len(d.removed) == 0
    grad_ops = {f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in after.node if n.op_type.endswith("Grad")}
    assert grad_ops and grad_ops <= set(d.gradient["op"])  # DropoutGrad, LayerNormalizationGrad, ...
    assert "com.microsoft::YieldOp" in d.summary()["ops_added"]
    producers = {o: n.name for n in after.node for o in n.output}
    for out in after.output:  # every returned gradient is computed by a node the gradient graph added
        assert producers[out.name] in set(d.gradient["name"]), out.name
    assert d.summary()["gradient"] == len(d.gradient) > 50
    table = d.table()
    assert (table["change"] == table["b"] - table["a"]).all() and (table["change"] != 0).all()


def test_recompute_nodes_only_with_the_memory_optimizer(exported):
    for key, expect in (("plain", False), ("memopt", True)):
        g = graphs(exported[key])
        names = [n.name for n in onnx_graph(g.files["training", "execution_model"]).node]
        d = g.diff("optimized", "execution_model")
        assert set(d.recompute["name"]) == {n for n in names if n.endswith("_recompute")}
        assert (len(d.recompute) > 0) is expect
        assert (g.stage("execution_model").kinds()["recompute"] > 0) is expect


def test_fused_nodes_point_at_their_fusion(exported):
    d = graphs(exported["plain"]).diff("optimized", "execution_model")
    fused = d.fused
    assert len(fused) > 0
    added = set(d.added["name"])
    assert set(fused["fused_into"]) <= added
    matmul = fused[fused["name"] == "/_original_module/blocks/blocks.0/attn/MatMul"]
    assert matmul["fused_into"].iloc[0].startswith("/_original_module/blocks/blocks.0/attn/MatMul/")
    assert d.summary()["fusion_nodes"] > 0


def test_search_by_name_op_and_module(exported):
    stage = graphs(exported["plain"]).stage("execution_model")
    nodes = onnx_graph(stage.path).node
    by_module = stage.search("blocks.0/attn", by="module", limit=None)
    assert len(by_module) > 10
    assert {m.removeprefix("blocks.0.attn") for m in by_module["module"]} <= {"", ".qkv", ".proj", ".attn_drop", ".resid_drop"}
    assert len(by_module) == sum("/blocks.0/attn/" in n.name for n in nodes)
    by_op = stage.search("fusedmatmul", by="op", limit=None)
    assert len(by_op) == sum(n.op_type == "FusedMatMul" for n in nodes)
    assert stage.search("YieldOp", by="name")["name"].tolist() == ["YieldOp"]
    assert len(stage.search("no-such-node")) == 0
    with pytest.raises(GraphsError, match="search by 'colour' is not allowed; allowed: any, name, op, module"):
        stage.search("x", by="colour")
    assert module_scope("/_original_module/blocks/blocks.1/attn/qkv/MatMul_Grad/FusedMatMul_0") == "blocks.1.attn.qkv"
    assert module_scope("BiasGelu_token_1") == ""


def test_neighbourhood_is_the_real_producers_and_consumers(exported):
    stage = graphs(exported["plain"]).stage("execution_model")
    nodes = onnx_graph(stage.path).node
    center = next(n for n in nodes if n.op_type == "LayerNormalization")
    producers = {n.name for n in nodes if set(n.output) & set(center.input)}
    consumers = {n.name for n in nodes if set(n.input) & set(center.output)}
    nb = stage.neighbourhood(center.name, hops=1)
    df = nb.nodes
    assert set(df.loc[df["distance"] == -1, "name"]) == producers
    assert set(df.loc[df["distance"] == 1, "name"]) == consumers
    assert df.loc[df["distance"] == 0, "name"].tolist() == [center.name]
    assert any(k == "input" for k in df["kind"])  # the LayerNorm weight and bias are graph inputs
    svg = nb.svg(engine="ortlab")
    root = ET.fromstring(svg)  # well-formed
    assert root.tag.endswith("svg") and svg == nb.svg(engine="ortlab")  # deterministic
    assert "LayerNormalization" in svg
    assert len(stage.neighbourhood(center.name, hops=3).rows) > len(nb.rows)
    small = stage.neighbourhood(center.name, hops=6, max_nodes=5)
    assert small.truncated > 0 and "more not shown" in small.svg(engine="ortlab")
    assert f'"{center.name}"' in nb.to_dot()
    with pytest.raises(GraphsError, match="no node named 'nope'"):
        stage.neighbourhood("nope")
    with pytest.raises(GraphsError, match="hops 0 is not allowed"):
        stage.neighbourhood(center.name, hops=0)


def test_charts_render(exported):
    g = graphs(exported["memopt"])
    from ortlab.plots import figure_png

    fig = g.diff("optimized", "execution_model").chart()
    assert "execution_model" in fig.axes[0].get_title() and len(fig.axes) == 2
    assert figure_png(fig).startswith(b"\x89PNG")
    assert figure_png(g.chart()).startswith(b"\x89PNG")


def test_clear_errors_for_folders_without_graphs(exported, tmp_path):
    with pytest.raises(GraphsError, match=f"no ORTModule stage files in {tmp_path}"):
        graphs(tmp_path)
    with pytest.raises(GraphsError, match="only ORTModule bursts export graphs"):
        graphs(exported["pytorch"])
    with pytest.raises(GraphsError, match="does not exist"):
        graphs(tmp_path / "missing")
    g = graphs(exported["plain"])
    with pytest.raises(GraphsError, match="stage 'optimised' is not in .*; stages there: torch_exported"):
        g.stage("optimised")
    with pytest.raises(GraphsError, match="mode 'inference' has no stage files"):
        g.stages("inference")
    for f in g.files.values():
        shutil.copy(f, tmp_path / f.name)
        shutil.copy(f, tmp_path / f.name.replace("model_", "other_", 1))
    with pytest.raises(GraphsError, match="several exports; pick one with prefix=: model, other"):
        graphs(tmp_path)
    assert graphs(tmp_path, prefix="other").stage().node_count == g.stage().node_count


def test_reexport_writes_its_graphs_into_its_own_run(tmp_path):
    """A changed input dtype (ORT checks only with SKIP_CHECK_DISABLED) re-exports: the new graphs land in the
    new burst's folder, the first burst keeps its own, and the transition says which schema caused it."""
    dtype_file = tmp_path / "dtype.txt"
    dtype_file.write_text("int64")

    def make():
        import torch

        from ortlab.demo import gpt
        from ortlab.workload import Workload

        w = gpt()

        def batch(step):
            x, y = w.batch(step)
            return x.to(getattr(torch, dtype_file.read_text())), y

        return Workload(w.model, batch, w.loss, name="gpt with a switchable input dtype", batch_size=w.batch_size)

    options = {"save_onnx": True, "skipcheck_policy": "SKIP_CHECK_DISABLED"}
    with Session(make, out=tmp_path / "runs", in_process=True) as s:
        first = s.burst("ortmodule", 1, options, progress=False)
        dtype_file.write_text("int32")
        second = s.burst("ortmodule", 1, options, progress=False)
    t = graphs(second).transitions
    assert t["action"].tolist() == ["re-export"] and t["ort_exported"].tolist() == [True]
    assert t["input_schema"].iloc[0] == "Tensor[int64, rank 2] -> Tensor[int32, rank 2]"
    assert graphs(first).transitions["input_schema"].tolist() == ["idx: int64, rank 2"]
    dtypes = [graphs(r).stage("torch_exported").inputs.set_index("name").loc["idx", "dtype"] for r in (first, second)]
    assert dtypes == ["int64", "int32"]


def _cli(*args):
    parser = argparse.ArgumentParser(prog="ortlab")
    register_cli(parser.add_subparsers(dest="command", required=True))
    ns = parser.parse_args(["graphs", *map(str, args)])
    return ns.func(ns)


def test_cli(exported, capsys, tmp_path):
    run = exported["memopt"].path
    assert _cli(run) == 0
    out = capsys.readouterr().out
    assert "optimized_pre_grad -> optimized" in out and "why ORTModule exported" in out and "re-wrap" in out
    assert _cli(run, "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["stage"] for r in data["stages"]] == list(STAGES) and data["diffs"]["training"][-1]["recompute"] > 0
    assert _cli(run, "--diff", "optimized", "execution_model", "--json") == 0
    assert json.loads(capsys.readouterr().out)["recompute"] > 0
    assert _cli(run, "--stage", "optimized", "--json") == 0
    assert json.loads(capsys.readouterr().out)["histogram"]["com.microsoft::YieldOp"] == 1
    assert _cli(run, "--search", "LayerNormalization") == 0
    assert "ln_f" in capsys.readouterr().out
    assert _cli(tmp_path) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"ortlab graphs: no ORTModule stage files in {tmp_path}")
    assert _cli(run, "--stage", "nope") == 2
    assert "stage 'nope' is not in" in capsys.readouterr().err


def test_callable_module_and_light_import():
    code = ("import sys, ortlab, ortlab.graphs; assert callable(ortlab.graphs); "
            "print(sorted(m for m in ('onnx', 'matplotlib', 'torch', 'pandas') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


# --------------------------------------------------------------------------------------------- netron


def test_netron_serves_the_model_and_stops(exported, monkeypatch):
    from ortlab.netron_view import netron_status, serve

    path = graphs(exported["plain"]).stage("execution_model").path
    server = serve(path)
    try:
        assert server.host == "127.0.0.1" and server.port > 0
        with urllib.request.urlopen(server.model_url, timeout=10) as r:
            assert r.status == 200 and r.read() == path.read_bytes()
        with urllib.request.urlopen(server.url, timeout=10) as r:
            page = r.read().decode()
            assert r.status == 200 and f'content="/data/{path.name}"' in page
            cookie = r.headers["Set-Cookie"]
            assert cookie.startswith("consent=") and "Partitioned" in cookie  # also inside a cross-site iframe
        assert f'src="http://127.0.0.1:{server.port}/"' in server.iframe_html()
        monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/ada/")
        assert server.browser_url == f"/user/ada/proxy/{server.port}/"
    finally:
        server.stop()
    assert not server.alive
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(server.url, timeout=5)
    import datetime as dt

    ok, message = netron_status(today=dt.date.today() + dt.timedelta(days=3650))
    assert not ok and "refuses to render builds older than 180 days" in message and "\n" not in message


def test_netron_missing_is_one_line_and_the_builtin_view_stays(exported, monkeypatch):
    from ortlab.netron_view import NetronError, serve
    from ortlab.widgets.graphs import GraphsPanel

    monkeypatch.setitem(sys.modules, "netron", None)  # as if it were not installed
    with pytest.raises(NetronError, match="netron is not installed"):
        serve(graphs(exported["plain"]).stage().path)
    panel = GraphsPanel(lambda: [exported["plain"]])
    panel.netron_button.click()
    assert "netron is not installed" in panel.status.value and panel.netron is None
    assert panel.tabs.selected_index == 2  # the Search tab: ortlab's own neighbourhood view


# --------------------------------------------------------------------------------------------- the panel


def test_graphs_panel_without_a_browser(exported, tmp_path):
    from ortlab.widgets.graphs import GraphsPanel

    runs = [exported["pytorch"], exported["plain"]]  # oldest first, as a Session lists them
    panel = GraphsPanel(lambda: runs)
    assert panel.run_picker.value == str(exported["plain"].path)  # the newest run with graphs
    runs.append(exported["memopt"])
    panel.refresh()  # a new run with graphs (the Lab refreshes after each burst): it is shown
    assert repr(panel) == "GraphsPanel(runs=3, stage='training/execution_model', netron=off)"
    assert panel.run_picker.value == str(exported["memopt"].path)
    assert panel.compare_picker.value == ("training", "optimized")
    assert bytes(panel.chart.value).startswith(b"\x89PNG") and "Recompute nodes added" in panel.diff_table.value
    assert "re-wrap" in panel.transitions.value and "idx: int64, rank 2" in panel.transitions.value
    assert "User inputs" in panel.summary.value and "idx" in panel.summary.value

    panel.compare_picker.value = ("training", "optimized_pre_grad")
    assert "DropoutGrad" in panel.diff_table.value
    panel.stage_picker.value = ("training", "optimized")
    assert panel.compare_picker.value == ("training", "optimized_pre_grad")

    panel.search_box.value = "blocks.1.mlp"
    assert len(panel.matches.options) > 0 and "<svg" in panel.neighbourhood.value
    panel.search_by.value = "op"
    panel.search_box.value = "YieldOp"
    assert panel.matches.value == "YieldOp" and "YieldOp" in panel.neighbourhood.value
    before = panel.neighbourhood.value
    panel.hops.value = 2
    assert panel.neighbourhood.value != before

    panel.netron_button.click()
    try:
        assert panel.netron is not None and "<iframe" in panel.netron_frame.value
        with urllib.request.urlopen(panel.netron.model_url, timeout=10) as r:
            assert r.status == 200
        assert repr(panel).endswith("netron=serving)")
        server = panel.netron
    finally:
        panel.netron_stop_button.click()
    assert not server.alive and panel.netron_frame.value == ""

    panel.run_picker.value = str(exported["pytorch"].path)  # errors stay inside the panel
    assert "only ORTModule bursts export graphs" in panel.status.value and panel.summary.value == ""
    runs.remove(exported["memopt"])
    panel.refresh()  # keeps the selected run
    assert panel.run_picker.value == str(exported["pytorch"].path) and len(panel.run_picker.options) == 2

    panel.netron_button.click()  # no stage selected: nothing happens
    assert panel.netron is None
    panel.run_picker.value = str(exported["plain"].path)
    panel.netron_button.click()
    server = panel.netron
    panel.close()  # closing the panel stops its netron
    assert not server.alive

    empty = GraphsPanel(lambda: [])
    assert "no runs yet" in empty.status.value and repr(empty) == "GraphsPanel(runs=0, stage=None, netron=off)"


# --------------------------------------------------------------------------------------------- in a real browser


@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="Debian's chromium is not installed (scripts/ensure-chromium installs it as root)")
def test_netron_renders_in_chromium_without_the_consent_prompt(exported, tmp_path):
    """netron inside an iframe of a page from another site (a notebook at localhost, netron at 127.0.0.1): the
    cookie ortlab sets must reach netron's page there too. Screenshots for docs/graphs.md go to docs/img/."""
    import functools
    import http.server
    import threading
    import time

    from playwright.sync_api import sync_playwright

    from ortlab.netron_view import serve
    from ortlab.plots import figure_png

    shots = Path(__file__).resolve().parents[1] / "docs" / "img"
    shots.mkdir(parents=True, exist_ok=True)
    g = graphs(exported["memopt"])
    stage = g.stage("execution_model")
    center = stage.search("YieldOp", by="op")["name"].iloc[0]
    (tmp_path / "diff.png").write_bytes(figure_png(g.diff("optimized", "execution_model").chart()))
    server = serve(graphs(exported["plain"]).stage("execution_model").path)
    (tmp_path / "host.html").write_text(
        f"<html><body style='font-family:sans-serif'>{server.iframe_html(700)}</body></html>")
    (tmp_path / "builtin.html").write_text(
        f"<html><head><meta charset='utf-8'></head><body style='font-family:sans-serif;margin:8px'>{stage.neighbourhood(center, hops=2).svg('ortlab')}"
        "<br><img src='diff.png'></body></html>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *a: None
    host = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=host.serve_forever, daemon=True).start()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium"),
                                        args=["--disable-gpu", "--no-first-run", "--disable-background-networking"])
            page = browser.new_page(viewport={"width": 1200, "height": 760})
            page.goto(f"http://localhost:{host.server_address[1]}/host.html")  # another site than 127.0.0.1
            frame = page.frame_locator("iframe")
            frame.locator("svg#canvas g.node").first.wait_for(timeout=60_000)
            frame.locator("body.default").wait_for(timeout=30_000)  # the graph view, not the welcome screen
            assert frame.locator("svg#canvas g.node").count() > 100
            assert "uses cookies" not in frame.locator("body").inner_text()
            time.sleep(1)  # netron fades its view in
            page.screenshot(path=str(shots / "graphs-netron.png"))
            page.goto(f"http://127.0.0.1:{host.server_address[1]}/builtin.html")
            page.locator("svg").first.wait_for()
            page.screenshot(path=str(shots / "graphs-builtin.png"), full_page=True)
            browser.close()
    finally:
        host.shutdown()
        server.stop()
