import ast
import os
import re
from pathlib import Path

import pytest

from ortlab.options import REGISTRY, SPECS, OptionError, Options, ReadAt, spec
from tests.conftest import REFERENCE


def ort_training_dir() -> Path:
    import importlib.util

    spec_ = importlib.util.find_spec("onnxruntime")
    return Path(next(iter(spec_.submodule_search_locations))) / "training"


# --- construction and validation


def test_three_ways_to_build_agree():
    a = Options(memory_opt_level=1, log_level="INFO")
    b = Options({"ORTMODULE_MEMORY_OPT_LEVEL": "1", "ORTMODULE_LOG_LEVEL": "info"})
    c = Options.parse(["memory_opt_level=1", "ORTMODULE_LOG_LEVEL=INFO"])
    assert a == b == c
    assert a["memory_opt_level"] == 1 and a["ORTMODULE_LOG_LEVEL"] == "INFO"
    assert a.env() == {"ORTMODULE_LOG_LEVEL": "INFO", "ORTMODULE_MEMORY_OPT_LEVEL": "1"}


def test_defaults_are_not_kept():
    assert len(Options(enable_compute_optimizer=True, memory_opt_level=0)) == 0
    assert Options()["enable_compute_optimizer"] is True


def test_bool_forms():
    for text in ("1", "true", "ON", "yes"):
        assert Options(print_input_density=text)["print_input_density"] is True
    assert Options(enable_compute_optimizer="0")["enable_compute_optimizer"] is False


@pytest.mark.parametrize(
    ("kwargs", "must_name"),
    [
        ({"memory_opt_level": 5}, ["memory_opt_level", "5", "0, 1, 2"]),
        ({"log_level": "LOUD"}, ["log_level", "LOUD", "VERBOSE", "DEVINFO"]),
        ({"enable_compute_optimizer": "maybe"}, ["enable_compute_optimizer", "maybe", "true/false"]),
        ({"max_tuning_duration_ms": -1}, ["max_tuning_duration_ms", "-1", ">= 0"]),
        ({"onnx_opset_version": "x"}, ["onnx_opset_version", "'x'"]),
    ],
)
def test_bad_value_names_option_value_and_allowed(kwargs, must_name):
    with pytest.raises(OptionError) as e:
        Options(**kwargs)
    for text in must_name:
        assert text in str(e.value)


def test_unknown_name_suggests_close_ones():
    with pytest.raises(OptionError, match=r"unknown option 'memory_opt_levl'.*memory_opt_level"):
        Options(memory_opt_levl=1)
    with pytest.raises(OptionError, match="not KEY=VALUE"):
        Options.parse(["memory_opt_level"])


def test_diff_and_export_lines():
    old, new = Options(memory_opt_level=1), Options(memory_opt_level=2, log_level="INFO")
    assert old.diff(new) == {"log_level": ("WARNING", "INFO"), "memory_opt_level": (1, 2)}
    assert new.export_lines() == "export ORTMODULE_LOG_LEVEL=INFO\nexport ORTMODULE_MEMORY_OPT_LEVEL=2"


# --- the scoped environment


def test_applied_sets_exactly_and_restores(monkeypatch):
    monkeypatch.setenv("ORTMODULE_PRINT_INPUT_DENSITY", "1")  # a stray user setting is unset inside
    monkeypatch.setenv("UNRELATED", "x")
    before = dict(os.environ)
    with Options(memory_opt_level=1).applied():
        assert os.environ["ORTMODULE_MEMORY_OPT_LEVEL"] == "1"
        assert "ORTMODULE_PRINT_INPUT_DENSITY" not in os.environ
        assert os.environ["UNRELATED"] == "x"
    assert dict(os.environ) == before


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_applied_restores_on_exceptions_and_interrupts(monkeypatch, exc):
    monkeypatch.setenv("ORTMODULE_LOG_LEVEL", "ERROR")
    before = dict(os.environ)
    with pytest.raises(exc), Options(log_level="INFO", use_triton=True).applied():
        assert os.environ["ORTMODULE_LOG_LEVEL"] == "INFO"
        raise exc()
    assert dict(os.environ) == before


# --- the registry against ORT 1.19.2's own source and the guidelines


def _env_reads(root: Path) -> dict[str, list[tuple[Path, bool]]]:
    """Every ORTMODULE_* string that ORT passes to os.getenv / os.environ / _defined_from_envvar, with whether
    the read is at module level (runs at import) or inside a function."""
    reads: dict[str, list[tuple[Path, bool]]] = {}
    for path in root.rglob("*.py"):
        if "test" in path.parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and re.fullmatch(r"ORTMODULE_[A-Z0-9_]+", node.value)):
                parent = parents.get(node)
                is_read = isinstance(parent, ast.Call | ast.Compare) or (
                    isinstance(parent, ast.Assign) and path.name == "options.py")
                if not is_read:
                    continue
                # a class constant naming the variable (options.py) is read through that name inside methods
                n, in_function = node, isinstance(parent, ast.Assign)
                while not in_function and n in parents:
                    n = parents[n]
                    if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                        in_function = True
                        break
                reads.setdefault(node.value, []).append((path, in_function))
    return reads


@pytest.mark.ort
def test_every_variable_ort_reads_is_in_the_registry():
    reads = _env_reads(ort_training_dir())
    registered = {s.env for s in REGISTRY if s.env}
    not_options = {"ORTMODULE_JSON_CONFIG_PATH",  # only read by an explicit load_from_json(path) call
                   "ORTMODULE_EXTERNAL_TORCH_CPP_EXTENSION_DIR", "ORTMODULE_EXTERNAL_TORCH_CUDA_EXTENSION_DIR"}
    missing = set(reads) - registered - not_options
    assert not missing, f"ORT 1.19.2 reads these but the registry lacks them: {sorted(missing)}"


@pytest.mark.ort
def test_read_at_matches_where_ort_reads_it():
    reads = _env_reads(ort_training_dir())
    for s in REGISTRY:
        if s.env is None or s.read_at is ReadAt.NEVER:
            continue
        places = reads.get(s.env)
        assert places, f"{s.env} is registered as read but ORT 1.19.2 never reads it"
        at_import = any(not in_function for _, in_function in places)
        assert at_import == (s.read_at is ReadAt.IMPORT), (s.env, s.read_at, places)


@pytest.mark.ort
def test_never_read_options_are_really_never_read():
    reads = _env_reads(ort_training_dir())
    for s in REGISTRY:
        if s.read_at is ReadAt.NEVER:
            assert s.env not in reads


@pytest.mark.skipif(not (REFERENCE / "ORTModule_Training_Guidelines.md").exists(), reason="shared/reference missing")
def test_every_documented_variable_is_in_the_registry():
    text = (REFERENCE / "ORTModule_Training_Guidelines.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"ORTMODULE_[A-Z0-9_]+", text))
    assert documented <= {s.env for s in REGISTRY}
    for name in documented:
        assert spec(name).documented, name


def test_spec_entries_are_complete():
    for s in REGISTRY:
        assert s.description and s.area and s.source
        s.parse(s.default) if s.default != "" or s.kind.value in ("path", "text") else None
    assert SPECS["use_triton"].needs_cuda and not SPECS["memory_opt_level"].needs_cuda
    assert SPECS["enable_custom_autograd"].read_at is ReadAt.IMPORT
