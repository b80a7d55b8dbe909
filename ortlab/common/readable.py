"""What a person reads of a source file's path and of an error message: the path from its top-level package, and a
message's first line as a whole statement. Plain text, shared by the workload's errors, the export's blockers
and errors (ortlab.compat) and torch.compile's graph breaks (ortlab.engine.backends.compiled)."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path


def short_path(file: str) -> str:
    """A source file as a person reads it: from its top-level package ("transformers/models/bert/modeling_bert.py"),
    else relative to the working folder when inside it, else as it is."""
    path = Path(file)
    top = path.parent
    while (top / "__init__.py").is_file():
        top = top.parent
    if top != path.parent:
        return path.relative_to(top).as_posix()
    with contextlib.suppress(ValueError):
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    return file


_CLAUSE = re.compile(r"(?:,\s+but|,|;|\s+-)\s+[^,;()]*$")


def sentence(text: str) -> str:
    """A message's first line as a whole statement: a line that ends with ':' introduces what the next lines list
    (torch's "zeros() received an invalid combination of arguments - got (...), but expected one of:"), so it ends
    at its last complete clause instead; without one, the list is joined onto it (the whole message)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()] or [""]
    first = lines[0]
    if not first.endswith(":") or len(lines) == 1:
        return first
    cut = _CLAUSE.sub("", first[:-1])
    return cut if cut != first[:-1] else f"{first} {'; '.join(lines[1:])}"
