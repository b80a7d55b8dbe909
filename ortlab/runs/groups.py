"""Which runs belong together, answered once: the PyTorch run another backend's run was compared with (a pair), a
comparison's runs (a PyTorch run and every run compared with it), the newest run of a backend. From meta.json
alone (its backend, model, steps, parity, seed and start). A leaf: what a backend is comes in as `registry`, the
backends' registry (`ortlab.engine.backends.BACKENDS`: name -> entry with its flags), so that this module imports
nothing above ortlab.runs."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ortlab.runs.run import Run, RunError, load_run

Registry = Mapping[str, Any]  # backend name -> its registry entry (flags as attributes: reference, onnx_stages)


def has(registry: Registry, backend: str | None, flag: str) -> bool:
    """Whether the registered backend has the flag; False for a backend not registered here (an old run's)."""
    return backend in registry and bool(getattr(registry[backend], flag))


def in_folder(path: str | Path) -> list[Run]:
    """The runs of a folder (its */meta.json), by name; a damaged run does not hide the others."""
    found = []
    for meta in sorted(Path(path).glob("*/meta.json")):
        try:
            found.append(load_run(meta.parent))
        except RunError:
            continue
    return found


def same_start(run: Run) -> tuple:
    """What runs of one comparison share: the model's factory, the steps, parity and the seed."""
    config = run.meta.get("config") or {}
    model = (run.meta.get("model") or {}).get("factory")
    return model, config.get("steps"), bool(config.get("parity")), config.get("seed")


def _started(run: Run) -> str:
    return run.meta.get("started") or ""


def reference_of(run: Run, among: Sequence[Run] | None, registry: Registry) -> Run | None:
    """The PyTorch run a run of another backend was compared with: the latest reference run of the same start
    begun no later than it (a comparison runs PyTorch first, from the same snapshot), among `among` (None: the
    runs in its folder). None for a PyTorch run, a backend not registered here, or when there is none."""
    if run.backend not in registry or has(registry, run.backend, "reference"):
        return None
    among = in_folder(run.path.parent) if among is None else among
    key, started = same_start(run), _started(run)
    candidates = [r for r in among if has(registry, r.backend, "reference") and same_start(r) == key
                  and _started(r) <= started and r.path != run.path]
    return max(candidates, key=lambda r: (_started(r), r.path.name)) if candidates else None


def references(runs: Sequence[Run], registry: Registry) -> list[Run]:
    """The PyTorch runs (the reference backend's) among `runs`."""
    return [r for r in runs if has(registry, r.backend, "reference")]


def pairs(runs: Sequence[Run], registry: Registry) -> list[tuple[Run, Run]]:
    """(PyTorch's run, another backend's run) for each run compared with a PyTorch run among `runs`."""
    return [(reference, run) for run in runs if (reference := reference_of(run, runs, registry)) is not None]


def comparisons(found: Iterable[tuple[Run, Run]]) -> list[list[Run]]:
    """The pairs grouped by their PyTorch run, in order: each comparison's runs, PyTorch's first."""
    groups: dict[Path, list[Run]] = {}
    for reference, run in found:
        groups.setdefault(reference.path, [reference]).append(run)
    return list(groups.values())


def newest_comparison(runs: Sequence[Run], registry: Registry) -> list[Run]:
    """The runs of the newest comparison among `runs` (oldest first): the last run with the PyTorch run it was
    compared with and that run's other partners; a lone run alone; [] without runs."""
    if not runs:
        return []
    reference = reference_of(runs[-1], runs, registry) or runs[-1]
    return [reference, *(r for r in runs if r is not reference and reference_of(r, runs, registry) is reference)]


def newest(runs: Sequence[Run], registry: Registry, flag: str | None) -> Run | None:
    """The newest run among `runs` (oldest first) of a backend with the registry's `flag` (None: of a registered
    backend with neither "reference" nor "onnx_stages": torch.compile's), or None."""
    def kept(run: Run) -> bool:
        if flag is not None:
            return has(registry, run.backend, flag)
        return not has(registry, run.backend, "onnx_stages") and not has(registry, run.backend, "reference")

    return next((r for r in reversed(runs) if kept(r)), None)


def newest_each(runs: Sequence[Run], keep: Callable[[Run], bool], registry: Registry) -> list[Run]:
    """The newest run of each backend that `keep` keeps, in the registry's order (PyTorch first)."""
    found: dict[str, Any] = {}
    for run in reversed(runs):
        if run.backend not in found and keep(run):
            found[run.backend] = run
    rank = {name: i for i, name in enumerate(registry)}
    return sorted(found.values(), key=lambda r: rank.get(r.backend, len(rank)))
