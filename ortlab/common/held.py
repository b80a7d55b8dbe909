"""Third-party output held back from a notebook cell: what ORTModule's import and exports print around a model the
user trains in their own kernel (`ortlab.wrap`): torch's "No CUDA runtime is found" on ORT's import, ORT's
symbolic shape inference warnings and its feature banner on every export. None of it is about the user's code, and
a cell full of it hides what is. It is kept, not dropped: in memory until a run records (`ortlab.record`, the
Trainer and Lightning callbacks), then in that run's log.txt, which the Lab's Log tab shows.

Shown where it was printed when asked for: `ORTLAB_SHOW_OUTPUT=1`, or ORT's own log level below WARNING (the
`log_level` option at INFO or VERBOSE asks for ORT's messages). The exporter's warnings about the user's model
(TracerWarning) are never held: they go through Python's warnings, which this module leaves alone.
"""

from __future__ import annotations

import collections
import contextlib
import io
import logging
import os
from collections.abc import Iterator
from pathlib import Path

LOGGERS = ("orttraining", "onnxruntime")  # ORTModule's logger, and ORT's tools (symbolic shape inference)
FORMAT = "%(asctime)s %(name)s [%(levelname)s] - %(message)s"  # the run logs' format (ortlab.common.capture)
KEPT = 5000  # lines held at most before a run takes them (the oldest go first)

_lines: collections.deque[str] = collections.deque(maxlen=KEPT)
_run_log: list[logging.Handler] = []  # the recording run's log handler while one records


def shown() -> bool:
    """Whether third-party output is asked for where it is printed (ORTLAB_SHOW_OUTPUT=1)."""
    return os.environ.get("ORTLAB_SHOW_OUTPUT", "") not in ("", "0")


class _Held(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            _lines.extend(self.format(record).splitlines())
        except Exception:  # a record that cannot be formatted must not break the user's step
            self.handleError(record)


@contextlib.contextmanager
def held(streams: bool = False, show: bool = False) -> Iterator[None]:
    """Keep ORT's loggers (and with `streams`, what Python code prints to sys.stdout and sys.stderr) out of the
    cell: into the recording run's log, else held until a run records. `show` (or ORTLAB_SHOW_OUTPUT=1): nothing is
    held."""
    if show or shown():
        yield
        return
    loggers = [logging.getLogger(name) for name in LOGGERS]
    saved = [lg.propagate for lg in loggers]
    handler = None if _run_log else _Held()
    if handler is not None:
        handler.setFormatter(logging.Formatter(FORMAT))
    for lg in loggers:
        lg.propagate = False  # not to the root logger's stream (ORT's import configures one): to the run's log
        for h in [handler, *_run_log]:
            if h is not None and h not in lg.handlers:
                lg.addHandler(h)
    buffer = io.StringIO()
    redirect = contextlib.ExitStack()
    if streams:
        redirect.enter_context(contextlib.redirect_stdout(buffer))
        redirect.enter_context(contextlib.redirect_stderr(buffer))
    try:
        with redirect:
            yield
    finally:
        for lg, propagate in zip(loggers, saved, strict=True):
            lg.propagate = propagate
            if handler is not None:
                lg.removeHandler(handler)
        if buffer.getvalue():
            _keep(buffer.getvalue().splitlines())


def _keep(lines: list[str]) -> None:
    """Printed output: into the recording run's log, else held."""
    if _run_log and isinstance(_run_log[0], logging.FileHandler):
        stream = _run_log[0].stream
        stream.write("".join(f"{line}\n" for line in lines))
        stream.flush()
    else:
        _lines.extend(lines)


@contextlib.contextmanager
def run_log(path: Path) -> Iterator[logging.Handler]:
    """While a run records: ORT's loggers also write into its log.txt (`path`), what was held before it goes there
    first, and what `held` keeps from then on goes there too."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter(FORMAT))
    if _lines:
        handler.stream.write("[ortlab] held back from the notebook before this run (ORTModule's import and "
                             "exports):\n" + "".join(f"{line}\n" for line in _lines))
        _lines.clear()
    loggers = [logging.getLogger(name) for name in LOGGERS]
    for lg in loggers:
        lg.addHandler(handler)
    _run_log.insert(0, handler)
    try:
        yield handler
    finally:
        _run_log.remove(handler)
        for lg in loggers:
            lg.removeHandler(handler)
        handler.close()


def lines() -> list[str]:
    """What is held now (nothing once a run took it)."""
    return list(_lines)

