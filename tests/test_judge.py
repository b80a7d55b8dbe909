"""`ortlab judge`: two run folders made by separate processes judged as a comparison in one process judges them
(ortlab.verdict.record, ortlab.verdict.folders). Real bursts in subprocesses, real verdicts; the in-process
Session.judge of the same two runs is the yardstick."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

DEMO = "ortlab.demo:gpt"
SMALL = ("--model-arg", "n_layer=1", "--model-arg", "d_model=32")  # the demo, smaller: a quicker burst


def ortlab(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "ortlab.cli", *args], capture_output=True, text=True, timeout=timeout)


def burst(out: Path, backend: str, *args: str, model: str = DEMO, steps: int = 3) -> Path:
    """One parity burst in its own process (a folder of its own under `out`): its run folder."""
    r = ortlab("burst", "--model", model, "--backend", backend, "--parity", "--steps", str(steps),
               "--out", str(out), "--json", *args)
    assert r.returncode == 0, r.stderr
    return Path(json.loads(r.stdout)["path"])


def judged(*args: str) -> tuple[int, list[dict], str]:
    r = ortlab("judge", *map(str, args), "--json")
    return r.returncode, json.loads(r.stdout) if r.returncode in (0, 1) else [], r.stderr


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """PyTorch and torch.compile parity bursts of the demo, each made by its own `ortlab burst` process."""
    root = tmp_path_factory.mktemp("judge")
    return root, burst(root / "pytorch", "pytorch", *SMALL), burst(root / "compile", "compile", *SMALL)


def test_a_parity_burst_records_what_a_verdict_needs_elsewhere(demo):
    from ortlab.runs.run import load_run
    from ortlab.runs.snapshot import Snapshot
    from ortlab.verdict import record

    _, pt, _ = demo
    kept = record.read(load_run(pt))
    assert kept["snapshot_file"] == record.SNAPSHOT and kept["first_step_summary"] == record.SUMMARY
    assert "first_step" not in kept and not (pt / record.GRADIENTS).exists()  # summaries only, unless asked
    assert len(kept["batches"]) == 3 and len(set(kept["batches"])) == 3  # each step's batch, each its own
    snapshot = Snapshot.load(pt / record.SNAPSHOT)
    assert record.snapshot_hash(snapshot) == kept["snapshot"]  # the file the hash names
    name = next(k for k, v in snapshot.model.items() if v.is_floating_point())
    snapshot.model[name].view(-1)[0] += 1e-6  # a last bit moved: another start
    del snapshot._sha256
    assert record.snapshot_hash(snapshot) != kept["snapshot"]
    step = record.first_step(load_run(pt))
    rows = [json.loads(line) for line in (pt / "metrics.jsonl").read_text().splitlines()]
    assert step.loss == pytest.approx(rows[0]["loss"], rel=1e-6)
    assert step.grads and all(g is None or g.finite for g in step.grads.values())


def test_judge_gives_the_verdict_of_the_comparison_in_one_process(demo, tmp_path):
    """PyTorch against torch.compile (both stacks): two processes' folders judged from disk, and the same two runs
    judged by a session in this process."""
    from ortlab.engine.session import Session
    from ortlab.runs.run import load_run

    _, pt, comp = demo
    code, out, err = judged(pt, comp, "--out", tmp_path)
    assert code in (0, 1), err
    assert len(out) == 1 and out[0]["backend"] == "compile" and out[0]["pytorch"] == str(pt)
    verdict = out[0]["verdict"]
    assert verdict["status"] in ("agree", "diverged")
    assert any("judged from two run folders" in n for n in verdict["notes"])
    assert code == (0 if verdict["status"] == "agree" else 1)
    session = Session(DEMO, {"n_layer": 1, "d_model": 32}, out=tmp_path / "in-process", in_process=True)
    here = session.judge(load_run(pt), load_run(comp))
    assert here.status == verdict["status"]
    assert here.gradients["judged_by"] == verdict["gradients"]["judged_by"]
    assert here.gradients["worst"][0]["parameter"] == verdict["gradients"]["worst"][0]["parameter"]


def test_judge_refuses_runs_that_did_not_start_alike_in_one_line(demo, tmp_path):
    """Another model (another snapshot), other batches, another seed, a burst not in parity mode: each refused in
    one line naming what differs (those runs made in this process: a folder is a folder)."""
    from ortlab.engine.session import Session

    _, pt, comp = demo
    small = {"n_layer": 1, "d_model": 32}
    session = Session(DEMO, small, out=tmp_path, in_process=True)
    cases = [(Session(DEMO, {**small, "n_layer": 2}, out=tmp_path, in_process=True), {},
              "did not start from the same snapshot"),
             (Session(DEMO, {**small, "batch_size": 4}, out=tmp_path, in_process=True), {},
              "did not train on the same batches: step 0"),
             (session, {"seed": 1}, "seed 1 vs 0"),
             (session, {"parity": False}, "not a parity burst")]
    for maker, kwargs, said in cases:
        run = maker.burst("pytorch", 3, **{"parity": True, "progress": False, **kwargs})
        code, _, err = judged(run.path, comp)
        assert code == 2, err
        assert said in err and err.startswith("ortlab judge: ") and err.count("\n") == 1, err
    code, _, err = judged(pt, pt)
    assert code == 2 and "both runs are PyTorch's" in err
    code, _, err = judged(pt, comp, "--reference", comp)
    assert code == 2 and "the reference is a PyTorch run" in err


@pytest.mark.slow
@pytest.mark.ort
def test_judge_finds_ortmodules_wrong_squeeze_excitation_gradient_from_folders(tmp_path):
    """ORTModule's wrong gradient through a squeeze-and-excitation block: DIVERGED from the two folders as in one
    process, the SE module named; and ORTModule against torch.compile, each judged against the PyTorch reference."""
    import ortlab
    from ortlab.engine.session import Session
    from ortlab.runs.run import load_run

    model = "ortlab.demo.divergence:squeeze_excite"
    runs = {b: burst(tmp_path / b, b, model=model) for b in ("pytorch", "ortmodule", "compile")}
    code, out, err = judged(runs["ortmodule"], runs["compile"], "--reference", runs["pytorch"], "--out",
                            tmp_path / "evidence")
    assert code == 1, err
    by = {j["backend"]: j["verdict"] for j in out}
    assert by["ortmodule"]["status"] == "diverged" and "SqueezeExcite" in by["ortmodule"]["headline"]
    assert any("global-avg-pool" in c["text"] for c in by["ortmodule"]["causes"])
    assert by["compile"]["status"] == "agree"
    again = ortlab.judge_runs(runs["pytorch"], runs["ortmodule"], out=tmp_path / "evidence")
    assert [j.verdict.status for j in again] == ["diverged"]
    session = Session(model, out=tmp_path / "in-process", in_process=True)
    assert session.judge(load_run(runs["pytorch"]), load_run(runs["ortmodule"])).status == "diverged"
