"""The compatibility tables: which model families train on ORTModule, with which fixes, for each tested
transformers release, and which of torch.nn's common layers do. Writes docs/compatibility.json (the data) and
docs/compatibility.md (the page).

    python scripts/compatibility.py write            # every tested transformers (the side folder for the newest)
    python scripts/compatibility.py survey OUT.json  # the transformers this interpreter imports, families only
    python scripts/compatibility.py layers [NAME...] # the torch.nn layers only (ortlab.demo.layers), in-process
    python scripts/compatibility.py zoo              # the timm models (ortlab.demo.zoo), with the zoo side folder

Per family (ortlab.demo.families): `ortlab check` with fixes="auto" (every blocker with its line, the fixes that
remove them, one ORTModule training step), then PyTorch and ORTModule side by side in parity mode with those fixes
for 3 steps: the fixes keep the math when the losses agree (<= PARITY). tests/test_families.py runs the survey
for each version and fails when the page says something else. Per layer the same, and the first step's gradients
compared parameter by parameter (<= PARITY); tests/test_layers.py checks that table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA, PAGE = ROOT / "docs" / "compatibility.json", ROOT / "docs" / "compatibility.md"
PARITY = 1e-5  # max |loss difference| over 3 parity steps for "keeps the math"
STEPS = 3


def survey(families: list[str] | None = None) -> list[dict]:
    """One row per family with the transformers this interpreter imports."""
    import transformers

    from ortlab import Session
    from ortlab.demo import families as zoo

    transformers.logging.set_verbosity_error()
    rows = []
    out = tempfile.mkdtemp(prefix="ortlab-compat-")
    for name in families or zoo.FAMILIES:
        with Session(f"ortlab.demo.families:{name}", out=out, in_process=True) as s:
            report = s.check("auto")
            row = {"family": name, "model": report.model, "transformers": transformers.__version__,
                   "status": report.status, "fixes": report.fixes,
                   "blockers": [_blocker(b) for b in report.blockers],
                   "remaining": [_blocker(b) for b in report.remaining], "parity": None}
            if report.status != "blocked":
                cmp = s.compare(steps=STEPS, parity=True, progress=False, fixes=report.fixes or "none")
                diff = cmp.to_dict()["max_loss_diff"]
                row["parity"] = {"pytorch": cmp.pytorch.status, "ortmodule": cmp.ortmodule.status,
                                 "max_loss_diff": diff, "agree": diff is not None and diff <= PARITY}
        rows.append(row)
        print(f"{name}: {row['status']} {row['fixes']} {row['parity']}", file=sys.stderr, flush=True)
    return rows


def _blocker(b) -> dict:
    return {"kind": b.kind, "op": b.op, "module": b.module, "source": b.source, "nodes": b.count,
            "fixes": b.fixes}


def survey_zoo(names: list[str] | None = None) -> list[dict]:
    """One row per timm model (ortlab.demo.zoo; timm importable), with what `ortlab check` prints."""
    import timm

    from ortlab import Session
    from ortlab.demo.zoo import MODELS
    from ortlab.verdict.gradients import first_step

    rows = []
    out = tempfile.mkdtemp(prefix="ortlab-zoo-")
    for name in names or MODELS:
        with Session(f"ortlab.demo.zoo:{name}", out=out, in_process=True) as s:
            report = s.check("auto")
            full = [dict(_blocker(b), node=b.node, cuda=b.cuda, remedy=b.remedy, tried=b.tried) for b in
                    report.remaining]
            row = {"model": name, "label": report.model, "timm": timm.__version__, "status": report.status,
                   "fixes": report.fixes, "check": str(report),
                   "blockers": [dict(_blocker(b), node=b.node, remedy=b.remedy, tried=b.tried)
                                for b in report.blockers], "remaining": full, "parity": None, "gradient": None}
            if report.status != "blocked":
                cmp = s.compare(steps=STEPS, parity=True, progress=False, fixes=report.fixes or "none")
                diff = cmp.to_dict()["max_loss_diff"]
                row["parity"] = {"pytorch": cmp.pytorch.status, "ortmodule": cmp.ortmodule.status,
                                 "max_loss_diff": diff, "agree": diff is not None and diff <= PARITY}
                worst = first_step(s._engine.workload, report.fixes).worst
                row["gradient"] = None if worst is None else worst["relative"]
                row["float64"] = against_float64(s._engine.workload, report.fixes)
                row["parity"]["agree"] = diff is not None and (diff <= PARITY or not row["float64"]["diverged"])
        rows.append(row)
        print(f"{name}: {row['status']} {row['fixes']} {row['parity']} {row['gradient']} {row.get('float64')}",
              file=sys.stderr, flush=True)
    return rows


def against_float64(workload, fixes: list[str]) -> dict:
    """The first step's gradients (dropout off) of ORTModule with the fixes and of PyTorch fp32, each measured from
    PyTorch float64's (ortlab.verdict.exact's criterion: ORTModule diverges only when it is measurably further
    from float64 than PyTorch fp32 is): a model of millions of parameters whose losses differ by rounding over
    the parity steps is judged by float64, not by a fixed bound."""
    import copy

    import torch

    from ortlab import _ort
    from ortlab.common.parity import parity
    from ortlab.compat import registry
    from ortlab.verdict.exact import judge
    from ortlab.verdict.gradients import step

    inputs, target = workload.batch(0)
    workload.model.train()
    with parity(workload.model, True, 0):
        fp32 = step(workload, [(inputs, target)])
        with registry.applied(workload.model, fixes):
            ort = step(workload, [(inputs, target)], _ort.new_ortmodule(workload.model))
        wide = copy.copy(workload)
        wide.model = copy.deepcopy(workload.model).double()
        exact = step(wide, [(inputs.double(), target)])
    names = [n for n, g in exact.grads.items() if g is not None]

    def flat(s):
        return torch.cat([s.grads[n].double().reshape(-1) for n in names])

    judged = judge(flat(ort), flat(fp32), flat(exact))
    norm = max(judged.norm, 1e-30)
    return {"ortmodule": judged.candidate / norm, "pytorch_fp32": judged.pytorch / norm, "diverged": judged.diverged}


def run_zoo_survey() -> list[dict]:
    """The timm survey in a child process with the zoo side folder ($ORTLAB_ZOO_PACKAGES) first on PYTHONPATH."""
    folder = os.environ.get("ORTLAB_ZOO_PACKAGES")
    if not folder:
        raise SystemExit("ORTLAB_ZOO_PACKAGES is not set: run this through bin/_env.sh (source bin/_env.sh)")
    env = dict(os.environ, TQDM_DISABLE="1",
               PYTHONPATH=os.pathsep.join([folder, str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        subprocess.run([sys.executable, __file__, "zoo-survey", str(out)], env=env, check=True)
        return json.loads(out.read_text())


def survey_layers(names: list[str] | None = None) -> list[dict]:
    """One row per torch.nn layer model (ortlab.demo.layers), in this process."""
    from ortlab import Session
    from ortlab.demo.layers import LAYERS
    from ortlab.verdict.gradients import first_step

    rows = []
    out = tempfile.mkdtemp(prefix="ortlab-layers-")
    for name in names or LAYERS:
        with Session(f"ortlab.demo.layers:{name}", out=out, in_process=True) as s:
            report = s.check("auto")
            row = {"layer": name, "model": report.model, "status": report.status, "fixes": report.fixes,
                   "blockers": [dict(_blocker(b), cuda=b.cuda, remedy=b.remedy) for b in report.blockers],
                   "remaining": [dict(_blocker(b), cuda=b.cuda, remedy=b.remedy) for b in report.remaining],
                   "parity": None, "gradient": None}
            if report.status != "blocked":
                cmp = s.compare(steps=STEPS, parity=True, progress=False, fixes=report.fixes or "none")
                diff = cmp.to_dict()["max_loss_diff"]
                row["parity"] = {"pytorch": cmp.pytorch.status, "ortmodule": cmp.ortmodule.status,
                                 "max_loss_diff": diff, "agree": diff is not None and diff <= PARITY}
                worst = first_step(s._engine.workload, report.fixes).worst
                row["gradient"] = None if worst is None else worst["relative"]
        rows.append(row)
        print(f"{name}: {row['status']} {row['fixes']} {row['parity']} {row['gradient']}", file=sys.stderr,
              flush=True)
    return rows


def side_folder() -> Path:
    """The side folder with the newest transformers (installed if missing)."""
    found = os.environ.get("ORTLAB_SIDE_PACKAGES")
    if found and (Path(found) / ".complete").is_file():
        return Path(found)
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "side_packages.py")], capture_output=True,
                          text=True, check=True)
    return Path(done.stdout.strip())


def run_survey(version: str, families: list[str] | None = None) -> list[dict]:
    """The survey in a child process that imports transformers `version` (the lock's, or the side folder's)."""
    from ortlab.stacks.versions import TESTED_TRANSFORMERS

    env = dict(os.environ, TQDM_DISABLE="1")
    if version != TESTED_TRANSFORMERS[0]:
        env["PYTHONPATH"] = os.pathsep.join([str(side_folder()), *filter(None, [env.get("PYTHONPATH")])])
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        subprocess.run([sys.executable, __file__, "survey", str(out), *(families or [])], env=env, check=True)
        rows = json.loads(out.read_text())
    found = {r["transformers"] for r in rows}
    if found != {version}:
        raise SystemExit(f"the survey for transformers {version} imported {', '.join(sorted(found))}")
    return rows


def page(data: dict) -> str:
    from ortlab.compat.registry import FIXES, get

    versions = data["versions"]
    by = {(r["family"], r["transformers"]): r for v in versions for r in data["rows"][v]}
    families = list(dict.fromkeys(r["family"] for v in versions for r in data["rows"][v]))
    lines = [
        "# Which models train on ORTModule",
        "",
        "Generated by `python scripts/compatibility.py write` from `docs/compatibility.json`; `tests/test_families.py`",
        "runs the same survey for each version and fails when this page says something else. Do not edit by hand.",
        "",
        f"ORTModule of onnxruntime-training {data['ort']}, torch {data['torch']}, on the CPU. Each family is a",
        "tiny random config from `ortlab.demo.families` (no download), trained the way people train it: labels",
        "passed in, the model's own loss, the attention implementation transformers picks by default. `ortlab",
        "check` lists every blocker with its source line and the fixes that remove it; the fixes are then verified",
        f"by a parity burst ({STEPS} steps, PyTorch as written against ORTModule with the fixes: losses within",
        f"{PARITY:g}).",
        "",
        "| family | " + " | ".join(f"transformers {v}" for v in versions) + " |",
        "|---|" + "---|" * len(versions),
    ]
    for family in families:
        cells = [_cell(by.get((family, v))) for v in versions]
        model = next(by[(family, v)]["model"] for v in versions if (family, v) in by)
        lines.append(f"| {model} (`{family}`) | " + " | ".join(cells) + " |")
    lines += ["", "Try one: `bin/ortlab check --model ortlab.demo.families:llama`, then",
              "`bin/ortlab burst --model ortlab.demo.families:llama --fix auto --parity`.", "",
              "## What ORTModule meets, and where", ""]
    for v in versions:
        found = [(r, b) for r in data["rows"][v] for b in r["blockers"]]
        lines.append(f"transformers {v}: " + ("nothing." if not found else ""))
        if found:
            lines += ["", "| family | blocker | module | source | fixed by |", "|---|---|---|---|---|"]
            lines += [f"| {r['family']} | {b['kind']}: `{b['op']}` ({b['nodes']} node{'s' * (b['nodes'] > 1)}) | "
                      f"{b['module'] or '(root)'} | `{b['source']}` | {', '.join(b['fixes']) or 'no fix'} |"
                      for r, b in found]
        lines.append("")
    if data.get("layers"):
        lines += _layers(data["layers"])
    if data.get("zoo"):
        lines += _zoo(data["zoo"])
    lines += ["## The fixes", "",
              "Applied to the ORTModule burst only (the PyTorch baseline runs the model as written), undone when",
              "the burst ends; parameters and state_dict keys are never changed.", ""]
    for name in FIXES:
        fix = get(name)
        lines += [f"### `{name}` ({fix.kind})", "", fix.describe()["doc"], ""]
    return "\n".join(lines).rstrip() + "\n"


def _layers(rows: list[dict]) -> list[str]:
    """The torch.nn layers' section of the page."""
    lines = [
        "## torch.nn layers", "",
        "Each of torch.nn's common layers in a small model built around it (`ortlab.demo.layers`), as written, on",
        "the CPU: `ortlab check` with fixes=\"auto\", then the first step's gradients compared parameter by",
        f"parameter and a parity burst ({STEPS} steps) with the fixes, both within {PARITY:g} of PyTorch. \"ORT on",
        "CUDA\" says whether ONNX Runtime 1.19.2 has what the CPU lacks on CUDA (read from its source:",
        "`ortlab/compat/known.py`). `python scripts/compatibility.py layers` writes this section;",
        "`tests/test_layers.py` fails when it is not current.", "",
        "| layer | on the CPU | what stops it as written | ORT on CUDA | first-step gradients | parity |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["status"] in ("blocked", "diverges"):
            cell = ("blocked by " if r["status"] == "blocked" else "trains another model than PyTorch: ") + "; ".join(
                f"{b['kind']} `{b['op']}`: {b['remedy']}" for b in r["remaining"])
        else:
            cell = "trains" if r["status"] == "ok" else f"trains with {', '.join(f'`{f}`' for f in r['fixes'])}"
        stops = "; ".join(f"{b['kind']} `{b['op']}`" for b in r["blockers"]) or "nothing"
        cuda = "; ".join(f"`{b['op']}`: {'has it' if b['cuda'] else 'lacks it too'}" for b in r["blockers"]
                         if b.get("cuda") is not None)
        parity = r["parity"] or {}
        agree = ("" if not parity else f"{parity['max_loss_diff']:.1e}" + ("" if parity["agree"] else " NOT met"))
        gradient = "" if r["gradient"] is None else f"{r['gradient']:.1e}"
        lines.append(f"| {r['model']} (`{r['layer']}`) | {cell} | {stops} | {cuda} | {gradient} | {agree} |")
    return [*lines, ""]


def _zoo(rows: list[dict]) -> list[str]:
    """The timm models' section of the page."""
    lines = [
        f"## timm models (timm {rows[0]['timm']})", "",
        "timm classifiers no one here wrote (`ortlab.demo.zoo`: random weights, batch 2 at 64x64, 10 classes), with",
        "timm from the zoo side folder: `ortlab check` with fixes=\"auto\" (each fix named only when exporting",
        "again with it removed its blocker), then, where it trains, the first step's gradients and a parity burst",
        f"({STEPS} steps) with the fixes. `python scripts/compatibility.py zoo` writes this section;",
        "`tests/test_advice.py` fails when it is not current.", "",
        "The last columns: the first step's gradients of ORTModule and of PyTorch fp32, each measured from PyTorch",
        "float64's (relative, all parameters), and the largest loss difference over the parity steps: ORTModule",
        "agrees when it is no further from float64 than PyTorch fp32 is (`ortlab.verdict.exact`), or within",
        f"{PARITY:g}.", "",
        "| model | on the CPU | what stops it as written | first-step gradients | gradients from float64: ORT, "
        "PyTorch fp32 | parity |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["status"] in ("blocked", "diverges"):
            cell = "blocked by " + "; ".join(
                f"{b['kind']} `{b['op']}` at node `{b['node']}` (module {b['module']}, `{b['source']}`): {b['remedy']}"
                for b in r["remaining"])
        else:
            cell = "trains" if r["status"] == "ok" else f"trains with {', '.join(f'`{f}`' for f in r['fixes'])}"
        stops = "; ".join(f"{b['kind']} `{b['op']}` ({b['nodes']} node{'s' * (b['nodes'] > 1)}, module "
                          f"{b['module']}, `{b['source']}`)" for b in r["blockers"]) or "nothing"
        parity = r["parity"] or {}
        agree = ("" if not parity else f"{parity['max_loss_diff']:.1e}" + ("" if parity["agree"] else " NOT met"))
        gradient = "" if r["gradient"] is None else f"{r['gradient']:.1e}"
        wide = r.get("float64")
        exact = "" if not wide else f"{wide['ortmodule']:.1e}, {wide['pytorch_fp32']:.1e}"
        lines.append(f"| {r['label']} (`{r['model']}`) | {cell} | {stops} | {gradient} | {exact} | {agree} |")
    return [*lines, ""]


def check_section(rows: list[dict]) -> str:
    """What `ortlab check` prints for each timm model: docs/check.md's generated section."""
    lines = [CHECK_BEGIN, "", "## What check says of timm models", "",
             "Generated by `python scripts/compatibility.py zoo` (timm from the zoo side folder); do not edit.", ""]
    for r in rows:
        lines += [f"`ortlab check --model ortlab.demo.zoo:{r['model']}`:", "", "```", r["check"], "```", ""]
        if r["parity"]:
            wide = r["float64"]
            lines += [f"With `--fix auto`: the first step's gradients {wide['ortmodule']:.1e} from PyTorch float64's "
                      f"(PyTorch fp32: {wide['pytorch_fp32']:.1e}); the worst parameter {r['gradient']:.1e} from "
                      f"PyTorch fp32's; losses within {r['parity']['max_loss_diff']:.1e} over {STEPS} parity "
                      "steps.", ""]
    return "\n".join([*lines, CHECK_END])


CHECK = ROOT / "docs" / "check.md"
CHECK_BEGIN, CHECK_END = "<!-- zoo: begin (scripts/compatibility.py) -->", "<!-- zoo: end -->"


def check_page(text: str, rows: list[dict]) -> str:
    """docs/check.md with its generated section replaced (appended when it has none)."""
    if CHECK_BEGIN in text:
        head, rest = text.split(CHECK_BEGIN, 1)
        return head + check_section(rows) + rest.split(CHECK_END, 1)[1]
    return text.rstrip() + "\n\n" + check_section(rows) + "\n"


def _cell(row: dict | None) -> str:
    if row is None:
        return "not surveyed"
    parity = row["parity"] or {}
    if row["status"] == "blocked":
        return "blocked by " + "; ".join(f"{b['kind']} `{b['op']}`" for b in row["remaining"])
    note = "" if parity.get("agree") else f" (parity NOT met: {parity.get('max_loss_diff')})"
    return ("trains" if row["status"] == "ok" else f"trains with fixes {', '.join(row['fixes'])}") + note


def main(argv: list[str]) -> None:
    if argv[:1] == ["survey"] and len(argv) >= 2:
        rows = survey(argv[2:] or None)
        Path(argv[1]).write_text(json.dumps(rows, indent=1) + "\n")
    elif argv[:1] == ["write"]:
        import importlib.metadata as md

        from ortlab.stacks.versions import TESTED_TRANSFORMERS

        data = {"ort": md.version("onnxruntime-training"), "torch": md.version("torch"),
                "versions": list(TESTED_TRANSFORMERS), "rows": {v: run_survey(v) for v in TESTED_TRANSFORMERS},
                "layers": survey_layers(), "zoo": run_zoo_survey()}
        DATA.write_text(json.dumps(data, indent=1) + "\n")
        PAGE.write_text(page(data))
        CHECK.write_text(check_page(CHECK.read_text(), data["zoo"]))
        print(f"wrote {PAGE.relative_to(ROOT)}, {CHECK.relative_to(ROOT)} and {DATA.relative_to(ROOT)}")
    elif argv[:1] == ["zoo-survey"] and len(argv) == 2:
        Path(argv[1]).write_text(json.dumps(survey_zoo(), indent=1) + "\n")
    elif argv[:1] == ["zoo"]:  # the timm models again, the other rows kept
        data = json.loads(DATA.read_text())
        data["zoo"] = run_zoo_survey()
        DATA.write_text(json.dumps(data, indent=1) + "\n")
        PAGE.write_text(page(data))
        CHECK.write_text(check_page(CHECK.read_text(), data["zoo"]))
        print(f"wrote {PAGE.relative_to(ROOT)}, {CHECK.relative_to(ROOT)} and {DATA.relative_to(ROOT)}")
    elif argv[:1] == ["layers"]:  # the layers' survey again (all, or the ones named), the families' rows kept
        data = json.loads(DATA.read_text())
        fresh = {row["layer"]: row for row in survey_layers(argv[1:] or None)}
        data["layers"] = [fresh.pop(row["layer"], row) for row in data.get("layers", [])] + list(fresh.values())
        DATA.write_text(json.dumps(data, indent=1) + "\n")
        PAGE.write_text(page(data))
        print(f"wrote {PAGE.relative_to(ROOT)} and {DATA.relative_to(ROOT)}")
    elif argv[:1] == ["page"]:  # the pages again from the data (after a change of this script)
        data = json.loads(DATA.read_text())
        PAGE.write_text(page(data))
        if data.get("zoo"):
            CHECK.write_text(check_page(CHECK.read_text(), data["zoo"]))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
