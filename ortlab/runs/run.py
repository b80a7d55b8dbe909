"""A run is a folder on disk: meta.json, metrics.jsonl (one line per step, written as it goes), log.txt, and
what each view adds. Partial runs stay readable: metrics are appended per step and meta is replaced atomically."""

from __future__ import annotations

import datetime as _dt
import errno
import itertools
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortlab.common.enums import StrEnum
from ortlab.errors import OrtlabError
from ortlab.runs.files import RunError, read_json, step_rows, text


class RunStatus(StrEnum):
    """What meta.json says of a run (the strings on disk)."""

    RUNNING = "running"
    OK = "ok"
    FALLBACK = "fallback"  # the burst finished, but ORTModule fell back to PyTorch (its steps are PyTorch's, not ORT's)
    INTERRUPTED = "interrupted"  # Ctrl-C or a Stop honoured after a step
    STOPPED = "stopped"  # the worker was ended after a Stop it did not honour
    FAILED = "failed"
    CRASHED = "crashed"  # the process died


STATUSES = tuple(s.value for s in RunStatus)
ENDED_EARLY = (RunStatus.INTERRUPTED, RunStatus.STOPPED)  # a user's Stop: a comparison goes no further
DISTRIBUTED_KEYS = ("nproc", "nnodes", "strategy", "ranks", "in_sync", "out_of_sync", "checkpoint", "failed_rank",
                    "rank_graphs", "imbalance")


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


COMMAND = "ORTLAB_COMMAND"  # the `ortlab ...` command line a run was made by (set by the CLI for its processes)


def invocation() -> dict[str, Any]:
    """What made the run when it was the CLI: its command line and working folder (`ortlab report` shows them and
    how to run it again); {} for a call from Python (the run's config is that call's arguments)."""
    command = os.environ.get(COMMAND)
    return {"command": command, "cwd": os.getcwd()} if command else {}


class RunWriteError(OrtlabError, OSError):
    """A run file could not be written (a full disk, a file-size limit): names the file."""

    def __str__(self) -> str:
        return str(self.strerror)


def _finite(row: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """JSON has no NaN or infinity: such values are written as null and named."""
    bad = [k for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)]
    return ({**row, **dict.fromkeys(bad)} if bad else row), bad


class RunWriter:
    """Writes one run folder as the burst goes. Each metrics line is written whole or not at all (a line that a
    full disk cut is removed again), so a reader always sees complete steps."""

    def __init__(self, path: Path, meta: dict[str, Any]):
        self.path = path
        self.meta = {"status": RunStatus.RUNNING.value, "started": _dt.datetime.now().isoformat(timespec="seconds"),
                     **invocation(), **meta}
        self.write("meta.json", self.meta)
        self._metrics_path = path / "metrics.jsonl"
        self._metrics = os.open(self._metrics_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.nonfinite: dict[str, int] = {}  # metric -> first step where it was not finite

    def step(self, row: dict[str, Any]) -> None:
        row, bad = _finite(row)
        for key in bad:
            self.nonfinite.setdefault(key, row.get("step"))
        data = (json.dumps(row, allow_nan=False) + "\n").encode()
        size = os.fstat(self._metrics).st_size
        try:
            written = os.write(self._metrics, data)
        except OSError as e:
            code, reason = e.errno, e.strerror
        else:
            if written == len(data):
                return
            code, reason = errno.ENOSPC, f"only {written} of {len(data)} bytes fit (a full disk or a file-size limit)"
        os.ftruncate(self._metrics, size)  # no half line
        raise RunWriteError(code, f"cannot write {self._metrics_path}: {reason}", str(self._metrics_path))

    def write(self, name: str, data: Any) -> None:
        try:
            write_json(self.path / name, data)
        except OSError as e:
            (self.path / f".{name}.{os.getpid()}.tmp").unlink(missing_ok=True)
            target = self.path / name
            raise RunWriteError(e.errno, f"cannot write {target}: {e.strerror}", str(target)) from None

    def finish(self, status: str, **extra: Any) -> None:
        """The final status; after a write failure the shortest meta that says so is tried as well."""
        if self._metrics is not None:
            os.close(self._metrics)
            self._metrics = None
        if self.nonfinite and "warning" not in extra:
            first = min(self.nonfinite.items(), key=lambda kv: kv[1] if kv[1] is not None else -1)
            extra["warning"] = (f"{first[0]} became non-finite at step {first[1]} (written as null): the learning "
                                "rate may be too high")
        self.meta.update(extra, status=status, finished=_dt.datetime.now().isoformat(timespec="seconds"))
        try:
            write_json(self.path / "meta.json", self.meta)
        except OSError:
            small = {k: self.meta.get(k) for k in ("status", "backend", "started", "finished", "error", "config")}
            write_json(self.path / "meta.json", small)


def mark(path: str | Path, status: str, **extra: Any) -> None:
    """Finish a run from outside (the kernel side, after its worker was stopped or died)."""
    path = Path(path)
    meta = read_json(path / "meta.json")
    if meta.get("status") != RunStatus.RUNNING:
        return
    meta.update(extra, status=status, finished=_dt.datetime.now().isoformat(timespec="seconds"))
    write_json(path / "meta.json", meta)


def _read_metrics(path: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """The step rows, and the line numbers that are not a step row (damaged: skipped, the later steps kept)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return [], []
    except OSError as e:
        raise RunError(f"{path}: cannot be read ({e.strerror})") from None
    return step_rows(text)


@dataclass
class Run:
    """One burst on disk (a run folder), read lazily: `meta` from meta.json, the rest on first use. Get one from
    `ortlab.burst`, `Session.burst` or `load_run(folder)`."""

    path: Path
    meta: dict[str, Any]
    damaged_lines: list[int] = field(default_factory=list)  # metrics.jsonl lines that are not a step (after .metrics)

    @property
    def status(self) -> str:
        """One of STATUSES (ok, fallback, failed, crashed, stopped, interrupted, running), as meta.json says; unknown
        without."""
        return self.meta.get("status", "unknown")

    @property
    def backend(self) -> str:
        """pytorch, ortmodule or compile."""
        return self.meta.get("backend", "?")

    @property
    def ok(self) -> bool:
        """Whether the burst finished on its own backend (status ok)."""
        return self.status == RunStatus.OK

    @property
    def error(self) -> str | None:
        """What failed, in one line, or None."""
        return self.meta.get("error")

    @property
    def versions(self) -> dict[str, Any]:
        """The versions of the libraries the run trained with (torch, python, onnxruntime-training...), as meta.json
        recorded them; empty for a run that recorded none."""
        return self.meta.get("versions") or {}

    @property
    def metrics(self):
        """One row per step (DataFrame): step, loss, step_time_s, samples_per_s, peak_mem_mb and what the collectors
        add; damaged lines are skipped and named in `damaged_lines`."""
        import pandas as pd

        rows, self.damaged_lines = _read_metrics(self.path / "metrics.jsonl")
        empty = ["step", "loss", "step_time_s", "samples_per_s", "peak_mem_mb"]
        return pd.DataFrame(rows, columns=None if rows else empty)

    @property
    def losses(self) -> list[float]:
        """The loss of every step, as a list (nan where a step has none); read without pandas (the verdict reads
        it for every comparison)."""
        rows, self.damaged_lines = _read_metrics(self.path / "metrics.jsonl")
        return [math.nan if r.get("loss") is None else float(r["loss"]) for r in rows]

    @property
    def log(self) -> str:
        """Everything the burst printed (log.txt), or an empty string."""
        return text(self.path / "log.txt")

    def read_json(self, name: str, default: Any = None) -> Any:
        """A JSON file of the run; a damaged one raises RunError naming it."""
        return read_json(self.path / name, default)

    @property
    def ort(self) -> dict[str, Any]:
        """ORT's own data for this burst: init overhead, feature table, post-export graph info, fallback."""
        return self.read_json("ort.json", {})

    @property
    def memory(self) -> dict[str, Any]:
        """The burst's activation-memory account (collector "memory"; ortlab.account): memory.json, {} without."""
        return self.read_json("memory.json", {})

    @property
    def transitions(self):
        """Why ORTModule exported during the burst, one row per event (DataFrame)."""
        import pandas as pd

        return pd.DataFrame(self.read_json("transitions.json", []))

    @property
    def ranks(self) -> list[Run]:
        """Each rank's own run (folder ranks/<r>) of a distributed burst, by rank; [] for a single process."""
        folder = self.path / "ranks"
        found = sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []
        return [load_run(folder / str(r)) for r in found if (folder / str(r) / "meta.json").is_file()]

    def summary(self) -> dict[str, Any]:
        """The figures a person compares first, as a dict: status, steps, final loss, median step, peak memory, ORT's
        start-up, the memory account's rows, fixes, verdict, ranks."""
        m = self.metrics
        out = {"run": self.path.name, "backend": self.backend, "status": self.status, "steps": len(m),
               "device": self.meta.get("device")}
        if len(m):
            out["final_loss"] = _number(m["loss"].iloc[-1])
            if "step_time_s" in m:
                from ortlab.runs import clock

                judged = clock.column(m)  # the step's CPU time on the CPU; wall time on CUDA and in older runs
                timed = m.iloc[1:] if len(m) > 1 else m
                out["median_step_s"] = _number(timed[judged].median())
                out["step_clock"] = clock.SHORT[judged]
                if judged != clock.WALL:  # the wall time too: what a person waits for
                    out["median_wall_s"] = _number(timed[clock.WALL].median())
                for key in ("comm_s", "comm_share"):  # a rank's time with a collective in flight (engine.comm)
                    if key in m:
                        out[key] = _number((m[key].iloc[1:] if len(m) > 1 else m[key]).median())
                from ortlab.runs.busy import busy

                why = busy(self.meta.get("machine"))
                if why:  # timings taken beside other work (ortlab.runs.busy)
                    out["busy"] = why
            for key in ("peak_mem_mb", "peak_reserved_mb"):  # reserved: the CUDA allocator's
                if key in m:
                    out[key] = _number(m[key].max())
        if self.damaged_lines:
            out["damaged_metrics_lines"] = self.damaged_lines
        ort = self.ort or {}
        overhead = ort.get("overhead") or {}
        if overhead:
            out["ort_init_s"] = out["startup_s"] = overhead.get("end to end")
        if self.status == RunStatus.FALLBACK:  # why a start-up is not the backend's (facts.py shows the words)
            out["startup_note"] = "fell back to PyTorch"
        elif ort and not ort.get("exported"):
            out["startup_note"] = "reused (no export)"
        compiled = self.read_json("compile.json")
        if compiled:  # a torch.compile burst (ortlab.engine.backends.compiled)
            out.update(compile_s=compiled.get("compile_s"), startup_s=compiled.get("compile_s"),
                       graph_breaks=sum(g.get("count", 1) for g in compiled.get("graph_breaks", [])),
                       recompiles=len(compiled.get("recompiles", [])))
        from ortlab.runs.memory import summary_fields

        out.update(summary_fields(self.memory))
        if self.meta.get("fallback"):  # ORTModule fell back to PyTorch (status "fallback")
            out["fallback"] = self.meta["fallback"]
        applied = (self.meta.get("fixes") or {}).get("applied")
        if applied:
            out["fixes"] = applied
        if self.meta.get("hazards"):  # what the exporter warned about (ortlab.compat.hazards)
            out["hazards"] = len(self.meta["hazards"])
        verdict = self.read_json("verdict.json")
        if verdict:  # an ORTModule run judged against its PyTorch run: what it said (its evidence: reporting.listing)
            out["verdict"] = verdict.get("status")
        for key in DISTRIBUTED_KEYS:  # a distributed burst (ortlab.engine.launch)
            if key in self.meta:
                out[key] = self.meta[key]
        if isinstance(self.meta.get("stack"), dict):  # the stack it was made on (older runs: not recorded)
            out["stack"] = self.meta["stack"]
        return out

    def __repr__(self) -> str:
        return f"Run({self.path.name!r}, backend={self.backend!r}, status={self.status!r}, steps={len(self.metrics)})"


def _number(value: Any) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def load_run(path: str | Path) -> Run:
    """The Run in folder `path` (RunError when it is not one); reading never executes code from it."""
    path = Path(path)
    meta_path = path / "meta.json"
    if not meta_path.is_file():
        raise RunError(f"{path} is not an ortlab run folder (no meta.json)")
    meta = read_json(meta_path)
    if not isinstance(meta, dict):
        raise RunError(f"{meta_path}: not a run's meta (a JSON object is expected, found {type(meta).__name__})")
    return Run(path, meta)
