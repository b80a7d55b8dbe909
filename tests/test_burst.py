"""Bursts with the real ORTModule on the CPU, in-process (the worker has its own tests)."""

import json
import os
import sys

import pytest
import torch

from ortlab import BurstError, Options, Session, load_run
from ortlab.engine import Engine
from ortlab.workload import ModelRef

# Parity tolerance on the loss: both backends do the same fp32 math in a different kernel order, which moves
# the loss by ~1e-6 over 10 steps here; 1e-4 leaves room for other CPUs while a real divergence (dropout on,
# a different op) moves it by 1e-2 and more (test_without_parity_losses_differ shows the tolerance can fail).
PARITY_RTOL = 1e-4


@pytest.mark.slow
@pytest.mark.ort
def test_parity_mode_pytorch_and_ortmodule_agree(demo_session):
    comparison = demo_session.compare(steps=10, parity=True, progress=False)
    losses = comparison.losses()
    assert comparison.pytorch.ok and comparison.ortmodule.ok
    assert len(losses) == 10
    assert (losses["abs_diff"] / losses["pytorch"].abs()).max() < PARITY_RTOL
    assert losses["pytorch"].iloc[-1] < losses["pytorch"].iloc[0]  # it trains
    summary = comparison.to_dict()
    assert summary["ort_init_s"] > 0 and summary["step_time_ratio"] > 0
    # the recommendation follows from the step times after warm-up and their noise, whichever way the machine's
    # timings went: a winner only when the interval of the step-time ratio leaves 1
    recommendation = comparison.recommendation()
    ratio = recommendation.ratios["ortmodule"]
    assert ratio["low"] <= ratio["value"] <= ratio["high"] and ratio["steps"] == 8  # 10 steps, 2 of warm-up
    if (summary["verdict"] or {}).get("status") == "agree":
        assert recommendation.told == ratio["told"], recommendation.line
        assert recommendation.backend == ("ortmodule" if ratio["high"] < 1 else "pytorch"), recommendation.line
    assert recommendation.line.startswith("recommendation: ")
    decision = comparison.decision().set_index("backend")
    assert decision.loc["ortmodule", "steps to break even"] == (
        "can't tell" if not ratio["told"] else "never (slower)" if ratio["low"] > 1 else
        decision.loc["ortmodule", "steps to break even"])


@pytest.mark.slow
@pytest.mark.ort
def test_without_parity_losses_differ(demo_session):
    comparison = demo_session.compare(steps=5, parity=False, progress=False)  # dropout 0.1 in the demo
    losses = comparison.losses()
    assert (losses["abs_diff"] / losses["pytorch"].abs()).max() > PARITY_RTOL


@pytest.mark.slow
@pytest.mark.ort
def test_rewrap_only_when_options_change(tmp_path):
    with Session(out=tmp_path, in_process=True) as s:
        first = s.burst("ortmodule", 2, progress=False)
        same = s.burst("ortmodule", 2, progress=False)
        changed = s.burst("ortmodule", 2, {"memory_opt_level": 1}, progress=False)
        back = s.burst("ortmodule", 2, progress=False)
    rows = s.transitions
    assert list(rows["action"]) == ["wrap", "reuse", "re-wrap", "re-wrap"]
    assert list(rows["ort_exported"]) == [True, False, True, True]  # from ORT's own exported-model record
    assert rows["reason"][0] == "first export"
    assert rows["changes"][2] == {"memory_opt_level": {"old": 0, "new": 1}}
    assert "memory_opt_level 0 -> 1" in rows["reason"][2]
    assert first.ort["overhead"]["export"] > 0 and "overhead" not in same.ort
    assert changed.transitions["action"].tolist() == ["re-wrap"]
    assert back.ok


@pytest.mark.slow
@pytest.mark.ort
def test_input_schema_and_requires_grad_changes_are_reasons(tmp_path):
    engine = Engine(ModelRef.of())
    x, _ = engine.workload.batch(0)
    wrapper = engine.backend("ortmodule").wrapper
    checking = Options(skipcheck_policy="SKIP_CHECK_DISABLED")
    with checking.applied():
        ort, row = wrapper.prepare(checking, False, x, "r1", tmp_path)
        ort(x).sum().backward()
    assert row.action == "wrap" and wrapper.exported_since_last_check()
    _, row = wrapper.prepare(checking, False, x.to(torch.int32), "r2", tmp_path)
    assert row.action == "re-export" and row.reason == "input schema changed"
    assert row.changes["input_schema"] == {"old": "Tensor[int64, rank 2]", "new": "Tensor[int32, rank 2]"}
    ort(x.to(torch.int32)).sum().backward()
    assert wrapper.exported_since_last_check()  # ORT really exported again
    engine.model.head.weight.requires_grad_(False)
    _, row = wrapper.prepare(checking, False, x.to(torch.int32), "r3", tmp_path)
    assert row.action == "rebuild gradient graph"
    assert row.changes["requires_grad"]["removed"] == ["head.weight"]


@pytest.mark.slow
@pytest.mark.ort
def test_default_skip_check_policy_means_no_reexport(tmp_path):
    """ORT 1.19.2's default ORTMODULE_SKIPCHECK_POLICY skips the re-export check after the first step: a new
    input dtype runs through the old graph. The transition row says so, and ORT's own state agrees."""
    engine = Engine(ModelRef.of())
    x, _ = engine.workload.batch(0)
    wrapper = engine.backend("ortmodule").wrapper
    ort, _ = wrapper.prepare(Options(), False, x, "r1", tmp_path)
    ort(x).sum().backward()
    assert wrapper.exported_since_last_check()
    _, row = wrapper.prepare(Options(), False, x.to(torch.int32), "r2", tmp_path)
    assert row.action == "re-export skipped" and "SKIP_CHECK_DISABLED" in row.reason
    ort(x.to(torch.int32)).sum().backward()
    assert not wrapper.exported_since_last_check()


@pytest.mark.slow
@pytest.mark.ort
def test_post_export_information(demo_session):
    info = demo_session.burst("ortmodule", 1, progress=False).ort["post_export"]
    assert info["user_inputs"] == ["idx"]
    assert info["dynamic_axes"]["idx"] == {"0": "idx_dim0", "1": "idx_dim1"}
    assert "_original_module.head.weight" in info["graph_inputs_requiring_grad"]


@pytest.mark.slow
@pytest.mark.ort
def test_features_table_parsed(tmp_path):
    with Session(out=tmp_path, in_process=True) as s:
        run = s.burst("ortmodule", 1, {"memory_opt_level": 1}, progress=False)
    features = {row["feature"]: row["on"] for row in run.ort["features"]}
    assert features["Memory Optimizer"] is True and features["Compute Optimizer"] is True
    assert features["TritonOp Enabled"] is False


def test_interrupt_keeps_the_steps_done(tmp_path):
    def interrupt_at_3(row):
        if row["step"] == 3:
            raise KeyboardInterrupt

    with Session(out=tmp_path, in_process=True) as s:
        run = s.burst("pytorch", 10, progress=False, on_step=interrupt_at_3)
    assert run.status == "interrupted"
    assert run.metrics["step"].tolist() == [0, 1, 2, 3]
    assert "interrupted by the user" in run.error


@pytest.mark.slow
@pytest.mark.ort
def test_multihead_attention_failure_is_reported_clearly(tmp_path):
    with Session(model_kwargs={"attention": "mha"}, out=tmp_path, in_process=True) as s:
        run = s.burst("ortmodule", 3, {"fallback_policy": "FALLBACK_DISABLE"}, progress=False)
    assert run.status == "failed"
    assert run.error.startswith("ortmodule burst failed in ORT's symbolic shape inference after export "
                                "(inferring Reshape node /_original_module/blocks/blocks.0/attn/Reshape_2) at step 0: "
                                "AssertionError")  # the node ORT was inferring, read from its frame
    assert "MultiheadAttention" in run.meta["hint"] and "explicit-attention" in run.meta["hint"]  # cause and fix
    assert "Traceback" in run.log and "_infer_Reshape" in run.log  # the full story stays in the log
    assert load_run(run.path).status == "failed"


def test_run_folder_round_trip(demo_session):
    run = demo_session.burst("pytorch", 3, seed=7, progress=False)
    again = load_run(run.path)
    assert again.meta == run.meta
    assert again.metrics.equals(run.metrics)
    from ortlab.stacks.table import ortmodule_unavailable

    ort = None if ortmodule_unavailable() else "1.19.2"  # the versions of the stack it ran on
    assert again.meta["config"]["seed"] == 7 and again.meta["versions"].get("onnxruntime-training") == ort
    # the stack it ran on, recorded: no reader guesses it from a version
    from ortlab.stacks.table import this_stack

    assert again.meta["stack"]["name"] == this_stack().value and again.meta["stack"]["python"] == sys.executable
    assert again.meta["stack"]["lock"] == os.environ.get("ORTLAB_LOCK")
    assert set(json.loads((run.path / "meta.json").read_text())) >= {"backend", "config", "model", "status", "device"}
    from ortlab import list_runs

    listed = list_runs(run.path.parent)
    assert str(run.path) in listed["path"].tolist()


def test_bad_burst_arguments_name_what_is_allowed(demo_session):
    with pytest.raises(BurstError, match="backend 'tensorflow' is not allowed; allowed: pytorch, ortmodule"):
        demo_session.burst("tensorflow", 1)
    with pytest.raises(BurstError, match="steps 0 is not allowed"):
        demo_session.burst("pytorch", 0)
    with pytest.raises(BurstError, match="optimizer 'fused_adam' is not available on the CPU"):
        demo_session.burst("pytorch", 1, optimizer="fused_adam", device="cpu", progress=False)
    if not torch.cuda.is_available():
        with pytest.raises(BurstError, match="device 'cuda' is not available here"):
            demo_session.burst("pytorch", 1, device="cuda", progress=False)
        with pytest.raises(BurstError, match="precision 'fp16' needs CUDA"):
            demo_session.burst("pytorch", 1, precision="fp16", progress=False)


def test_bursts_start_from_the_same_snapshot(demo_session):
    a = demo_session.burst("pytorch", 3, progress=False)
    b = demo_session.burst("pytorch", 3, progress=False)
    assert a.losses == b.losses


def test_parity_restores_dropout_and_determinism(demo_session):
    model = demo_session._engine.model
    demo_session.burst("pytorch", 1, parity=True, progress=False)
    assert model.drop.p == 0.1
    assert not torch.are_deterministic_algorithms_enabled()


@pytest.mark.cuda  # skipped without a GPU, saying why (tests/conftest.py)
def test_cuda_fp16_burst(tmp_path):
    pytest.importorskip("onnxruntime.training", reason="onnxruntime-training is not installed: no ORTModule here")
    with Session(out=tmp_path, in_process=True) as s:
        run = s.burst("ortmodule", 3, precision="fp16", device="cuda", progress=False)
    assert run.ok and run.meta["device"].startswith("cuda")
