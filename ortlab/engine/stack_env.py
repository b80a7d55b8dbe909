"""Another stack's interpreter and environment, for a worker that runs a backend there (ORTModule on the ort stack
while this process runs the newest torch, or torch.compile on the current stack from the ort stack).

A process holds one torch: ORTModule needs torch 2.6 (Python <= 3.11), the newest torch needs Python >= 3.12. So a
worker for the other stack is started with that stack's Python and environment, built or reused by the same code
as bin/ortlab (bin/_env.sh: a virtual environment per lock and Python under ~/.cache/ortlab) and read back from a
bash that sourced it: its python, PYTHONPATH (this checkout first), ORTLAB_STACK, ORTLAB_LOCK, LD_LIBRARY_PATH and
the side folders. Asked once per stack per process; a build (minutes, once per machine) shows bin/_env.sh's own
progress on stderr.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ortlab.stacks.table import STACKS, Stack, StackError, parse_stack, this_stack

ROOT = Path(__file__).resolve().parents[2]  # the checkout whose bin/_env.sh builds the environments
ENV_SCRIPT = ROOT / "bin" / "_env.sh"
FINDER_SCRIPT = ROOT / "bin" / "_stacks.sh"  # the stacks' table read in bash, and the Python finder it drives
# what the parent's environment must not hand to the other stack's bash: its own Python, venv and path
_NOT_INHERITED = ("ORTLAB_PYTHON", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "ORTLAB_LOCK", "ORTLAB_SIDE_PACKAGES",
                  "ORTLAB_ZOO_PACKAGES")
_known: dict[Stack, StackEnv] = {}
_probed: dict[Stack, str | None] = {}  # ready()'s answers
# StackError and parse_stack are the stacks' table's (ortlab.stacks.table), named here too for this module's callers
__all__ = ["StackEnv", "StackError", "environment", "parse_stack", "ready", "worker_interpreter"]


@dataclass(frozen=True)
class StackEnv:
    """A stack's Python and the environment variables its workers start with."""

    stack: Stack
    python: str
    env: dict[str, str]

    @property
    def torch(self) -> str:
        """The torch its lock pins (what its runs record; the table's headers read the runs' own)."""
        return STACKS[self.stack].torch


def environment(stack: Stack | str) -> StackEnv:
    """The environment of `stack`, built by bin/_env.sh when missing (its progress on stderr), once per process.
    StackError in one line when it cannot be built here (no Python for it, a failed install)."""
    stack = parse_stack(str(stack))
    if stack not in _known:
        _known[stack] = _sourced(stack)
    return _known[stack]


def _sourced(stack: Stack) -> StackEnv:
    base = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
    base["ORTLAB_STACK"] = str(stack)
    if stack == this_stack() and os.environ.get("ORTLAB_PYTHON"):  # another stack's: bin/_env.sh finds its own
        base["ORTLAB_PYTHON"] = os.environ["ORTLAB_PYTHON"]
    # bin/_env.sh writes its progress to stderr (shown as it comes); the environment, NUL-separated, to stdout
    script = 'source "$1" >&2 && env -0'
    proc = subprocess.Popen(["bash", "-c", script, "bash", str(ENV_SCRIPT)], env=base, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    said: list[str] = []
    building = False
    assert proc.stderr is not None and proc.stdout is not None
    for raw in proc.stderr:  # bin/_env.sh's notes are kept for an error; once it builds, each line is progress
        line = raw.decode(errors="replace").rstrip()
        said.append(line)
        if not building and ("building" in line or "installing" in line):
            building = True
            print(f"ortlab: workers on the {stack} stack need its environment (bin/_env.sh); building it now, "
                  "once per machine", file=sys.stderr, flush=True)
        if building:
            print(line, file=sys.stderr, flush=True)
    out = proc.stdout.read()
    if proc.wait() != 0:
        why = next((s for s in reversed(said) if s.strip()), f"bin/_env.sh exited {proc.returncode}")
        raise StackError(f"the {stack} stack's environment cannot be built here: {why.removeprefix('ortlab: ')}")
    env = dict(item.split("=", 1) for item in out.decode(errors="replace").split("\0") if "=" in item)
    python = str(Path(env["VIRTUAL_ENV"]) / "bin" / "python")
    return StackEnv(stack, python, env)


def worker_interpreter(stack: Stack | str | None) -> tuple[str, dict[str, str] | None]:
    """The Python a worker of `stack` starts with, and its environment (None: this process's own, for this stack
    or no stack asked)."""
    if stack is None or Stack(str(stack)) == this_stack():
        return sys.executable, None
    found = environment(stack)
    return found.python, dict(found.env)


def ready(stack: Stack | str) -> str | None:
    """Why `stack`'s workers cannot start from here, without building anything (None: its environment exists or
    this process is on it; a missing one is built on first use). For a chooser that offers the stacks."""
    stack = parse_stack(str(stack))
    if stack == this_stack() or stack in _known:
        return None
    if stack not in _probed:  # its Python, found once per process (each candidate's start costs a fraction of a second)
        _probed[stack] = _probe(stack)
    return _probed[stack]


def _probe(stack: Stack) -> str | None:
    # not bin/_env.sh (that would build it): only its Python finder, bin/_stacks.sh, which the stacks' table drives
    probe = 'source "$1" && _ortlab_python >/dev/null'
    base = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED} | {"ORTLAB_STACK": str(stack)}
    done = subprocess.run(["bash", "-c", probe, "bash", str(FINDER_SCRIPT)], env=base, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or [f"no Python for the {stack} stack"])[-1].removeprefix("ortlab: ")
    return None
