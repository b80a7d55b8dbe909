"""The type check: mypy over ortlab.engine, ortlab.verdict, ortlab.compat, the parity helpers and the collectors'
packages (ortlab.timing, ortlab.account, ortlab.activations; [tool.mypy] in pyproject.toml) finds nothing. mypy is
not in the environment's locks: requirements-typecheck.lock installs it once into a side folder per Python
(scripts/side_packages.py), which the check puts first on PYTHONPATH."""

from __future__ import annotations

import dataclasses
import os
import re
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


def _references():
    """(where in the registries, the reference) for every typed reference of every entry of the engine's registries
    (the backends', the collectors'): a field that is one, or a tuple holding one."""
    from ortlab.engine.backends import BACKENDS
    from ortlab.engine.collectors import COLLECTORS
    from ortlab.engine.refs import Ref

    for registry, entries in (("BACKENDS", BACKENDS), ("COLLECTORS", COLLECTORS)):
        for key, entry in entries.items():
            for f in dataclasses.fields(entry):
                value, where = getattr(entry, f.name), f"{registry}[{key!r}].{f.name}"
                if isinstance(value, Ref):
                    yield where, None, value
                elif isinstance(value, tuple):
                    yield from ((where, i, v) for i, v in enumerate(value) if isinstance(v, Ref))


def _stub(references, extra: str = "") -> str:
    """A module in which mypy holds each reference to its field's type: `expect(ref.resolve)` takes T from the
    field's `Ref[T]` alone, and the named class or function is passed where a T is wanted. The verdict's procedure,
    which ortlab.judging imports by name (PROCEDURE), is held to the judging's Protocol the same way."""
    from ortlab.judging import PROCEDURE

    head = ["from collections.abc import Callable", "from typing import TypeVar", "",
            "from ortlab.engine.backends import BACKENDS", "from ortlab.engine.collectors import COLLECTORS",
            "from ortlab.judging import Verdicts", f"import {PROCEDURE} as _procedure", ""]
    body = ['T = TypeVar("T")', "", "", "def expect(resolve: Callable[[], T]) -> Callable[[T], None]:",
            "    return lambda value: None", "", "", "_verdicts: Verdicts = _procedure"]
    for n, (where, index, ref) in enumerate(references):
        head.append(f"from {ref.module} import {ref.attribute} as _{n}")
        item = "" if index is None else f"[{index}]"
        body += [f"_t{n} = {where}", f"assert _t{n} is not None", f"expect(_t{n}{item}.resolve)(_{n})"]
    return "\n".join([*head, "", *body, extra, ""])


def test_every_registered_reference_resolves():
    """Each backend's class, adapters and checks and each collector's class and settings check, named by reference
    so that the engine imports nothing above it, is there; no field still names code by a plain string."""
    from ortlab.engine.backends import BACKENDS
    from ortlab.engine.collectors import COLLECTORS

    found = list(_references())
    assert len(found) >= 3 * len(BACKENDS) + len(COLLECTORS)
    for where, _, ref in found:
        assert callable(ref.resolve()), where
    plain = [f"{entry}.{f.name}" for entry in (*BACKENDS.values(), *COLLECTORS.values())
             for f in dataclasses.fields(entry)
             if isinstance(getattr(entry, f.name), str) and re.match(r"^[\w.]+:\w+$", getattr(entry, f.name))]
    assert plain == []


def test_a_reference_that_points_nowhere_is_named():
    from ortlab.engine.refs import Ref, RefError

    with pytest.raises(RefError, match=r"^reference 'ortlab.timing.sources:Nowhere' does not resolve: module "
                                       r"'ortlab.timing.sources' has no 'Nowhere'$"):
        Ref("ortlab.timing.sources:Nowhere").resolve()
    with pytest.raises(RefError, match=r"^reference 'ortlab.nowhere:X' does not resolve: no module 'ortlab.nowhere'$"):
        Ref("ortlab.nowhere:X").resolve()
    with pytest.raises(RefError, match=r"^reference 'ortlab.timing.sources' is not allowed; allowed: "):
        Ref("ortlab.timing.sources")


def test_every_registered_reference_meets_its_contract(mypy_folder, tmp_path):
    """mypy holds every reference of every registry entry to its field's type (the adapter Protocols of
    ortlab.engine.types, the checks' signatures), and the verdict's procedure to ortlab.judging.Verdicts; the stub
    is written from the registries now, so an entry added to them is checked with no other edit. It can fail: a time
    source where a memory account is wanted is named."""
    references = list(_references())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([mypy_folder, str(ROOT)])}
    wrong = next(n for n, (where, _, _) in enumerate(references) if where.endswith(".time_source"))
    for name, extra, fails in (("registries.py", "", False),
                               ("wrong.py", f"expect(BACKENDS['pytorch'].memory.resolve)(_{wrong})", True)):
        stub = tmp_path / name
        stub.write_text(_stub(references, extra))
        done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                               "--cache-dir", str(tmp_path / "cache"), "--no-error-summary", str(stub)],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        if fails:
            assert done.returncode == 1 and 'incompatible type "type[TorchProfiler]"' in done.stdout, done.stdout
        else:
            assert done.returncode == 0 and not done.stdout.strip(), done.stdout[-6000:] + stub.read_text()


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
