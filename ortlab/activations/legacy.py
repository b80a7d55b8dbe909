"""ORT's StatisticsSubscriber dump folders (`step_N/order.txt` + one text file per tensor): read them into
ortlab's table, and merge them into per-step summaries as ORT's merge_activation_summary does.

ORT's subscriber combines per-bucket std with the bucket *sum* where the formula needs the bucket mean, so for
one bucket it writes sqrt(std^2 + n(n-1) mean^2): right only when the mean is 0. The reader keeps ORT's value
and marks it `std_reliable=False` when it cannot be right (larger than any std of values in [min, max]) or
when that formula, if it was used, put more than rounding noise into it; comparisons skip those.
"""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from ortlab.activations.errors import ActivationsError, DumpError, StatsFileError
from ortlab.activations.table import COLUMNS, STATS_FILE, empty_table, read_stats

ORDER_FILE = "order.txt"
_STEP_DIR = re.compile(r"^step_(\d+)$")
_SUFFIX = re.compile(r"^(?P<base>.+)_(?P<phase>forward|backward)$")
_ORT_NAME = re.compile(r"^(?P<cls>.+)_(?P<index>\d+)_(?P<k>\d+)th_output$")
_NUM = r"[-+]?(?:nan|inf|\d+(?:\.\d*)?(?:e[-+]?\d+)?)"
_HEADER = re.compile(r"^(?P<depth>>*)(?P<name>.+) (?P<phase>forward|backward) run "
                     r"shape: torch\.Size\(\[(?P<shape>[\d, ]*)\]\) "
                     r"dtype: torch\.(?P<dtype>\w+) size: torch\.Size\(\[(?P<size>\d*)\]\)\s*$")
_STATS = re.compile(rf"^min: (?P<min>{_NUM}) max: (?P<max>{_NUM}), "
                    rf"mean: (?P<mean>{_NUM}), std: (?P<std>{_NUM})\s*$")
_COUNTS = re.compile(rf"^nan: (?P<nan>{_NUM}), inf: (?P<inf>{_NUM})\s*$")
_SIGNS = re.compile(rf"^neg: (?P<neg>{_NUM}|-), pos: (?P<pos>{_NUM}|-), zero: (?P<zero>{_NUM}),\s*$")
_SAMPLES_START = "samples(top 128): "
_END = "=" * 16
# ORT's bucketed formula is exact in float arithmetic only up to rounding; above this share of std^2 it is
# not.
_CONTAMINATION = 1e-6


def is_dump(path: Any) -> bool:
    """Whether `path` is a StatisticsSubscriber output folder (step_N folders with an order.txt)."""
    path = Path(path)
    return path.is_dir() and any((d / ORDER_FILE).is_file() for d in path.iterdir()
                                 if _STEP_DIR.match(d.name))


def _num(text: str) -> float:
    return float(text)


def parse_tensor_file(path: Path) -> dict[str, Any]:
    """One per-tensor file as a row of the table (without step and order), or DumpError naming its line."""
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except FileNotFoundError:
        raise DumpError(str(path), 0, "listed in order.txt but missing") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DumpError(str(path), 0, f"cannot be read ({type(e).__name__})") from None

    def fail(line_no: int, what: str) -> NoReturn:
        got = lines[line_no - 1] if 0 < line_no <= len(lines) else "end of file"
        shown = got if len(got) <= 60 else got[:57] + "..."
        raise DumpError(str(path), line_no, f"{what}; found {shown!r}")

    def match(line_no: int, pattern: re.Pattern, what: str) -> re.Match:
        if line_no > len(lines) or not (m := pattern.match(lines[line_no - 1])):
            fail(line_no, f"expected {what} (the file is truncated or malformed)")
        return m

    head = match(1, _HEADER, "the header 'NAME forward|backward run shape: ...'")
    stats = match(2, _STATS, "'min: .. max: .., mean: .., std: ..'")
    counts = match(3, _COUNTS, "'nan: .., inf: ..'")
    if len(lines) < 4 or not lines[3].startswith(_SAMPLES_START):
        fail(4, "expected 'samples(top 128): tensor([...])'")
    text, line_no = lines[3][len(_SAMPLES_START):], 4
    while not text.rstrip().endswith(")"):  # torch prints the samples over lines, the last ends in ")"
        line_no += 1
        if line_no > len(lines) or lines[line_no - 1].startswith(("neg:", _END)):
            fail(line_no, "expected the rest of the samples, ending in ')'")
        text += lines[line_no - 1]
    samples = _parse_samples(text)
    if samples is None:
        fail(4, "expected samples as 'tensor([v, v, ...])'")
    signs = match(line_no + 1, _SIGNS, "'neg: .., pos: .., zero: ..,'")
    if line_no + 2 > len(lines) or lines[line_no + 1].strip() != _END:
        fail(line_no + 2, f"expected the closing {_END}")
    shape = [int(v) for v in head["shape"].replace(" ", "").split(",") if v]
    numel = int(head["size"] or 0)
    if numel != math.prod(shape):
        fail(1, f"size {numel} does not match shape {shape}")
    row = {"name": head["name"], "phase": head["phase"], "depth": len(head["depth"]),
           "shape": "x".join(map(str, shape)), "dtype": head["dtype"], "numel": numel,
           **{k: _num(stats[k]) for k in ("min", "max", "mean", "std")},
           "nan": int(_num(counts["nan"])), "inf": int(_num(counts["inf"])), "zero": int(_num(signs["zero"])),
           "samples": samples}
    row["std_reliable"] = std_reliable(row["std"], row["mean"], row["min"], row["max"], numel, row["dtype"])
    return row


_TENSOR = re.compile(r"^tensor\(\[(?P<body>[^\]]*)\](?:,\s*\w+=[^)]*)*\)$", re.S)


def _parse_samples(text: str) -> np.ndarray | None:
    m = _TENSOR.match(text.strip())
    if not m:
        return None
    body = m["body"]
    try:
        values = [float(v) for v in body.replace("\n", " ").split(",") if v.strip()]
    except ValueError:
        return None
    return np.array(values, np.float32)


def std_reliable(std: float, mean: float, mn: float, mx: float, n: int, dtype: str) -> bool:
    """Whether ORT's std can be trusted: ORT computes none for integer tensors; no std of values in [min, max]
    exceeds (max-min)/2 * sqrt(n/(n-1)); and its bucketed formula gives sqrt(std^2 + n(n-1) mean^2), so when
    that term is more than rounding noise of the value (and no more than all of it, which would rule the
    formula out) the value is wrong."""
    if n < 2 or ("float" not in dtype and "half" not in dtype):
        return n < 2
    if not all(map(math.isfinite, (std, mean, mn, mx))):
        return False
    bound = (mx - mn) / 2 * math.sqrt(n / (n - 1))
    if std > bound * (1 + 1e-5) + 1e-30:
        return False
    share = n * (n - 1) * mean * mean / (std * std) if std > 0 else (0.0 if mean == 0 else math.inf)
    return not (_CONTAMINATION < share <= 1 + 1e-6)


def _ort_name_parts(name: str) -> tuple[str, int, int]:
    m = _ORT_NAME.match(name)
    return (m["cls"], int(m["index"]), int(m["k"])) if m else ("", -1, 0)


def read_dump(path: Any, model: Any = None):
    """A StatisticsSubscriber folder as ortlab's table. Files that are missing, truncated or malformed are
    listed in `table.attrs["errors"]` (DumpError: file, line, what) and the rest is read. With `model` (the
    nn.Module that was dumped) ORT's `Class_<n>_<k>th_output` names become module paths."""
    import pandas as pd

    root = Path(path)
    if not root.is_dir():
        raise StatsFileError(f"{root} is not a folder (expected a StatisticsSubscriber output folder)")
    steps = sorted((int(m[1]), d) for d in root.iterdir() if (m := _STEP_DIR.match(d.name)) and d.is_dir())
    if not steps:
        raise StatsFileError(f"{root} has no step_N folders: not a StatisticsSubscriber output folder")
    paths = _module_paths(model) if model is not None else {}
    rows, errors = [], []
    for step, folder in steps:
        order_path = folder / ORDER_FILE
        try:
            names = [n.strip() for n in order_path.read_text(encoding="utf-8").splitlines() if n.strip()]
        except (OSError, UnicodeDecodeError) as e:
            errors.append(DumpError(str(order_path), 0, f"cannot be read ({type(e).__name__})"))
            continue
        forward_pos: dict[str, int] = {}
        for seq, file_name in enumerate(names):
            m = _SUFFIX.match(file_name)
            if not m:
                errors.append(DumpError(str(order_path), seq + 1,
                                        f"{file_name!r} does not end in _forward or _backward"))
                continue
            try:
                row = parse_tensor_file(folder / file_name)
            except DumpError as e:
                errors.append(e.with_traceback(None))  # kept in the table: not its frames
                continue
            base = m["base"]
            if row.pop("name") != base or row["phase"] != m["phase"]:
                errors.append(DumpError(str(folder / file_name), 1,
                                        "the header names another tensor than the file"))
                continue
            if m["phase"] == "forward":
                forward_pos.setdefault(base, len(forward_pos))
            cls, index, k = _ort_name_parts(base)
            known = cls and paths.get(index, ("", ""))[1] == cls  # the module of that number and class
            module = paths[index][0] if known else base
            name = (module if k == 0 else f"{module}:{k}") if known else base
            row.pop("depth")
            rows.append({**row, "step": step, "seq": seq, "order": forward_pos.get(base, -1), "name": name,
                         "ort_name": base, "kind": "module" if cls else "tap", "module": module, "cls": cls,
                         "norm": _norm(row)})
    table = pd.DataFrame(rows) if rows else empty_table()
    if rows:
        missing = table["order"] < 0  # a gradient whose forward file is missing: after every forward tensor
        table.loc[missing, "order"] = len(table)
        table = table[list(COLUMNS)].sort_values(["step", "seq"], ignore_index=True)
    table.attrs.update(source=str(root), kind="ort-dump", errors=errors)
    return table


def _norm(row: dict) -> float:
    """The L2 norm, which ORT does not write: from mean and std when the std is right."""
    n, finite = row["numel"], row["numel"] - row["nan"] - row["inf"]
    if not row["std_reliable"] or finite < 1 or n != finite:
        return math.nan
    return math.sqrt(max((finite - 1) * row["std"] ** 2 + finite * row["mean"] ** 2, 0.0))


def _module_paths(model) -> dict[int, tuple[str, str]]:
    """ORT's module number -> (module path, class name)."""
    from ortlab.activations.collect import ROOT, ort_module_numbers

    names = {module: path or ROOT for path, module in model.named_modules()}
    numbers = ort_module_numbers(model)
    return {number: (names[module], type(module).__name__) for module, number in numbers.items()}


# --------------------------------------------------------------------------- merge


_MERGE_FOLDERS = ("merge_pt", "merge_ort")


def merge(pt_dir: Any, ort_dir: Any, output_dir: Any, overwrite: bool = False) -> Path:
    """Per-step summaries as ORT's merge_activation_summary writes them: `output_dir/merge_pt/step_N_.txt` and
    `merge_ort/step_N_.txt`, each the step's tensor files in the order of the PyTorch run's step_0/order.txt.
    Each side is an ORT dump folder or an ortlab run that collected stats (written in ORT's text layout)."""
    out = Path(output_dir)
    sources = [(Path(pt_dir), "pt_dir"), (Path(ort_dir), "ort_dir")]
    for src, name in sources:
        if not (is_dump(src) or (src / STATS_FILE).is_file()):
            raise StatsFileError(f"{name} {src} is neither a StatisticsSubscriber folder (step_N/order.txt) "
                                 f"nor an ortlab run with {STATS_FILE}")
        if src.resolve() == out.resolve() or out.resolve() in src.resolve().parents:
            raise ActivationsError(f"output_dir {out} is or contains {name} {src}: writing there would replace "
                                   "the input; choose another output_dir")
    if out.exists():
        if not overwrite:
            raise ActivationsError(f"output_dir {out} already exists; pass overwrite=True (--overwrite) to "
                                   "replace it")
        foreign = sorted(p.name for p in out.iterdir() if p.name not in _MERGE_FOLDERS) if out.is_dir() else [out.name]
        if foreign:
            raise ActivationsError(f"output_dir {out} holds more than an earlier merge ({', '.join(foreign[:5])}); "
                                   "overwrite replaces only a folder with merge_pt/ and merge_ort/")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    order = _reference_order(Path(pt_dir))
    for (src, _), dest in zip(sources, ("merge_pt", "merge_ort"), strict=True):
        target = out / dest
        target.mkdir()
        if is_dump(src):
            for folder in (d for d in src.iterdir() if d.is_dir()):
                with (target / f"{folder.name}_.txt").open("w", encoding="utf-8") as f:
                    for name in order:
                        file = folder / name
                        if name and file.is_file():
                            f.write(file.read_text(encoding="utf-8"))
                            f.write("\n")
        else:
            table = read_stats(src)
            for step, group in table.groupby("step"):
                texts = {f"{r.name}_{r.phase}": render(r) for r in group.itertuples(index=False)}
                with (target / f"step_{step}_.txt").open("w", encoding="utf-8") as f:
                    for name in order:
                        if name in texts:
                            f.write(texts[name])
                            f.write("\n")
    return out


def _reference_order(pt: Path) -> list[str]:
    if is_dump(pt):
        text = (pt / "step_0" / ORDER_FILE).read_text(encoding="utf-8")
        return [n.rstrip("\n") for n in text.splitlines(True)]
    table = read_stats(pt)
    first = table[table["step"] == table["step"].min()].sort_values("seq")
    return [f"{name}_{phase}" for name, phase in zip(first["name"], first["phase"], strict=True)]


def render(row) -> str:
    """One tensor's statistics in the layout of ORT's per-tensor files (our std is the right one; the samples
    are ortlab's evenly spaced ones, not the first 128 values)."""
    shape = ", ".join(row.shape.split("x")) if row.shape else ""
    samples = ", ".join(f"{v:.6e}" for v in row.samples if not math.isnan(v))
    return (f"{row.name} {row.phase} run shape: torch.Size([{shape}]) dtype: torch.{row.dtype} "
            f"size: torch.Size([{row.numel}]) \n"
            f"min: {row.min} max: {row.max}, mean: {row.mean}, std: {row.std} \n"
            f"nan: {row.nan}, inf: {row.inf}\n"
            f"samples(top 128): tensor([{samples}])\n"
            f"neg: -, pos: -, zero: {row.zero},\n"
            f"{_END}\n")
