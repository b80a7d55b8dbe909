"""Golden outputs: the text ortlab prints (the comparison table, `ortlab time`, a CheckReport) compared line by
line with tests/golden/*.txt, so that a change of wording is a diff a reviewer sees. The inputs are fixed run
folders and reports (no burst: nothing here depends on a timer). `ORTLAB_UPDATE_GOLDEN=1` rewrites the files."""

import json
import os
import shutil
from pathlib import Path

from ortlab.compat.blockers import NO_GRADIENT_KERNEL, UNSUPPORTED_OP, Blocker
from ortlab.compat.check import CheckReport
from ortlab.run import load_run

GOLDEN = Path(__file__).parent / "golden"


def same_as_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("ORTLAB_UPDATE_GOLDEN"):
        path.write_text(text + "\n", encoding="utf-8")
    expected = path.read_text(encoding="utf-8").splitlines()
    assert text.splitlines() == expected, f"{name} changed: review the diff, then ORTLAB_UPDATE_GOLDEN=1"


def fake_run(folder: Path, backend: str, losses: list[float], step_s: float, **files) -> Path:
    """A finished run folder: meta.json, metrics.jsonl, and any other file (name_json=data)."""
    folder.mkdir(parents=True)
    meta = {"status": "ok", "backend": backend, "device": "cpu", "effective_options": {},
            "config": {"optimizer": "adamw", "options": {}, "parity": True}}
    (folder / "meta.json").write_text(json.dumps(meta))
    rows = [{"step": i, "loss": loss, "step_time_s": step_s * (3 if i == 0 else 1), "samples_per_s": 8 / step_s,
             "peak_mem_mb": 500.0 + i} for i, loss in enumerate(losses)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name, data in files.items():
        (folder / name.replace("_json", ".json")).write_text(json.dumps(data))
    return folder


def test_the_comparison_table(tmp_path, monkeypatch):
    from ortlab.summary import Comparison

    monkeypatch.chdir(tmp_path)  # run folders shown relative to it
    pt = fake_run(tmp_path / "20260101-000000-pytorch", "pytorch", [2.5, 2.25, 2.0], 0.010)
    ort = fake_run(tmp_path / "20260101-000001-ortmodule", "ortmodule", [2.5, 2.2501, 2.0002], 0.008,
                   ort_json={"exported": True, "overhead": {"end to end": 4.25, "export": 2.0}})
    compiled = fake_run(tmp_path / "20260101-000002-compile", "compile", [2.5, 2.25, 2.00001], 0.006,
                        compile_json={"compile_s": 12.5, "graph_breaks": [{"count": 2}], "recompiles": []})
    two = Comparison(load_run(pt), load_run(ort))
    three = Comparison(load_run(pt), load_run(ort), load_run(compiled), backends=("pytorch", "ortmodule", "compile"))
    same_as_golden("comparison.txt", f"{two}\n\n{three}")


def test_ortlab_time(tmp_path, monkeypatch, capsys):
    from ortlab.cli import main

    for name in ("20260101-000000-pytorch", "20260101-000001-ortmodule"):
        shutil.copytree(GOLDEN / "runs" / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    assert main(["time", "20260101-000000-pytorch", "20260101-000001-ortmodule", "--top", "5"]) == 0
    same_as_golden("time.txt", capsys.readouterr().out.rstrip("\n"))


def test_a_check_report():
    kernel = Blocker(NO_GRADIENT_KERNEL, "ConvTransposeGrad", "m", "session", module="up")
    ctc = Blocker(UNSUPPORTED_OP, "aten::ctc_loss", "m", "export", source="model.py:3 in forward")
    hazard = {"file": "model.py", "line": 12, "module": "gate", "kind": "a Python branch on a tensor",
              "advice": "the branch taken at export is the only one the graph has"}
    reports = [CheckReport("m", [], [], [], True), CheckReport("m", [kernel], ["conv-transpose"], [], True),
               CheckReport("m", [kernel, ctc], ["conv-transpose"], [ctc], None, unchecked=["CTCLoss"]),
               CheckReport("m", [], [], [], True, hazards=[hazard])]
    same_as_golden("check.txt", "\n\n".join(str(r) for r in reports))
