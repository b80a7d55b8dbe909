"""The one table every source of activation statistics becomes: ortlab's stats files and ORT's dump folders.

One row per tensor, step and phase. `seq` is the execution order within a step (forward rows first, then the
gradients, then the parameter gradients a rank recorded after all-reduce: phase "param_grad", kind
"parameter"); `order` is the tensor's forward position, shared by its two rows. Reading needs numpy and pandas
only, not torch, so `ortlab diff` and the widgets stay quick.
"""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ortlab.activations.errors import StatsFileError

STATS_FILE = "stats.npz"
FORMAT = "ortlab-stats-1"
FIELDS = ("numel", "min", "max", "sum", "sumsq", "css", "nan", "inf", "zero")  # a stats row, then samples
COLUMNS = ("step", "phase", "seq", "order", "name", "ort_name", "kind", "module", "cls", "shape", "dtype",
           "numel", "min", "max", "mean", "std", "norm", "nan", "inf", "zero", "samples", "std_reliable")
PHASES = ("forward", "backward")
PARAM_GRAD = "param_grad"  # a parameter's gradient after backward (and DDP's all-reduce), recorded by ranks


_TRACED = re.compile(r"tensor\((-?\d+)[^)]*\)")  # a dimension as the exporter's trace spells it: tensor(2)


def dims(shape: Any) -> str:
    """A shape as numbers, "2x64x32x32", whether its dimensions are ints or, under ORT's export, traced tensors
    (which print as "tensor(2)"; spelled from the text, so nothing is converted inside the trace)."""
    return dims_text("x".join(map(str, shape)))


def dims_text(text: str) -> str:
    """A recorded shape's text with every traced dimension ("tensor(2)") as its number: runs written before the
    collector spelled shapes as numbers compare like with like."""
    return _TRACED.sub(r"\1", text) if "tensor(" in text else text


def stats_path(source: Any) -> Path:
    """The stats file of a Run, a run folder or the file itself; of a distributed run, its lowest rank's."""
    path = Path(getattr(source, "path", source))
    if path.is_dir() and not (path / STATS_FILE).is_file() and (path / "ranks").is_dir():
        ranks = sorted((p for p in (path / "ranks").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
        path = ranks[0] if ranks else path
    if path.is_dir():
        path = path / STATS_FILE
    if not path.is_file():
        why = f"{path} does not exist: the run did not collect statistics"
        raise StatsFileError(f"{why} (burst with collect={{'stats': {{}}}})",
                             cli=f"{why} (burst with --collect stats)")
    return path


def read_stats(source: Any):
    """The statistics a burst collected (Run, run folder or stats.npz) as a table with COLUMNS."""
    import pandas as pd

    path = stats_path(source)
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            if meta.get("format") != FORMAT:
                raise StatsFileError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}")
            data = {k: z[k] for k in z.files}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        if isinstance(e, StatsFileError):
            raise
        raise StatsFileError(f"{path}: not a readable ortlab stats file ({type(e).__name__}: {e})") from None
    steps = data["step"]
    n = len(data["slot_name"])
    frames = []
    for p, phase in enumerate(PHASES):
        rows = data[phase]  # [step, tensor, field]
        if not rows.size:
            continue
        present = ~np.isnan(rows[:, :, 0])
        si, ti = np.nonzero(present)
        r = rows[si, ti]
        numel = r[:, 0]
        mean, std = _moments(r)
        order = data["slot_index"][ti]
        kind = data["slot_kind"][ti]
        ort_name = np.where(kind == "module", np.char.add(np.char.add(data["slot_cls"][ti], "_"), np.char.add(
            np.char.add(data["slot_ort_index"][ti].astype(str), "_"),
            np.char.add(data["slot_output_index"][ti].astype(str), "th_output"))), data["slot_name"][ti])
        frames.append(pd.DataFrame({
            "step": steps[si], "phase": phase,
            "seq": order if p == 0 else 2 * n - 1 - order,  # gradients flow back in reverse forward order
            "order": order, "name": data["slot_name"][ti], "ort_name": ort_name, "kind": kind,
            "module": data["slot_module"][ti], "cls": data["slot_cls"][ti], "shape": _shapes(data["slot_shape"])[ti],
            "dtype": data["slot_dtype"][ti], "numel": numel.astype(np.int64), "min": r[:, 1], "max": r[:, 2],
            "mean": mean, "std": std, "norm": np.sqrt(r[:, 4]), "nan": r[:, 6].astype(np.int64),
            "inf": r[:, 7].astype(np.int64), "zero": r[:, 8].astype(np.int64),
            "samples": list(data[f"{phase}_samples"][si, ti]), "std_reliable": True}))
    if "param_grad" in data:
        frames.append(_param_rows(data, steps, 2 * n))
    if not frames:
        return empty_table()
    df = pd.concat(frames, ignore_index=True)
    df = df.sort_values(["step", "seq"], ignore_index=True)
    df.attrs.update(source=str(path.parent), kind="ortlab", meta=meta)
    return df


def _shapes(shapes: np.ndarray) -> np.ndarray:
    """The recorded shapes as numbers (ortlab before 2026-11-27 wrote ORT's traced dimensions as "tensor(2)")."""
    return np.array([dims_text(str(s)) for s in shapes], dtype=str) if len(shapes) else shapes


def _moments(r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and std of stats rows (FIELDS): min, max and the sums are over the finite values."""
    finite_n = r[:, 0] - r[:, 6] - r[:, 7]
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.where(finite_n > 0, r[:, 3] / finite_n, np.nan)
        std = np.where(finite_n > 1, np.sqrt(r[:, 5] / (finite_n - 1)), np.nan)
    return mean, std


def _param_rows(data: dict[str, np.ndarray], steps: np.ndarray, first_seq: int):
    """Phase "param_grad": one row per parameter and recorded step, after every tensor of the step."""
    import pandas as pd

    rows = data["param_grad"]
    si, pi = np.nonzero(~np.isnan(rows[:, :, 0]))
    r = rows[si, pi]
    numel = r[:, 0]
    mean, std = _moments(r)
    names = data["param_name"][pi]
    module = np.array([name.rpartition(".")[0] for name in names], dtype=str)
    return pd.DataFrame({
        "step": steps[si], "phase": PARAM_GRAD, "seq": first_seq + pi, "order": first_seq + pi, "name": names,
        "ort_name": names, "kind": "parameter", "module": module, "cls": "", "shape": data["param_shape"][pi],
        "dtype": data["param_dtype"][pi], "numel": numel.astype(np.int64), "min": r[:, 1], "max": r[:, 2],
        "mean": mean, "std": std, "norm": np.sqrt(r[:, 4]), "nan": r[:, 6].astype(np.int64),
        "inf": r[:, 7].astype(np.int64), "zero": r[:, 8].astype(np.int64),
        "samples": list(data["param_grad_samples"][si, pi]), "std_reliable": True})


def empty_table():
    import pandas as pd

    return pd.DataFrame({c: pd.Series(dtype=object) for c in COLUMNS})
