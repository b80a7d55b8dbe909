"""The verdict's zoo: models no one at ortlab wrote (tests/factories/zoo.py: torchvision 0.21 from the zoo side
folder, and small BatchNorm and InstanceNorm conv nets), each compared as a new user would
(`ortlab burst --backend both --parity --steps 3`, with or without `--fix auto`), and what the verdict says, with
its evidence: the worst gradient's distance to float64 beside PyTorch fp32's. Writes docs/convergence.json (the
data) and the table in docs/convergence.md between its markers.

    python scripts/convergence.py write     # run the zoo (minutes on 2 cores), write the data and the table
    python scripts/convergence.py page      # the table again from docs/convergence.json
    python scripts/convergence.py row NAME  # one model's row as JSON (to run several at once)
    python scripts/convergence.py collect ROWS.jsonl   # the data from rows run one by one, then the table

tests/test_verdict_zoo.py checks that the page is the data written out, and (slow tier) runs each model and
checks its verdict against the expected one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA, PAGE = ROOT / "docs" / "convergence.json", ROOT / "docs" / "convergence.md"
FACTORIES = ROOT / "tests" / "factories" / "zoo.py"
BEGIN, END = "<!-- zoo table: python scripts/convergence.py -->", "<!-- end of zoo table -->"
STEPS = 3
# (factory, fixes, the expected verdict: what is true of the model on ORTModule 1.19.2); "name@7": the factory's
# model from another start (--model-arg seed=7)
ZOO = (
    ("resnet18", "auto", "agree"),
    ("mnasnet0_5", "auto", "agree"),
    ("mnasnet0_5@7", "auto", "agree"),
    ("efficientnet_b0", "none", "diverged"),
    ("regnet_y_400mf", "none", "diverged"),
    ("convnext_tiny", "auto", "agree"),
    ("instance_norm", "auto", "agree"),
    ("batch_norm", "none", "diverged"),
)


def environment() -> dict[str, str]:
    """This environment with the zoo side folder first on PYTHONPATH (bin/_env.sh names it)."""
    env = dict(os.environ)
    zoo = env.get("ORTLAB_ZOO_PACKAGES")
    if not zoo:
        sys.exit("ORTLAB_ZOO_PACKAGES is not set: run through bin/_env.sh (source bin/_env.sh)")
    env["PYTHONPATH"] = os.pathsep.join([zoo, str(ROOT), env.get("PYTHONPATH", "")])
    return env


def run_one(factory: str, fixes: str, out: str | None = None) -> dict:
    """One comparison through the CLI, in a child with the zoo first on its path: the row of the table."""
    out = out or tempfile.mkdtemp(prefix="ortlab-zoo-")
    name, _, seed = factory.partition("@")
    start = ["--model-arg", f"seed={seed}"] if seed else []
    done = subprocess.run([sys.executable, "-m", "ortlab.cli", "burst", "--model", f"{FACTORIES}:{name}", *start,
                           "--backend", "both", "--parity", "--steps", str(STEPS), "--fix", fixes, "--json",
                           "--in-process", "--out", out], capture_output=True, text=True, env=environment(),
                          cwd=out)
    try:
        result = json.loads(done.stdout)
    except ValueError:
        return {"model": factory, "fixes": fixes, "exit": done.returncode, "status": "failed",
                "error": done.stderr.strip().splitlines()[-1:] or ["no output"]}
    run = Path(result["ortmodule"]["path"])
    verdict = json.loads((run / "verdict.json").read_text())
    meta = json.loads((run / "meta.json").read_text())
    return {"model": factory, "name": meta["model"].get("name") or factory, "fixes": fixes,
            "applied": (meta.get("fixes") or {}).get("applied") or [], "exit": done.returncode,
            "status": verdict["status"], "evidence": evidence(verdict), "headline": verdict["headline"],
            "causes": [c["text"] for c in verdict["causes"]]}


def evidence(verdict: dict) -> dict:
    """The numbers a reader checks: the worst gradient's distances to float64 (ORT's, PyTorch fp32's) and their
    ratio, and the loss curve's, with what judged each."""
    grads = verdict.get("gradients") or {}
    worst = (grads.get("worst") or [{}])[0]
    losses = verdict.get("losses") or {}
    out = {"gradients": grads.get("judged_by"), "parameter": worst.get("parameter"),
           "ort_to_float64": worst.get("to_float64"), "pytorch_to_float64": worst.get("pytorch_to_float64"),
           "spread": worst.get("spread"), "gradient_members": len(grads.get("members") or []),
           "losses": losses.get("judged_by"), "loss_ort_to_float64": losses.get("to_float64"),
           "loss_pytorch_to_float64": losses.get("pytorch_to_float64"),
           "loss_spread": max(losses.get("members") or [], default=None), "loss_norm": losses.get("norm"),
           "loss_members": len(losses.get("members") or []), "chaotic": bool(losses.get("chaotic")),
           "no_evidence": bool(losses.get("no_evidence")),
           "state_differs": (verdict.get("state") or {}).get("count", 0)}
    return out


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return "-"
    from ortlab.verdict.exact import number

    return "inf" if b == 0 else number(a / b)


def _fp32(pytorch: float, spread: float | None, members: int) -> str:
    """PyTorch fp32's distance, and the ensemble's largest where one ran: "7.2e-05" or "7.2e-05 (8 runs: 0.012)"."""
    from ortlab.verdict.exact import number

    runs = f"{members} more run{'s' if members > 1 else ''}"
    return number(pytorch) + (f" ({runs}: up to {number(spread)})" if members and spread is not None else "")


def table(rows: list[dict]) -> str:
    from ortlab.verdict.exact import number

    lines = ["| model | fixes | evidence: worst gradient (ORT→fp64 / fp32→fp64 = ratio) | losses (same) | verdict |",
             "|---|---|---|---|---|"]
    for r in rows:
        e = r.get("evidence") or {}
        if e.get("gradients") == "float64":
            noise = max(e["pytorch_to_float64"], e.get("spread") or 0.0)
            grad = (f"`{e['parameter']}`: {number(e['ort_to_float64'])} / "
                    f"{_fp32(e['pytorch_to_float64'], e.get('spread'), e.get('gradient_members', 0))} = "
                    f"{_ratio(e['ort_to_float64'], noise)}")
        else:
            grad = e.get("gradients") or "-"
        if e.get("losses") == "float64":
            noise = max(e["loss_pytorch_to_float64"], e.get("loss_spread") or 0.0)
            loss = (f"{number(e['loss_ort_to_float64'])} / "
                    f"{_fp32(e['loss_pytorch_to_float64'], e.get('loss_spread'), e.get('loss_members', 0))} = "
                    f"{_ratio(e['loss_ort_to_float64'], noise)}" + (" (chaotic: no evidence)" if e.get("no_evidence")
                                                                     else " (chaotic)" if e.get("chaotic") else ""))
        else:
            loss = e.get("losses") or "-"
        verdict = r["status"] + (f": {r['causes'][0]}" if r["status"] == "diverged" and r.get("causes") else "")
        fixes = ", ".join(r.get("applied") or []) or ("-" if r["fixes"] == "none" else "auto: none needed"
                                                      if "applied" in r else r["fixes"])
        lines.append(f"| {r.get('name') or r['model']} | {fixes} | {grad} | {loss} | {verdict.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def page(data: dict) -> str:
    """docs/convergence.md with the table between its markers replaced by the data's."""
    text = PAGE.read_text()
    head, _, rest = text.partition(BEGIN + "\n")
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{table(data['rows'])}{END}{tail}"


def main(argv: list[str]) -> None:
    what = argv[0] if argv else "page"
    fixes = {factory: f for factory, f, _ in ZOO}
    sys.path.insert(0, str(ROOT))
    if what == "row":
        print(json.dumps(run_one(argv[1], fixes[argv[1]])), flush=True)
        return
    if what in ("write", "collect"):
        import torch

        if what == "write":
            rows = [run_one(factory, f) for factory, f, _ in ZOO]
        else:
            found = {r["model"]: r for r in map(json.loads, Path(argv[1]).read_text().splitlines()) if r}
            rows = [found.get(factory) or {"model": factory, "fixes": f, "status": "not measured"}
                    for factory, f, _ in ZOO]
        DATA.write_text(json.dumps({"torch": torch.__version__, "steps": STEPS, "rows": rows}, indent=1) + "\n")
    PAGE.write_text(page(json.loads(DATA.read_text())))


if __name__ == "__main__":
    main(sys.argv[1:])
