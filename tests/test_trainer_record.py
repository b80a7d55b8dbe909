"""ortlab.hf.RecordCallback and ortlab.lightning.RecordCallback on real Trainers: one row per optimizer step with
the trainer's own loss, the training unchanged by them, ORT's files when the model is ortlab.wrap'ped."""

import json
import subprocess
import sys

import pytest
import torch

import ortlab
from ortlab.stacks.table import this_stack

SEQ = 16


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        ids = torch.randint(0, 128, (SEQ,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


def _hf(tmp_path, callback=None, wrap=None, steps=3):
    """A tiny Llama's Trainer run (gradient accumulation 2, clipping, warmup): its logged losses."""
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    from ortlab.demo.families import _decoder_config

    torch.manual_seed(0)
    model = LlamaForCausalLM(_decoder_config(LlamaConfig, num_key_value_heads=2))
    model = ortlab.wrap(model, **wrap) if wrap is not None else model
    args = TrainingArguments(str(tmp_path / "trainer"), max_steps=steps, per_device_train_batch_size=2,
                             gradient_accumulation_steps=2, max_grad_norm=1.0, warmup_steps=1, logging_steps=1,
                             report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[callback] if callback else None)
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_hf_rows_are_the_trainers_logged_losses_and_change_nothing(tmp_path):
    plain = _hf(tmp_path)
    callback = ortlab.hf.RecordCallback(out=tmp_path / "runs")
    recorded = _hf(tmp_path, callback)
    assert recorded == plain
    run = ortlab.load_run(callback.path)
    assert run.ok and run.meta["backend"] == "pytorch" and run.meta["model"]["factory"] == "transformers.Trainer"
    assert run.losses == recorded and len(run.metrics) == 3  # one row per optimizer step (2 micro-batches each)
    assert run.meta["trainer"]["gradient_accumulation_steps"] == 2 and run.metrics["grad_norm"].notna().all()
    assert run.meta["stack"]["name"] == str(this_stack()) and run.meta["stack"]["python"] == sys.executable


def test_bad_collectors_are_refused_in_one_line(tmp_path):
    with pytest.raises(ortlab.InputError, match="allowed: 'stats'"):
        ortlab.hf.RecordCallback(out=tmp_path, collect={"plans": {}})
    with pytest.raises(ortlab.InputError, match="allowed: 'stats'"):
        ortlab.lightning.RecordCallback(out=tmp_path, collect={"memory": {}})


@pytest.mark.slow
@pytest.mark.ort
def test_hf_with_ortlab_wrap_keeps_ort_files_and_feeds_runs_and_diff(tmp_path):
    pt = ortlab.hf.RecordCallback(out=tmp_path / "runs", collect={"stats": {}})
    _hf(tmp_path, pt)
    ort = ortlab.hf.RecordCallback(out=tmp_path / "runs", collect={"stats": {}})
    losses = _hf(tmp_path, ort, wrap={"fixes": "none", "options": {"save_onnx": True}})
    run = ortlab.load_run(ort.path)
    assert run.ok and run.meta["backend"] == "ortmodule" and run.losses == losses
    assert run.transitions["action"].tolist() == ["wrap"] and run.ort["overhead"]
    assert (ort.path / "stats.npz").is_file() and list((ort.path / "onnx").glob("*.onnx"))
    assert run.meta["fixes"]["applied"] == [] and run.meta["effective_options"]["fallback_policy"] == \
        "FALLBACK_DISABLE"
    listed = subprocess.run([sys.executable, "-m", "ortlab.cli", "runs", str(tmp_path / "runs"), "--json"],
                            capture_output=True, text=True, timeout=120)
    assert {row["status"] for row in json.loads(listed.stdout)} == {"ok"}
    diff = subprocess.run([sys.executable, "-m", "ortlab.cli", "diff", str(pt.path), str(ort.path)],
                          capture_output=True, text=True, timeout=300)
    assert diff.returncode in (0, 1) and "Traceback" not in diff.stderr, diff.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.ort
def test_the_lora_trainer_wrapped_and_recorded_keeps_its_logged_losses(tmp_path):
    """ortlab.demo.trainers:lora_llama (use_cache on, accumulation 2, clipping 1.0, warmup): train() with its model
    in ortlab.wrap (fixes="auto": no-kv-cache) and the callback."""
    from ortlab.demo.trainers import lora_llama

    def train(wrap, callbacks=None):
        torch.manual_seed(0)
        trainer = lora_llama(out=str(tmp_path / "trainer"))
        trainer.args.max_steps = 3
        if wrap:
            trainer.model = trainer.model_wrapped = ortlab.wrap(trainer.model)
        for callback in callbacks or []:
            trainer.add_callback(callback)
        trainer.train()
        return [h["loss"] for h in trainer.state.log_history if "loss" in h], trainer.model

    plain, _ = train(False)
    callback = ortlab.hf.RecordCallback(out=tmp_path / "runs")
    logged, _ = train(True, [callback])
    assert logged == pytest.approx(plain, abs=2e-4)
    run = ortlab.load_run(callback.path)
    assert run.ok and run.meta["backend"] == "ortmodule" and run.losses == logged
    assert run.meta["fixes"]["applied"] == ["no-kv-cache"] and run.transitions["action"].tolist() == ["wrap"]


def _lightning(tmp_path, callback=None, wrap=False, fail_at=None):
    import lightning as L

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
            self.fc = torch.nn.Linear(4 * 8 * 8, 10)

        def forward(self, x):
            return self.fc(torch.relu(self.conv(x)).flatten(1))

    class Classifier(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = ortlab.wrap(Net()) if wrap else Net()  # fixes="auto": checked on the first batch
            self.losses = []

        def training_step(self, batch, i):
            if i == fail_at:
                raise RuntimeError("stop here")
            loss = torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 1, 8, 8, generator=g), torch.randint(0, 10, (64,),
                                                                                               generator=g))
    torch.manual_seed(0)
    module = Classifier()
    trainer = L.Trainer(max_steps=3, accumulate_grad_batches=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                        default_root_dir=str(tmp_path), callbacks=[callback] if callback else None)
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
    return module.losses


def test_lightning_rows_are_optimizer_steps_and_change_nothing(tmp_path):
    plain = _lightning(tmp_path)
    callback = ortlab.lightning.RecordCallback(out=tmp_path / "runs")
    recorded = _lightning(tmp_path, callback)
    assert recorded == plain
    run = ortlab.load_run(callback.path)
    assert run.ok and run.meta["model"]["factory"] == "lightning.Trainer" and len(run.metrics) == 3
    assert run.meta["stack"]["name"] == str(this_stack()) and run.meta["stack"]["python"] == sys.executable
    means = [(recorded[2 * i] + recorded[2 * i + 1]) / 2 for i in range(3)]  # the step's micro-batches
    assert run.losses == pytest.approx(means, rel=1e-6)


@pytest.mark.ort
def test_lightning_failure_ends_the_run_failed(tmp_path):
    callback = ortlab.lightning.RecordCallback(out=tmp_path / "runs")
    with pytest.raises(RuntimeError, match="stop here"):
        _lightning(tmp_path, callback, fail_at=3)
    run = ortlab.load_run(callback.path)
    assert run.status == "failed" and "stop here" in run.error and len(run.metrics) == 1


@pytest.mark.slow
@pytest.mark.ort
def test_lightning_with_a_wrapped_net_is_recorded_through_its_ortmodule(tmp_path):
    plain = _lightning(tmp_path)
    callback = ortlab.lightning.RecordCallback(out=tmp_path / "runs")
    assert _lightning(tmp_path, callback, wrap=True) == pytest.approx(plain, rel=1e-5)
    run = ortlab.load_run(callback.path)
    assert run.ok and run.meta["backend"] == "ortmodule" and run.transitions["action"].tolist() == ["wrap"]


def test_a_pytorch_lightning_trainer_takes_the_callback(tmp_path):
    import pytorch_lightning as pl

    class Regression(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 1)

        def training_step(self, batch, i):
            return torch.nn.functional.mse_loss(self.fc(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g))
    callback = ortlab.lightning.RecordCallback(out=tmp_path / "runs")
    trainer = pl.Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", default_root_dir=str(tmp_path),
                         callbacks=[callback])
    trainer.fit(Regression(), torch.utils.data.DataLoader(data, batch_size=4))
    run = ortlab.load_run(callback.path)
    assert run.ok and run.meta["model"]["factory"] == "pytorch_lightning.Trainer" and len(run.metrics) == 2


FAILING_SCRIPT = """
import sys
import torch
import ortlab
from tests.test_trainer_record import Tokens, _hf


class Broken(Tokens):
    def __getitem__(self, i):
        if i >= 4:
            raise RuntimeError("bad sample")
        return super().__getitem__(i)


import tests.test_trainer_record as t
t.Tokens = Broken
_hf(__import__("pathlib").Path(sys.argv[1]), ortlab.hf.RecordCallback(out=sys.argv[1] + "/runs"))
"""


def test_hf_run_of_a_script_that_raises_ends_failed(tmp_path):
    """A Trainer tells its callbacks nothing of an exception: the process's end closes the run."""
    from pathlib import Path

    r = subprocess.run([sys.executable, "-c", FAILING_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                       timeout=600, cwd=Path(__file__).parents[1])
    assert r.returncode != 0 and "bad sample" in r.stderr
    (path,) = (tmp_path / "runs").iterdir()
    run = ortlab.load_run(path)
    assert run.status == "failed" and "the process ended during train()" in run.error
