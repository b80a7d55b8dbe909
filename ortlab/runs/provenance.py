"""What was run and how to run it again, from a run's meta.json alone: the command line (recorded when the CLI made
it), the Python call its config amounts to, the options, the stack's versions, the machine and the dates; the
`ortlab` command that repeats it, and the regression script `ortlab repro` wrote for it when there is one."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from ortlab.runs.run import Run

# BurstConfig's defaults, as `ortlab burst` spells them: a reproduction names only what differs.
_FLAGS = (("optimizer", "--optimizer", "auto"), ("lr", "--lr", 1e-3), ("seed", "--seed", 0),
          ("precision", "--precision", "fp32"), ("device", "--device", "auto"), ("nproc", "--nproc", 1),
          ("nnodes", "--nnodes", 1), ("sampler", "--sampler", None))


def what_ran(run: Run) -> dict[str, Any]:
    """One run's provenance as plain data: command (or None: a Python call), working folder, the call its config
    amounts to, the model, the options it ran with, versions, machine, device, dates, status and error."""
    meta = run.meta
    config = meta.get("config") or {}
    model = meta.get("model") or {}
    machine = meta.get("machine") or {}
    return {"run": run.path.name, "path": str(run.path), "backend": run.backend, "status": run.status,
            "error": run.error, "command": meta.get("command"), "cwd": meta.get("cwd"), "call": python_call(run),
            "model": model.get("name") or model.get("factory"), "factory": model.get("factory"),
            "parameters": model.get("parameters"), "batch_size": model.get("batch_size"),
            "steps": config.get("steps"), "parity": bool(config.get("parity")),
            "collect": sorted(config.get("collect") or {}), "options": meta.get("effective_options") or {},
            "fixes": (meta.get("fixes") or {}).get("applied") or [], "optimizer": meta.get("optimizer"),
            "versions": meta.get("versions") or {}, "device": meta.get("device"), "gpu": meta.get("gpu"),
            "machine": {k: machine.get(k) for k in ("cores", "threads", "ort_threads", "load", "cpu_wait")
                        if machine.get(k) is not None},
            "started": meta.get("started"), "finished": meta.get("finished")}


def python_call(run: Run) -> str | None:
    """`ortlab.burst(...)` with the run's arguments (what Session.burst was given), or None without a config."""
    config = run.meta.get("config")
    if not config:
        return None
    ref = ((run.meta.get("model") or {}).get("rebuild") or {}).get("ref") or {}
    args = [repr(ref.get("target") if ref.get("kind") == "import" else ref.get("label") or "<a callable>")]
    args += [f"{k}={v!r}" for k, v in (ref.get("kwargs") or {}).items()]
    args += [f"backend={config.get('backend')!r}", f"steps={config.get('steps')}"]
    if config.get("options"):
        args.append(f"options={config['options']!r}")
    if config.get("parity"):
        args.append("parity=True")
    for key, _flag, default in _FLAGS:
        if config.get(key, default) != default:
            args.append(f"{key}={config[key]!r}")
    if config.get("collect"):
        args.append(f"collect={config['collect']!r}")
    if config.get("fixes"):
        args.append(f"fixes={config['fixes']!r}")
    return f"ortlab.burst({', '.join(args)})"


def command(runs: list[Run]) -> str | None:
    """The `ortlab` command that runs these again: the recorded command line when the CLI made them, else
    `ortlab compare` (several backends of one comparison) or `ortlab burst` built from the config; None when the
    model was a callable from a notebook (no factory to name)."""
    recorded = {r.meta.get("command") for r in runs} - {None}
    if len(recorded) == 1:
        return recorded.pop()
    first = runs[0]
    config = first.meta.get("config") or {}
    ref = ((first.meta.get("model") or {}).get("rebuild") or {}).get("ref")
    if not config or not ref:
        return None
    backends = list(dict.fromkeys(r.backend for r in runs))
    if len(backends) > 1:
        words = ["ortlab", "compare", "--backends", ",".join(backends), "--steps", str(config.get("steps"))]
        if not config.get("parity"):
            words.append("--no-parity")
    else:
        words = ["ortlab", "burst", "--backend", backends[0], "--steps", str(config.get("steps"))]
        if config.get("parity"):
            words.append("--parity")
    if ref.get("target") != "ortlab.demo:gpt" or ref.get("kwargs"):
        words += ["--model", ref.get("label") or str(ref.get("target"))]
    for key, value in (ref.get("kwargs") or {}).items():
        words += ["--model-arg", f"{key}={value}"]
    for key, value in (config.get("options") or {}).items():
        words += ["--option", f"{key}={value}"]
    for key, flag, default in _FLAGS:
        if config.get(key, default) != default:
            words += [flag, str(config[key])]
    collect = config.get("collect") or {}
    words += [w for name in sorted(collect) if name != "memory" for w in ("--collect", name)]
    if "memory" not in collect:
        words.append("--no-memory")
    fixes = config.get("fixes")
    if fixes:
        words += ["--fix", fixes if isinstance(fixes, str) else ",".join(fixes)]
    return shlex.join(words)


def repro_script(run: Run) -> dict[str, Any] | None:
    """The regression script `ortlab repro` wrote for a diverged run (its path and text), or None."""
    localized = (run.read_json("verdict.json") or {}).get("localized") or {}
    script = (localized.get("repro") or {}).get("script")
    if not script or not Path(script).is_file():  # ortlab repro's default folder: the run's repro/
        found = sorted((run.path / "repro").glob("*.py"))
        if not found:
            return None
        script = str(found[0])
    return {"path": script, "text": Path(script).read_text(encoding="utf-8", errors="replace"),
            "module": localized.get("path")}
