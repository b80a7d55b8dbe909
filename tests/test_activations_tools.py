"""The noise floor, bisection over ORTModule options, and the `diff | merge | bisect` commands, on real
bursts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ortlab import Session
from ortlab.activations import ActivationsError, bisect, compare, noise_floor
from ortlab.cli import main as run_cli

FACTORIES = Path(__file__).parent / "factories" / "activations.py"
STATS = {"stats": {}}


@pytest.mark.slow  # exports with ORTModule
@pytest.mark.ort
def test_noise_floor_names_randomness_that_escapes_parity_mode(tmp_path):
    model = f"{FACTORIES}:handmade_dropout"
    with Session(model, {"module": "blocks.0.attn"}, out=tmp_path, in_process=True) as s:
        c = s.compare(3, parity=True, progress=False, collect=STATS)
        floor = noise_floor(s, c.pytorch)
    assert floor.deterministic  # the same seed gives the same run, to the last bit
    assert (floor.seed_dependent.step, floor.seed_dependent.name) == (0, "blocks.0.attn")
    assert "random in parity mode" in str(floor) and "another random op" in str(floor)
    per_tensor = floor.floor.set_index(["phase", "name"])
    assert per_tensor.loc[("forward", "blocks.0.attn"), "floor_samples"] > 0.01  # dropped values
    assert per_tensor.loc[("forward", "tok"), "floor_mean"] < 1e-4  # only the updates after step 0 moved it
    raw, against = compare(c), compare(c, noise=floor)
    assert raw.first.name == "blocks.0.attn"  # ORT's dropout draws other numbers than PyTorch's
    assert against.table["diverged"].sum() < raw.table["diverged"].sum()
    with pytest.raises(ActivationsError, match="repeats a PyTorch run"):
        noise_floor(s, c.ortmodule)


def test_noise_floor_names_what_is_not_deterministic(tmp_path):
    with Session(f"{FACTORIES}:own_rng", {"module": "blocks.0.mlp.1"}, out=tmp_path, in_process=True) as s:
        run = s.burst("pytorch", 2, parity=True, progress=False, collect=STATS)
        floor = noise_floor(s, run)
    assert not floor.deterministic
    assert (floor.nondeterministic.step, floor.nondeterministic.name) == (0, "blocks.0.mlp.1")
    assert str(floor).splitlines()[1].startswith("not deterministic: two PyTorch bursts with seed 0 differ, "
                                                 "first at step 0, forward: blocks.0.mlp.1")


@pytest.mark.slow  # exports with ORTModule
@pytest.mark.ort
def test_bisect_finds_the_toggle_that_removes_a_divergence(tmp_path):
    with Session(model_kwargs={"n_layer": 1}, out=tmp_path, in_process=True) as s:
        result = bisect(session=s, steps=2, parity=False, candidates=["enable_compute_optimizer", "parity"])
    d = result.divergence
    assert (d.step, d.phase, d.name, d.previous) == (0, "forward", "drop", "tok")  # dropout's other numbers
    rows = result.rows.set_index("option")
    assert not rows.loc["enable_compute_optimizer", "disappears"]
    assert rows.loc["parity", "disappears"] and rows.loc["parity", "evidence"] == "statistics"
    assert result.fixes == ["parity=True"]
    assert "disappears with: parity=True" in str(result)
    with pytest.raises(Exception, match="bisect candidate 'warp_speed' is not known"):
        bisect(session=s, steps=1, parity=False, candidates=["warp_speed"])


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    with Session(f"{FACTORIES}:injected", {"step": 1}, out=out, in_process=True) as s:
        injected = s.burst("pytorch", 3, parity=True, progress=False, collect=STATS)
    with Session(f"{FACTORIES}:injected", {"step": None}, out=out, in_process=True) as s:
        plain = s.burst("pytorch", 3, parity=True, progress=False, collect=STATS)
        again = s.burst("pytorch", 3, parity=True, progress=False, collect=STATS)
    return plain, again, injected


def test_cli_diff(three_runs, capsys):
    plain, again, injected = three_runs
    assert run_cli(["diff", str(plain.path), str(again.path)]) == 0
    assert "no divergence beyond tolerance" in capsys.readouterr().out
    assert run_cli(["diff", str(plain.path), str(injected.path), "--top", "3"]) == 1
    out = capsys.readouterr().out
    assert "first divergence: step 1, forward: blocks.1.mlp.0" in out and "largest differences" in out
    assert run_cli(["diff", str(plain.path), str(injected.path), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["first"]["name"] == "blocks.1.mlp.0" and data["first"]["previous"] == "blocks.1.ln2"


@pytest.mark.ort
def test_cli_bad_input_is_one_line_and_exit_2(three_runs, tmp_path, capsys):
    plain, _, _ = three_runs

    def fails(argv: list[str], *expected: str) -> None:
        assert run_cli(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"ortlab {argv[0]}: "), err
        assert all(text in err for text in expected), err

    fails(["diff", str(plain.path), str(tmp_path / "nowhere")], "B '", "does not exist")
    fails(["diff", str(plain.path), str(tmp_path)], "is neither an ortlab run with statistics")
    fails(["diff", str(plain.path), str(plain.path), "--tolerance", "speed=1"],
          "tolerance for 'speed' is not known")
    with pytest.raises(SystemExit) as e:  # argparse checks the form of a tolerance
        run_cli(["diff", str(plain.path), str(plain.path), "--tolerance", "tight"])
    assert e.value.code == 2 and "--tolerance: 'tight' is not a number" in capsys.readouterr().err
    merge = ["merge", "--pt-dir", str(plain.path), "--ort-dir", str(plain.path),
             "--output-dir", str(tmp_path / "m")]
    fails([*merge[:3], "--ort-dir", str(tmp_path), *merge[5:]], f"ort_dir {tmp_path} is neither")
    assert run_cli(merge) == 0
    assert (tmp_path / "m" / "merge_ort" / "step_2_.txt").is_file()
    fails(merge, "already exists", "--overwrite")
    assert run_cli([*merge, "--overwrite"]) == 0
    capsys.readouterr()
    fails(["bisect", "--option", "memory_opt_level=zero", "--in-process", "--out", str(tmp_path)],
          "memory_opt_level")
