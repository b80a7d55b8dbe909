"""Activation statistics summarized on the device (ortlab.activations.batched), the path CUDA tensors take: run on
CPU tensors here, row for row against the C kernel and numpy (nan, inf, empty, fp16/bf16, integers, float64, tensors
smaller than the samples), across reductions forced by a small budget, and in a real burst (ORTLAB_STATS_KERNEL=torch)
against the same burst summarized by the C kernel."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ortlab.activations import batched, read_stats
from ortlab.activations.summarize import Summarizer

K = 8


def tensors() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    nan, inf = float("nan"), float("inf")
    return [torch.randn(3, 1000, generator=g), torch.rand(7, generator=g) + 5, torch.zeros(5), torch.empty(0),
            torch.randn(64, 33, generator=g).t(),  # not contiguous
            torch.tensor([1.0, nan, inf, 0.0, -0.0, -3.0]), torch.full((4,), nan), torch.tensor([inf, -inf]),
            1e4 + torch.randn(100_000, generator=g),  # |mean| >> std: the centred sum needs its second pass
            torch.randn(50, generator=g).half(), torch.randn(50, generator=g).bfloat16(),
            torch.tensor([1.0, nan, 2.0], dtype=torch.float16), torch.arange(20), torch.tensor(3.5),
            torch.randn(30, dtype=torch.float64, generator=g), torch.tensor([True, False, True]),
            torch.randn(2, 3, generator=g)]  # fewer values than samples


def summarized(s: Summarizer, xs: list[torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
    """Rows and samples of `xs`, split over two destination arrays (as the collector's forward and backward)."""
    rows = [np.full((len(xs), 9), np.nan), np.full((len(xs), 9), np.nan)]
    samples = [np.full((len(xs), K), np.nan, np.float32), np.full((len(xs), K), np.nan, np.float32)]
    for i, x in enumerate(xs):
        s(x, rows[i % 2], samples[i % 2], i)
    s.flush()
    pick = np.arange(len(xs)) % 2
    return (np.stack([rows[p][i] for i, p in enumerate(pick)]), np.stack([samples[p][i] for i, p in enumerate(pick)]))


@pytest.mark.parametrize("budget", [batched.BUDGET, 1000])  # one reduction, or one every few tensors
def test_the_device_path_gives_the_rows_of_the_kernel_and_numpy(monkeypatch, budget):
    monkeypatch.setattr(batched, "BUDGET", budget)
    xs = tensors()
    device = Summarizer(K, batched=True)
    numpy_only = Summarizer(K)
    numpy_only.kernel = None
    on_device, device_samples = summarized(device, xs)
    for reference in (Summarizer(K), numpy_only):
        rows, samples = summarized(reference, xs)
        for i, x in enumerate(xs):
            np.testing.assert_allclose(on_device[i], rows[i], rtol=1e-5, atol=1e-6, err_msg=f"{i}: {x.dtype}")
            np.testing.assert_array_equal(device_samples[i], samples[i], err_msg=f"{i}: {x.dtype}")
    assert device.describe() == "torch"
    assert on_device[5, 6:9].tolist() == [1, 1, 2] and on_device[5, 1:4].tolist() == [-3.0, 1.0, -2.0]
    assert np.isnan(on_device[6, 1:3]).all() and on_device[6, 3:6].tolist() == [0, 0, 0]  # nothing finite
    assert on_device[3, 0] == 0 and np.isnan(on_device[3, 1:3]).all()  # empty: no min or max


def test_rows_wait_for_the_flush_and_a_cleared_step_writes_nothing():
    s = Summarizer(K, batched=True)
    rows, samples = np.full((1, 9), np.nan), np.full((1, K), np.nan, np.float32)
    s(torch.ones(10), rows, samples, 0)
    assert np.isnan(rows).all()  # no copy to the host per tensor
    s.clear()
    s.flush()
    assert np.isnan(rows).all()
    s(torch.ones(10), rows, samples, 0)
    s.flush()
    assert rows[0].tolist() == [10, 1, 1, 10, 10, 0, 0, 0, 0]


def test_a_burst_summarized_on_the_device_path_matches_the_kernel(tmp_path, monkeypatch):
    """The collector flushes before each optimizer step: a PyTorch burst (the demo, parity, 3 steps) gives the same
    stats.npz with the device path as with the C kernel."""
    from ortlab import Session

    runs = []
    for kernel in ("c", "torch"):
        monkeypatch.setenv("ORTLAB_STATS_KERNEL", kernel)
        with Session(out=tmp_path / kernel, in_process=True) as s:
            runs.append(s.burst("pytorch", 3, parity=True, progress=False, collect={"stats": {}}))
    assert all(r.ok for r in runs), [r.error for r in runs]
    kernel, device = (read_stats(r) for r in runs)
    assert len(kernel) == len(device) > 0
    assert kernel[["step", "phase", "name"]].equals(device[["step", "phase", "name"]])
    fields = ["numel", "min", "max", "mean", "std", "norm", "nan", "inf", "zero"]
    np.testing.assert_allclose(device[fields].to_numpy(float), kernel[fields].to_numpy(float), rtol=1e-4,
                               atol=1e-6)
    with np.load(runs[1].path / "stats.npz") as z:
        import json

        assert json.loads(str(z["meta"]))["summarizer"] == "torch"
        with np.load(runs[0].path / "stats.npz") as c:
            np.testing.assert_array_equal(z["forward_samples"], c["forward_samples"])


EXPECTED = [3, -3, 2, -2, 14, 14 - 4 / 3, 0, 0, 0]  # the row of [-1, 2, -3]


def test_a_tensor_changed_in_place_after_it_was_observed_keeps_its_observed_values():
    """The first time a slot is seen its tensor is copied and watched: one left alone is kept by reference in later
    steps (no copy), one changed in place (a ReLU with inplace=True after its module) is copied every step; a
    referenced tensor that changes after all loses its row (empty, counted) rather than report the changed values."""
    s = Summarizer(K, batched=True)
    rows, samples = np.full((2, 9), np.nan), np.full((2, K), np.nan, np.float32)

    def step(relu_after: bool, change_kept: bool = False) -> None:
        rows.fill(np.nan)
        kept, changed = torch.tensor([-1.0, 2.0, -3.0]), torch.tensor([-1.0, 2.0, -3.0])
        s(kept, rows, samples, 0)
        s(changed, rows, samples, 1)
        if relu_after:
            changed.relu_()  # in place, after it was observed
        if change_kept:
            kept.mul_(10)
        s.flush()

    for _ in range(3):
        step(relu_after=True)
        np.testing.assert_allclose(rows, [EXPECTED, EXPECTED])
    assert s.device._safe == {(id(rows), 0)} and s.device._changed == {(id(rows), 1)}
    step(relu_after=True, change_kept=True)
    assert np.isnan(rows[0]).all() and s.device.lost == 1  # its values were gone when the step was reduced
    step(relu_after=True, change_kept=True)
    np.testing.assert_allclose(rows[0], EXPECTED)  # copied from then on


def test_tensors_whose_memory_is_reused_behind_torchs_back_are_always_copied():
    s = Summarizer(K, batched=True)
    s.device.always_copy = True  # ORT's PythonOp outputs, CUDA graphs' pools
    rows, samples = np.full((1, 9), np.nan), np.full((1, K), np.nan, np.float32)
    for _ in range(2):
        t = torch.ones(4)
        s(t, rows, samples, 0)
        t.copy_(torch.zeros(4))
        s.flush()
        assert rows[0, 3] == 4 and not s.device._safe


def test_the_summarizer_names_only_the_paths_that_summarized():
    """A burst whose tensors never reached the C kernel (a CUDA burst: the kernel is compiled there all the same)
    is not described as "c+torch"; here float64 tensors go through numpy, and float32 ones through the kernel."""
    s = Summarizer(K, batched=False)
    if s.kernel is None:
        pytest.skip("the C kernel could not be compiled here")
    summarized(s, [torch.randn(10, dtype=torch.float64)])
    assert s.describe() == "numpy"
    summarized(s, [torch.randn(10)])
    assert s.describe() == "c+numpy"
