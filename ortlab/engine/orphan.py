"""Processes that end with the one that started them: ortlab's worker, the elastic agent of a distributed burst
and each of its ranks watch their parent, so that none outlives the kernel or command that started it (a parent
that dies, even by SIGKILL, tells its children nothing; they are only handed to another parent)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable


def on_parent_death(action: Callable[[], None], name: str, every_s: float = 0.5) -> None:
    """Call `action` on a daemon thread (named `name`) once this process's parent is gone, seen within `every_s`
    seconds as a change of os.getppid()."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        action()

    threading.Thread(target=watch, daemon=True, name=name).start()
