"""The ONNX stage files in a run's folder: which files are ORTModule stage files (`PREFIX_STAGE_MODE.onnx`, as ORT
1.19 names them with `save_onnx`), where a run keeps them, and whether the ranks of a distributed run exported the
same ones (a sha256 per stage file and rank: every rank exports its own ORTModule, and they must all run one graph).
Below the engine, which writes what the ranks exported into the run's meta (`rank_graphs`), and the graph views
(ortlab.graphs), which read them."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STAGES = ("torch_exported", "post_processed", "optimized_pre_grad", "optimized", "execution_model")
MODES = ("training", "inference")
_FILE = re.compile(rf"^(?P<prefix>.*)_(?P<stage>{'|'.join(STAGES)})_(?P<mode>{'|'.join(MODES)})\.onnx$")


@dataclass(frozen=True)
class StageFile:
    path: Path
    prefix: str
    stage: str
    mode: str


def find_stage_files(folder: str | Path) -> list[StageFile]:
    """Every `PREFIX_STAGE_MODE.onnx` directly in `folder`, in stage order (none when it is not a folder)."""
    folder = Path(folder)
    found = []
    for p in folder.glob("*.onnx") if folder.is_dir() else ():
        m = _FILE.match(p.name)
        if m:
            found.append(StageFile(p, m["prefix"], m["stage"], m["mode"]))
    return sorted(found, key=lambda f: (f.prefix, MODES.index(f.mode), STAGES.index(f.stage)))


def run_stage_folders(run) -> list[Path]:
    """Where a run's stage files may be, first choice first: its save_onnx_path, its onnx/ folder, its lowest
    rank's onnx/ folder (a distributed run: every rank exports; ranks/<r>/onnx), itself."""
    saved = (run.meta.get("effective_options") or {}).get("save_onnx_path")
    ranks = run.path / "ranks"
    lowest = sorted((p for p in ranks.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)) \
        if ranks.is_dir() else []
    return [*([Path(saved)] if saved else []), run.path / "onnx", *[p / "onnx" for p in lowest[:1]], run.path]


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check(rank_folders: dict[int, list[Path]]) -> dict[str, Any] | None:
    """{rank: the folders its stage files may be in} -> `identical`, how many stage `files`, the `ranks`, and per
    file that is not the same on every rank its digest per rank (None: that rank has no such file); None when no
    rank saved graphs."""
    found: dict[int, dict[str, str]] = {}
    for rank, folders in rank_folders.items():
        files = next((f for f in (find_stage_files(p) for p in folders) if f), [])
        found[rank] = {f.path.name: digest(f.path) for f in files}
    names = sorted({name for files in found.values() for name in files})
    if not names:
        return None
    differ = {name: {str(r): (files.get(name) or None) and files[name][:16] for r, files in found.items()}
              for name in names if len({files.get(name) for files in found.values()}) > 1}
    return {"identical": not differ, "files": len(names), "ranks": sorted(found), "differ": differ}
