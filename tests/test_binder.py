"""The binder/ files: what mybinder.org would run, run here against the project's environment."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_binder_pins_python_311_and_the_lock():
    assert (ROOT / "binder" / "runtime.txt").read_text().strip() == "python-3.11"
    lines = [line for line in (ROOT / "binder" / "requirements.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines == ["-r ../requirements.lock"]
    lock = (ROOT / "requirements.lock").read_text().lower().replace("_", "-")  # pip freeze keeps either spelling
    for pin in ("torch==2.6.0", "onnxruntime-training==1.19.2", "jupyterlab==", "ipywidgets==",
                "jupyter-server-proxy==", "netron=="):
        assert pin in lock


@pytest.mark.slow
def test_binder_requirements_resolve(tmp_path):
    """pip resolves binder/requirements.txt as Binder would (from the pip cache the environment build filled)."""
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed",
                        "--report", str(tmp_path / "report.json"), "-r", "binder/requirements.txt"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    import json

    names = {item["metadata"]["name"].lower() for item in json.loads((tmp_path / "report.json").read_text())["install"]}
    assert {"torch", "onnxruntime-training", "jupyterlab", "ipywidgets"} <= names


@pytest.mark.slow
def test_postbuild_runs(tmp_path):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    r = subprocess.run(["bash", "binder/postBuild"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "ORTModule can run." in r.stdout
