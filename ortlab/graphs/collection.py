"""The stage files of one ORTModule export, per mode: `load(run_or_folder)` finds them, `Graphs` reads them
(summaries, diffs between stages, search, and why the run exported)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortlab.graphs.diff import StageDiff, diff_stages
from ortlab.graphs.errors import GraphsError
from ortlab.graphs.neighbourhood import Neighbourhood
from ortlab.graphs.stage import Stage
from ortlab.runs.stages import MODES, STAGES, StageFile, find_stage_files, run_stage_folders


@dataclass
class Graphs:
    """The stage files of one ORTModule export (one prefix), per mode, and what a run recorded about it."""

    folder: Path
    prefix: str
    files: dict[tuple[str, str], Path]  # (mode, stage) -> file
    run: Any = None  # the ortlab Run, when the folder belongs to one
    _stages: dict[tuple[str, str], Stage] = field(default_factory=dict, repr=False)

    @property
    def modes(self) -> list[str]:
        return [m for m in MODES if any(k[0] == m for k in self.files)]

    def stages(self, mode: str = "training") -> list[str]:
        if mode not in self.modes:
            raise GraphsError(f"mode {mode!r} has no stage files in {self.folder}; modes here: "
                              f"{', '.join(self.modes)}")
        return [s for s in STAGES if (mode, s) in self.files]

    def stage(self, name: str | None = None, mode: str = "training") -> Stage:
        """One stage (default: the execution model, what ORT runs)."""
        present = self.stages(mode)
        name = name or present[-1]
        if name not in present:
            raise GraphsError(f"stage {name!r} is not in {self.folder} for mode {mode}; stages there: "
                              f"{', '.join(present)}")
        key = (mode, name)
        if key not in self._stages:
            user, grad = self._ort_inputs()
            self._stages[key] = Stage(self.files[key], name, mode, self.prefix, user, grad)
        return self._stages[key]

    def _ort_inputs(self) -> tuple[set[str] | None, set[str]]:
        """User inputs and inputs requiring grad from ORT's post-export record, when the run has one."""
        info = (self.run.ort.get("post_export") or {}) if self.run is not None else {}
        user = set(info["user_inputs"]) if info.get("user_inputs") is not None else None
        return user, set(info.get("graph_inputs_requiring_grad") or [])

    def summary(self, mode: str | None = None):
        """One row per stage: node counts by kind, op types, inputs, outputs, sizes."""
        import pandas as pd

        modes = [mode] if mode else self.modes
        return pd.DataFrame([self.stage(s, m).summary() for m in modes for s in self.stages(m)])

    def diff(self, a: str | None = None, b: str | None = None, mode: str = "training") -> StageDiff:
        """Stage a -> stage b (default: the first and the last stage of the mode)."""
        present = self.stages(mode)
        return diff_stages(self.stage(a or present[0], mode), self.stage(b or present[-1], mode))

    def diffs(self, mode: str = "training"):
        """Each stage against the one before it: one summary row per step."""
        import pandas as pd

        present = self.stages(mode)
        return pd.DataFrame([self.diff(x, y, mode).summary() for x, y in itertools.pairwise(present)])

    def search(self, text: str, stage: str | None = None, mode: str = "training", by: str = "any",
               limit: int | None = 200):
        """Nodes of one stage (default: the execution model) by name, op type or module scope."""
        return self.stage(stage, mode).search(text, by, limit)

    def neighbourhood(self, node: str, hops: int = 1, stage: str | None = None, mode: str = "training",
                      max_nodes: int = 40) -> Neighbourhood:
        return self.stage(stage, mode).neighbourhood(node, hops, max_nodes)

    @property
    def transitions(self):
        """Why ORTModule exported (the run's transition table) and the input schema behind each export: the
        recorded old -> new schema of a re-export, else the user inputs of the exported graph."""
        import pandas as pd

        cols = ["run", "step", "action", "reason", "input_schema", "ort_exported"]
        t = self.run.transitions if self.run is not None else pd.DataFrame()
        if not len(t):
            return pd.DataFrame(columns=cols)
        mode = "training" if "training" in self.modes else self.modes[0]
        first = self.stage(self.stages(mode)[0], mode).inputs
        users = first[first["role"] == "user input"]
        exported = ", ".join(f"{r.name}: {r.dtype}, rank {r.rank}" for r in users.itertuples())

        def schema(row):
            change = (row.get("changes") or {}).get("input_schema")
            if change:
                return f"{change['old']} -> {change['new']}"
            return exported if row.get("ort_exported") else ""

        t = t.assign(input_schema=[schema(r) for r in t.to_dict(orient="records")])
        return t[[c for c in cols if c in t.columns]]

    def chart(self, mode: str = "training"):
        """Node count per stage, stacked by kind (a matplotlib Figure)."""
        from ortlab.graphs.figures import stages_chart

        return stages_chart(self.summary(mode), f"{self.prefix} ({mode}): nodes per stage")

    @property
    def rank_graphs(self) -> dict[str, Any] | None:
        """Of a distributed run: whether every rank exported the same stage files (ortlab.runs.stages.check)."""
        return self.run.meta.get("rank_graphs") if self.run is not None else None

    def to_dict(self) -> dict[str, Any]:
        return {"folder": str(self.folder), "prefix": self.prefix, "modes": self.modes,
                **({"rank_graphs": self.rank_graphs} if self.rank_graphs else {}),
                "stages": self.summary().to_dict(orient="records"),
                "diffs": {m: self.diffs(m).to_dict(orient="records") for m in self.modes}}

    def __repr__(self) -> str:
        per_mode = ", ".join(f"{m}: {len(self.stages(m))} stages" for m in self.modes)
        return f"Graphs(prefix={self.prefix!r}, {per_mode})"


def stage_file_of(path: Path) -> StageFile:
    """The stage file `path` names, or GraphsError saying what a stage file's name looks like."""
    for found in find_stage_files(path.parent):
        if found.path.resolve() == path.resolve():
            return found
    raise GraphsError(f"{path} is not an ORTModule stage file (named PREFIX_STAGE_MODE.onnx, STAGE one of "
                      f"{', '.join(STAGES)}); give it, its folder or its run")


def load(source: Any, prefix: str | None = None) -> Graphs:
    """The exported graphs of a run (a Run or its folder) or of any folder of ORTModule stage files. `prefix`
    picks one export when the folder holds several."""
    from ortlab.runs.run import Run, RunError, load_run

    run = source if isinstance(source, Run) else None
    folder = Path(run.path if run is not None else source).expanduser()
    if folder.is_file():  # one stage file: the export it belongs to
        match = stage_file_of(folder)
        folder, prefix = folder.parent, prefix if prefix is not None else match.prefix
    if not folder.exists():
        raise GraphsError(f"{folder} does not exist; give a run, a run folder or a folder of ORTModule stage "
                          "files")
    if run is None and (folder / "meta.json").is_file():
        try:
            run = load_run(folder)
        except RunError:
            run = None
    if run is not None:
        candidates = run_stage_folders(run)
    else:
        candidates = [folder / "onnx", folder] if (folder / "onnx").is_dir() else [folder]
    for where in candidates:
        files = find_stage_files(where)
        if files:
            break
    else:
        raise GraphsError(_nothing_found(folder, run))
    prefixes = sorted({f.prefix for f in files})
    if prefix is None and len(prefixes) > 1:
        raise GraphsError(f"{where} holds the stage files of several exports; pick one with prefix=: "
                          f"{', '.join(prefixes)}")
    prefix = prefix if prefix is not None else prefixes[0]
    if prefix not in prefixes:
        raise GraphsError(f"no stage files with prefix {prefix!r} in {where}; prefixes there: "
                          f"{', '.join(prefixes)}")
    chosen = {(f.mode, f.stage): f.path for f in files if f.prefix == prefix}
    return Graphs(where, prefix, chosen, run)


def _nothing_found(folder: Path, run) -> str:
    """Why there are no stage files, in the words of what to do about it."""
    expected = (f"files named PREFIX_STAGE_MODE.onnx, STAGE one of {', '.join(STAGES)}, MODE training or "
                "inference")
    if run is None:
        return f"no ORTModule stage files in {folder} ({expected})"
    options = run.meta.get("effective_options") or {}
    t = run.transitions
    reused = bool(len(t)) and "ort_exported" in t and not t["ort_exported"].fillna(False).any()
    from ortlab.engine.backends import has

    if not has(run.backend, "onnx_stages"):
        why = f"it is a {run.backend} burst: only ORTModule bursts export graphs"
    elif not options.get("save_onnx"):
        why = "it ran without save_onnx: run the burst with options={'save_onnx': True}"
    elif reused:
        why = ("ORT did not export in this burst (it reused the ORTModule of an earlier burst): see that "
               "burst's graphs")
    else:
        why = "ORT wrote none (the burst may have failed before the export)"
    return f"no ORTModule stage files for run {run.path.name}: {why}"
