"""Exported graphs: stage files written by the real ORTModule in this test (slow) or built with onnx.helper
(fast), read back, diffed, searched, drawn, served with netron, and shown in the Graphs panel without a
browser."""

import importlib
import json
import pkgutil
import re
import shutil
import struct
import subprocess
import sys
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import onnx
import pytest

import ortlab
import ortlab.graphs
from ortlab import Session
from ortlab.graphs import STAGES, GraphsError, load, module_scope


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


SVG = "{http://www.w3.org/2000/svg}"


def check_svg(svg: str, nb) -> None:
    """The drawing holds what the neighbourhood holds: a box per node titled with its name and labelled with
    its op, the centre outlined, one downward arrow per producer -> consumer pair."""
    root = ET.fromstring(svg)
    assert root.tag == SVG + "svg"
    groups = root.findall(SVG + "g")
    names = [r["name"] for r in nb.rows]
    assert len(groups) == len(names)
    for group, row in zip(groups, nb.rows, strict=True):
        assert group.find(SVG + "title").text.endswith(row["name"])
        if row["op"]:
            assert row["op"].split("::")[-1] in "".join(group.itertext())
    assert groups[names.index(nb.center)].find(SVG + "rect").get("stroke") == "#d6336c"
    arrows = root.findall(SVG + "path")
    assert len(arrows) == len({(a, b) for a, b, _ in nb.edges if a != b})
    for arrow in arrows:
        numbers = [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?", arrow.get("d"))]
        assert numbers[-1] > numbers[1], arrow.get("d")  # every edge points down


# ------------------------------------------------------------------------------------ fast: built stages


def _value(name, shape):
    return onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape)


def _model(nodes, outputs, path):
    h = onnx.helper
    inputs = [_value("input", ["batch", 4]), _value("_original_module.fc.weight", [4, 3]),
              _value("_original_module.fc.bias", [3])]
    scale = h.make_tensor("scale", onnx.TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    made = [h.make_node(op, ins, outs, name=name, domain=domain) for name, op, ins, outs, domain in nodes]
    graph = h.make_graph(made, "g", inputs, outputs, initializer=[scale])
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)]),
              str(path))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Two stages of an export named as ORTModule names them (written with onnx.helper, in a second): a linear
    layer and a ReLU; then fused, with ORT-style gradient, recompute and YieldOp nodes."""
    folder = tmp_path_factory.mktemp("built")
    fc, act = "/_original_module/fc", "/_original_module/act"
    _model([(f"{fc}/MatMul", "MatMul", ["input", "_original_module.fc.weight"], ["mm"], ""),
            (f"{fc}/Add", "Add", ["mm", "_original_module.fc.bias"], ["pre"], ""),
            (f"{act}/Relu", "Relu", ["pre"], ["out"], ""),
            ("/_original_module/Mul", "Mul", ["out", "scale"], ["scaled"], "")],
           [_value("scaled", ["batch", 3])], folder / "tiny_torch_exported_training.onnx")
    w, b = "_original_module.fc.weight", "_original_module.fc.bias"
    _model([(f"{fc}/MatMul/FusedGemm/", "Gemm", ["input", w, b], ["pre"], ""),
            (f"{act}/Relu", "Relu", ["pre"], ["out"], ""),
            ("/_original_module/Mul", "Mul", ["out", "scale"], ["scaled"], ""),
            ("YieldOp", "YieldOp", ["scaled"], ["scaled_grad"], "com.microsoft"),
            ("/_original_module/Mul_Grad/Mul_0", "Mul", ["scaled_grad", "scale"], ["out_grad"], ""),
            (f"{act}/Relu_recompute", "Relu", ["pre"], ["out_recompute"], ""),
            (f"{act}/Relu_Grad/ReluGrad_0", "ReluGrad", ["out_grad", "out_recompute"], ["pre_grad"],
             "com.microsoft"),
            (f"{fc}/Gemm_Grad/Gemm_0", "Gemm", ["input", "pre_grad"], [w + "_grad"], ""),
            ("AccumulateGrad_bias", "ReduceSum", ["pre_grad"], ["_original_module.fc.bias_grad"], "")],
           [_value("_original_module.fc.weight_grad", [4, 3]), _value("_original_module.fc.bias_grad", [3])],
           folder / "tiny_execution_model_training.onnx")
    (folder / "notes.onnx").write_text("not a stage file")
    return folder


def test_a_built_folder_read_back(built):
    g = load(built)
    assert repr(g) == "Graphs(prefix='tiny', training: 2 stages)" and g.folder == built
    assert g.stages() == ["torch_exported", "execution_model"] and g.stage().name == "execution_model"
    first, last = g.stage("torch_exported"), g.stage()
    assert last.kinds() == {"forward": 3, "gradient": 4, "recompute": 1, "yield": 1}
    assert first.histogram().to_dict() == {"ai.onnx::Add": 1, "ai.onnx::MatMul": 1, "ai.onnx::Mul": 1,
                                           "ai.onnx::Relu": 1}
    nodes = last.nodes.set_index("name")
    assert nodes.loc["/_original_module/fc/MatMul/FusedGemm/", "module"] == "fc"
    assert nodes.loc["/_original_module/act/Relu_recompute", "module"] == "act"
    assert nodes.loc["YieldOp", ["op", "kind", "module"]].tolist() == ["com.microsoft::YieldOp", "yield", ""]
    inputs = first.inputs.set_index("name")
    assert inputs["role"].to_dict() == {"input": "user input", "_original_module.fc.weight": "parameter",
                                        "_original_module.fc.bias": "parameter"}
    assert inputs.loc["input", "shape"] == "[batch, 4]" and inputs.loc["input", "rank"] == 2
    assert set(last.outputs["role"]) == {"gradient"} and first.outputs["role"].tolist() == ["output"]
    size = first.size()
    assert (size["parameter_elements"], size["parameter_bytes"]) == (15, 60)
    assert (size["initializers"], size["initializer_elements"], size["initializer_bytes"]) == (1, 3, 12)
    assert g.summary()["nodes"].tolist() == [4, 9] and len(g.transitions) == 0


def test_a_built_diff_links_fusions_and_counts_what_was_added(built):
    d = load(built).diff()
    fused = "/_original_module/fc/MatMul/FusedGemm/"
    assert d.fused.set_index("name")["fused_into"].to_dict() == {  # by name, and by the tensor it produces
        "/_original_module/fc/MatMul": fused, "/_original_module/fc/Add": fused}
    s = d.summary()
    assert (s["added"], s["removed"], s["gradient"], s["recompute"], s["fusion_nodes"]) == (7, 2, 4, 1, 1)
    assert s["ops_added"] == ["ai.onnx::Gemm", "ai.onnx::ReduceSum", "com.microsoft::ReluGrad",
                              "com.microsoft::YieldOp"]
    assert s["ops_removed"] == ["ai.onnx::Add", "ai.onnx::MatMul"]
    assert d.ops.iloc[0].tolist() == ["ai.onnx::Gemm", 0, 2, 2] and len(d.changed) == 0
    assert repr(d) == ("StageDiff('training/torch_exported' -> 'training/execution_model': 4 -> 9 nodes, "
                       "+7 -2, gradient 4, recompute 1, fused away 2)")


def test_a_built_stage_searched_and_drawn(built):
    st = load(built).stage()
    assert st.search("fc", by="module")["name"].tolist() == ["/_original_module/fc/MatMul/FusedGemm/",
                                                             "/_original_module/fc/Gemm_Grad/Gemm_0"]
    assert st.search("relugrad", by="op")["kind"].tolist() == ["gradient"]
    nb = st.neighbourhood("/_original_module/act/Relu")
    assert nb.nodes.set_index("name")["distance"].dropna().to_dict() == {
        "/_original_module/act/Relu": 0, "/_original_module/fc/MatMul/FusedGemm/": -1,
        "/_original_module/Mul": 1}
    assert sorted(r["name"] for r in nb.rows if r["kind"] == "input") == [
        "in:_original_module.fc.bias", "in:_original_module.fc.weight", "in:input"]
    check_svg(nb.svg(engine="ortlab"), nb)
    grad = st.neighbourhood("AccumulateGrad_bias", hops=2)
    assert "out:_original_module.fc.bias_grad" in {r["name"] for r in grad.rows}
    check_svg(grad.svg(engine="ortlab"), grad)
    small = st.neighbourhood("/_original_module/act/Relu", hops=3, max_nodes=2)
    assert small.truncated > 0 and "more not shown" in small.svg(engine="ortlab")
    with pytest.raises(GraphsError, match="engine 'png' is not allowed; allowed: auto, ortlab, graphviz"):
        nb.svg(engine="png")
    with pytest.raises(GraphsError, match="no node named 'Relu' in stage training/execution_model; search"):
        st.neighbourhood("Relu")


def test_a_damaged_stage_file_is_named(built, tmp_path):
    shutil.copy(built / "tiny_torch_exported_training.onnx", tmp_path)
    (tmp_path / "tiny_execution_model_training.onnx").write_bytes(b"\x00not onnx")
    g = load(tmp_path)
    assert g.stage("torch_exported").node_count == 4
    with pytest.raises(GraphsError, match=r"model_training\.onnx is not a readable ONNX model"):
        g.stage().node_count  # noqa: B018
    with pytest.raises(GraphsError, match=r"no stage files with prefix 'other' in .*; prefixes there: tiny"):
        load(tmp_path, prefix="other")


@pytest.mark.slow
@pytest.mark.ort
def test_five_training_stages_per_run_and_per_mode_in_any_folder(exported):
    g = load(exported["plain"])
    assert g.modes == ["training"] and g.stages("training") == list(STAGES)
    assert g.folder == exported["plain"].path / "onnx"
    other = load(exported["folder"])  # written by ORTModule directly, with its own prefix
    assert other.prefix == "my_mlp" and other.modes == ["training", "inference"]
    assert other.stages("training") == list(STAGES)
    # ORT 1.19.2 builds no gradient graph in eval mode, so it writes no optimized_pre_grad stage there
    assert other.stages("inference") == ["torch_exported", "post_processed", "optimized", "execution_model"]
    assert len(other.summary()) == 9


@pytest.mark.slow
@pytest.mark.ort
def test_histograms_match_onnx_counts(exported):
    g = load(exported["memopt"])
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


@pytest.mark.slow
@pytest.mark.ort
def test_inputs_outputs_and_size(exported):
    run = exported["plain"]
    stage = load(run).stage("torch_exported")
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
    outputs = load(run).stage("optimized").outputs
    # the training graph returns the gradients; the loss goes via YieldOp
    assert set(outputs["role"]) == {"gradient"}
    assert len(outputs) == len(params)


@pytest.mark.slow
@pytest.mark.ort
def test_diff_finds_what_the_gradient_graph_added(exported):
    g = load(exported["plain"])
    d = g.diff("optimized_pre_grad", "optimized")
    before = onnx_graph(g.files["training", "optimized_pre_grad"])
    after = onnx_graph(g.files["training", "optimized"])
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


@pytest.mark.slow
@pytest.mark.ort
def test_recompute_nodes_only_with_the_memory_optimizer(exported):
    for key, expect in (("plain", False), ("memopt", True)):
        g = load(exported[key])
        names = [n.name for n in onnx_graph(g.files["training", "execution_model"]).node]
        d = g.diff("optimized", "execution_model")
        assert set(d.recompute["name"]) == {n for n in names if n.endswith("_recompute")}
        assert (len(d.recompute) > 0) is expect
        assert (g.stage("execution_model").kinds()["recompute"] > 0) is expect


@pytest.mark.slow
@pytest.mark.ort
def test_fused_nodes_point_at_their_fusion(exported):
    d = load(exported["plain"]).diff("optimized", "execution_model")
    fused = d.fused
    assert len(fused) > 0
    added = set(d.added["name"])
    assert set(fused["fused_into"]) <= added
    matmul = fused[fused["name"] == "/_original_module/blocks/blocks.0/attn/MatMul"]
    assert matmul["fused_into"].iloc[0].startswith("/_original_module/blocks/blocks.0/attn/MatMul/")
    assert d.summary()["fusion_nodes"] > 0


@pytest.mark.slow
@pytest.mark.ort
def test_search_by_name_op_and_module(exported):
    stage = load(exported["plain"]).stage("execution_model")
    nodes = onnx_graph(stage.path).node
    by_module = stage.search("blocks.0/attn", by="module", limit=None)
    assert len(by_module) > 10
    assert ({m.removeprefix("blocks.0.attn") for m in by_module["module"]}
            <= {"", ".qkv", ".proj", ".attn_drop", ".resid_drop"})
    assert len(by_module) == sum("/blocks.0/attn/" in n.name for n in nodes)
    by_op = stage.search("fusedmatmul", by="op", limit=None)
    assert len(by_op) == sum(n.op_type == "FusedMatMul" for n in nodes)
    assert stage.search("YieldOp", by="name")["name"].tolist() == ["YieldOp"]
    assert len(stage.search("no-such-node")) == 0
    with pytest.raises(GraphsError, match="by 'colour' is not allowed; allowed: any, name, op, module"):
        stage.search("x", by="colour")
    grad = "/_original_module/blocks/blocks.1/attn/qkv/MatMul_Grad/FusedMatMul_0"
    assert module_scope(grad) == "blocks.1.attn.qkv"
    assert module_scope("BiasGelu_token_1") == ""
    assert module_scope("/_original_module/_original_module.2/Gemm") == "2"  # a top-level nn.Sequential's child
    assert module_scope("/_original_module/_original_module.0/_original_module.0.1/Gemm") == "0.1"


@pytest.mark.slow
@pytest.mark.ort
def test_neighbourhood_is_the_real_producers_and_consumers(exported):
    stage = load(exported["plain"]).stage("execution_model")
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
    assert svg == nb.svg(engine="ortlab")  # deterministic
    check_svg(svg, nb)
    assert len(stage.neighbourhood(center.name, hops=3).rows) > len(nb.rows)
    small = stage.neighbourhood(center.name, hops=6, max_nodes=5)
    assert small.truncated > 0 and "more not shown" in small.svg(engine="ortlab")
    assert f'"{center.name}"' in nb.to_dot()
    with pytest.raises(GraphsError, match="no node named 'nope'"):
        stage.neighbourhood("nope")
    with pytest.raises(GraphsError, match="hops 0 is not allowed"):
        stage.neighbourhood(center.name, hops=0)


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk (after the signature and the chunk's length and type)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.mark.slow
@pytest.mark.ort
def test_charts_draw_the_numbers_they_show(exported):
    from ortlab.common.plots import figure_png

    g = load(exported["memopt"])
    d = g.diff("optimized", "execution_model")
    fig = d.chart(top=8)
    left, right = fig.axes
    assert left.get_title().startswith("training/optimized → training/execution_model")
    shown = d.ops.head(8).iloc[::-1]  # largest change at the top
    assert [b.get_width() for b in left.patches] == shown["change"].tolist()
    assert [t.get_text().split("  ")[0] for t in left.get_yticklabels()] == shown["op"].tolist()
    s = d.summary()
    names = {round(t.get_position()[1]): t.get_text() for t in right.get_yticklabels()}
    bars = {names[round(b.get_y() + b.get_height() / 2)]: b.get_width() for b in right.patches}
    assert bars["recompute"] == s["recompute"] > 0 and bars["fused away"] == s["fused_away"]
    assert sum(bars.values()) == s["added"] + s["removed"]
    png = figure_png(fig)
    assert png_size(png) == (900, round(fig.get_figheight() * 100))  # 9 inches at 100 dpi

    summary = g.summary("training")
    fig = g.chart()
    ax = fig.axes[0]
    per_stage = [0] * len(summary)
    for bar in ax.patches:  # stacked by kind: the heights add up to each stage's node count
        per_stage[round(bar.get_x() + bar.get_width() / 2)] += bar.get_height()
    assert per_stage == summary["nodes"].tolist()
    assert [t.get_text() for t in ax.texts] == [str(n) for n in summary["nodes"]]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(ortlab.graphs.KINDS)
    assert png_size(figure_png(fig)) == (700, 300)


@pytest.mark.slow
@pytest.mark.ort
def test_clear_errors_for_folders_without_graphs(exported, tmp_path):
    with pytest.raises(GraphsError, match=f"no ORTModule stage files in {tmp_path}"):
        load(tmp_path)
    with pytest.raises(GraphsError, match="only ORTModule bursts export graphs"):
        load(exported["pytorch"])
    with pytest.raises(GraphsError, match="does not exist"):
        load(tmp_path / "missing")
    g = load(exported["plain"])
    with pytest.raises(GraphsError, match=r"stage 'optimised' is not in .*; stages there: torch_exported"):
        g.stage("optimised")
    with pytest.raises(GraphsError, match="mode 'inference' has no stage files"):
        g.stages("inference")
    for f in g.files.values():
        shutil.copy(f, tmp_path / f.name)
        shutil.copy(f, tmp_path / f.name.replace("model_", "other_", 1))
    with pytest.raises(GraphsError, match="several exports; pick one with prefix=: model, other"):
        load(tmp_path)
    assert load(tmp_path, prefix="other").stage().node_count == g.stage().node_count


@pytest.mark.slow
@pytest.mark.ort
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

        return Workload(w.model, batch, w.loss, name="gpt with a switchable input dtype",
                        batch_size=w.batch_size)

    options = {"save_onnx": True, "skipcheck_policy": "SKIP_CHECK_DISABLED"}
    with Session(make, out=tmp_path / "runs", in_process=True) as s:
        first = s.burst("ortmodule", 1, options, progress=False)
        dtype_file.write_text("int32")
        second = s.burst("ortmodule", 1, options, progress=False)
    t = load(second).transitions
    assert t["action"].tolist() == ["re-export"] and t["ort_exported"].tolist() == [True]
    assert t["input_schema"].iloc[0] == "Tensor[int64, rank 2] -> Tensor[int32, rank 2]"
    assert load(first).transitions["input_schema"].tolist() == ["idx: int64, rank 2"]
    dtypes = [load(r).stage("torch_exported").inputs.set_index("name").loc["idx", "dtype"]
              for r in (first, second)]
    assert dtypes == ["int64", "int32"]


def _cli(*args):
    from ortlab.cli import main

    return main(["graphs", *map(str, args)])


@pytest.mark.slow
@pytest.mark.ort
def test_cli(exported, capsys, tmp_path):
    run = exported["memopt"].path
    assert _cli(run) == 0
    out = capsys.readouterr().out
    assert "optimized_pre_grad -> optimized" in out and "why ORTModule exported" in out and "re-wrap" in out
    assert _cli(run, "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["stage"] for r in data["stages"]] == list(STAGES)
    assert data["diffs"]["training"][-1]["recompute"] > 0
    assert _cli(run, "--diff", "optimized", "execution_model", "--json") == 0
    assert json.loads(capsys.readouterr().out)["recompute"] > 0
    assert _cli(run, "--stage", "optimized", "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["histogram"]["com.microsoft::YieldOp"] == 1
    assert [i["elements"] for i in data["inputs"] if i["role"] == "user input"] == [None]  # null, not NaN
    assert _cli(run, "--search", "LayerNormalization") == 0
    assert "ln_f" in capsys.readouterr().out
    assert _cli(run, "--stage", "nope") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ortlab graphs: stage 'nope' is not in")
    assert _cli(exported["folder"], "--mode", "inference", "--json") == 0  # ran in eval mode too: that mode only
    data = json.loads(capsys.readouterr().out)
    assert data["modes"] == ["inference"] and {r["mode"] for r in data["stages"]} == {"inference"}
    assert list(data["diffs"]) == ["inference"]


def test_cli_bad_input_is_one_line_exit_2(capsys, tmp_path):
    assert _cli(tmp_path) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"ortlab graphs: no ORTModule stage files in {tmp_path}")
    assert _cli(tmp_path / "missing") == 2
    assert "does not exist" in capsys.readouterr().err


def test_cli_a_mode_without_stages_is_bad_input(built, capsys):
    """`--mode inference` on an export with training stages only says so (exit 2), listing or not; --mode
    picks what the listing shows."""
    assert _cli(built, "--mode", "inference") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "mode 'inference' has no stage files" in err and "modes here: training" in err
    assert _cli(built, "--mode", "inference", "--stage", "execution_model") == 2
    assert "mode 'inference'" in capsys.readouterr().err
    assert _cli(built, "--mode", "training", "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["modes"] == ["training"] and {r["mode"] for r in data["stages"]} == {"training"}


def test_plain_functions_no_shadowed_modules_and_a_light_import():
    """`ortlab.graphs` is a package of modules; `load` (also `ortlab.load_graphs`) is a function, and stays
    one after every submodule is imported."""
    subs = [m.name for m in pkgutil.iter_modules(ortlab.graphs.__path__)]
    assert {"collection", "diff", "stage", "svg", "netron"} <= set(subs)
    for name in subs:
        importlib.import_module(f"ortlab.graphs.{name}")
    public = set(ortlab.graphs.__all__)
    assert not public & set(subs), "a public name equal to a submodule's is rebound when the submodule loads"
    assert all(hasattr(ortlab.graphs, n) for n in public)
    assert ortlab.load_graphs is ortlab.graphs.load is load and callable(load)
    assert issubclass(GraphsError, ortlab.InputError)
    code = ("import sys, ortlab, ortlab.graphs, ortlab.cli.graphs; ortlab.load_graphs; print(sorted(m for m "
            "in ('onnx', 'matplotlib', 'torch', 'pandas', 'onnxruntime') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


# --------------------------------------------------------------------------------------------- netron


def test_netron_serves_each_file_and_stops(built, monkeypatch):
    from ortlab.graphs import netron_status, serve

    paths = [built / "tiny_torch_exported_training.onnx", built / "tiny_execution_model_training.onnx"]
    servers = [serve(paths[0]), serve(paths[1], consent=False)]
    try:
        for server, path in zip(servers, paths, strict=True):  # two at once, each its own file
            assert server.host == "127.0.0.1" and server.port > 0
            with urllib.request.urlopen(server.model_url, timeout=10) as r:
                assert r.status == 200 and r.read() == path.read_bytes()
            with urllib.request.urlopen(server.url, timeout=10) as r:
                page = r.read().decode()
                assert r.status == 200 and f'content="/data/{path.name}"' in page
                cookie = r.headers["Set-Cookie"]
            assert f'src="http://127.0.0.1:{server.port}/"' in server.iframe_html()
        assert cookie is None  # consent=False: netron asks itself
        with urllib.request.urlopen(servers[0].url, timeout=10) as r:
            cookie = r.headers["Set-Cookie"]
        assert cookie.startswith("consent=") and "Partitioned" in cookie  # also inside a cross-site iframe
        monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/ada/")
        assert servers[0].browser_url == f"/user/ada/proxy/{servers[0].port}/"
        assert repr(servers[0]) == "NetronServer('tiny_torch_exported_training.onnx', serving)"
    finally:
        for server in servers:
            server.stop()
    assert not any(server.alive for server in servers)
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(servers[0].url, timeout=5)
    import datetime as dt

    ok, message = netron_status(today=dt.date.today() + dt.timedelta(days=3650))
    assert not ok and "refuses to render builds older than 180 days" in message and "\n" not in message
    assert netron_status()[0]


def test_netron_missing_or_no_file_is_one_line(built, monkeypatch, tmp_path):
    from ortlab.graphs import NetronError, netron_status, serve

    with pytest.raises(GraphsError, match=r"is not a file: give an \.onnx stage file"):
        serve(tmp_path / "missing.onnx")
    monkeypatch.setitem(sys.modules, "netron", None)  # as if it were not installed
    assert netron_status() == (False, "netron is not installed (pip install netron): showing ortlab's own "
                                      "graph view instead")
    with pytest.raises(NetronError, match="netron is not installed"):
        serve(built / "tiny_execution_model_training.onnx")


@pytest.mark.slow
@pytest.mark.ort
def test_netron_missing_the_panel_says_so_and_keeps_its_own_view(exported, monkeypatch):
    from ortlab.widgets.graphs import GraphsPanel

    monkeypatch.setitem(sys.modules, "netron", None)  # as if it were not installed
    panel = GraphsPanel(lambda: [exported["plain"]])
    panel.netron_button.click()
    assert "netron is not installed" in panel.status.value and panel.netron is None
    assert panel.tabs.selected_index == 2  # the Search tab: ortlab's own neighbourhood view


# --------------------------------------------------------------------------------------------- the panel


@pytest.mark.slow
@pytest.mark.ort
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
    assert png_size(bytes(panel.chart.value))[0] == 900 and "Recompute nodes added" in panel.diff_table.value
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
    assert "no runs yet" in empty.status.value
    assert repr(empty) == "GraphsPanel(runs=0, stage=None, netron=off)"


# ------------------------------------------------------------------------------------ in a real browser


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="Debian's chromium is not installed (scripts/ensure-chromium installs it as root)")
@pytest.mark.ort
def test_netron_renders_in_chromium_without_the_consent_prompt(exported, tmp_path, shots_dir):
    """netron inside an iframe of a page from another site (a notebook at localhost, netron at 127.0.0.1): the
    cookie ortlab sets must reach netron's page there too. The screenshots docs/graphs.md shows go to a
    temporary folder, to docs/img/ with ORTLAB_UPDATE_SCREENSHOTS=1."""
    import functools
    import http.server
    import threading
    import time

    from playwright.sync_api import sync_playwright

    from ortlab.common.plots import figure_png
    from ortlab.graphs import serve

    shots = shots_dir
    shots.mkdir(parents=True, exist_ok=True)
    g = load(exported["memopt"])
    stage = g.stage("execution_model")
    center = stage.search("YieldOp", by="op")["name"].iloc[0]
    (tmp_path / "diff.png").write_bytes(figure_png(g.diff("optimized", "execution_model").chart()))
    server = serve(load(exported["plain"]).stage("execution_model").path)
    (tmp_path / "host.html").write_text(
        f"<html><body style='font-family:sans-serif'>{server.iframe_html(700)}</body></html>")
    (tmp_path / "builtin.html").write_text(
        "<html><head><meta charset='utf-8'></head><body style='font-family:sans-serif;margin:8px'>"
        f"{stage.neighbourhood(center, hops=2).svg('ortlab')}<br><img src='diff.png'></body></html>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *a: None
    host = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=host.serve_forever, daemon=True).start()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=[
                "--disable-gpu", "--no-first-run", "--disable-background-networking"])
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


@pytest.mark.slow
@pytest.mark.ort
def test_statistics_taps_are_ortlabs_not_the_models(exported, tmp_path):
    """A burst that collects statistics adds ortlab's taps (PythonOp, PythonOpGrad) to the graph: the views count
    the model's operators without them, and the memory account counts a tap's output as its input's tensor."""
    from ortlab.account import memory

    with Session(out=tmp_path, in_process=True) as s:
        stats = s.burst("ortmodule", 1, {"save_onnx": True}, collect={"stats": {}}, progress=False)
    assert stats.ok, stats.error
    plain, tapped = load(exported["plain"].path), load(stats.path)
    before, after = plain.stage("torch_exported"), tapped.stage("torch_exported")
    assert after.taps > 0 and before.taps == 0
    assert after.histogram().equals(before.histogram())  # the model's operators, with and without statistics
    assert after.node_count == before.node_count and after.summary()["ortlab_taps"] == after.taps
    assert "ortlab's statistics taps" in after.taps_note
    execution = tapped.stage("execution_model")
    assert not any(op.endswith("PythonOp") or op.endswith("PythonOpGrad") for op in execution.histogram().index)
    account = memory(stats.path)
    held = [t for t in account.top_tensors if t["op"] in ("PythonOp", "PythonOpGrad")]
    assert held and all(t["bytes"] == 8 and t["name"].endswith("_ctx") for t in held)  # a context handle each
    assert "ortlab's statistics taps" in account.what
