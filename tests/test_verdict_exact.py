"""The verdict's decisions on small fakes (tensors, dicts, run-like objects), without ORT: exact arithmetic judges,
buffers are told apart and grouped, hazards are causes only where the evidence points to them, and the text a
user reads (golden lines)."""

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from ortlab.verdict import exact, state
from ortlab.verdict.gradients import Step, compare
from ortlab.verdict.judge import evidence, judge

# --------------------------------------------------------------------------- exact arithmetic


def test_a_candidate_diverges_only_when_measurably_further_from_float64_than_pytorch():
    truth = torch.linspace(-1, 1, 1000, dtype=torch.float64)
    noise = torch.randn(1000, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 1e-3
    pytorch = truth + noise
    assert not exact.judge(truth - 2 * noise, pytorch, truth).diverged  # twice PyTorch's own error: rounding
    assert exact.judge(truth + 10 * noise, pytorch, truth).diverged
    closer = exact.judge(truth + 0.1 * noise, pytorch, truth)  # closer to exact than PyTorch (LeViT's case)
    assert not closer.diverged and closer.times_noise == pytest.approx(0.1)
    assert exact.judge(truth * float("nan"), pytorch, truth).diverged


def test_a_true_zero_carries_only_rounding_and_the_floor_absorbs_it():
    zero = torch.zeros(8, dtype=torch.float64)
    rounding = torch.full((8,), 1e-9, dtype=torch.float64)
    assert not exact.judge(rounding, zero, zero, scale=1.0).diverged  # PyTorch exact by luck, ORT rounds
    assert exact.judge(torch.full((8,), 1e-3, dtype=torch.float64), zero, zero, scale=1.0).diverged


def test_the_fast_path_is_allclose_and_never_passes_a_non_finite_tensor():
    a = torch.ones(4)
    assert exact.close(a, a * (1 + 1e-8)) and not exact.close(a * 1.001, a)
    assert not exact.close(a * float("inf"), a)


def test_distances_read_as_percentages_and_times_the_noise():
    assert exact.percent(0.5, 1.0) == "50%" and exact.percent(0.031, 1.0) == "3.1%"
    assert exact.percent(1e-7, 1.0) == "1.0e-05%"
    assert exact.times(18.2, 1.0) == "18x" and exact.times(0.0168, 1.0) == "0.017x"


# --------------------------------------------------------------------------- gradients


def _steps(ort_error: dict, pt_error: float = 1e-6):
    g = torch.Generator().manual_seed(1)
    truth = {"a.weight": torch.randn(16, 16, generator=g, dtype=torch.float64),
             "a.bias": torch.zeros(16, dtype=torch.float64)}  # true gradient zero (a norm removes it)
    pt = {n: t + pt_error * torch.randn(t.shape, generator=g, dtype=torch.float64) for n, t in truth.items()}
    ort = {n: t + ort_error.get(n, pt_error) * torch.randn(t.shape, generator=g, dtype=torch.float64)
           for n, t in truth.items()}
    return Step(1.0, pt), Step(1.0, ort), Step(1.0, truth)


def test_gradients_judged_against_float64_flag_only_a_real_difference():
    pt, ort, truth = _steps({"a.bias": 2e-6})  # the zero-gradient bias: rounding on both sides
    check = compare(pt, ort, exact=truth)
    assert check.judged_by == "float64" and check.agree, check.rows[0]
    pt, ort, truth = _steps({"a.weight": 0.1})  # a wrong gradient (ORT's squeeze-and-excitation)
    check = compare(pt, ort, exact=truth)
    assert not check.agree and check.worst["parameter"] == "a.weight"
    assert check.to_dict()["distances"][0]["diverged"] and check.to_dict()["factor"] == exact.FACTOR


def test_gradients_allclose_need_no_float64_and_without_it_pytorch_fp32_judges_with_a_note():
    pt, _, _ = _steps({})
    assert compare(pt, Step(1.0, {n: g.clone() for n, g in pt.grads.items()})).judged_by == "allclose"
    _, ort, _ = _steps({"a.weight": 0.1})
    check = compare(pt, ort, notes=["the model does not run in float64: ..."])
    assert check.judged_by == "pytorch fp32" and not check.agree and check.notes


# --------------------------------------------------------------------------- runs judged


@dataclass
class FakeRun:
    path: Path
    backend: str
    losses: list
    meta: dict = field(default_factory=dict)
    status: str = "ok"


def _entry(kind, dtype, total, module_type="BatchNorm2d", numel=8):
    return {"kind": kind, "dtype": dtype, "numel": numel, "module_type": module_type, "sum": total,
            "sumsq": total * total / numel}


def _bn_state(count: float, var: float, weight: float = 1.0) -> dict:
    out = {}
    for m in ("bn1", "layer1.0.bn1", "layer1.0.bn2"):
        out.update({f"{m}.weight": _entry("parameter", "float32", weight),
                    f"{m}.running_mean": _entry("buffer", "float32", 0.1),
                    f"{m}.running_var": _entry("buffer", "float32", var),
                    f"{m}.num_batches_tracked": _entry("buffer", "int64", count, numel=1)})
    return out


def _run(tmp_path: Path, name: str, backend: str, final: dict, losses=(2.0, 1.9, 1.8), **meta) -> FakeRun:
    folder = tmp_path / name
    folder.mkdir()
    (folder / state.FILE).write_text(json.dumps(final))
    return FakeRun(folder, backend, list(losses), {"config": {"parity": True}, **meta})


AGREEING = {"agree": True, "judged_by": "allclose", "worst": [], "forward_agrees": True, "factor": exact.FACTOR}
BN_HAZARD = {"kind": "tensor used as a Python bool", "file": "torchvision/models/resnet.py", "line": 270,
             "module": "bn1", "module_type": "BatchNorm2d", "in_torch": True, "step": 0, "advice": "...",
             "message": "Converting a tensor to a Python boolean"}


def test_batchnorm_buffers_without_the_fix_are_one_grouped_cause(tmp_path):
    pytorch = _run(tmp_path, "pt", "pytorch", _bn_state(3, 24.0))
    ort = _run(tmp_path, "ort", "ortmodule", _bn_state(1, 22.0), hazards=[BN_HAZARD])
    verdict = judge(pytorch, ort, AGREEING, float64={"losses": [2.0, 1.9, 1.8], "state": _bn_state(3, 24.0)})
    assert verdict.lines() == [
        "DIVERGED: the state at the end differs: 3 whole-number buffers (e.g. `bn1.num_batches_tracked`, "
        "`layer1.0.bn1.num_batches_tracked`), 3 buffers (e.g. `bn1.running_var`, `layer1.0.bn1.running_var`)",
        "  cause: BatchNorm running statistics in 3 BatchNorm2d modules (e.g. `bn1`, `layer1.0.bn1`): ORTModule "
        "counts 1 batch where PyTorch counts 3 batches and updates the running variance differently; weights train "
        "the same; fix: pytorch-buffers",
        "  note: export hazards seen, harmless in this burst: tensor used as a Python bool in 1 BatchNorm2d module "
        "(torch's own check) at `torchvision/models/resnet.py:270`"]


def test_with_the_buffer_fix_no_cause_blames_the_export_and_float_buffers_are_judged_against_float64(tmp_path):
    exact_state = _bn_state(3, 24.0)
    pytorch = _run(tmp_path, "pt", "pytorch", _bn_state(3, 24.0 * (1 + 1e-6)))
    ort = _run(tmp_path, "ort", "ortmodule", _bn_state(3, 24.0 * (1 - 2e-6)), fixes={"applied": ["pytorch-buffers"]})
    verdict = judge(pytorch, ort, AGREEING, float64={"losses": [2.0, 1.9, 1.8], "state": exact_state})
    assert verdict.status == "agree", str(verdict)
    wrong = _run(tmp_path, "wrong", "ortmodule", _bn_state(3, 30.0), fixes={"applied": ["pytorch-buffers"]})
    verdict = judge(pytorch, wrong, AGREEING, float64={"losses": [2.0, 1.9, 1.8], "state": exact_state})
    assert verdict.diverged and "once more" not in str(verdict) and "although pytorch-buffers is applied" in str(
        verdict)


def test_torch_compile_is_never_told_about_orts_graph(tmp_path):
    pytorch = _run(tmp_path, "pt", "pytorch", _bn_state(3, 24.0))
    compiled = _run(tmp_path, "tc", "compile", _bn_state(2, 24.0))
    text = str(judge(pytorch, compiled, AGREEING, float64={"losses": [2.0, 1.9, 1.8], "state": _bn_state(3, 24.0)}))
    assert "torch.compile counts 2 batches" in text and "ORT" not in text and "fix:" not in text


def test_a_loss_curve_closer_to_float64_than_pytorchs_agrees_and_a_far_one_diverges(tmp_path):
    same = _bn_state(3, 24.0)
    truth = [2.0, 1.9, 1.8]
    pytorch = _run(tmp_path, "pt", "pytorch", same, losses=[2.0, 1.9098, 1.8])  # PyTorch fp32 0.0098 off
    ort = _run(tmp_path, "ort", "ortmodule", same, losses=[2.0, 1.9026, 1.8])  # ORT 0.0026 (timm EfficientNet)
    verdict = judge(pytorch, ort, AGREEING, float64={"losses": truth, "state": same})
    assert verdict.status == "agree" and verdict.losses["judged_by"] == "float64", str(verdict)
    far = _run(tmp_path, "far", "ortmodule", same, losses=[2.0, 1.5, 1.2],
               hazards=[{**BN_HAZARD, "file": "model.py", "line": 12, "in_torch": False, "module": "(root)"}])
    verdict = judge(pytorch, far, AGREEING, float64={"losses": truth, "state": same})
    assert verdict.diverged and verdict.headline.startswith("DIVERGED: ORTModule's losses over 3 steps are ")
    assert verdict.causes[0]["kind"] == "export hazard" and "model.py:12" in verdict.causes[0]["text"]
    assert evidence(verdict.to_dict()) == "gradients allclose; loss: 0.72 vs PyTorch 0.0098 from fp64; factor 3"


def test_hazards_are_never_located_in_ortlabs_own_files():
    import ortlab
    from ortlab.compat.hazards import frame_kind

    own = Path(ortlab.__file__).parent
    assert frame_kind(str(own / "workload.py")) == frame_kind(str(own / "engine" / "loop.py")) == "stop"
    assert frame_kind(str(own / "compat" / "fixes" / "buffers.py")) == "skip"  # runs inside the model's forward
    assert frame_kind(str(own / "demo" / "divergence.py")) == "user"
    assert frame_kind("/site/torch/nn/functional.py") == "skip"
    assert frame_kind("/site/onnxruntime/training/ortmodule/_io.py") == "stop"
    assert frame_kind("/root/.cache/ortlab/env-1/side-2/torchvision/models/resnet.py") == "user"


def test_the_lab_plots_each_parameters_distance_to_float64_with_the_flagged_ones_marked():
    from ortlab.options import Options
    from ortlab.verdict.figures import distances_figure
    from ortlab.verdict.judge import Verdict
    from ortlab.widgets.burst_panel import BurstPanel

    pt, ort, truth = _steps({"a.weight": 0.1})
    verdict = Verdict("diverged", "DIVERGED: ...", compare(pt, ort, exact=truth).to_dict())
    figure = distances_figure(verdict)
    labels = [t.get_text() for t in figure.axes[0].texts]
    assert labels == ["a.weight"] and "diverged (1)" in [t.get_text() for t in figure.axes[0].get_legend().texts][-1]
    assert distances_figure(Verdict("agree", "agree", {"judged_by": "allclose", "worst": []})) is None
    panel = BurstPanel(None, Options)
    panel.last_verdicts = {"ortmodule": verdict}
    panel._show_distances()
    assert panel.distances.value[:4] == b"\x89PNG" and panel.distances.layout.display is None


def test_the_grouped_cause_sees_every_buffer_not_only_the_first_listed(tmp_path):
    def many(count, var):
        out = {}
        for i in range(25):
            out.update({f"m{i}.running_var": _entry("buffer", "float32", var),
                        f"m{i}.num_batches_tracked": _entry("buffer", "int64", count, numel=1)})
        return out

    pytorch = _run(tmp_path, "pt", "pytorch", many(3, 24.0))
    ort = _run(tmp_path, "ort", "ortmodule", many(1, 22.0))
    verdict = judge(pytorch, ort, AGREEING, float64={"losses": [2.0, 1.9, 1.8], "state": many(3, 24.0)})
    assert verdict.state["count"] == 50 and len(verdict.state["differ"]) == 20
    assert "in 25 BatchNorm2d modules" in verdict.causes[0]["text"]
    assert "updates the running variance differently" in verdict.causes[0]["text"]
