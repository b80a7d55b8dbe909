"""Packaging as the ecosystem expects: extras that agree with the lock, an entry point, ruff clean."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from ortlab.stacks.table import STACKS

try:
    import tomllib  # novermin: tomli below on 3.10
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
LOCKS = {python: lock for stack in STACKS.values() for python, lock in stack.locks.items()}  # one per Python
INPUTS = {"ort": "requirements.in", "current": "requirements-current.in"}  # what scripts/lock resolves each from


def _lock(name: str = "requirements.lock") -> dict[str, str]:
    pins = {}
    for line in (ROOT / name).read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    return pins


@pytest.mark.parametrize("python", list(LOCKS))
def test_dependencies_and_extras_admit_the_locked_versions(python):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert set(project["optional-dependencies"]) == {"lab", "hf", "lightning", "ort", "test"}
    pins = _lock(LOCKS[python])
    for text in [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]:
        req = Requirement(text)
        if req.name == "ortlab" or (req.marker and not req.marker.evaluate({"python_version": python})):
            continue
        name = req.name.lower().replace("_", "-")
        assert name in pins, f"{name} is declared in pyproject.toml but missing from {LOCKS[python]}"
        assert req.specifier.contains(pins[name], prereleases=True), f"{text} excludes the locked {name}=={pins[name]}"


def test_pytest_addopts_plugins_are_declared_in_the_test_extra():
    """`pip install -e .[test]` then `pytest` or bin/test must not stop at `unrecognized arguments`."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    addopts = config["tool"]["pytest"]["ini_options"]["addopts"] + (ROOT / "bin" / "test").read_text()
    test_extra = {Requirement(r).name for r in config["project"]["optional-dependencies"]["test"]}
    if "--timeout" in addopts:
        assert "pytest-timeout" in test_extra
    if "--nbval" in addopts:
        assert "nbval" in test_extra
    if "--dist" in addopts:
        assert "pytest-xdist" in test_extra


def test_ruff_is_clean():
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "ortlab", "tests", "benchmarks", "scripts"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_the_code_runs_on_python_3_10():
    """Python 3.10 is supported (requirements-py310.lock) but CI's suite runs on 3.11: a name new in 3.11 (enum.StrEnum,
    tomllib) must be caught here, not on a 3.10 user's first run. A guarded use says `# novermin` on its line."""
    r = subprocess.run([str(Path(sys.executable).with_name("vermin")), "--target=3.10-", "--violations", "--no-tips",
                        "ortlab", "tests", "scripts", "benchmarks"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


@pytest.mark.parametrize("stack", list(INPUTS))
def test_the_locks_pin_what_their_in_file_pins(stack):
    wanted = {}
    for line in (ROOT / INPUTS[stack]).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            wanted[name.strip().lower().replace("_", "-")] = version.strip()
    for lock in STACKS[stack].locks.values():
        pins = _lock(lock)
        assert {k: pins.get(k) for k in wanted} == wanted, f"{lock} disagrees with {INPUTS[stack]}: scripts/lock"


def test_only_the_ort_stack_has_ortmodule():
    """onnxruntime-training is the ort stack's (its markers keep it off Python 3.12+); the current stack's locks
    have the newest torch these machines install instead."""
    for stack in STACKS.values():
        for lock in stack.locks.values():
            pins = _lock(lock)
            assert ("onnxruntime-training" in pins) == (stack.name == "ort"), lock
            assert pins["torch"] == stack.torch, lock


@pytest.mark.slow
@pytest.mark.parametrize("python", list(LOCKS))
def test_every_pin_of_each_lock_has_a_wheel_for_its_python(python, tmp_path):
    """pip's resolver, for the lock's Python and Linux x86_64 wheels only, without installing: a pin with no wheel
    for that Python (e.g. a release that dropped 3.10) fails here, on whichever Python runs the suite. The lock of
    the Python running the suite was installed for it from nothing (bin/_env.sh): that one is not asked again."""
    if python == f"{sys.version_info[0]}.{sys.version_info[1]}" and Path(sys.prefix, ".complete").is_file():
        pytest.skip(f"{LOCKS[python]} built this environment")
    abi = "cp" + python.replace(".", "")
    glibc = [f"manylinux_2_{minor}_x86_64" for minor in range(36, 16, -1)]  # Debian 12's glibc 2.36 and older
    platforms = [a for p in (*glibc, "manylinux2014_x86_64", "linux_x86_64") for a in ("--platform", p)]
    # --ignore-requires-python: pip checks it against the interpreter that runs it, not --python-version (on 3.10,
    # 3.11's lock failed on contourpy's >=3.11); the report's requires_python is checked below for the lock's Python
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps",
                        "--ignore-requires-python",
                        "--only-binary=:all:", "--disable-pip-version-check", "--python-version", python,
                        "--implementation", "cp", "--abi", abi, *platforms, "--target", str(tmp_path / "t"),
                        "--report", str(tmp_path / "report.json"), "-r", str(ROOT / LOCKS[python])],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"{LOCKS[python]} on Python {python}: " + r.stderr[-3000:]
    # every pin's requires_python, from the report, against the lock's Python
    assert not _lock_check().inadmissible(json.loads((tmp_path / "report.json").read_text()), f"{python}.0")


def _lock_check():
    spec = importlib.util.spec_from_file_location("lock_check", ROOT / "scripts" / "lock_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_lock_check_names_a_pin_whose_requires_python_excludes_the_locks_python(tmp_path):
    """networkx 3.6.1 needs Python 3.11; pinned in the 3.10 lock it passed a dry run and failed a user's first run
    after 12 minutes. scripts/lock now stops on it, from pip's report."""
    report = {"install": [{"metadata": {"name": "networkx", "version": "3.6.1", "requires_python": "!=3.14.1,>=3.11"}},
                          {"metadata": {"name": "numpy", "version": "1.26.4", "requires_python": ">=3.9"}},
                          {"metadata": {"name": "six", "version": "1.17.0"}}]}
    check = _lock_check()
    assert check.inadmissible(report, "3.10.13") == ["networkx==3.6.1 (requires Python !=3.14.1,>=3.11)"]
    assert check.inadmissible(report, "3.11.7") == []
    (tmp_path / "report.json").write_text(json.dumps(report))
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "lock_check.py"), "report",
                        str(tmp_path / "report.json"), "3.10.13"], capture_output=True, text=True)
    assert r.returncode == 1 and "networkx==3.6.1" in r.stderr


def test_the_environment_script_names_the_pythons_it_needs(tmp_path):
    """On a machine whose only Python is 3.9, bin/ortlab and bin/test stop at once with one message: which
    Pythons work for which stack, why (ORT's wheels), and what to install."""
    import shutil

    (tmp_path / "python3").write_text('#!/bin/sh\ncase "$*" in *%d.%d*) echo 3.9;; *) exit 1;; esac\n')
    (tmp_path / "python3").chmod(0o755)
    for tool in ("dirname", "sh"):
        (tmp_path / tool).symlink_to(shutil.which(tool))
    r = subprocess.run([shutil.which("bash"), str(ROOT / "bin" / "_env.sh")], capture_output=True, text=True,
                       env={"PATH": str(tmp_path), "HOME": str(tmp_path)})
    assert r.returncode != 0
    assert r.stderr.count("\n") == 1 and "needs Python 3.10 or 3.11 for the ort stack, or 3.12 or 3.13 for the " \
           "current stack (found: python3=3.9): ORTModule runs on the ort stack only" in r.stderr, r.stderr
    assert "ships no wheel past Python 3.11" in r.stderr and "ORTLAB_PYTHON=/path/to/python3.11" in r.stderr


def test_saved_notebook_outputs_hold_no_machine_paths():
    """A notebook's saved outputs are what a reader sees on GitHub or Binder: no path of the machine it last ran
    on (a home, a checkout, a cache folder). Run folders are shown relative to the notebook."""
    import json
    import re

    machine_path = re.compile(r"(?<![\w.~])/(?:home|root|tmp|work|Users|mnt|srv|var/folders)/[^\s'\"\\]+")
    found = []
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
        for number, cell in enumerate(cells):
            for output in cell.get("outputs", []):
                found += [f"{notebook.name} cell {number}: {m}" for m in machine_path.findall(json.dumps(output))]
    assert not found, "machine paths in saved outputs (re-run the notebook):\n" + "\n".join(found[:20])


def test_the_trainer_notebook_shows_no_stderr():
    """Notebook 12 trains a Trainer in its own kernel with ortlab.wrap: ORTModule's import and exports print (torch's
    CUDA search, shape inference, ORT's banner) into the run's log, not into the cells (ortlab.common.held)."""
    import json

    cells = json.loads((ROOT / "notebooks" / "12_trainer.ipynb").read_text(encoding="utf-8"))["cells"]
    stderr = [f"cell {n}: {''.join(o['text'])[:100]!r}" for n, cell in enumerate(cells)
              for o in cell.get("outputs", []) if o.get("name") == "stderr"]
    assert not stderr, "stderr in notebook 12's saved outputs (re-run it):\n" + "\n".join(stderr)


@pytest.mark.slow
def test_the_lock_install_check_installs_and_fails_on_an_unpinned_dependency(tmp_path):
    """What .ci/run does for the lock bin/test does not build, on a lock of one package: installed for real with
    --no-deps, then `pip check`: a dependency the lock forgot (six, for python-dateutil) fails it; a passing lock is
    not installed twice."""
    from ortlab.stacks.environment import base_python

    python = base_python()
    script, env = str(ROOT / "scripts" / "lock_check.py"), {**os.environ, "ORTLAB_ENV_ROOT": str(tmp_path / "root")}
    (tmp_path / "bad.lock").write_text("python-dateutil==2.9.0.post0\n")
    (tmp_path / "good.lock").write_text("python-dateutil==2.9.0.post0\nsix==1.17.0\n")
    bad = subprocess.run([sys.executable, script, "install", str(tmp_path / "bad.lock"), python], env=env,
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "requires six, which is not installed" in bad.stderr, bad.stdout + bad.stderr
    for expected in ("every dependency pinned", "already installed"):
        good = subprocess.run([sys.executable, script, "install", str(tmp_path / "good.lock"), python], env=env,
                              capture_output=True, text=True)
        assert good.returncode == 0 and expected in good.stdout, good.stdout + good.stderr


@pytest.mark.slow
def test_an_installed_ortlab_reads_the_stacks_table_it_ships(tmp_path):
    """The stacks' table is data beside ortlab/stacks/table.py (package-data): `pip install .` of a copy of the
    package, away from the checkout, holds it and reads the same stacks; the Lab's JavaScript ships beside its
    module too."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(ROOT / "ortlab", src / "ortlab", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-input",
                        "--disable-pip-version-check", "-q", "--target", str(tmp_path / "site"), str(src)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    code = "import ortlab.stacks.table as t; print(t.__file__); print(sorted((s, i.locks) for s, i in " \
        "t.STACKS.items()))"
    assert (tmp_path / "site" / "ortlab" / "widgets" / "mirror.js").is_file()  # the Lab's anywidget renderer
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(tmp_path / "site")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    where, stacks = r.stdout.splitlines()
    assert where.startswith(str(tmp_path / "site")) and (Path(where).parent / "stacks.txt").is_file()
    assert stacks == str(sorted((s, i.locks) for s, i in STACKS.items()))
