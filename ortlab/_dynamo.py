"""The one adapter to torch.compile's internals: dynamo's logs (graph breaks, recompiles), its compile-time
metrics, inductor's generated code, and the reset between settings. Nothing else in ortlab names them, so that
a torch upgrade touches this file only; what moved is named by `DynamoInternalsError`."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

from ortlab.errors import OrtlabError

# torch 2.6: "Graph break in user code at F:L\nReason: Unsupported: ..."; torch 2.7+: "Graph break (user stack
# suppressed ...) in user code at F:L\nGraph Break Reason: Encountered graph break when ...:\n\n<what>\n
#   Explanation: ..."
_BREAK = re.compile(r"Graph break(?: \([^)]*\))? in user code at (?P<file>.+?):(?P<line>\d+)\s*\n"
                    r"(?:Graph Break )?Reason: (?P<reason>.+?)(?:\n|$)", re.S)
_EXPLAINED = re.compile(r"\n\n(?P<what>[^\n]+)\n\s+Explanation: (?P<why>[^\n]+)")
_RECOMPILE = re.compile(r"Recompiling function (?P<function>\S+) in (?P<file>.+?):(?P<line>\d+)")
_OUTPUT_CODE = re.compile(r"Output code written to: (?P<path>\S+)")
# compile-time metrics whose entries add up to the time spent compiling (forward: dynamo, AOT and inductor;
# backward: inductor's backward compile, which runs at the first backward)
_COMPILE_METRICS = ("_compile.compile_inner", "compile_fx.<locals>.bw_compiler")


class DynamoInternalsError(OrtlabError, RuntimeError):
    """torch.compile's internals are not where ortlab expects them (another torch version)."""


def compile_seconds() -> float:
    """Seconds spent compiling in this process so far (dynamo's own accounting)."""
    try:
        from torch._dynamo.utils import compilation_time_metrics
    except ImportError as e:
        raise DynamoInternalsError(f"torch._dynamo.utils.compilation_time_metrics is gone: {e}") from None
    return float(sum(sum(compilation_time_metrics.get(name, ())) for name in _COMPILE_METRICS))


def reset() -> None:
    """Forget every compiled graph (another burst with other settings compiles anew)."""
    import torch

    torch._dynamo.reset()


def bisect(agrees: Any) -> dict[str, Any] | None:
    """torch._inductor's CompilerBisector run on `agrees` (compiles with inductor and says whether the result is
    right): which backend, subsystem and application of it first make it wrong, as plain data; None when every
    backend agrees (the difference is not the compiler's) or the bisector is not there."""
    try:
        from torch._inductor.compiler_bisector import CompilerBisector
    except ImportError:
        return None
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # it prints each step it takes: the finding is what it returns
        found = CompilerBisector.do_bisect(agrees)
    if found is None:
        return None
    return {"backend": found.backend, "subsystem": found.subsystem, "application": found.bisect_number,
            "detail": found.debug_info}


def compiled_inner(model: Any) -> Any:
    """The module inside a torch.compile'd module (None when `model` is not one)."""
    try:
        from torch._dynamo.eval_frame import OptimizedModule
    except ImportError:
        return None
    return model._orig_mod if isinstance(model, OptimizedModule) else None


def unique_graphs() -> int | None:
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return None
    return int(counters["stats"].get("unique_graphs", 0))


def break_reason(text: str, first: str = "") -> str:
    """A graph break's reason in one line: torch 2.7+ says what failed and explains it on later lines ("Failed to
    trace builtin operator" / "Explanation: Dynamo does not know how to trace builtin operator `print` ..."), torch
    2.6 on its first line."""
    if (m := _EXPLAINED.search(text)) is not None:
        return f"{m['what'].strip()}: {m['why'].strip()}"
    return first.strip() or (text.strip().splitlines() or [""])[0]


@dataclass
class Observed:
    """What dynamo and inductor said during a burst, by step."""

    graph_breaks: list[dict[str, Any]] = field(default_factory=list)
    recompiles: list[dict[str, Any]] = field(default_factory=list)
    code_files: list[str] = field(default_factory=list)


class Observer(logging.Handler):
    """While open: dynamo's graph-break and recompile logs and inductor's output-code log, read as data (the
    step they happened in is `step`, set by the backend). Logs are switched back to torch's defaults after."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.step: int | None = None
        self.observed = Observed()
        self._loggers = [logging.getLogger(n) for n in ("torch._dynamo", "torch._inductor")]

    def __enter__(self) -> Observer:
        import torch

        torch._logging.set_logs(graph_breaks=True, recompiles=True, output_code=True)
        for lg in self._loggers:
            lg.addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        import torch

        for lg in self._loggers:
            lg.removeHandler(self)
        torch._logging.set_logs()

    def emit(self, record: logging.LogRecord) -> None:
        if self.step is None:
            return
        try:
            text = record.getMessage()
        except Exception:  # a record that cannot format is no graph break
            return
        if (m := _BREAK.search(text)) is not None:
            self.observed.graph_breaks.append({"step": self.step, "file": m["file"], "line": int(m["line"]),
                                               "reason": break_reason(text, m["reason"])})
        elif (m := _RECOMPILE.search(text)) is not None:
            reasons = [line.strip()[2:].strip() for line in text.splitlines()[2:] if line.strip().startswith("- ")]
            self.observed.recompiles.append({"step": self.step, "function": m["function"], "file": m["file"],
                                             "line": int(m["line"]), "reasons": reasons})
        elif (m := _OUTPUT_CODE.search(text)) is not None:
            self.observed.code_files.append(m["path"])
