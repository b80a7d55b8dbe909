"""Mixed precision on the CPU: bf16 (torch.autocast bfloat16, no GradScaler) trains on PyTorch and torch.compile and is
judged in bf16 (PyTorch bf16's own distance to float64 is the yardstick, never fp32's); fp16 and ORTModule's bf16 are
refused in one line before anything starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ortlab import Session
from ortlab.engine import precision
from ortlab.engine.config import BurstConfig, BurstError, made_elsewhere, resolve_device
from ortlab.engine.types import Precision

CPU = resolve_device("cpu")


def test_each_precision_is_checked_against_the_device_and_backend():
    """Once, as the config is made: a precision this device or backend cannot train in is refused in one line."""
    assert BurstConfig(backend="pytorch", precision="bf16").precision is Precision.BF16
    with pytest.raises(BurstError, match="precision 'fp8' is not allowed; allowed: fp32, fp16, bf16"):
        BurstConfig(backend="pytorch", precision="fp8")
    with pytest.raises(BurstError, match=r"precision 'fp16' needs CUDA .*use fp32 or bf16 on the CPU"):
        BurstConfig(backend="pytorch", precision="fp16", device="cpu")
    with pytest.raises(BurstError, match=r"precision 'bf16' does not run on ORTModule on the CPU: ORT 1\.19\.2's CPU "
                                         r"kernels have no bfloat16 MatMul"):
        precision.check(Precision.BF16, CPU, "ortmodule")
    for backend in ("pytorch", "compile"):
        assert BurstConfig(backend=backend, precision="bf16", device="cpu").precision is Precision.BF16
    with made_elsewhere():  # a run's config read back on a machine it was not made on: no error while reading it
        assert BurstConfig(backend="pytorch", precision="fp16", device="cpu").precision is Precision.FP16
    assert precision.scaler(Precision.BF16) is None and precision.note(Precision.FP32) is None
    assert precision.note(Precision.BF16).startswith("judged in bf16 (torch.autocast bfloat16")


@pytest.mark.ort
def test_a_comparison_the_precision_rules_out_starts_no_burst(tmp_path):
    done = subprocess.run([sys.executable, "-m", "ortlab.cli", "burst", "--backend", "both", "--precision", "bf16",
                           "--steps", "1", "--out", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == ["ortlab burst: precision 'bf16' does not run on ORTModule on the CPU: "
                                                "ORT 1.19.2's CPU kernels have no bfloat16 MatMul (the first step "
                                                "fails); use fp32 here, or bf16 on CUDA"]
    assert not list(tmp_path.iterdir())  # not even the PyTorch burst ran


def test_a_bf16_burst_runs_under_autocast_on_the_cpu(tmp_path):
    """What autograd keeps for backward is bfloat16 in a bf16 burst: the memory account shows it smaller."""
    with Session(out=tmp_path, in_process=True) as s:
        runs = {p: s.burst("pytorch", 2, precision=p, parity=True, progress=False, collect={"memory": {}})
                for p in ("fp32", "bf16")}
    assert all(r.ok for r in runs.values()), [r.error for r in runs.values()]
    fp32, bf16 = (runs[p].summary() for p in ("fp32", "bf16"))
    assert bf16["saved_for_backward_mb"] < 0.75 * fp32["saved_for_backward_mb"], (bf16, fp32)
    assert runs["bf16"].meta["config"]["precision"] == "bf16"
    assert abs(bf16["final_loss"] - fp32["final_loss"]) < 0.05 * abs(fp32["final_loss"])  # the same model, rounded


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_torch_compile_in_bf16_is_judged_against_pytorch_bf16(tmp_path):
    """A correct torch.compile burst in bf16 agrees, measured against PyTorch bf16's bf16-sized distance to float64
    (not fp32's, which is 1e-7 of a gradient): the verdict says so in a note."""
    with Session(model_kwargs={"n_layer": 1}, out=tmp_path, in_process=True) as s:
        c = s.compare(steps=4, backends="pytorch,compile", precision="bf16", parity=True, progress=False)
    verdict = c.verdict_of("compile")
    assert verdict.status == "agree", str(verdict)
    grads = verdict.gradients
    assert grads["judged_by"] == "float64"
    worst = grads["worst"][0]
    assert worst["pytorch_to_float64"] > 1e-4 * worst["norm"]  # bf16-sized: fp32 is ~1e-7 of the norm
    assert any("judged in bf16" in n and "not fp32 agreement" in n for n in verdict.notes)
    assert verdict.losses["judged_by"] in ("float64", "allclose")
