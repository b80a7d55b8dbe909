"""A burst's progress as it runs: a tqdm bar per burst, and the step callbacks chained."""

from __future__ import annotations

from collections.abc import Callable


def chain(*callbacks: Callable[[dict], None] | None) -> Callable[[dict], None] | None:
    """One callback calling every given one (None when none is)."""
    live = [c for c in callbacks if c]
    if not live:
        return None
    return lambda row: [c(row) for c in live]


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
