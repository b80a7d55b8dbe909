"""The package's layout: the engine's modules import each other without a circle (the plain types and contracts
in a leaf), nothing below the verdict names it, and no module is over 450 lines."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ortlab"
MAX_LINES = 450


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in PACKAGE.rglob("*.py")}


def _imports(name: str, path: Path) -> set[str]:
    """Every ortlab module `name` imports: at the top, inside functions and under TYPE_CHECKING alike (`from
    package import submodule` counts as the submodule)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
            found.update(subs if len(subs) == len(node.names) else [base, *subs])
    out = set()
    for target in found:
        while target and target not in MODULES:
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_engine_has_no_import_circle():
    graph = {name: _imports(name, path) for name, path in MODULES.items()}
    circles = [c for c in _cycles(graph) if any(m.startswith("ortlab.engine") for m in c)]
    assert circles == []
    assert not any(m.startswith("ortlab.engine") for m in graph["ortlab.engine.types"])  # the leaf


def test_nothing_below_the_verdict_names_it():
    """engine/ and compat/ name nothing of ortlab.verdict, neither by an import (at the top, inside a function or
    under TYPE_CHECKING) nor by a "module:function" string in their code: the verdict's evidence reaches the engine
    by reference from above (ortlab.verdict.tasks, Engine.task), its procedure through the leaf ortlab.judging."""
    for name, path in MODULES.items():
        if name.startswith(("ortlab.engine", "ortlab.compat")):
            assert not {m for m in _imports(name, path) if m.startswith("ortlab.verdict")}, name
            strings, _ = _code_strings_and_calls(ast.parse(path.read_text()))
            assert not [s for s in strings if "ortlab.verdict" in s], name
    assert _imports("ortlab.judging", MODULES["ortlab.judging"]) == set()  # a leaf
    evidence = _imports("ortlab.runs.evidence", MODULES["ortlab.runs.evidence"])
    assert evidence == {"ortlab.runs.run", "ortlab.runs.sketch"}
    assert _imports("ortlab.runs.sketch", MODULES["ortlab.runs.sketch"]) == set()  # a leaf: torch only


def test_no_module_is_over_450_lines():
    long = {p.relative_to(ROOT).as_posix(): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}


def _code_strings_and_calls(tree: ast.AST) -> tuple[set[str], set[str]]:
    """The string constants of a module's code (not its docstrings) and the names it calls."""
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
               and id(n) not in docstrings}
    calls = {n.func.id if isinstance(n.func, ast.Name) else n.func.attr for n in ast.walk(tree)
             if isinstance(n, ast.Call) and isinstance(n.func, (ast.Name, ast.Attribute))}
    return strings, calls


def test_ortmodule_is_built_and_its_module_name_spelled_in_the_ort_adapter_only():
    """One home: ORTModule(...) is called in ortlab/_ort.py (new_ortmodule) and ORT's name for the user's module,
    `_original_module`, is written there (ORIGINAL_MODULE). verdict/repro_script.py is exempt: `ortlab repro` copies
    it out as a standalone script that needs only torch and onnxruntime-training."""
    built, spelled = [], []
    exempt = {PACKAGE / "_ort.py", PACKAGE / "verdict" / "repro_script.py"}
    for path in sorted(set(PACKAGE.rglob("*.py")) - exempt):
        strings, calls = _code_strings_and_calls(ast.parse(path.read_text(encoding="utf-8")))
        relative = path.relative_to(ROOT).as_posix()
        if "ORTModule" in calls:
            built.append(relative)
        if any("_original_module" in s and "ORTModule(" not in s for s in strings):
            spelled.append(relative)
    assert built == [] and spelled == []


# The modules outside ortlab/runs/ that parse JSON of files that are not a run's (or of no file): why each may.
NOT_RUN_FILES = {
    "ortlab.verdict.debug_logs": "a DebugMode log or torchtitan dump the user names",
    "ortlab.recompute.observer": "ORT's memory observer's own config file (ORT's, where ORT keeps it)",
    "ortlab.cli.common": "an option's value on the command line (key=JSON)",
    "ortlab.compat.opcheck": "the results a forked child sends through a pipe",
    "ortlab.comparison.cross_stack": "the verdicts another stack's process prints on its stdout",
    "ortlab.activations.table": "the header string stored inside stats.npz, which numpy reads (read_stats)",
}


def _json_reads(path: Path) -> list[int]:
    """The lines where a module calls json.load or json.loads, other than on a DataFrame's own to_json()."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("load", "loads") and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "json"):
            continue
        arg = node.args[0] if node.args else None
        if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute) and arg.func.attr == "to_json":
            continue  # a DataFrame made JSON-ready, no file
        lines.append(node.lineno)
    return lines


def test_run_files_are_read_through_ortlab_runs_only():
    """A run's files are read by Run (ortlab.runs.run) and the leaf ortlab.runs.files; a module elsewhere that
    parses JSON itself reads a file that is not a run's, named with its reason in NOT_RUN_FILES."""
    found = {name: lines for name, path in MODULES.items()
             if not name.startswith("ortlab.runs.") and (lines := _json_reads(path))}
    unexplained = {name: lines for name, lines in found.items() if name not in NOT_RUN_FILES}
    assert not unexplained, ("read run files through ortlab.runs (Run.read_json, ortlab.runs.files), or add the "
                             f"module to NOT_RUN_FILES with the reason: {unexplained}")
    assert set(NOT_RUN_FILES) <= set(found), f"allowed but no longer parsing JSON: {set(NOT_RUN_FILES) - set(found)}"
