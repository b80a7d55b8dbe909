"""Which runs belong together, answered once: the PyTorch run another backend's run was compared with (a pair), a
comparison's runs (a PyTorch run and every run compared with it), the newest run of a backend; and which runs are
the user's. From meta.json alone (its backend, model, steps, parity, seed and start). The runs ortlab makes for its
own purposes (Tune's measurements and guards, the plan sweep's bursts, a verdict's evidence) live in the
`ortlab-runs/` folder (OWN) under the run or folder that asked for them and say so in meta.json ("asked_by"):
every answer here is about the user's runs only. A leaf: what a backend is comes in as `registry`, the backends'
registry (`ortlab.engine.backends.BACKENDS`: name -> entry with its flags), so that this module imports nothing
above ortlab.runs."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ortlab.runs.run import Run, RunError, load_run, write_json

Registry = Mapping[str, Any]  # backend name -> its registry entry (flags as attributes: reference, onnx_stages)


def has(registry: Registry, backend: str | None, flag: str) -> bool:
    """Whether the registered backend has the flag; False for a backend not registered here (an old run's)."""
    return backend in registry and bool(getattr(registry[backend], flag))


OWN = "ortlab-runs"  # the folder under a run or a tuning that holds the runs ortlab made for it
ASKED_BY = "asked_by"  # meta.json: {"folder": what asked for the run, "purpose": why}
# the names ortlab gave its own bursts before they were kept apart: how a run of an older folder is told apart
_OWN_NAMES = re.compile(r"tune-(baseline(-again)?-\d+|reference|guard-.+|\d+(-again)?)|plans(-none|-set\d+|-applied)?"
                        r"|pytorch-noise|localize-.+")


def own_folder(asker: str | Path) -> Path:
    """Where the runs ortlab makes for `asker` (a run's folder, a tuning's, a plan sweep's) go: its OWN folder."""
    return Path(asker) / OWN


def mark_asked(run: Run, asker: str | Path, purpose: str) -> None:
    """Say in `run`'s meta.json (and its `meta`) that ortlab made it for `asker`'s `purpose` ("tune", "plans",
    "evidence"), not the user."""
    run.meta[ASKED_BY] = {"folder": Path(asker).name, "purpose": purpose}
    write_json(run.path / "meta.json", run.meta)


def asked_by(run: Run) -> dict[str, Any] | None:
    """What ortlab made `run` for ({"folder", "purpose"}), None for a user's run: its meta.json says so, or it lies
    in an OWN folder under another folder, or (a folder of older runs) its name is one ortlab gave its own bursts."""
    said = run.meta.get(ASKED_BY)
    if isinstance(said, dict):
        return said
    if run.path.parent.name == OWN:
        return {"folder": run.path.parent.parent.name, "purpose": "unknown"}
    name = (run.meta.get("config") or {}).get("name")
    if isinstance(name, str) and _OWN_NAMES.fullmatch(name):
        return {"folder": None, "purpose": name.split("-")[0]}
    return None


def users(runs: Iterable[Run]) -> list[Run]:
    """The user's runs among `runs`, order kept: not the ones ortlab made for its own purposes (asked_by)."""
    return [r for r in runs if asked_by(r) is None]


def in_folder(path: str | Path, asked: bool = False) -> list[Run]:
    """The user's runs of a folder (its */meta.json), by name; a damaged run does not hide the others. `asked`:
    also the runs ortlab made for its own purposes, after the user's (*/ortlab-runs/*, at any depth)."""
    found = []
    for meta in sorted(Path(path).glob("*/meta.json")):
        try:
            found.append(load_run(meta.parent))
        except RunError:
            continue
    if not asked:
        return users(found)
    nested = []
    for folder in sorted(p for p in Path(path).glob(f"*/{OWN}") if p.is_dir()):
        nested += in_folder(folder, asked=True)
    return [*found, *nested]


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
    among = in_folder(run.path.parent) if among is None else users(among)
    key, started = same_start(run), _started(run)
    candidates = [r for r in among if has(registry, r.backend, "reference") and same_start(r) == key
                  and _started(r) <= started and r.path != run.path]
    return max(candidates, key=lambda r: (_started(r), r.path.name)) if candidates else None


def references(runs: Sequence[Run], registry: Registry) -> list[Run]:
    """The user's PyTorch runs (the reference backend's) among `runs`."""
    return [r for r in users(runs) if has(registry, r.backend, "reference")]


def pairs(runs: Sequence[Run], registry: Registry) -> list[tuple[Run, Run]]:
    """(PyTorch's run, another backend's run) for each user's run compared with a PyTorch run among `runs`."""
    runs = users(runs)
    return [(reference, run) for run in runs if (reference := reference_of(run, runs, registry)) is not None]


def comparisons(found: Iterable[tuple[Run, Run]]) -> list[list[Run]]:
    """The pairs grouped by their PyTorch run, in order: each comparison's runs, PyTorch's first."""
    groups: dict[Path, list[Run]] = {}
    for reference, run in found:
        groups.setdefault(reference.path, [reference]).append(run)
    return list(groups.values())


def newest_comparison(runs: Sequence[Run], registry: Registry) -> list[Run]:
    """The runs of the newest comparison among `runs` (oldest first): the last run with the PyTorch run it was
    compared with and that run's other partners; a lone run alone; [] without runs. The user's runs only."""
    runs = users(runs)
    if not runs:
        return []
    reference = reference_of(runs[-1], runs, registry) or runs[-1]
    return [reference, *(r for r in runs if r is not reference and reference_of(r, runs, registry) is reference)]


def newest(runs: Sequence[Run], registry: Registry, flag: str | None) -> Run | None:
    """The newest run among `runs` (oldest first) of a backend with the registry's `flag` (None: of a registered
    backend with neither "reference" nor "onnx_stages": torch.compile's), or None. The user's runs only."""
    def kept(run: Run) -> bool:
        if flag is not None:
            return has(registry, run.backend, flag)
        return not has(registry, run.backend, "onnx_stages") and not has(registry, run.backend, "reference")

    return next((r for r in reversed(users(runs)) if kept(r)), None)


def newest_each(runs: Sequence[Run], keep: Callable[[Run], bool], registry: Registry) -> list[Run]:
    """The newest user's run of each backend that `keep` keeps, in the registry's order (PyTorch first)."""
    found: dict[str, Any] = {}
    for run in reversed(users(runs)):
        if run.backend not in found and keep(run):
            found[run.backend] = run
    rank = {name: i for i, name in enumerate(registry)}
    return sorted(found.values(), key=lambda r: rank.get(r.backend, len(rank)))
