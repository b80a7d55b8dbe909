"""The activation-memory account (ortlab.account): hand-built graphs whose liveness is worked out by hand, a
graph with a size nobody can know, real ORTModule execution graphs of the demo (memory optimizer off and on,
beside ORT's own prediction), PyTorch's saved-tensor account, the figure and the CLI."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ortlab.account import AccountError, MemoryAccount, memory, timeline_figure, torch_memory
from ortlab.account.dims import evaluate
from ortlab.account.order import execution_order

F32, I64, MS = 1, 7, "com.microsoft"


def _save(path: Path, nodes, inputs, outputs, initializers, infos) -> Path:
    import onnx
    from onnx import helper

    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers, value_info=infos)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    onnx.save(model, str(path))
    return path


def tiny_training_graph(path: Path) -> Path:
    """x[batch,8] @ w[8,8] -> Relu -> Reshape -> Dropout (mask unused) -> Mul c -> YieldOp; backward Mul,
    Reshape, ReluGrad, Gemm -> w_grad. Shapes symbolic in `batch`, as ORT saves them.

    By hand at batch=2 (float32 [2,8] and [16] = 64 bytes, the bool mask 16 bytes), ORT's CPU planner:
    step 0 MatMul h (64); 1 Relu writes r into h's buffer (h's last reader, same size); 2 Reshape v is a view
    of it; 3 Dropout m (64) and mask (16, nobody reads it: freed at once); 4 Mul y (64), m freed; 5 YieldOp:
    y handed over, dy (64) comes in from PyTorch and stays; 6 Mul dv (64); 7 Reshape dr views dv; 8 ReluGrad
    dh (64) reads r: h's buffer and dv's freed; 9 Gemm writes the gradient w_grad (256, counted apart).
    Live bytes: 64, 64, 64, 144, 192, 192, 192, 192, 256, 128. Peak 256 at step 8; h's buffer (64) is the
    only forward buffer alive across the yield."""
    from onnx import helper

    t, node, at = helper.make_tensor_value_info, helper.make_node, "/_original_module"
    nodes = [
        node("MatMul", ["x", "w"], ["h"], name=f"{at}/fc/MatMul"),
        node("Relu", ["h"], ["r"], name=f"{at}/act/Relu"),
        node("Reshape", ["r", "s_flat"], ["v"], name=f"{at}/Reshape"),
        node("Dropout", ["v"], ["m", "mask"], name=f"{at}/drop/Dropout"),
        node("Mul", ["m", "c"], ["y"], name=f"{at}/Mul"),
        node("YieldOp", ["y"], ["y_grad"], name="YieldOp", domain=MS, full_shape_outputs=[0]),
        node("Mul", ["y_grad", "c"], ["v_grad"], name=f"{at}/Mul_Grad/Mul_0"),
        node("Reshape", ["v_grad", "s_back"], ["r_grad"], name=f"{at}/Reshape_Grad/Reshape_0"),
        node("ReluGrad", ["r_grad", "r"], ["h_grad"], name=f"{at}/act/Relu_Grad/ReluGrad_0", domain=MS),
        node("Gemm", ["x", "h_grad"], ["w_grad"], name=f"{at}/fc/MatMul_Grad/Gemm_0", transA=1),
    ]
    inits = [helper.make_tensor("s_flat", I64, [1], [-1]), helper.make_tensor("s_back", I64, [2], [-1, 8]),
             helper.make_tensor("c", F32, [16], [0.5] * 16)]
    infos = [t("h", F32, ["batch", 8]), t("r", F32, ["batch", 8]), t("v", F32, ["batch*8"]),
             t("m", F32, ["batch*8"]), t("mask", 9, ["batch*8"]), t("y", F32, ["batch*8"]),
             t("y_grad", F32, ["batch*8"]), t("v_grad", F32, ["batch*8"]), t("r_grad", F32, ["batch", 8]),
             t("h_grad", F32, ["batch", 8])]
    return _save(path, nodes, [t("x", F32, ["batch", 8]), t("w", F32, [8, 8])], [t("w_grad", F32, [8, 8])],
                 inits, infos)


def recompute_graph(path: Path) -> Path:
    """h = x @ w, s = Sin(h) to the YieldOp; backward cos(h) from a recompute of h. In the file the recompute
    sits before the forward's Sin (as if ORT's default order had put it there). x [4,8], w [8,256]: every
    activation is 4096 bytes.

    File order: MatMul, MatMul_recompute, Sin, YieldOp, Cos, Mul, Gemm; h_recompute crosses the yield.
    Live: 4096, 8192, 12288 (Sin reads h, writes s, h_recompute waits), 12288, 12288, 12288, 8192.
    Memory-efficient order: MatMul, Sin, YieldOp, then the branch {MatMul_recompute, Cos} right before Mul,
    its first backward reader: live 4096, 8192, 8192, 8192, 12288, 12288, 8192; nothing crosses the yield."""
    from onnx import helper

    t, node, at = helper.make_tensor_value_info, helper.make_node, "/_original_module"
    nodes = [
        node("MatMul", ["x", "w"], ["h"], name=f"{at}/fc/MatMul"),
        node("MatMul", ["x", "w"], ["h_recompute"], name=f"{at}/fc/MatMul_recompute"),
        node("Sin", ["h"], ["s"], name=f"{at}/Sin"),
        node("YieldOp", ["s"], ["s_grad"], name="YieldOp", domain=MS, full_shape_outputs=[0]),
        node("Cos", ["h_recompute"], ["c"], name=f"{at}/Sin_Grad/Cos_0"),
        node("Mul", ["s_grad", "c"], ["h_grad"], name=f"{at}/Sin_Grad/Mul_1"),
        node("Gemm", ["x", "h_grad"], ["w_grad"], name=f"{at}/fc/MatMul_Grad/Gemm_0", transA=1),
    ]
    infos = [t(n, F32, [4, 256]) for n in ("h", "s", "s_grad", "c", "h_grad")]  # h_recompute: none, as in ORT
    inputs, outputs = [t("x", F32, [4, 8]), t("w", F32, [8, 256])], [t("w_grad", F32, [8, 256])]
    return _save(path, nodes, inputs, outputs, [], infos)


# --------------------------------------------------------------------------- by hand


def test_tiny_graph_exact_bytes_by_hand(tmp_path):
    a = memory(tiny_training_graph(tmp_path / "m_execution_model_training.onnx"), dims={"batch": 2})
    assert isinstance(a, MemoryAccount) and a.exact and a.order == "default"
    assert a.steps["live"] == [64, 64, 64, 144, 192, 192, 192, 192, 256, 128]
    assert a.steps["phase"] == ["forward"] * 5 + ["yield"] + ["backward"] * 4
    assert (a.peak_activation_bytes, a.peak_index, a.peak_phase) == (256, 8, "backward")
    assert a.peak_op == "ReluGrad"
    assert (a.yield_index, a.yield_activation_bytes, a.stashed_bytes) == (5, 192, 64)
    # apart: parameter w 256, input x 64, constants s_flat 8 + s_back 16 + c 64, gradient w_grad 256
    assert (a.parameter_bytes, a.input_bytes, a.constant_bytes, a.gradient_bytes) == (256, 64, 88, 256)
    assert a.steps["gradients"][-1] == 256 and a.optimizer_state_bytes is None
    top = {t["name"]: t for t in a.top_tensors}
    assert set(top) == {"r", "y_grad", "v_grad", "h_grad"}  # h's buffer holds r (Relu wrote it in place)
    assert top["r"]["buffer"] == "h" and top["r"]["views"] == 2 and top["r"]["module"] == "act"
    assert top["r"]["born"] == "forward" and top["y_grad"]["op"] == "YieldOp"
    assert all(t["bytes"] == 64 for t in a.top_tensors)
    df = a.timeline
    assert list(df.columns) == ["index", "node", "op", "phase", "live_bytes", "gradient_bytes", "uncertain"]
    assert df["live_bytes"].max() == 256 and len(df) == 10
    data = json.loads(json.dumps(a.to_dict(timeline=True)))
    assert data["peak_activation_bytes"] == 256 and data["timeline"]["live"][3] == 144 and data["exact"]
    assert "counted apart" in a.what.lower() and "256" not in repr(a)  # repr in MB


def test_dims_from_input_shapes_and_missing_symbol(tmp_path):
    path = tiny_training_graph(tmp_path / "m_execution_model_training.onnx")
    assert memory(path, input_shapes={"x": (2, 8)}).peak_activation_bytes == 256
    assert memory(path, dims={"batch": 4}).peak_activation_bytes == 512  # everything but w scales with batch
    with pytest.raises(AccountError, match="batch"):
        memory(path)
    with pytest.raises(AccountError, match="rank"):
        memory(path, input_shapes={"x": (2,)})
    with pytest.raises(AccountError, match="not an input"):
        memory(path, input_shapes={"nope": (2, 8)})


def test_symbolic_dimensions_are_evaluated_never_executed():
    values = {"input_ids_dim0": 2, "input_ids_dim1": 128, "labels_dim1": 127}
    assert evaluate("input_ids_dim0*input_ids_dim1", values) == 256
    assert evaluate("labels_dim1 + 1", values) == 128
    assert evaluate("floor(input_ids_dim1/3)", values) == 42
    assert evaluate("Max(input_ids_dim0, 3)*2", values) == 6
    assert evaluate("unk__12*2", values) is None  # a data-dependent size: unknown, not guessed
    assert evaluate("input_ids_dim1/3", values) is None  # not a whole number
    assert evaluate("__import__('os').getcwd()", values) is None


def test_memory_efficient_order_runs_recompute_in_backward(tmp_path):
    path = recompute_graph(tmp_path / "m_execution_model_training.onnx")
    from ortlab.account.graph import read_graph

    g = read_graph(path)
    order, used = execution_order(g, "memory_efficient")
    assert used == "memory_efficient"
    assert [g.names[i].rsplit("/", 1)[-1] for i in order] == [
        "MatMul", "Sin", "YieldOp", "MatMul_recompute", "Cos_0", "Mul_1", "Gemm_0"]
    auto = memory(path)  # recompute nodes in a bare graph: ORT's memory optimizer was on
    assert auto.order == "memory_efficient" and "recompute" in auto.order_reason
    assert auto.steps["live"] == [4096, 8192, 8192, 8192, 12288, 12288, 8192]
    assert auto.stashed_bytes == 0 and auto.peak_phase == "backward" and auto.exact  # h_recompute: shape of h
    file_order = memory(path, order="default")
    assert file_order.steps["live"] == [4096, 8192, 12288, 12288, 12288, 12288, 8192]
    assert file_order.stashed_bytes == 4096 and file_order.peak_index == 2
    with pytest.raises(AccountError, match="order"):
        memory(path, order="fastest")


def test_unknown_size_is_reported_not_guessed(tmp_path):
    """A custom op ONNX cannot infer, whose output has no saved shape: its buffer is named as uncertain, left
    out of the bytes, and the peak says it is a lower bound."""
    from onnx import helper

    t, node, at = helper.make_tensor_value_info, helper.make_node, "/_original_module"
    nodes = [node("MatMul", ["x", "w"], ["h"], name=f"{at}/fc/MatMul"),
             node("Mystery", ["h"], ["q"], name=f"{at}/odd/Mystery", domain="custom.ops"),
             node("Add", ["h", "q"], ["y"], name=f"{at}/Add"),
             node("YieldOp", ["y"], ["y_grad"], name="YieldOp", domain=MS, full_shape_outputs=[0]),
             node("Gemm", ["x", "y_grad"], ["w_grad"], name=f"{at}/fc/MatMul_Grad/Gemm_0", transA=1)]
    path = _save(tmp_path / "m_execution_model_training.onnx", nodes,
                 [t("x", F32, [2, 8]), t("w", F32, [8, 8])], [t("w_grad", F32, [8, 8])], [],
                 [t("h", F32, [2, 8]), t("y", F32, [2, 8]), t("y_grad", F32, [2, 8])])
    a = memory(path)
    assert not a.exact
    assert [(u["name"], u["op"], u["bytes"]) for u in a.uncertain] == [("q", "Mystery", None)]
    assert a.uncertain[0]["module"] == "odd" and "no shape" in a.uncertain[0]["reason"]
    assert a.uncertain_at_peak == 1 and a.steps["uncertain"] == [0, 1, 1, 0, 0]
    assert a.peak_activation_bytes == 128  # h and y (64 each) at the Add; q not counted
    assert "lower bound" in a.what and "unknown size" in a.report()


def test_run_folder_uses_recorded_shapes_options_and_optimizer(tmp_path):
    """A run folder: the graph from onnx/, the dims from ort.json `input_shapes`, ORT's parameters from its
    post-export record, the order from the options, the optimizer state from the config (AdamW: 2 moments)."""
    run = tmp_path / "20260101-000000-ortmodule"
    (run / "onnx").mkdir(parents=True)
    tiny_training_graph(run / "onnx" / "model_execution_model_training.onnx")
    meta = {"status": "ok", "backend": "ortmodule", "device": "cpu", "effective_options": {"save_onnx": True},
            "config": {"optimizer": "adamw", "options": {"save_onnx": True}}}
    (run / "meta.json").write_text(json.dumps(meta))
    ort = {"post_export": {"user_inputs": ["x"], "graph_inputs_requiring_grad": ["w"]},
           "input_shapes": {"x": [2, 8]}}
    (run / "ort.json").write_text(json.dumps(ort))
    a = memory(run)
    assert a.run == run.name and a.dims == {"batch": 2} and a.device == "cpu" and a.order == "default"
    assert a.peak_activation_bytes == 256 and a.optimizer == "adamw" and a.optimizer_state_bytes == 2 * 256
    assert memory(run, dims={"batch": 4}).dims == {"batch": 4}  # a given symbol overrides the recorded one
    with pytest.raises(AccountError, match="no input symbol 'bach'; its symbols: batch"):
        memory(run, dims={"bach": 4})  # a typo is named, not ignored beside the recorded value
    for made, state in (("AdamW", 2 * 256), ("SGD", None), (None, 2 * 256)):  # optimizer "auto": what the burst made
        meta["config"]["optimizer"], meta["optimizer"] = "auto", made  # (another's SGD: its momentum is not known)
        (run / "meta.json").write_text(json.dumps(meta))
        a = memory(run)
        assert (a.optimizer, a.optimizer_state_bytes) == ((made or "AdamW").lower(), state), made
    meta["effective_options"]["memory_opt_level"] = 1
    (run / "meta.json").write_text(json.dumps(meta))
    assert memory(run).order == "memory_efficient"


def test_bad_sources_name_the_problem(tmp_path):
    with pytest.raises(AccountError, match="does not exist"):
        memory(tmp_path / "nope")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(AccountError, match="not a readable ONNX model"):
        memory(bad)
    with pytest.raises(AccountError, match="no ORTModule stage files"):
        memory(tmp_path)


def test_timeline_figure_overlays_two_accounts(tmp_path):
    path = recompute_graph(tmp_path / "m_execution_model_training.onnx")
    a, b = memory(path, order="default"), memory(path)
    fig = timeline_figure(a, b, labels=["file order", "memory-efficient"])
    ax = fig.axes[0]
    assert len([line for line in ax.lines if len(line.get_xdata()) > 2]) == 2  # not the yield and peak marks
    assert any("MatMul" in text.get_text() or "h" in text.get_text() for text in ax.texts)
    assert "file order: peak" in fig.legends[0].get_texts()[0].get_text()
    # each peak's words sit above every curve, inside the axes: they never cover a curve
    highest = max(max(line.get_ydata()) for line in ax.lines if len(line.get_xdata()) != 2)  # not the yield
    for text in ax.texts:
        assert highest < text.xyann[1] <= ax.get_ylim()[1]
    with pytest.raises(AccountError):
        timeline_figure(a, labels=["one", "two"])


# --------------------------------------------------------------------------- CLI


def _cli(argv):
    """`ortlab memory ...` through the view's own parser and command (the error -> exit code mapping is the
    CLI's, tested by test_cli_subprocess_exit_codes once `memory` is registered there)."""
    import argparse

    from ortlab.cli import memory as memory_cli

    p = argparse.ArgumentParser(prog="ortlab")
    memory_cli.register(p.add_subparsers(dest="command"))
    args = p.parse_args(argv)
    return args.func(args)


def test_cli_json_and_text(tmp_path, capsys):
    path = tiny_training_graph(tmp_path / "m_execution_model_training.onnx")
    assert _cli(["memory", str(path), "--json", "--dim", "batch=2", "--top", "2"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["peak_activation_bytes"] == 256 and len(data["top_tensors"]) == 2 and "timeline" not in data
    assert _cli(["memory", str(path), "--input-shape", "x=2x8"]) == 0
    out = capsys.readouterr().out
    assert "peak 0.000 MB" in out and "counted apart" in out and "ReluGrad" in out
    with pytest.raises(AccountError):  # the CLI turns it into one line and exit 2
        _cli(["memory", str(tmp_path / "nope")])
    from ortlab.cli.common import CliError

    with pytest.raises(CliError, match="SYMBOL=VALUE"):
        _cli(["memory", str(path), "--dim", "batch"])


def _registered() -> bool:
    import contextlib
    import io

    try:
        from ortlab.cli import build_parser

        with contextlib.redirect_stderr(io.StringIO()):
            build_parser().parse_args(["memory", "x"])
    except (ImportError, SystemExit):  # the CLI package is being rebuilt, or has no `memory` yet
        return False
    return True


@pytest.mark.skipif(not _registered(), reason="`memory` is not registered in ortlab/cli/__init__.py yet")
def test_cli_subprocess_exit_codes(tmp_path):
    path = tiny_training_graph(tmp_path / "m_execution_model_training.onnx")
    command = [sys.executable, "-m", "ortlab.cli", "memory"]
    ok = subprocess.run([*command, str(path), "--json", "--dim", "batch=2"], capture_output=True, text=True,
                        timeout=120)
    assert ok.returncode == 0 and json.loads(ok.stdout)["peak_activation_bytes"] == 256
    bad = subprocess.run([*command, str(tmp_path / "nope")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and bad.stderr.startswith("ortlab memory: ")


# --------------------------------------------------------------------------- PyTorch


def test_torch_account_on_the_demo_is_positive_and_stable():
    a, b = torch_memory(), torch_memory()
    assert a.saved_bytes > 0 and a.saved_bytes == b.saved_bytes and a.per_module == b.per_module
    assert a.peak_saved_bytes >= a.saved_bytes and a.loss_saved_bytes > 0
    assert a.inputs == {"0": [8, 64]} and a.state_saved_bytes > 0  # weights saved for the matmuls, apart
    modules = {m["module"] for m in a.per_module}
    assert {"blocks.0.attn", "blocks.1.mlp.1", "(loss)"} <= modules
    # the attention probabilities after dropout: float32 [8, 4, 64, 64] = 0.5 MB, saved by the second matmul
    assert any(t["shape"] == [8, 4, 64, 64] and t["bytes"] == 524288 for t in a.top_tensors)
    assert "saved" in a.report() and a.to_dict()["saved_bytes"] == a.saved_bytes


def test_torch_account_of_a_module_needs_inputs():
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    a = torch_memory(model, torch.ones(3, 4))
    # Linear saves its input (x: given, apart); ReLU saves its output [3, 8] (96 bytes), the second Linear
    # saves the same tensor again: one storage, counted once
    assert a.saved_bytes == 96 and a.tensors == 1 and a.input_saved_bytes == 48
    with pytest.raises(AccountError, match="inputs="):
        torch_memory(model)


# --------------------------------------------------------------------------- real ORTModule graphs


def _burst(kwargs: dict, level: int, out: Path):
    """One real ORTModule step of the demo with save_onnx; the run and ORT's memory observer after it."""
    from ortlab.engine import BurstConfig, Engine
    from ortlab.options import Options
    from ortlab.workload import ModelRef

    engine = Engine(ModelRef.of(None, **kwargs))
    options = Options({"save_onnx": True, "memory_opt_level": level})
    path = engine.run(BurstConfig(backend="ortmodule", steps=1, options=options, out=str(out)))
    return path, engine.backend("ortmodule").wrapper.internals().memory_observer()


@pytest.mark.slow
@pytest.mark.parametrize("kwargs", [{}, {"n_layer": 3, "d_model": 128, "seq_len": 128, "batch_size": 8}],
                         ids=["demo", "larger"])
@pytest.mark.ort
def test_real_graphs_level_1_lowers_the_peak_against_ort_prediction(tmp_path, kwargs):
    base, observer = _burst(kwargs, 0, tmp_path)
    lowered, observer1 = _burst(kwargs, 1, tmp_path)
    dims = observer.dims  # ORT's own values of the symbolic dimensions, from the first batch
    assert set(dims) == {"idx_dim0", "idx_dim1"}
    a0, a1 = memory(base, dims=dims), memory(lowered, dims=dims)
    assert a0.exact and a1.exact  # every activation's size known: recompute shapes copied, the rest inferred
    assert (a0.order, a1.order) == ("default", "memory_efficient")
    assert a1.peak_activation_bytes < a0.peak_activation_bytes
    assert a1.stashed_bytes < a0.stashed_bytes / 4
    assert a0.parameter_bytes == a0.gradient_bytes > 0 and a0.optimizer_state_bytes == 2 * a0.parameter_bytes
    # ORT's prediction: the sum of its level-1 plans' symbolic savings at these dims. The account sees more
    # leave the stash, exactly by outputs ORT's plan summaries leave out: a summary has one term per
    # occurrence of its subgraph, one stashed output each, while recomputing a Dropout removes both its output
    # and its mask, a LayerNormalization its Y, mean and inv_std. On the demo: 6.40 MB accounted against
    # ORT's 5.89 MB (the two attention-dropout masks, 262,144 bytes, and the LayerNorm outputs beyond one per
    # occurrence, two Y and eight mean/inv_std, 278,528 bytes); on the larger model 39.69 MB against 32.31 MB.
    predicted = sum(float(p.ort_saving) for p in observer1.plans)
    saved_from_stash = a0.stashed_bytes - a1.stashed_bytes
    kept = {t["buffer"] for t in a1.stashed_tensors}
    removed = [t for t in a0.stashed_tensors if t["buffer"] not in kept]
    multi_output = sum(t["bytes"] for t in removed if t["op"] in ("Dropout", "LayerNormalization"))
    assert sum(t["bytes"] for t in removed) - saved_from_stash < 1024  # a few shape tensors newly kept
    assert 0 < saved_from_stash - predicted < multi_output
    # The peak falls by less than the stash: the recomputed activations live again in backward, so the peak
    # moves into the backward pass of the last block, where its recomputed activations meet the gradients.
    assert a0.peak_activation_bytes - a1.peak_activation_bytes < saved_from_stash
    assert a1.peak_phase == "backward" and any(t["name"].endswith("_recompute") for t in a1.top_tensors)
    top = a0.top_tensors[0]  # the largest at the peak: an attention-sized or MLP-sized float32 buffer
    b, t = dims["idx_dim0"], dims["idx_dim1"]
    assert top["bytes"] in (b * 4 * t * t * 4, b * t * 4 * kwargs.get("d_model", 64) * 4)
    assert top["module"].startswith("blocks.")


@pytest.mark.slow
@pytest.mark.ort
def test_a_plan_that_moves_the_stash_saves_nothing(tmp_path):
    """ORT's "Add+" plan on the demo recomputes the four residual sums in backward and predicts 0.5 MB saved.
    But it recomputes them from the dropout outputs they add, which nothing kept before and which must now
    stay until backward: the account sees the four sums leave the stash and four dropout outputs of the same
    size join it, a saving of exactly 0 (at the peak as well)."""
    from ortlab.engine import BurstConfig, Engine
    from ortlab.options import Options
    from ortlab.workload import ModelRef

    config = tmp_path / "plan.json"
    config.write_text(json.dumps(["Add+:1:-1"]))
    engine = Engine(ModelRef.of())
    base = engine.run(BurstConfig(backend="ortmodule", steps=1, options=Options({"save_onnx": True}),
                                  out=str(tmp_path)))
    options = Options({"save_onnx": True, "memory_opt_config": str(config)})
    planned = engine.run(BurstConfig(backend="ortmodule", steps=1, options=options, out=str(tmp_path)))
    observer = engine.backend("ortmodule").wrapper.internals().memory_observer()
    predicted = {p.cluster_id: p.ort_saving for p in observer.plans}
    assert predicted["Add+:1:-1"] == 524288
    dims = {"idx_dim0": 8, "idx_dim1": 64}
    a0, a1 = memory(base, dims=dims), memory(planned, dims=dims)
    assert sum(n.endswith("_recompute") for n in a1.steps["node"]) == 4 and a1.order == "memory_efficient"
    left = {t["name"] for t in a0.stashed_tensors} - {t["name"] for t in a1.stashed_tensors}
    joined = {t["name"] for t in a1.stashed_tensors} - {t["name"] for t in a0.stashed_tensors}
    assert sorted(n.rsplit("/", 1)[-1] for n in left) == ["Add_1_output_0", "Add_1_output_0", "Add_output_0",
                                                          "Add_output_0"]
    assert len(joined) == 4 and all("Dropout_output_0" in n for n in joined)
    assert a1.stashed_bytes == a0.stashed_bytes and a1.peak_activation_bytes == a0.peak_activation_bytes


@pytest.mark.slow
@pytest.mark.ort
def test_a_dim_given_for_a_real_run_keeps_the_recorded_shapes(tmp_path, capsys):
    """`ortlab memory RUN --dim idx_dim1=32`: the demo's recorded batch (idx_dim0 = 8) stays, only the sequence
    length changes; the account at the shorter sequence is smaller."""
    from ortlab.cli import main

    run, _ = _burst({}, 0, tmp_path)
    recorded = memory(run)
    assert recorded.dims == {"idx_dim0": 8, "idx_dim1": 64}
    shorter = memory(run, dims={"idx_dim1": 32})
    assert shorter.dims == {"idx_dim0": 8, "idx_dim1": 32}
    assert 0 < shorter.peak_activation_bytes < recorded.peak_activation_bytes
    assert main(["memory", str(run), "--dim", "idx_dim1=32", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["dims"] == shorter.dims and data["peak_activation_bytes"] == shorter.peak_activation_bytes


# --------------------------------------------------------------------------- where it shows: collector, summary


def bn_workload():
    """A model with a BatchNorm (running statistics: state a forward changes) and a Dropout (random numbers)."""
    import torch

    from ortlab.workload import Workload

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                                torch.nn.Dropout(0.3), torch.nn.Linear(32, 4))

    def batch(step):
        g = torch.Generator().manual_seed(step)
        return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)

    return Workload(model, batch, torch.nn.functional.mse_loss, name="bn", batch_size=8)


def fake_run(folder: Path, backend: str, memory_data: dict | None, options: dict | None = None,
             peak_mem_mb: float = 500.0) -> Path:
    """A finished run folder with one step and the memory.json a burst's collector would have written."""
    folder.mkdir(parents=True)
    meta = {"status": "ok", "backend": backend, "device": "cpu", "effective_options": options or {},
            "config": {"optimizer": "adamw", "options": options or {}}}
    (folder / "meta.json").write_text(json.dumps(meta))
    row = {"step": 0, "loss": 1.0, "step_time_s": 0.01, "samples_per_s": 800.0, "peak_mem_mb": peak_mem_mb}
    (folder / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    if memory_data is not None:
        (folder / "memory.json").write_text(json.dumps(memory_data))
    return folder


def graph_record(account: MemoryAccount) -> dict:
    from ortlab.runs.memory import COUNTS, GRAPH

    return {"kind": GRAPH, "counts": COUNTS[GRAPH], **account.to_dict(timeline=True)}


def autograd_record(account) -> dict:
    from ortlab.runs.memory import AUTOGRAD, COUNTS

    return {"kind": AUTOGRAD, "counts": COUNTS[AUTOGRAD], **account.to_dict()}


def test_untouched_leaves_no_trace():
    import random

    import numpy as np
    import torch

    from ortlab.account.collector import untouched

    model = bn_workload().model.train()
    model[0].weight.grad = torch.ones_like(model[0].weight)
    py, cpu, npy = random.getstate(), torch.get_rng_state(), np.random.get_state()[1].copy()
    stats, grad = model[1].running_mean.clone(), model[0].weight.grad.clone()
    with untouched(model):
        model(torch.randn(5, 16)).sum().backward()
        random.random(), np.random.rand()
    assert random.getstate() == py and torch.equal(torch.get_rng_state(), cpu)
    assert np.array_equal(np.random.get_state()[1], npy)
    assert torch.equal(model[1].running_mean, stats) and torch.equal(model[0].weight.grad, grad)
    assert model[4].weight.grad is None


@pytest.mark.parametrize("factory", [None, bn_workload], ids=["demo", "batchnorm"])
def test_the_collector_leaves_a_pytorch_burst_as_it_was(tmp_path, factory):
    """The autograd account runs a forward and backward before the first step; the burst's losses, the model
    it leaves, and the next burst are those of bursts without it."""
    import torch

    from ortlab.engine import BurstConfig, Engine
    from ortlab.runs.run import load_run
    from ortlab.workload import ModelRef

    engine = Engine(ModelRef.of(factory))

    def burst(collect):
        path = engine.run(BurstConfig(backend="pytorch", steps=3, out=str(tmp_path), collect=collect))
        return load_run(path), {k: v.clone() for k, v in engine.model.state_dict().items()}

    (plain, state), (counted, state_counted), (after, _) = burst({}), burst({"memory": {}}), burst({})
    assert plain.losses == counted.losses == after.losses
    assert all(torch.equal(state[k], state_counted[k]) for k in state)
    assert plain.memory == {} and counted.memory["kind"] == "autograd"
    expected = torch_memory(factory).saved_bytes
    assert counted.memory["saved_bytes"] == expected > 0
    s = counted.summary()
    assert s["saved_for_backward_mb"] == round(expected / 2**20, 3) and "autograd" in s["memory_counts"]
    assert "activation_peak_mb" not in s and "saved_for_backward_mb" not in plain.summary()


def test_summary_reports_accounted_memory_beside_the_process(tmp_path):
    from ortlab.comparison.summary import Comparison
    from ortlab.runs.memory import GRAPH, missing
    from ortlab.runs.run import load_run

    graph = memory(recompute_graph(tmp_path / "m_execution_model_training.onnx"), order="default")
    saved = torch_memory(torch_module(), torch_input())
    pt = load_run(fake_run(tmp_path / "20260101-000000-pytorch", "pytorch", autograd_record(saved)))
    ort = load_run(fake_run(tmp_path / "20260101-000001-ortmodule", "ortmodule", graph_record(graph),
                            {"save_onnx": True}))
    c = Comparison(pt, ort)
    d = c.to_dict()
    assert d["ortmodule"]["activation_peak_mb"] == round(12288 / 2**20, 3)
    assert d["ortmodule"]["saved_for_backward_mb"] == round(graph.stashed_bytes / 2**20, 3)
    assert d["pytorch"]["saved_for_backward_mb"] == round(saved.saved_bytes / 2**20, 3)
    assert d["saved_for_backward_ratio"] == pytest.approx(d["ortmodule"]["saved_for_backward_mb"]
                                                          / d["pytorch"]["saved_for_backward_mb"])
    text = str(c)
    assert "peak resident set (MB)" in text and "peak memory" not in text
    assert "kept for backward (MB)" in text and "activation peak (MB)" in text and "autograd" in text
    assert json.loads(json.dumps(d))["ortmodule"]["memory_counts"].startswith("ORTModule")
    none = load_run(fake_run(tmp_path / "20260101-000002-ortmodule", "ortmodule",
                             missing(GRAPH, "no graph: save_onnx was off")))
    assert none.summary()["memory_missing"] == "no graph: save_onnx was off"
    assert "no activation account for ortmodule: no graph: save_onnx was off" in str(Comparison(pt, none))
    assert MemoryAccount.from_dict(ort.memory).steps == graph.steps
    with pytest.raises(AccountError, match="timeline"):
        MemoryAccount.from_dict(graph.to_dict())


def test_a_single_backend_prints_the_comparison_s_labelled_table(tmp_path):
    """`ortlab burst --backend ortmodule` (or pytorch) prints the same labelled rows as a comparison, one column:
    no raw summary keys, the rows aligned."""
    from ortlab.comparison.summary import Comparison, run_text
    from ortlab.runs.run import load_run

    graph = memory(recompute_graph(tmp_path / "m_execution_model_training.onnx"), order="default")
    saved = torch_memory(torch_module(), torch_input())
    pt = load_run(fake_run(tmp_path / "20260101-000000-pytorch", "pytorch", autograd_record(saved)))
    ort = load_run(fake_run(tmp_path / "20260101-000001-ortmodule", "ortmodule", graph_record(graph),
                            {"save_onnx": True}))
    both = str(Comparison(pt, ort)).splitlines()
    for run, column in ((pt, 1), (ort, 2)):
        text = run_text(run)
        assert "saved_for_backward_mb" not in text and "final_loss" not in text
        lines = text.splitlines()
        table = lines[:8]
        cells = [re.split(r"\s{2,}", r.strip()) for r in table]  # a cell may hold words ("wall time")
        compared = [re.split(r"\s{2,}", r.strip()) for r in both[1:8]]
        assert cells[0] == [run.backend] and [c[:-1] for c in cells[1:]] == [
            c[:-2] for c in compared]  # the comparison's labels, in its order
        assert [c[-1] for c in cells[1:]] == [c[column - 3] for c in compared]
        assert len({len(r) for r in table}) == 1  # aligned: every row as wide
        assert lines[-1].startswith("run: ") and lines[-1].endswith(run.path.name)
        assert "accounted rows: activations only" in text


def torch_module():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2))


def torch_input():
    import torch

    return torch.ones(16, 64)


def test_cli_burst_collects_memory_by_default():
    import argparse

    from ortlab.cli import burst as burst_cli

    p = argparse.ArgumentParser(prog="ortlab")
    burst_cli.register(p.add_subparsers(dest="command"))
    assert burst_cli.collect_settings(p.parse_args(["burst"])) == {"memory": {}}
    assert burst_cli.collect_settings(p.parse_args(["burst", "--no-memory"])) == {}
    assert burst_cli.collect_settings(p.parse_args(["burst", "--no-memory", "--collect", "stats"])) == {"stats": {}}


@pytest.mark.slow
@pytest.mark.ort
def test_the_collector_accounts_ortmodule_bursts_and_says_why_not(tmp_path):
    """With save_onnx: memory.json holds the graph's account, the same as ortlab.memory(run) afterwards; a
    burst that reused the ORTModule has the account of the export it reused; without save_onnx asked for, the
    collector turns it on (the account reads the graph ORT saves)."""
    from ortlab.engine import BurstConfig, Engine
    from ortlab.options import Options
    from ortlab.runs.run import load_run
    from ortlab.workload import ModelRef

    engine = Engine(ModelRef.of())

    def burst(options):
        cfg = BurstConfig(backend="ortmodule", steps=2, options=Options(options), out=str(tmp_path),
                          collect={"memory": {}})
        return load_run(engine.run(cfg))

    first, reused, unsaved = burst({"save_onnx": True}), burst({"save_onnx": True}), burst({})
    assert first.ok and reused.ok and unsaved.ok
    recorded = first.memory
    assert recorded["kind"] == "graph" and recorded["run"] == first.path.name and recorded["exact"]
    again = memory(first)  # from ort.json's input shapes, written after the collector ran
    assert again.to_dict(timeline=True) == {k: v for k, v in recorded.items() if k not in ("kind", "counts")}
    assert reused.memory["peak_activation_bytes"] == recorded["peak_activation_bytes"]
    assert "reused" in reused.memory["note"] and reused.memory["run"] == reused.path.name
    assert unsaved.meta["effective_options"]["save_onnx"] is True and unsaved.memory["kind"] == "graph"
    s = first.summary()
    assert s["activation_peak_mb"] > s["saved_for_backward_mb"] > 0 and s["peak_mem_mb"] > 0
