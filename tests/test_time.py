"""The collector "time" and its tables: real bursts of the demo profiled (torch.profiler, ORT's profiler), the
parts of a step adding up to it, the demo's modules on both backends, the trace file, the CLI, bad input."""

import json

import pytest

from ortlab.errors import InputError
from ortlab.timing.collector import FILE, TRACE, profiled_steps
from ortlab.timing.errors import TimeError
from ortlab.timing.profile import NONE, ROOT, TAPS, module_of

DEMO_MODULES = ("blocks.0.attn.qkv", "blocks.1.attn.proj", "blocks.0.mlp.0", "blocks.1.ln1")


def _burst(engine, tmp_path, backend, steps=7, options=None, **settings):
    from ortlab.engine import BurstConfig
    from ortlab.options import Options
    from ortlab.runs.run import load_run

    cfg = BurstConfig(backend=backend, steps=steps, out=str(tmp_path), collect={"time": settings},
                      options=Options(options or {}))
    return load_run(engine.run(cfg))


@pytest.fixture(scope="module")
def engine():
    from ortlab.engine import Engine
    from ortlab.workload import ModelRef

    return Engine(ModelRef.of())


def _check_run(run, modules=DEMO_MODULES):
    """What every profiled run must hold: its phases add up to each step, kernels inside their phase, the steps
    the engine measured, the cost said, the demo's modules, a trace Perfetto opens."""
    assert run.ok, run.error
    data = json.loads((run.path / FILE).read_text())
    assert data["steps"] == [2, 3, 4] and "error" not in data
    metrics = {r["step"]: r["step_time_s"] for r in run.metrics.to_dict("records")}
    for row in data["step_rows"]:
        phases = [row[f"{p}_s"] for p in ("forward", "backward", "optimizer")]
        assert sum(phases) == pytest.approx(row["step_s"])
        for p in ("forward", "backward", "optimizer"):
            assert 0 <= row[f"{p}_kernels_s"] <= row[f"{p}_s"]
        # the same interval the engine timed, less one loop over the collectors (two clocks read a few calls
        # apart: on a busy machine a torch.compile step came out 5% apart once, so 10%; and a loaded machine's
        # scheduler may take the core between them for a time slice, 13 ms once on a 108 ms step, so 30 ms)
        assert row["step_s"] == pytest.approx(metrics[row["step"]], rel=0.1, abs=0.03)
    assert sum(p["s"] for p in data["parts"]) == pytest.approx(data["step_s"])
    assert data["cost"]["unprofiled_steps"] == 2 and data["cost"]["ratio"] > 0
    seen = {m["module"] for m in data["modules"] if m["s"] > 0}
    assert set(modules) <= seen, seen
    trace = json.loads((run.path / TRACE).read_text())
    assert trace["traceEvents"] and all("ph" in e and "ts" in e for e in trace["traceEvents"][:50])
    return data


# --------------------------------------------------------------------------- settings


@pytest.mark.parametrize("steps", [[0, 2], [2, 7], [2, 2], [], "2", [1.0], 3])
def test_bad_steps_are_refused_before_the_burst(steps):
    from ortlab.engine import BurstConfig

    with pytest.raises(TimeError, match=r"time steps .* not allowed; allowed: a list of distinct steps from 1 to 6"):
        BurstConfig(backend="pytorch", steps=7, collect={"time": {"steps": steps}})


def test_defaults_and_other_bad_settings():
    from ortlab.engine import BurstConfig

    assert profiled_steps({}, 20) == [2, 3, 4] and profiled_steps(None, 4) == [1, 2, 3]
    assert profiled_steps({}, 2) == [1] and profiled_steps({"steps": [5, 1]}, 6) == [1, 5]
    with pytest.raises(InputError, match=r"allowed: \{'steps'"):
        BurstConfig(backend="pytorch", steps=7, collect={"time": {"step": [2]}})
    with pytest.raises(InputError, match="at least 2 steps"):
        BurstConfig(backend="pytorch", steps=1, collect={"time": {}})


def test_module_paths_from_exported_node_names():
    modules = {"blocks", "blocks.1", "blocks.1.mlp", "blocks.1.mlp.0", "tok"}
    assert module_of("/_original_module/blocks/blocks.1/mlp/mlp.0/MatMul_Grad/Gemm_5/Fusion/", modules) \
        == "blocks.1.mlp.0"
    assert module_of("/_original_module/tok/ATen", modules) == "tok"
    assert module_of("/_original_module/Shape", modules) == ROOT
    assert module_of("BiasGelu_token_1_Grad/BiasGeluGrad_dX_0", modules) == NONE
    # a top-level nn.Sequential: ORTModule's wrapper prefixes its children; a Sequential inside it, and a wrapper
    # around a wrapper, likewise
    sequential = {"0", "0.1", "2"}
    assert module_of("/_original_module/_original_module.2/Gemm", sequential) == "2"
    assert module_of("/_original_module/_original_module.0/_original_module.0.1/Gemm_Grad/Gemm_0", sequential) == "0.1"
    assert module_of("/_original_module/_original_module._original_module.2/Gemm", sequential) == "2"


def test_a_run_without_time_data_says_how_to_collect_it(tmp_path, capsys, engine):
    from ortlab.cli import main
    from ortlab.engine import BurstConfig
    from ortlab.runs.run import load_run
    from ortlab.timing.table import time

    run = load_run(engine.run(BurstConfig(backend="pytorch", steps=1, out=str(tmp_path))))
    with pytest.raises(TimeError, match=r"has no time data .*--collect time"):
        time(run)
    with pytest.raises(TimeError, match="at least one run"):
        time()
    assert main(["time", str(run.path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ortlab time: ") and "--collect time" in err and err.count("\n") == 1


# --------------------------------------------------------------------------- real bursts


def test_pytorch_burst_is_profiled_per_module_and_op(tmp_path, engine):
    run = _burst(engine, tmp_path, "pytorch")
    data = _check_run(run, ("blocks.0.attn.qkv", "blocks.1.mlp.0", "(optimizer)"))
    ops = {o["op"] for o in data["ops"]}
    assert "aten::addmm" in ops and any(o.endswith("(autograd)") for o in ops)  # forward and backward
    backward = {m["module"] for m in data["modules"] if m["phase"] == "backward" and m["s"] > 0}
    assert "blocks.0.attn.qkv" in backward  # backward ops follow their forward op's module
    assert not data["nodes"]
    names = {e.get("name") for e in json.loads((run.path / TRACE).read_text())["traceEvents"]}
    assert "ortlab: step 3 backward" in names and "module: blocks.0.attn" in names

    from ortlab.widgets.time import TimePanel

    panel = TimePanel(lambda: [run])
    panel.top.value = 200  # every module
    assert bytes(panel.figure.value[:4]) == b"\x89PNG" and "blocks.0.attn.qkv" in panel.tables.value
    assert panel.tables_of.labels == ["pytorch"]


def test_the_lab_has_a_time_tab_and_switch(tmp_path):
    from ortlab import Lab
    from ortlab.widgets.time import TimePanel

    lab = Lab(out=tmp_path, in_process=True, cuda_available=False)
    try:
        assert "Time" in lab.titles and isinstance(lab.extra_panels["Time"], TimePanel)
        assert lab.burst_panel.profile_time.value is False
        assert "--collect time" in lab.extra_panels["Time"].status.value
    finally:
        lab.close()


@pytest.mark.slow
@pytest.mark.ort
def test_ortmodule_beside_pytorch(tmp_path, engine, capsys):
    from ortlab.cli import main
    from ortlab.timing.table import time

    pt = _burst(engine, tmp_path, "pytorch")
    ort = _burst(engine, tmp_path, "ortmodule")
    data = _check_run(ort)
    assert data["nodes"] and {"op", "module", "node"} <= set(data["nodes"][0])
    assert any(n["phase"] == "backward" for n in data["nodes"])
    outside = [p for p in data["parts"] if p["kind"] == "outside" and p["phase"] != "optimizer"]
    assert all(p["s"] > 0 for p in outside) and "outside ORT's kernels" in outside[0]["part"]
    assert not list(ort.path.glob("ort_profile_*.json"))  # ORT's own files read into time.json and trace.json
    cats = {e.get("cat") for e in json.loads((ort.path / TRACE).read_text())["traceEvents"]}
    assert {"Node", "ortlab"} <= cats

    tables = time(pt, ort)
    assert tables.labels == ["pytorch", "ortmodule"]
    for module in DEMO_MODULES:
        assert tables.modules.loc[module].notna().all(), module
    assert tables.parts.loc[("step", "")].tolist() == pytest.approx([pt_s * 1e3 for pt_s in (
        json.loads((pt.path / FILE).read_text())["step_s"], data["step_s"])])
    diff = tables.difference["difference ms"].tolist()
    assert diff == sorted(diff, reverse=True) and set(tables.difference["run"]) == {"ortmodule"}
    assert tables.figure().axes[0].get_legend() is not None

    assert main(["time", str(pt.path), str(ort.path), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "outside" in out and "slower (+)" in out and "ORT graph nodes" in out and "blocks." in out
    assert main(["time", str(pt.path), str(ort.path), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert set(got["runs"]) == {"pytorch", "ortmodule"} and got["difference"] and got["nodes"]

    # a later burst exports anew (its own session, profiled); with its graphs saved, the Graphs tab's node view
    # shows a node's kernel time
    again = _burst(engine, tmp_path, "ortmodule", options={"save_onnx": True})
    top = json.loads((again.path / FILE).read_text())["nodes"][0]
    assert time(ort, again).labels == [f"ortmodule ({ort.path.name})", f"ortmodule ({again.path.name})"]
    from ortlab.widgets.graphs import GraphsPanel

    panel = GraphsPanel(lambda: [again])
    try:
        panel.search_box.value = top["node"]
        panel.matches.value = top["node"]
        panel._show_neighbourhood()
        assert "ORT kernel time" in panel.node_time.value and top["op"] in panel.node_time.value
    finally:
        panel.close()


@pytest.mark.slow
def test_two_ranks_are_profiled_each_with_their_wait(tmp_path):
    """Under nproc 2 each rank writes its own time data; the tables show one column per rank, the wait for the
    slowest rank apart from the backward's rest, the parts still adding up to each rank's step."""
    from ortlab import Session
    from ortlab.timing.table import time

    with Session(out=tmp_path, in_process=True) as s:
        run = s.burst("pytorch", 7, nproc=2, progress=False, collect={"time": {}})
    assert run.ok, run.error
    assert len(run.ranks) == 2 and all((r.path / FILE).is_file() and (r.path / TRACE).is_file() for r in run.ranks)
    for rank in run.ranks:
        data = _check_run(rank, ("blocks.0.attn.qkv",))
        assert next(p for p in data["parts"] if p["kind"] == "wait")["s"] >= 0
    tables = time(run)
    assert tables.labels == ["pytorch rank 0", "pytorch rank 1"]
    assert ("backward", "wait") in tables.parts.index


def _recorded_loop(tmp_path, wrap=None, steps=7):
    import torch

    import ortlab
    from ortlab.demo import gpt

    torch.manual_seed(0)
    w = gpt(n_layer=1, d_model=32)
    model = wrap(w.model) if wrap else w.model
    optimizer = torch.optim.AdamW(w.model.parameters(), lr=1e-3)
    with ortlab.record(model, out=tmp_path, collect={"time": {}}) as rec:
        for step in range(steps):
            x, y = w.batch(step)
            loss = w.loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            rec.step(loss=loss)
    from ortlab.runs.run import load_run

    return load_run(rec.path)


def _check_recorded(run, modules):
    assert run.ok, run.error
    data = json.loads((run.path / FILE).read_text())
    assert data["steps"] == [2, 3, 4] and "error" not in data, data.get("error")
    assert {p["phase"] for p in data["parts"]} == {"loop"}  # the user's loop: one phase, its whole iteration
    assert sum(p["s"] for p in data["parts"]) == pytest.approx(data["step_s"])
    for row in data["step_rows"]:
        assert 0 < row["loop_kernels_s"] <= row["loop_s"] == pytest.approx(row["step_s"])
    assert set(modules) <= {m["module"] for m in data["modules"]}
    assert json.loads((run.path / TRACE).read_text())["traceEvents"]
    return data


def test_a_recorded_loop_is_profiled(tmp_path):
    import ortlab

    _check_recorded(_recorded_loop(tmp_path), ("blocks.0.attn.qkv",))
    with pytest.raises(TimeError, match="from 1 "):
        ortlab.record(__import__("torch").nn.Linear(2, 2), out=tmp_path, collect={"time": {"steps": [0]}})


@pytest.mark.slow
@pytest.mark.ort
def test_a_recorded_ortmodule_loop_is_profiled(tmp_path):
    from onnxruntime.training.ortmodule import ORTModule

    data = _check_recorded(_recorded_loop(tmp_path, ORTModule), ("blocks.0.attn.qkv",))
    assert data["nodes"] and data["backend"] == "ortmodule"


@pytest.mark.slow
@pytest.mark.ort
def test_pythonops_are_listed_with_the_function_they_run(tmp_path, engine):
    """The stats collector taps a module's output through a PythonOp (an autograd.Function) under ORTModule: the
    time data lists it, forward and backward, with the function's name, marked as ortlab's and timed apart from
    the model's modules and op types."""
    from ortlab.engine import BurstConfig
    from ortlab.runs.run import load_run

    cfg = BurstConfig(backend="ortmodule", steps=6, out=str(tmp_path),
                      collect={"time": {}, "stats": {"modules": "blocks.0.attn"}})
    run = load_run(engine.run(cfg))
    assert run.ok, run.error
    data = json.loads((run.path / FILE).read_text())
    ops = data["python_ops"]
    assert {p["phase"] for p in ops} == {"forward", "backward"}
    assert {p["function"] for p in ops} == {"ortlab.activations.pythonop.Tap"}
    assert all(p["ortlab_tap"] for p in ops)
    assert {(m["module"], m["phase"]) for m in data["modules"] if m["module"] == TAPS} == {(TAPS, "forward"),
                                                                                          (TAPS, "backward")}
    op_types = {o["op"] for o in data["ops"]}
    assert {"PythonOp (ortlab's tap)", "PythonOpGrad (ortlab's tap)"} <= op_types
    assert not op_types & {"PythonOp", "PythonOpGrad"}  # the demo has none of its own
    tables = __import__("ortlab").time(run)
    assert tables.python_ops.ortlab_tap.all() and TAPS in tables.modules.index
    assert "ortlab_tap: ortlab's statistics taps" in tables.report()


def test_cli_burst_collects_time_and_says_how_to_see_it(tmp_path, capsys):
    from ortlab.cli import main

    args = ["burst", "--backend", "pytorch", "--steps", "4", "--out", str(tmp_path), "--in-process", "--no-memory"]
    assert main([*args, "--collect", "time", "--time-steps", "2"]) == 0
    hint = capsys.readouterr().err.strip().splitlines()[-1]
    assert hint.startswith("where the time goes: ortlab time ")
    path = hint.rpartition(" ")[2]
    assert json.loads((tmp_path / path.rpartition("/")[2] / FILE).read_text())["steps"] == [2]
    assert main(["time", path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"] == {"pytorch": path}
    assert main([*args, "--time-steps", "2"]) == 2
    assert "--time-steps needs --collect time" in capsys.readouterr().err
    assert main([*args, "--collect", "time", "--time-steps", "4"]) == 2  # step 4 is not in a burst of 4 steps
    assert "from 1 to 3" in capsys.readouterr().err


@pytest.mark.slow
def test_a_torch_compile_burst_is_profiled(tmp_path, engine):
    """torch.compile (aot_eager: its graphs without inductor's code generation, seconds to compile): the same
    split, no hooks on the compiled module, its ops under the compiled graph."""
    from ortlab.engine import BurstConfig
    from ortlab.runs.run import load_run
    from ortlab.timing.profile import COMPILED

    cfg = BurstConfig(backend="compile", steps=7, out=str(tmp_path), collect={"time": {}},
                      compile={"backend": "aot_eager"})
    run = load_run(engine.run(cfg))
    data = _check_run(run, (COMPILED,))
    assert "fuses operators" in data["note"]
    assert {m["module"] for m in data["modules"]} <= {COMPILED, NONE, "(optimizer)"}  # no hooks: no module ranges


@pytest.mark.slow
@pytest.mark.ort
def test_a_top_level_sequential_gets_its_time_per_module_and_memory_names_modules_alike(tmp_path):
    """ORTModule names the children of a top-level nn.Sequential `/_original_module/_original_module.0/Gemm`: Time
    gives each child its ORT kernel time (not all of it to the root), and the memory account names the same modules
    the same way (`0`, not `_original_module.0`)."""
    from ortlab.account import memory
    from ortlab.engine import BurstConfig, Engine
    from ortlab.options import Options
    from ortlab.runs.run import load_run
    from ortlab.workload import ModelRef

    engine = Engine(ModelRef.of("tests.factories.wide:mlp", width=64, depth=2))
    run = load_run(engine.run(BurstConfig(backend="ortmodule", steps=6, out=str(tmp_path), collect={"time": {}},
                                          options=Options({"save_onnx": True}))))
    assert run.ok, run.error
    data = json.loads((run.path / FILE).read_text())
    timed = {m["module"]: m["s"] for m in data["modules"] if m["s"] > 0}
    linears = {"0", "2", "4"}  # Linear, GELU, Linear, GELU, Linear
    assert linears <= set(timed), timed
    nodes = {n["module"] for n in data["nodes"]}
    assert linears <= nodes and not any("_original_module" in m for m in nodes), nodes
    account = memory(run)
    named = {t["module"] for t in account.top_tensors if t["module"]}
    assert named and named <= {"0", "1", "2", "3", "4"}, named
