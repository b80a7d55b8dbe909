"""Advice that holds: a fix is named only when exporting again with it removed its blocker, an applied or tried fix
is never named again, a blocker no fix removes says so with a remedy, a failure inside ORT names its node; the
fixes this needed (group-norm, layer-norm-bias, embedding-bag's 2-D forms) compute what torch computes and train
on ORTModule in parity; timm's PoolFormerV2-S12 and EdgeNeXt-XXS (the zoo side folder) as docs/compatibility.md
says."""

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ortlab.compat import registry
from ortlab.compat.blockers import NO_GRADIENT, ORT_FAILED, Blocker
from ortlab.workload import Workload

ROOT = Path(__file__).resolve().parents[1]
slow = pytest.mark.slow
TORCH_GROUP_NORM = "/site-packages/torch/nn/functional.py(2965): group_norm"


def _r(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _outputs_and_grads(fn, params, inputs):
    """fn's output and the gradients of a fixed random projection of it for `params` and float `inputs`."""
    leaves = [p.detach().clone().requires_grad_(True) for p in params]
    xs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    out = fn(leaves, xs)
    (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(0))).sum().backward()
    return out.detach(), [t.grad for t in leaves + xs if t.grad is not None]


def _same_as_torch(fix, fn, params, inputs):
    expected = _outputs_and_grads(fn, params, inputs)
    with registry.applied(nn.Module(), [fix]):
        got = _outputs_and_grads(fn, params, inputs)
    torch.testing.assert_close(got[0], expected[0], rtol=1e-5, atol=1e-5)
    assert len(got[1]) == len(expected[1])
    for g, e in zip(got[1], expected[1], strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- the rewrites, against torch

GROUP_NORMS = {  # (groups, weight, bias, input shape, eps)
    "one group, weight only (timm GroupNorm1NoBias)": (1, True, False, (2, 6, 3, 4), 1e-6),
    "one group, no affine": (1, False, False, (2, 6, 3, 4), 1e-5),
    "three groups, weight only": (3, True, False, (2, 6, 3, 4), 1e-5),
    "two groups, no affine, 3-d": (2, False, False, (2, 6, 5), 1e-3),
    "six groups, 5-d": (6, True, False, (1, 6, 2, 3, 2), 1e-5),
    "two groups, weight and bias (torch's own)": (2, True, True, (2, 6, 3, 3), 1e-5),
}


@pytest.mark.parametrize("case", list(GROUP_NORMS))
def test_the_group_norm_fix_computes_what_torch_computes(case):
    groups, weight, bias, shape, eps = GROUP_NORMS[case]
    params = [_r(shape[1], seed=2) + 1, _r(shape[1], seed=3)]

    def fn(p, x):
        return F.group_norm(x[0], groups, p[0] if weight else None, p[1] if bias else None, eps)

    _same_as_torch("group-norm", fn, params, (_r(*shape) * 3 + 1,))


BAG_IDS = torch.tensor([[1, 2, 2, 0], [2, 2, 2, 2], [7, 3, 9, 3]])  # row 1: all padding when padding_idx=2
BAGS = [(mode, padding, weighted) for mode in ("sum", "mean", "max") for padding in (None, 2)
        for weighted in ((False, True) if mode == "sum" else (False,))]  # torch: per_sample_weights with sum only


@pytest.mark.parametrize(("mode", "padding", "weighted"), BAGS)
def test_the_embedding_bag_fix_covers_2d_input_without_offsets(mode, padding, weighted):
    weights = _r(*BAG_IDS.shape, seed=4)

    def fn(p, x):
        return F.embedding_bag(BAG_IDS, p[0], mode=mode, padding_idx=padding,
                               per_sample_weights=x[0] if weighted else None)

    _same_as_torch("embedding-bag", fn, [_r(10, 3, seed=5)], (weights,))


@pytest.mark.parametrize("missing", ["bias", "weight"])
def test_the_layer_norm_fix_computes_what_torch_computes(missing):
    def fn(p, x):
        return F.layer_norm(x[0], (5,), None if missing == "weight" else p[0], None if missing == "bias" else p[1])

    _same_as_torch("layer-norm-bias", fn, [_r(5, seed=2), _r(5, seed=3)], (_r(2, 3, 5) * 2,))


# --------------------------------------------------------------------------- which fix is named, and when


def test_a_fix_claims_a_normalization_by_the_function_that_wrote_it():
    """InstanceNormalization from F.group_norm is group-norm's, from F.instance_norm instance-norm's."""
    group = Blocker(NO_GRADIENT, "InstanceNormalization", "m", "gradient graph",
                    stack=[TORCH_GROUP_NORM, "timm/layers/norm.py(67): forward"])
    instance = Blocker(NO_GRADIENT, "InstanceNormalization", "m", "gradient graph",
                       stack=["/site-packages/torch/nn/functional.py(2880): instance_norm"])
    model = nn.Linear(1, 1)
    assert registry.for_blocker(group, model) == ["group-norm"]
    assert registry.for_blocker(instance, model) == ["instance-norm"]


def test_an_applied_or_tried_fix_is_never_named_again_and_the_remedy_says_so():
    from ortlab.compat.advice import confirm, recommend

    model = nn.Linear(1, 1)
    blocker = Blocker(NO_GRADIENT, "InstanceNormalization", "m", "gradient graph", stack=[TORCH_GROUP_NORM])
    assert recommend([blocker], model) == ["group-norm"] and blocker.fixes == ["group-norm"]
    assert recommend([blocker], model, ["group-norm"]) == [] and blocker.fixes == []  # applied: not named
    recommend([blocker], model)
    still = Blocker(NO_GRADIENT, "InstanceNormalization", "m", "gradient graph", stack=[TORCH_GROUP_NORM])
    assert confirm([blocker], [still]) == []  # exported again with it, the blocker is still there
    assert blocker.fixes == [] and blocker.tried == ["group-norm"]
    assert blocker.remedy.startswith("no ortlab fix removes it (group-norm tried: still there when exported again")
    assert "group-norm" not in blocker.line().split(";")[0] and recommend([blocker], model) == []


def test_the_graph_builders_missing_name_message_names_its_node():
    from ortlab.compat.errors import read_error

    read = read_error("Attempting to get index by a name which does not exist:_original_module.e.weightfor node: "
                      "/_original_module/e/Loop")
    assert read.node == "/_original_module/e/Loop" and read.line() == read.message


# --------------------------------------------------------------------------- on ORTModule


class _GroupNorm1NoBias(nn.GroupNorm):
    """timm's GroupNorm1NoBias, written again: GroupNorm with one group and no bias."""

    def __init__(self, channels):
        super().__init__(1, channels, eps=1e-6)
        self.bias = None


def _norms() -> Workload:
    """GroupNorm without bias (1 and 4 groups), LayerNorm without bias (twice): what PoolFormerV2 is made of."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), _GroupNorm1NoBias(8), nn.GELU(),
                          nn.GroupNorm(4, 8, affine=False), nn.Flatten(), nn.Linear(8 * 16, 12),
                          nn.LayerNorm(12, bias=False), nn.Linear(12, 12), nn.LayerNorm(12, bias=False),
                          nn.Linear(12, 4))

    def batch(step):
        g = torch.Generator().manual_seed(step)
        return torch.randn(2, 3, 4, 4, generator=g), torch.randint(0, 4, (2,), generator=g)

    return Workload(model, batch, F.cross_entropy, name="bias-free norms")


class _Bags(nn.Module):
    """Every 2-D EmbeddingBag form without offsets torch allows, summed."""

    def __init__(self):
        super().__init__()
        self.bags = nn.ModuleList(nn.EmbeddingBag(50, 16, mode=mode, padding_idx=padding)
                                  for mode, padding, _ in BAGS)
        self.head = nn.Linear(16, 4)

    def forward(self, ids, weights):
        out = sum(bag(ids, per_sample_weights=weights if weighted else None)
                  for bag, (_, _, weighted) in zip(self.bags, BAGS, strict=True))
        return self.head(out)


def bags() -> Workload:
    def batch(step):
        g = torch.Generator().manual_seed(step)
        ids = torch.randint(0, 50, (3, 5), generator=g)
        ids[0, :2] = 2  # padding entries, and a bag of padding only
        ids[1] = 2
        return (ids, torch.rand(3, 5, generator=g)), torch.randint(0, 4, (3,), generator=g)

    return Workload(_Bags(), batch, F.cross_entropy, name="EmbeddingBag 2-D forms")


def mean_bag() -> Workload:
    """The issue's form: nn.EmbeddingBag(50, 16, mode="mean") on a 2-D index tensor, no offsets."""
    model = nn.Sequential(nn.EmbeddingBag(50, 16, mode="mean"), nn.Linear(16, 4))

    def batch(step):
        g = torch.Generator().manual_seed(step)
        return torch.randint(0, 50, (3, 5), generator=g), torch.randint(0, 4, (3,), generator=g)

    return Workload(model, batch, F.cross_entropy, name="EmbeddingBag mean, 2-D")


@contextlib.contextmanager
def _claims_only():
    """A registered fix that claims group_norm's InstanceNormalization and changes nothing (what instance-norm did
    for GroupNorm), with group-norm out of the registry: the verification must not name it."""
    fixes = dict(registry.FIXES)
    registry.FIXES.clear()
    registry.FIXES.update({k: v for k, v in fixes.items() if k != "group-norm"}, **{"claims-only": __name__})
    try:
        yield
    finally:
        registry.FIXES.clear()
        registry.FIXES.update(fixes)


FIX = registry.Fix("claims-only", "changes nothing", "module",
                   removes=lambda b: b.kind == NO_GRADIENT and b.op == "InstanceNormalization",
                   apply=lambda model: contextlib.nullcontext())


@slow
@pytest.mark.ort
def test_a_fix_that_removes_nothing_is_tried_not_named_and_check_says_no_fix_exists():
    from ortlab.compat.check import check

    with _claims_only():
        report = check(_norms(), "auto", train_step=False)
    norm = next(b for b in report.blockers if b.op == "InstanceNormalization")
    assert norm.fixes == [] and norm.tried == ["claims-only"] and "no ortlab fix removes it" in norm.remedy
    assert "claims-only" not in report.fixes and report.status == "blocked"
    row = report.table().set_index("op").loc["InstanceNormalization"]  # the Lab's check table
    assert row["fix"] is None and row["tried"] == "claims-only" and "no ortlab fix removes it" in row["remedy"]
    assert not any("fix: claims-only" in line for line in str(report).splitlines())


@slow
@pytest.mark.ort
def test_bias_free_norms_train_with_their_verified_fixes_in_parity(tmp_path):
    from ortlab.compat.check import check
    from ortlab.verdict.gradients import first_step

    report = check(_norms(), "auto")
    assert report.status == "fixed" and report.fixes == ["group-norm", "layer-norm-bias"], str(report)
    kinds = {(b.kind, b.op): b.fixes for b in report.blockers}
    assert kinds == {(NO_GRADIENT, "InstanceNormalization"): ["group-norm"],
                     (ORT_FAILED, "LayerNormalization"): ["layer-norm-bias"]}
    assert first_step(_norms(), report.fixes).worst["relative"] <= 1e-5


@slow
@pytest.mark.parametrize("factory", ["mean_bag", "bags"])
@pytest.mark.ort
def test_2d_embedding_bags_train_with_fix_auto_in_parity(factory, tmp_path):
    from ortlab import Session
    from ortlab.verdict.gradients import first_step

    with Session(f"tests.test_advice:{factory}", out=tmp_path, in_process=True) as s:
        if factory == "mean_bag":  # as written: the failure names its node, and the fix a step would try
            failed = s.burst("ortmodule", 1, {"fallback_policy": "FALLBACK_DISABLE"}, progress=False)
            assert failed.status == "failed" and "node: /_original_module/_original_module.0/Loop" in failed.error
            assert failed.meta["hint"].startswith("ORT failed: Loop (module 0); embedding-bag may remove it")
        report = s.check("auto")
        assert report.fixes == ["embedding-bag"] and report.status == "fixed", str(report)
        comparison = s.compare(steps=3, parity=True, progress=False, fixes="auto")
    assert comparison.pytorch.ok and comparison.ortmodule.ok, comparison.ortmodule.error
    assert comparison.ortmodule.meta["fixes"]["applied"] == ["embedding-bag"]
    assert comparison.to_dict()["max_loss_diff"] <= 1e-5
    assert first_step(globals()[factory](), ["embedding-bag"]).worst["relative"] <= 1e-5


@slow
@pytest.mark.ort
def test_a_failed_burst_names_only_fixes_that_remove_what_it_met(tmp_path):
    """A burst with instance-norm (which does not touch GroupNorm) fails; its hint names group-norm, verified,
    never the fix it applied."""
    from ortlab import Session

    with Session("tests.test_advice:_norms", out=tmp_path, in_process=True) as s:
        run = s.burst("ortmodule", 1, fixes="instance-norm,layer-norm-bias", progress=False)
    assert run.status in ("failed", "fallback")
    hint = run.meta["hint"]
    assert "fixes group-norm remove what ORTModule met here" in hint and "instance-norm" not in hint, hint


# --------------------------------------------------------------------------- timm (the zoo side folder)


def _zoo() -> dict:
    folder = os.environ.get("ORTLAB_ZOO_PACKAGES")
    if not folder or not (Path(folder) / ".complete").is_file():
        pytest.skip("the zoo side folder ($ORTLAB_ZOO_PACKAGES, bin/_env.sh) is not installed")
    return dict(os.environ, PYTHONPATH=os.pathsep.join([folder, str(ROOT), *filter(None, [
        os.environ.get("PYTHONPATH")])]), TQDM_DISABLE="1")


@slow
@pytest.mark.timeout(1800)
def test_timm_models_check_as_the_compatibility_page_says(tmp_path):
    """PoolFormerV2-S12 trains with --fix auto in parity; EdgeNeXt-XXS's failure names its node, module and line."""
    out = tmp_path / "zoo.json"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "compatibility.py"), "zoo-survey", str(out)],
                   env=_zoo(), check=True)
    rows = {row["model"]: row for row in json.loads(out.read_text())}
    expected = {row["model"]: row for row in json.loads((ROOT / "docs" / "compatibility.json").read_text())["zoo"]}
    assert list(rows) == list(expected)
    for name, row in rows.items():
        want = expected[name]
        assert (row["status"], row["fixes"]) == (want["status"], want["fixes"]), (
            f"{name}: {row['status']} {row['fixes']}, the page says {want['status']} {want['fixes']}: "
            "python scripts/compatibility.py zoo")
        assert [(b["kind"], b["op"], b["module"]) for b in row["blockers"]] == [
            (b["kind"], b["op"], b["module"]) for b in want["blockers"]]
    pool = rows["poolformerv2_s12"]
    assert pool["status"] == "fixed" and pool["fixes"] == ["group-norm", "layer-norm-bias"]
    assert pool["parity"]["agree"] and pool["gradient"] <= 1e-4 and not pool["float64"]["diverged"], pool
    edge = rows["edgenext_xx_small"]["remaining"][0]
    assert edge["node"].endswith("/Add_1") and edge["module"] == "stages.2.blocks.5"
    assert edge["source"].startswith("timm/models/edgenext.py:") and edge["remedy"].startswith("no ortlab fix")
