"""Recompute plans with the real ORTModule on the CPU: read from ORT, what-if, choose, sweep, CLI, panel."""

import json

import pytest

from ortlab import BurstError, Session
from ortlab.account import memory
from ortlab.recompute import (
    PlanError,
    evaluate,
    plan_config,
    plan_sweep,
    plans,
    what_if,
    what_if_figure,
    write_config,
)

# dropout 0: recompute reruns the same kernels, so every plan set must reproduce the no-plan losses exactly;
# with dropout the recomputed graph draws other masks and the sweep says so instead.
MODEL = {"dropout": 0.0}


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    with Session("ortlab.demo:gpt", MODEL, out=tmp_path_factory.mktemp("runs"), in_process=True) as s:
        yield s


@pytest.fixture(scope="module")
def plan_run(session):
    run = session.burst("ortmodule", 2, {"save_onnx": True}, collect={"plans": {}}, progress=False)
    assert run.ok, run.error
    return run


@pytest.mark.slow
@pytest.mark.ort
def test_demo_model_yields_plans_with_positive_savings(plan_run):
    table = plans(plan_run)
    assert len(table) >= 3
    assert (table["saving_bytes"] > 0).all()
    assert set(table["type"]) <= {1, 2} and (table["frequency"] >= 1).all()
    assert list(table["plan"]) == list(range(1, len(table) + 1))
    assert table["saving_bytes"].is_monotonic_decreasing
    # this burst's shapes (batch 8, sequence 64) and ORT's own evaluation at its first batch agree
    assert table.attrs["dims"] == {"idx_dim0": 8, "idx_dim1": 64} == table.attrs["ort_dims"]
    assert (table["saving_bytes"] == table["ort_saving_bytes"]).all()
    # level 0 without a config applies nothing, and the saved execution graph has no recompute node
    assert not table["applied"].any() and table.attrs["memory_opt_level"] == 0
    assert table.attrs["execution_graph"]["recompute_nodes"] == 0
    assert "BiasGelu+:1:-1" in set(table["cluster_id"])  # the demo MLP's GELU activation


@pytest.mark.slow
@pytest.mark.ort
def test_what_if_matches_direct_evaluation(plan_run):
    table = plans(plan_run)
    dims = {"idx_dim0": 32, "idx_dim1": 128}
    out = what_if(plan_run, **dims)
    for raw, value in zip(table["raw_expr"], out["what_if_bytes"], strict=True):
        direct = eval(raw, {"__builtins__": {}}, dict(dims))  # ORT's unsimplified expression, plain Python
        assert value == pytest.approx(direct, rel=1e-12)
    same = what_if(table)
    assert (same["what_if_bytes"] == table["saving_bytes"]).all()
    only_batch = what_if(table, idx_dim0=16)  # the other dimension keeps the burst's value
    assert only_batch.attrs["dims"] == {"idx_dim0": 16, "idx_dim1": 64}
    assert (only_batch["ratio"][table["saving_expr"].str.contains("idx_dim0")] == 2).all()
    assert len(what_if_figure(out).axes) == 1
    with pytest.raises(PlanError, match=r"'batch' is not a symbol of these plans; known: idx_dim0, idx_dim1"):
        what_if(table, batch=4)
    with pytest.raises(PlanError, match=r"idx_dim0=0 is not allowed"):
        what_if(table, idx_dim0=0)
    for text in ("idx_dim0.__class__", "1.0.real", "__import__(1)"):  # plans.json is data: never code
        with pytest.raises(PlanError, match="not plain arithmetic"):
            evaluate(text, dims)


@pytest.mark.slow
@pytest.mark.ort
def test_invalid_plan_ids_are_rejected_with_the_valid_ones(plan_run, tmp_path):
    table = plans(plan_run)
    valid = [f"{n} = {c}" for n, c in zip(table["plan"], table["cluster_id"], strict=True)]
    for bad in ([99], ["NoSuchOp+:1"], ["nonsense"]):
        with pytest.raises(PlanError) as e:
            write_config(bad, tmp_path / "c.json", plans=table)
        assert all(v in str(e.value) for v in valid)
    with pytest.raises(PlanError, match="type 3 is not allowed"):
        plan_config(["BiasGelu+:3"], table)
    with pytest.raises(PlanError, match="count 0 is not allowed"):
        plan_config(["BiasGelu+:1:0"])
    with pytest.raises(PlanError, match="needs the plans table"):
        plan_config([1])
    assert not (tmp_path / "c.json").exists()  # nothing written for a bad id
    path = write_config([1, "BiasGelu+:1:1", table["cluster_id"][1]], tmp_path / "c.json", plans=plan_run)
    entries = json.loads(path.read_text())
    assert entries == list(dict.fromkeys([table["cluster_id"][0], "BiasGelu+:1:1", table["cluster_id"][1]]))


@pytest.mark.slow
@pytest.mark.ort
def test_sweep_chosen_plans_add_recompute_nodes_and_keep_the_loss(session, plan_run):
    sweep = plan_sweep(session, steps=2, top=1)
    t = sweep.table.set_index("set")
    table = plans(plan_run)
    top = table.iloc[0]
    single = f"plan 1: {top['cluster_id'].rsplit(':', 2)[0]}"
    assert list(t.index) == ["none", single, "all type 1", "level 1", "level 2"]
    assert (t["status"] == "ok").all()
    assert t.loc["none", "recompute_nodes"] == 0 and t.loc["none", "predicted_saving_mb"] == 0
    # one plan: recompute nodes only of that plan's operators, and ORT's predicted saving for it
    assert t.loc[single, "recompute_nodes"] > 0
    assert set(t.loc[single, "recompute_ops"]) <= set(top["subgraph"].strip("+").split("+"))
    assert t.loc[single, "predicted_saving_mb"] == pytest.approx(top["saving_mb"])
    for name in ("all type 1", "level 1", "level 2"):
        assert t.loc[name, "recompute_nodes"] > t.loc[single, "recompute_nodes"]
        assert t.loc[name, "predicted_saving_mb"] > t.loc[single, "predicted_saving_mb"]
    assert t["loss_equal"].all(), t["max_loss_rel_diff"]
    assert not [n for n in sweep.notes if "loss differs" in n or "not applied" in n]
    assert sweep.notes[0].startswith("memory: accounted_peak_mb is the most activation bytes alive")
    assert "process_peak_mb is the process's peak resident set" in sweep.notes[0]
    # The no-plan burst reused plan_run's ORTModule, which exported without the memory collector: its account
    # comes from the graph the plans collector names, and is the account of plan_run's own graph.
    assert "missing" in sweep.runs["none"].memory
    assert t.loc["none", "accounted_peak_mb"] * 2**20 == memory(plan_run).peak_activation_bytes
    check_accounted_savings(t, n_layer=2)
    assert (sweep.path / "sweep.json").exists()
    assert len(sweep.pareto().axes) == 1 and len(sweep.savings().axes) == 1
    assert "accounted" in sweep.pareto().axes[0].get_ylabel()


def check_accounted_savings(t, n_layer: int) -> None:
    """What the account says of the sweep's plan sets, against ORT's prediction (docs/recompute.md, "Measured
    by the account"). Savings are the no-plan set's minus the set's, in MB (2**20 bytes)."""
    assert t["accounted_exact"].all() and t["account_missing"].isna().all()
    assert t.loc["none", "accounted_saving_mb"] == 0 == t.loc["none", "stash_saving_mb"]
    assert t.loc["none", "accounted_stash_mb"] > 0
    for name in [n for n in t.index if n.startswith("plan ")]:
        row = t.loc[name]
        # a single plan: the stash falls by exactly ORT's prediction; the peak, in the last block's backward
        # where that block's recomputed tensor is alive again, by all blocks but that one
        assert row["stash_saving_mb"] == pytest.approx(row["predicted_saving_mb"], abs=1e-3)
        assert 0 < row["accounted_saving_mb"] <= row["stash_saving_mb"]
        if name.endswith(("BiasGelu+", ": FusedMatMul+")):  # the MLP's plans
            assert row["accounted_saving_mb"] == pytest.approx(row["stash_saving_mb"] * (n_layer - 1) / n_layer)
    level1 = t.loc["level 1"]
    # level 1: the peak falls, by less than the stash (the last block's recomputed tensors are alive again at
    # the peak) and less than ORT predicts; the stash by about ORT's prediction: ORT's estimate of the
    # LayerNormalization plan varies from run to run, from almost nothing to every occurrence's full output
    # (14% of the prediction at most on these models), and the account also sees its mean and inv_std go
    assert 0 < level1["accounted_saving_mb"] < level1["predicted_saving_mb"]
    assert level1["accounted_saving_mb"] < level1["stash_saving_mb"]
    assert level1["stash_saving_mb"] == pytest.approx(level1["predicted_saving_mb"], rel=0.2)
    assert level1["accounted_stash_mb"] < t.loc["none", "accounted_stash_mb"] / 10
    # all type 1 of the level-0 probe: the stash falls by ORT's prediction or more, the peak not at all: its
    # plans cross layers (the residual sums among them), so the whole forward reruns before the first
    # backward node and the peak is the no-plan peak
    every = t.loc["all type 1"]
    assert every["stash_saving_mb"] == pytest.approx(every["predicted_saving_mb"], rel=0.2)
    assert every["accounted_saving_mb"] == 0


@pytest.mark.slow
@pytest.mark.ort
def test_sweep_on_larger_activations_against_ort_prediction(tmp_path):
    model = {"dropout": 0.0, "n_layer": 3, "d_model": 128, "seq_len": 128, "batch_size": 8}
    with Session("ortlab.demo:gpt", model, out=tmp_path, in_process=True) as s:
        sweep = plan_sweep(s, steps=2, top=1)
    t = sweep.table.set_index("set")
    assert list(t.index) == ["none", "plan 1: BiasGelu+", "all type 1", "level 1", "level 2"]
    assert all(r.memory.get("kind") == "graph" and "peak_activation_bytes" in r.memory for r in sweep.runs.values())
    check_accounted_savings(t, n_layer=3)
    # level 1 on this model (batch 8, sequence 128, width 128): the peak from 32.8 MB to 13.7 MB
    assert t.loc["level 1", "accounted_peak_mb"] < t.loc["none", "accounted_peak_mb"] / 2


def test_pytorch_run_has_no_plans(session, tmp_path):
    with pytest.raises(BurstError, match=r"^collector 'plans' is not allowed on backend 'pytorch' \(it reads ORT's "
                       r"recompute plans\); allowed on: ortmodule$"):
        session.burst("pytorch", 1, collect={"plans": {}}, progress=False)
    run = session.burst("pytorch", 1, progress=False)  # a run without plans.json says why
    with pytest.raises(PlanError, match="PyTorch burst: plans exist only for ORTModule bursts"):
        plans(run)


def _cli(*argv):
    from ortlab.cli import main

    return main(list(argv))


@pytest.mark.slow
@pytest.mark.ort
def test_cli_plans_json_at_the_given_shapes(tmp_path, capsys):
    model = ["--model-arg", "batch_size=4", "--model-arg", "seq_len=32"]
    code = _cli("plans", *model, "--json", "--out", str(tmp_path))
    out = capsys.readouterr()
    assert code == 0, out.err
    data = json.loads(out.out)
    assert data["dims"] == {"idx_dim0": 4, "idx_dim1": 32}
    assert data["plans"] and all(p["saving_bytes"] > 0 for p in data["plans"])


@pytest.mark.slow
@pytest.mark.ort
def test_cli_sweep_json_reports_accounted_savings(tmp_path, capsys):
    model = ["--model-arg", "dropout=0", "--model-arg", "batch_size=4", "--model-arg", "seq_len=32"]
    code = _cli("plans", "--sweep", "--steps", "2", *model, "--json", "--out", str(tmp_path))
    out = capsys.readouterr()
    assert code == 0, out.err
    rows = {r["set"]: r for r in json.loads(out.out)["rows"]}
    assert "peak_mem_mb" not in rows["none"] and rows["none"]["process_peak_mb"] > 0
    assert rows["none"]["accounted_saving_mb"] == 0 and rows["none"]["accounted_exact"]
    applied = [r for r in rows.values() if r["recompute_nodes"]]
    assert len(applied) == len(rows) - 1
    # every set ORT applied keeps less for backward; every one but the level-0 probe's cross-layer set also
    # lowers the activation peak (docs/recompute.md, "Measured by the account")
    assert all(r["stash_saving_mb"] > 0 for r in applied)
    assert all(r["accounted_saving_mb"] > 0 for r in applied if r["set"] != "all type 1")


@pytest.mark.ort
def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys):
    assert _cli("plans", "--model-arg", "n_layer", "--out", str(tmp_path)) == 2
    assert _cli("plans", "--sweep", "--steps", "1", "--out", str(tmp_path)) == 2
    assert _cli("plans", "--model", "missing.py:make", "--out", str(tmp_path)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3
    assert "KEY=VALUE" in err[0] and "--steps 1 is not allowed" in err[1] and "missing.py" in err[2]


@pytest.mark.slow
@pytest.mark.ort
def test_panel_find_what_if_apply(session, capsys):
    from ortlab.widgets.recompute import RecomputePanel

    panel = RecomputePanel(session, steps=2)
    assert repr(panel) == "RecomputePanel(plans=0, checked=[], dims={}, running=False)"
    panel.apply(wait=True)
    assert "Find plans first" in panel.status.value
    panel.find(wait=True)
    n = len(panel.table)
    assert n >= 3 and len(panel.checkboxes.children) == n
    assert panel.dims == {"idx_dim0": 8, "idx_dim1": 64}
    panel.sliders.children[0].value = 32  # idx_dim0
    expected = what_if(panel.table, idx_dim0=32)["what_if_bytes"].iloc[0]
    # in MB, as every table of the Lab counts bytes (not 4.194e+06)
    assert f">{expected / 2**20:.4g}<" in panel.what_if_table.value and panel.what_if_plot.value
    assert "what if (MB)" in panel.what_if_table.value and "e+0" not in panel.what_if_table.value
    panel.checkboxes.children[0].value = True
    panel.apply(wait=True)
    assert panel.last_run.ok
    result = panel.apply_result.value
    top = panel.table["cluster_id"][0]
    assert result.startswith(f"ok: 1 plan(s) {top}; recompute nodes in the execution graph: ")
    assert "graph: 0;" not in result and "max relative difference 0.0e+00" in result  # dropout 0: same losses
    # the plan's saving from the memory account: the top plan lowers what the graph keeps for backward
    assert "accounted activation peak" in result and "kept for backward -" in result, result
    dims = "{'idx_dim0': 32, 'idx_dim1': 64}"
    assert repr(panel) == f"RecomputePanel(plans={n}, checked=[1], dims={dims}, running=False)"
    panel.sweep(wait=True)
    assert panel.last_sweep is not None and "level 2" in panel.sweep_table.value
    assert "accounted_saving_mb" in panel.sweep_table.value and "peak_mem_mb" not in panel.sweep_table.value
    assert all(image.value for image in panel.sweep_plots.children)
    assert capsys.readouterr().out == ""


@pytest.mark.slow
@pytest.mark.ort
def test_sweep_says_when_the_loss_differs(tmp_path):
    # dropout 0.1: the recomputed graph draws other dropout masks, so the loss check must fail and say so
    with Session("ortlab.demo:gpt", {"dropout": 0.1}, out=tmp_path, in_process=True) as s:
        sweep = plan_sweep(s, steps=2, sets={"none": [], "level 1": {"memory_opt_level": 1}})
    t = sweep.table.set_index("set")
    assert t.loc["none", "loss_equal"] and not t.loc["level 1", "loss_equal"]
    assert t.loc["level 1", "max_loss_rel_diff"] > 1e-4
    assert any(n.startswith("level 1: loss differs from 'none'") for n in sweep.notes)
