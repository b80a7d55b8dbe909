"""When ORTModule trains another model than the user's: every comparison says agree or diverged from evidence that
optimizer noise cannot fool, names the cause, and the fixes bring it back to agree. The project's own models
(ortlab.demo.divergence), real ORTModule."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ortlab.compat.hazards import classify
from ortlab.compat.inputs import InputWatch
from ortlab.verdict import state

FACTORIES = Path(__file__).resolve().parents[1] / "ortlab" / "demo" / "divergence.py"
slow = pytest.mark.slow


def model(name: str) -> str:
    return f"ortlab.demo.divergence:{name}"


def line_of(marker: str) -> int:
    lines = FACTORIES.read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f"# line: {marker}"))


# --------------------------------------------------------------------------- the pieces, without ORT


def test_tracer_warnings_are_named_by_what_the_graph_froze():
    assert classify("Converting a tensor to a Python boolean might cause the trace to be incorrect.")[0] == \
        "tensor used as a Python bool"
    assert classify("Converting a tensor to a Python number might cause ...")[0] == "tensor read as a Python number"
    assert classify("Iterating over a tensor might cause the trace to be incorrect.")[0] == "iteration over a tensor"
    assert classify("something new")[0] == "traced Python"


def test_inputs_are_named_as_ort_names_them_and_only_baked_changes_count():
    from ortlab.demo.divergence import Flag, Temperature

    x = torch.zeros(8, 16)
    watch = InputWatch.exported(Flag(), (x, False), read={"x"}, hazards=[])
    assert watch.changes((x, False)) == []
    assert watch.changes((x, True)) == [{"input": "use_residual", "old": "False", "new": "True", "what": "value"}]
    assert watch.changes((torch.zeros(4, 16), False)) == []  # shapes are dynamic axes: fine without a hazard
    assert watch.key((x, True)) != watch.key((x, False))
    read = InputWatch.exported(Temperature(), (x, 1.0), read={"x", "temperature"}, hazards=[])
    assert read.changes((x, 2.0)) == []  # a graph input the graph reads carries every value
    shaped = InputWatch.exported(Flag(), (x, False), read={"x"}, hazards=[{"kind": "tensor used as a Python bool"}])
    assert shaped.changes((torch.zeros(4, 16), False))[0]["what"] == "shape"


def test_end_states_differ_exactly_for_whole_numbers_and_beyond_the_noise_for_floats():
    a = {"w": {"kind": "parameter", "dtype": "float32", "numel": 4, "sum": 1.0, "sumsq": 1.0},
         "n": {"kind": "buffer", "dtype": "int64", "numel": 1, "sum": 48.0, "sumsq": 2304.0}}
    b = {"w": {**a["w"], "sum": 1.0 + 1e-7}, "n": {**a["n"], "sum": 16.0, "sumsq": 256.0}}
    noise = {"w": {**a["w"], "sum": 1.0 + 2e-7}, "n": a["n"]}
    assert [d["name"] for d in state.differing(a, b, noise)] == ["n"]
    assert [d["name"] for d in state.differing(a, b, None)] == ["n"]  # floats are not judged without noise
    far = {"w": {**a["w"], "sum": 1.5}, "n": a["n"]}
    assert [d["name"] for d in state.differing(a, far, noise)] == ["w"]


# --------------------------------------------------------------------------- check names each kind


@slow
@pytest.mark.parametrize("case,kind,fix", [
    ("flag", "baked input", "graph-per-value"), ("loop", "baked input", "graph-per-value"),
    ("mode", "baked input", "graph-per-value"), ("shape_branch", "baked input", "graph-per-value"),
    ("value_branch", "frozen control flow", None), ("item", "frozen control flow", None),
    ("counter", "buffer update", "pytorch-buffers"), ("norm", "buffer update", "pytorch-buffers"),
    ("squeeze_excite", "wrong gradient", "global-avg-pool"), ("temperature", None, None), ("clean", None, None)])
@pytest.mark.ort
def test_check_names_how_ortmodule_would_train_another_model(case, kind, fix, tmp_path):
    import ortlab

    report = ortlab.check(model(case), out=tmp_path, in_process=True)
    kinds = {b.kind for b in report.blockers}
    if kind is None:
        assert report.status == "ok" and not report.blockers, str(report)
        return
    assert kind in kinds, str(report)
    found = next(b for b in report.blockers if b.kind == kind)
    if fix:
        assert found.fixes == [fix] and report.status == "fixed" and report.fixes == [fix], str(report)
    else:  # no fix: the line and the rewrite are named
        assert report.status == "diverges" and found.source.endswith(f"divergence.py:{line_of(case.split('_')[0])}")
        assert found.remedy


# --------------------------------------------------------------------------- every comparison judged


@slow
@pytest.mark.parametrize("case,cause", [
    ("flag", "input ORT did not re-export for"), ("squeeze_excite", "check"), ("counter", "buffer"),
    ("norm", "buffer"), ("value_branch", "export hazard"), ("item", "export hazard")])
@pytest.mark.ort
def test_a_comparison_that_diverges_says_so_with_its_cause(case, cause, tmp_path):
    from ortlab import Session

    with Session(model(case), out=tmp_path, in_process=True) as s:
        comparison = s.compare(steps=4, parity=True, progress=False)
    verdict = comparison.verdict
    assert comparison.pytorch.ok and comparison.ortmodule.ok
    assert verdict.status == "diverged", str(verdict)
    assert verdict.headline.startswith("DIVERGED: ")
    assert cause in {c["kind"] for c in verdict.causes}, str(verdict)
    assert comparison.to_dict()["verdict"]["status"] == "diverged"
    assert "verdict: DIVERGED" in str(comparison)


@slow
@pytest.mark.parametrize("case", ["flag", "loop", "mode", "shape_branch", "counter", "norm", "squeeze_excite"])
@pytest.mark.ort
def test_the_fixes_bring_each_case_back_to_agree_in_parity(case, tmp_path):
    from ortlab import Session

    with Session(model(case), out=tmp_path, in_process=True) as s:
        comparison = s.compare(steps=4, parity=True, progress=False, fixes="auto")
    assert comparison.ortmodule.meta["fixes"]["applied"], comparison.ortmodule.meta["fixes"]
    assert comparison.verdict.status == "agree", str(comparison.verdict)
    assert comparison.to_dict()["max_loss_diff"] <= 1e-5


@slow
@pytest.mark.parametrize("case", ["clean", "temperature"])
@pytest.mark.ort
def test_what_trains_correctly_raises_no_alarm(case, tmp_path):
    done = subprocess.run([sys.executable, "-m", "ortlab.cli", "burst", "--model", model(case), "--steps", "4",
                           "--parity", "--out", str(tmp_path), "--in-process", "--json"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["verdict"]["status"] == "agree" and not result["verdict"]["causes"]


@slow
@pytest.mark.ort
def test_a_diverged_burst_exits_1_and_names_the_cause_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "ortlab.cli", "burst", "--model", model("squeeze_excite"),
                           "--steps", "3", "--parity", "--out", str(tmp_path), "--in-process"],
                          capture_output=True, text=True)
    assert done.returncode == 1, done.stderr
    assert "verdict: DIVERGED: " in done.stdout and "ORTModule's gradient of fc2" in done.stdout
    assert "global-avg-pool" in done.stdout
    assert "ortlab burst: DIVERGED" in done.stderr


@slow
@pytest.mark.ort
def test_outside_parity_mode_the_gradients_judge(tmp_path):
    """Dropout and ORT's compute optimizer make losses differ outside parity mode: the first-step gradients
    (dropout off, one extra export) still judge, and the losses are said not to be."""
    from ortlab import Session

    with Session(model("squeeze_excite"), out=tmp_path, in_process=True) as s:
        bad = s.compare(steps=2, progress=False)
        good = s.compare(steps=2, progress=False, fixes="auto")
    assert bad.verdict.status == "diverged" and bad.verdict.gradients["exported"]
    assert any("not in parity mode" in n for n in bad.verdict.notes)
    assert good.verdict.status == "agree", str(good.verdict)


@slow
@pytest.mark.ort
def test_recorded_loops_are_judged_too(tmp_path):
    from onnxruntime.training.ortmodule import ORTModule

    import ortlab
    from ortlab.demo.divergence import counter

    runs = []
    for wrap in (lambda m: m, ORTModule):
        torch.manual_seed(0)
        workload = counter()
        trained = wrap(workload.model)
        optimizer = torch.optim.SGD(trained.parameters(), lr=0.01)
        with ortlab.record(trained, out=tmp_path) as rec:
            for step in range(3):
                inputs, target = workload.batch(step)
                loss = workload.loss(trained(*inputs), target)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                rec.step(loss=loss)
        runs.append(ortlab.load_run(rec.path))
    verdict = ortlab.judge(*runs)
    assert verdict.status == "diverged" and "whole-number buffer (`seen`)" in verdict.headline, str(verdict)
    assert "first-step gradients not compared" in verdict.notes


@slow
@pytest.mark.ort
def test_bisect_judges_a_toggle_by_gradients_not_by_a_short_loss(tmp_path):
    from ortlab import bisect

    result = bisect(model("squeeze_excite"), steps=2, candidates=["enable_custom_autograd"], out=str(tmp_path))
    row = result.rows.iloc[0]
    assert row["evidence"] == "first-step gradients" and not row["disappears"]
    assert "gradient of fc2" in row["first divergence"]
    assert result.fixes == []
