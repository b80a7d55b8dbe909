"""The move written out (ortlab.move): every ORTModule option has its newest-torch entry, every torch name an entry
uses exists on this stack's torch, and the report over real runs (real ORTModule, real torch.compile, on the demo)
reads both sides' figures and verdicts from their folders, says what is missing, and refuses in one line what is
not a move."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ortlab.move.mapping import BY_OPTION, MAPPING, SETTINGS, Fit, equivalent, every_api, has_api
from ortlab.options import REGISTRY, Kind

SMALL = {"n_layer": 1, "d_model": 32}


def ortlab(*args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "ortlab.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_every_option_ortlab_knows_has_an_entry_and_every_choice_an_answer():
    assert set(BY_OPTION) == {s.name for s in REGISTRY} | set(SETTINGS)
    assert len(BY_OPTION) == len(MAPPING)  # one entry per option
    for s in REGISTRY:
        values = list(s.choices) or ([True, False] if s.kind is Kind.BOOL else [s.default])
        for value in values:
            entry = equivalent(s.name, value)
            assert entry.becomes and entry.option == s.name, (s.name, value)
            if entry.fit in (Fit.NONE, Fit.PARTIAL, Fit.BUILT_IN):
                assert entry.why, f"{s.name}={value}: {entry.fit} without saying why"
            if entry.fit is not Fit.NONE and entry.fit is not Fit.BUILT_IN:
                assert entry.apis, f"{s.name}={value}: names no torch API to check"


def test_the_entries_the_issue_names():
    assert equivalent("optimizer", "fused_adam").apis == ("torch.optim.AdamW(fused)",)
    assert "fused=True" in equivalent("optimizer", "fused_adam").snippet
    assert "torch.amp.GradScaler" in equivalent("optimizer", "fp16_optimizer").apis
    assert "GradScaler" in equivalent("precision", "fp16").snippet
    assert "fullgraph=True" in equivalent("fallback_policy", "FALLBACK_DISABLE").snippet
    assert "graph breaks" in equivalent("fallback_policy", "DEFAULT").becomes
    for level in (1, 2):
        entry = equivalent("memory_opt_level", level)
        assert {"torch.utils.checkpoint.checkpoint", "torch._functorch.config.activation_memory_budget"} <= set(
            entry.apis)
    assert equivalent("onnx_opset_version", 17).fit is Fit.NONE
    assert "not needed" in equivalent("onnx_opset_version", 17).why
    assert equivalent("log_level", "INFO").apis and "TORCH_LOGS" in equivalent("log_level", "INFO").snippet


def test_every_torch_name_an_entry_uses_exists_on_this_stacks_torch():
    """On the ort stack (torch 2.6) the names torch 2.6 has; on the current stack (torch 2.14) every name."""
    import torch

    here = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    names = every_api()
    assert len(names) > 30
    wanted = [name for name, since in names.items() if since <= here]
    missing = [name for name in wanted if not has_api(name)]
    assert not missing, f"torch {torch.__version__} lacks {missing}"
    if here >= (2, 7):
        assert wanted == list(names)  # the newest torch has every one
    assert not has_api("torch.optim.AdamW(no_such_parameter)") and not has_api("torch.no_such_module.thing")


def test_docs_compile_md_names_every_option_the_mapping_has():
    docs = (Path(__file__).resolve().parents[1] / "docs" / "compile.md").read_text(encoding="utf-8")
    section = docs[docs.index("## The move, written out"):]
    for entry in MAPPING:
        assert f"`{entry.option}" in section, entry.option
        assert entry.becomes.split(":")[0].replace("|", "/") in section, entry.option


# Real runs: PyTorch, ORTModule and torch.compile of the small demo, one parity comparison in this process.

@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    from ortlab.engine.session import Session

    out = tmp_path_factory.mktemp("move")
    with Session("ortlab.demo:gpt", SMALL, out=out, in_process=True) as session:
        cmp = session.compare(3, {"memory_opt_level": 1}, backends=("pytorch", "ortmodule", "compile"), parity=True,
                              progress=False, collect={"memory": {}})
    return cmp


@pytest.mark.slow
@pytest.mark.ort
def test_the_move_report_of_real_runs_reads_both_sides(compared):
    from ortlab.move import move_report

    report = move_report(compared.compile, compared.ortmodule)  # either order
    d = report.to_dict()
    assert d["from"]["backend"] == "ortmodule" and d["to"]["backend"] == "compile"
    for side, run in (("from", compared.ortmodule), ("to", compared.compile)):
        summary = run.summary()
        assert d[side]["figures"]["median_step_s"] == summary["median_step_s"]
        assert d[side]["figures"]["startup_s"] == summary["startup_s"] > 0
        assert d[side]["figures"]["saved_for_backward_mb"] == summary["saved_for_backward_mb"]
        assert d[side]["torch"] == run.meta["versions"]["torch"] and d[side]["stack"] == "ort"
        assert d[side]["verdict"] == run.read_json("verdict.json")["status"] == "agree"
    assert d["from"]["figures"]["activation_peak_mb"] > 0
    assert d["ratios"]["median_step_s"] == pytest.approx(
        compared.compile.summary()["median_step_s"] / compared.ortmodule.summary()["median_step_s"])
    shown = {e["option"]: e for e in d["options"]}
    assert shown["memory_opt_level"]["value"] == 1 and shown["memory_opt_level"]["set_by"] == "the run"
    assert shown["enable_compute_optimizer"]["set_by"].startswith("ortlab, for parity")
    assert shown["fallback_policy"]["value"] == "DEFAULT" and shown["wrap"]["snippet"]
    assert report.recomputed and all(r.startswith(("blocks.", "ln_f", "head", "tok")) for r in report.recomputed)
    assert d["to"]["settings"]["fullgraph"] is False and d["to"]["settings"]["graph_breaks"] == 0
    text = str(report)
    assert "memory_opt_level=1" in text and "activation_memory_budget" in text
    assert "both train the same model as PyTorch" in report.conclusion
    assert report.missing == []  # torch.compile's activation peak is not a figure it has
    # ORT recomputed, torch.compile ran without a budget: the equivalent is not measured, and the command that does
    memory = d["memory"]
    assert memory["recompute"] == "memory_opt_level=1" and memory["measured"] is False and memory["budget"] is None
    assert f"memory: {memory['line']}" in text and "the equivalent was not measured" in memory["line"]
    assert f"measure it: {memory['command']}" in text
    assert 0 < memory["suggested_budget"] < 1
    assert f"--compile-memory-budget {memory['suggested_budget']:g}" in memory["command"]
    # made by a Python call from a factory: the command is built from the run's config
    assert memory["command"].startswith("ortlab burst --backend compile --steps 3 --parity")
    assert "--model-arg n_layer=1" in memory["command"]


@pytest.mark.slow
@pytest.mark.ort
def test_the_move_report_measures_the_equivalent_of_recompute_with_a_budget(compared, tmp_path):
    """A torch.compile run with an activation memory budget from the same start: the report's memory line sets
    what it kept beside what ORTModule with memory_opt_level=1 kept; less than without the budget, and judged
    against the PyTorch run it still agrees."""
    import shlex

    from ortlab.cli import build_parser
    from ortlab.engine.session import Session
    from ortlab.move import move_report

    with Session("ortlab.demo:gpt", SMALL, out=tmp_path, in_process=True) as session:
        budget = session.burst("compile", 3, parity=True, progress=False, collect={"memory": {}},
                               compile={"memory_budget": 0.05})
    assert budget.ok, budget.error
    report = move_report(compared.ortmodule, budget, reference_run=compared.pytorch)
    kept, ort_kept = budget.summary()["saved_for_backward_mb"], compared.ortmodule.summary()["saved_for_backward_mb"]
    assert 0 < kept < 0.5 * compared.compile.summary()["saved_for_backward_mb"]
    assert report.memory["measured"] is True and report.memory["command"] is None
    assert report.memory["line"] == (f"the equivalent measured: torch.compile with activation_memory_budget=0.05 kept "
                                     f"{kept:.3g} MB for backward, ORTModule with memory_opt_level=1 kept "
                                     f"{ort_kept:.3g} MB")
    assert f"memory: {report.memory['line']}" in str(report)
    assert "(activation_memory_budget=0.05)" in report.conclusion
    assert report.target.verdict == "agree" and report.ortmodule.verdict == "agree"
    # the command the report gives when a run's command was recorded: the same command with the budget, which parses
    meta = json.loads((compared.compile.path / "meta.json").read_text())
    copy = Path(shutil.copytree(compared.compile.path, tmp_path / compared.compile.path.name))
    recorded = "ortlab burst --backend pytorch,ortmodule,compile --parity --steps 3 --compile-memory-budget 0.5"
    (copy / "meta.json").write_text(json.dumps({**meta, "command": recorded}))
    command = move_report(compared.ortmodule, copy).memory["command"]
    words = shlex.split(command)
    assert words[:2] == ["ortlab", "burst"] and words.count("--compile-memory-budget") == 1
    args = build_parser().parse_args(words[1:])
    assert 0 < args.compile_memory_budget < 0.5 and args.backend == "pytorch,ortmodule,compile"


@pytest.mark.slow
@pytest.mark.ort
def test_figures_a_run_did_not_record_are_said_missing(compared, tmp_path):
    from ortlab.move import move_report

    ort = Path(shutil.copytree(compared.ortmodule.path, tmp_path / compared.ortmodule.path.name))
    (ort / "memory.json").unlink()
    (ort / "verdict.json").unlink()
    report = move_report(ort, compared.compile.path)
    assert report.ortmodule.figures["saved_for_backward_mb"] is None
    assert any("kept for backward" in m and ort.name in m for m in report.missing)
    assert "missing" in str(report) and report.ratios["saved_for_backward_mb"] is None
    assert report.ortmodule.verdict is None and report.target.verdict == "agree"
    assert "not judged on both sides" in report.conclusion


@pytest.mark.slow
@pytest.mark.ort
def test_the_cli_judges_with_a_reference_when_the_runs_have_no_verdict(compared, tmp_path):
    runs = {}
    for name in ("ortmodule", "compile"):
        run = compared.run(name)
        runs[name] = Path(shutil.copytree(run.path, tmp_path / run.path.name))
        (runs[name] / "verdict.json").unlink()
    r = ortlab("move", runs["ortmodule"], runs["compile"], "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["verdict"]["from"] is None
    r = ortlab("move", runs["compile"], runs["ortmodule"], "--reference", compared.pytorch.path, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["verdict"]["from"] == d["verdict"]["to"] == "agree"
    assert "judge_runs" in d["verdict"]["note"]
    assert (runs["ortmodule"] / "verdict.json").is_file()  # judge_runs wrote it
    r = ortlab("move", runs["compile"], runs["ortmodule"])
    assert r.returncode == 0 and "what each option becomes:" in r.stdout and "verdict, ORTModule: agree" in r.stdout


@pytest.mark.slow
@pytest.mark.ort
def test_the_cli_refuses_what_is_not_a_move_in_one_line(compared, tmp_path):
    ort, comp, pt = compared.ortmodule.path, compared.compile.path, compared.pytorch.path
    for args, words in (((ort, ort), "both runs are ORTModule's"),
                        ((pt, comp), "neither run is ORTModule's"),
                        ((ort, pt), "is a pytorch run: the move is to torch.compile"),
                        ((ort, tmp_path), "is not an ortlab run folder")):
        r = ortlab("move", *args)
        assert r.returncode == 2 and r.stdout == "", r.stderr
        assert r.stderr.startswith("ortlab move: ") and words in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_runs_without_an_ortmodule_run_are_refused_on_any_stack(tmp_path):
    """Real PyTorch runs (both stacks): neither is ORTModule's, in one line; a folder that is not a run likewise."""
    from ortlab.engine.session import Session
    from ortlab.move import MoveError, move_report

    with Session("ortlab.demo:gpt", SMALL, out=tmp_path, in_process=True) as session:
        a = session.burst("pytorch", 2, progress=False)
        b = session.burst("pytorch", 2, progress=False)
    with pytest.raises(MoveError, match="neither run is ORTModule's"):
        move_report(a, b)
    r = ortlab("move", a.path, b.path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "neither run is ORTModule's" in r.stderr


def _current_python() -> str | None:
    found = sorted(Path("/root/.pyenv/versions").glob("3.12.*/bin/python3.12"))
    return str(found[0]) if found else None


@pytest.mark.slow
@pytest.mark.ort
@pytest.mark.skipif(_current_python() is None, reason="no Python 3.12 for the current stack here")
def test_the_move_to_the_newest_torch_from_a_run_made_on_the_current_stack(compared, tmp_path):
    """torch.compile on the current stack (another process, torch 2.14), ORTModule from the ort stack: the report
    names both torches and stacks, and judges both against the PyTorch run."""
    import os

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "ORTLAB_STACK": "current", "ORTLAB_PYTHON": _current_python()}
    env.pop("VIRTUAL_ENV", None)
    r = subprocess.run([str(root / "bin" / "ortlab"), "burst", "--backend", "compile", "--parity", "--steps", "3",
                        "--model-arg", "n_layer=1", "--model-arg", "d_model=32", "--out", str(tmp_path), "--json"],
                       capture_output=True, text=True, timeout=1200, env=env)
    assert r.returncode == 0, r.stderr
    current = json.loads(r.stdout)["path"]
    r = ortlab("move", compared.ortmodule.path, current, "--reference", compared.pytorch.path, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["from"]["stack"] == "ort" and d["from"]["torch"].startswith("2.6")
    assert d["to"]["stack"] == "current" and not d["to"]["torch"].startswith("2.6")
    assert d["verdict"]["to"] == "agree" and "separate processes" in d["conclusion"]


def test_the_labs_move_tab_says_what_it_needs_before_the_runs(tmp_path):
    from ortlab import Lab
    from ortlab.widgets.move import MovePanel

    lab = Lab(out=tmp_path, in_process=True, cuda_available=False)
    try:
        panel = lab.extra_panels["Move"]
        assert isinstance(panel, MovePanel) and lab.titles.index("Move") == lab.titles.index("Report") - 1
        assert "the move needs an ORTModule run and a torch.compile run" in panel.result.value
        panel.ortmodule_path.value = str(tmp_path)
        assert panel.show() is None and "not an ortlab run folder" in panel.result.value  # one red line
        assert panel.result.value.count("<span") == 1
    finally:
        lab.close()


@pytest.mark.slow
@pytest.mark.ort
def test_the_labs_move_tab_shows_the_report_of_its_newest_runs(tmp_path, compared):
    from ortlab import Lab

    lab = Lab("ortlab.demo:gpt", SMALL, out=tmp_path, in_process=True, cuda_available=False)
    try:
        panel = lab.extra_panels["Move"]
        lab.burst("ortmodule", 2, progress=False)
        assert "the move needs a torch.compile run" in panel.result.value
        comp = lab.burst("compile", 2, progress=False)
        report = panel.report
        assert report is not None and report.target.run == comp.path.name
        assert report.ortmodule.run == lab.runs[0].path.name
        shown = panel.result.value
        for words in ("torch.compile", "median step after start-up", "fallback_policy=DEFAULT", "graph breaks",
                      "model = torch.compile(model)", report.conclusion.split(";")[0]):
            assert words.replace("'", "&#x27;") in shown, words
        panel.ortmodule_path.value = str(compared.ortmodule.path)  # a folder named instead: judged in a comparison
        assert panel.show().ortmodule.run == compared.ortmodule.path.name and "agree" in panel.result.value
    finally:
        lab.close()


@pytest.mark.slow
@pytest.mark.ort
def test_the_report_page_has_the_move_when_both_runs_are_there(compared, tmp_path):
    import html
    import re

    from ortlab.reporting import report

    page = report(compared, out=tmp_path / "all.html").read_text()
    section = page[page.index("<section id=\"the-move\">"):]
    section = html.unescape(re.sub(r"<[^>]+>", " ", section[:section.index("</section>")]))
    assert "memory_opt_level=1" in section and "torch.utils.checkpoint" in section and "fullgraph" not in section
    assert "both train the same model as PyTorch" in section
    without = report(compared.pytorch, compared.ortmodule, out=tmp_path / "two.html").read_text()
    assert "the-move" not in without  # no torch.compile run: no move section


@pytest.mark.slow
@pytest.mark.ort
def test_compare_ends_with_the_move_when_ortmodule_and_torch_compile_both_ran(tmp_path):
    small = ("--model-arg", "n_layer=1", "--model-arg", "d_model=32", "--steps", "2", "--out", tmp_path)
    r = ortlab("compare", "--backends", "all", *small, "--in-process")
    assert r.returncode == 0, r.stderr
    after = r.stdout.split("what each option becomes:")
    assert len(after) == 2 and "the move: ORTModule (" in after[0]
    assert after[1].rstrip().splitlines()[-1].startswith("move: on torch.compile")
    r = ortlab("compare", "--backends", "both", *small, "--in-process")  # PyTorch and ORTModule: no move
    assert r.returncode == 0 and "what each option becomes" not in r.stdout, r.stderr


@pytest.mark.slow
@pytest.mark.ort
def test_an_ortmodule_run_that_fell_back_shows_no_figures_as_ortmodules(tmp_path):
    """A model ORT cannot export falls back to PyTorch: its step time and memory are PyTorch's, so the report does
    not show them as ORTModule's; it says why instead."""
    from ortlab.engine.session import Session
    from ortlab.move import move_report

    model = str(Path(__file__).parent / "factories" / "compat.py") + ":fixable"
    with Session(model, out=tmp_path, in_process=True) as session:
        fell = session.burst("ortmodule", 2, progress=False)
        comp = session.burst("compile", 2, progress=False, compile={"backend": "aot_eager"})
    assert fell.status == "fallback" and fell.summary()["median_step_s"] is not None
    report = move_report(fell, comp)
    assert report.ortmodule.figures["median_step_s"] is None and report.ortmodule.figures["startup_s"] is None
    assert report.ratios["median_step_s"] is None
    assert any(fell.path.name in m and "fallback" in m and "PyTorch's" in m for m in report.missing)
    assert "a step takes" not in report.conclusion


def test_a_runs_stack_is_read_from_its_folder_and_an_unrecorded_one_is_said_so(tmp_path):
    """The stack of each side is what its meta.json recorded ("stack"); a run made before runs recorded it says
    "stack not recorded", whatever its Python's version would suggest (3.11 here: no guess of the ort stack)."""
    from ortlab.move import move_report
    from ortlab.runs.run import RunWriter, new_run_dir

    made = {}
    for backend, stack in (("ortmodule", None), ("compile", {"name": "current", "python": "/x/python3.12",
                                                             "lock": "requirements-current.lock"})):
        path = new_run_dir(tmp_path, backend, None)
        w = RunWriter(path, {"backend": backend, "device": "cpu", "config": {},
                             "versions": {"python": "3.11.7", "torch": "2.6.0"}, **({"stack": stack} if stack else {})})
        for step in range(3):
            w.step({"step": step, "loss": 2.5 - step / 10, "step_time_s": 0.0123})
        w.finish("ok")
        made[backend] = path
    report = move_report(made["ortmodule"], made["compile"])
    assert report.to_dict()["from"]["stack"] == "not recorded" and report.to_dict()["to"]["stack"] == "current"
    first = str(report).splitlines()[0]
    assert "torch 2.6.0, stack not recorded) -> torch.compile" in first and first.endswith("current stack)"), first
