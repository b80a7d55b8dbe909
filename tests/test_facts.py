"""A run's facts said once (ortlab.runs.facts) and shown alike by the CLI's table, the report page and the Lab's
results: a fact added to the spec appears in all three with no other edit, a CUDA run's process figure has one
label, the stack a run was made on is shown (and missing, never guessed, for a run made before it was recorded)."""

from __future__ import annotations

import pytest

from ortlab.comparison.summary import Comparison, run_text
from ortlab.runs import facts
from ortlab.runs.facts import MISSING, Fact
from ortlab.runs.run import RunWriter, load_run

STACK = {"name": "ort", "python": "/opt/env/bin/python", "lock": "/somewhere/locks/ort-py311.lock"}


def made(folder, backend: str, device: str = "cpu", stack: dict | None = STACK, peak: float = 500.0):
    """A finished run folder, written as a burst writes one."""
    folder.mkdir(parents=True)
    meta = {"backend": backend, "device": device, "config": {"steps": 3, "parity": True, "options": {}}}
    if stack is not None:
        meta["stack"] = stack
    writer = RunWriter(folder, meta)
    for i, loss in enumerate((2.5, 2.25, 2.0)):
        row = {"step": i, "loss": loss, "step_time_s": 0.01, "samples_per_s": 800.0, "peak_mem_mb": peak + i}
        if device == "cuda":
            row["peak_reserved_mb"] = 2 * peak
        writer.step(row)
    writer.finish("ok")
    return load_run(folder)


def shown(runs, tmp_path) -> dict[str, str]:
    """The same runs as the CLI prints them, as the report page shows them, and as the Lab's results table."""
    from ortlab import report
    from ortlab.engine.session import Session
    from ortlab.options import Options
    from ortlab.widgets.burst_panel import BurstPanel

    cli = str(Comparison(*runs)) if len(runs) > 1 else run_text(runs[0])
    page = report(*runs, out=tmp_path / "page.html").read_text(encoding="utf-8")
    panel = BurstPanel(Session(out=str(tmp_path / "lab"), in_process=True), Options)
    panel._show_results(runs)
    return {"cli": cli, "report": page, "lab": panel.results.value}


@pytest.fixture
def pair(tmp_path):
    return [made(tmp_path / "runs" / "20260101-000000-pytorch", "pytorch"),
            made(tmp_path / "runs" / "20260101-000001-ortmodule", "ortmodule")]


def test_a_fact_added_to_the_spec_appears_everywhere(pair, tmp_path, monkeypatch):
    before = shown(pair, tmp_path)
    assert not any("run folder name" in text for text in before.values())
    monkeypatch.setattr(facts, "FACTS", (*facts.FACTS, Fact("run", "run folder name")))
    after = shown(pair, tmp_path)
    for medium, text in after.items():
        assert "run folder name" in text and "20260101-000001-ortmodule" in text, medium
    line = next(x for x in after["cli"].splitlines() if x.startswith("run folder name"))
    assert line.split()[-2:] == ["20260101-000000-pytorch", "20260101-000001-ortmodule"]


def test_a_cuda_run_is_labelled_alike_everywhere(tmp_path):
    runs = [made(tmp_path / "runs" / "20260101-000000-pytorch", "pytorch", "cuda", peak=512.0),
            made(tmp_path / "runs" / "20260101-000001-ortmodule", "ortmodule", "cuda", peak=300.0)]
    for medium, text in shown(runs, tmp_path).items():
        assert "peak CUDA allocated (MB)" in text and "peak CUDA reserved (MB)" in text, medium
        assert "peak resident set" not in text, medium
    decision = Comparison(*runs).decision()
    assert "peak CUDA allocated (MB)" in decision.columns and "peak resident set (MB)" not in decision.columns
    cpu = shown([made(tmp_path / "cpu" / "20260101-000002-pytorch", "pytorch")], tmp_path / "cpu")
    assert all("peak resident set (MB)" in text and "CUDA" not in text for text in cpu.values())


def test_the_stack_a_run_was_made_on_is_shown_and_never_guessed(tmp_path):
    runs = [made(tmp_path / "runs" / "20260101-000000-pytorch", "pytorch"),
            made(tmp_path / "runs" / "20260101-000001-ortmodule", "ortmodule", stack=None)]  # made before 4f0d27c
    assert runs[0].summary()["stack"] == STACK and "stack" not in runs[1].summary()
    for medium, text in shown(runs, tmp_path).items():
        assert "ort (ort-py311.lock)" in text and "/somewhere" not in text, medium
    line = next(x for x in shown(runs, tmp_path)["cli"].splitlines() if x.startswith("stack"))
    assert line.split()[-1] == MISSING  # the older run's: missing, not the other's nor a guess from its Python


def test_one_spelling_of_a_missing_value(pair, tmp_path):
    texts = shown(pair, tmp_path)
    cli = next(x for x in texts["cli"].splitlines() if x.startswith("kept for backward"))
    assert cli.split()[-2:] == [MISSING, MISSING]
    assert f"<td>{MISSING}</td>" in texts["report"]
    assert MISSING in texts["lab"]
    from ortlab.widgets.layout import MISSING as LAB

    assert LAB == MISSING


def test_a_fallback_run_shows_none_of_its_backends_figures(tmp_path):
    run = made(tmp_path / "20260101-000001-ortmodule", "ortmodule")
    from ortlab.runs.run import write_json

    write_json(run.path / "meta.json", {**run.meta, "status": "fallback", "error": "no gradient kernel"})
    summary = load_run(run.path).summary()
    rows = {fact.title: cells[0] for fact, cells in facts.rows([summary])}
    assert rows["median step (ms)"] == MISSING and rows["start-up (s)"] == "fell back to PyTorch"
    assert rows["final loss"] == "2.0000"


def test_which_runs_belong_together_is_answered_once(tmp_path):
    """ortlab.runs.groups from run folders: the pairs of a comparison, the newest comparison, the newest run of a
    backend; the report's sources and the Lab's tabs ask it."""
    from ortlab.engine.backends import BACKENDS
    from ortlab.reporting.sources import collect
    from ortlab.runs import groups
    from ortlab.runs.run import write_json
    from ortlab.widgets.move import newest_pair
    from ortlab.widgets.report import newest_comparison

    def run(name: str, backend: str, started: str, steps: int = 3):
        r = made(tmp_path / name, backend)
        write_json(r.path / "meta.json", {**r.meta, "started": started, "config": {**r.meta["config"],
                                                                                  "steps": steps}})
        return load_run(r.path)

    first = [run("a-pytorch", "pytorch", "2026-01-01T00:00:00"),
             run("b-ortmodule", "ortmodule", "2026-01-01T00:00:01"), run("c-compile", "compile", "2026-01-01T00:00:02")]
    other = run("d-pytorch", "pytorch", "2026-01-01T00:01:00", steps=5)  # another start: not their reference
    second = [run("e-pytorch", "pytorch", "2026-01-01T00:02:00"),
              run("f-ortmodule", "ortmodule", "2026-01-01T00:02:01")]
    runs = [*first, other, *second]
    names = lambda rs: [r.path.name for r in rs]  # noqa: E731
    assert [names(p) for p in groups.pairs(runs, BACKENDS)] == [
        ["a-pytorch", "b-ortmodule"], ["a-pytorch", "c-compile"], ["e-pytorch", "f-ortmodule"]]
    assert names(groups.newest_comparison(runs, BACKENDS)) == ["e-pytorch", "f-ortmodule"] == names(
        newest_comparison(runs))
    assert names(newest_comparison(first)) == names(first)
    assert names(newest_pair(runs)) == ["f-ortmodule", "c-compile"]
    assert [names(p) for p in collect(tmp_path).pairs()] == [names(p) for p in groups.pairs(runs, BACKENDS)]
    assert groups.reference_of(other, None, BACKENDS) is None  # PyTorch's own run


def test_a_distributed_runs_ranks_are_facts(tmp_path):
    from ortlab.runs.run import write_json

    run = made(tmp_path / "20260101-000001-pytorch", "pytorch")
    write_json(run.path / "meta.json", {**run.meta, "nproc": 2, "strategy": "fsdp2", "ranks": [0, 1], "in_sync": False,
                                        "rank_graphs": {"identical": True},
                                        "imbalance": {"load": 1.25, "wait_share": 0.125}})
    rows = {fact.title: cells[0] for fact, cells in facts.rows([load_run(run.path).summary()])}
    assert rows["ranks"] == "2" and rows["in sync"] == "no" and rows["same graphs on all ranks"] == "yes"
    assert rows["strategy"] == "fsdp2"
    assert rows["load imbalance (max/mean)"] == "1.250" and rows["ranks waited (of step)"] == "12.5%"
    one = {fact.title for fact, _ in facts.rows([made(tmp_path / "one", "pytorch").summary()])}
    assert "ranks" not in one and "strategy" not in one
