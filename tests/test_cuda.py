"""ortlab's CUDA paths on a real GPU: bursts of every backend that runs there (fp32 from the CLI, fp16 and bf16),
their verdicts, the memory account with the CUDA allocator's figures, `--collect time` with CUDA kernels, `--collect
stats` summarized on the device, a Trainer burst, ORTModule where onnxruntime-training is installed.

Marked `cuda`: without a GPU they skip, saying why (tests/conftest.py). scripts/gpu_check runs them on a GPU machine
from a plain checkout (PYTHONPATH=.), also where pytest is missing (it then calls each test itself, with a
tmp_path): so they use plain asserts, no fixtures but tmp_path, and need neither onnxruntime-training (its test
skips, naming it), ipywidgets nor netron.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

try:
    import pytest
except ImportError:  # scripts/gpu_check runs these itself on a machine without pytest
    pytest = None

if pytest is not None:
    pytestmark = pytest.mark.cuda

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"n_layer": 1}  # the demo GPT with one block: every path, less to compile
TRAINER = "ortlab.demo.trainers:lora_llama"


def skip(reason: str) -> None:
    if pytest is not None:
        pytest.skip(reason)
    raise SkipTest(reason)


class SkipTest(Exception):
    """A test that cannot run here (without pytest: scripts/gpu_check reports it as skipped)."""


def session(out: Path, factory: str | None = None, kwargs: dict | None = None):
    from ortlab import Session

    return Session(factory, kwargs or {}, out=out, in_process=True)


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "ortlab.cli", *args], capture_output=True, text=True, env=env,
                          timeout=900)


def agree(comparison, backend: str, precision: str = "fp32"):
    """The other backend's verdict, asserted to agree (in a mixed precision: judged in it, and saying so)."""
    verdict = comparison.verdict_of(backend)
    assert verdict is not None and verdict.status == "agree", str(verdict)
    if precision != "fp32":
        assert any(f"judged in {precision}" in n for n in verdict.notes), verdict.notes
    return verdict


def test_the_cli_comparison_runs_on_cuda_and_agrees(tmp_path):
    done = cli("burst", "--backend", "pytorch,compile", "--parity", "--device", "cuda", "--steps", "6", "--out",
               str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "compile verdict: agree" in done.stdout, done.stdout
    assert "peak CUDA allocated (MB)" in done.stdout and "peak CUDA reserved (MB)" in done.stdout, done.stdout
    metas = [json.loads((p / "meta.json").read_text()) for p in tmp_path.iterdir() if (p / "meta.json").is_file()]
    assert {m["backend"] for m in metas} == {"pytorch", "compile"}
    assert all(m["device"].startswith("cuda") and m["gpu"] for m in metas), metas


def mixed(tmp_path: Path, precision: str) -> None:
    with session(tmp_path, kwargs=SMALL) as s:
        c = s.compare(steps=4, backends="pytorch,compile", precision=precision, device="cuda", parity=True,
                      progress=False)
    assert c.pytorch.ok and c.run("compile").ok, (c.pytorch.error, c.run("compile").error)
    verdict = agree(c, "compile", precision)
    assert verdict.gradients["judged_by"] in ("float64", "allclose"), verdict.gradients
    for run in (c.pytorch, c.run("compile")):
        assert run.meta["config"]["precision"] == precision
        assert all(math.isfinite(v) for v in run.losses), run.losses
        assert run.summary()["peak_reserved_mb"] >= run.summary()["peak_mem_mb"] > 0


def test_fp16_bursts_train_and_are_judged_in_fp16(tmp_path):
    mixed(tmp_path, "fp16")


def test_bf16_bursts_train_and_are_judged_in_bf16(tmp_path):
    mixed(tmp_path, "bf16")


def test_the_memory_account_has_the_cuda_allocator_beside_it(tmp_path):
    from ortlab.comparison.summary import run_text

    with session(tmp_path, kwargs=SMALL) as s:
        runs = [s.burst(b, 3, device="cuda", progress=False, collect={"memory": {}}) for b in ("pytorch", "compile")]
    for run in runs:
        assert run.ok, run.error
        memory = json.loads((run.path / "memory.json").read_text())
        assert memory["kind"] == "autograd" and memory["saved_bytes"] > 0, memory
        allocator = memory["allocator"]
        assert allocator["peak_reserved_bytes"] >= allocator["peak_allocated_bytes"] > 0, allocator
        assert run.summary()["cuda_allocator_mb"]["peak_allocated"] > 0
        assert f"CUDA allocator for {run.backend} over its steps: peak allocated" in run_text(run)


def test_time_attributes_cuda_kernels_to_modules_and_phases(tmp_path):
    import ortlab
    from ortlab.timing.profile import COMPILED

    with session(tmp_path, kwargs=SMALL) as s:
        runs = [s.burst(b, 6, device="cuda", progress=False, collect={"time": {"steps": [2, 3]}})
                for b in ("pytorch", "compile")]
    for run in runs:
        assert run.ok, run.error
        data = json.loads((run.path / "time.json").read_text())
        assert data.get("device") == "cuda" and not data.get("error"), data
        kernels = {(p["phase"], p["kind"]): p["s"] for p in data["parts"]}
        assert kernels[("forward", "kernels")] > 0 and kernels[("backward", "kernels")] > 0, kernels
        assert data["cuda_kernels"] and data["cuda_kernels"][0]["s"] > 0
        modules = {m["module"] for m in data["modules"] if m["s"] > 0}
        if run.backend == "pytorch":
            assert any(m.startswith("blocks.0") for m in modules), modules
        else:
            assert COMPILED in modules, modules
    assert "CUDA kernels" in ortlab.time(*runs).report()


def test_statistics_on_cuda_mean_what_they_mean_on_the_cpu(tmp_path):
    """The same burst (parity, the same seeds) with statistics on CUDA and on the CPU: the same tensors, the same
    rows to rounding (the GPU's kernels round differently), summarized on the device on CUDA."""
    import numpy as np

    from ortlab.activations import read_stats

    with session(tmp_path, kwargs=SMALL) as s:
        runs = {d: s.burst("pytorch", 2, device=d, parity=True, progress=False, collect={"stats": {}})
                for d in ("cpu", "cuda")}
    assert all(r.ok for r in runs.values()), [r.error for r in runs.values()]
    with np.load(runs["cuda"].path / "stats.npz") as z:
        meta = json.loads(str(z["meta"]))
    assert meta["summarizer"] == "torch" and meta["lost_rows"] == 0, meta
    cpu, cuda = (read_stats(runs[d]) for d in ("cpu", "cuda"))
    assert cpu[["step", "phase", "name"]].equals(cuda[["step", "phase", "name"]])
    first = (cpu.step == 0) & (cpu.phase == "forward")
    assert (cuda.loc[first, "numel"].to_numpy() == cpu.loc[first, "numel"].to_numpy()).all()
    for field in ("min", "max", "norm"):
        np.testing.assert_allclose(cuda.loc[first, field].to_numpy(float), cpu.loc[first, field].to_numpy(float),
                                   rtol=2e-3, atol=1e-4, err_msg=field)
    assert (cuda[["nan", "inf"]].to_numpy() == 0).all()


def test_a_trainer_trains_on_cuda_with_its_compile_start_up(tmp_path):
    with session(tmp_path, TRAINER) as s:
        c = s.compare(steps=3, backends="pytorch,compile", device="cuda", parity=True, progress=False)
    assert c.pytorch.ok and c.run("compile").ok, (c.pytorch.error, c.run("compile").error)
    agree(c, "compile")
    assert c.run("compile").summary()["startup_s"] > 0.5  # measured over the whole first step (2 micro-batches)


def test_ortmodule_trains_on_cuda_where_it_is_installed(tmp_path):
    if importlib.util.find_spec("onnxruntime") is None or importlib.util.find_spec("onnxruntime.training") is None:
        skip("onnxruntime-training is not installed: ORTModule cannot run here")
    with session(tmp_path, kwargs=SMALL) as s:
        c = s.compare(steps=4, backends="pytorch,ortmodule", device="cuda", parity=True, progress=False)
    assert c.pytorch.ok and c.run("ortmodule").ok, (c.pytorch.error, c.run("ortmodule").error)
    agree(c, "ortmodule")


def test_two_nccl_ranks_under_ddp_and_fsdp2_agree_with_one_process(tmp_path):
    """2 ranks over NCCL, one GPU each: a DDP and an FSDP2 parity burst, each judged against one process of the same
    global batch, each rank's time in communication recorded. Fewer than 2 GPUs: skipped, saying so."""
    import torch

    if torch.cuda.device_count() < 2:
        skip(f"2 ranks over NCCL need 2 GPUs (one per rank); this machine has {torch.cuda.device_count()}")
    for strategy in ("ddp", "fsdp2"):
        out = tmp_path / strategy
        r = cli("burst", "--backend", "pytorch", "--nproc", "2", "--strategy", strategy, "--parity", "--steps", "3",
                "--model-arg", "n_layer=1", "--device", "cuda", "--out", str(out))
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        said = [line for line in r.stdout.splitlines() if "against one process of the same global batch" in line]
        assert said and ": agree" in said[0] and f"2 ranks, {strategy})" in said[0], r.stdout[-2000:]
        run = next(p for p in out.iterdir() if p.name.endswith("-pytorch"))
        ranks = json.loads((run / "meta.json").read_text())["ranks"]
        assert [row["rank"] for row in ranks] == [0, 1] and all(row["comm_s"] is not None for row in ranks), ranks
