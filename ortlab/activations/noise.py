"""The run-to-run noise floor, the convergence notes' first advice made automatic: repeat the PyTorch burst
with the same seed (it must match exactly) and with another seed, and measure per tensor and step how much
runs differ by themselves. A comparison against the floor reports only differences beyond that noise."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ortlab.activations.diff import compare
from ortlab.activations.errors import ActivationsError, FailedBurstError
from ortlab.activations.results import METRICS, ActivationDiff, Divergence
from ortlab.runs.run import RunStatus


@dataclass
class NoiseFloor:
    """`floor`: per tensor (phase and name) the largest relative difference of each statistic, over the steps,
    between the reference and its two repeats (columns floor_<metric>). `findings`: what is not deterministic,
    or still random in parity mode, named by tensor and module."""

    reference: str
    same_seed: ActivationDiff
    other_seed: ActivationDiff
    floor: Any  # DataFrame
    findings: list[str] = field(default_factory=list)

    @property
    def deterministic(self) -> bool:
        return self.same_seed.first is None

    @property
    def nondeterministic(self) -> Divergence | None:
        """The first tensor that differs between two bursts with the same seed."""
        return self.same_seed.first

    @property
    def seed_dependent(self) -> Divergence | None:
        """The first tensor that changes with the seed."""
        return self.other_seed.first

    def __str__(self) -> str:
        lines = [f"noise floor of {self.reference}: {self.same_seed.b} (same seed), "
                 f"{self.other_seed.b} (another seed)"]
        lines += self.findings or ["deterministic, and nothing changes with the seed: the floor is 0"]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"NoiseFloor({self.reference!r}, deterministic={self.deterministic}, "
                f"seed_dependent={self.seed_dependent.name if self.seed_dependent else None!r})")


def noise_floor(session, reference, other_seed: int | None = None) -> NoiseFloor:
    """Two more PyTorch bursts like `reference` (a PyTorch run that collected stats), one with its seed and
    one with `other_seed` (default: its seed + 1), through `session` (the Session of the model that made
    it)."""
    meta = reference.meta
    cfg = dict(meta.get("config") or {})
    from ortlab.engine.backends import has

    if not has(meta.get("backend"), "reference"):
        raise ActivationsError(f"the noise floor repeats a PyTorch run; {reference.path.name} is a "
                               f"{meta.get('backend')} run")
    if "stats" not in (cfg.get("collect") or {}):
        raise ActivationsError(f"{reference.path.name} did not collect statistics "
                               "(collect={'stats': {}})")
    seed = int(cfg.get("seed", 0))
    other = seed + 1 if other_seed is None else int(other_seed)
    if other == seed:
        raise ActivationsError(f"other_seed must differ from the reference's seed {seed}")
    steps = len(reference.metrics)
    kwargs = {k: cfg[k] for k in ("optimizer", "lr", "precision", "device", "parity") if k in cfg}
    with session.asking(reference.path, "noise floor"):  # ortlab's repeats, kept under the run they measure
        runs = [session.burst("pytorch", steps, cfg.get("options") or {}, seed=s, collect=cfg["collect"],
                              progress=False, name=f"pytorch-seed{s}", **kwargs) for s in (seed, other)]
    for run in runs:
        if run.status != RunStatus.OK:
            raise FailedBurstError(f"the noise-floor burst {run.path.name} ended {run.status}: {run.error}")
    same = compare(reference, runs[0], tolerances=0)
    moved = compare(reference, runs[1], tolerances=0)
    floor = _floor(same, moved)
    findings = _findings(same, moved, seed, other, bool(cfg.get("parity")))
    return NoiseFloor(reference.path.name, same, moved, floor, findings)


def _floor(*diffs: ActivationDiff):
    """Per tensor the largest difference over the steps and repeats: one repeat is one draw of the noise, and
    extreme statistics (min, max) vary a lot from draw to draw, so a per-step floor would be too tight."""
    import pandas as pd

    cols = [f"rel_{m}" for m in METRICS]
    both = pd.concat([d.table[["phase", "name", *cols]] for d in diffs])
    floor = both.groupby(["phase", "name"], sort=False)[cols].max()
    floor.columns = [c.replace("rel_", "floor_") for c in floor.columns]
    return floor.reset_index()


def _where(d: Divergence) -> str:
    module = f" (module {d.module})" if d.module and d.module != d.name else ""
    return f"step {d.step}, {d.phase}: {d.name}{module}"


def _findings(same: ActivationDiff, moved: ActivationDiff, seed: int, other: int, parity: bool) -> list[str]:
    out = []
    if same.first is not None:
        out.append(f"not deterministic: two PyTorch bursts with seed {seed} differ, first at "
                   f"{_where(same.first)} ({same.first.metric} {same.first.a:.6g} vs {same.first.b:.6g}). "
                   "Something there draws random numbers that no seed resets (its own torch.Generator, numpy "
                   "or Python random state) or runs a nondeterministic kernel; ORTModule cannot be held to "
                   "exact parity below this noise.")

    def where(d: Divergence) -> tuple:
        return d.step, d.phase, d.name

    if moved.first is not None and (same.first is None or where(moved.first) != where(same.first)):
        if parity:
            out.append(f"random in parity mode: with seed {other} instead of {seed} the run first changes at "
                       f"{_where(moved.first)}. Parity mode turns off every dropout (modules and F.dropout "
                       "calls), but this is another random op (torch.rand, bernoulli, randn, ...). PyTorch "
                       "and ORTModule draw different random numbers there, so they differ at least by this "
                       "floor.")
        else:
            out.append(f"with seed {other} the run first changes at {_where(moved.first)} (dropout and other "
                       "randomness): the floor is this run-to-run noise; parity mode removes module dropout.")
    return out
