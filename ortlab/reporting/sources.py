"""What a report is made of: the runs its arguments name (run folders, a folder of runs, a Comparison, Runs), the
tunings beside them (tune.json folders), and which runs were compared with which (each other backend's run with the
PyTorch run of its comparison). Only JSON is read: nothing of a run's code is imported or executed."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortlab.errors import InputError
from ortlab.runs import groups
from ortlab.runs.run import Run, load_run


class ReportError(InputError):
    """Nothing to report on: a path that is neither a run, a folder of runs nor a tuning."""


@dataclass
class Sources:
    """The runs (oldest first), the tuning folders, and what was given (for the page's header)."""

    runs: list[Run]
    tunings: list[Path] = field(default_factory=list)
    given: list[str] = field(default_factory=list)

    def pairs(self) -> list[tuple[Run, Run]]:
        """(PyTorch's run, another backend's run) for each run compared with a PyTorch run among these."""
        from ortlab.engine.backends import BACKENDS

        return groups.pairs(self.runs, BACKENDS)


def collect(*sources: Any) -> Sources:
    """The Sources of `sources`: Comparisons, Runs, run folders, folders of runs and tuning folders, in any mix."""
    from ortlab.tuning.result import FILE as TUNE_FILE

    if not sources:
        raise ReportError("a report needs at least one run, folder of runs or comparison")
    runs: dict[Path, Run] = {}
    tunings: list[Path] = []
    given: list[str] = []
    for source in sources:
        if hasattr(source, "runs") and hasattr(source, "pytorch"):  # a Comparison
            found = list(source.runs)
            given.append("a comparison of " + ", ".join(r.path.name for r in found))
        elif isinstance(source, Run):
            found = [source]
            given.append(str(source.path))
        else:
            path = Path(source).expanduser()
            given.append(str(path))
            if (path / "meta.json").is_file():
                found = [load_run(path)]
            elif (path / TUNE_FILE).is_file():
                found, tunings = [], [*tunings, path]  # its runs are measurements: the page shows its table
            elif path.is_dir():
                found = groups.in_folder(path)
                tunings += sorted(p.parent for p in path.glob(f"*/{TUNE_FILE}"))
                if not found and not tunings:
                    raise ReportError(f"{path} holds no ortlab run (no */meta.json) and no tuning (*/{TUNE_FILE})")
            else:
                raise ReportError(f"{path} does not exist; give run folders, a folder of runs or a tuning folder")
        for run in found:
            runs.setdefault(run.path.resolve(), run)
    ordered = sorted(runs.values(), key=_order)
    return Sources(ordered, list(dict.fromkeys(tunings)), given)


def _order(run: Run) -> tuple:
    """Oldest first; within one second (meta's resolution) PyTorch's run first: a comparison starts with it."""
    from ortlab.engine.backends import has

    reference = has(run.backend, "reference")
    return run.meta.get("started") or "", not reference, run.path.name


def reference_of(run: Run, among: list[Run] | None = None) -> Run | None:
    """The PyTorch run a run of another backend was compared with (ortlab.runs.groups.reference_of), among `among`
    (default: the runs in the same folder). None for a PyTorch run or when there is none."""
    from ortlab.engine.backends import BACKENDS

    return groups.reference_of(run, among, BACKENDS)
