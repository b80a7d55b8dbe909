"""The two stacks ortlab runs on, named once: `ort` (ORTModule's frozen stack) and `current` (the newest torch,
without ORTModule). bin/_env.sh holds the same table in bash (which Python and lock build which environment);
tests/test_packaging.py checks that the two agree.

ORTModule cannot follow its users: onnxruntime-training 1.19.2, its last release, has wheels for Python 3.8-3.11
and its torch extensions fail to load from torch 2.7 on. So a process either has ORTModule (the ort stack) or the
newest torch (the current stack), never both; what runs where is asked here, without importing torch or ORT."""

from __future__ import annotations

import importlib.metadata
import os
import sys
from dataclasses import dataclass

from ortlab.common.enums import StrEnum


class Stack(StrEnum):
    ORT = "ort"
    CURRENT = "current"


@dataclass(frozen=True)
class StackInfo:
    name: Stack
    pythons: tuple[str, ...]  # the Python versions it is locked for
    locks: dict[str, str]  # Python version -> its lock (what bin/_env.sh installs)
    torch: str  # the torch its locks pin
    runs: str  # what runs there, in words
    required: tuple[str, ...]  # the backends it promises: `ortlab doctor` exits 0 when all of them can run


STACKS: dict[Stack, StackInfo] = {
    Stack.ORT: StackInfo(Stack.ORT, ("3.10", "3.11"),
                         {"3.11": "requirements.lock", "3.10": "requirements-py310.lock"}, "2.6.0",
                         "PyTorch, ORTModule (onnxruntime-training 1.19.2) and torch.compile",
                         ("pytorch", "ortmodule")),
    Stack.CURRENT: StackInfo(Stack.CURRENT, ("3.12", "3.13"),
                             {"3.12": "requirements-current.lock", "3.13": "requirements-current-py313.lock"},
                             "2.14.1", "PyTorch and torch.compile on the newest torch; no ORTModule",
                             ("pytorch", "compile")),
}
ORT_TORCH_MAX = (2, 6)  # ORTModule 1.19.2's extensions fail to load from torch 2.7 on


def _minor() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def this_stack() -> Stack:
    """The stack this process runs: what bin/_env.sh chose (ORTLAB_STACK), else the one its Python belongs to."""
    asked = os.environ.get("ORTLAB_STACK")
    if asked in tuple(Stack):
        return Stack(asked)
    return Stack.ORT if sys.version_info < (3, 12) else Stack.CURRENT


def recorded() -> dict[str, str | None]:
    """The stack this process runs, as a run's meta.json keeps it ("stack"): its name, the interpreter and the lock
    its environment was built from (ORTLAB_LOCK, set by bin/_env.sh; None outside it), so that no reader of the run
    guesses the stack from a version."""
    return {"name": this_stack().value, "python": sys.executable, "lock": os.environ.get("ORTLAB_LOCK")}


def ortmodule_unavailable() -> str | None:
    """Why ORTModule cannot run in this process (None: it can, as far as packages tell; `ortlab doctor` checks
    its built extensions). Read from package metadata: neither torch nor onnxruntime is imported."""
    if sys.version_info >= (3, 12):
        return (f"the current stack: Python {_minor()}, and onnxruntime-training 1.19.2, ORTModule's last release, "
                "has no wheel past 3.11")
    if _version("onnxruntime-training") is None:
        return "onnxruntime-training is not installed in this environment"
    torch = _version("torch")
    if torch and tuple(int(x) for x in torch.split("+")[0].split(".")[:2]) > ORT_TORCH_MAX:
        return f"torch {torch} is too new for onnxruntime-training 1.19.2 (its extensions fail to load from torch 2.7)"
    return None


def ort_stack_hint() -> str:
    """How to run ORTModule from here: the ort stack's Python and the variable that asks for it."""
    return "it runs on the ort stack: ORTLAB_STACK=ort bin/ortlab ..., with a Python 3.11 or 3.10 installed"


def ortmodule_line() -> str | None:
    """One line for a user who asked for ORTModule where it cannot run (None where it can)."""
    why = ortmodule_unavailable()
    return None if why is None else f"ORTModule does not run here ({why}); {ort_stack_hint()}"


def describe() -> str:
    """This process's stack in one line: its name, Python, torch and what runs."""
    stack = STACKS[this_stack()]
    torch = _version("torch") or "not installed"
    return f"{stack.name} (Python {_minor()}, torch {torch}): {stack.runs}"
