"""The type check: mypy over ortlab.engine, ortlab.verdict, ortlab.compat, the parity helpers and the collectors'
packages (ortlab.timing, ortlab.account, ortlab.activations; [tool.mypy] in pyproject.toml) finds nothing. mypy is
not in the environment's locks: requirements-typecheck.lock installs it once into a side folder per Python
(scripts/side_packages.py), which the check puts first on PYTHONPATH."""

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


def test_the_typed_packages_check_clean(mypy_folder, tmp_path):
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


def test_a_config_holds_members_and_writes_plain_strings():
    """A user's strings become the closed sets' members; the run folder's config keeps the plain strings, and
    reading it back gives the same config."""
    import json

    from ortlab.engine.config import BurstConfig
    from ortlab.engine.types import Device, Optimizer, Precision, Sampler

    cfg = BurstConfig(backend="pytorch", optimizer="sgd", precision=Precision.BF16, device="cpu",
                      sampler="distributed")
    assert (cfg.optimizer, cfg.precision, cfg.device, cfg.sampler) == (
        Optimizer.SGD, Precision.BF16, Device.CPU, Sampler.DISTRIBUTED)
    assert cfg.optimizer is Optimizer.SGD and cfg.device is Device.CPU
    written = cfg.to_dict()
    assert [type(written[k]) for k in ("optimizer", "precision", "device", "sampler")] == [str] * 4
    assert json.loads(json.dumps(written))["optimizer"] == "sgd"
    assert BurstConfig.from_dict(json.loads(json.dumps(written))) == cfg


@pytest.mark.parametrize("field, value, message", [
    ("device", "cdua", "device 'cdua' is not allowed; allowed: auto, cpu, cuda; did you mean cuda?"),
    ("optimizer", "adam", "optimizer 'adam' is not allowed; allowed: auto, adamw, sgd, fused_adam, fp16_optimizer, "
                          "zero1; did you mean adamw"),
    ("sampler", "random", "sampler 'random' is not allowed; allowed: distributed, load_balancing (or None: a dataset "
                          "in order)"),
])
def test_a_value_outside_a_closed_set_names_what_is_allowed(field, value, message):
    from ortlab.engine.config import BurstConfig, BurstError

    with pytest.raises(BurstError) as e:
        BurstConfig(backend="pytorch", **{field: value})
    assert str(e.value).startswith(message)
