"""The three ways ORTModule 1.19.2 trains another model than the user's, measured on ortlab.demo.divergence:
each case compared with PyTorch in parity mode (4 AdamW steps from one snapshot), as it is and with the fixes
`ortlab check` recommends. Prints a markdown table (docs/convergence.md quotes it, with the day it was run).

    python scripts/divergence.py [CASE ...]
"""

from __future__ import annotations

import sys
import tempfile

STEPS = 4


def row(case: str) -> str:
    from ortlab import Session

    out = tempfile.mkdtemp(prefix="ortlab-divergence-")
    cells = []
    with Session(f"ortlab.demo.divergence:{case}", out=out, in_process=True) as s:
        for fixes in ("none", "auto"):
            cmp = s.compare(steps=STEPS, parity=True, progress=False, fixes=fixes)
            verdict, d = cmp.verdict, cmp.to_dict()
            worst = (verdict.gradients or {}).get("worst") or [{}]
            cause = next((c["kind"] for c in verdict.causes if c["kind"] != "fix"), "-") if verdict.diverged else "-"
            applied = ", ".join(cmp.ortmodule.meta.get("fixes", {}).get("applied") or []) or "-"
            cells.append((verdict.status, f"{d['max_loss_diff']:.2g}", f"{worst[0].get('relative', 0):.2g}",
                          cause, applied))
    (status, loss, grad, cause, _), (fixed, fixed_loss, _, _, applied) = cells
    return f"| `{case}` | {status} | {loss} | {grad} | {cause} | {applied} | {fixed} | {fixed_loss} |"


def main(cases: list[str]) -> None:
    from ortlab.demo import divergence

    print("| case | as it is | max loss diff | worst gradient | first cause named | fixes (auto) | with them "
          "| max loss diff |")
    print("|---|---|---|---|---|---|---|---|")
    for case in cases or divergence.CASES:
        print(row(case), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
