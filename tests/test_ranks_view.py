"""Distributed runs in the views: ranks compared as ranks (activations may differ, parameter gradients after
all-reduce must not), graph stages per rank, and the Lab's processes control, per-rank curves and logs.

The fast tests write rank folders as the ranks do (the real StatsCollector, real files); the slow one runs a real
2-rank ORTModule burst from the Lab (~30 s on 2 cores)."""

import json
from types import SimpleNamespace

import pytest
import torch

from ortlab.activations import StatsCollector, compare
from ortlab.cli import main as cli
from ortlab.errors import InputError
from ortlab.graphs import load as load_graphs
from ortlab.graphs.ranks import describe
from ortlab.runs.run import load_run, write_json
from ortlab.runs.stages import check
from ortlab.widgets.log_panel import LogPanel


def write_rank(run_dir, rank, grads, steps=2, world=2):
    """One rank's folder as a rank writes it: its meta and the stats of a tiny model trained on this rank's
    data; `grads(step, name, grad)` is what the rank holds after the all-reduce."""
    folder = run_dir / "ranks" / str(rank)
    folder.mkdir(parents=True)
    write_json(folder / "meta.json", {"status": "ok", "backend": "pytorch", "rank": rank, "world_size": world})
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    collector = StatsCollector()
    collector.start(SimpleNamespace(model=model), SimpleNamespace(backend="pytorch"), folder)
    for step in range(steps):
        collector.step_begin(step)
        x = torch.randn(5, 4, generator=torch.Generator().manual_seed(100 * rank + step))  # this rank's data
        model(x).pow(2).mean().backward()
        for name, p in model.named_parameters():
            p.grad = grads(step, name, torch.full_like(p, 0.1 * (step + 1)))
        collector.on_parameter_grads(model.named_parameters())
        collector.step_end(step)
        model.zero_grad()
    collector.finish(SimpleNamespace(model=model), SimpleNamespace(backend="pytorch"), folder, "ok")
    return folder


def distributed_run(tmp_path, rank1_grads=lambda step, name, g: g):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_json(run_dir / "meta.json", {"status": "ok", "backend": "pytorch", "nproc": 2})
    write_rank(run_dir, 0, lambda step, name, g: g)
    write_rank(run_dir, 1, rank1_grads)
    return run_dir


def test_ranks_differ_by_data_without_a_divergence_when_their_parameter_gradients_are_equal(tmp_path):
    run_dir = distributed_run(tmp_path)
    diff = compare(load_run(run_dir), ranks=(0, 1))
    assert diff.ranks == (0, 1) and not diff.diverged
    forward = diff.table[diff.table["phase"] == "forward"]
    assert (forward["score"] > 1).any() and forward["expected"].all()  # the data differ: expected
    params = diff.table[diff.table["phase"] == "param_grad"]
    assert set(params["name"]) == {"0.weight", "0.bias", "2.weight", "2.bias"} and set(params["step"]) == {0, 1}
    report = diff.report()
    assert "differ (expected, not a divergence" in report
    assert "parameter gradients after all-reduce: 4 parameters x 2 steps, all equal" in report
    # the same from the two rank folders, and from the command line
    assert not compare(run_dir / "ranks" / "0", run_dir / "ranks" / "1").diverged
    assert cli(["diff", str(run_dir), "--ranks", "0", "1"]) == 0


def test_the_activations_tab_offers_each_rank_and_compares_two_as_ranks(tmp_path):
    from ortlab.widgets.activations import ActivationsPanel

    def off(step, name, g):
        return g * 2 if (step, name) == (0, "0.bias") else g

    run = load_run(distributed_run(tmp_path, off))
    panel = ActivationsPanel(lambda: [run])
    labels = [label for label, _ in panel.a.options]
    assert labels == ["run (pytorch) rank 0", "run (pytorch) rank 1"]
    panel.a.value, panel.b.value = (str(run.path / "ranks" / str(r)) for r in (0, 1))
    diff = panel.compare()
    assert diff.ranks == (0, 1) and (diff.first.step, diff.first.name) == (0, "0.bias")
    assert "differ (expected, not a divergence" in panel.status.value
    assert "first divergence: step 0, param_grad: 0.bias" in panel.status.value
    assert panel.tensor.value == ("param_grad", "0.bias") and "param grad 0.bias" in dict(panel.tensor.options)


def test_a_parameter_gradient_that_differs_between_ranks_is_the_divergence_naming_it_and_its_step(tmp_path, capsys):
    def off(step, name, g):
        return g + 1e-6 if (step, name) == (1, "2.weight") else g

    run_dir = distributed_run(tmp_path, off)
    diff = compare(run_dir / "ranks" / "0", run_dir / "ranks" / "1")
    assert diff.diverged
    first = diff.first
    assert (first.step, first.phase, first.name) == (1, "param_grad", "2.weight")
    assert "parameter gradients after all-reduce DIFFER: 1 of 4 parameters, first 2.weight at step 1" in str(diff)
    assert diff.top(5)["name"].tolist() == ["2.weight"]  # activations are not listed as differences
    assert diff.to_dict()["ranks"] == [0, 1] and "DIFFER" in diff.to_dict()["rank_notes"][1]
    assert cli(["diff", str(run_dir), "--ranks", "0", "1"]) == 1
    assert "step 1, param_grad: 2.weight" in capsys.readouterr().out
    # a tolerance given applies to the parameter gradients instead of equality
    assert not compare(run_dir, ranks=(0, 1), tolerances=1e-3).diverged


def test_rank_arguments_are_checked(tmp_path, capsys):
    run_dir = distributed_run(tmp_path)
    with pytest.raises(InputError, match=r"no rank 7 .*ranks here: 0, 1"):
        compare(run_dir, ranks=(0, 7))
    with pytest.raises(InputError, match="two rank numbers"):
        compare(run_dir, ranks=(0,))
    assert cli(["diff", str(run_dir), str(run_dir), "--ranks", "0", "1"]) == 2
    assert cli(["diff", str(run_dir)]) == 2
    assert "--ranks I J" in capsys.readouterr().err


def test_stage_files_are_checked_across_ranks_and_the_views_read_the_lowest_rank(tmp_path):
    run_dir = tmp_path / "run"
    names = ("model_torch_exported_training.onnx", "model_execution_model_training.onnx")
    for rank in (0, 1):
        onnx = run_dir / "ranks" / str(rank) / "onnx"
        onnx.mkdir(parents=True)
        for name in names:
            (onnx / name).write_bytes(f"graph {name}".encode())
    folders = {r: [run_dir / "ranks" / str(r) / "onnx"] for r in (0, 1)}
    same = check(folders)
    assert same == {"identical": True, "files": 2, "ranks": [0, 1], "differ": {}}
    assert "identical on ranks 0, 1" in describe(same)
    (run_dir / "ranks" / "1" / "onnx" / names[1]).write_bytes(b"another graph")
    (run_dir / "ranks" / "1" / "onnx" / names[0]).unlink()
    differ = check(folders)
    assert not differ["identical"] and set(differ["differ"]) == set(names)
    assert differ["differ"][names[0]]["1"] is None and len(differ["differ"][names[1]]["0"]) == 16
    assert "DIFFER" in describe(differ)
    assert check({0: [tmp_path / "nothing"]}) is None
    write_json(run_dir / "meta.json", {"status": "ok", "backend": "ortmodule", "nproc": 2, "rank_graphs": differ})
    graphs = load_graphs(load_run(run_dir))
    assert graphs.folder == run_dir / "ranks" / "0" / "onnx" and graphs.rank_graphs == differ


def test_log_panel_picks_a_rank_of_a_distributed_run(tmp_path):
    run_dir = tmp_path / "run"
    metas = {run_dir: {"status": "failed", "backend": "pytorch", "nproc": 2, "failed_rank": 1}}
    for rank in (0, 1):
        metas[run_dir / "ranks" / str(rank)] = {"status": "ok", "rank": rank, "world_size": 2}
    for folder, meta in metas.items():
        folder.mkdir(parents=True, exist_ok=True)
        write_json(folder / "meta.json", meta)
    (run_dir / "log.txt").write_text("the launcher's line\n")
    for rank in (0, 1):
        (run_dir / "ranks" / str(rank) / "log.txt").write_text(f"rank {rank} says hello\n")
    single = tmp_path / "single"
    single.mkdir()
    write_json(single / "meta.json", {"status": "ok", "backend": "pytorch"})
    (single / "log.txt").write_text("one process\n")
    runs = [load_run(single), load_run(run_dir)]
    panel = LogPanel(lambda: runs)
    assert panel.rank.options == (("rank 0", 0), ("rank 1", 1), ("launcher", -1))
    assert panel.rank.value == 1 and panel.rank.layout.display is None  # the failed rank's log first
    assert "rank 1 says hello" in panel.view.value and "rank=1" in repr(panel)
    panel.rank.value = 0
    assert "rank 0 says hello" in panel.view.value
    panel.rank.value = -1
    assert "the launcher" in panel.view.value
    panel.run.value = 1  # the single-process run: no rank picker
    assert panel.rank.layout.display == "none" and "one process" in panel.view.value


@pytest.mark.slow
@pytest.mark.ort
def test_lab_runs_ranks_with_a_curve_and_a_log_per_rank_and_checks_their_graphs_and_gradients(tmp_path):
    from ortlab import Lab

    lab = Lab(model_kwargs={"n_layer": 1, "d_model": 32, "seq_len": 16, "batch_size": 4}, out=tmp_path / "runs",
              cuda_available=False)
    try:
        panel = lab.burst_panel
        assert panel.nproc.value == 1
        panel.backend.value, panel.steps.value, panel.nproc.value = "ortmodule", 2, 2
        panel.record_stats.value, panel.save_graphs.value = True, True
        panel.run_button.click()
        panel.wait(600)
        run = lab.runs[-1]
        assert run.ok and run.meta["nproc"] == 2, (run.error, panel.status.value)
        assert list(panel._curves) == ["ortmodule rank 0", "ortmodule rank 1"]  # the plot: one curve per rank
        assert panel._curves["ortmodule rank 0"] == run.ranks[0].losses != run.ranks[1].losses
        assert "in sync" in panel.results.value and "same graphs on all ranks" in panel.results.value
        # every rank exported the same graphs; the Graphs tab reads rank 0's and says so
        assert run.meta["rank_graphs"]["identical"] is True and run.summary()["rank_graphs"]["files"] >= 4
        graphs = lab.extra_panels["Graphs"]
        assert graphs.graphs is not None and graphs.graphs.folder == run.path / "ranks" / "0" / "onnx"
        assert "identical on ranks 0, 1" in graphs.status.value
        # the Log tab: each rank's log
        log = lab.log_panel
        assert [v for _, v in log.rank.options] == [0, 1, -1] and log.rank.value == 0
        log.rank.value = 1
        assert log.log() == run.ranks[1].log and log.log()
        # the ranks' statistics: activations differ by data, parameter gradients after all-reduce are equal
        diff = compare(run, ranks=(0, 1))
        assert not diff.diverged and (diff.table["phase"] == "param_grad").any()
        assert "all equal" in diff.report()
        loaded = json.loads((run.path / "meta.json").read_text())
        assert loaded["in_sync"] is True
    finally:
        lab.close()


def test_burst_panel_reads_every_ranks_curve_from_the_running_burst(tmp_path):
    import os

    from ortlab.runs.files import rank_losses as _rank_losses
    from ortlab.runs.files import running_distributed as _running_ranks_run
    from ortlab.widgets.burst_panel import BurstPanel

    run_dir = tmp_path / "20261123-101500-ortmodule"
    run_dir.mkdir()
    write_json(run_dir / "meta.json", {"status": "running", "backend": "ortmodule", "nproc": 2, "pid": os.getpid()})
    for rank, losses in ((0, [3.0, 2.5]), (1, [3.1])):
        folder = run_dir / "ranks" / str(rank)
        folder.mkdir(parents=True)
        lines = [json.dumps({"step": i, "loss": v}) for i, v in enumerate(losses)]
        (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n" + ('{"step": 2, "lo' if rank == 0 else ""))
    assert _running_ranks_run(tmp_path, "ortmodule") == run_dir
    assert _running_ranks_run(tmp_path, "pytorch") is None
    assert _rank_losses(run_dir) == {0: [3.0, 2.5], 1: [3.1]}  # a half-written line is not a step
    panel = BurstPanel(SimpleNamespace(out=tmp_path), lambda: None)
    panel._curves = {"pytorch": [1.0], "ortmodule": [3.0]}
    panel._set_rank_curves("ortmodule", _rank_losses(run_dir))
    assert panel._curves == {"pytorch": [1.0], "ortmodule rank 0": [3.0, 2.5], "ortmodule rank 1": [3.1]}
