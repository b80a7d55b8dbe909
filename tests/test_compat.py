"""ortlab check, the fix registry and the fallback status: every blocker at once with its line, fixes that keep
the math, and no fallback shown as a success."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ortlab.compat import registry
from ortlab.compat.errors import read_error, readable

FACTORIES = Path(__file__).parent / "factories" / "compat.py"
FIXABLE, BLOCKED = f"{FACTORIES}:fixable", f"{FACTORIES}:blocked"
slow = pytest.mark.slow


def line_of(marker: str) -> int:
    """The line of the factory file that carries `# line: marker`."""
    lines = FACTORIES.read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f"# line: {marker}"))


def cli(*args, env=None, **kwargs):
    return subprocess.run([sys.executable, "-m", "ortlab.cli", *args], capture_output=True, text=True, env=env,
                          **kwargs)


# --------------------------------------------------------------------------- reading ORT's errors

# Messages as onnxruntime-training 1.19.2 words them (from ORTModule runs on this project's models).
GRAPH_TYPE = ("/onnxruntime_src/orttraining/orttraining/python/orttraining_pybind_state.cc:543 onnxruntime::python::"
              "addObjectMethodsForTraining(pybind11::module&)::<lambda(onnxruntime::training::OrtModuleGraphBuilder*,"
              " const pybind11::bytes&, const onnxruntime::training::OrtModuleGraphBuilderConfiguration&)> "
              "[ONNXRuntimeError] : 10 : INVALID_GRAPH : This is an invalid model. Type Error: Type 'tensor(bool)' of "
              "input parameter (/_original_module/Not_output_0) of operator (CumSum) in node "
              "(/_original_module/CumSum) is invalid.")
NO_BUILDER = ("/onnxruntime_src/orttraining/orttraining/core/graph/gradient_builder_registry.cc:29 onnxruntime::"
              "training::GradientDef onnxruntime::training::GetGradientForOp(const onnxruntime::training::"
              "GradientGraphConfiguration&, onnxruntime::Graph*, const onnxruntime::Node*) gradient_builder != "
              "nullptr was false. The gradient builder has not been registered: HardSwish for node /act/HardSwish")
NO_KERNEL = ("[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for ConvTransposeGrad(1) "
             "node with name 'ConvTranspose_Grad/ConvTransposeGrad_0'")


def test_ort_errors_lead_with_what_failed_and_keep_the_cxx_location_last():
    read = read_error(GRAPH_TYPE)
    assert (read.op, read.node, read.dtype, read.code) == ("CumSum", "/_original_module/CumSum", "tensor(bool)",
                                                          "INVALID_GRAPH")
    line = readable(GRAPH_TYPE)
    assert line.startswith("This is an invalid model. Type Error: Type 'tensor(bool)'")
    assert line.endswith("(ORT INVALID_GRAPH at orttraining_pybind_state.cc:543)")
    assert "onnxruntime::" not in line and "pybind11" not in line
    assert read_error(NO_BUILDER).op == "HardSwish" and readable(NO_BUILDER).startswith("The gradient builder")
    assert read_error(NO_KERNEL).op == "ConvTransposeGrad" and read_error(NO_KERNEL).code == "NOT_IMPLEMENTED"
    assert readable("plain text") == "plain text"


@pytest.mark.ort
def test_fixes_are_named_or_auto_and_a_bad_name_says_what_exists():
    from ortlab.engine.config import BurstConfig

    assert registry.parse("auto") == "auto" and registry.parse("none") == () and registry.parse(None) == ()
    assert registry.parse("diff, cumsum-int64") == ("diff", "cumsum-int64")
    assert registry.parse(["eager-attention", "eager-attention"]) == ("eager-attention",)
    with pytest.raises(registry.FixError, match=r"fix 'difff' is not known; known: diff, cumsum-int64.*; did you mean "
                                                r"diff\?$"):
        registry.parse("difff")
    with pytest.raises(registry.FixError, match="allowed: 'auto', 'none', or fix names"):
        registry.parse(3)
    assert BurstConfig(fixes="auto").fixes == "auto"
    assert BurstConfig.from_dict(BurstConfig(fixes=["diff"]).to_dict()).fixes == ("diff",)
    with pytest.raises(registry.FixError):
        BurstConfig(fixes="nope")
    assert set(registry.catalogue()["name"]) == set(registry.FIXES)


# --------------------------------------------------------------------------- the exporter fixes, against torch


def _ort_run(module, *inputs, fixes=()):
    """The module exported at opset 17 (with `fixes` applied) and run by ONNX Runtime."""
    import io

    import onnxruntime as ort

    buffer = io.BytesIO()
    with registry.applied(module, fixes):
        torch.onnx.export(module, inputs, buffer, opset_version=17, dynamo=False)
    session = ort.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"])
    feeds = {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs, strict=True)}
    return session.run(None, feeds)[0]


class _Call(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


@pytest.mark.parametrize("case", [
    dict(n=1, dim=-1), dict(n=2, dim=0), dict(n=1, dim=1, prepend=True), dict(n=1, dim=-1, append=True),
    dict(n=3, dim=-1, prepend=True, append=True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
@pytest.mark.ort
def test_the_diff_fix_exports_what_torch_diff_computes(case, dtype):
    x = (torch.randn(3, 6, generator=torch.Generator().manual_seed(1)) * 4).to(dtype)
    pre = x[:, :1] if case.get("prepend") else None
    post = x[:, -2:] if case.get("append") else None
    if case["dim"] == 0 and (pre is not None or post is not None):
        pytest.skip("prepend/append shaped for dim 1")

    def fn(x):
        return torch.diff(x, n=case["n"], dim=case["dim"], prepend=None if pre is None else x[:, :1],
                          append=None if post is None else x[:, -2:])

    expected = fn(x)
    got = _ort_run(_Call(fn), x, fixes=["diff"])
    assert got.dtype == expected.numpy().dtype and (got == expected.numpy()).all()


@pytest.mark.ort
def test_without_the_diff_fix_the_exporter_still_says_unsupported():
    """The fix is undone with its context: the next export fails as torch fails, not on an emptied registry."""
    x = torch.randn(2, 4)
    _ort_run(_Call(lambda x: torch.diff(x)), x, fixes=["diff"])
    with pytest.raises(Exception, match=r"aten::diff.*not supported"):
        _ort_run(_Call(lambda x: torch.diff(x)), x)


@pytest.mark.parametrize("dtype,asked", [(torch.bool, None), (torch.int32, None), (torch.uint8, None),
                                         (torch.float32, None), (torch.int64, torch.float64)])
@pytest.mark.ort
def test_the_cumsum_fix_sums_in_the_type_torch_sums_in(dtype, asked):
    x = (torch.randn(3, 5, generator=torch.Generator().manual_seed(2)) * 3).to(dtype)

    def fn(x):
        return torch.cumsum(x, -1) if asked is None else torch.cumsum(x, -1, dtype=asked)

    expected = fn(x).numpy()
    got = _ort_run(_Call(fn), x, fixes=["cumsum-int64"])
    assert got.dtype == expected.dtype
    torch.testing.assert_close(torch.from_numpy(got), torch.from_numpy(expected), rtol=1e-6, atol=1e-6)


def test_the_eager_attention_fix_keeps_parameters_and_is_undone():
    pytest.importorskip("transformers")
    from ortlab.demo import families

    workload = families.bert()
    model = workload.model.eval()
    classes = [type(m) for m in model.modules()]
    keys = list(model.state_dict())
    inputs, _ = workload.batch(0)
    inputs = {k: v for k, v in inputs.items() if k != "labels"}
    before = model(**inputs).logits
    fix = registry.get("eager-attention")
    assert fix.applies_to(model)
    with registry.applied(model, ["eager-attention"]):
        assert list(model.state_dict()) == keys
        assert all(c._attn_implementation == "eager" for c in [model.config])
        assert not any("Sdpa" in type(m).__name__ for m in model.modules())
        during = model(**inputs).logits
    assert [type(m) for m in model.modules()] == classes and model.config._attn_implementation != "eager"
    torch.testing.assert_close(during, before, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- ortlab check


@slow
@pytest.mark.ort
def test_check_lists_every_blocker_at_once_with_its_line_and_what_removes_it(tmp_path):
    import ortlab

    report = ortlab.check(BLOCKED, fixes="none", out=tmp_path, in_process=True)
    found = {(b.kind, b.op): b for b in report.blockers}
    assert set(found) == {("unsupported operator", "aten::diff"), ("unsupported operator", "aten::histc"),
                          ("invalid type", "CumSum"), ("no gradient", "Round")}
    markers = {("unsupported operator", "aten::diff"): "diff", ("invalid type", "CumSum"): "cumsum",
               ("unsupported operator", "aten::histc"): "histc", ("no gradient", "Round"): "round"}
    for key, marker in markers.items():
        assert found[key].source.endswith(f"compat.py:{line_of(marker)} in forward"), found[key].source
    assert found[("unsupported operator", "aten::diff")].fixes == ["diff"]
    assert found[("invalid type", "CumSum")].fixes == ["cumsum-int64"]
    assert found[("no gradient", "Round")].fixes == [] and "no ortlab fix" in found[("no gradient", "Round")].remedy
    assert report.status == "blocked" and report.trains is None
    saved = json.loads((Path(report.path) / "check.json").read_text())
    assert saved["status"] == "blocked" and len(saved["blockers"]) == 4

    auto = ortlab.check(BLOCKED, out=tmp_path, in_process=True)
    assert auto.fixes == ["diff", "cumsum-int64"]
    assert {(b.kind, b.op) for b in auto.remaining} == {("unsupported operator", "aten::histc"),
                                                        ("no gradient", "Round")}
    assert auto.verdict.startswith("blocked with fixes diff, cumsum-int64")


UNET = str(Path(__file__).parent / "factories" / "unet.py") + ":unet"
BATCH_NORMS = ("down1.1", "down2.1", "bottleneck.1", "dec2.1", "dec1.1")


@pytest.mark.ort
@slow
def test_check_on_a_unet_names_every_batchnorm_and_leaves_torchs_own_check_out_of_the_users_hazards(tmp_path):
    """A U-Net's 5 BatchNorms: torch's batch-size check inside F.batch_norm is no hazard of the user's (no advice
    to rewrite their lines; one note, in the words the burst's verdict uses), and the buffer update names each of
    the 5 modules whose buffers forward mutates."""
    done = cli("check", "--model", UNET, "--out", str(tmp_path), "--in-process")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "torch.where" not in text and "Python decisions the graph froze" not in text, text
    notes = [line for line in text.splitlines() if "torch's own check" in line]
    assert len(notes) == 1 and notes[0].strip().startswith("note: export hazards seen, harmless") and \
        "tensor used as a Python bool in 5 BatchNorm2d modules (torch's own check)" in notes[0], text
    buffers = next(line for line in text.splitlines() if line.strip().startswith("buffer update"))
    assert all(name in buffers for name in BATCH_NORMS) and "5 BatchNorm2d modules" in buffers, buffers
    saved = json.loads(next(tmp_path.glob("*-check/check.json")).read_text())
    blocker = next(b for b in saved["blockers"] if b["kind"] == "buffer update")
    assert all(f"{name}.running_mean" in blocker["message"] for name in BATCH_NORMS), blocker["message"]
    assert all(h["in_torch"] and h["harmless"] for h in saved["hazards"] if h["kind"].startswith("tensor used"))


@slow
@pytest.mark.ort
def test_check_verifies_the_fixes_with_a_training_step_and_the_cli_says_so(tmp_path):
    done = cli("check", "--model", FIXABLE, "--out", str(tmp_path), "--in-process", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["status"] == "fixed" and report["fixes"] == ["diff", "cumsum-int64"] and report["trains"] is True
    assert report["versions"]["onnxruntime-training"].startswith("1.19")
    blocked = cli("check", "--model", BLOCKED, "--out", str(tmp_path), "--in-process")
    assert blocked.returncode == 1 and "verdict: blocked" in blocked.stdout
    assert f"compat.py:{line_of('histc')} in forward" in blocked.stdout
    bad = cli("check", "--model", FIXABLE, "--fix", "nope", "--out", str(tmp_path), "--in-process")
    assert bad.returncode == 2 and "fix 'nope' is not known" in bad.stderr


@slow
@pytest.mark.ort
def test_the_fixes_keep_the_math_loss_and_gradients(tmp_path):
    from ortlab import Session
    from ortlab.verdict.gradients import first_step

    with Session(FIXABLE, out=tmp_path, in_process=True) as s:
        comparison = s.compare(steps=4, parity=True, progress=False, fixes="auto")
        gradients = first_step(s._engine.workload, ["diff", "cumsum-int64"])
    assert comparison.pytorch.ok and comparison.ortmodule.ok, comparison.ortmodule.error
    assert comparison.ortmodule.meta["fixes"]["applied"] == ["diff", "cumsum-int64"]
    assert "fixes" not in comparison.pytorch.meta  # the baseline runs the model as written
    assert comparison.to_dict()["max_loss_diff"] <= 1e-5
    assert gradients.agree and gradients.worst["relative"] <= 1e-5, gradients.worst


# --------------------------------------------------------------------------- a fallback is never ok


@slow
@pytest.mark.ort
def test_a_fallback_is_its_own_status_and_nothing_is_compared_against_it(tmp_path):
    out = tmp_path / "runs"
    done = cli("burst", "--model", FIXABLE, "--steps", "2", "--parity", "--out", str(out), "--json")
    assert done.returncode == 1, done.stderr
    result = json.loads(done.stdout)
    ort = result["ortmodule"]
    assert ort["status"] == "fallback" and result["pytorch"]["status"] == "ok"
    assert result["max_loss_diff"] is None and result["step_time_ratio"] is None
    assert "fell back to PyTorch" in result["not_compared"]
    assert ort["fallback"]["op"] == "aten::diff" and ort["fallback"]["step"] == 0
    assert ort["fallback"]["source"].endswith(f"compat.py:{line_of('diff')} in forward")
    assert "median_step_s" not in ort
    assert "--fix auto" in done.stderr and "diff, cumsum-int64" in done.stderr

    allowed = cli("burst", "--model", FIXABLE, "--steps", "2", "--backend", "ortmodule", "--allow-fallback",
                  "--out", str(out))
    assert allowed.returncode == 0, allowed.stderr
    runs = cli("runs", str(out))
    assert "fallback" in runs.stdout
    run = Path(ort["path"])
    memory = json.loads((run / "memory.json").read_text())
    assert "fell back to PyTorch" in memory["missing"]
    diff = cli("diff", result["pytorch"]["path"], str(run))
    assert diff.returncode == 2 and "did not run on ORTModule" in diff.stderr


@slow
@pytest.mark.ort
def test_an_ort_graph_error_reads_from_its_reason(tmp_path):
    from ortlab import Session

    with Session(FIXABLE, out=tmp_path, in_process=True) as s:
        run = s.burst("ortmodule", 1, {"fallback_policy": "FALLBACK_DISABLE"}, progress=False, fixes=["diff"])
    assert run.status == "failed"
    reason = run.error.split(": ", 1)[1]
    assert "Type Error: Type 'tensor(bool)'" in reason and "onnxruntime::" not in reason
    assert reason.index("CumSum") < reason.index("ORT INVALID_GRAPH")
    assert [b["op"] for b in run.meta["blockers"]] == ["CumSum"] and "cumsum-int64" in run.meta["hint"]


@slow
@pytest.mark.ort
def test_a_recorded_ortmodule_that_fell_back_is_not_ok(tmp_path):
    from onnxruntime.training.ortmodule import ORTModule

    import ortlab
    from tests.factories.compat import fixable

    workload = fixable()
    model = ORTModule(workload.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with ortlab.record(model, out=tmp_path) as rec:
        for step in range(2):
            inputs, target = workload.batch(step)
            loss = workload.loss(model(*inputs), target)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            rec.step(loss=loss)
    run = ortlab.load_run(rec.path)
    assert run.status == "fallback" and run.meta["fallback"]["op"] == "aten::diff"
    assert "UnsupportedOperatorError" in run.ort["fallback"]
