"""scripts/gpu_check, the one command that proves ortlab's CUDA paths on a GPU machine: refused in one line without a
GPU, and (with the device check faked, which only this test does) run end to end on the CPU with tiny settings: one
table, each benchmark's ratio against its target, each `cuda` test (skipped here, saying why), the raw outputs in
--out, and an exit code that says whether every row passed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check"


def gpu_check(*args: str, fake: bool = False, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("ORTLAB_GPU_CHECK_FAKE_DEVICE", "OUT")}
    env.update(PYTHON=sys.executable, PYTHONPATH=str(ROOT))
    if fake:
        env["ORTLAB_GPU_CHECK_FAKE_DEVICE"] = "cpu"
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)


def test_without_a_gpu_it_refuses_in_one_line(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: gpu_check would run")
    assert os.access(SCRIPT, os.X_OK)
    done = gpu_check("--out", str(tmp_path / "out"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == ["gpu_check: no CUDA GPU here (torch.cuda.is_available() is False): "
                                                "it proves ortlab's CUDA paths on a GPU machine"]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_faked_on_the_cpu_it_runs_end_to_end_and_prints_one_table(tmp_path):
    out = tmp_path / "out"
    done = gpu_check("--out", str(out), "--budget", "1800", fake=True, timeout=2300)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    results = json.loads((out / "results.json").read_text())
    rows = {r["check"]: r for r in results["rows"]}
    assert done.returncode == (0 if all(r["result"] in ("pass", "skipped") for r in rows.values()) else 1)
    assert results["passed"] == (done.returncode == 0)
    for name, key in (("statistics", "stats_overhead: demo/pytorch"), ("burst bookkeeping", "burst_overhead: pytorch"),
                      ("compile bookkeeping", "compile_overhead: compile")):
        row = rows[f"{name} ({key})"]
        assert row["measured"] > 0 and row["result"] == ("pass" if row["measured"] <= row["target"] else "fail")
        assert row["device"].startswith("cpu (")
    assert rows["statistics (stats_overhead: demo/pytorch)"]["target"] == 1.15
    assert rows["burst bookkeeping (burst_overhead: pytorch)"]["target"] == 1.05
    tests = {k: r for k, r in rows.items() if k.startswith("cuda test: ")}
    assert "cuda test: test_fp16_bursts_train_and_are_judged_in_fp16" in tests and len(tests) >= 7
    assert all(r["result"] == "skipped" and "no CUDA device" in r["note"] for r in tests.values()), tests
    table = (out / "table.txt").read_text()
    assert done.stdout.rstrip().endswith(table.rstrip())  # the table is the last thing printed
    assert "ortlab gpu_check on no GPU: the device check faked on the CPU" in table and "<= 1.15x" in table
    for raw in ("stats_overhead.log", "stats_overhead.json", "burst_overhead.log", "compile_overhead.log",
                "cuda-tests.log", "cuda-tests.xml"):
        assert (out / raw).is_file(), raw
