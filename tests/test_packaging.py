"""Packaging as the ecosystem expects: extras that agree with the lock, an entry point, ruff clean."""

import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def _lock() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    return pins


def test_dependencies_and_extras_admit_the_locked_versions():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert set(project["optional-dependencies"]) == {"lab", "test"}
    pins = _lock()
    for text in [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]:
        req = Requirement(text)
        if req.name == "ortlab":
            continue
        name = req.name.lower().replace("_", "-")
        assert name in pins, f"{name} is declared in pyproject.toml but missing from requirements.lock"
        assert req.specifier.contains(pins[name], prereleases=True), f"{text} excludes the locked {name}=={pins[name]}"


def test_pytest_addopts_plugins_are_declared_in_the_test_extra():
    """`pip install -e .[test]` then `pytest` must not stop at `unrecognized arguments`."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    addopts = config["tool"]["pytest"]["ini_options"]["addopts"]
    test_extra = {Requirement(r).name for r in config["project"]["optional-dependencies"]["test"]}
    if "--timeout" in addopts:
        assert "pytest-timeout" in test_extra
    if "--nbval" in addopts:
        assert "nbval" in test_extra


def test_ruff_is_clean():
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "ortlab", "tests", "benchmarks", "scripts"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
