"""Whether the ranks of a distributed burst exported the same graphs: every rank exports its own ORTModule, and
they must all run one graph. A sha256 per stage file and rank; `check` writes what differs."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from ortlab.graphs.files import find_stage_files


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


def describe(info: dict[str, Any] | None) -> str:
    """One sentence for a view: whether the ranks' graphs are identical, else which files differ."""
    if not info:
        return ""
    ranks = ", ".join(map(str, info["ranks"]))
    if info["identical"]:
        return f"the {info['files']} stage files are identical on ranks {ranks} (sha256); shown: the lowest rank's"
    names = ", ".join(info["differ"])
    return f"the ranks' graphs DIFFER ({names}); shown: the lowest rank's (ranks {ranks}: see ranks/<r>/onnx)"
