"""DebugMode logs as evidence (ortlab.verdict.debug_logs): two logs from two processes read and judged op by op,
the first op that differs while its inputs agree told apart from the ones that inherited it."""

import json
import subprocess
import sys
import textwrap

import pytest

from ortlab.verdict import debug_logs
from ortlab.verdict.ops import AGREES, DIVERGED_HERE, INHERITED


def _value(v):
    if isinstance(v, list | tuple):
        return {"type": "tuple", "items": [_value(x) for x in v]}
    return {"type": "scalar", "value": v}


def _op(name, depth, out, inputs, dtype="f32"):
    log = {"type": "dict", "items": [["input_hash", _value([inputs, {}])], ["hash", _value(out)]]}
    return {"type": "op", "op_name": name, "call_depth": depth, "args_str": f"t: {dtype}[4]", "kwargs_str": "",
            "output_str": f"  ->  t: {dtype}[4]", "log": log}


def _module(tag, depth):
    return {"type": "annotate", "header": "nn.Mod", "tag": tag, "call_depth": depth}


def _write(path, calls):
    path.write_text(json.dumps({"format": debug_logs.FORMAT, "version": 1, "logs": calls}))
    return path


def _program(tmp_path, name, tanh, weight=3.0):
    """A small program's log: a matmul in `lin`, a tanh in `act` (its norm `tanh`), a sum outside both."""
    return _write(tmp_path / name, [
        _module("Net", 1), _module("Net.lin", 2), _op("aten::mm", 3, 5.0 * weight / 3.0, [2.0, weight]),
        _module("Net.act", 2), _op("aten::tanh", 3, tanh, [5.0 * weight / 3.0]),
        _op("aten::sum", 1, tanh, [tanh]), _op("aten::mul.Tensor", 1, 2 * tanh, [tanh, None])])


def test_the_op_whose_output_differs_while_its_inputs_agree_is_the_first(tmp_path):
    table = debug_logs.compare(_program(tmp_path, "a.json", 4.0), _program(tmp_path, "b.json", 4.01))
    status = {o["name"]: o["status"] for o in table["ops"]}
    assert status == {"aten::mm": AGREES, "aten::tanh": DIVERGED_HERE, "aten::sum": INHERITED,
                      "aten::mul.Tensor": INHERITED}, status
    first = table["ops"][1]
    assert first["where"] == "Net.act" and table["ops"][0]["where"] == "Net.lin" and table["ops"][2]["where"] == ""
    assert table["first"].startswith("aten::tanh (#1, in Net.act): its output's norm differs by 0.00249 of itself")


def test_rounding_of_the_dtype_is_not_a_difference(tmp_path):
    table = debug_logs.compare(_program(tmp_path, "a.json", 4.0), _program(tmp_path, "b.json", 4.0 + 4e-6))
    assert table["first"] is None and {o["status"] for o in table["ops"]} == {AGREES}


def test_a_difference_no_op_made_is_said_to_enter_through_an_input(tmp_path):
    table = debug_logs.compare(_program(tmp_path, "a.json", 4.0), _program(tmp_path, "b.json", 4.01, weight=3.1))
    assert table["first"] is None and table["ops"][0]["status"] == INHERITED
    assert "the difference enters at op #0 (aten::mm in Net.lin) through an input no logged op made" in table["note"]


def test_a_float64_log_is_the_yardstick(tmp_path):
    a, f64 = _program(tmp_path, "a.json", 4.0), _program(tmp_path, "f64.json", 4.0005)
    near = debug_logs.compare(a, _program(tmp_path, "b.json", 4.0009), f64)  # as far from float64 as a is
    assert near["first"] is None, near["first"]
    far = debug_logs.compare(a, _program(tmp_path, "c.json", 4.01), f64)
    assert far["first"].startswith("aten::tanh (#1, in Net.act): its output's norm is 19x further from float64")


def test_logs_of_other_programs_are_compared_up_to_where_they_part(tmp_path):
    a = _program(tmp_path, "a.json", 4.0)
    b = _write(tmp_path / "b.json", [_op("aten::mm", 1, 5.0, [2.0, 3.0]), _op("aten::relu", 1, 4.0, [5.0])])
    table = debug_logs.compare(a, b)
    assert len(table["ops"]) == 1 and "the logs part at op #1: aten::relu vs aten::tanh" in table["note"]


def test_a_file_that_is_not_a_log_is_refused_in_one_line(tmp_path):
    (tmp_path / "x.json").write_text('{"format": "other"}')
    (tmp_path / "y.json").write_text("not json")
    with pytest.raises(debug_logs.LogError, match=r"x\.json is not a DebugMode log \(expected JSON with format"):
        debug_logs.read(tmp_path / "x.json")
    with pytest.raises(debug_logs.LogError, match=r"y\.json is not a DebugMode log: "):
        debug_logs.read(tmp_path / "y.json")
    done = subprocess.run([sys.executable, "-m", "ortlab.cli", "judge", str(tmp_path / "x.json"),
                           str(tmp_path / "y.json")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0, done.stderr
    assert "is not a DebugMode log" in done.stderr


JOB = textwrap.dedent('''
    import sys
    import torch
    from torch.utils._debug_mode import DebugMode

    if sys.argv[2] == "planted":  # this process's tanh kernel is off by 0.1%: a wrong kernel, not rounding
        lib = torch.library.Library("aten", "IMPL")
        lib.impl("tanh", lambda x: (1 - 2 / (torch.exp(2 * x) + 1)) * 1.001, "CPU")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    x = torch.randn(6, 8)
    with DebugMode(record_nn_module=True) as mode, DebugMode.log_tensor_hashes(hash_inputs=True):
        model(x).pow(2).mean().backward()
    DebugMode.save_logs(mode.logs, sys.argv[1])
''')


def test_two_processes_logs_are_read_and_judged(tmp_path):
    """DebugMode's logs of the same job from two processes, one whose tanh kernel is planted wrong: `ortlab judge`
    names aten::tanh in the Tanh module, the ops after it inherit, exit 1; the same job twice agrees."""
    pytest.importorskip("torch.utils._debug_mode")
    from torch.utils._debug_mode import DebugMode

    if not hasattr(DebugMode, "save_logs"):
        pytest.skip("this torch's DebugMode cannot save logs (torch 2.10+ can)")
    job = tmp_path / "job.py"
    job.write_text(JOB)
    for name, how in (("a", "right"), ("b", "planted"), ("c", "right")):
        subprocess.run([sys.executable, str(job), str(tmp_path / f"{name}.json"), how], check=True, timeout=300,
                       capture_output=True)
    done = subprocess.run([sys.executable, "-m", "ortlab.cli", "judge", str(tmp_path / "a.json"),
                           str(tmp_path / "b.json")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    marked = [line for line in done.stdout.splitlines() if line.startswith(">>")]
    assert len(marked) == 1 and "aten::tanh" in marked[0] and "Sequential.1" in marked[0], done.stdout
    assert "first op that differs beyond rounding: aten::tanh (#" in done.stdout
    assert "inherited" in done.stdout
    same = subprocess.run([sys.executable, "-m", "ortlab.cli", "judge", str(tmp_path / "a.json"),
                           str(tmp_path / "c.json"), "--json"], capture_output=True, text=True, timeout=300)
    assert same.returncode == 0, same.stdout[-2000:] + same.stderr
    assert json.loads(same.stdout)["first"] is None


def _titan(path, tanh):
    """A torchtitan numerics dump (agent_tooling/numerics_debugging's format) of three ops of one layer."""
    blocks = [("layers.0.attention.wq/op_0_mm", "torch.float32", 5.0, "2.000000e+00, 3.000000e+00", "", None),
              ("layers.0.feed_forward/op_0_tanh", "torch.float32", tanh, "5.000000e+00",
               "layers.0.attention.wq/op_0_mm", None),
              ("layers.0.feed_forward/op_1_mm", "torch.float32", 2 * tanh, f"{tanh:.6e}, 3.000000e+00",
               "layers.0.feed_forward/op_0_tanh;", "backward")]
    text = "Total captured activations: 3\nExcluded ops dispatched: t, view\n" + "=" * 80 + "\n\n"
    for key, dtype, out, inputs, producers, phase in blocks:
        text += f"[{key}]\n  Shape: torch.Size([4, 4]), Dtype: {dtype}\n  L2 norm: 1.000000e+00\n"
        text += f"  Output hash: {out:.6e}\n  Input hashes: {inputs}\n"
        text += f"  Input producers: {producers}\n" if producers else ""
        text += "  Location: common/attention.py:534\n" + (f"  Phase: {phase}\n" if phase else "") + "\n"
    path.write_text(text)
    return path


def test_torchtitans_numerics_dumps_are_read_and_judged_alike(tmp_path):
    table = debug_logs.compare(_titan(tmp_path / "rank_0_a.log", 4.0), _titan(tmp_path / "rank_0_b.log", 4.01))
    status = [(o["name"], o["where"], o["phase"], o["status"]) for o in table["ops"]]
    assert status == [("layers.0.attention.wq/op_0_mm", "layers.0.attention.wq", "forward", AGREES),
                      ("layers.0.feed_forward/op_0_tanh", "layers.0.feed_forward", "forward", DIVERGED_HERE),
                      ("layers.0.feed_forward/op_1_mm", "layers.0.feed_forward", "backward", INHERITED)], status
    assert table["ops"][1]["inputs"] == ["layers.0.attention.wq/op_0_mm"]
    same = debug_logs.compare(_titan(tmp_path / "a.log", 4.0), _titan(tmp_path / "c.log", 4.0))
    assert same["first"] is None
