"""The binder/ files: what mybinder.org would run, run here against the project's environment."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_binder_pins_python_311_and_the_lock():
    """Binder installs requirements.lock on Python 3.11: the very install bin/_env.sh does from nothing, so that
    it resolves is shown by the environment the suite runs in (and tests/test_packaging.py for the other lock)."""
    assert (ROOT / "binder" / "runtime.txt").read_text().strip() == "python-3.11"
    lines = [line for line in (ROOT / "binder" / "requirements.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines == ["-r ../requirements.lock"]
    lock = (ROOT / "requirements.lock").read_text().lower().replace("_", "-")  # pip freeze keeps either spelling
    for pin in ("torch==2.6.0", "onnxruntime-training==1.19.2", "jupyterlab==", "ipywidgets==",
                "jupyter-server-proxy==", "netron=="):
        assert pin in lock


@pytest.mark.slow
@pytest.mark.ort
def test_postbuild_runs(tmp_path):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    r = subprocess.run(["bash", "binder/postBuild"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "the ort stack is healthy" in r.stdout and "ORTModule      runs" in r.stdout
