"""The type check: mypy over ortlab.engine, ortlab.verdict and ortlab.compat ([tool.mypy] in pyproject.toml) finds
nothing. mypy is not in the environment's locks: requirements-typecheck.lock installs it once into a side folder
per Python (scripts/side_packages.py), which the check puts first on PYTHONPATH."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mypy_folder() -> str:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "side_packages.py"), "--lock",
                           "requirements-typecheck.lock"], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        pytest.skip(f"mypy's side folder (requirements-typecheck.lock) could not be installed: {done.stderr[-500:]}")
    return done.stdout.strip()


def test_engine_verdict_and_compat_type_check_clean(mypy_folder, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([mypy_folder, str(ROOT)])}
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                           "--cache-dir", str(tmp_path / "cache"), "--no-error-summary"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout[-6000:] + done.stderr[-2000:]


def test_the_check_reports_a_wrong_type(mypy_folder, tmp_path):
    """The check can fail: a plain string where an enum is wanted is named, with its file and line."""
    bad = tmp_path / "bad.py"
    bad.write_text("from ortlab.compat.registry import FixKind\n\nkind: FixKind = 'module'\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([mypy_folder, str(ROOT)])}
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                           "--cache-dir", str(tmp_path / "cache"), str(bad)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1 and "bad.py:3: error: Incompatible types in assignment" in done.stdout, done.stdout
