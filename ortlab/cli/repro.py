"""`ortlab repro RUN`: a run's gradient divergence shrunk to the smallest module that reproduces it alone (and, for
torch.compile, the first op inside it), written as a script that shows it with the bare backend
(ortlab.verdict.repro)."""

from __future__ import annotations

import sys

from ortlab.cli.common import add_in_process_arg, add_json_arg, model_kwargs, print_json


def cmd_repro(args) -> int:
    from ortlab.verdict.repro import repro

    def progress(count, tried) -> None:
        print(f"[{count}] {tried.path or '(the whole model)'} ({tried.class_name}): {tried.verdict}"
              f"{f' ({tried.reason})' if tried.reason else ''}, {tried.seconds:.1f} s", file=sys.stderr, flush=True)

    found = repro(args.run, args.out, model=args.model, model_kwargs=model_kwargs(args) or None,
                  in_process=args.in_process, progress=None if args.json else progress)
    if args.json:
        print_json(found.to_dict())
    else:
        print(found)
        if found.localization.ops:
            from ortlab.verdict.ops import lines

            print("\n".join(lines(found.localization.ops)))
    return 0 if found.script is not None else 1


def register(sub) -> None:
    r = sub.add_parser("repro", help="shrink a run's wrong gradient to one module and write a script that shows it",
                       description="For an ORTModule or torch.compile run whose verdict diverged on gradients: "
                       "find the smallest module whose run alone on that backend (the rest in PyTorch, the same "
                       "state and first batch) still reproduces the divergence against float64, by bisecting the "
                       "module tree; for torch.compile also each op inside it, compiled alone and judged against "
                       "itself in float64 (the first that diverged there, the ones that inherited it); and write "
                       "a self-contained script (torch, and onnxruntime-training for ORTModule) with a .pt file "
                       "beside it that runs that module on the bare backend, PyTorch fp32 and float64 and exits 1 "
                       "while the backend's gradient is wrong: a regression test to keep. The localization is "
                       "stored in the run's "
                       "verdict.json and reused. Exit 0 when the script is written, 1 when no module reproduces "
                       "the divergence, 2 for a run that did not diverge on gradients.")
    r.add_argument("run", help="the ORTModule or torch.compile run's folder")
    r.add_argument("--out", default=None, help="folder for the script and its .pt file (default: RUN/repro)")
    r.add_argument("--model", default=None, help="factory: module:callable or file.py:callable (default: the "
                   "run's own, when it names one)")
    r.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="keyword for the factory, value read as JSON when it parses (repeatable)")
    add_in_process_arg(r)
    add_json_arg(r)
    r.set_defaults(func=cmd_repro)
