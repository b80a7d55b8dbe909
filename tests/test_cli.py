import json
import subprocess
import sys

import pytest


def ortlab(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "ortlab.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_options_json_lists_the_registry():
    r = ortlab("options", "--json")
    assert r.returncode == 0
    rows = json.loads(r.stdout)
    env = {row["env"]: row for row in rows}
    assert env["ORTMODULE_MEMORY_OPT_LEVEL"]["read_at"] == "construction"
    assert env["ORTMODULE_ENABLE_SPARSE_OPTIMIZER"]["read_at"] == "never"


def test_options_table():
    r = ortlab("options", "--area", "triton")
    assert r.returncode == 0 and "ORTMODULE_USE_TRITON" in r.stdout and "ORTMODULE_LOG_LEVEL" not in r.stdout
    every = ortlab("options").stdout
    row = next(line for line in every.splitlines() if "ORTMODULE_MEMORY_OPT_LEVEL" in line)
    assert row.split()[:2] == ["memory_opt_level", "ORTMODULE_MEMORY_OPT_LEVEL"]  # the key --option takes, beside
    from ortlab.options import REGISTRY

    areas = [line for line in every.splitlines() if line.startswith("ORTMODULE/")]
    assert sorted(areas) == sorted({s.area for s in REGISTRY})  # each area once, with all its options


def test_bad_option_is_one_line_exit_2(tmp_path):
    r = ortlab("burst", "--option", "memory_opt_level=7", "--out", str(tmp_path))
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0
    assert "memory_opt_level" in r.stderr and "7" in r.stderr and "0, 1, 2" in r.stderr
    r = ortlab("burst", "--option", "no_such_option=1", "--out", str(tmp_path))
    assert r.returncode == 2 and "unknown option 'no_such_option'" in r.stderr


def test_bad_model_is_one_line_exit_2(tmp_path):
    r = ortlab("burst", "--model", "missing.py:make", "--out", str(tmp_path))
    assert r.returncode == 2 and "model file 'missing.py' does not exist" in r.stderr


@pytest.mark.parametrize("command", ["burst", "compare", "check"])
def test_a_missing_model_file_is_named_before_torch_loads(command, tmp_path):
    """A typo in --model is answered in about a second, not after torch's import (18 s on a loaded machine)."""
    code = ("import sys; from ortlab.cli import main; rc = main(sys.argv[1:]); "
            "print('torch loaded' if 'torch' in sys.modules else 'torch not loaded'); sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code, command, "--model", "nosuch.py:make", "--out", str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout.strip() == "torch not loaded", r.stdout + r.stderr
    expected = f"ortlab {command}: model file 'nosuch.py' does not exist (from --model 'nosuch.py:make')"
    assert r.stderr.strip() == expected


@pytest.mark.ort
def test_doctor_json():
    r = ortlab("doctor", "--json")
    report = json.loads(r.stdout)
    assert report["versions"]["onnxruntime"] == "1.19.2"
    assert report["extensions"]["aten_op_executor"] and report["extensions"]["torch_interop_utils"]
    assert r.returncode == (0 if report["ok"] else 1) and report["ok"]


def test_doctor_says_the_stack_and_what_runs_per_backend():
    """On either stack: the stack, every registered backend with whether it runs here (ORTModule's reason and fix
    where it does not), exit 0 when the backends the stack promises run."""
    from ortlab.engine.backends import BACKENDS
    from ortlab.stacks import STACKS, ortmodule_unavailable, this_stack

    r = ortlab("doctor", "--json")
    report = json.loads(r.stdout)
    assert report["stack"] == str(this_stack())
    backends = {b["name"]: b for b in report["backends"]}
    assert list(backends) == list(BACKENDS) and backends["pytorch"]["runs"]
    assert backends["ortmodule"]["runs"] == (ortmodule_unavailable() is None)
    if not backends["ortmodule"]["runs"]:
        assert "ORTLAB_STACK=ort" in backends["ortmodule"]["fix"] and "3.11" in backends["ortmodule"]["fix"]
    assert all(backends[name]["runs"] for name in STACKS[this_stack()].required)
    assert r.returncode == 0 and report["ok"]
    text = ortlab("doctor").stdout
    assert f"the {report['stack']} stack is healthy" in text and "NOT HERE" not in text.split("backends")[0]


@pytest.mark.skipif(__import__("ortlab.stacks").stacks.ortmodule_unavailable() is None,
                    reason="ORTModule runs here: where it does not (the current stack), the refusal is tested")
def test_ortmodule_where_it_cannot_run_is_one_line_never_an_export_failure(tmp_path):
    """The current stack: ORTModule asked for by name, or an ORTModule-only command, is refused in one line saying
    why and where it runs (exit 2), before any burst; the default comparison is PyTorch and torch.compile, with
    one line on ORTModule."""
    for args in (("burst", "--backend", "ortmodule", "--steps", "1"), ("burst", "--backend", "both"),
                 ("plans",), ("check",), ("tune",)):
        r = ortlab(*args, "--out", str(tmp_path))
        assert r.returncode == 2, (args, r.stderr)
        line = r.stderr.strip()
        assert "\n" not in line and line.startswith(f"ortlab {args[0]}: ORTModule does not run here"), (args, line)
        assert "ORTLAB_STACK=ort" in line and "export" not in line and "ModuleNotFoundError" not in line
    assert not list(tmp_path.iterdir())  # nothing started
    from ortlab.engine.backends import parse_backends

    assert parse_backends(None) == ("pytorch", "compile")


@pytest.mark.ort
def test_setup_is_idempotent():
    r = ortlab("setup")
    assert r.returncode == 0 and "already built" in r.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.ort
def test_burst_both_json(tmp_path):
    r = ortlab("burst", "--steps", "4", "--parity", "--json", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["pytorch"]["status"] == summary["ortmodule"]["status"] == "ok"
    assert summary["max_loss_diff"] < 1e-3
    assert summary["ort_init_s"] > 0
    # activation memory per backend from the account (on by default), beside the process's resident set
    assert summary["pytorch"]["saved_for_backward_mb"] > 0 and summary["ortmodule"]["activation_peak_mb"] > 0
    assert "autograd" in summary["pytorch"]["memory_counts"] and summary["saved_for_backward_ratio"] > 0
    from ortlab import load_run

    assert load_run(summary["ortmodule"]["path"]).backend == "ortmodule"


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.ort
def test_burst_table(tmp_path):
    r = ortlab("burst", "--steps", "3", "--backend", "ortmodule", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "final loss" in r.stdout and "ORT init overhead" in r.stdout and "activation peak (MB)" in r.stdout
    assert "final_loss" not in r.stdout  # the labelled table of a comparison, one column


def test_options_reference_page_is_generated_from_the_registry():
    from pathlib import Path

    from ortlab.cli.options import registry_markdown

    page = Path(__file__).resolve().parents[1] / "docs" / "options.md"
    assert page.read_text(encoding="utf-8") == registry_markdown(), \
        "regenerate: ortlab options --markdown > docs/options.md"
    headings = [line for line in registry_markdown().splitlines() if line.startswith("## ")]
    assert len(headings) == len(set(headings))  # an area's options under one heading


@pytest.mark.ort
def test_setup_failure_says_what_is_missing():
    import os

    env = dict(os.environ, CXX="no-such-compiler")
    r = subprocess.run([sys.executable, "-m", "ortlab.cli", "setup", "--force"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 1
    assert "no C++ compiler found" in r.stderr and "apt-get install g++" in r.stderr
    assert ortlab("doctor", "--json").returncode == 0  # the built extensions are untouched
