"""Third-party warnings that say nothing about a run stay out of ortlab's output and the suite's summary; nothing
else is silenced."""

import subprocess
import sys
from pathlib import Path

import pytest

from ortlab.common.quiet import QUIET

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


def test_ort_messages_around_a_wrapped_model_are_held_for_the_runs_log_unless_asked_for(tmp_path, capsys,
                                                                                      monkeypatch):
    """What ORT's loggers and its import print around a model trained in the user's kernel (ortlab.wrap) stays
    out of the cell: held, then written first into the next run's log.txt; ORTLAB_SHOW_OUTPUT=1 shows it."""
    import logging

    from ortlab.common import held

    root = logging.getLogger()
    handler = logging.StreamHandler()  # what ORT's import configures: the root logger to stderr
    root.addHandler(handler)
    try:
        with held.held(streams=True):
            logging.getLogger("orttraining").warning("ORT's banner")
            logging.getLogger("onnxruntime.tools.symbolic_shape_infer").warning("shape inference")
            print("No CUDA runtime is found", file=sys.stderr)
        assert capsys.readouterr().err == ""
        assert [line.split(" - ")[-1] for line in held.lines()[-3:-1]] == ["ORT's banner", "shape inference"]
        assert held.lines()[-1] == "No CUDA runtime is found"
        log = tmp_path / "log.txt"
        with held.run_log(log), held.held():
            logging.getLogger("orttraining").warning("an export during the run")
        text = log.read_text()
        assert text.index("held back from the notebook") < text.index("ORT's banner") < text.index(
            "an export during the run") and held.lines() == []
        monkeypatch.setenv("ORTLAB_SHOW_OUTPUT", "1")
        with held.held():
            logging.getLogger("orttraining").warning("asked for")
        assert "asked for" in capsys.readouterr().err and held.lines() == []
    finally:
        root.removeHandler(handler)
