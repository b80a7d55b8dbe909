"""The package's shape, kept as docs/architecture.md draws it: a root that holds the public API, packages that say
what lives in them, and packages that import one another downward only, but for the upward imports the page names
with their reasons."""

import ast
import re
from pathlib import Path

from tests.test_layout import _cycles

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ortlab"
MAX_ROOT_MODULES = 20
# root modules that are neither public nor an adapter to a third party's internals, and why they stay at the root
ROOT_INTERNAL = {"judging": "the one typed way from the floors below up to the verdict"}
UPWARD = re.compile(r"^- `(\w+(?:\.py)?/?)` -> `(\w+(?:\.py)?/?)`: \S")


def _room(dotted: str) -> str | None:
    """The top-level room of a module: its package (`engine/`), or the root module itself (`workload.py`)."""
    parts = dotted.split(".")
    if parts[0] != "ortlab" or len(parts) < 2:
        return None
    if (PACKAGE / parts[1]).is_dir():
        return parts[1] + "/"
    return parts[1] + ".py" if (PACKAGE / f"{parts[1]}.py").exists() else None


def _arrows() -> dict[tuple[str, str], set[str]]:
    """(room, room) -> the files whose imports (anywhere in the file, inside functions too) make the arrow."""
    arrows: dict[tuple[str, str], set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[1:] == ("__init__.py",):  # the package's face hands names on; its exports are checked elsewhere
            continue
        module = ".".join(rel.with_suffix("").parts)
        here = _room(module)
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], base]).strip(".")
                targets = [base, *(f"{base}.{a.name}" for a in node.names)]
            else:
                continue
            for target in targets:
                there = _room(target)
                if there and here and there != here:
                    arrows.setdefault((here, there), set()).add(str(rel))
    return arrows


def _loops(edges: set[tuple[str, str]]) -> list[list[str]]:
    """The rooms that import each other, directly or around a loop."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    return _cycles(graph)


def _named_upward() -> set[tuple[str, str]]:
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    return {(m.group(1), m.group(2)) for line in page.splitlines() if (m := UPWARD.match(line))}


def test_packages_import_downward_but_for_the_arrows_the_page_names():
    """Without the upward arrows docs/architecture.md names (each with its reason), the packages form floors: no two
    import each other, directly or around a loop. A new upward import fails here until it is turned round or named;
    a named one that the code no longer has fails too, so the page stays true."""
    arrows = _arrows()
    named = _named_upward()
    assert named, "docs/architecture.md names no upward arrow: its list ('- `engine/` -> `graphs/`: why') is gone"
    stale = sorted(named - set(arrows))
    assert not stale, f"docs/architecture.md names upward arrows the code no longer has: {stale}"
    loops = _loops(set(arrows) - named)
    described = [
        "; ".join(f"{a} -> {b} ({', '.join(sorted(arrows[(a, b)])[:2])})"
                  for (a, b) in sorted(arrows) if a in loop and b in loop and (a, b) not in named)
        for loop in loops]
    assert not loops, "packages that import each other: " + " | ".join(described)


def test_the_root_holds_the_public_api_and_the_adapters():
    """At most 20 modules at the root, each a public name's home (`ortlab.__init__`'s exports and packages), an
    adapter to a third party's internals (`_ort`, `_dynamo`, `_netron`), or named in ROOT_INTERNAL with its reason."""
    import ortlab

    modules = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    assert len(modules) <= MAX_ROOT_MODULES, modules
    homes = {ref.partition(":")[0] for ref in ortlab._EXPORTS.values()}
    public = {m for m in modules if f"ortlab.{m}" in homes or m in ortlab._PACKAGES}
    stray = [m for m in modules if m not in public and not m.startswith("_") and m not in ROOT_INTERNAL]
    assert not stray, f"root modules that are not the public API: {stray}; move them into the package of their concern"


def test_every_package_says_what_lives_in_it():
    """Each package's __init__.py opens with a docstring: a newcomer reads what a folder holds before its files."""
    silent = []
    for init in sorted(PACKAGE.rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        if not doc or len(doc.split()) < 5:
            silent.append(str(init.relative_to(ROOT)))
    assert not silent, f"packages without a docstring that says what lives there: {silent}"
