"""A burst's progress as it runs: a tqdm bar per burst, the step callbacks chained, and the line a panel shows
("step 330/6000 · 12 s · ~40 s left")."""

from __future__ import annotations

from collections.abc import Callable


def chain(*callbacks: Callable[[dict], None] | None) -> Callable[[dict], None] | None:
    """One callback calling every given one (None when none is)."""
    live = [c for c in callbacks if c]
    if not live:
        return None

    def call(row: dict) -> None:
        for c in live:
            c(row)

    return call


class Bar:
    """A tqdm bar over the burst's steps, the loss beside it."""

    def __init__(self, cfg):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=cfg.steps, desc=cfg.backend, unit="step", leave=True)

    def update(self, row: dict) -> None:
        self.bar.set_postfix(loss=f"{row['loss']:.4f}", refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def duration(seconds: float) -> str:
    """A duration as a person reads it: "12 s", "3.4 min", "1.2 h"."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


class Pace:
    """Where a run of steps stands, as one line: "step 330/6000 · 12 s · ~40 s left". The time left is the steps
    left times the median of the last steps (the first steps export, compile and warm up: not what the rest take);
    it is shown only while it means something (a second or more to go), and once the run has ended (`end`) the line
    says how it ended instead."""

    RECENT = 20

    def __init__(self, total: int, label: str = ""):
        import time

        self.total, self.label, self.done = total, label, 0
        self._clock = time.monotonic
        self._started = self._clock()
        self._times: list[float] = []
        self.ended: str | None = None  # "finished", "stopped"...: how the run ended (None while it runs)
        self._ended_at: float | None = None

    def step(self, row: dict | None = None) -> None:
        """One step ended (`row`: its metrics row; its step_time_s feeds the estimate)."""
        self.done += 1
        seconds = (row or {}).get("step_time_s")
        if self.done > 1 and isinstance(seconds, int | float) and seconds > 0:  # the first step exports: left out
            self._times = [*self._times[-(self.RECENT - 1):], float(seconds)]

    def end(self, how: str = "finished") -> None:
        """The run ended ("finished", "stopped", "failed"): no estimate from here, the time stands still."""
        if self.ended is None:
            self.ended, self._ended_at = how, self._clock()

    @property
    def elapsed(self) -> float:
        return (self._ended_at if self._ended_at is not None else self._clock()) - self._started

    def left(self) -> float | None:
        """Seconds left, from the recent steps (None before the second step: the first one exports; None once the
        run has ended)."""
        if not self._times or self.ended is not None:
            return None
        import statistics

        return statistics.median(self._times) * (self.total - self.done)

    def line(self) -> str:
        where = f"{self.label + ': ' if self.label else ''}"
        if self.ended is not None:
            return f"{where}{self.ended} at step {self.done}/{self.total} · {duration(self.elapsed)}"
        left = self.left()
        parts = [f"{where}step {self.done}/{self.total}", duration(self.elapsed)]
        if left is not None and self.done < self.total and left >= 1:  # "~0 s left" tells nothing
            parts.append(f"~{duration(left)} left")
        return " · ".join(parts)
