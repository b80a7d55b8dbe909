"""Below the module (ortlab.verdict.ops): the ops a localized module runs, each judged alone against itself in
float64, the first that diverged there told apart from the ones that inherited it."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from ortlab.engine.backends import Alone
from ortlab.verdict import ops
from ortlab.verdict.localize import Localization
from ortlab.workload import Workload

slow = pytest.mark.slow
FACTORIES = Path(__file__).resolve().parent / "factories"


def _workload() -> Workload:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))

    def batch(step: int):
        g = torch.Generator().manual_seed(step)
        return torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)

    return Workload(model, batch, nn.functional.mse_loss, name="three layers", batch_size=6)


def _alone(wrong=None, factor: float = 1.01) -> Alone:
    """A backend of the test's own that runs every op as PyTorch does, except `wrong`, whose output it scales."""

    def op(func):
        def run(*args, **kwargs):
            out = func(*args, **kwargs)
            return out * factor if func is wrong else out
        return run

    return Alone("planted", lambda m: m, lambda r: None, lambda m: torch.no_grad(), op)


def test_the_op_that_computes_wrong_is_named_and_the_ops_after_it_inherit():
    w = _workload()
    table = ops.inside(w, w.batch(0), "", _alone(torch.ops.aten.tanh.default))
    first = next(o for o in table["ops"] if o["status"] == ops.DIVERGED_HERE)
    assert first["name"] == "aten.tanh.default" and first["phase"] == "forward" and first["where"] == "1", first
    assert table["first_index"] == first["index"] and table["first"].startswith("aten.tanh (#"), table["first"]
    before = [o for o in table["ops"] if o["index"] < first["index"] and o["status"] != ops.NOT_JUDGED]
    assert before and all(o["status"] == ops.AGREES for o in before), before
    after = [o for o in table["ops"] if o["index"] > first["index"] and o["status"] != ops.NOT_JUDGED]
    assert [o["status"] for o in after].count(ops.DIVERGED_HERE) == 0, after  # one planted op: one place
    consumer = next(o for o in after if o["name"] == "aten.addmm.default")
    assert consumer["status"] == ops.INHERITED and f"#{first['index']}" in consumer["inputs"], consumer
    backward = [o for o in after if o["phase"] == "backward"]
    assert any(o["name"] == "aten.tanh_backward.default" and o["status"] == ops.INHERITED for o in backward), backward
    assert all(o["where"] for o in backward if o["name"] == "aten.tanh_backward.default")
    assert any("TanhBackward0" in o["where"] and o["where"].startswith("1 ") for o in backward), backward
    shown = "\n".join(ops.lines(table))
    assert ">>" in shown and "aten.tanh " in shown and "diverged here" in shown, shown


def test_a_backend_that_computes_right_agrees_everywhere():
    w = _workload()
    table = ops.inside(w, w.batch(0), "", _alone())
    assert table["first"] is None and table["counts"].get(ops.DIVERGED_HERE, 0) == 0
    assert table["counts"].get(ops.INHERITED, 0) == 0 and table["counts"][ops.AGREES] >= 6, table["counts"]


def test_an_error_within_fp32_rounding_is_not_a_divergence():
    w = _workload()
    table = ops.inside(w, w.batch(0), "", _alone(torch.ops.aten.tanh.default, 1 + 2 ** -23))
    assert table["first"] is None, table["first"]


def test_inside_a_submodule_only_its_ops_are_judged():
    w = _workload()
    table = ops.inside(w, w.batch(0), "2", _alone(torch.ops.aten.tanh.default))
    assert table["module"] == "2" and table["first"] is None
    assert {o["name"] for o in table["ops"] if o["status"] != ops.NOT_JUDGED} <= {
        "aten.addmm.default", "aten.mm.default", "aten.sum.dim_IntList"}, table["ops"]
    assert any(o["inputs"][0] == "bias" for o in table["ops"] if o["name"] == "aten.addmm.default")


def test_a_backend_that_runs_whole_graphs_says_so():
    w = _workload()
    no_op = Alone("ORT", lambda m: m, lambda r: None, lambda m: torch.no_grad())
    table = ops.inside(w, w.batch(0), "", no_op)
    assert table["ops"] == [] and "not judged here" in table["note"]
    assert ops.lines(table)[0].endswith("not judged here")


def test_an_op_the_backend_cannot_run_alone_is_not_judged_and_the_rest_goes_on():
    def op(func):
        if func is torch.ops.aten.tanh.default:
            raise RuntimeError("no kernel")
        return func

    w = _workload()
    table = ops.inside(w, w.batch(0), "", Alone("broken", lambda m: m, lambda r: None, lambda m: torch.no_grad(), op))
    tanh = next(o for o in table["ops"] if o["name"] == "aten.tanh.default")
    assert tanh["status"] == ops.NOT_JUDGED and "does not run alone on broken: RuntimeError: no kernel" in tanh["note"]
    assert table["counts"][ops.AGREES] >= 5 and table["first"] is None


def test_a_localization_names_its_first_op_and_reads_one_written_before_compile_was_localized():
    worst = {"tensor": "out.weight", "ort": 0.02, "pytorch": 1e-7, "allowed": 2e-4, "norm": 2.0, "factor": 2e5,
             "ratio": 100.0, "diverged": True}
    old = Localization.from_dict({"path": "", "class_name": "Gained", "worst": worst})
    assert old.text.endswith("ORT's gradient of out.weight is 2e+05x further from float64 than PyTorch's (an error "
                             "of 1% of its norm)"), old.text
    new = Localization("", "Gained", worst={**old.worst}, who="torch.compile",
                       ops={"first": "ortlab_test.gain (#4, forward): ..."})
    assert "torch.compile's gradient of out.weight" in new.text
    assert new.text.endswith("; first op beyond float64's rounding: ortlab_test.gain (#4, forward): ...")
    assert Localization.from_dict(new.to_dict()).text == new.text


@slow
@pytest.mark.timeout(900)
def test_a_wrong_inductor_decomposition_is_named_down_to_its_op(tmp_path):
    """tests/factories/compile_differs.py registers an inductor decomposition of its custom op that computes
    x * 2.02 where eager computes x * 2: torch.compile's run is localized to the module and to that op, not to the
    ops after it; `ortlab repro` writes a script that exits 1 with torch.compile."""
    done = subprocess.run([sys.executable, "-m", "ortlab.cli", "burst", "--model",
                           f"{FACTORIES / 'compile_differs.py'}:model", "--backend", "pytorch,compile", "--parity",
                           "--steps", "2", "--no-memory", "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=850)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "first op beyond float64's rounding: ortlab_test.gain (#" in done.stdout, done.stdout[-3000:]
    # inductor's CompilerBisector on that one op: its decomposition, not a pass or a lowering
    assert "CompilerBisector: the op goes wrong at backend aot_eager_decomp_partition, subsystem decomposition" \
        in done.stdout and "(ortlab_test.gain.default)" in done.stdout, done.stdout[-3000:]
    assert "ortlab repro" in done.stdout
    run = next(tmp_path.glob("*-compile"))
    # judged again from the two folders, in this process: the same cause, and no word of the bisector's own
    judged = subprocess.run([sys.executable, "-m", "ortlab.cli", "judge", str(next(tmp_path.glob("*-pytorch"))),
                             str(run), "--out", str(tmp_path / "judged")], capture_output=True, text=True, timeout=850)
    assert judged.returncode == 1 and "ortlab_test.gain (#" in judged.stdout, judged.stdout[-3000:]
    assert "bisection" not in judged.stdout.lower(), judged.stdout[-3000:]
    repro = subprocess.run([sys.executable, "-m", "ortlab.cli", "repro", str(run)], capture_output=True, text=True,
                           timeout=850)
    assert repro.returncode == 0, repro.stderr[-3000:]
    marked = [line for line in repro.stdout.splitlines() if line.startswith(">>")]
    assert len(marked) == 1 and "ortlab_test.gain" in marked[0] and "diverged here" in marked[0], repro.stdout
    assert "inherited" in repro.stdout
    script = next((run / "repro").glob("repro_*.py"))
    shown = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                           cwd=script.parent)
    assert shown.returncode == 1 and "WRONG: torch.compile's gradient of out.weight" in shown.stdout, \
        shown.stdout + shown.stderr[-2000:]
    page = subprocess.run([sys.executable, "-m", "ortlab.cli", "report", str(tmp_path), "--out",
                           str(tmp_path / "report.html")], capture_output=True, text=True, timeout=600)
    assert page.returncode == 0, page.stderr[-2000:]
    html = (tmp_path / "report.html").read_text()
    assert "<pre class='ops'>" in html and "&gt;&gt;" in html and "ortlab_test.gain" in html


def test_a_bisection_names_where_the_op_goes_wrong_and_one_that_fails_costs_nothing():
    w = _workload()
    wrong = torch.ops.aten.tanh.default
    asked = []

    def bisect(func, agrees):
        asked.append((func, agrees(func), agrees(lambda *a, **k: func(*a, **k) * 1.01)))
        return {"backend": "aot_eager_decomp_partition", "subsystem": "decomposition", "application": 0,
                "detail": "<OpOverload(op='aten.tanh', overload='default')>"}

    planted = _alone(wrong)
    found = ops.inside(w, w.batch(0), "", Alone(planted.who, planted.wrap, planted.ran, planted.around, planted.op,
                                                bisect))
    assert asked == [(wrong, True, False)]  # asked once, about the first op, with a test that tells right from wrong
    assert found["first"].endswith("; inductor's CompilerBisector: the op goes wrong at backend "
                                   "aot_eager_decomp_partition, subsystem decomposition, application 0 "
                                   "(aten.tanh.default)"), found["first"]

    def broken(func, agrees):
        raise RuntimeError("bisector state lost")

    kept = ops.inside(w, w.batch(0), "", Alone(planted.who, planted.wrap, planted.ran, planted.around, planted.op,
                                               broken))
    assert kept["bisect"] is None and kept["first"].startswith("aten.tanh (#")


def test_the_activations_tab_shows_the_newest_verdicts_op_table(tmp_path):
    import json
    from types import SimpleNamespace

    from ortlab.widgets.activations import ActivationsPanel

    w = _workload()
    table = ops.inside(w, w.batch(0), "", _alone(torch.ops.aten.tanh.default))
    verdict = {"status": "diverged", "headline": "DIVERGED", "causes": [
        {"kind": "localized", "text": "...", "localized": {"path": "", "ops": table}}]}
    (tmp_path / "verdict.json").write_text(json.dumps(verdict))
    run = SimpleNamespace(path=tmp_path, ranks=[], backend="compile",
                          read_json=lambda name: json.loads((tmp_path / name).read_text()))
    panel = ActivationsPanel(lambda: [run])
    assert "Ops inside the localized module" in panel.ops.value and "&gt;&gt;" in panel.ops.value
    assert "aten.tanh" in panel.ops.value and "diverged here" in panel.ops.value
    assert ActivationsPanel(lambda: []).ops.value == ""


@slow
@pytest.mark.ort
def test_the_se_blocks_wrong_ort_gradient_is_named_down_to_its_graph_node():
    """ORT's training graph of the squeeze-and-excitation block (tests/factories/localize.py), each node judged
    against float64 on the inputs ORT gave it: the gradient of the gate's broadcasting Mul is written in the shape of
    the other input (an Identity where a ReduceSum belongs), and the SigmoidGrad that reads it is wrong; the nodes
    before agree. The same block with its pool as a mean trains right: no node is blamed."""
    import os

    sys.path.insert(0, str(FACTORIES))
    try:
        import localize as factories
    finally:
        sys.path.remove(str(FACTORIES))
    from ortlab.engine.backends.ort import OrtBackend

    for make, wrong in ((factories.nested, True), (factories.correct, False)):
        torch.manual_seed(0)
        net, batch, loss = make()
        w = Workload(net, batch, loss, name="se", batch_size=2)
        table = ops.inside(w, w.batch(0), "blocks.0.se", OrtBackend(net).alone(None, (), Path(os.devnull)))
        if not wrong:
            assert table["first"] is None and table["counts"][ops.AGREES] >= 10, table["counts"]
            continue
        first = next(o for o in table["ops"] if o["status"] == ops.DIVERGED_HERE)
        assert (first["name"], first["phase"], first["where"]) == ("ai.onnx.Identity", "backward",
                                                                   "Mul_Grad/Identity_3"), first
        assert "in shape [2, 8, 12, 12], where that tensor is [2, 8, 1, 1]" in first["note"]
        sigmoid = next(o for o in table["ops"] if o["name"] == "com.microsoft.SigmoidGrad")
        assert sigmoid["status"] == ops.DIVERGED_HERE and sigmoid["own"]["diverged"]
        assert all(o["status"] == ops.AGREES for o in table["ops"] if o["phase"] == "forward")


def test_bad_input_to_the_op_level_is_refused_in_one_line(tmp_path):
    """Localizing the reference or a backend that does not exist, and a float64 log beside two run folders, are
    refused before anything runs, naming what is allowed."""
    from ortlab import BurstError, InputError, Session

    with Session(out=tmp_path, in_process=True) as s:
        with pytest.raises(InputError, match="backend 'pytorch' is the reference every other is judged against: "
                                             "localize takes ortmodule or compile"):
            s.localize(backend="pytorch")
        with pytest.raises(BurstError, match="backend 'compiled' is not allowed; allowed: pytorch, ortmodule, "
                                             "compile"):
            s.localize(backend="compiled")
        assert s.runs == []
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    done = subprocess.run([sys.executable, "-m", "ortlab.cli", "judge", str(tmp_path / "a"), str(tmp_path / "b"),
                           "--float64-log", str(tmp_path / "c.json")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.strip() == ("ortlab judge: --float64-log judges two DebugMode logs, "
                                                            "not run folders"), done.stderr
