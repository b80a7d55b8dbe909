"""torch.compile as a third backend beside PyTorch and ORTModule: the same snapshot, parity, its start-up,
graph breaks and re-compilations as data, everything ortlab measures for three (real torch.compile, inductor
where it matters, aot_eager where only dynamo is)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ortlab.engine.backends import parse_backends
from ortlab.engine.config import BurstConfig, BurstError

BREAKS = Path(__file__).resolve().parents[1] / "ortlab" / "demo" / "breaks.py"
slow = pytest.mark.slow


def line_of(marker: str) -> int:
    lines = BREAKS.read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f"# line: {marker}"))


def cli(*args):
    return subprocess.run([sys.executable, "-m", "ortlab.cli", *args], capture_output=True, text=True)


def test_compile_settings_are_data_checked_with_what_is_allowed():
    assert BurstConfig(backend="compile").compile == {"mode": "default", "dynamic": None, "fullgraph": False,
                                                      "backend": "inductor", "memory_budget": None}
    compiled = BurstConfig(backend="compile", compile={"mode": "reduce-overhead", "dynamic": True})
    assert compiled.compile["dynamic"] is True
    with pytest.raises(BurstError, match="compile mode 'fast' is not allowed; allowed: 'default', 'reduce-overhead'"):
        BurstConfig(backend="compile", compile={"mode": "fast"})
    with pytest.raises(BurstError, match=r"compile setting 'fullgraf' is not known; known: mode, dynamic.*; "
                                         r"did you mean fullgraph\?$"):
        BurstConfig(backend="compile", compile={"fullgraf": True})
    with pytest.raises(BurstError, match="compile fullgraph 1 is not allowed"):
        BurstConfig(backend="compile", compile={"fullgraph": 1})
    again = BurstConfig.from_dict(BurstConfig(backend="compile", compile={"backend": "aot_eager"}).to_dict())
    assert again.compile["backend"] == "aot_eager"


def test_the_activation_memory_budget_is_a_number_in_zero_to_one():
    import torch._functorch.config as functorch_config

    assert functorch_config.activation_memory_budget == 1.0  # torch's default, on both stacks' torch
    assert BurstConfig(backend="compile", compile={"memory_budget": 1}).compile["memory_budget"] == 1.0
    assert BurstConfig.from_dict(BurstConfig(backend="compile", compile={"memory_budget": 0.2}).to_dict()
                                 ).compile["memory_budget"] == 0.2
    for bad in (0, -0.1, 1.5, float("nan"), True, "0.5"):
        with pytest.raises(BurstError, match=r"^compile memory_budget .* is not allowed; allowed: a number in \(0, 1]"):
            BurstConfig(backend="compile", compile={"memory_budget": bad})
    with pytest.raises(BurstError, match="did you mean memory_budget"):
        BurstConfig(backend="compile", compile={"memory_budgt": 0.5})
    with pytest.raises(BurstError, match="memory_budget needs backend 'inductor' or 'aot_eager'"):
        BurstConfig(backend="compile", compile={"memory_budget": 0.5, "backend": "eager"})
    assert BurstConfig(backend="compile", compile={"memory_budget": 0.5, "backend": "aot_eager"}).compile[
        "memory_budget"] == 0.5
    for value in ("0", "1.5", "half"):
        bad = cli("burst", "--backend", "compile", "--steps", "1", "--compile-memory-budget", value)
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
        assert f"--compile-memory-budget: '{value}' is not a number in (0, 1]" in bad.stderr


@slow
@pytest.mark.timeout(1200)
def test_a_memory_budget_lowers_what_torch_compile_keeps_for_backward(tmp_path):
    """The budget is in effect when AOTAutograd partitions (the first call, not torch.compile itself): a burst
    with it keeps less for backward than the same burst without, and trains the same losses."""
    from ortlab import Session

    with Session("ortlab.demo:gpt", {"n_layer": 1, "d_model": 32}, out=tmp_path, in_process=True) as s:
        full = s.burst("compile", 2, parity=True, progress=False, collect={"memory": {}})
        kept = s.burst("compile", 2, parity=True, progress=False, collect={"memory": {}},
                       compile={"memory_budget": 0.05})
        transitions = s.transitions
    assert full.ok and kept.ok, (full.error, kept.error)
    assert kept.read_json("compile.json")["settings"]["memory_budget"] == 0.05
    assert "memory_budget None -> 0.05" in " ".join(transitions["reason"])  # re-compiled for the budget
    before, after = full.summary()["saved_for_backward_mb"], kept.summary()["saved_for_backward_mb"]
    assert 0 < after < 0.5 * before, (before, after)
    assert kept.losses == pytest.approx(full.losses, rel=1e-5)


def test_backends_of_a_comparison_put_pytorch_first():
    from ortlab.engine.backends import BackendUnavailable
    from ortlab.stacks.table import ortmodule_line

    if ortmodule_line() is None:  # the ort stack
        assert parse_backends("both") == ("pytorch", "ortmodule") == parse_backends(None)
        assert parse_backends("all") == ("pytorch", "ortmodule", "compile")
    else:  # the current stack: "all" is what runs here, ORTModule asked for by name is refused saying where it runs
        assert parse_backends("all") == ("pytorch", "compile") == parse_backends(None)
        with pytest.raises(BackendUnavailable, match=r"^ORTModule does not run here .* ORTLAB_STACK=ort"):
            parse_backends("both")
    assert parse_backends("compile,pytorch") == ("pytorch", "compile")
    with pytest.raises(BurstError, match="backend 'jit' is not allowed; allowed: pytorch, ortmodule, compile"):
        parse_backends("pytorch,jit")
    with pytest.raises(BurstError, match="needs two backends or more"):
        parse_backends("compile")
    bad = cli("burst", "--backend", "pytorch,tpu", "--steps", "1")
    assert bad.returncode == 2 and "backend 'tpu' is not allowed" in bad.stderr


@slow
@pytest.mark.timeout(900)
@pytest.mark.ort
def test_three_backends_side_by_side_in_parity(tmp_path):
    done = cli("burst", "--backend", "pytorch,ortmodule,compile", "--parity", "--steps", "6", "--model-arg",
               "n_layer=1", "--out", str(tmp_path), "--in-process", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["backends"] == ["pytorch", "ortmodule", "compile"]
    compiled = result["compile"]
    assert compiled["status"] == "ok" and compiled["compile_s"] > 0 and compiled["graph_breaks"] == 0
    versus = result["versus"]["compile"]
    assert versus["max_loss_diff"] < 1e-5 and versus["verdict"]["status"] == "agree"
    assert result["versus"]["ortmodule"]["verdict"]["status"] == "agree"
    assert compiled["saved_for_backward_mb"] > 0  # the account through the compiled module
    run = Path(compiled["path"])
    info = json.loads((run / "compile.json").read_text())
    assert info["compiled_steps"][0]["step"] == 0 and info["generated_code"]
    assert all((run / "compiled" / name).is_file() for name in info["generated_code"])
    table = cli("runs", str(tmp_path))
    assert "compile" in table.stdout
    from ortlab import load_run
    from ortlab.widgets.graphs import GraphsPanel

    panel = GraphsPanel(lambda: [load_run(run)])  # the Graphs tab lists the compiled code
    assert "generated code" in panel.summary.value and info["generated_code"][0] in panel.summary.value


@slow
@pytest.mark.timeout(900)
def test_graph_breaks_and_recompiles_are_named_with_their_line(tmp_path):
    from ortlab import Session

    with Session("ortlab.demo.breaks:model", {"batch_sizes": [8, 12]}, out=tmp_path, in_process=True) as s:
        run = s.burst("compile", 4, parity=True, progress=False, compile={"backend": "aot_eager"})
        transitions = s.transitions
    assert run.ok, run.error
    info = run.read_json("compile.json")
    breaks = info["graph_breaks"]
    assert breaks and breaks[0]["file"].endswith("breaks.py") and breaks[0]["line"] == line_of("break")
    assert "print" in breaks[0]["reason"]
    assert info["recompiles"] and info["recompiles"][0]["step"] == 1
    assert any("size mismatch" in r or "expected 8" in r for r in info["recompiles"][0]["reasons"])
    assert "re-compile" in list(transitions["action"])
    assert run.summary()["graph_breaks"] >= 1


@slow
@pytest.mark.timeout(900)
def test_a_fullgraph_burst_that_breaks_fails_with_the_reason_in_one_line(tmp_path):
    done = cli("burst", "--backend", "compile", "--model", "ortlab.demo.breaks:model", "--steps", "2",
               "--compile-fullgraph", "--compile-backend", "aot_eager", "--out", str(tmp_path), "--in-process")
    assert done.returncode == 1
    line = next(x for x in done.stderr.splitlines() if x.startswith("ortlab burst: compile:"))
    assert "a graph break with fullgraph=True" in line and "print" in line
    run = next(p for p in tmp_path.iterdir() if p.name.endswith("compile"))
    meta = json.loads((run / "meta.json").read_text())
    assert meta["graph_break"]["line"] == line_of("break")


@slow
@pytest.mark.timeout(900)
def test_statistics_compare_between_compile_and_pytorch(tmp_path):
    from ortlab import Session, compare

    with Session(model_kwargs={"n_layer": 1}, out=tmp_path, in_process=True) as s:
        pt = s.burst("pytorch", 2, parity=True, progress=False, collect={"stats": {}})
        compiled = s.burst("compile", 2, parity=True, progress=False, collect={"stats": {}},
                           compile={"backend": "aot_eager"})
    assert compiled.ok and (compiled.path / "stats.npz").is_file()
    assert compare(pt, compiled).first is None


@slow
@pytest.mark.timeout(900)
def test_a_compiled_loop_is_recorded(tmp_path):
    import torch

    import ortlab
    from ortlab.demo import gpt

    workload = gpt(n_layer=1)
    compiled = torch.compile(workload.model, backend="aot_eager")
    optimizer = torch.optim.SGD(compiled.parameters(), lr=0.01)
    with ortlab.record(compiled, out=tmp_path) as rec:
        for step in range(2):
            inputs, target = workload.batch(step)
            loss = workload.loss(compiled(inputs), target)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            rec.step(loss=loss)
    run = ortlab.load_run(rec.path)
    assert run.backend == "compile" and run.ok and len(run.losses) == 2


@slow
@pytest.mark.timeout(900)
def test_ddp_over_a_compiled_model(tmp_path):
    from ortlab import Session

    with Session(model_kwargs={"n_layer": 1}, out=tmp_path) as s:
        run = s.burst("compile", 3, parity=True, progress=False, nproc=2, compile={"backend": "aot_eager"})
    assert run.ok, run.error
    assert run.meta["in_sync"] is True and len(run.ranks) == 2


@slow
@pytest.mark.timeout(1500)
def test_a_trainer_that_accumulates_reports_its_compile_start_up(tmp_path):
    """The LoRA Trainer runs two micro-batches a step: the first one's compile (forward and backward) is the
    start-up, and the second micro-batch's forward must not hide it (it printed 0.00 s)."""
    from ortlab import Session

    with Session("ortlab.demo.trainers:lora_llama", out=tmp_path, in_process=True) as s:
        run = s.burst("compile", 2, progress=False)
    assert run.ok, run.error
    compiled = run.read_json("compile.json")
    assert compiled["compiled_steps"][0]["step"] == 0 and compiled["compile_s"] > 1.0, compiled
    assert run.summary()["startup_s"] == compiled["compile_s"]
    assert run.metrics["compile_s"].iloc[0] == pytest.approx(compiled["compile_s"], rel=1e-3)
