"""Third-party warnings that say nothing about a run stay out of ortlab's output and the suite's summary; nothing
else is silenced."""

import subprocess
import sys
from pathlib import Path

import pytest

from ortlab.quiet import QUIET

try:
    import tomllib  # novermin: tomli below on 3.10
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.ort
def test_onnxruntimes_import_warning_is_silenced_by_ortlabs_import_and_others_are_not():
    code = ("import warnings; warnings.simplefilter('default'); import ortlab, onnxruntime; "
            "warnings.warn('a warning of the user', UserWarning)")
    r = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "cudart_version" not in r.stderr and "a warning of the user" in r.stderr, r.stderr
    # without ortlab it is there (a CPU build of ORT says it on every import): the entry is not dead
    without = subprocess.run([sys.executable, "-W", "default", "-c", "import onnxruntime"], capture_output=True,
                             text=True)
    assert "WARNING: failed to get cudart_version" in without.stderr, without.stderr


def test_the_suites_filters_carry_ortlabs():
    filters = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["filterwarnings"]
    for category, message, module, _why in QUIET:
        entry = f"ignore:{message}:{category}" + (f":{module}" if module else "")
        assert entry in filters, f"pyproject.toml's filterwarnings lacks {entry}"
