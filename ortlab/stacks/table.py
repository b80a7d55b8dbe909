"""The two stacks ortlab runs on, named once: `ort` (ORTModule's frozen stack) and `current` (the newest torch,
without ORTModule). The table is data, stacks.txt beside this module, read here (STACKS) and by bin/_env.sh in plain
bash (which Python and lock build which environment), so the two cannot disagree.

ORTModule cannot follow its users: onnxruntime-training 1.19.2, its last release, has wheels for Python 3.8-3.11
and its torch extensions fail to load from torch 2.7 on. So a process either has ORTModule (the ort stack) or the
newest torch (the current stack), never both; what runs where is asked here, without importing torch or ORT."""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import os
import sys
from dataclasses import dataclass

from ortlab.common.enums import StrEnum
from ortlab.errors import InputError, OrtlabError, did_you_mean


class Stack(StrEnum):
    ORT = "ort"
    CURRENT = "current"


TABLE = "stacks.txt"  # in this package (shipped in the wheel): the table bin/_env.sh reads too


class StackTableError(OrtlabError, ValueError):
    """The stacks' table is malformed (a row of no known shape, a stack ortlab does not know): file, line, why."""


@dataclass(frozen=True)
class StackInfo:
    name: Stack
    pythons: tuple[str, ...]  # the Python versions it is locked for, oldest first
    locks: dict[str, str]  # Python version -> its lock (what bin/_env.sh installs), in the order bin/_env.sh tries them
    torches: dict[str, str]  # Python version -> the torch its lock pins
    backends: tuple[str, ...]  # the backends that run on it
    required: tuple[str, ...]  # the backends it promises: `ortlab doctor` exits 0 when all of them can run
    runs: str  # what runs there, in words

    @property
    def torch(self) -> str:
        """The torch of its first Python's lock (the stack's own; what its headers name)."""
        return self.torches[next(iter(self.locks))]


def _version_key(python: str) -> tuple[int, ...]:
    return tuple(int(p) for p in python.split(".") if p.isdigit())


def read(text: str, source: str = TABLE) -> dict[Stack, StackInfo]:
    """The stacks a table's text describes ('python STACK MINOR LOCK TORCH' and 'stack NAME RUNS PROMISED WORDS'
    rows); StackTableError in one line naming the file and the row for anything else."""
    pythons: dict[str, dict[str, tuple[str, str]]] = {}
    stacks: dict[str, tuple[tuple[str, ...], tuple[str, ...], str]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if fields[0] == "python" and len(fields) == 5 and fields[2] not in pythons.get(fields[1], {}):
            pythons.setdefault(fields[1], {})[fields[2]] = (fields[3], fields[4])
        elif fields[0] == "stack" and len(fields) >= 5 and fields[1] not in stacks:
            stacks[fields[1]] = (tuple(fields[2].split(",")), tuple(fields[3].split(",")), line.split(None, 4)[4])
        else:
            raise StackTableError(f"{source} line {number}: {line.strip()!r} is not a row (or names its Python or "
                                  "stack twice); allowed: 'python STACK MINOR LOCK TORCH', 'stack NAME RUNS PROMISED "
                                  "WORDS'")
    known = [str(s) for s in Stack]
    named = list(dict.fromkeys([*pythons, *stacks]))  # in the table's order: the order bin/_env.sh tries them
    if sorted(named) != sorted(known) or set(pythons) != set(stacks):
        raise StackTableError(f"{source} names the stacks {', '.join(named) or 'none'} (python rows: "
                              f"{', '.join(pythons) or 'none'}; stack rows: {', '.join(stacks) or 'none'}); ortlab "
                              f"knows {', '.join(known)}, each with python rows and one stack row")
    out = {}
    for name in named:
        rows, (backends, required, words) = pythons[name], stacks[name]
        out[Stack(name)] = StackInfo(Stack(name), tuple(sorted(rows, key=_version_key)),
                                     {p: lock for p, (lock, _) in rows.items()},
                                     {p: torch for p, (_, torch) in rows.items()}, backends, required, words)
    return out


def _table_text() -> str:
    return importlib.resources.files(__package__ or "ortlab.stacks").joinpath(TABLE).read_text(encoding="utf-8")


STACKS: dict[Stack, StackInfo] = read(_table_text())
ORT_TORCH_MAX = (2, 6)  # ORTModule 1.19.2's extensions fail to load from torch 2.7 on


class StackError(InputError):
    """A stack asked for that is not one, or whose environment cannot be built here: the line says why."""


def parse_stack(name: str) -> Stack:
    """A stack name ("ort", "current"), or StackError naming the stacks, with a suggestion."""
    if name in tuple(Stack):
        return Stack(name)
    allowed = [str(s) for s in Stack]
    shown = ", ".join(f"{s} (torch {STACKS[Stack(s)].torch})" for s in allowed)
    raise StackError(f"stack {name!r} is not one; allowed: {shown}{did_you_mean(name, allowed)}")


def running(backend: str) -> tuple[Stack, ...]:
    """The stacks whose table says `backend` runs there (none for a backend the table does not name)."""
    return tuple(s.name for s in STACKS.values() if backend in s.backends)


def stack_of(python: str) -> Stack | None:
    """The stack a Python version ("3.12" or "3.12.1") is locked for, the first the table names it under (None: it
    names it under none)."""
    minor = ".".join(python.split(".")[:2])
    return next((s.name for s in STACKS.values() if minor in s.locks), None)


def _minor() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def this_stack() -> Stack:
    """The stack this process runs: what bin/_env.sh chose (ORTLAB_STACK), else the one the table locks its Python
    for (a Python it does not name: the stack of the nearest one it does)."""
    asked = os.environ.get("ORTLAB_STACK")
    if asked in tuple(Stack):
        return Stack(asked)
    found = stack_of(_minor())
    if found is not None:
        return found
    here = _version_key(_minor())
    nearest = min((abs(_version_key(p)[1] - here[1]), p) for s in STACKS.values() for p in s.pythons)[1]
    return stack_of(nearest) or Stack.ORT


def recorded() -> dict[str, str | None]:
    """The stack this process runs, as a run's meta.json keeps it ("stack"): its name, the interpreter and the lock
    its environment was built from (ORTLAB_LOCK, set by bin/_env.sh; None outside it), so that no reader of the run
    guesses the stack from a version."""
    return {"name": this_stack().value, "python": sys.executable, "lock": os.environ.get("ORTLAB_LOCK")}


def pythons_running(backend: str) -> list[str]:
    """The Pythons of the stacks that run `backend`, in the order bin/_env.sh tries them."""
    return [p for s in running(backend) for p in STACKS[s].locks]


def ortmodule_unavailable() -> str | None:
    """Why ORTModule cannot run in this process (None: it can, as far as packages tell; `ortlab doctor` checks
    its built extensions). Read from package metadata: neither torch nor onnxruntime is imported."""
    pythons = pythons_running("ortmodule")
    if _minor() not in pythons:
        newest = max(pythons, key=_version_key)
        return (f"the {this_stack()} stack: Python {_minor()}, and onnxruntime-training 1.19.2, ORTModule's last "
                f"release, has no wheel past {newest}")
    if _version("onnxruntime-training") is None:
        return "onnxruntime-training is not installed in this environment"
    torch = _version("torch")
    if torch and tuple(int(x) for x in torch.split("+")[0].split(".")[:2]) > ORT_TORCH_MAX:
        return f"torch {torch} is too new for onnxruntime-training 1.19.2 (its extensions fail to load from torch 2.7)"
    return None


def ort_stack_hint() -> str:
    """How to run ORTModule from here: the ort stack's Python and the variable that asks for it."""
    stack = running("ortmodule")[0]
    return (f"it runs on the {stack} stack: ORTLAB_STACK={stack} bin/ortlab ..., with a Python "
            f"{' or '.join(STACKS[stack].locks)} installed")


def ortmodule_line() -> str | None:
    """One line for a user who asked for ORTModule where it cannot run (None where it can)."""
    why = ortmodule_unavailable()
    return None if why is None else f"ORTModule does not run here ({why}); {ort_stack_hint()}"


def describe() -> str:
    """This process's stack in one line: its name, Python, torch and what runs."""
    stack = STACKS[this_stack()]
    torch = _version("torch") or "not installed"
    return f"{stack.name} (Python {_minor()}, torch {torch}): {stack.runs}"
