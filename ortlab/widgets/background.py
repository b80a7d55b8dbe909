"""What every panel that trains runs in the background shares: one worker thread at a time, so that the kernel
stays responsive (and Stop can be clicked) while a burst, a check or a tuning runs; `wait()` blocks for scripts and
tests; an exception is shown in the panel on one red line, never printed over the notebook."""

from __future__ import annotations

import html
import threading
from collections.abc import Callable
from typing import Any


def error_html(e: BaseException) -> str:
    """An exception as a panel shows it: its class and the first line of its message, in red."""
    text = f"{type(e).__name__}: {e}".splitlines()[0]
    return f"<span style='color:#c00'>{html.escape(text)}</span>"


class Background:
    """A mixin for a panel (before the widget class in its bases): `running`, `wait()`, and `_in_background`,
    which starts the panel's work on a daemon thread."""

    _thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        """Whether the panel's work is in progress."""
        return self._thread is not None and self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> None:
        """Block until the work in progress ends (or `timeout` seconds pass)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _in_background(self, target: Callable[..., None], *args: Any, wait: bool = False) -> None:
        """Run `target(*args)` on a new daemon thread (the caller checked `running`); `wait`: block until it ends."""
        self._thread = threading.Thread(target=target, args=args, daemon=True)
        self._thread.start()
        if wait:
            self.wait()
