"""`ortlab compare` across stacks (ortlab.comparison.cross_stack, ortlab.engine.stack_env): BACKEND@STACK read into
placed backends, the one-line refusals, and (slow) a real comparison whose workers run on both stacks' Pythons, judged
from their folders."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ortlab.comparison.cross_stack import CrossStackError, Placed, check_crossable, parse_placed, placements
from ortlab.engine.backends import BurstError
from ortlab.engine.stack_env import StackError, parse_stack
from ortlab.stacks.table import STACKS, Stack, this_stack

SMALL = {"n_layer": 1, "d_model": 32}  # the demo, smaller: a quicker burst
OTHER = Stack.CURRENT if this_stack() == Stack.ORT else Stack.ORT


def ortlab(*args, env=None, timeout=900):
    return subprocess.run([sys.executable, "-m", "ortlab.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_a_backend_is_placed_on_the_stack_it_names_and_defaults_to_the_natural_one():
    here = this_stack()
    assert parse_placed("pytorch,ortmodule@ort,compile@current") == (
        Placed("pytorch", here), Placed("ortmodule", Stack.ORT), Placed("compile", Stack.CURRENT))
    # without @: ORTModule on the ort stack, every other backend here; PyTorch added first when not named
    assert parse_placed("compile@current,ortmodule", here=Stack.CURRENT) == (
        Placed("pytorch", Stack.CURRENT), Placed("compile", Stack.CURRENT), Placed("ortmodule", Stack.ORT))
    assert parse_placed(["pytorch@current", "compile@ort"], here=Stack.ORT) == (
        Placed("pytorch", Stack.CURRENT), Placed("compile", Stack.ORT))
    assert str(Placed("compile", Stack.CURRENT)) == "compile@current"
    assert placements("pytorch,compile") is None and placements("all") is None  # one process: parse_backends's
    assert placements("pytorch, compile@current")[1] == Placed("compile", Stack.CURRENT)


@pytest.mark.parametrize("value, error, says", [
    ("pytorch,compile@curent", StackError, "stack 'curent' is not one; allowed: ort (torch 2.6.0), current "
                                           "(torch 2.14.1); did you mean current?"),
    ("pytorch,compile@", StackError, "names no stack after '@'"),
    ("pytorch,compil@current", BurstError,
     "backend 'compil' (in 'compil@current') is not allowed; allowed: pytorch, ortmodule, compile, each optionally "
     "@STACK (ort, current), or both or all alone; did you mean compile?"),
    ("pytorch,ortmodule@current", StackError, "ORTModule runs on the ort stack only"),
    ("pytorch,compile@ort,compile@current", BurstError, "compile is already placed (compile@ort)"),
    ("all@current", BurstError, "all stands for several backends"),
    ("pytorch@current", BurstError, "a comparison needs two backends or more"),
])
def test_a_bad_placement_is_refused_in_one_line_naming_what_is_allowed(value, error, says):
    with pytest.raises(error) as e:
        parse_placed(value)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_placed_backend_in_one_process_points_at_the_comparison_across_stacks():
    """Session.compare (one process) given "compile@current": one line naming ortlab.compare_stacks, which takes
    the same words (and is the public name of cross_stack's comparison)."""
    import ortlab
    from ortlab.engine.backends import parse_backends

    with pytest.raises(BurstError, match=r"^backend 'compile@current' names a stack: .* ortlab.compare_stacks\(model, "
                       r"'pytorch,compile@current'\)"):
        parse_backends("pytorch,compile@current")
    assert ortlab.compare_stacks.__module__ == "ortlab.comparison.cross_stack"
    with pytest.raises(CrossStackError, match="put it in a module"):  # a notebook's factory, refused before any burst
        ortlab.compare_stacks(lambda: None, "pytorch,compile@" + str(OTHER))


def test_a_bad_stack_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    r = ortlab("compare", "--backends", "pytorch,compile@curent", "--out", str(tmp_path))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "did you mean current?" in lines[0] and "Traceback" not in r.stderr
    assert not any(tmp_path.iterdir())  # refused before any burst


def test_a_notebook_factory_cannot_cross_python_versions_and_says_what_to_do():
    import ortlab.demo
    from ortlab.workload import ModelRef

    ref = ModelRef.of(lambda: ortlab.demo.gpt(n_layer=1))
    with pytest.raises(CrossStackError) as e:
        check_crossable(ref)
    assert "another stack's Python cannot load" in str(e.value) and "'module:function'" in str(e.value)
    check_crossable(ModelRef.of("ortlab.demo:gpt"))  # an import path crosses


def test_no_parity_is_refused_before_any_burst(tmp_path):
    from ortlab.comparison.cross_stack import compare

    with pytest.raises(CrossStackError, match="parity=True"):
        compare(None, SMALL, parse_placed(f"pytorch,compile@{OTHER}"), 2, out=tmp_path, parity=False)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def _no_python_path(tmp_path: Path) -> dict:
    """An environment whose PATH holds the tools bin/_env.sh's Python finder uses, and no Python nor pyenv."""
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("bash", "sed", "ls", "head", "dirname"):
        (tools / tool).symlink_to(shutil.which(tool))
    keep = {k: v for k, v in os.environ.items() if k not in ("ORTLAB_PYTHON", "PYENV_ROOT", "PYENV_VERSION")}
    return {**keep, "PATH": str(tools), "HOME": str(tmp_path)}


def test_a_stack_without_its_python_says_so_in_one_line(tmp_path, monkeypatch):
    from ortlab.engine import stack_env

    for key, value in _no_python_path(tmp_path).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("ORTLAB_PYTHON", raising=False)
    monkeypatch.setattr(stack_env, "_known", {})
    monkeypatch.setattr(stack_env, "_probed", {})
    why = stack_env.ready(OTHER)
    assert why is not None and "Python" in why and "\n" not in why
    with pytest.raises(StackError) as e:
        stack_env.environment(OTHER)
    assert str(e.value).startswith(f"the {OTHER} stack's environment cannot be built here: ")
    assert "\n" not in str(e.value)
    assert parse_stack(str(OTHER)) == OTHER and stack_env.ready(this_stack()) is None  # here: nothing to build


def _other_stack_or_skip():
    from ortlab.engine.stack_env import ready

    why = ready(OTHER)
    if why is not None:
        pytest.skip(f"the {OTHER} stack's environment cannot be built here: {why}")


@pytest.mark.slow
def test_a_comparison_across_stacks_runs_each_worker_on_its_stack_and_judges_every_pair(tmp_path):
    """Real workers: PyTorch here, torch.compile on the other stack (and ORTModule on the ort stack), one saved
    snapshot, each judged against PyTorch from the folders; the table and the recommendation name the stacks."""
    _other_stack_or_skip()
    spec = f"pytorch,compile@{OTHER},ortmodule@ort"
    r = ortlab("compare", "--backends", spec, "--steps", "3", "--model-arg", "n_layer=1", "--model-arg",
               "d_model=32", "--out", str(tmp_path), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    here = str(this_stack())
    assert d["backends"] == ["pytorch", "compile", "ortmodule"]
    assert {b: s["stack"] for b, s in d["stacks"].items()} == {"pytorch": here, "compile": str(OTHER),
                                                                "ortmodule": "ort"}
    torches = {s["stack"]: s["torch"] for s in d["stacks"].values()}
    assert torches["ort"].startswith("2.6") and torches["current"].startswith("2.14")  # each run's own torch
    for backend in ("compile", "ortmodule"):
        assert d["versus"][backend]["verdict"]["status"] == "agree", d["versus"][backend]["verdict"]
        run = Path(d[backend]["path"])
        meta = json.loads((run / "meta.json").read_text())
        assert meta["versions"]["torch"].split("+")[0] == d["stacks"][backend]["torch"]
        assert (run / "verdict.json").is_file()
    for backend in d["backends"]:  # each worker records the stack it ran on, its interpreter and its lock
        stack = json.loads((Path(d[backend]["path"]) / "meta.json").read_text())["stack"]
        assert stack["name"] == d["stacks"][backend]["stack"], (backend, stack)
        if stack["name"] == here:  # this process's workers: its own lock (None outside bin/_env.sh)
            assert stack["lock"] == os.environ.get("ORTLAB_LOCK"), (backend, stack)
        else:  # the other stack's: the one bin/_env.sh built its environment from
            assert Path(stack["lock"]).name in STACKS[Stack(stack["name"])].locks.values(), (backend, stack)
    snapshots = [json.loads((Path(d[b]["path"]) / "meta.json").read_text())["model"]["rebuild"]["snapshot"]
                 for b in d["backends"]]
    assert len(set(snapshots)) == 1 and Path(snapshots[0]).is_file()  # every worker loaded the one saved file
    line = d["recommendation"]["line"]
    assert "on the ort stack (torch 2.6" in line and "on the current stack (torch 2.14" in line

    from ortlab.comparison.summary import Comparison
    from ortlab.runs.run import load_run

    shown = Comparison(runs={b: load_run(d[b]["path"]) for b in d["backends"]}, backends=tuple(d["backends"]),
                       stacks=d["stacks"])
    header = str(shown).splitlines()[0]
    assert f"torch.compile @{OTHER} (torch " in header and "ORTModule @ort (torch 2.6" in header
    from ortlab.comparison.drift import repeats_of

    again = repeats_of(shown.pytorch)  # PyTorch timed again after the others, in its own stack's worker
    assert len(again) == 1 and again[0].meta["stack"]["name"] == here


def test_each_pair_is_judged_where_its_backend_runs():
    """Here when the backend runs in this process (two at a time against PyTorch), else in its own stack's Python:
    ORTModule from the current stack on the ort stack, where its causes can be looked for."""
    from ortlab.comparison.cross_stack import judged_on, judging_plan
    from ortlab.stacks.table import ortmodule_unavailable

    here = this_stack()
    assert judged_on("compile", OTHER) == here  # torch.compile runs on every stack: judged here
    assert judged_on("pytorch", here) == here
    assert judged_on("ortmodule", Stack.ORT) == Stack.ORT  # here on the ort stack, there from the current one
    if here == Stack.CURRENT:
        assert ortmodule_unavailable() is not None and judged_on("ortmodule", None) == Stack.ORT
    not_ort = lambda b: b != "ortmodule"  # noqa: E731 - the current stack's answer, asked on either stack
    placed = {"ortmodule": Stack.ORT, "compile": Stack.CURRENT}
    assert judging_plan(["ortmodule", "compile"], placed, Stack.CURRENT, not_ort) == [
        (Stack.ORT, ("ortmodule",)), (Stack.CURRENT, ("compile",))]
    assert judging_plan(["ortmodule", "compile"], placed, Stack.ORT, lambda b: True) == [
        (Stack.ORT, ("ortmodule", "compile"))]  # both run here: two at a time, one float64 session
    assert judging_plan(["compile", "ortmodule"], {}, Stack.CURRENT, not_ort) == [
        (Stack.CURRENT, ("compile",)), (Stack.ORT, ("ortmodule",))]  # no stack given: ORTModule's is ort
    assert judging_plan([], placed) == []


def _folder(path: Path, backend: str) -> Path:
    """A run folder as a burst without parity leaves it (a meta.json): one `ortlab judge` refuses."""
    path.mkdir()
    (path / "meta.json").write_text(json.dumps({"backend": backend, "status": "ok", "config": {"parity": False}}))
    return path


def test_a_judging_that_fails_in_the_other_python_leaves_the_runs_and_says_why(tmp_path, capsys):
    """The real `ortlab judge` in a Python of its own (this stack's here, the same code path as the other's) refuses
    the folders: its one line becomes a "not judged" verdict in the run's folder, its stderr kept beside."""
    from ortlab.comparison.cross_stack import JUDGE_LOG, judge_elsewhere
    from ortlab.comparison.summary import Comparison
    from ortlab.runs.run import load_run

    pt, ort = (load_run(_folder(tmp_path / b, b)) for b in ("pytorch", "ortmodule"))
    failed = judge_elsewhere(this_stack(), pt, [ort], progress=True)
    line = failed["ortmodule"]
    assert line.startswith(f"not judged: judging in the {this_stack()} stack's Python failed: pytorch cannot be "
                           "judged from its folder: it was not a parity burst"), line
    assert "\n" not in line and list(failed) == ["ortmodule"]
    err = capsys.readouterr().err
    assert f"in the {this_stack()} stack's Python" in err and f"ortlab: ORTModule: {line}" in err
    verdict = Comparison(runs={"pytorch": pt, "ortmodule": ort}).verdict_of("ortmodule")
    assert verdict.status == "not judged" and verdict.headline == line
    assert "ortlab judge: pytorch cannot be judged" in (tmp_path / "ortmodule" / JUDGE_LOG).read_text()
    assert (tmp_path / "pytorch" / "meta.json").is_file() and not (tmp_path / "pytorch" / "verdict.json").exists()


@pytest.mark.slow
def test_from_the_current_stack_the_ortmodule_pair_is_judged_on_the_ort_stack_with_its_causes(tmp_path):
    """`compare` started on the current stack, where ORTModule cannot run: its pair is judged by the ort stack's
    Python, which looks for the divergence's causes (ortlab check's global-avg-pool fix) as one ort process would."""
    _other_stack_or_skip()
    from ortlab.engine.stack_env import environment

    current = environment(Stack.CURRENT) if this_stack() == Stack.ORT else None
    python, env = (current.python, current.env) if current else (sys.executable, None)
    r = subprocess.run([python, "-m", "ortlab.cli", "compare", "--backends", "pytorch,ortmodule@ort,compile",
                        "--model", "ortlab.demo.divergence:squeeze_excite", "--steps", "6", "--out", str(tmp_path),
                        "--json"], capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 1, r.stderr  # ORTModule diverged
    d = json.loads(r.stdout)
    assert {b: s["stack"] for b, s in d["stacks"].items()} == {"pytorch": "current", "ortmodule": "ort",
                                                                "compile": "current"}
    ort = d["versus"]["ortmodule"]["verdict"]
    assert ort["status"] == "diverged" and "SqueezeExcite" in ort["headline"], ort
    assert any("global-avg-pool" in c["text"] for c in ort["causes"]), ort["causes"]
    assert not any("causes not looked for" in n for n in ort["notes"]), ort["notes"]
    assert any("float64 here on torch 2.6" in n for n in ort["notes"]), ort["notes"]  # computed on the ort stack
    assert json.loads((Path(d["ortmodule"]["path"]) / "verdict.json").read_text())["causes"] == ort["causes"]
    compiled = d["versus"]["compile"]["verdict"]
    assert compiled["status"] == "agree" and any("float64 here on torch 2.14" in n for n in compiled["notes"])


@pytest.fixture
def panel(tmp_path):
    from ortlab import Lab

    lab = Lab("ortlab.demo:gpt", SMALL, out=str(tmp_path), in_process=True, cuda_available=False)
    yield lab.burst_panel
    lab.close()


def test_the_burst_panel_offers_each_backend_the_stacks_ready_here(panel):
    from ortlab.engine.stack_env import ready

    if ready(OTHER) is not None:
        assert panel.stacks == {}  # no other stack here: nothing to choose
        return
    here = str(this_stack())
    assert "ortmodule" not in panel.stacks  # it runs on the ort stack only
    for chooser in panel.stacks.values():
        assert chooser.value == here and [v for _, v in chooser.options] == [here, str(OTHER)]
        assert "(torch 2." in chooser.options[1][0]
    assert panel._placed(["pytorch", "compile"]) is None  # every backend here: the session's own worker
    panel.stacks["compile"].value = str(OTHER)
    assert panel._placed(["pytorch", "compile"]) == (Placed("pytorch", this_stack()), Placed("compile", OTHER))
    assert panel._placed(["compile"]) is None  # one burst: the session's
    from ortlab.widgets.burst_panel import elsewhere_choices

    shown = dict((v, label) for label, v in panel.backend.options)
    if this_stack() == Stack.CURRENT:  # ORTModule cannot run here, but in the ort stack's worker it can
        assert elsewhere_choices() == {"ortmodule@ort": ["pytorch", "ortmodule"]}
        assert shown["ortmodule@ort"] == "PyTorch + ORTModule (ort stack)"
        assert panel._placed(panel.choices["ortmodule@ort"]) == (Placed("pytorch", Stack.CURRENT),
                                                                 Placed("ortmodule", Stack.ORT))
    else:  # ORTModule runs here: nothing to offer elsewhere
        assert elsewhere_choices() == {} and not any("@" in v for v in shown)


@pytest.mark.slow
def test_the_burst_panel_compares_across_stacks_and_names_them(panel):
    _other_stack_or_skip()
    panel.stacks["compile"].value = str(OTHER)
    offered = [v for _, v in panel.backend.options]  # all: with torch.compile (the ort stack); both (current)
    chosen = "all" if "all" in offered else "both"
    panel.backend.value, panel.steps.value = chosen, 2
    panel.run_button.click()
    panel.wait(900)
    status = panel.status.value
    assert "Traceback" not in status and "compile verdict: agree" in status, status
    assert f"on the {OTHER} stack (torch " in status and "recommendation:" in status
    assert "compile" in panel.choices[chosen]
    assert panel.progress.value == 2 * len(panel.choices[chosen])  # every step of every backend counted
    assert [r.backend for r in panel.last_runs] == panel.choices[chosen]
    assert panel.last_runs[-1].meta["versions"]["torch"] != panel.last_runs[0].meta["versions"]["torch"]


@pytest.mark.slow
def test_on_the_current_stack_the_burst_panel_compares_with_ortmodule_on_the_ort_stack(panel):
    """The Lab opened on the newest torch still answers stay or move: PyTorch here beside ORTModule in the ort
    stack's worker, judged there (where ORTModule runs), its torch named."""
    if this_stack() != Stack.CURRENT:
        pytest.skip("ORTModule runs in this process here: the Lab offers it directly (the current stack tests this)")
    _other_stack_or_skip()
    panel.backend.value, panel.steps.value = "ortmodule@ort", 2
    panel.run_button.click()
    panel.wait(900)
    status = panel.status.value
    assert "Traceback" not in status and "ortmodule verdict: agree" in status, status
    assert "on the ort stack (torch 2.6" in status and "recommendation:" in status
    assert [r.backend for r in panel.last_runs] == ["pytorch", "ortmodule"]
    assert panel.last_runs[1].meta["versions"]["torch"].startswith("2.6")
