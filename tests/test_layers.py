"""torch.nn's common layers on ORTModule: the fixes that rewrite the layers ORT 1.19.2 cannot train compute what torch
computes (outputs and gradients), keep the parameters and state_dict keys, are undone, train on ORTModule in
parity (the bare layers in one export, each layer in a small model, MobileNetV3- and ViT-style models), and
docs/compatibility.md's layer table says what ORTModule does with each layer today."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ortlab.compat import registry

ROOT = Path(__file__).resolve().parents[1]
LAYER_FIXES = ["activations", "pixel-shuffle", "instance-norm", "group-norm", "layer-norm-bias", "rms-norm",
               "bidirectional-rnn", "explicit-attention", "embedding-bag", "conv-transpose", "linear-interpolation",
               "feature-dropout", "label-smoothing", "embedding-max-norm"]
slow = pytest.mark.slow


def _script():
    spec = importlib.util.spec_from_file_location("compatibility_script", ROOT / "scripts" / "compatibility.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- the rewrites, against torch


def _grads(module, inputs):
    """Outputs, and the gradients of a fixed random projection of them for the parameters and float inputs."""
    inputs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    module.zero_grad()
    out = module(*inputs)
    flat = torch.cat([o.reshape(-1) for o in _tensors(out)])
    weights = torch.randn(flat.shape, generator=torch.Generator().manual_seed(0))
    (flat * weights).sum().backward()
    grads = [p.grad.clone() for p in module.parameters() if p.grad is not None]
    return flat.detach(), grads + [x.grad for x in inputs if x.grad is not None]


def _tensors(out):
    if isinstance(out, tuple | list):
        return [t for o in out for t in _tensors(o)]
    return [] if out is None else [out]


class _Call(nn.Module):
    def __init__(self, fn, *modules):
        super().__init__()
        self.fn = fn
        self.layers = nn.ModuleList(modules)

    def forward(self, *args):
        return self.fn(self.layers, *args)


def _r(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


CASES = {
    "hardswish and hardsigmoid": ("activations", nn.Sequential(nn.Hardswish(), nn.Hardsigmoid()), (_r(4, 9) * 4,)),
    "mish and softplus": ("activations", nn.Sequential(nn.Mish(), nn.Softplus(2.0, 3.0)), (_r(4, 9) * 12,)),
    "elu, selu, celu": ("activations", nn.Sequential(nn.ELU(0.7), nn.SELU(), nn.CELU(1.5)), (_r(4, 9) * 30,)),
    "prelu per channel": ("activations", nn.PReLU(3), (_r(2, 3, 5),)),
    "pixel shuffle": ("pixel-shuffle", nn.Sequential(nn.PixelShuffle(3), nn.PixelUnshuffle(3)), (_r(2, 18, 2, 3),)),
    "pixel shuffle unbatched": ("pixel-shuffle", nn.PixelShuffle(2), (_r(8, 2, 3),)),
    "instance norm 1d": ("instance-norm", nn.InstanceNorm1d(3, affine=True), (_r(2, 3, 7),)),
    "instance norm 3d": ("instance-norm", nn.InstanceNorm3d(3), (_r(2, 3, 2, 3, 4),)),
    "instance norm with running stats": ("instance-norm", nn.InstanceNorm2d(3, track_running_stats=True),
                                         (_r(2, 3, 4, 4),)),
    "rms norm": ("rms-norm", nn.RMSNorm([3, 5], eps=1e-3), (_r(2, 3, 5),)),
    "rms norm, default eps, no weight": ("rms-norm", nn.RMSNorm(5, elementwise_affine=False), (_r(2, 3, 5),)),
    "gru 2 layers bidirectional batch first": ("bidirectional-rnn", nn.GRU(5, 4, 2, batch_first=True,
                                                                         bidirectional=True), (_r(2, 6, 5),)),
    "gru bidirectional with h0": ("bidirectional-rnn", nn.GRU(5, 4, bidirectional=True), (_r(6, 2, 5), _r(2, 2, 4))),
    "lstm bidirectional unbatched": ("bidirectional-rnn", nn.LSTM(5, 4, 2, bidirectional=True), (_r(6, 5),)),
    "rnn relu": ("bidirectional-rnn", nn.RNN(5, 4, 2, nonlinearity="relu", bidirectional=True), (_r(6, 2, 5),)),
    "attention, masks, per-head weights": ("explicit-attention", _Call(
        lambda m, x: m[0](x, x, x, attn_mask=torch.triu(torch.ones(4, 4, dtype=torch.bool), 1),
                          key_padding_mask=torch.tensor([[0, 0, 0, 1], [0, 0, 0, 0]], dtype=torch.bool),
                          average_attn_weights=False), nn.MultiheadAttention(8, 2, batch_first=True)), (_r(2, 4, 8),)),
    "attention, float 3-d mask, kdim/vdim, bias_kv, zero attn": ("explicit-attention", _Call(
        lambda m, q, k, v, mask: m[0](q, k, v, attn_mask=mask),
        nn.MultiheadAttention(8, 2, kdim=6, vdim=5, add_bias_kv=True, add_zero_attn=True, bias=False)),
        (_r(3, 2, 8), _r(4, 2, 6), _r(4, 2, 5), _r(4, 3, 4))),
    "attention unbatched, no weights": ("explicit-attention", _Call(
        lambda m, x: m[0](x, x, x, need_weights=False), nn.MultiheadAttention(8, 4)), (_r(5, 8),)),
    "transformer": ("explicit-attention", nn.Transformer(8, 2, 1, 1, 16, dropout=0.0), (_r(5, 2, 8), _r(3, 2, 8))),
    "embedding bag sum, offsets, weights": ("embedding-bag", _Call(
        lambda m, ids, offsets, w: m[0](ids, offsets, per_sample_weights=w), nn.EmbeddingBag(10, 3, mode="sum")),
        (torch.tensor([1, 2, 2, 5, 9, 0]), torch.tensor([0, 2, 2, 5]), _r(6))),
    "embedding bag mean 2-d padding": ("embedding-bag", nn.EmbeddingBag(10, 3, padding_idx=2),
                                       (torch.tensor([[1, 2, 3], [2, 2, 2]]),)),
    "embedding bag max, last offset": ("embedding-bag", _Call(
        lambda m, ids, offsets: m[0](ids, offsets), nn.EmbeddingBag(10, 3, mode="max", include_last_offset=True)),
        (torch.tensor([1, 1, 4, 7, 3]), torch.tensor([0, 3, 3, 5]))),
    "conv transpose 2d": ("conv-transpose", nn.ConvTranspose2d(4, 6, (3, 2), (2, 3), (1, 0), (1, 2), groups=2,
                                                             dilation=(2, 1)), (_r(2, 4, 5, 4),)),
    "conv transpose 1d, 3d": ("conv-transpose", _Call(lambda m, x, y: (m[0](x), m[1](y)),
                                                     nn.ConvTranspose1d(3, 2, 4, 2, 1), nn.ConvTranspose3d(3, 2, 2, 2)),
                              (_r(2, 3, 7), _r(1, 3, 2, 3, 2))),
    "bilinear": ("linear-interpolation", nn.Upsample(scale_factor=(1.5, 0.6), mode="bilinear"), (_r(2, 3, 5, 6),)),
    "bilinear, align corners, size": ("linear-interpolation", nn.Upsample((7, 4), mode="bilinear",
                                                                          align_corners=True), (_r(2, 3, 5, 6),)),
    "linear, trilinear": ("linear-interpolation", _Call(
        lambda m, x, y: (F.interpolate(x, scale_factor=2.5, mode="linear", recompute_scale_factor=True),
                         F.interpolate(y, size=(3, 5, 2), mode="trilinear"))), (_r(2, 3, 5), _r(1, 2, 2, 3, 4))),
    "embedding max_norm": ("embedding-max-norm", nn.Embedding(10, 3, max_norm=0.5, norm_type=1.5),
                           (torch.tensor([[1, 2, 2], [7, 1, 0]]),)),
    "cross entropy with label smoothing": ("label-smoothing", _Call(
        lambda m, x, t: tuple(F.cross_entropy(x, t, weight=torch.linspace(0.5, 2, 5), ignore_index=1,
                                              label_smoothing=0.2, reduction=r) for r in ("mean", "sum", "none"))),
        (_r(2, 5, 3), torch.tensor([[0, 1, 4], [2, 3, 1]]))),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_fix_computes_what_torch_computes(case):
    """Outputs and gradients (parameters and inputs) of the rewritten layer against torch's own, in PyTorch."""
    fix, module, inputs = CASES[case]
    module.train()
    expected_out, expected_grads = _grads(module, inputs)
    buffers = {k: v.clone() for k, v in module.state_dict().items()}
    with registry.applied(module, [fix]):
        got_out, got_grads = _grads(module, inputs)
    torch.testing.assert_close(got_out, expected_out, rtol=1e-5, atol=1e-5)
    assert len(got_grads) == len(expected_grads)
    for got, expected in zip(got_grads, expected_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    if case == "instance norm with running stats":  # updated once more, as torch's second forward would
        for name in ("running_mean", "running_var"):
            assert not torch.equal(module.state_dict()[name], buffers[name])


def test_the_channel_dropouts_draw_torchs_distribution_and_parity_turns_them_off():
    from ortlab.common.parity import parity

    x = torch.ones(400, 6, 3, 3)
    layer = nn.Dropout2d(0.25)
    with registry.applied(layer, ["feature-dropout"]):
        y = layer(x)
    per_channel = y[:, :, 0, 0]
    assert torch.equal(y, per_channel[:, :, None, None].expand_as(y))  # one draw per sample and channel
    assert torch.allclose(per_channel.unique(), torch.tensor([0.0, 1 / 0.75]))
    assert abs((per_channel == 0).float().mean().item() - 0.25) < 0.05
    alpha = nn.AlphaDropout(0.2)
    z = torch.randn(20_000, generator=torch.Generator().manual_seed(3))
    with registry.applied(alpha, ["feature-dropout"]):
        out = alpha(z)
    assert abs(out.mean().item()) < 0.05 and abs(out.std().item() - 1) < 0.05  # alpha dropout keeps both
    with parity(alpha, True, 0), registry.applied(alpha, ["feature-dropout"]):
        assert torch.equal(alpha(z), z) and torch.equal(F.dropout2d(x, 0.5), x)


def test_the_fixes_keep_parameters_and_state_dict_keys_and_are_undone():
    from tests.factories.layers import Bare

    model = Bare()
    keys, params = list(model.state_dict()), [id(p) for p in model.parameters()]
    functions = {name: getattr(F, name) for name in dir(F) if not name.startswith("_")}
    with registry.applied(model, LAYER_FIXES):
        assert list(model.state_dict()) == keys and [id(p) for p in model.parameters()] == params
        assert F.hardswish is not functions["hardswish"] and "forward" in vars(model.gru)
    assert {name: getattr(F, name) for name in functions} == functions
    assert not any("forward" in vars(m) for m in model.modules())


def test_every_layer_fix_is_recommended_for_the_blocker_check_reports():
    """`removes` matches what ortlab check reports for the layer (the survey's blockers in the data)."""
    data = json.loads((ROOT / "docs" / "compatibility.json").read_text())
    recommended = {f for row in data["layers"] for b in row["blockers"] for f in b["fixes"]}
    assert set(LAYER_FIXES) <= recommended


def test_the_layer_table_covers_every_layer():
    from ortlab.demo.layers import LAYERS

    data = json.loads((ROOT / "docs" / "compatibility.json").read_text())
    assert [row["layer"] for row in data["layers"]] == list(LAYERS)
    page = (ROOT / "docs" / "compatibility.md").read_text()
    assert "## torch.nn layers" in page and all(f"(`{name}`)" in page for name in LAYERS)


def test_a_blocker_names_what_ort_lacks_on_cuda_and_what_to_do():
    from ortlab.compat.blockers import NO_GRADIENT_KERNEL, UNSUPPORTED_OP, Blocker
    from ortlab.compat.check import CheckReport, recommend

    kernel = Blocker(NO_GRADIENT_KERNEL, "ConvTransposeGrad", "m", "session", module="up")
    ctc = Blocker(UNSUPPORTED_OP, "aten::ctc_loss", "m", "export", source="model.py:3 in forward")
    assert recommend([kernel, ctc], nn.Linear(1, 1)) == ["conv-transpose"]
    assert kernel.cuda is True and kernel.line() == ("no gradient kernel: ConvTransposeGrad (module up; ORT has it "
                                                     "on CUDA); fix: conv-transpose")
    assert ctc.cuda is False and ctc.fixes == [] and "compute the CTC loss outside" in ctc.remedy
    assert ctc.line().startswith("unsupported operator: aten::ctc_loss (at model.py:3 in forward; not on CUDA")
    report = CheckReport("m", [kernel, ctc], ["conv-transpose"], [ctc], None)
    assert report.table()["on CUDA"].tolist() == ["ORT has it", "missing too"]  # the Lab's check table


# --------------------------------------------------------------------------- on ORTModule


@slow
@pytest.mark.ort
def test_the_bare_layers_train_on_ortmodule_with_their_fixes_in_one_export():
    """Every rewritten layer, in its variants, bare: the first step's gradients of ORTModule with the fixes against
    PyTorch's as written, parameter by parameter."""
    from ortlab.verdict.gradients import first_step
    from tests.factories.layers import bare

    gradients = first_step(bare(), LAYER_FIXES)
    assert gradients.forward_agrees and len(gradients.rows) == len(list(bare().model.parameters()))
    assert gradients.worst["relative"] <= 1e-5, gradients.worst


@slow
@pytest.mark.timeout(900)
@pytest.mark.ort
def test_each_layer_trains_as_the_compatibility_page_says():
    """Each layer model: check with fixes="auto", the first step's gradients and a 3-step parity burst with the
    fixes, against docs/compatibility.json."""
    script = _script()
    expected = {row["layer"]: row for row in json.loads(script.DATA.read_text())["layers"]}
    for row in script.survey_layers():
        want = expected[row["layer"]]
        assert (row["status"], row["fixes"]) == (want["status"], want["fixes"]), (
            f"{row['layer']}: {row['status']} {row['fixes']}, the page says {want['status']} {want['fixes']}: "
            "python scripts/compatibility.py layers")
        assert [(b["kind"], b["op"]) for b in row["blockers"]] == [(b["kind"], b["op"]) for b in want["blockers"]]
        if row["status"] in ("ok", "fixed"):
            assert row["parity"]["pytorch"] == row["parity"]["ortmodule"] == "ok", row
            assert row["parity"]["agree"] and row["gradient"] <= script.PARITY, row
    assert expected["ctc"]["status"] == "blocked"  # the one layer no fix keeps the math of: no export


@slow
@pytest.mark.parametrize("name", ["mobilenet", "vit"])
@pytest.mark.ort
def test_whole_models_train_with_fix_auto_in_parity(name, tmp_path):
    from onnxruntime.training.ortmodule import ORTModule

    import ortlab
    from ortlab import Session
    from ortlab.demo import layers

    with Session(f"ortlab.demo.layers:{name}", out=tmp_path, in_process=True) as s:
        comparison = s.compare(steps=3, parity=True, progress=False, fixes="auto")
    applied = comparison.ortmodule.meta["fixes"]["applied"]
    assert {"mobilenet": "activations", "vit": "explicit-attention"}[name] in applied
    assert comparison.pytorch.ok and comparison.ortmodule.ok, comparison.ortmodule.error
    assert comparison.to_dict()["max_loss_diff"] <= 1e-5

    # the user's own loop: ORTModule over the model with the fixes, recorded; the checkpoint loads back
    workload = getattr(layers, name)()
    keys = list(workload.model.state_dict())
    with registry.applied(workload.model, applied):
        model = ORTModule(workload.model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with ortlab.record(model, out=tmp_path / "record") as rec:
            for step in range(2):
                inputs, target = workload.batch(step)
                loss = workload.loss(model(inputs), target)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                rec.step(loss=loss)
    assert ortlab.load_run(rec.path).status == "ok"
    assert list(workload.model.state_dict()) == keys
    getattr(layers, name)().model.load_state_dict(workload.model.state_dict())
