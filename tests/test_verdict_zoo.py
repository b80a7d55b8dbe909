"""The verdict on models no one at ortlab wrote (torchvision 0.21 from the zoo side folder, small BatchNorm and
InstanceNorm conv nets), compared as a new user would: correct models agree, ORT's wrong squeeze-and-excitation
gradients and BatchNorm buffers without the fix diverge with one cause a user can act on. docs/convergence.md's
zoo table is scripts/convergence.py's data written out."""

import importlib.util
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "convergence.py"


def _script():
    spec = importlib.util.spec_from_file_location("convergence_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_zoo_table_is_the_data_written_out():
    script = _script()
    assert script.PAGE.read_text() == script.page(json.loads(script.DATA.read_text())), (
        "docs/convergence.md's zoo table is not docs/convergence.json written out: python scripts/convergence.py page")


def test_the_data_says_what_is_true_of_each_model():
    script = _script()
    rows = {r["model"]: r for r in json.loads(script.DATA.read_text())["rows"]}
    for factory, fixes, expected in script.ZOO:
        if rows[factory]["status"] == "not measured":  # the slow test below runs it
            continue
        assert rows[factory]["fixes"] == fixes and rows[factory]["status"] == expected, rows[factory]
        assert rows[factory]["exit"] == (1 if expected == "diverged" else 0)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("factory,fixes,expected", _script().ZOO, ids=[z[0] for z in _script().ZOO])
def test_each_zoo_model_gets_the_true_verdict(factory, fixes, expected, tmp_path):
    if not os.environ.get("ORTLAB_ZOO_PACKAGES"):
        pytest.skip("no zoo side folder (ORTLAB_ZOO_PACKAGES: bin/_env.sh sets it)")
    row = _script().run_one(factory, fixes, str(tmp_path))
    assert row["status"] == expected, row
    assert row["exit"] == (1 if expected == "diverged" else 0), row
    assert not any("ortlab/" in c and "ortlab/demo/" not in c for c in row["causes"]), row["causes"]
    if factory in ("efficientnet_b0", "regnet_y_400mf"):  # ORT's squeeze-and-excitation gradients
        assert row["evidence"]["gradients"] == "float64" and "gradient of" in row["headline"], row
        assert "forward agrees" in row["headline"]
        assert not row["evidence"]["ort_to_float64"] <= 100 * row["evidence"]["pytorch_to_float64"]  # nan: not finite
        assert "fc2" in row["evidence"]["parameter"] or any(  # the squeeze-and-excitation block named
            "wrong gradient" in c and ".fc2" in c for c in row["causes"]), row
    if factory == "batch_norm":  # one grouped cause, not one per buffer
        assert len(row["causes"]) == 1 and row["causes"][0].startswith(
            "BatchNorm running statistics in 2 BatchNorm2d modules (`body.1`, `body.4`): ORTModule counts 1 batch "
            "where PyTorch counts 3 batches"), row["causes"]
        assert row["causes"][0].endswith("; weights train the same; fix: pytorch-buffers")
