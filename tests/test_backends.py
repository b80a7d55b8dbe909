"""The backend seam: what a backend is lives in ortlab.engine.backends (the registry and one module each), no
code outside engine/backends/ decides by a backend's name, and a fourth backend is one module and one registry
line."""

import ast
import json
from pathlib import Path

import pytest

from ortlab import BurstError
from ortlab.engine.backends import BACKENDS, BackendName, Registered, has, registered
from ortlab.engine.refs import Ref

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ortlab"


def _names_compared(tree: ast.AST, lookups: bool = True) -> list[tuple[int, str]]:
    """Comparisons of something with a backend's name (`x == "ortmodule"`, `b in ("pytorch", ...)`), and with
    `lookups` a lookup by one (`d.get("ortmodule")`, `d["pytorch"]`) or a dict keyed by one."""
    names = set(BACKENDS)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]  # a name itself, or one of a tuple/list/set of them
            items = [e for o in operands for e in (o.elts if isinstance(o, (ast.Tuple, ast.List, ast.Set)) else [o])]
            constants = [c.value for c in items if isinstance(c, ast.Constant) and isinstance(c.value, str)]
            if names & set(constants):
                out.append((node.lineno, ast.unparse(node)))
        keys: list[ast.AST] = []  # what a lookup or a dict is keyed by
        if not lookups:
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("get", "setdefault", "pop") and node.args:
            keys = [node.args[0]]
        elif isinstance(node, ast.Subscript):
            keys = [node.slice]
        elif isinstance(node, ast.Dict):
            keys = [k for k in node.keys if k is not None]
        if any(isinstance(k, ast.Constant) and k.value in names for k in keys):
            out.append((node.lineno, ast.unparse(node)))
    return out


# (module, statement) that may use a backend's name as a key: formats on disk and in the CLI's JSON, where "pytorch"
# names PyTorch fp32's column (a localization's rows, kept in verdict.json and reused; `ortlab judge --json`'s folders)
ALLOWED: set[tuple[str, str]] = {
    ("ortlab/verdict/localize.py", 'if worst["pytorch"] == 0:'),
    ("ortlab/verdict/localize.py", 'return {"tensor": name, "candidate": math.nan, "pytorch": math.nan, "allowed": '
                                   'math.nan, "norm": math.nan,'),
    ("ortlab/verdict/localize.py", 'return {"tensor": name, "candidate": j.candidate, "pytorch": j.pytorch, '
                                   '"allowed": j.allowed, "norm": j.norm,'),
    # the repro script: a file a user keeps, run without ortlab, so without its registry (CASE says which backend)
    ("ortlab/verdict/repro_script.py", 'WHO = {"ortmodule": "ORT", "compile": "torch.compile"}'),
    ("ortlab/verdict/repro_script.py", 'if backend == "ortmodule":'),
    ("ortlab/verdict/repro_script.py", 'elif backend == "compile":'),
    ("ortlab/verdict/repro_script.py", 'settings = dict(CASE.get("compile") or {})'),
    ("ortlab/verdict/folders.py", 'return {"pytorch": str(self.pytorch.path), "other": str(self.other.path), '
                                  '"backend": self.other.backend,'),
    ("ortlab/verdict/folders.py", '"torch": {"pytorch": _torch(self.pytorch), "other": _torch(self.other)},'),
}


def test_no_code_outside_the_backends_decides_by_a_backends_name():
    """Nor looks a run or a figure up by a backend's name: the registry says which backend is the reference
    (REFERENCE) and which has what (has)."""
    assert len(_names_compared(ast.parse('x = d.get("ortmodule"), d["pytorch"], {"compile": 1}'))) == 3
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith("ortlab/engine/backends/"):
            continue
        tree = ast.parse(path.read_text())
        for line, text in _names_compared(tree):
            statement = path.read_text().splitlines()[line - 1].strip()
            if (relative, statement) not in ALLOWED:
                found.append(f"{relative}:{line}: {text}")
    assert found == []


def test_no_collector_reaches_into_the_backend_it_serves():
    """What a collector reads of ORT's wrap goes through the contract (`ort_internals`, `graph_input_shapes`),
    never `engine.current.wrapper`: a backend's insides stay its own."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "wrapper" and \
                    isinstance(node.value, ast.Attribute) and node.value.attr == "current":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_the_registry_is_data_and_its_names_a_closed_set():
    assert [str(b) for b in BackendName] == list(BACKENDS) == ["pytorch", "ortmodule", "compile"]
    assert has("pytorch", "reference") and has("ortmodule", "onnx_stages") and not has("compile", "onnx_stages")
    assert not has("an old run's backend", "reference")
    from ortlab.engine.backends import ALIASES, aliased, parse_backends, unavailable

    assert aliased("both") == ("pytorch", "ortmodule") and aliased("pytorch") is None
    assert set(ALIASES) == {"both", "all"}
    assert parse_backends("all") == tuple(n for n in BACKENDS if unavailable(n) is None) == aliased("all")
    with pytest.raises(BurstError, match=r"^backend 'jit' is not allowed; allowed: pytorch, ortmodule, compile$"):
        registered("jit")


def test_a_mistyped_backend_name_gets_a_suggestion(capsys):
    from ortlab.cli import main
    from ortlab.engine.backends import parse_backends

    with pytest.raises(BurstError, match=r"^backend 'ortmdule' is not allowed; allowed: .*; did you mean ortmodule\?$"):
        parse_backends("ortmdule")
    with pytest.raises(BurstError, match=r"; did you mean compile\?$"):
        registered("compiel")
    from ortlab.engine.config import BurstConfig

    with pytest.raises(BurstError, match=r"^collector 'stat' is not known; known: .*; did you mean stats\?$"):
        BurstConfig(collect={"stat": {}})
    with pytest.raises(SystemExit) as e:
        main(["burst", "--backend", "pytorch,ortmdule", "--steps", "1"])
    line = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in line, line
    assert line.startswith("ortlab burst: argument --backend: backend 'ortmdule' is not allowed") and \
        "did you mean ortmodule?" in line, line


def test_every_registered_backend_keeps_the_contract():
    import torch

    from ortlab.engine.backends import make
    from ortlab.engine.types import Backend

    for name in BACKENDS:
        backend = make(name, torch.nn.Linear(2, 2))
        assert isinstance(backend, Backend) and backend.name == name


@pytest.mark.ort
def test_a_collector_refuses_a_backend_it_does_not_serve():
    from ortlab.engine import BurstConfig

    with pytest.raises(BurstError, match=r"^collector 'plans' is not allowed on backend 'compile' \(it reads ORT's "
                       r"recompute plans\); allowed on: ortmodule$"):
        BurstConfig(backend="compile", collect={"plans": {}})
    assert BurstConfig(backend="ortmodule", collect={"plans": {}}).collect == {"plans": {}}


ADAPTER_CLASSES = {"TorchProfiler", "TorchProfilerFused", "OrtProfiler", "Account", "Autograd", "AutogradRunner",
                   "Graph", "Hooks", "GraphTaps", "CompiledHooks"}
ADAPTER_MODULES = {"ortlab/timing/sources.py", "ortlab/account/sources.py", "ortlab/activations/taps.py"}


def _kinds_asked(tree: ast.AST) -> list[tuple[int, str]]:
    """What asks a backend's kind instead of its adapter: a comparison with a member of the old kinds' enums
    (`TimeSource.ORT_PROFILER`), with an entry's adapter field (`registered(b).memory == ...`) or with an adapter
    class, and isinstance/issubclass against an adapter class."""
    fields = {"time_source", "memory", "stats_taps"}

    def kind(node: ast.AST) -> bool:
        if isinstance(node, ast.Attribute):
            base = node.value
            return (isinstance(base, ast.Name) and base.id in {"TimeSource", "MemoryAccount", "StatsTaps"}) or \
                (node.attr in fields and isinstance(base, ast.Call)) or node.attr in ADAPTER_CLASSES
        return isinstance(node, ast.Name) and node.id in ADAPTER_CLASSES

    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            items = [e for o in operands for e in (o.elts if isinstance(o, (ast.Tuple, ast.List, ast.Set)) else [o])]
            if any(kind(i) for i in items):
                out.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in {"isinstance", "issubclass"} and len(node.args) == 2:
            second = node.args[1]
            if any(kind(i) for i in (second.elts if isinstance(second, ast.Tuple) else [second])):
                out.append((node.lineno, ast.unparse(node)))
    return out


def test_no_collector_branches_on_the_kind_of_backend_it_serves():
    """Where a backend's time comes from, what its memory account is and how its statistics are tapped are the
    adapters its registry entry names (Registered.adapter): a collector calls them and never asks which it got."""
    assert _kinds_asked(ast.parse("if registered(b).memory is MemoryAccount.GRAPH: pass\n"
                                  "x = isinstance(s, OrtProfiler) or taps == sources.GraphTaps")) != []
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith("ortlab/engine/backends/") or relative in ADAPTER_MODULES:
            continue
        found += [f"{relative}:{line}: {text}" for line, text in _kinds_asked(ast.parse(path.read_text()))]
    assert found == []


def test_every_backend_declares_an_adapter_of_each_kind():
    from ortlab.account.sources import Account
    from ortlab.activations.taps import Hooks
    from ortlab.engine.backends import ADAPTERS
    from ortlab.timing.sources import TimeSource

    bases = {"time_source": TimeSource, "memory": Account, "stats_taps": Hooks}
    assert set(bases) == set(ADAPTERS)
    for entry in BACKENDS.values():
        for concern, base in bases.items():
            assert issubclass(entry.adapter(concern), base), (entry.name, concern)
    assert registered("ortmodule").adapter("memory").saves_graphs and \
        not registered("pytorch").adapter("memory").saves_graphs
    with pytest.raises(BurstError, match=r"^adapter 'time_sorce' is not known; known: time_source, memory, stats_taps; "
                       r"did you mean time_source\?$"):
        registered("pytorch").adapter("time_sorce")


@pytest.fixture
def toy(monkeypatch):
    """The fourth backend's one registry line, with the adapters it declares."""
    monkeypatch.setitem(BACKENDS, "toy", Registered(
        "toy", Ref("tests.factories.toy_backend:Toy"), "toy", time_source=Ref("tests.factories.toy_backend:ToyTime"),
        memory=Ref("tests.factories.toy_backend:ToyAccount"), stats_taps=Ref("tests.factories.toy_backend:ToyTaps")))
    return "toy"


def test_a_fourth_backend_is_one_module_and_one_registry_line(toy, tmp_path, capsys):
    from ortlab import Session
    from ortlab.activations import read_stats
    from ortlab.cli import main
    from ortlab.timing.table import time
    from tests.factories.toy_backend import ToyTaps

    collect = {"time": {"steps": [1]}, "memory": {}}
    hooked = []
    with Session(out=tmp_path, in_process=True) as s:  # the demo
        pt = s.burst("pytorch", 3, parity=True, collect=collect, progress=False)
        calls = ToyTaps.calls
        run = s.burst(toy, 3, parity=True, collect={**collect, "stats": {"steps": [1, 2]}}, progress=False,
                      on_step=lambda row: hooked.append(any(m._forward_hooks for m in s._engine.model.modules())))
        verdict = s.judge(pt, run)
    assert run.ok and run.backend == toy and len(run.metrics) == 3
    # its memory account: autograd's, taken after the burst
    assert run.memory["kind"] == "autograd" and run.memory["note"] == "the toy's account, taken after the burst"
    assert run.memory["saved_bytes"] > 0
    tables = time(pt, run)  # its time source: torch.profiler, a range per module
    assert tables.labels == ["pytorch", toy] and len(tables.difference) > 0
    assert json.loads((run.path / "time.json").read_text())["tool"] == "the toy's torch.profiler"
    assert main(["time", str(pt.path), str(run.path)]) == 0 and toy in capsys.readouterr().out
    # its statistics taps: hooks through its own wrapper, attached for the whole burst, rows of step 1 only
    assert ToyTaps.calls > calls and hooked == [True, True, True]
    assert sorted(set(read_stats(run)["step"])) == [1]
    assert verdict.status == "agree", verdict.to_dict()  # eager against eager, first-step gradients included
    assert json.loads((run.path / "verdict.json").read_text())["gradients"]["agree"] is True
