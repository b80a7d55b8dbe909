"""Golden outputs: the text ortlab prints (the comparison table, `ortlab time`, a CheckReport) compared line by
line with tests/golden/*.txt, so that a change of wording is a diff a reviewer sees. The inputs are fixed run
folders and reports (no burst: nothing here depends on a timer). `ORTLAB_UPDATE_GOLDEN=1` rewrites the files."""

import json
import os
import shutil
from pathlib import Path

from ortlab.compat.blockers import NO_GRADIENT_KERNEL, UNSUPPORTED_OP, Blocker
from ortlab.compat.check import CheckReport
from ortlab.runs.run import load_run

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
    from ortlab.comparison.summary import Comparison

    monkeypatch.chdir(tmp_path)  # run folders shown relative to it
    pt = fake_run(tmp_path / "20260101-000000-pytorch", "pytorch", [2.5, 2.25, 2.0], 0.010)
    ort = fake_run(tmp_path / "20260101-000001-ortmodule", "ortmodule", [2.5, 2.2501, 2.0002], 0.008,
                   ort_json={"exported": True, "overhead": {"end to end": 4.25, "export": 2.0}})
    compiled = fake_run(tmp_path / "20260101-000002-compile", "compile", [2.5, 2.25, 2.00001], 0.006,
                        compile_json={"compile_s": 12.5, "graph_breaks": [{"count": 2}], "recompiles": []})
    two = Comparison(load_run(pt), load_run(ort))
    three = Comparison(load_run(pt), load_run(ort), load_run(compiled), backends=("pytorch", "ortmodule", "compile"))
    same_as_golden("comparison.txt", f"{two}\n\n{three}")

    # held by backend name: the same comparison however its runs are given, and a backend's run by its name
    by_name = Comparison(runs={"pytorch": load_run(pt), "ortmodule": load_run(ort), "compile": load_run(compiled)},
                         backends=("pytorch", "ortmodule", "compile"))
    assert str(by_name) == str(three) and str(Comparison(pytorch=load_run(pt), ortmodule=load_run(ort))) == str(two)
    assert by_name.compile.path == compiled and by_name.run("compile").path == compiled and by_name.headline == \
        "ortmodule" and list(by_name.by_backend) == ["pytorch", "ortmodule", "compile"]
    without_ort = Comparison(pytorch=load_run(pt), compile=load_run(compiled))
    assert without_ort.backends == ("pytorch", "compile") and without_ort.headline is None
    assert without_ort.ortmodule is None and without_ort.verdict is None and without_ort.to_dict()["verdict"] is None


def test_a_comparison_holds_any_registered_backend_by_name(tmp_path, monkeypatch):
    import pytest

    from ortlab import BurstError
    from ortlab.comparison.summary import Comparison
    from ortlab.engine.backends import BACKENDS, Registered
    from ortlab.engine.refs import Ref

    monkeypatch.setitem(BACKENDS, "toy", Registered("toy", Ref("tests.factories.toy_backend:Toy"), "toy"))
    pt = load_run(fake_run(tmp_path / "20260101-000000-pytorch", "pytorch", [2.5, 2.25, 2.0], 0.010))
    toy = load_run(fake_run(tmp_path / "20260101-000001-toy", "toy", [2.5, 2.25, 2.125], 0.005))
    c = Comparison(pytorch=pt, toy=toy)
    assert c.backends == ("pytorch", "toy") and c.toy is toy and c.others == ["toy"] and c.runs == [pt, toy]
    data = c.to_dict()
    assert data["toy"]["path"] == str(toy.path) and data["versus"]["toy"]["max_loss_diff"] == 0.125
    assert data["versus"]["toy"]["step_time_ratio"] == 0.5 and "toy_diff" in c.losses()
    assert "toy: max |loss difference| 0.125" in str(c)
    with pytest.raises(BurstError, match=r"^backend 'ortmdule' is not allowed; .*did you mean ortmodule\?$"):
        Comparison(pytorch=pt, ortmdule=toy)


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
