"""Capture everything a burst prints (C-level file descriptors, Python streams, ORT's logger) into the run log,
and read ORT's feature banner back as data."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_FEATURE_ROW = re.compile(r"^(?P<feature>\s?-?\s?[A-Za-z][\w /]*?)\s+:\s+(?P<state>ON|OFF)\s+:\s+(?P<note>.*?)\s*$")
_LOG_FORMAT = "%(asctime)s %(name)s [%(levelname)s] - %(message)s"


@contextlib.contextmanager
def captured_output(path: Path) -> Iterator[None]:
    """Send file descriptors 1 and 2, `sys.stdout`/`sys.stderr` and ORT's Python logger to `path` (appending).

    File-descriptor level because ORT and the torch exporter print from C++; restored on any exit.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    log_file = open(path, "a", buffering=1, encoding="utf-8", errors="replace")  # noqa: SIM115
    saved_fds = []
    for fd in (1, 2):
        try:
            saved_fds.append((fd, os.dup(fd)))
            os.dup2(log_file.fileno(), fd)
        except OSError:
            pass  # no such descriptor (embedded interpreters); Python-level capture still works
    saved_streams = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = log_file
    handler = logging.StreamHandler(log_file)
    handler.setFormatter(logging.Formatter(_LOG_FORMAT))
    ort_logger = logging.getLogger("orttraining")
    saved_propagate = ort_logger.propagate
    ort_logger.addHandler(handler)
    ort_logger.propagate = False
    try:
        yield
    finally:
        ort_logger.removeHandler(handler)
        ort_logger.propagate = saved_propagate
        sys.stdout, sys.stderr = saved_streams
        log_file.flush()
        for fd, saved in saved_fds:
            os.dup2(saved, fd)
            os.close(saved)
        log_file.close()


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def parse_feature_table(log_text: str) -> list[dict[str, str | bool]]:
    """ORT's "features ON/OFF" banner (logged at WARNING on the first export) as rows of feature, on, note."""
    text = strip_ansi(log_text)
    start = text.rfind("ORTModule is enabled with following features ON/OFF")
    if start < 0:
        return []
    rows = []
    for line in text[start:].splitlines()[1:]:
        if line.startswith("Total ORT initialization overhead"):
            break
        m = _FEATURE_ROW.match(line)
        if m:
            feature = m["feature"].strip()
            rows.append({"feature": feature, "on": m["state"] == "ON", "note": m["note"].strip()})
    return rows


_LEVEL = re.compile(r"\[(VERBOSE|DEBUG|INFO|WARNING|ERROR|CRITICAL|FATAL)\]")


def log_records(log_text: str) -> list[dict[str, str]]:
    """Split a run log into records (level, source, text) for filtering; continuation lines join the record above."""
    records: list[dict[str, str]] = []
    for line in strip_ansi(log_text).splitlines():
        m = _LEVEL.search(line[:120])
        if m or not records:
            source = ("ortmodule" if "orttraining" in line[:80] else "ortlab" if line.startswith("[ortlab]")
                      else "output")
            records.append({"level": m[1] if m else "OUTPUT", "source": source, "text": line})
        else:
            records[-1]["text"] += "\n" + line
    return records
