"""Reading a run folder's files, one way for all of ortlab: JSON whole (a damaged file named, or passed over where
the reader can do without it), JSON lines as a burst appends them (complete lines only), a folder's meta.json,
and the runs of a folder still being written. Nothing read is executed. `Run` (run.py) reads through here, and so
does every module that reads a run's file without a Run."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ortlab.errors import InputError

META = "meta.json"
METRICS = "metrics.jsonl"


class RunError(InputError):
    """A folder that is not an ortlab run, or a run file that cannot be read."""


def read_json(path: str | Path, default: Any = None, strict: bool = True) -> Any:
    """A JSON file of a run; `default` when it is not there. Damaged: RunError naming it, or `default` when not
    `strict` (a reader that can do without it)."""
    path = Path(path)
    if not path.is_file():
        return default
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        if not strict:
            return default
        raise RunError(f"{path}: not valid JSON ({e})") from None


def text(path: str | Path) -> str:
    """A run's text file (log.txt, torch.compile's generated code), undecodable bytes replaced; "" when it is not
    there or cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def meta(folder: str | Path) -> dict[str, Any]:
    """A folder's meta.json as a dict; {} when it has none or it is damaged (a reader that only looks)."""
    data = read_json(Path(folder) / META, {}, strict=False)
    return data if isinstance(data, dict) else {}


_DAMAGED = object()  # a line that is not JSON


def _parsed(text: str):
    """Each non-blank line's number and its JSON value (_DAMAGED when it is not JSON)."""
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError:
                yield number, _DAMAGED


def rows(text: str, until_damaged: bool = False) -> tuple[list[Any], list[int]]:
    """The JSON values of a text's lines (blank lines skipped) and the numbers of the lines that are not JSON;
    `until_damaged`: stop at the first such line (a file being written: its last line may be half of one)."""
    out, damaged = [], []
    for number, value in _parsed(text):
        if value is not _DAMAGED:
            out.append(value)
        elif until_damaged:
            break
        else:
            damaged.append(number)
    return out, damaged


def step_rows(text: str) -> tuple[list[dict[str, Any]], list[int]]:
    """metrics.jsonl's step rows (a step and its loss) and the numbers of the lines that are not one (damaged:
    skipped, the later steps kept)."""
    out, damaged = [], []
    for number, value in _parsed(text):
        if isinstance(value, dict) and "step" in value and "loss" in value:
            out.append(value)
        else:
            damaged.append(number)
    return out, damaged


def json_lines(path: str | Path, until_damaged: bool = False) -> list[Any]:
    """A JSON-lines file's values ([] without the file); damaged lines skipped (`until_damaged`: the values before
    the first one)."""
    return rows(text(path), until_damaged)[0]


def appended(path: str | Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """The complete JSON lines appended to `path` after byte `offset`, and the offset after them (a rank's
    metrics.jsonl, copied as it grows); a line that is not JSON is passed over."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    found = rows(data[:end].decode("utf-8", errors="replace"))[0]
    return [r for r in found if isinstance(r, dict)], offset + end


def rank_losses(folder: str | Path) -> dict[int, list[float]]:
    """Each rank's losses so far (a distributed run's ranks/<r>/metrics.jsonl, complete steps only), by rank."""
    ranks = Path(folder) / "ranks"
    found = sorted(int(p.name) for p in ranks.iterdir() if p.name.isdigit()) if ranks.is_dir() else []
    out = {}
    for rank in found:
        if not (ranks / str(rank) / METRICS).is_file():
            continue
        losses = []
        for row in json_lines(ranks / str(rank) / METRICS, until_damaged=True):
            if not isinstance(row, dict) or "loss" not in row:
                break
            losses.append(row["loss"])
        out[rank] = losses
    return out


def running_distributed(out: str | Path, backend: str, pid: int | None = None) -> Path | None:
    """The folder under `out` of the distributed burst of `backend` that process `pid` (this one) is running now:
    its launcher writes the pid, the status running and the number of processes into meta.json."""
    pid = os.getpid() if pid is None else pid
    for path in sorted(Path(out).glob(f"*/{META}"), reverse=True):
        m = meta(path.parent)
        if m.get("pid") == pid and m.get("status") == "running" and m.get("backend") == backend and "nproc" in m:
            return path.parent
    return None
