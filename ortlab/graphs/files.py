"""Which files are ORTModule stage files: `PREFIX_STAGE_MODE.onnx`, as ORT 1.19 names them (`save_onnx`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

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
