"""Activation statistics on real bursts: PyTorch and ORTModule collect the same tensors, identical runs do not
diverge, an injected divergence is found at its module and step, ORT's own StatisticsSubscriber dumps are
read, compared and merged as ORT merges them."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from ortlab import Session
from ortlab.activations import StatsCollector, StatsError, compare, pythonop, read_dump, read_stats, tap
from ortlab.activations.legacy import std_reliable
from ortlab.activations.summarize import Summarizer

FACTORIES = Path(__file__).parent / "factories" / "activations.py"
STATS = {"stats": {}}
slow = pytest.mark.slow  # exports with ORTModule


def factory(name: str) -> str:
    return f"{FACTORIES}:{name}"


@pytest.fixture(scope="module")
def parity_pair(tmp_path_factory):
    """PyTorch and ORTModule bursts of the demo in parity mode, collecting statistics (6 steps)."""
    with Session(out=tmp_path_factory.mktemp("runs"), in_process=True) as s:
        c = s.compare(steps=6, parity=True, progress=False, collect=STATS)
    assert c.pytorch.ok and c.ortmodule.ok, (c.pytorch.error, c.ortmodule.error, c.ortmodule.meta)
    return c


@pytest.fixture(scope="module")
def pytorch_pair(tmp_path_factory):
    """Two PyTorch bursts of the demo in parity mode from the same start, collecting statistics (6 steps)."""
    with Session(out=tmp_path_factory.mktemp("runs"), in_process=True) as s:
        return [s.burst("pytorch", 6, parity=True, progress=False, collect=STATS) for _ in range(2)]


def test_no_public_name_is_a_submodule_and_import_stays_light():
    """Importing a submodule rebinds the package attribute of the same name: no exported name may be one. And
    `import ortlab.activations` (compare, the results) imports neither torch, pandas nor matplotlib."""
    import importlib
    import inspect
    import pkgutil
    import subprocess
    import sys

    import ortlab.activations as package

    modules = {m.name for m in pkgutil.iter_modules(package.__path__)}
    assert not modules & set(package.__all__)
    for name in sorted(modules):
        importlib.import_module(f"ortlab.activations.{name}")
    assert not any(inspect.ismodule(getattr(package, name)) for name in package.__all__)
    assert callable(package.compare) and callable(package.bisect) and callable(package.tap)
    code = ("import sys, ortlab.activations as a; a.compare, a.Tolerances, a.read_stats; "
            "print(sorted(m for m in ('torch', 'pandas', 'matplotlib', 'onnxruntime') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_bad_input_errors_are_input_errors():
    from ortlab.activations import ActivationsError, DumpError, StatsFileError, Tolerances
    from ortlab.errors import InputError

    assert issubclass(StatsError, InputError) and issubclass(DumpError, InputError)
    with pytest.raises(ActivationsError, match="tolerance for 'speed' is not known"):
        Tolerances.of({"speed": 1})
    with pytest.raises(StatsFileError, match="does not exist: the run did not collect statistics"):
        read_stats("/nonexistent/run")
    e = DumpError("a/step_0/X_forward", 3, "expected 'nan: .., inf: ..'")
    assert (e.file, e.line) == ("a/step_0/X_forward", 3)
    assert str(e) == "a/step_0/X_forward:3: expected 'nan: .., inf: ..'"


def test_a_run_without_statistics_says_how_to_collect_them_where_it_is_read(tmp_path, capsys):
    """In Python the fix is a keyword (collect={'stats': {}}), on the command line a flag (--collect stats)."""
    import json

    from ortlab.activations import StatsFileError, compare
    from ortlab.cli import main

    run = tmp_path / "20260101-000000-pytorch"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({"status": "ok", "backend": "pytorch"}))
    with pytest.raises(StatsFileError, match=r"collect=\{'stats': \{\}\}"):
        compare(run, run)
    assert main(["diff", str(run), str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "(burst with --collect stats)" in err and "collect={" not in err


@slow
@pytest.mark.ort
def test_both_backends_record_the_same_tensors_in_the_same_order(parity_pair):
    c = parity_pair
    pt, ort = read_stats(c.pytorch), read_stats(c.ortmodule)
    assert not c.ortmodule.meta.get("collector_errors")
    key = ["step", "phase", "seq", "name"]
    assert pt[key].equals(ort[key])
    forward = pt[(pt.step == 0) & (pt.phase == "forward")]
    names = forward["name"].tolist()
    assert names[:4] == ["tok", "drop", "blocks.0.ln1", "blocks.0.attn.qkv"] and names[-1] == "(root)"
    assert len(names) == 32  # every module output of the demo
    assert set(pt["step"]) == set(range(6)) and set(pt["phase"]) == {"forward", "backward"}
    qkv = forward.set_index("name").loc["blocks.0.attn.qkv"]
    assert qkv["shape"] == "8x64x192" and qkv["numel"] == 8 * 64 * 192
    probs = forward.set_index("name").loc["blocks.0.attn.attn_drop"]  # softmax over a causal mask
    assert probs["min"] == 0 and probs["max"] <= 1 and probs["zero"] == 8 * 4 * (64 * 63 // 2)
    assert math.isclose(probs["mean"], 1 / 64, rel_tol=1e-6)


@slow
@pytest.mark.ort
def test_parity_mode_shows_no_false_divergence(parity_pair):
    c = parity_pair
    diff = compare(c)
    assert diff.aligned_by == "name" and not diff.unmatched[diff.a] and not diff.unmatched[diff.b]
    assert diff.first is None, str(diff)
    assert diff.table["score"].max() < 0.1  # an order of magnitude inside the default tolerance
    assert diff.nonfinite == {diff.a: None, diff.b: None}


def test_two_identical_pytorch_runs_are_identical(pytorch_pair):
    first, again = pytorch_pair
    diff = compare(first, again, tolerances=0)
    assert diff.first is None
    assert (diff.table["score"] == 0).all()


@slow
@pytest.mark.ort
def test_injected_divergence_is_found_at_its_module_and_step(tmp_path):
    module = {"module": "blocks.1.mlp.0"}
    with Session(factory("injected"), {**module, "step": 3}, out=tmp_path, in_process=True) as s:
        ort = s.burst("ortmodule", 5, parity=True, progress=False, collect=STATS)
    with Session(factory("injected"), {**module, "step": None}, out=tmp_path, in_process=True) as s:
        pt = s.burst("pytorch", 5, parity=True, progress=False, collect=STATS)
    diff = compare(pt, ort)
    first = diff.first
    assert (first.step, first.phase, first.name, first.module) == (3, "forward", "blocks.1.mlp.0",
                                                                    "blocks.1.mlp.0")
    assert first.previous == "blocks.1.ln2"  # the tensor just before it still matched
    assert 0.005 < first.rel < 0.02  # x1.01
    assert "step 3, forward: blocks.1.mlp.0" in str(diff)
    assert diff.table[diff.table.step < 3]["score"].max() < 0.1
    slight_change = {"module": "blocks.0.attn.proj", "step": 2, "scale": 1.003}
    with Session(factory("injected"), slight_change, out=tmp_path, in_process=True) as s:
        slight = s.burst("pytorch", 3, parity=True, progress=False, collect=STATS)
    first = compare(pt, slight).first  # a 0.3% change is caught at its module and step
    assert (first.step, first.name, first.previous) == (2, "blocks.0.attn.proj", "blocks.0.attn.attn_drop")


@slow
@pytest.mark.ort
def test_ort_statistics_subscriber_dumps_are_read_and_compared(tmp_path):
    from tests.factories.activations import injected

    def dump(folder: str, ort: bool, inject_step):
        from onnxruntime.training.utils.hooks import StatisticsSubscriber, SubscriberManager

        from ortlab._ort import patch_label_hook_bug

        torch.manual_seed(0)
        w = injected("blocks.0.mlp.2", inject_step, n_layer=1, d_model=32, seq_len=16, batch_size=4,
                     dropout=0.0)
        runner = w.model
        if ort:
            from onnxruntime.training.ortmodule import DebugOptions, LogLevel, ORTModule

            patch_label_hook_bug()
            runner = ORTModule(w.model, DebugOptions(log_level=LogLevel.WARNING))
        subscriber = StatisticsSubscriber(str(tmp_path / folder), override_output_dir=True)
        SubscriberManager().subscribe(runner, [subscriber])
        opt = torch.optim.SGD(w.model.parameters(), lr=0.1)
        for step in range(3):
            x, y = w.batch(step)
            w.loss(runner(x), y).backward()
            opt.step()
            opt.zero_grad()
        return w.model

    model = dump("pt", False, None)
    dump("ort", True, 2)
    pt = read_dump(tmp_path / "pt")
    assert not pt.attrs["errors"]
    assert sorted(set(pt["step"])) == [0, 1, 2] and len(pt) == 3 * 2 * 19  # 19 modules, forward and backward
    row = pt[(pt.step == 0) & (pt.name == "Linear_13_0th_output") & (pt.phase == "forward")].iloc[0]
    assert row["shape"] == "4x16x128" and row["dtype"] == "float32"
    assert not row["std_reliable"] and math.isnan(row["norm"])  # ORT's bucketed std: wrong for a nonzero mean
    layer_norm = pt[(pt.name == "LayerNorm_5_0th_output") & (pt.phase == "forward")].iloc[0]
    assert layer_norm["std_reliable"] and math.isclose(layer_norm["std"], 1.0, rel_tol=1e-3)

    diff = compare(tmp_path / "pt", tmp_path / "ort")
    first = diff.first
    assert (first.step, first.phase, first.name) == (2, "forward", "Linear_15_0th_output")  # blocks.0.mlp.2
    named = compare(tmp_path / "pt", tmp_path / "ort", model=model).first
    assert (named.name, named.module, named.previous) == ("blocks.0.mlp.2", "blocks.0.mlp.2",
                                                          "blocks.0.mlp.1")


@pytest.mark.ort
def test_ortlab_run_and_ort_dump_compare_by_ort_names(pytorch_pair, tmp_path):
    """An ortlab run against a dump ORT's subscriber wrote of the same training: tensors pair up by ORT's
    names."""
    from onnxruntime.training.utils.hooks import StatisticsSubscriber, SubscriberManager

    from ortlab.demo import gpt

    run, _ = pytorch_pair
    torch.manual_seed(0)  # the session built the demo after the same seed: the same initial weights
    w = gpt(dropout=0.0)
    subscriber = StatisticsSubscriber(str(tmp_path / "pt"), override_output_dir=True)
    SubscriberManager().subscribe(w.model, [subscriber])
    opt = torch.optim.AdamW(w.model.parameters(), lr=1e-3)
    for step in range(2):
        x, y = w.batch(step)
        w.loss(w.model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    diff = compare(run, tmp_path / "pt", steps=[0, 1])
    assert diff.aligned_by == "ORT name"
    assert set(diff.table["name"]) >= {"tok", "blocks.1.mlp.0", "(root)"}
    assert diff.first is None, str(diff)


def test_std_is_right_for_any_mean_and_counts_nonfinite():
    s = Summarizer(4)
    g = torch.Generator().manual_seed(0)
    x = 1e4 + torch.randn(100_000, generator=g)
    rows, srows = np.full((1, 9), np.nan), np.full((1, 4), np.nan, np.float32)
    row, samples = rows[0], srows[0]
    s(x, rows, srows, 0)
    n = row[0]
    std = math.sqrt(row[5] / (n - 1))
    exact = x.double().std().item()
    assert abs(std - exact) / exact < 1e-4
    assert samples[0] == x[0].item() and samples[-1] == x[-1].item()
    y = torch.tensor([1.0, float("nan"), float("inf"), 0.0, -0.0, -3.0])
    s(y, rows, srows, 0)
    assert row[6:9].tolist() == [1, 1, 2]  # nan, inf, zeros (-0.0 is a zero)
    assert row[1] == -3.0 and row[2] == 1.0 and row[3] == -2.0  # min, max, sum of the finite values
    half = torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16)
    s(half, rows, srows, 0)
    assert row[3] == 6.0 and math.isclose(math.sqrt(row[5] / 2), 1.0)
    # ORT's bucketed formula: sqrt(std^2 + n(n-1) mean^2)
    ort_std = math.sqrt(exact**2 + n * (n - 1) * x.double().mean().item() ** 2)
    assert not std_reliable(ort_std, x.mean().item(), x.min().item(), x.max().item(), int(n), "float32")
    assert std_reliable(exact, 0.0, -5.0, 5.0, 1000, "float32")
    assert not std_reliable(11.0, 0.0, -5.0, 5.0, 1000, "float32")  # larger than any std of values in [-5, 5]


@slow
@pytest.mark.ort
def test_structured_outputs_and_taps_in_both_backends(tmp_path):
    with Session(factory("structured"), out=tmp_path, in_process=True) as s:
        c = s.compare(steps=2, parity=True, progress=False, collect=STATS)
    assert c.ortmodule.ok and not c.ortmodule.meta.get("collector_errors"), c.ortmodule.error
    pt, ort = read_stats(c.pytorch), read_stats(c.ortmodule)
    names = pt[(pt.step == 0) & (pt.phase == "forward")]["name"].tolist()
    assert names == ["emb", "split.lin", "split:0.first", "split:0.second", "mixer_product", "mix.lin",
                     "mix:0.hidden", "mix:0.extra.gate", "mix:1.key_cache.0", "head", "(root):logits",
                     "(root):gate"]
    assert pt[pt.name == "mixer_product"]["kind"].iloc[0] == "tap"
    ort_names = ort[(ort.step == 0) & (ort.phase == "forward")]["name"].tolist()
    assert ort_names == [n for n in names if n != "mix:1.key_cache.0"]  # the export prunes a detached cache
    diff = compare(c)
    assert diff.first is None, str(diff)
    grads = pt[(pt.phase == "backward") & (pt.step == 0)]["name"].tolist()
    assert "mixer_product" in grads and "mix:1.key_cache.0" not in grads  # it does not require grad


def test_step_range_module_filter_and_cleanup(tmp_path):
    with Session(out=tmp_path, in_process=True) as s:
        stats = {"modules": ["blocks.1.*"], "steps": [1, 5, 2], "grads": False, "samples": 3}
        run = s.burst("pytorch", 5, parity=True, progress=False, collect={"stats": stats})
        model = s._engine.model
    t = read_stats(run)
    assert sorted(set(t["step"])) == [1, 3]
    assert set(t["phase"]) == {"forward"}
    assert all(n.startswith("blocks.1.") for n in t["name"]) and "blocks.1.attn.qkv" in set(t["name"])
    assert len(t["samples"].iloc[0]) == 3
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert pythonop.active() is None
    x = torch.ones(2)
    assert tap("outside", x) is x


def test_a_pytorch_step_that_records_nothing_runs_without_hooks(tmp_path):
    """A module with forward hooks takes torch's slower call path: steps outside `steps` must not pay for it."""
    with Session(out=tmp_path, in_process=True) as s:
        hooked = []

        def on_step(row):
            hooked.append(any(m._forward_hooks for m in s._engine.model.modules()))

        run = s.burst("pytorch", 5, parity=True, progress=False, on_step=on_step,
                      collect={"stats": {"steps": [1, 5, 2]}})
    assert sorted(set(read_stats(run)["step"])) == [1, 3]
    # after step k ended: the hooks stay only when step k + 1 records (step 1); step 3 registers them again
    assert hooked == [True, False, False, False, False]


def test_gradient_rows_live_with_the_models_own_tensor_hooks(tmp_path):
    """The collector hooks gradients without torch's handles (see collect._grad_hook): the model's own hooks, added
    after or before it on the same tensors, must still run, once, and in registration order."""
    with Session(factory("own_grad_hooks"), out=tmp_path, in_process=True) as s:
        run = s.burst("pytorch", 3, progress=False, collect=STATS)
        model = s._engine.model
    assert run.ok, run.error
    assert model[0].calls == 2 * 3
    t = read_stats(run).set_index(["step", "phase", "name"])
    expected = 2 * 3 * float(model[1].weight.sum())
    for step in range(3):
        for name in ("0", "0.lin"):
            row = t.loc[(step, "backward", name)]
            assert row["mean"] * row["numel"] == pytest.approx(expected, rel=1e-5)


def test_bad_collector_arguments_name_what_is_allowed(tmp_path):
    with pytest.raises(StatsError, match="stats steps 'all' is not allowed"):
        StatsCollector(steps="all")
    with pytest.raises(StatsError, match="stats samples -1 is not allowed"):
        StatsCollector(samples=-1)
    with Session(out=tmp_path, in_process=True) as s:
        run = s.burst("pytorch", 1, progress=False, collect={"stats": {"modules": "encoder.*"}})
    assert run.status == "failed" and "match no module of the model" in run.error


def test_t5_cache_outputs_are_recorded_and_parity_reaches_its_functional_dropout(tmp_path):
    """ORT's StatisticsSubscriber fails on T5 (transformers 4.51) with "Unsupported flatten data type:
    EncoderDecoderCache"; ortlab records the tensors inside. T5's attention calls F.dropout, which parity mode
    turns off too: its noise floor is 0."""
    pytest.importorskip("transformers")
    from ortlab.activations import noise_floor

    with Session(factory("tiny_t5"), out=tmp_path, in_process=True) as s:
        run = s.burst("pytorch", 2, parity=True, progress=False, collect=STATS)
        floor = noise_floor(s, run)
    assert run.ok and not run.meta.get("collector_errors")
    names = set(read_stats(run)["name"])
    # tensors inside the cache object are recorded, under whatever names this transformers gives its cache
    assert any("cache" in name.partition(":")[2].lower() for name in names), sorted(names)[:20]
    assert "(root):encoder_last_hidden_state" in names
    assert floor.deterministic and floor.seed_dependent is None, str(floor)
    assert not floor.findings


@slow
@pytest.mark.ort
def test_ortmodule_wraps_follow_the_instrumentation(tmp_path):
    """A stats burst reuses an ORTModule exported with the same instrumentation (its PythonOps still report),
    and re-wraps when the module filter changes or statistics are no longer collected."""
    with Session(model_kwargs={"n_layer": 1}, out=tmp_path, in_process=True) as s:
        first = s.burst("ortmodule", 2, parity=True, progress=False, collect=STATS)
        again = s.burst("ortmodule", 2, parity=True, progress=False, collect=STATS)
        narrow = s.burst("ortmodule", 2, parity=True, progress=False,
                         collect={"stats": {"modules": "blocks.0.mlp*"}})
        plain = s.burst("ortmodule", 2, parity=True, progress=False)
    assert list(s.transitions["action"]) == ["wrap", "reuse", "re-wrap", "re-wrap"]
    assert "instrumentation" in s.transitions["changes"][2]
    a, b = read_stats(first), read_stats(again)
    assert a[["step", "phase", "name"]].equals(b[["step", "phase", "name"]])
    assert compare(first, again, tolerances=0).first is None  # the same start, the same graph: identical
    assert set(read_stats(narrow)["name"]) == {"blocks.0.mlp", "blocks.0.mlp.0", "blocks.0.mlp.1",
                                               "blocks.0.mlp.2", "blocks.0.mlp.3"}
    assert plain.ok and not (plain.path / "stats.npz").exists()


def test_the_numpy_fallback_agrees_with_the_kernel():
    from ortlab.common.kernels import stats_kernel

    assert stats_kernel() is not None  # a C compiler is part of this environment
    fast, numpy_only = Summarizer(8), Summarizer(8)
    numpy_only.kernel = None
    g = torch.Generator().manual_seed(1)
    for x in (torch.randn(3, 1000, generator=g), torch.rand(7, generator=g) + 5, torch.zeros(5),
              torch.empty(0), torch.randn(64, 33, generator=g).t()):  # the last one is not contiguous
        rows = np.full((2, 9), np.nan)
        samples = np.full((2, 8), np.nan, np.float32)
        fast(x, rows, samples, 0)
        numpy_only(x, rows, samples, 1)
        np.testing.assert_allclose(rows[0], rows[1], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(samples[0], samples[1])


@slow
@pytest.mark.ort
def test_the_first_nan_or_inf_producer_is_named(tmp_path):
    kwargs = {"module": "blocks.0.mlp.0", "step": 1, "scale": 3e38}  # values beyond +-1.13 overflow
    with Session(factory("injected"), kwargs, out=tmp_path, in_process=True) as s:
        c = s.compare(2, parity=True, progress=False, collect=STATS)
    for run in (c.pytorch, c.ortmodule):
        t = read_stats(run)
        bad = t[(t.step == 1) & (t.name == "blocks.0.mlp.0") & (t.phase == "forward")].iloc[0]
        assert bad["inf"] > 0 and bad["nan"] == 0 and math.isfinite(bad["max"])  # max of the finite values
    diff = compare(c)
    for label in (diff.a, diff.b):
        nf = diff.nonfinite[label]
        assert (nf.step, nf.phase, nf.name, nf.previous) == (1, "forward", "blocks.0.mlp.0", "blocks.0.ln2")
    assert f"first nan/inf in {diff.a}: step 1, forward: blocks.0.mlp.0 has 0 nan and" in str(diff)


@slow
@pytest.mark.ort
def test_taps_run_in_orts_unsafe_mode_and_still_report(tmp_path):
    """Tap saves and changes nothing, so its PythonOps are exported with safe_run_mode=0 (no autograd bookkeeping
    around each call); the statistics they report are the PyTorch burst's."""
    import onnx

    from ortlab.runs.stages import find_stage_files, run_stage_folders

    with Session(model_kwargs={"n_layer": 1}, out=tmp_path, in_process=True) as s:
        ort = s.burst("ortmodule", 2, {"save_onnx": True}, parity=True, progress=False, collect=STATS)
        pt = s.burst("pytorch", 2, parity=True, progress=False, collect=STATS)
    files = [f for folder in run_stage_folders(ort) for f in find_stage_files(folder)
             if f.stage == "torch_exported" and f.mode == "training"]
    assert files, "save_onnx wrote no exported graph"
    taps = [n for n in onnx.load(str(files[0].path)).graph.node if n.op_type == "PythonOp"
            and onnx.helper.get_node_attr_value(n, "func_name").decode().endswith(".Tap")]
    assert taps and all(onnx.helper.get_node_attr_value(n, "safe_run_mode") == 0 for n in taps)
    assert compare(pt, ort).first is None


@pytest.mark.ort
def test_a_conv_nets_shapes_are_numbers_on_both_backends_so_no_divergence_is_a_spelling(tmp_path):
    """ORT's export traces a conv net's dimensions as tensors: its run once recorded "tensor(2)xtensor(8)x..."
    where PyTorch's said "2x8x...", and the first divergence was that spelling at the first conv."""
    from ortlab.activations.table import dims_text

    zoo = Path(__file__).resolve().parent / "factories" / "zoo.py"
    stats = {"stats": {"steps": 1}}
    with Session(f"{zoo}:batch_norm", out=tmp_path, in_process=True) as s:
        pt = s.burst("pytorch", 1, parity=True, progress=False, collect=stats)
        ort = s.burst("ortmodule", 1, parity=True, progress=False, collect=stats, fixes="auto")
    shapes = read_stats(ort)["shape"]
    assert set(shapes) == set(read_stats(pt)["shape"]) and "2x8x32x32" in set(shapes), sorted(set(shapes))
    diff = compare(pt, ort)
    assert float(diff.table["rel_shape"].max()) == 0 and (diff.first is None or diff.first.metric != "shape")
    assert dims_text("tensor(2)xtensor(8)xtensor(32)xtensor(32)") == "2x8x32x32"  # as runs recorded before read
