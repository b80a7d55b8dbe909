"""A run is a folder on disk: meta.json, metrics.jsonl (one line per step, written as it goes), log.txt, and
what each view adds. Partial runs stay readable: metrics are appended per step and meta is replaced atomically."""

from __future__ import annotations

import datetime as _dt
import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATUSES = ("running", "ok", "interrupted", "stopped", "failed", "crashed")


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (a reader never sees half a file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)


_counter = itertools.count()


def new_run_dir(out: str | Path, backend: str, name: str | None = None) -> Path:
    out = Path(out).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = f"{stamp}-{name or backend}"
    for i in itertools.count():
        path = out / (base if i == 0 else f"{base}-{i}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


class RunWriter:
    """Writes one run folder as the burst goes."""

    def __init__(self, path: Path, meta: dict[str, Any]):
        self.path = path
        self.meta = {"status": "running", "started": _dt.datetime.now().isoformat(timespec="seconds"), **meta}
        write_json(path / "meta.json", self.meta)
        self._metrics = open(path / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115

    def step(self, row: dict[str, Any]) -> None:
        self._metrics.write(json.dumps(row) + "\n")
        self._metrics.flush()

    def write(self, name: str, data: Any) -> None:
        write_json(self.path / name, data)

    def finish(self, status: str, **extra: Any) -> None:
        self._metrics.close()
        self.meta.update(extra, status=status, finished=_dt.datetime.now().isoformat(timespec="seconds"))
        write_json(self.path / "meta.json", self.meta)


def mark(path: str | Path, status: str, **extra: Any) -> None:
    """Finish a run from outside (the kernel side, after its worker was stopped or died)."""
    path = Path(path)
    meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
    if meta.get("status") != "running":
        return
    meta.update(extra, status=status, finished=_dt.datetime.now().isoformat(timespec="seconds"))
    write_json(path / "meta.json", meta)


class RunError(ValueError):
    """A folder that is not an ortlab run."""


@dataclass
class Run:
    path: Path
    meta: dict[str, Any]

    @property
    def status(self) -> str:
        return self.meta.get("status", "unknown")

    @property
    def backend(self) -> str:
        return self.meta.get("backend", "?")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def error(self) -> str | None:
        return self.meta.get("error")

    @property
    def metrics(self):
        import pandas as pd

        rows = []
        path = self.path / "metrics.jsonl"
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    break  # a line cut by a killed worker: keep what came before
        return pd.DataFrame(rows, columns=None if rows else ["step", "loss", "step_time_s", "samples_per_s", "peak_mem_mb"])

    @property
    def losses(self) -> list[float]:
        return self.metrics["loss"].tolist() if len(self.metrics) else []

    @property
    def log(self) -> str:
        path = self.path / "log.txt"
        return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""

    def read_json(self, name: str, default: Any = None) -> Any:
        path = self.path / name
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else default

    @property
    def ort(self) -> dict[str, Any]:
        """ORT's own data for this burst: init overhead, feature table, post-export graph info, fallback."""
        return self.read_json("ort.json", {})

    @property
    def transitions(self):
        import pandas as pd

        return pd.DataFrame(self.read_json("transitions.json", []))

    def summary(self) -> dict[str, Any]:
        m = self.metrics
        out = {"run": self.path.name, "backend": self.backend, "status": self.status, "steps": len(m)}
        if len(m):
            out["final_loss"] = float(m["loss"].iloc[-1])
            timed = m["step_time_s"].iloc[1:] if len(m) > 1 else m["step_time_s"]
            out["median_step_s"] = float(timed.median())
            out["peak_mem_mb"] = float(m["peak_mem_mb"].max())
        overhead = self.ort.get("overhead", {})
        if overhead:
            out["ort_init_s"] = overhead.get("end to end")
        return out

    def __repr__(self) -> str:
        return f"Run({self.path.name!r}, backend={self.backend!r}, status={self.status!r}, steps={len(self.metrics)})"


def load_run(path: str | Path) -> Run:
    """Read a run folder; reading never executes code from it."""
    path = Path(path)
    meta_path = path / "meta.json"
    if not meta_path.is_file():
        raise RunError(f"{path} is not an ortlab run folder (no meta.json)")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise RunError(f"{meta_path}: not valid JSON ({e})") from None
    return Run(path, meta)


def list_runs(folder: str | Path = "runs"):
    """All runs below `folder`, newest first, as a DataFrame."""
    import pandas as pd

    rows = []
    folder = Path(folder)
    if folder.is_dir():
        for meta in folder.glob("*/meta.json"):
            try:
                run = load_run(meta.parent)
            except RunError:
                continue
            rows.append({**run.summary(), "started": run.meta.get("started"), "path": str(run.path)})
    df = pd.DataFrame(rows)
    return df.sort_values("started", ascending=False, ignore_index=True) if len(df) else df
