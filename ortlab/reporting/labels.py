"""Runs named by what sets them apart: "ortmodule · memory_opt_level=1" beside "ortmodule · defaults", never an option
the user did not set (parity mode turns ORT's compute optimizer off in every parity run: that is "parity", not an
option of one run). What every run shares is left out; runs alike in everything get their start time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ortlab.engine.backends import has

_SHOWN = ("steps", "parity", "optimizer", "precision", "seed", "lr", "nproc", "fixes", "device")


def settings(run: Any) -> dict[str, Any]:
    """What a run was asked for: its backend, model, burst settings, collectors and the ORT options set for it (its
    config's, not the effective ones parity mode adds)."""
    config = run.meta.get("config") or {}
    out: dict[str, Any] = {"backend": run.backend, "model": (run.meta.get("model") or {}).get("name")}
    out.update({k: config[k] for k in _SHOWN if k in config})
    out["collect"] = tuple(sorted(config.get("collect") or {}))
    for name, value in sorted((config.get("options") or {}).items()):
        if name not in ("save_onnx", "save_onnx_path", "onnx_prefix"):  # where graphs go: no bearing on the run
            out[f"option:{name}"] = value
    return out


def labels(runs: Sequence[Any], backend: bool = True) -> list[str]:
    """One label per run, in order: its backend (unless `backend` is False) and the settings that differ between
    the runs; the run's start time where two would read the same."""
    sets = [settings(r) for r in runs]
    keys = list(dict.fromkeys(k for s in sets for k in s))
    differing = [k for k in keys if k != "backend" and len({repr(s.get(k)) for s in sets}) > 1]
    options = [k for k in differing if k.startswith("option:")]
    out = []
    for run, s in zip(runs, sets, strict=True):
        parts = [run.backend] if backend else []
        parts += [_words(k, s.get(k)) for k in differing if not k.startswith("option:")]
        if options and has(run.backend, "onnx_stages"):  # ORT's options: only what runs ORT reads them
            set_here = [f"{k.removeprefix('option:')}={s[k]}" for k in options if k in s]
            parts.append(", ".join(set_here) or "default options")
        out.append(" · ".join(p for p in parts if p))
    counts = {label: out.count(label) for label in out}
    return [_time(run) if not label else f"{label} · {_time(run)}" if counts[label] > 1 else label
            for label, run in zip(out, runs, strict=True)]


def _words(key: str, value: Any) -> str:
    if key == "parity":
        return "parity" if value else "no parity"
    if key == "collect":
        return "+".join(value) if value else "no collectors"
    if key == "model":
        return str(value)
    if key == "fixes":  # "auto" (what check finds) or the fixes' names
        if not value:
            return "no fixes"
        return f"fixes: {value if isinstance(value, str) else ', '.join(map(str, value))}"
    return f"{key} {value}"


def _time(run: Any) -> str:
    """A run's start time from its folder name (20261127-011639-...): "01:16:39"."""
    parts = run.path.name.split("-")
    stamp = parts[1] if len(parts) > 1 and parts[1].isdigit() and len(parts[1]) == 6 else run.path.name
    return f"{stamp[:2]}:{stamp[2:4]}:{stamp[4:6]}" if stamp.isdigit() else stamp
