"""The localizer (ortlab.verdict.localize) and `ortlab repro`: a wrong ORT gradient shrunk to the module that
reproduces it alone, the model left as it was, and a script a user keeps that exits 1 while ORT is wrong."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ortlab.verdict.localize import INPUT, REPRODUCES, SKIPPED, Localization, Tried, _taps, worst_text

slow = pytest.mark.slow
FACTORIES = Path(__file__).resolve().parent / "factories"
SMALL = f"{FACTORIES / 'localize.py'}:nested"
CORRECT = f"{FACTORIES / 'localize.py'}:correct"
ZOO = os.environ.get("ORTLAB_ZOO_PACKAGES")
# the script runs where ortlab cannot be imported: it needs only torch and onnxruntime-training
WITHOUT_ORTLAB = "import runpy, sys; sys.modules['ortlab'] = None; sys.argv = sys.argv[1:]; " \
                 "runpy.run_path(sys.argv[0], run_name='__main__')"


def class_line(name: str) -> int:
    lines = (FACTORIES / "localize.py").read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.startswith(f"class {name}("))


def _ort_alone(model):
    """How the localizer runs a module on ORTModule (no fixes), as the engine's ORTModule backend says."""
    from ortlab.engine.backends.ort import OrtBackend

    return OrtBackend(model).alone(None, (), Path(os.devnull))


def run_script(script: Path, extra_path: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if extra_path:
        env["PYTHONPATH"] = extra_path
    return subprocess.run([sys.executable, "-c", WITHOUT_ORTLAB, str(script)], capture_output=True, text=True,
                          env=env, cwd=script.parent, timeout=900)


# --------------------------------------------------------------------------- the pieces, without ORT


def test_a_localization_reads_as_one_line_and_round_trips():
    worst = {"tensor": "fc1.weight", "candidate": 1.8e-3, "pytorch": 1e-4, "allowed": 3.2e-4, "factor": 18.04,
             "ratio": 5.6, "diverged": True}
    found = Localization("features.1.0.block.1", "torchvision.ops.misc.SqueezeExcitation",
                         "/env/lib/python3.11/site-packages/torchvision/ops/misc.py", 262, worst,
                         [Tried("", "EfficientNet", REPRODUCES, 30.0), Tried("features.0", "X", SKIPPED, 0.0, "why")],
                         scale=2.0)
    assert found.text == ("the divergence reproduces in features.1.0.block.1 (torchvision.ops.misc.SqueezeExcitation, "
                          ".../torchvision/ops/misc.py:262) alone: ORT's gradient of fc1.weight is 18x further from "
                          "float64 than PyTorch's")
    assert Localization("x", "X", worst={**worst, "norm": 0.09}).text.endswith(
        "18x further from float64 than PyTorch's (an error of 2% of its norm)")
    back = Localization.from_dict(json.loads(json.dumps(found.to_dict())))
    assert back == found and back.to_dict()["text"] == found.text and back.exports == 1
    assert Localization("", "Net", None, None, worst).text.startswith("the divergence reproduces only in the whole "
                                                                       "model (Net): ")
    assert not Localization(None, note="no luck").found
    assert worst_text({**worst, "factor": 2.345}).endswith("is 2.3x further from float64 than PyTorch's")
    assert worst_text({**worst, "factor": 5e4, "norm": 1.7e-3}).endswith("5e+04x further from float64 than "
                                                                         "PyTorch's (an error of 106% of its norm)")
    assert worst_text({**worst, "factor": 6e33, "candidate": 7e24, "norm": 0.1}).endswith(
        "is 6e+33x further from float64 than PyTorch's (an error of 7e+25 times its norm)")
    assert worst_text({**worst, "tensor": INPUT, "pytorch": 0.0}) == (
        "ORT's gradient of its input is 0.0018 from float64, where PyTorch's is exact")
    assert worst_text({**worst, "candidate": math.inf}) == "ORT's gradient of fc1.weight is not finite"


def test_a_tap_records_a_modules_own_input_gradient_not_the_residuals():
    from tests.factories.localize import Block

    torch.manual_seed(0)
    block = Block(4)
    x = torch.randn(2, 4, 5, 5, requires_grad=True)
    with _taps({"conv": block.conv, "project": block.project}) as tap:
        block(x).square().sum().backward()
    assert tap.order == ["conv", "project"]
    own = x.detach().requires_grad_(True)  # the block's input through its conv only: the residual left out
    (x.detach() + block.project(block.se(block.conv(own)))).square().sum().backward()
    assert torch.allclose(tap.grads["conv"], own.grad) and not torch.allclose(tap.grads["conv"], x.grad)
    assert not block.conv._forward_pre_hooks and not block.project._forward_pre_hooks


def _fake_run(folder: Path, backend: str, verdict: dict | None) -> Path:
    from ortlab.runs.run import RunWriter, write_json

    path = folder / f"run-{backend}"
    path.mkdir()
    RunWriter(path, {"backend": backend, "config": {"backend": backend}}).finish("ok")
    if verdict is not None:
        write_json(path / "verdict.json", verdict)
    return path


@pytest.mark.parametrize("backend,verdict,says", [
    ("pytorch", None, "is a pytorch run; ortlab repro needs an ORTModule or torch.compile run"),
    ("ortmodule", None, "has no verdict; compare it with PyTorch first"),
    ("ortmodule", {"status": "agree", "gradients": {"agree": True}}, "verdict is 'agree': nothing to reproduce"),
    ("ortmodule", {"status": "diverged", "gradients": {"agree": True}}, "its first step's gradients agree"),
])
@pytest.mark.ort
def test_repro_refuses_a_run_without_a_gradient_divergence_in_one_line(tmp_path, backend, verdict, says):
    path = _fake_run(tmp_path, backend, verdict)
    done = subprocess.run([sys.executable, "-m", "ortlab.cli", "repro", str(path)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and says in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert not (path / "repro").exists()


def test_repro_asks_for_the_model_when_the_run_cannot_name_it(tmp_path):
    import ortlab

    path = _fake_run(tmp_path, "ortmodule", {"status": "diverged", "gradients": {"agree": False}})
    with pytest.raises(ortlab.InputError, match="pass it: ortlab repro RUN --model module:callable"):
        ortlab.repro(path)


@pytest.mark.ort
def test_a_stored_localization_that_found_nothing_is_reported_exit_1(tmp_path):
    path = _fake_run(tmp_path, "ortmodule", {"status": "diverged", "gradients": {"agree": False},
                                             "localized": {"path": None, "note": "no module reproduces it"}})
    done = subprocess.run([sys.executable, "-m", "ortlab.cli", "repro", str(path)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1, done.stderr
    assert done.stdout.strip() == "the divergence does not reproduce against float64: no module reproduces it"


def test_localize_takes_the_fixes_a_run_applied_by_name_not_auto(tmp_path):
    from ortlab import Session
    from ortlab.compat.registry import FixError

    with Session(SMALL, out=tmp_path, in_process=True) as s, pytest.raises(FixError, match="not 'auto'"):
        s.localize(fixes="auto")


# --------------------------------------------------------------------------- on ORTModule


def _workload(ref: str):
    from ortlab.workload import ModelRef

    torch.manual_seed(0)
    return ModelRef.of(ref).build()


@slow
@pytest.mark.ort
def test_the_wrong_gradient_shrinks_to_the_se_block_and_the_model_is_left_as_it_was():
    from ortlab.verdict.localize import localize

    workload = _workload(SMALL)
    model = workload.model
    model.blocks[0].conv[1].eval()  # a mode of its own, which an ORTModule over its block would overwrite
    grads = {n: torch.full_like(p, 0.5) for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        p.grad = grads[n]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    modules = list(model.named_modules())
    modes = [m.training for _, m in modules]
    seen = []
    found = localize(workload, workload.batch(0), _ort_alone(model),
                     progress=lambda n, row: seen.append((n, row.path, row.verdict)))
    assert found.found and found.path in ("blocks.0.se", "blocks.1.se"), found.text
    assert found.class_name == "ortlab_user_localize.SqueezeExcite"
    assert (found.file, found.line) == (str(FACTORIES / "localize.py"), class_line("SqueezeExcite"))
    assert found.worst["diverged"] and not found.worst["candidate"] <= found.worst["allowed"]  # ORT's may be NaN
    assert found.text.startswith(f"the divergence reproduces in {found.path} (ortlab_user_localize.SqueezeExcite, ")
    # bisected: the root first, then one module per level, then each child of the SE block, none reproducing
    tried = [t.path for t in found.tried]
    assert tried[0] == "" and [n for n, _, _ in seen] == list(range(1, len(tried) + 1))
    assert {t.path for t in found.tried if t.path.startswith(found.path + ".")} == {
        f"{found.path}.{c}" for c in ("avgpool", "fc1", "act", "fc2", "gate")}
    assert all(t.verdict != REPRODUCES for t in found.tried if t.path.startswith(found.path + "."))
    assert "stem" not in tried and "head" not in tried and len(tried) <= 11
    # the model exactly as it was: the same module objects, state, gradients, modes, no hooks
    assert [(n, id(m)) for n, m in model.named_modules()] == [(n, id(m)) for n, m in modules]
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is grads[n] for n, p in model.named_parameters())
    assert [m.training for _, m in modules] == modes
    assert not any(m._forward_pre_hooks or m._forward_hooks or m._backward_hooks for m in model.modules())


@slow
@pytest.mark.ort
def test_a_model_whose_ort_gradients_are_right_localizes_nothing():
    from ortlab.verdict.localize import localize

    workload = _workload(CORRECT)
    found = localize(workload, workload.batch(0), _ort_alone(workload.model))
    assert not found.found and [t.path for t in found.tried] == [""], found.text
    assert found.text.startswith("the divergence does not reproduce against float64: ORT's gradients over "
                                 "the whole model are as close to float64 as PyTorch's")


@slow
@pytest.mark.ort
def test_the_repro_script_of_a_correct_module_exits_0(tmp_path):
    from ortlab.verdict.repro_case import write

    workload = _workload(CORRECT)
    found = Localization("blocks.1.se", "SqueezeExcite", scale=1.0)
    files = write(workload, workload.batch(0), found, tmp_path)
    done = run_script(Path(files["script"]))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ORT's gradients are as close to float64 as PyTorch fp32's" in done.stdout
    assert "<input>" in done.stdout and "fc1.weight" in done.stdout


@slow
@pytest.mark.ort
def test_the_command_repro_prints_runs_its_script_from_a_fresh_shell_anywhere(tmp_path):
    """"run it: ..." works as printed from a shell whose `python` is not the environment's (none at all here), in
    another folder, without PYTHONPATH; the module's class comes from a package that imports itself relatively."""
    import shlex

    from ortlab.verdict.repro import Repro
    from ortlab.verdict.repro_case import write

    workload = _workload("tests.factories.repro_pkg:correct")
    found = Localization("blocks.1.se", "tests.factories.repro_pkg.PackagedSqueezeExcite", scale=1.0)
    (tmp_path / "repro").mkdir()
    files = write(workload, workload.batch(0), found, tmp_path / "repro")
    text = Repro("run", found, Path(files["script"]), Path(files["script"]).with_suffix(".pt")).text
    command = text.split("run it: ", 1)[1].split(" (exit 1", 1)[0]
    shell = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/"), "OMP_NUM_THREADS": "1"}
    try:
        done = subprocess.run(shlex.split(command), capture_output=True, text=True, env=shell, cwd="/",
                              timeout=900)
    except FileNotFoundError as e:
        pytest.fail(f"{command!r} does not run from a fresh shell: {e}")
    assert done.returncode == 0, (command, done.stdout + done.stderr)
    assert "ORT's gradients are as close to float64 as PyTorch fp32's" in done.stdout


@slow
@pytest.mark.ort
def test_ortlab_repro_writes_a_script_that_shows_the_wrong_gradient_with_bare_ortmodule(tmp_path):
    from ortlab import Session
    from ortlab.verdict.localize import LOCALIZED

    with Session(SMALL, out=tmp_path) as s:
        comparison = s.compare(steps=1, parity=True, progress=False)
    run = comparison.ortmodule
    assert comparison.verdict.diverged and not comparison.verdict.gradients["agree"], str(comparison.verdict)
    done = subprocess.run([sys.executable, "-m", "ortlab.cli", "repro", str(run.path)], capture_output=True,
                          text=True, timeout=1800)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("the divergence reproduces in blocks."), done.stdout
    assert "[1] (the whole model) (ortlab_user_localize.Net): reproduces" in done.stderr
    # down to ORT's graph node: the gradient of the gate's broadcasting Mul is never reduced to the gate's shape
    assert "first op beyond float64's rounding: ai.onnx.Identity (#11, backward, in Mul_Grad/Identity_3): it writes " \
           "the gradient of gate/Sigmoid_output_0 in shape [2, 8, 12, 12], where that tensor is [2, 8, 1, 1]" \
        in done.stdout, done.stdout
    marked = [line for line in done.stdout.splitlines() if line.startswith(">>")]
    assert len(marked) == 1 and "Mul_Grad/Identity_3" in marked[0], done.stdout
    stored = json.loads((run.path / "verdict.json").read_text())[LOCALIZED]
    assert stored["path"] in ("blocks.0.se", "blocks.1.se") and stored["tried"]
    scripts = list((run.path / "repro").glob("repro_*.py"))
    assert [p.name for p in scripts] == [f"repro_{stored['path'].replace('.', '_')}.py"]
    assert scripts[0].with_suffix(".pt").is_file()
    shown = run_script(scripts[0])
    assert shown.returncode == 1, shown.stdout + shown.stderr
    assert "WRONG: ORT's gradient of " in shown.stdout and "further from float64 than PyTorch fp32's" in shown.stdout
    # the second time the stored localization is reused: no module is tried again
    import ortlab

    again = ortlab.repro(run, tmp_path / "again", progress=lambda n, row: pytest.fail("localized again"))
    assert again.localization.path == stored["path"] and again.script.parent == tmp_path / "again"


@slow
@pytest.mark.ort
def test_the_session_localizes_in_its_worker_with_progress(tmp_path):
    from ortlab import Session

    seen = []
    with Session(SMALL, out=tmp_path) as s:
        found = s.localize(progress=lambda n, row: seen.append((n, row.path)))
        assert s.worker_pid is not None
    assert found.found and found.path.endswith(".se") and found.tried[0].path == ""
    assert seen == [(i + 1, t.path) for i, t in enumerate(found.tried)]


# --------------------------------------------------------------------------- torchvision's SE blocks


@slow
@pytest.mark.timeout(3600)
@pytest.mark.skipif(not ZOO, reason="needs the zoo side folder ($ORTLAB_ZOO_PACKAGES, bin/_env.sh sets it)")
@pytest.mark.parametrize("name", ["efficientnet_b0", "regnet_y_400mf"])
def test_torchvision_se_divergence_shrinks_to_its_squeeze_and_excitation_block(name, tmp_path):
    from ortlab import Session

    with Session(f"{FACTORIES / 'zoo_se.py'}:{name}", out=tmp_path) as s:
        found = s.localize(repro=tmp_path)
    assert found.class_name == "torchvision.ops.misc.SqueezeExcitation", found.text
    assert found.file.endswith("torchvision/ops/misc.py") and found.line > 0
    assert all(t.verdict != REPRODUCES for t in found.tried if t.path.startswith(found.path + "."))
    print(f"{name}: {found.text}; {len(found.tried)} modules tried, {found.exports} exports, "
          f"{found.seconds:.0f} s", file=sys.stderr)
    shown = run_script(Path(found.repro["script"]), ZOO)
    assert shown.returncode == 1, shown.stdout + shown.stderr
    assert "WRONG: ORT's gradient of " in shown.stdout


def test_the_repro_template_has_the_one_case_line_the_writer_fills():
    """The script template's `CASE = {}` (annotated for the type checker or not) is found once: a template the
    writer cannot fill writes scripts that fail with KeyError instead of judging the module."""
    from ortlab.verdict.repro_case import _CASE_LINE, TEMPLATE

    assert len(_CASE_LINE.findall(TEMPLATE.read_text())) == 1


def test_a_cause_search_that_fails_never_costs_the_verdict(tmp_path):
    """The statistics bursts of a localization came back without statistics (what a torch.compile run on a model
    it lowers wrongly once gave: "<run>-localize-compile holds no statistics", and the comparison's table and
    verdict were lost): the cause reads "could not localize" with the reason."""
    from ortlab.engine.config import BurstConfig
    from ortlab.engine.session import Session
    from ortlab.verdict import procedure

    with Session("ortlab.demo:gpt", {"n_layer": 1, "d_model": 16}, out=tmp_path, in_process=True) as session:
        made = [session.burst("pytorch", 1, parity=True, progress=False) for _ in range(2)]

        class NoStatistics:  # the session's own bursts, made without the statistics the localization asked for
            shell_options = session.shell_options

            def evidence_burst(self, config):
                return made.pop(0)

        cause = procedure.localize(NoStatistics(), BurstConfig(backend="pytorch"), BurstConfig(backend="pytorch"))
    assert cause["kind"] == "localized" and cause["text"].startswith("could not localize: "), cause
    assert "StatsFileError" in cause["text"] and "statistics" in cause["text"]


@slow
@pytest.mark.timeout(900)
def test_a_compile_run_that_diverges_keeps_its_table_verdict_and_exit_code(tmp_path):
    """A model whose torch.compile lowering computes one op wrong (tests/factories/compile_differs.py): the
    comparison prints its table and a DIVERGED verdict naming the gradient, exits 1, whatever its cause search
    found."""
    done = subprocess.run([sys.executable, "-m", "ortlab.cli", "burst", "--model",
                           f"{FACTORIES / 'compile_differs.py'}:model", "--backend", "pytorch,compile", "--parity",
                           "--steps", "3", "--no-memory", "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=850)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "final loss" in done.stdout and "compile verdict: DIVERGED:" in done.stdout, done.stdout[-3000:]
    assert "torch.compile's gradient of out.weight" in done.stdout
    verdict = json.loads(next(tmp_path.glob("*-compile/verdict.json")).read_text())
    assert verdict["status"] == "diverged" and verdict["causes"], verdict
