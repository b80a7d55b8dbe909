"""The noise floor, bisection over ORTModule options, and the `diff | merge | bisect` commands, on real bursts."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from ortlab import Session
from ortlab.activations import bisect, compare, noise_floor, register_cli

FACTORIES = Path(__file__).parent / "factories" / "activations.py"
STATS = {"stats": {}}


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="ortlab")
    register_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_noise_floor_names_randomness_that_escapes_parity_mode(tmp_path):
    with Session(f"{FACTORIES}:functional_dropout", {"module": "blocks.0.attn"}, out=tmp_path, in_process=True) as s:
        c = s.compare(3, parity=True, progress=False, collect=STATS)
        floor = noise_floor(s, c.pytorch)
    assert floor.deterministic  # the same seed gives the same run, to the last bit
    assert (floor.seed_dependent.step, floor.seed_dependent.name) == (0, "blocks.0.attn")
    assert "random in parity mode" in str(floor) and "F.dropout" in str(floor)
    per_tensor = floor.floor.set_index(["phase", "name"])
    assert per_tensor.loc[("forward", "blocks.0.attn"), "floor_samples"] > 0.01  # dropped values
    assert per_tensor.loc[("forward", "tok"), "floor_mean"] < 1e-4  # only the updates after step 0 moved it
    raw, against = compare(c), compare(c, noise=floor)
    assert raw.first.name == "blocks.0.attn"  # ORT's dropout draws other numbers than PyTorch's
    assert against.table["diverged"].sum() < raw.table["diverged"].sum()
    with pytest.raises(ValueError, match="repeats a PyTorch run"):
        noise_floor(s, c.ortmodule)


def test_noise_floor_names_what_is_not_deterministic(tmp_path):
    with Session(f"{FACTORIES}:own_rng", {"module": "blocks.0.mlp.1"}, out=tmp_path, in_process=True) as s:
        run = s.burst("pytorch", 2, parity=True, progress=False, collect=STATS)
        floor = noise_floor(s, run)
    assert not floor.deterministic
    assert (floor.nondeterministic.step, floor.nondeterministic.name) == (0, "blocks.0.mlp.1")
    assert str(floor).splitlines()[1].startswith("not deterministic: two PyTorch bursts with seed 0 differ, first at "
                                                 "step 0, forward: blocks.0.mlp.1")


def test_bisect_finds_the_toggle_that_removes_a_divergence(tmp_path):
    with Session(model_kwargs={"n_layer": 1}, out=tmp_path, in_process=True) as s:
        result = bisect(session=s, steps=2, parity=False, candidates=["enable_compute_optimizer", "parity"])
    d = result.divergence
    assert (d.step, d.phase, d.name, d.previous) == (0, "forward", "drop", "tok")  # dropout draws other numbers
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


def test_cli_bad_input_is_one_line_and_exit_2(three_runs, tmp_path, capsys):
    plain, _, _ = three_runs
    assert run_cli(["diff", str(plain.path), str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "B '" in err and "does not exist" in err
    assert run_cli(["diff", str(plain.path), str(plain.path), "--tolerance", "tight"]) == 2
    assert "--tolerance 'tight' is not a number" in capsys.readouterr().err
    assert run_cli(["diff", str(plain.path), str(tmp_path)]) == 2  # exists, but holds no statistics
    assert "is neither an ortlab run with statistics" in capsys.readouterr().err
    assert run_cli(["merge", "--pt_dir", str(plain.path), "--ort_dir", str(tmp_path), "--output_dir",
                    str(tmp_path / "m")]) == 2
    assert "--ort_dir" in capsys.readouterr().err
    assert run_cli(["merge", "--pt_dir", str(plain.path), "--ort_dir", str(plain.path), "--output_dir",
                    str(tmp_path / "m")]) == 0
    assert (tmp_path / "m" / "merge_ort" / "step_2_.txt").is_file()
    assert run_cli(["bisect", "--option", "memory_opt_level=zero", "--in-process", "--out", str(tmp_path)]) == 2
    assert "memory_opt_level" in capsys.readouterr().err
