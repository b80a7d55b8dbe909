"""ortlab.wrap: a model in ORTModule for the user's own training, with ortlab's options and fixes (applied around
its forwards only), fallback disabled; real ORTModule, Trainer and DDP objects."""

import os

import pytest
import torch

import ortlab
from ortlab.wrapping import OrtModuleFailed, WrapError, info_of


class Hardswish(torch.nn.Module):
    """ORT 1.19.2 has no gradient for HardSwish: the fix "activations" writes it with ReLU."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.nn.functional.hardswish(self.fc(x))


def _batch(step):
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(step))


def _train(model, steps=3):
    torch.manual_seed(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        loss = model(_batch(step)).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _model(cls=Hardswish):
    torch.manual_seed(0)
    return cls()


def test_bad_input_is_refused_in_one_line():
    with pytest.raises(WrapError, match=r"allowed: a torch\.nn\.Module"):
        ortlab.wrap("model")
    with pytest.raises(WrapError, match=r"torch\.compile"):
        ortlab.wrap(torch.compile(torch.nn.Linear(2, 2)))
    with pytest.raises(WrapError, match="graph-per-value needs ortlab's bursts"):
        ortlab.wrap(torch.nn.Linear(2, 2), fixes="graph-per-value")
    with pytest.raises(WrapError, match="never runs the model on PyTorch silently"):
        ortlab.wrap(torch.nn.Linear(2, 2), options={"fallback_policy": "FALLBACK_FORCE_TORCH_FORWARD"})
    with pytest.raises(ortlab.InputError, match="not known"):
        ortlab.wrap(torch.nn.Linear(2, 2), fixes="no-such-fix")


@pytest.mark.slow
@pytest.mark.ort
def test_auto_fixes_stay_for_the_models_life_and_reach_no_other_model():
    plain = _train(_model())
    original = torch.nn.functional.hardswish
    wrapped = ortlab.wrap(_model(), example=_batch(0))  # fixes="auto": ortlab check on the example, now
    assert info_of(wrapped).fixes == ("activations",) and not info_of(wrapped).pending
    assert torch.nn.functional.hardswish is original  # applied around the wrapped model's forwards only
    assert _train(wrapped) == pytest.approx(plain, rel=1e-5)
    assert torch.nn.functional.hardswish is original
    assert ortlab._ort.Wrap(wrapped, True).exported_model() is not None  # ORT trained it, not PyTorch


@pytest.mark.slow
@pytest.mark.ort
def test_a_failure_raises_one_line_never_a_pytorch_run():
    wrapped = ortlab.wrap(_model(), fixes="none")
    with pytest.raises(OrtModuleFailed, match=r"^ORTModule failed in .*HardSwish") as failed:
        _train(wrapped, steps=1)
    assert "\n" not in str(failed.value) and failed.value.__cause__ is not None


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.ort
def test_in_a_trainer_the_deferred_check_runs_on_the_first_batch(tmp_path, lora):
    from transformers import Trainer, TrainingArguments

    from ortlab.demo.families import SEQ, _decoder_config

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            ids = torch.randint(0, 128, (SEQ,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids}

    def losses(wrap):
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        model = LlamaForCausalLM(_decoder_config(LlamaConfig, num_key_value_heads=2))
        if lora:  # its forward takes (*args, **kwargs): the Trainer keeps the columns its base model names
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
        model = ortlab.wrap(model) if wrap else model
        args = TrainingArguments(str(tmp_path), max_steps=3, per_device_train_batch_size=2, logging_steps=1,
                                 report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True, seed=0)
        trainer = Trainer(model=model, args=args, train_dataset=Data())
        trainer.train()
        return [h["loss"] for h in trainer.state.log_history if "loss" in h], model

    plain, _ = losses(False)
    wrapped, model = losses(True)
    assert wrapped == pytest.approx(plain, abs=2e-4) and not info_of(model).pending


@pytest.mark.slow
@pytest.mark.ort
def test_under_ddp_ortmodule_goes_inside(tmp_path):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        with pytest.raises(WrapError, match=r"DDP\(ortlab.wrap\(model\)\)"):
            ortlab.wrap(DDP(torch.nn.Linear(8, 8)))
        with pytest.raises(WrapError, match="pass example="):  # no check inside DDP's forward
            DDP(ortlab.wrap(_model()))(_batch(0))
        plain = _train(_model())
        assert _train(DDP(ortlab.wrap(_model(), example=_batch(0)))) == pytest.approx(plain, rel=1e-5)
    finally:
        dist.destroy_process_group()


@pytest.mark.ort
def test_options_read_at_import_are_refused_once_onnxruntime_is_imported():
    import onnxruntime.training.ortmodule  # noqa: F401 - what a process that used ORTModule has done

    with pytest.raises(WrapError, match="ORTMODULE_ENABLE_CUSTOM_AUTOGRAD before Python starts"):
        ortlab.wrap(torch.nn.Linear(2, 2), options={"enable_custom_autograd": False}, fixes="none")
    os.environ["ORTMODULE_ENABLE_CUSTOM_AUTOGRAD"] = "1"  # the default, set: nothing to change
    try:
        wrapped = ortlab.wrap(torch.nn.Linear(2, 2), fixes="none")
    finally:
        del os.environ["ORTMODULE_ENABLE_CUSTOM_AUTOGRAD"]
    assert info_of(wrapped).options["fallback_policy"] == "FALLBACK_DISABLE"


@pytest.mark.ort
def test_options_read_at_import_are_set_before_onnxruntime_is_imported():
    import subprocess
    import sys

    script = ("import os, sys, torch, ortlab\n"
              "ortlab.wrap(torch.nn.Linear(2, 2), options={'enable_custom_autograd': False}, fixes='none')\n"
              "print(os.environ['ORTMODULE_ENABLE_CUSTOM_AUTOGRAD'])\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("0"), r.stderr[-2000:]
