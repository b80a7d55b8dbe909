import json
import subprocess
import sys

import pytest


def ortlab(*args, timeout=600, cwd=None):
    return subprocess.run([sys.executable, "-m", "ortlab.cli", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd)


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
    from ortlab.stacks.table import STACKS, ortmodule_unavailable, this_stack

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


@pytest.mark.skipif(__import__("ortlab.stacks.table").stacks.table.ortmodule_unavailable() is None,
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


def _runs_folder(tmp_path):
    """Runs as bursts write them, with the long fields a real folder has: a busy machine, the memory account's
    words, fixes, hazards, a verdict with its evidence, a long name, a damaged run."""
    from ortlab.runs.run import RunWriter, new_run_dir, write_json

    folder = tmp_path / "runs"
    made = []
    for backend, name, fixes in (("pytorch", None, None), ("ortmodule", None, ["pytorch-buffers", "activations"]),
                                 ("ortmodule", "tune-baseline-again-12-with-a-rather-long-name", None)):
        path = new_run_dir(folder, backend, name)
        w = RunWriter(path, {"backend": backend, "device": "cpu", "config": {}, "machine": {"cpu_wait": 0.73},
                             **({"fixes": {"applied": fixes}} if fixes else {}),
                             **({"hazards": [{"kind": "tensor used as a Python bool"}] * 3} if fixes else {})})
        for step in range(3):
            w.step({"step": step, "loss": 2.5 - step / 10, "step_time_s": 0.0123, "peak_mem_mb": 612.25})
        w.finish("ok")
        write_json(path / "memory.json", {"kind": "ort", "peak_activation_bytes": 7.6e6, "stashed_bytes": 7e6,
                                          "counts": "ORTModule: the activation buffers of ORT's execution graph at "
                                          "the burst's shapes, step by step (kept for backward: forward buffers "
                                          "alive across the yield); parameters, gradients, optimizer state apart"})
        if backend == "ortmodule":
            write_json(path / "verdict.json", {"status": "agree", "gradients": {"worst": [
                {"parameter": "transformer.h.1.attn.c_attn.weight", "to_float64": 4.5e-7,
                 "pytorch_to_float64": 3.1e-7}], "factor": 4}})
        made.append(path)
    (folder / "damaged").mkdir()
    (folder / "damaged" / "meta.json").write_text("{not json")
    return folder, made


def test_runs_is_a_table_that_fits_100_columns_with_details_on_request(tmp_path):
    folder, made = _runs_folder(tmp_path)
    table = ortlab("runs", str(folder))
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100, "\n".join(line for line in lines if len(line) > 100)
    for path in made:  # every run on its own line, named so that `ortlab runs RUN` finds it
        assert any(line.startswith(path.name) for line in lines), (path.name, lines)
    assert any("unreadable" in line and line.startswith("damaged") for line in lines)
    assert "agree" in table.stdout and "ORT's execution graph" not in table.stdout  # the words are details
    long = ortlab("runs", "runs", "--long", cwd=tmp_path)  # as typed in the folder that holds them
    assert long.returncode == 0 and max(len(line) for line in long.stdout.splitlines()) <= 100
    for text in ("ORT's execution graph", "it waited for a core 73% of the time", "pytorch-buffers, activations",
                 "transformer.h.1.attn.c_attn.weight", "not valid JSON", f"path: runs/{made[0].name}"):
        assert text in " ".join(long.stdout.split()), text
    one = ortlab("runs", str(made[1].relative_to(tmp_path)), cwd=tmp_path)  # as typed: a path is never broken
    assert one.returncode == 0 and made[1].name in one.stdout and made[0].name not in one.stdout
    assert "pytorch-buffers" in one.stdout and max(len(line) for line in one.stdout.splitlines()) <= 100
    data = json.loads(ortlab("runs", str(folder), "--json").stdout)
    assert {r["run"] for r in data} >= {p.name for p in made} and "memory_counts" in data[0]
