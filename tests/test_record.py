"""ortlab.record on a user's own loop: a script a user could write, a notebook cell, and the guarantee that
recording never changes the training."""

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch
from nbclient import NotebookClient

import ortlab
from ortlab.demo import gpt

SCRIPT = Path(__file__).parent / "scripts" / "train_with_record.py"


def _train(recorder_out=None, steps=4):
    torch.manual_seed(0)
    w = gpt(n_layer=1, d_model=32)  # dropout on: recording must not move the random stream either
    optimizer = torch.optim.AdamW(w.model.parameters(), lr=1e-3)
    losses = []
    rec = ortlab.record(w.model, out=recorder_out, collect={"stats": {}}) if recorder_out else None
    if rec:
        rec.__enter__()
    for step in range(steps):
        x, y = w.batch(step)
        loss = w.loss(w.model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        if rec:
            rec.step(loss=loss)
    if rec:
        rec.__exit__(None, None, None)
    return losses, rec


def test_recording_never_changes_the_training(tmp_path):
    plain, _ = _train()
    recorded, rec = _train(tmp_path)
    assert plain == recorded
    run = ortlab.load_run(rec.path)
    assert run.ok and run.meta["recorded"] and run.losses == pytest.approx(recorded, rel=1e-6)
    assert (rec.path / "stats.npz").is_file()
    assert run.meta["stack"] == _stack_here()  # where it was recorded: no reader guesses it from a version


def _stack_here() -> dict:
    """What a run made in this process records of its stack: this stack, this interpreter, bin/_env.sh's lock."""
    import os
    import sys

    from ortlab.stacks.table import this_stack

    return {"name": str(this_stack()), "python": sys.executable, "lock": os.environ.get("ORTLAB_LOCK")}


@pytest.mark.slow
@pytest.mark.ort
def test_a_users_script_with_and_without_ortmodule_feeds_runs_and_diff(tmp_path):
    paths = {}
    for backend in ("pt", "ort"):
        r = subprocess.run([sys.executable, str(SCRIPT), backend, str(tmp_path)], capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        paths[backend] = Path(r.stdout.strip().splitlines()[-1])
    ort = ortlab.load_run(paths["ort"])
    assert ort.ok and len(ort.metrics) == 3 and ort.metrics["exported"].iloc[0]
    assert ort.ort["overhead"] and ort.transitions["action"].tolist() == ["wrap"]
    listed = subprocess.run([sys.executable, "-m", "ortlab.cli", "runs", str(tmp_path), "--json"],
                            capture_output=True, text=True, timeout=120)
    assert {row["status"] for row in json.loads(listed.stdout)} == {"ok"}
    diff = subprocess.run([sys.executable, "-m", "ortlab.cli", "diff", str(paths["pt"]), str(paths["ort"])],
                          capture_output=True, text=True, timeout=300)
    assert diff.returncode in (0, 1), diff.stderr  # agree, or diverge with the first divergence named
    assert "Traceback" not in diff.stderr


def test_bad_input_is_refused_in_one_line(tmp_path):
    with pytest.raises(ortlab.InputError, match=r"not allowed; allowed: a torch\.nn\.Module"):
        ortlab.record("model", out=tmp_path)
    with pytest.raises(ortlab.InputError, match="allowed: 'stats'"):
        ortlab.record(torch.nn.Linear(2, 2), out=tmp_path, collect={"plans": {}})


@pytest.mark.slow
@pytest.mark.ort
def test_in_a_jupyter_kernel_hanging_log_levels_are_refused(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import torch, ortlab\n"
        "from onnxruntime.training.ortmodule import ORTModule, DebugOptions, LogLevel\n"
        "m = ORTModule(torch.nn.Linear(2, 2), DebugOptions(log_level=LogLevel.INFO))\n"
        "try:\n"
        f"    ortlab.record(m, out={str(tmp_path)!r})\n"
        "except ortlab.InputError as e:\n"
        "    print('refused:', e)\n")])
    NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    text = "".join(o.get("text", "") for o in nb.cells[0].outputs)
    assert "refused: ORTModule log level INFO hangs a Jupyter kernel" in text
