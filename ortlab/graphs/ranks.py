"""Whether the ranks of a distributed burst exported the same graphs, in words for the views (the check itself, a
sha256 per stage file and rank, is ortlab.runs.stages.check: the engine runs it as the burst ends)."""

from __future__ import annotations

from typing import Any


def describe(info: dict[str, Any] | None) -> str:
    """One sentence for a view: whether the ranks' graphs are identical, else which files differ."""
    if not info:
        return ""
    ranks = ", ".join(map(str, info["ranks"]))
    if info["identical"]:
        return f"the {info['files']} stage files are identical on ranks {ranks} (sha256); shown: the lowest rank's"
    names = ", ".join(info["differ"])
    return f"the ranks' graphs DIFFER ({names}); shown: the lowest rank's (ranks {ranks}: see ranks/<r>/onnx)"
