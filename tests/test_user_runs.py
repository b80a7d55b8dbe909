"""The user's runs only: what ortlab runs for its own purposes (Tune's measurements and guards, the plans' bursts, a
verdict's evidence) is kept under what asked for it, and no answer of ortlab.runs.groups, no listing and no tab of
the Lab offers it as the user's."""

from pathlib import Path

import pytest

from ortlab.engine.backends import BACKENDS
from ortlab.reporting.labels import labels
from ortlab.reporting.listing import list_runs
from ortlab.runs import groups
from ortlab.runs.run import RunStatus, RunWriter, load_run, new_run_dir

START = {"factory": "ortlab.demo:gpt"}


def _run(out: Path, backend: str, name: str | None = None, started: str = "2026-11-28T10:00:00", **config):
    path = new_run_dir(out, backend, name)
    writer = RunWriter(path, {"backend": backend, "model": START, "started": started,
                              "config": {"steps": 3, "parity": True, "seed": 0, "name": name, **config}})
    writer.step({"step": 0, "loss": 1.0, "step_time_s": 0.01})
    writer.finish(RunStatus.OK)
    return load_run(path)


def test_the_runs_ortlab_made_for_itself_are_not_the_users(tmp_path):
    pytorch = _run(tmp_path, "pytorch", started="2026-11-28T10:00:00")
    ort = _run(tmp_path, "ortmodule", started="2026-11-28T10:00:01")
    tuning = tmp_path / "20261128-100100-tune"
    guard_ref = _run(groups.own_folder(tuning), "pytorch", "tune-reference", started="2026-11-28T10:01:00")
    guard = _run(groups.own_folder(tuning), "ortmodule", "tune-guard-1", started="2026-11-28T10:01:01")
    groups.mark_asked(guard, tuning, "tune")
    evidence = _run(groups.own_folder(ort.path), "pytorch", "pytorch-noise", started="2026-11-28T10:00:02")
    older = _run(tmp_path, "ortmodule", "plans-set1", started="2026-11-28T10:02:00")  # a folder of older runs
    runs = [pytorch, ort, guard_ref, guard, evidence, older]

    assert load_run(guard.path).meta["asked_by"] == {"folder": tuning.name, "purpose": "tune"}
    assert groups.asked_by(guard_ref)["folder"] == tuning.name  # by its folder alone
    assert groups.asked_by(older) is not None and groups.asked_by(ort) is None
    assert groups.users(runs) == [pytorch, ort]
    assert sorted(r.path for r in groups.in_folder(tmp_path)) == sorted([pytorch.path, ort.path])
    every = {r.path for r in groups.in_folder(tmp_path, asked=True)}
    assert {guard.path, guard_ref.path, evidence.path, older.path} <= every
    assert groups.newest(runs, BACKENDS, "onnx_stages").path == ort.path  # not the plans' run, newer
    assert [r.path for r in groups.newest_comparison(runs, BACKENDS)] == [pytorch.path, ort.path]
    assert [(a.path, b.path) for a, b in groups.pairs(runs, BACKENDS)] == [(pytorch.path, ort.path)]
    assert groups.reference_of(guard, runs, BACKENDS) is None or guard not in groups.users(runs)
    assert sorted(list_runs(tmp_path)["run"]) == sorted([pytorch.path.name, ort.path.name])
    assert len(list_runs(tmp_path, asked=True)) == 6


def test_a_label_reads_what_differs_in_words(tmp_path):
    auto = _run(tmp_path, "ortmodule", fixes="auto")
    named = _run(tmp_path, "ortmodule", fixes=["group-norm", "instance-norm"])
    none = _run(tmp_path, "ortmodule", fixes=[])
    found = labels([auto, named, none])
    assert found == ["ortmodule · fixes: auto", "ortmodule · fixes: group-norm, instance-norm", "ortmodule · no fixes"]
    assert not any("a, u, t, o" in label for label in found)


@pytest.mark.slow
@pytest.mark.ort
def test_after_tune_and_find_plans_the_lab_shows_the_users_burst_only(tmp_path):
    from ortlab import Lab
    from ortlab.cli import main

    lab = Lab(out=tmp_path, in_process=True, cuda_available=False)
    try:
        burst = lab.burst_panel
        burst.backend.value, burst.steps.value = "all", 3  # PyTorch, ORTModule, torch.compile: the move's pair
        burst.run(wait=True)
        assert burst.last_verdict is not None, burst.status.value
        verdict = burst.last_verdict.status
        user = [r.path for r in lab.runs]
        assert [r.backend for r in lab.runs] == ["pytorch", "ortmodule", "compile"]

        tune = lab.extra_panels["Tune"]
        tune.steps.value, tune.budget.value = 5, 3
        tune.run(wait=True, only=["enable_compute_optimizer"], repeats=2, guard_steps=2)
        assert tune.result is not None and tune.result.runs, tune.status.value
        assert all(groups.OWN in r.path.parts for r in tune.result.runs.values())
        recompute = lab.extra_panels["Recompute"]
        recompute.steps.value = 2
        recompute.find(wait=True)
        assert recompute.plans_run is not None and groups.asked_by(recompute.plans_run) is not None

        assert [r.path for r in lab.runs] == user  # the Lab's runs: the user's burst alone
        assert sorted(r.path for r in groups.in_folder(tmp_path)) == sorted(user)  # and the folder's
        earlier = burst._earlier_curves()
        assert len(earlier) == 3 and not any("tune" in k or "memory_opt" in k for k in earlier), earlier
        report = lab.extra_panels["Report"]
        assert all(p.name in report.about.value for p in user) and "tune-" not in report.about.value
        move = lab.extra_panels["Move"]  # the user's ORTModule burst, judged as the user's burst was
        assert move.report is not None, move.result.value
        assert move.report.ortmodule.run == user[1].name and move.report.ortmodule.verdict == verdict
        assert "neither run has a verdict" not in move.result.value
        assert [label for label, _ in lab.log_panel.run.options] == [f"{p.name} (ok)" for p in reversed(user)]
        assert verdict in ("agree", "diverged", "not judged")
        # the tuning's own results still read: tune.json names its runs where they are
        assert (tune.result.path / "tune.json").is_file() and all(p.is_dir() for p in (
            r.path for r in tune.result.runs.values()))
        page = report.write()
        assert page is not None and "tune-guard" not in page.read_text(encoding="utf-8")
    finally:
        lab.close()
    import contextlib
    import io

    def runs_printed(*flags: str) -> list[str]:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            assert main(["runs", str(tmp_path), *flags]) == 0
        return printed.getvalue().splitlines()

    listed = [line.split()[0] for line in runs_printed() if line[:8].isdigit()]
    assert sorted(listed) == sorted(p.name for p in user)
    every = runs_printed("--asked")
    assert any("tune-baseline-1" in line for line in every) and any(line.startswith("made by ortlab") for line in every)


def test_the_noise_floors_repeats_are_kept_under_the_run_they_measure(tmp_path):
    from ortlab.activations import noise_floor
    from ortlab.engine.session import Session

    factories = Path(__file__).parent / "factories" / "activations.py"
    with Session(f"{factories}:own_rng", {"module": "blocks.0.mlp.1"}, out=tmp_path, in_process=True) as s:
        run = s.burst("pytorch", 2, parity=True, progress=False, collect={"stats": {}})
        noise_floor(s, run)
        assert s.runs == [run]  # the session's runs: the user's
    assert [r.path for r in groups.in_folder(tmp_path)] == [run.path]
    repeats = [load_run(p.parent) for p in groups.own_folder(run.path).glob("*/meta.json")]
    assert len(repeats) == 2 and all(groups.asked_by(r)["purpose"] == "noise floor" for r in repeats)
