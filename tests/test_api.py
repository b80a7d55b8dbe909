"""The public API: the README's calls work repeatedly and in any import order; no public name is shadowed by a
module of the same name (importing `ortlab.x.y` rebinds the attribute `y` of `ortlab.x` to the module)."""

import importlib
import pkgutil
import subprocess
import sys
import types

import pytest

import ortlab


def _all_modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(ortlab.__path__, "ortlab."):
        if info.name.endswith("__main__"):
            continue
        names.append(info.name)
    return names


def test_no_public_name_is_a_module_after_importing_everything():
    for name in _all_modules():
        importlib.import_module(name)
    packages = [ortlab] + [sys.modules[n] for n in _all_modules() if hasattr(sys.modules[n], "__path__")]
    for package in packages:
        meant = set(getattr(package, "_PACKAGES", ()))
        for public in getattr(package, "__all__", []):
            value = getattr(package, public)
            if public not in meant:
                assert not isinstance(value, types.ModuleType), f"{package.__name__}.{public} is shadowed by a module"


def test_every_error_of_ortlab_derives_from_ortlab_error():
    """One base: `except ortlab.OrtlabError` catches whatever ortlab raises of its own (warnings have theirs)."""
    from ortlab.errors import OrtlabError

    outside = []
    for name in _all_modules():
        module = importlib.import_module(name)
        for value in vars(module).values():
            if (isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == name
                    and not issubclass(value, Warning) and not issubclass(value, OrtlabError)):
                outside.append(f"{name}.{value.__name__}")
    assert outside == []
    from ortlab._ort import OrtInternalsError
    from ortlab.runs.run import RunWriteError

    assert issubclass(OrtInternalsError, RuntimeError) and issubclass(RunWriteError, OSError)  # what callers catch


SCRIPT = """
import sys
{first}
import ortlab
for _ in range(2):
    run = ortlab.burst(backend="pytorch", steps=2, out={out!r}, progress=False, in_process=True)
    assert run.ok and len(run.metrics) == 2, run
    assert callable(ortlab.burst) and callable(ortlab.session)
print("ok")
"""


@pytest.mark.parametrize("first", ["", "from ortlab import BurstError", "import ortlab.engine.session"])
def test_readme_burst_call_works_twice_in_any_import_order(tmp_path, first):
    r = subprocess.run([sys.executable, "-c", SCRIPT.format(first=first, out=str(tmp_path))],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_import_ortlab_stays_light():
    r = subprocess.run([sys.executable, "-c", "import sys, ortlab; ortlab.Options; "
                        "print(sorted(m for m in ('torch', 'onnxruntime', 'matplotlib') if m in sys.modules))"],
                       capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr
