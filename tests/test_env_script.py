"""bin/_env.sh: which Python and lock it picks (and says so), and that checkouts sharing one environment each run
their own ortlab."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("dirname", "sh", "sha256sum", "cut", "mkdir", "flock", "rm", "cat")


def _fake_python(folder: Path, name: str, version: str) -> None:
    """A stand-in interpreter: answers _env.sh's questions as Python `version` would, and fails to make a venv (so
    the script stops right after saying what it chose)."""
    path = folder / name
    minor = ".".join(version.split(".")[:2])
    path.write_text(f"""#!/bin/sh
case "$*" in
  *%d.%d*) echo "{minor}";;
  *sys.executable*) echo "{path}";;
  *python_version*) echo "{version}"; echo "{version} (fake)";;
  *) exit 3;;
esac
""")
    path.chmod(0o755)


def _env_sh(folder: Path, script: Path = ROOT / "bin" / "_env.sh", **env) -> subprocess.CompletedProcess:
    for tool in TOOLS:
        if not (folder / tool).exists():
            (folder / tool).symlink_to(shutil.which(tool))
    return subprocess.run([shutil.which("bash"), str(script)], capture_output=True, text=True,
                          env={"PATH": str(folder), "HOME": str(folder), "ORTLAB_ENV_ROOT": str(folder / "envs"),
                               **env})


def test_the_active_python3_wins_over_a_python311_on_path(tmp_path):
    """PYENV_VERSION=3.10.13 (or a 3.10 bin/ first on PATH) makes python3 a 3.10, while a python3.11 is on PATH
    too: 3.10 and its lock are used, and the first line says so."""
    _fake_python(tmp_path, "python3", "3.10.13")
    _fake_python(tmp_path, "python3.11", "3.11.7")
    r = _env_sh(tmp_path)
    assert r.returncode != 0  # the fake cannot make a venv
    assert f"the ort stack for Python 3.10.13 ({tmp_path}/python3) from requirements-py310.lock" in r.stderr, r.stderr


def test_ortlab_python_wins_and_an_unsupported_one_is_named(tmp_path):
    _fake_python(tmp_path, "python3", "3.10.13")
    _fake_python(tmp_path, "python3.11", "3.11.7")
    r = _env_sh(tmp_path, ORTLAB_PYTHON=str(tmp_path / "python3.11"))
    assert f"the ort stack for Python 3.11.7 ({tmp_path}/python3.11) from requirements.lock" in r.stderr, r.stderr
    (tmp_path / "python3.9").write_text('#!/bin/sh\ncase "$*" in *%d.%d*) echo 3.9;; *) exit 1;; esac\n')
    (tmp_path / "python3.9").chmod(0o755)
    r = _env_sh(tmp_path, ORTLAB_PYTHON=str(tmp_path / "python3.9"))
    assert r.returncode != 0
    assert r.stderr.strip() == f"ortlab: ORTLAB_PYTHON={tmp_path}/python3.9 is not a Python (3.9; ort: 3.10 or " \
                               "3.11, current: 3.12 or 3.13)"


def test_a_python_312_gets_the_current_stack_and_says_so(tmp_path):
    """A machine whose only Python is 3.12 (or 3.13) builds the current stack from its lock, and says which."""
    _fake_python(tmp_path, "python3", "3.12.1")
    r = _env_sh(tmp_path)
    assert f"the current stack for Python 3.12.1 ({tmp_path}/python3) from requirements-current.lock" in r.stderr
    assert "ORTModule on the ort stack" in r.stderr, r.stderr
    _fake_python(tmp_path, "python3", "3.13.0")
    r = _env_sh(tmp_path)
    assert f"the current stack for Python 3.13.0 ({tmp_path}/python3) from requirements-current-py313.lock" in r.stderr


def test_ortlab_stack_asks_for_a_stack_and_finds_its_python(tmp_path):
    """PYENV_VERSION=3.12.1 makes python3 a 3.12: ORTLAB_STACK=ort still finds a 3.11 (on PATH, or one pyenv
    installed but did not select) and says why it did not take python3; a bad name is refused in one line."""
    _fake_python(tmp_path, "python3", "3.12.1")
    _fake_python(tmp_path, "python3.11", "3.11.7")
    r = _env_sh(tmp_path, ORTLAB_STACK="ort")
    assert "python3 is not a Python of the ort stack (python3=3.12); using python3.11" in r.stderr, r.stderr
    assert f"the ort stack for Python 3.11.7 ({tmp_path}/python3.11) from requirements.lock" in r.stderr
    (tmp_path / "python3.11").unlink()
    root = tmp_path / "pyenv-root"
    (root / "versions" / "3.11.7" / "bin").mkdir(parents=True)
    _fake_python(root / "versions" / "3.11.7" / "bin", "python3.11", "3.11.7")
    (tmp_path / "pyenv").write_text(f'#!/bin/sh\n[ "$1" = root ] && echo {root}\n')
    (tmp_path / "pyenv").chmod(0o755)
    for tool in ("ls", "head"):
        (tmp_path / tool).symlink_to(shutil.which(tool))
    r = _env_sh(tmp_path, ORTLAB_STACK="ort")
    assert f"Python 3.11.7 ({root}/versions/3.11.7/bin/python3.11) from requirements.lock" in r.stderr, r.stderr
    r = _env_sh(tmp_path, ORTLAB_STACK="newest")
    assert r.returncode != 0 and r.stderr.strip().startswith("ortlab: ORTLAB_STACK=newest is not a stack; allowed: ort")


def _bash_answers(root: Path, stacks: dict) -> list[str]:
    """What bin/_stacks.sh under `root` answers, sourced in a bash with no Python (it parses the table with bash's
    builtins alone), for each Python and stack of `stacks` (a table read by ortlab.stacks.table) and for 3.9: the
    Pythons it tries, in order, then one line per answer."""
    from ortlab.engine.backends import BACKENDS

    asks = ['echo "tries" $(_ortlab_candidates)', 'echo "3.9 is $(_ortlab_stack_of 3.9 || echo none)"']
    for info in stacks.values():
        asks += [f'echo "{p} is $(_ortlab_stack_of {p})"; echo "{info.name} {p} builds from $(_ortlab_lock_of '
                 f'{info.name} {p})"' for p in info.locks]
        asks += [f'_ortlab_runs {info.name} {b} && echo "{info.name} runs {b}"' for b in BACKENDS]
    r = subprocess.run([shutil.which("bash"), "-c", 'source "$1" || exit 1\n' + "\n".join(asks), "bash",
                        str(root / "bin" / "_stacks.sh")], capture_output=True, text=True,
                       env={"PATH": os.environ["PATH"], "HOME": str(root)})
    assert r.returncode == 0 and r.stderr == "", r.stderr
    lines = r.stdout.splitlines()
    return lines[:1] + sorted(lines[1:])


def _python_answers(stacks: dict) -> list[str]:
    """The same answers from the table as ortlab.stacks.table read it."""
    from ortlab.engine.backends import BACKENDS

    tries = dict.fromkeys(["python3", *(f"python{p}" for s in stacks.values() for p in s.locks)])
    first = {p: s.name for s in reversed(stacks.values()) for p in s.locks}  # the first stack naming it
    lines = [*(f"{p} is {stack}" for p, stack in first.items()), "3.9 is none"]
    for info in stacks.values():
        lines += [f"{info.name} {p} builds from {lock}" for p, lock in info.locks.items()]
        lines += [f"{info.name} runs {b}" for b in BACKENDS if b in info.backends]
    return [f"tries {' '.join(tries)}", *sorted(lines)]


def test_the_script_and_ortlab_stacks_read_one_table_and_agree():
    """bin/_stacks.sh (bash, for bin/_env.sh) and ortlab/stacks/table.py (Python) read the same file,
    ortlab/stacks/stacks.txt: the same stack and lock for every Python it names, the same Pythons tried in the same
    order, the same backends on each stack."""
    from ortlab.stacks import table

    assert table.read((ROOT / "ortlab" / "stacks" / table.TABLE).read_text()) == table.STACKS
    bash = _bash_answers(ROOT, table.STACKS)
    assert bash == _python_answers(table.STACKS)
    assert "3.11 is ort" in bash and "current 3.12 builds from requirements-current.lock" in bash  # today's table
    assert "ort runs ortmodule" in bash and "current runs ortmodule" not in bash


def test_a_changed_table_changes_both_readers(tmp_path):
    """A copy of the checkout's bin/ and table, the table changed (the current stack listed first and gaining
    Python 3.14, the ort stack losing 3.10 and its 3.11 lock renamed): bash and Python both follow it, and
    bin/_env.sh builds a Python 3.14 from the new row's lock."""
    from ortlab.stacks import table

    (tmp_path / "bin").mkdir()
    for script in ("_env.sh", "_stacks.sh"):
        shutil.copy(ROOT / "bin" / script, tmp_path / "bin" / script)
    (tmp_path / "ortlab" / "stacks").mkdir(parents=True)
    rows = (ROOT / "ortlab" / "stacks" / table.TABLE).read_text().splitlines()
    ort = [r for r in rows if r.split()[:2] == ["python", "ort"]]
    current = [r for r in rows if r.split()[:2] == ["python", "current"]]
    changed = [*current, "python current 3.14 requirements-current-py314.lock 2.15.0",
               ort[0].replace("requirements.lock", "requirements-ort.lock"),
               *(r for r in rows if not r.startswith("python"))]
    (tmp_path / "ortlab" / "stacks" / table.TABLE).write_text("\n".join(changed) + "\n")
    stacks = table.read((tmp_path / "ortlab" / "stacks" / table.TABLE).read_text())
    assert list(stacks) == ["current", "ort"] and stacks["ort"].pythons == ("3.11",)
    assert stacks["current"].locks["3.14"] == "requirements-current-py314.lock" and stacks["ort"].torch == "2.6.0"
    bash = _bash_answers(tmp_path, stacks)
    assert bash == _python_answers(stacks)
    assert bash[0] == "tries python3 python3.12 python3.13 python3.14 python3.11"
    assert "ort 3.11 builds from requirements-ort.lock" in bash and "3.10 is ort" not in bash
    (tmp_path / "requirements-current-py314.lock").write_text("torch==2.15.0\n")
    _fake_python(tmp_path, "python3", "3.14.0")
    r = _env_sh(tmp_path, script=tmp_path / "bin" / "_env.sh")
    assert f"the current stack for Python 3.14.0 ({tmp_path}/python3) from requirements-current-py314.lock" \
        in r.stderr, r.stderr
    _fake_python(tmp_path, "python3", "3.10.13")
    r = _env_sh(tmp_path, script=tmp_path / "bin" / "_env.sh")
    assert r.returncode != 0 and "needs Python 3.11 for the ort stack, or 3.12 or 3.13 or 3.14 for the current " \
        "stack (found: python3=3.10)" in r.stderr, r.stderr


def test_a_python3_of_another_version_falls_back_and_says_so(tmp_path):
    (tmp_path / "python3").write_text('#!/bin/sh\ncase "$*" in *%d.%d*) echo 3.9;; *) exit 1;; esac\n')
    (tmp_path / "python3").chmod(0o755)
    _fake_python(tmp_path, "python3.11", "3.11.7")
    r = _env_sh(tmp_path)
    assert "python3 is not a Python (python3=3.9); using python3.11" in r.stderr, r.stderr
    assert "for Python 3.11.7" in r.stderr


def _clone(into: Path) -> Path:
    """What a fresh clone holds of what bin/ortlab needs (the working tree's files, committed or not)."""
    into.mkdir()
    for name in ("bin", "scripts", "ortlab"):
        shutil.copytree(ROOT / name, into / name, ignore=shutil.ignore_patterns("__pycache__"))
    for lock in ROOT.glob("requirements*.lock"):
        shutil.copy(lock, into / lock.name)
    return into


@pytest.mark.slow
@pytest.mark.skipif(not Path(sys.prefix, ".complete").is_file(), reason="needs an environment bin/_env.sh built")
def test_two_clones_sharing_one_environment_each_run_their_own_ortlab(tmp_path):
    """The environment is shared (keyed by lock and Python, not by checkout); ortlab's code is not. Two clones used
    one after the other, then the first again: each `doctor` runs from its own checkout, whichever checkout the
    environment was built from."""
    first, second = _clone(tmp_path / "first"), _clone(tmp_path / "second")
    (second / "ortlab" / "engine" / "diagnosis.py").write_text(
        (second / "ortlab" / "engine" / "diagnosis.py").read_text().replace('"ortlab from  ', '"ortlab from (second) '))
    from ortlab.stacks.environment import base_python

    env = dict(os.environ, ORTLAB_ENV_ROOT=str(Path(sys.prefix).parent), ORTLAB_PYTHON=base_python())
    env.pop("PYTHONPATH", None)
    seen = []
    for clone in (first, second, first):
        r = subprocess.run([str(clone / "bin" / "ortlab"), "doctor"], capture_output=True, text=True, env=env,
                           cwd=tmp_path)
        assert "building the environment" not in r.stderr, "the clone did not find the shared environment"
        assert f"environment: {sys.prefix})" in r.stdout, r.stdout + r.stderr
        seen.append(next(line for line in r.stdout.splitlines() if line.startswith("ortlab from")))
    assert seen == [f"ortlab from  {first}", f"ortlab from (second) {second}", f"ortlab from  {first}"]


def test_ortlab_env_root_moves_the_compiled_kernels_too(tmp_path):
    """One variable moves everything ortlab builds outside a checkout: the environments (bin/_env.sh) and the C
    kernels compiled on first use, which went to ~/.cache/ortlab whatever ORTLAB_ENV_ROOT said."""
    code = "from ortlab.common.kernels import stats_kernel; print(stats_kernel() is not None)"
    env = dict(os.environ, ORTLAB_ENV_ROOT=str(tmp_path / "root"), HOME=str(tmp_path / "home"))
    env.pop("XDG_CACHE_HOME", None)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    if r.stdout.strip() != "True":
        pytest.skip("no C compiler here: the kernels fall back to numpy and write nothing")
    assert list((tmp_path / "root" / "kernels").glob("ortlab_stats_*")), sorted(tmp_path.rglob("*"))
    assert not (tmp_path / "home").exists()


def test_a_failed_install_shows_pips_error_first_and_each_download_with_its_size(tmp_path):
    """pip's resolver notices came before its one ERROR line (the 25th of 25 shown); now the error leads."""
    pip = tmp_path / "pip"
    pip.write_text("#!/bin/sh\n"
                   "echo 'Collecting torch==2.6.0'\n"
                   "echo '  Downloading torch-2.6.0-cp310-cp310-manylinux1_x86_64.whl (766.7 MB)'\n"
                   + "echo 'INFO: pip is looking at multiple versions of networkx'\n" * 24 +
                   "echo \"ERROR: Package 'networkx' requires a different Python: 3.10.13 not in '>=3.11'\"\n"
                   "exit 1\n")
    pip.chmod(0o755)
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "install_progress.py"), str(tmp_path / "log"),
                        str(tmp_path), "--", str(pip)], capture_output=True, text=True)
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    assert "downloading torch-2.6.0 (766.7 MB); 767 MB downloaded so far" in lines[0]
    assert lines[1] == "ERROR: Package 'networkx' requires a different Python: 3.10.13 not in '>=3.11'"
    assert lines[-1] == f"ortlab: installing the pinned packages failed (pip exit 1); full log: {tmp_path / 'log'}"
    assert (tmp_path / "log").read_text().count("INFO: pip is looking") == 24


def _unresolved(library: Path, **env) -> set[str]:
    """The libraries `ldd` cannot find for `library` (with `env` added to this process's environment)."""
    out = subprocess.run(["ldd", str(library)], capture_output=True, text=True, env={**os.environ, **env}).stdout
    return {line.split()[0] for line in out.splitlines() if "not found" in line}


@pytest.mark.slow
@pytest.mark.ort
@pytest.mark.timeout(1800)
@pytest.mark.skipif(shutil.which("ldd") is None, reason="no ldd on this machine")
def test_on_a_gpu_the_ort_stack_gets_the_cuda_11_libraries_its_provider_loads(tmp_path):
    """ORT's CUDA provider (onnxruntime-training 1.19.2, a CUDA 11.8 build) needs CUDA 11 libraries torch 2.6 does not
    bring. Told there is a GPU (ORTLAB_GPU=1: there is none here), scripts/ort_cuda.py installs
    requirements-ort-cuda.lock into a folder of the environment and prints its library folders, which bin/_env.sh
    puts on LD_LIBRARY_PATH: with them, every library the provider needs resolves; without a GPU it installs and
    prints nothing. (The folder is kept under the cache root: 1.4 GB, installed once.)"""
    import onnxruntime

    from ortlab.common.cache import cache_root

    provider = Path(onnxruntime.__file__).parent / "capi" / "libonnxruntime_providers_cuda.so"
    script = str(ROOT / "scripts" / "ort_cuda.py")
    none = subprocess.run([sys.executable, script, str(tmp_path)], env={**os.environ, "ORTLAB_GPU": "0"},
                          capture_output=True, text=True)
    assert none.returncode == 0 and none.stdout == "" and not (tmp_path / "ort-cuda11").exists()
    r = subprocess.run([sys.executable, script, str(cache_root() / "ort-cuda-check")],
                       env={**os.environ, "ORTLAB_GPU": "1"}, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stderr[-3000:]
    folders = r.stdout.strip().split(":")
    assert folders and all(Path(f).is_dir() for f in folders), r.stdout
    before = _unresolved(provider, LD_LIBRARY_PATH="")
    assert {"libcublas.so.11", "libcudnn.so.8", "libcudart.so.11.0"} <= before  # what torch's CUDA 12 lacks
    assert _unresolved(provider, LD_LIBRARY_PATH=":".join(folders)) == set()
