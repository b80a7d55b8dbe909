"""Where ortlab keeps what it builds outside a checkout: one folder, one variable to move it."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Where ortlab keeps what it builds outside a checkout (bin/_env.sh's environments, the compiled kernels):
    ORTLAB_ENV_ROOT when set, else $XDG_CACHE_HOME/ortlab, else ~/.cache/ortlab. One variable moves all of it."""
    if os.environ.get("ORTLAB_ENV_ROOT"):
        return Path(os.environ["ORTLAB_ENV_ROOT"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ortlab"
