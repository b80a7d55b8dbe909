"""A LightningModule with its data, returned by a factory, bursts like any workload: training_step the loss,
configure_optimizers the optimizer and scheduler, the loader's batches; real Lightning objects."""

import subprocess
import sys
from pathlib import Path

import pytest

import ortlab
from ortlab.workload import ModelRef

FACTORY = Path(__file__).parent / "factories" / "lightning_cnn.py"


def test_a_module_and_its_loader_become_a_workload():
    w = ModelRef.of(f"{FACTORY}:cnn").build()
    assert w.step_loss is not None and w.loss is None and w.batch_size == 8
    assert w.batch(0)[1] == 0 and w.batch(5)[1] == 1  # 4 batches in the epoch: wrapping around
    assert w.batch(5)[0][0][0].data_ptr() == w.batch(1)[0][0][0].data_ptr()
    optimizer, scheduler = w.optimizer(w.model)
    assert type(optimizer).__name__ == "AdamW" and type(scheduler).__name__ == "LinearLR"


def test_a_pytorch_burst_from_a_datamodule(tmp_path):
    run = ortlab.burst(f"{FACTORY}:cnn_datamodule", backend="pytorch", steps=3, out=str(tmp_path), progress=False,
                       in_process=True)
    assert run.ok and len(run.metrics) == 3 and run.metrics["loss"].notna().all()


@pytest.mark.parametrize(("factory", "says"), [("no_loss", "training_step returned None; it must return the loss"),
                                               ("manual", "optimizes manually")])
def test_bad_modules_are_refused_in_one_line(factory, says):
    with pytest.raises(ortlab.WorkloadError, match=says):
        ModelRef.of(f"{FACTORY}:{factory}").build()


@pytest.mark.slow
@pytest.mark.ort
def test_a_small_cnn_bursts_on_both_backends_in_parity_and_agrees(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ortlab.cli", "burst", "--model", f"{FACTORY}:cnn", "--backend", "both",
                        "--parity", "--steps", "4", "--out", str(tmp_path)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "verdict: agree" in r.stdout
