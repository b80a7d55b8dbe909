"""ORT StatisticsSubscriber dumps: ortlab's merge writes what ORT's merge_activation_summary writes, and the
reader survives generated malformed files, naming the file and line while reading the rest."""

from __future__ import annotations

import shutil
from argparse import Namespace
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ortlab.activations import ActivationsError, DumpError, StatsFileError, merge, read_dump
from ortlab.activations.legacy import parse_tensor_file


def _dump(folder: Path, ort: bool) -> None:
    """A StatisticsSubscriber folder of a tiny demo, 2 steps, on PyTorch or ORTModule."""
    from onnxruntime.training.utils.hooks import StatisticsSubscriber, SubscriberManager

    from ortlab.demo import gpt

    torch.manual_seed(0)
    w = gpt(n_layer=1, d_model=16, seq_len=8, batch_size=2, dropout=0.0)
    runner = w.model
    if ort:
        from onnxruntime.training.ortmodule import DebugOptions, LogLevel, ORTModule

        from ortlab._ort import patch_label_hook_bug

        patch_label_hook_bug()
        runner = ORTModule(w.model, DebugOptions(log_level=LogLevel.WARNING))
    SubscriberManager().subscribe(runner, [StatisticsSubscriber(str(folder), override_output_dir=True)])
    for step in range(2):
        x, y = w.batch(step)
        w.loss(runner(x), y).backward()


@pytest.fixture(scope="module")
def pt_dump(tmp_path_factory):
    """A folder with the PyTorch dump in `pt/`."""
    root = tmp_path_factory.mktemp("dumps")
    _dump(root / "pt", ort=False)
    return root


@pytest.fixture(scope="module")
def dumps(pt_dump):
    """The same folder with the ORTModule dump added in `ort/`."""
    _dump(pt_dump / "ort", ort=True)
    return pt_dump


@pytest.mark.slow  # exports with ORTModule
@pytest.mark.ort
def test_merge_writes_what_ort_merge_writes(dumps, tmp_path):
    from onnxruntime.training.utils.hooks.merge_activation_summary import generate_summaries_per_step

    generate_summaries_per_step(Namespace(pt_dir=str(dumps / "pt"), ort_dir=str(dumps / "ort"),
                                          output_dir=str(tmp_path / "theirs")))
    merge(dumps / "pt", dumps / "ort", tmp_path / "ours")
    theirs = sorted(p.relative_to(tmp_path / "theirs") for p in (tmp_path / "theirs").rglob("*.txt"))
    ours = sorted(p.relative_to(tmp_path / "ours") for p in (tmp_path / "ours").rglob("*.txt"))
    assert ours == theirs and len(ours) == 4
    for rel in ours:
        assert (tmp_path / "ours" / rel).read_bytes() == (tmp_path / "theirs" / rel).read_bytes()
    with pytest.raises(ActivationsError, match="already exists"):
        merge(dumps / "pt", dumps / "ort", tmp_path / "ours")
    with pytest.raises(StatsFileError, match=r"ort_dir .* is neither"):
        merge(dumps / "pt", tmp_path, tmp_path / "other")


def test_merge_renders_ortlab_runs_in_ort_layout(tmp_path):
    from ortlab import Session

    with Session(model_kwargs={"n_layer": 1}, out=tmp_path / "runs", in_process=True) as s:
        run = s.burst("pytorch", 2, parity=True, progress=False, collect={"stats": {}})
    out = merge(run.path, run.path, tmp_path / "merged")
    text = (out / "merge_pt" / "step_1_.txt").read_text()
    assert text.startswith("tok forward run shape: torch.Size([8, 64, 64]) dtype: torch.float32")
    rows = read_dump(_as_dump(out / "merge_pt" / "step_1_.txt", tmp_path / "reread"))
    assert not rows.attrs["errors"] and len(rows) == 2 * 19
    from ortlab.activations import read_stats

    ours = read_stats(run).query("step == 1").set_index(["name", "phase"])
    back = rows.set_index(["name", "phase"])
    for column in ("min", "max", "mean", "std"):  # the rendering parses back to the same numbers
        assert (back[column] == ours.loc[back.index, column]).all()


def _as_dump(merged: Path, folder: Path) -> Path:
    """Split a merged summary back into per-tensor files: ortlab's rendering parses as ORT's layout."""
    step = folder / "step_0"
    step.mkdir(parents=True)
    names = []
    for block in merged.read_text().split("================\n\n"):
        if block.strip():
            head = block.split(" run shape")[0].split(" ")
            name = f"{head[0]}_{head[1]}"
            names.append(name)
            (step / name).write_text(block if block.endswith("=\n") else block + "================\n")
    (step / "order.txt").write_text("".join(n + "\n" for n in names))
    return folder


@pytest.mark.ort
def test_a_broken_file_names_its_line_and_the_rest_is_read(pt_dump, tmp_path):
    copy = tmp_path / "pt"
    shutil.copytree(pt_dump / "pt", copy)
    victim = copy / "step_1" / "Linear_7_0th_output_forward"
    lines = victim.read_text().splitlines(True)
    victim.write_text("".join(lines[:2]) + lines[2][:5])  # cut inside the third line
    order = copy / "step_0" / "order.txt"
    order.write_text(order.read_text() + "Gone_99_0th_output_forward\n")
    table = read_dump(copy)
    errors = {Path(e.file).name: e for e in table.attrs["errors"]}
    assert errors["Linear_7_0th_output_forward"].line == 3
    assert "expected 'nan: .., inf: ..'" in str(errors["Linear_7_0th_output_forward"])
    assert str(errors["Gone_99_0th_output_forward"]).endswith("listed in order.txt but missing")
    complete = read_dump(pt_dump / "pt")
    assert len(table) == len(complete) - 1


def _sample_file(pt_dump) -> str:
    return (pt_dump / "pt" / "step_0" / "Linear_7_0th_output_forward").read_text()


mutations = st.one_of(
    st.tuples(st.just("truncate"), st.integers(min_value=0, max_value=10_000)),
    st.tuples(st.just("drop_line"), st.integers(min_value=0, max_value=40)),
    st.tuples(st.just("replace_line"), st.integers(min_value=0, max_value=40), st.text(max_size=40)),
    st.tuples(st.just("insert"), st.integers(min_value=0, max_value=10_000), st.text(max_size=10)),
    st.tuples(st.just("bytes"), st.binary(max_size=64)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutation=mutations)
@pytest.mark.ort
def test_malformed_tensor_files_fail_with_file_and_line(pt_dump, tmp_path, mutation):
    good = _sample_file(pt_dump)
    kind = mutation[0]
    path = tmp_path / "Linear_7_0th_output_forward"
    if kind == "truncate":
        path.write_text(good[: mutation[1] % (len(good) + 1)], encoding="utf-8")
    elif kind == "drop_line":
        lines = good.split("\n")
        del lines[mutation[1] % len(lines)]
        path.write_text("\n".join(lines), encoding="utf-8")
    elif kind == "replace_line":
        lines = good.split("\n")
        lines[mutation[1] % len(lines)] = mutation[2]
        path.write_text("\n".join(lines), encoding="utf-8", errors="surrogatepass")
    elif kind == "insert":
        at = mutation[1] % (len(good) + 1)
        path.write_text(good[:at] + mutation[2] + good[at:], encoding="utf-8", errors="surrogatepass")
    else:
        path.write_bytes(mutation[1])
    n_lines = len(path.read_bytes().split(b"\n"))
    try:
        row = parse_tensor_file(path)
    except DumpError as e:
        assert e.file == str(path)
        assert 0 <= e.line <= n_lines + 2
        assert str(e).startswith(str(path))
    else:  # the mutation left a well-formed file: its numbers parse
        assert row["numel"] >= 0 and row["phase"] in ("forward", "backward")
