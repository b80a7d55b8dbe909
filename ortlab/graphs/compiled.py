"""torch.compile's side of the Graphs view: the code inductor generated for a compile burst (kept in the run's
compiled/ folder), with its graph breaks and re-compilations, read without running anything."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ortlab.runs import files


def compiled_code(run: Any):
    """One row per generated file: its name, lines, the kernels and graph functions it defines."""
    import pandas as pd

    info = run.read_json("compile.json", {}) or {}
    rows = []
    for name in info.get("generated_code") or []:
        path = Path(run.path) / "compiled" / name
        if not path.is_file():
            continue
        text = files.text(path)
        kernels = sorted({m for m in re.findall(r"\b(cpp_fused_\w+|triton_\w+)", text)})
        rows.append({"file": name, "lines": text.count("\n") + 1, "kernels": len(kernels),
                     "first kernels": ", ".join(kernels[:4]), "path": str(path)})
    return pd.DataFrame(rows, columns=["file", "lines", "kernels", "first kernels", "path"])


def has_compiled_code(run: Any) -> bool:
    return bool((run.read_json("compile.json", {}) or {}).get("generated_code"))


def excerpt(path: str | Path, lines: int = 40) -> str:
    """The start of one generated file."""
    text = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    return "\n".join(text[:lines]) + (f"\n... ({len(text) - lines} more lines)" if len(text) > lines else "")
