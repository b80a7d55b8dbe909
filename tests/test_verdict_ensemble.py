"""fp32's own spread as the yardstick where one PyTorch fp32 run is not (ortlab.verdict.ensemble): an ill-posed
first step (a ReLU at a tie), a chaotic loss curve (no evidence), what is judged beyond it; the numbers a verdict
prints, in a form a person reads; the cause naming the headline's parameter; which formula each side ran. Fakes
for the decisions, real models for the members (and real ORTModule on a small BatchNorm CNN)."""

import json
import math
import re
from pathlib import Path

import pytest
import torch

from ortlab import Workload
from ortlab.verdict import ensemble, exact, state
from ortlab.verdict.gradients import Step, compare, describe, widened
from ortlab.verdict.judge import judge, loss_note
from tests.test_verdict_exact import FakeRun

FACTORIES = Path(__file__).resolve().parent / "factories" / "zoo.py"

# --------------------------------------------------------------------------- numbers a person reads


def test_ratios_and_percentages_read_in_powers_of_ten_when_they_are_huge_or_tiny():
    assert exact.percent(5.2e37, 1.0) == "5.2e+39%" and exact.percent(0.5, 1.0) == "50%"
    assert exact.times(518468183156173039237454907858731201986560.0, 1.0) == "5.2e+41x"
    assert exact.times(518468.0, 1.0) == "5.2e+05x" and exact.times(18.2, 1.0) == "18x"
    assert exact.number(4.26e34) == "4.3e+34" and exact.number(0.0123) == "0.0123" and exact.number(0) == "0"
    assert exact.number(math.nan) == "not finite" and exact.times(math.inf, 1.0) == "not finite"


def _row(to64, norm, parameter="features.1.0.block.1.fc2.weight", **extra):
    return {"parameter": parameter, "module": parameter.rpartition(".")[0], "relative": 1.0, "to_float64": to64,
            "pytorch_to_float64": 2.8e-4, "allowed": 1e-3, "norm": norm, "diverged": True, **extra}


def test_a_garbage_or_non_finite_gradient_is_said_so_in_words():
    text = describe(_row(4.26e34, 8.4, module_type="Conv2d", within="SqueezeExcitation"))
    assert text == ("ORT's gradient of features.1.0.block.1.fc2.weight (module features.1.0.block.1.fc2: Conv2d in "
                    "SqueezeExcitation) is garbage: 4.3e+34 off float64, whose norm is 8.4 (PyTorch fp32 is 3.3e-03% "
                    "off; first step, dropout off)"), text
    assert "not finite: garbage" in describe({**_row(math.inf, 8.4), "note": "not finite"})
    assert re.search(r"\d{7}", describe(_row(3.0e6, 8.4))) is None  # no number spelled out in 7+ digits
    assert "is 3x the PyTorch noise" in describe(_row(8.4e-4, 8.4))


def test_a_verdict_with_a_huge_gradient_prints_no_number_longer_than_a_person_reads(tmp_path):
    pytorch, ort = _pair(tmp_path, [2.0, 1.9, 1.8], [2.0, 1.2, 0.9])
    grads = {"agree": False, "judged_by": "float64", "worst": [_row(4.25e34, 8.4)], "forward_agrees": True}
    verdict = judge(pytorch, ort, grads, float64={"losses": [2.0, 1.9, 1.8], "state": _state(1.0)})
    assert verdict.diverged and "garbage" in verdict.headline
    assert not any(re.search(r"\d{7}", line) for line in verdict.lines()), verdict.lines()


def test_the_headline_names_the_worst_finite_gradient_and_counts_the_garbage_upstream(tmp_path):
    from ortlab.verdict.gradients import worst_first

    order = ["stem.0.weight", "block1.se.fc1.weight", "block1.se.fc2.weight", "head.weight"]
    rows = [_row(math.nan, 1.0, "stem.0.weight"), _row(math.nan, 1.0, "block1.se.fc1.weight"),
            _row(0.5, 1.0, "block1.se.fc2.weight"), {**_row(1e-4, 1.0, "head.weight"), "diverged": False}]
    ranked = worst_first(rows, order)
    assert [r["parameter"] for r in ranked] == ["block1.se.fc2.weight", "block1.se.fc1.weight", "stem.0.weight",
                                                "head.weight"]  # NaN floods upstream: it locates nothing
    assert [r["parameter"] for r in worst_first(rows[:2], order)] == ["block1.se.fc1.weight", "stem.0.weight"]
    pytorch, ort = _pair(tmp_path, TRUTH, TRUTH)
    grads = {"agree": False, "judged_by": "float64", "worst": ranked, "garbage": 2, "forward_agrees": True}
    headline = judge(pytorch, ort, grads).headline
    assert headline.startswith("DIVERGED: ORTModule's gradient of block1.se.fc2.weight (module block1.se.fc2) is ")
    assert "; 2 gradients are garbage (not finite, or off by over a million times the noise), e.g. " \
           "block1.se.fc1.weight" in headline


# --------------------------------------------------------------------------- the first step: ill-posed gradients


class Tie(torch.nn.Module):
    """relu(w . x) with w . x exactly 0: the gradient jumps with the last bit of w (a ReLU at a tie), beside a
    term whose gradient is large (as the rest of a network's are)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([1.0, -1.0]))
        self.v = torch.nn.Parameter(torch.tensor([0.5]))
        self.u = torch.nn.Parameter(torch.tensor([1.0]))

    def forward(self, x):
        return torch.relu((x * self.w).sum(-1, keepdim=True)) * self.v + 1000 * self.u * x.sum(-1, keepdim=True)


def _tie() -> Workload:
    return Workload(Tie(), lambda step: (torch.tensor([[3.0, 3.0]]), None), lambda out, target: out.sum())


def test_a_gradient_at_a_tie_is_judged_against_fp32_runs_from_starts_one_ulp_away():
    from ortlab.verdict import reference

    work = _tie()
    batches = work.micro_batches(work.batch, 0)
    exact64 = reference.step(work, batches)
    pt = Step(0.0, {n: p.detach() for n, p in _grads(work.model, batches).items()})
    flipped = next(m for _, m in ensemble.gradient_members(work, batches) if float(m.grads["w"].norm()) > 0)
    check = compare(pt, flipped, exact=exact64)  # ORT on the other side of the tie: beyond one PyTorch run
    assert not check.agree and check.worst["parameter"] == "w"
    check = widened(work, batches, 0, (), pt, flipped, exact64, check)
    assert check.agree and check.members and check.worst["spread"] >= check.worst["to_float64"], check.rows
    assert check.members[0]["how"] == "PyTorch fp32 from the start moved by one ulp (seed 1)"
    wrong = Step(0.0, {**flipped.grads, "w": torch.tensor([40.0, 40.0])})  # beyond any fp32 run
    assert not widened(work, batches, 0, (), pt, wrong, exact64, compare(pt, wrong, exact=exact64)).agree
    assert work.model.w.tolist() == [1.0, -1.0]  # members run on copies


def _grads(model, batches):
    for p in model.parameters():
        p.grad = None
    out = model(batches[0][0]).sum()
    out.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = None
    return grads


def test_the_first_member_runs_the_formula_the_other_backend_ran():
    """A module-kind fix (`activations`: HardSwish as relu's) rewrites arithmetic for ORTModule: fp32's spread
    starts with PyTorch running that formula (the same function, rounded otherwise)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Hardswish(), torch.nn.Linear(64, 1))
    work = Workload(model, lambda step: (torch.randn(32, 16, generator=torch.Generator().manual_seed(step)), None),
                    lambda out, target: out.square().mean())
    batches = work.micro_batches(work.batch, 0)
    written = ensemble._step(work, batches, 0, None, ()).grads  # PyTorch as written
    what, member = next(ensemble.gradient_members(work, batches, fixes=("activations", "pytorch-buffers")))
    assert what == {"how": "PyTorch fp32 with the formulas of activations", "seed": None, "ulps": 0,
                    "formulas": ["activations"]}
    ran = member.grads["0.weight"]
    assert not torch.equal(ran, written["0.weight"]) and torch.allclose(ran, written["0.weight"], rtol=1e-4,
                                                                        atol=1e-6)
    assert torch.nn.functional.hardswish.__name__ == "hardswish"  # the formula undone after


def test_a_start_moved_by_one_ulp_is_the_next_float_up_or_down():
    from ortlab.verdict import reference

    model = torch.nn.Linear(64, 64)
    before = model.weight.detach().clone()
    reference.nudged(model, 1)
    moved = model.weight.detach()
    up, down = torch.nextafter(before, torch.tensor(math.inf)), torch.nextafter(before, torch.tensor(-math.inf))
    assert bool(((moved == up) | (moved == down)).all()) and 0.3 < float((moved == up).float().mean()) < 0.7


# --------------------------------------------------------------------------- the losses and the end state


def _state(value: float) -> dict:
    return {"w": {"kind": "parameter", "dtype": "float32", "numel": 8, "module_type": "Linear", "sum": value,
                  "sumsq": value * value / 8}}


def _pair(tmp_path, pt_losses, ort_losses, applied=(), tag=""):
    runs = []
    for name, backend, losses in (("pt", "pytorch", pt_losses), ("ort", "ortmodule", ort_losses)):
        folder = tmp_path / f"{name}{tag}"
        folder.mkdir()
        (folder / state.FILE).write_text(json.dumps(_state(1.0)))
        runs.append(FakeRun(folder, backend, list(losses), {"config": {"parity": True},
                                                            "fixes": {"applied": list(applied)}}))
    return runs


AGREEING = {"agree": True, "judged_by": "allclose", "worst": [], "forward_agrees": True, "factor": exact.FACTOR}
TRUTH = [2.0, 1.9, 1.8]


def _members(*curves):
    return {"members": [{"losses": list(c), "state": _state(1.0), "how": "..."} for c in curves]}


def test_losses_beyond_one_pytorch_run_but_within_fp32s_spread_agree_and_say_so(tmp_path):
    pytorch, ort = _pair(tmp_path, [2.0, 1.9001, 1.8001], [2.0, 1.9008, 1.8006])  # ResNet-18's case: 6x one run
    alone = judge(pytorch, ort, AGREEING, float64={"losses": TRUTH, "state": _state(1.0)})
    assert alone.diverged and ensemble.wanted(alone)  # one sample of fp32's error is no yardstick
    spread = _members([2.0, 1.9005, 1.8004], [2.0, 1.8998, 1.7999], [2.0, 1.9002, 1.8001])
    verdict = judge(pytorch, ort, AGREEING, float64={"losses": TRUTH, "state": _state(1.0)}, ensemble=spread)
    assert verdict.status == "agree" and not ensemble.wanted(verdict), str(verdict)
    assert "losses within fp32's spread: 4 PyTorch fp32 runs of this start end up to" in str(verdict)
    assert loss_note(verdict.to_dict()).startswith(" (within the spread of PyTorch fp32 runs")


def test_losses_beyond_fp32s_spread_diverge_where_training_is_not_chaotic(tmp_path):
    pytorch, ort = _pair(tmp_path, [2.0, 1.9001, 1.8001], [2.0, 1.95, 1.85])
    spread = _members([2.0, 1.9002, 1.8001], [2.0, 1.8999, 1.8002], [2.0, 1.9001, 1.7999])
    verdict = judge(pytorch, ort, AGREEING, float64={"losses": TRUTH, "state": _state(1.0)}, ensemble=spread)
    assert verdict.diverged and verdict.headline.startswith("DIVERGED: ORTModule's losses over 3 steps are "), \
        str(verdict)
    assert "fp32's spread from float64" in verdict.headline and "4 PyTorch fp32 runs of this start are at most" in \
        verdict.headline


def test_chaotic_losses_are_no_evidence_and_the_verdict_rests_on_the_first_step(tmp_path):
    # MNASNet 0.5 at batch 2: fp32 runs of one start end 1-26% of the loss from float64 after 3 AdamW steps
    pytorch, ort = _pair(tmp_path, [8.07, 10.86, 2.46], [8.07, 10.91, 3.07])
    truth = [8.07, 10.86, 2.94]
    spread = _members([8.07, 10.80, 3.05], [8.07, 10.92, 2.75], [8.07, 10.93, 2.99])
    verdict = judge(pytorch, ort, AGREEING, float64={"losses": truth, "state": _state(1.0)}, ensemble=spread)
    assert verdict.status == "agree" and verdict.losses["chaotic"], str(verdict)
    assert "losses no evidence: training is chaotic here: 4 PyTorch fp32 runs of this start end up to 3.5% of " \
           "the loss from float64 (ORTModule: 1%), so the loss curves may differ that much (max |loss difference| " \
           "0.61)" in str(verdict)
    far = _pair(tmp_path, [8.07, 10.86, 2.46], [8.07, 10.91, 6.10], tag="-far")[1]
    verdict = judge(pytorch, far, AGREEING, float64={"losses": truth, "state": _state(1.0)}, ensemble=spread)
    assert verdict.status == "agree" and verdict.losses["no_evidence"], str(verdict)
    assert "losses no evidence: training is chaotic here" in str(verdict)
    assert loss_note(verdict.to_dict()).startswith(" (no evidence: training is chaotic here, PyTorch fp32 runs of "
                                                   "this start end up to")
    wrong = {"agree": False, "judged_by": "float64", "worst": [_row(0.5, 1.0)], "forward_agrees": True}
    assert judge(pytorch, far, wrong, float64={"losses": truth, "state": _state(1.0)}, ensemble=spread).diverged
    beyond = _pair(tmp_path, [8.07, 10.86, 2.46], [8.07, 10.91, 9.0], tag="-beyond")[1]  # 13x fp32's spread
    verdict = judge(pytorch, beyond, AGREEING, float64={"losses": truth, "state": _state(1.0)}, ensemble=spread)
    assert verdict.diverged and "fp32's spread from float64" in verdict.headline, str(verdict)


def test_the_end_states_float_tensors_are_judged_against_the_members_and_chaos_is_no_evidence():
    exact64 = {f"t{i}": _state(1.0)["w"] for i in range(4)}

    def off(by):
        return {n: {**e, "sum": e["sum"] * (1 + by)} for n, e in exact64.items()}

    groups = state.judged(off(1e-3), off(1e-2), exact64)  # 10x one PyTorch run
    assert groups["parameter"]["diverged"] and groups["parameter"]["members"] == 0
    groups = state.judged(off(1e-3), off(1e-2), exact64, [off(-5e-3), off(4e-3)])  # within 3x the members'
    assert not groups["parameter"]["diverged"] and not groups["parameter"]["chaotic"]
    assert groups["parameter"]["spread"] > 5 * groups["parameter"]["pytorch_to_float64"]
    groups = state.judged(off(1e-2), off(2e-1), exact64, [off(3e-2)])  # chaotic: fp32 3% off per tensor
    assert groups["parameter"]["chaotic"] and groups["parameter"]["no_evidence"] and not groups["parameter"]["diverged"]


# --------------------------------------------------------------------------- words: formulas, causes


def test_a_fix_that_rewrites_arithmetic_is_named_with_the_formula_each_side_ran(tmp_path):
    pytorch, ort = _pair(tmp_path, TRUTH, TRUTH, applied=["activations", "pytorch-buffers"])
    verdict = judge(pytorch, ort, AGREEING)
    assert "formulas: PyTorch ran the model as written, ORTModule the formulas of the fix `activations` (the same " \
           "function): both are judged against float64 of the model as written" in verdict.notes
    pytorch, ort = _pair(tmp_path, TRUTH, TRUTH, applied=["pytorch-buffers"], tag="-b")
    assert not any("formulas" in n for n in judge(pytorch, ort, AGREEING).notes)


def test_the_cause_names_the_parameter_the_headline_names_and_the_operator_nearest_to_it():
    from ortlab.compat.blockers import WRONG_GRADIENT, Blocker
    from ortlab.verdict.procedure import _line, _located

    found = Blocker(WRONG_GRADIENT, "aten::_adaptive_avg_pool2d", "...", "training step",
                    module="features.3.0.block.2.fc2", fixes=["global-avg-pool"])  # check's own worst
    evidence = {"agree": False, "worst": [_row(4.25e34, 8.4)]}
    assert _line(found, evidence) == ("wrong gradient of features.1.0.block.1.fc2.weight: aten::_adaptive_avg_pool2d "
                                      "(module features.1.0.block.1.fc2); fix: global-avg-pool")
    assert _located(found, evidence).module == "features.1.0.block.1.fc2"
    assert _line(found, {"agree": True, "worst": []}) == found.line()
    pools = Blocker(WRONG_GRADIENT, "aten::_adaptive_avg_pool2d", "...", "training step", module="stem.0",
                    fixes=["global-avg-pool"], modules=["trunk_output.block1.block1-0.f.se.avgpool",
                                                        "trunk_output.block3.block3-4.f.se.avgpool",
                                                        "trunk_output.block3.block3-5.f.se.avgpool"])
    near = {"agree": False, "worst": [_row(620.0, 1.0, "trunk_output.block3.block3-4.f.b.1.bias")]}
    assert _line(pools, near) == (
        "wrong gradient of trunk_output.block3.block3-4.f.b.1.bias: aten::_adaptive_avg_pool2d (module "
        "trunk_output.block3.block3-4.f.se.avgpool, the nearest to it of the 3 that hold it); fix: global-avg-pool")


# --------------------------------------------------------------------------- a real chaotic run


@pytest.mark.ort
@pytest.mark.timeout(600)
def test_a_batchnorm_cnn_at_a_high_learning_rate_agrees_within_fp32s_spread(tmp_path):
    """20 AdamW steps at lr 0.1 (2026-11-27): PyTorch fp32's losses 3e-3% of the loss from float64, ORT's 3e-2%
    (its kernels sum in another order at every step), fp32 runs with their own rounding 3e-3% to 0.012%: one
    PyTorch run called it 10x the noise, DIVERGED."""
    from ortlab import Session

    with Session(f"{FACTORIES}:batch_norm", out=tmp_path) as s:  # the worker runs the ensemble
        pt = s.burst("pytorch", 20, parity=True, progress=False, lr=0.1)
        # ORT's pool on more than one thread, as a user's default burst has it (not the suite's OMP_NUM_THREADS=1,
        # which gives ORT one thread too: then it sums as PyTorch does, and one fp32 run settles it)
        ort = s.burst("ortmodule", 20, parity=True, progress=False, lr=0.1, fixes="auto", threads=2)
        verdict = s.judge(pt, ort)
    assert ort.meta["fixes"]["applied"] == ["pytorch-buffers"]
    assert verdict.status == "agree", str(verdict)
    assert verdict.losses["judged_by"] == "float64" and 1 <= len(verdict.losses["members"]) <= ensemble.BURST_MEMBERS
    fp32 = max(verdict.losses["members"] + [verdict.losses["pytorch_to_float64"]])
    assert verdict.losses["to_float64"] > exact.FACTOR * verdict.losses["pytorch_to_float64"]  # one run: diverged
    assert verdict.losses["to_float64"] <= exact.FACTOR * fp32 + 1e-4 * verdict.losses["norm"]
    assert any(n.startswith("losses within fp32's spread") for n in verdict.notes), verdict.notes
