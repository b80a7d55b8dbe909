"""`ortlab check`: will the model train on ORTModule? Every blocker at once with its source line, and the fixes."""

from __future__ import annotations

from ortlab.cli.common import add_in_process_arg, add_json_arg, add_model_args, add_out_arg, model_kwargs, print_json


def cmd_check(args) -> int:
    from ortlab.engine.session import Session
    from ortlab.options import Options

    with Session(args.model, model_kwargs(args), out=args.out, in_process=args.in_process) as session:
        report = session.check(args.fix, Options.parse(args.option))
    print_json(report.to_dict()) if args.json else print(report)
    return 0 if report.status in ("ok", "fixed") else 1


def register(sub) -> None:
    from ortlab.compat.registry import FIXES

    c = sub.add_parser("check", help="will the model train on ORTModule: every blocker, its source line, the fixes",
                       description="Export the model as ORTModule does and try every operator on ORT (types, "
                       "kernels, gradients), list every blocker with the module and Python line it comes from and "
                       "the fixes that remove it, verify the fixes by exporting again, then run one ORTModule "
                       "training step (no optimizer step). Exit 0 when it trains (as it is or with the fixes), "
                       "1 when it is blocked.")
    add_model_args(c)
    c.add_argument("--fix", default="auto", metavar="auto|none|NAME[,NAME]",
                   help="fixes to verify: auto = the ones that remove what was found, none, or names "
                   f"({', '.join(FIXES)})")
    c.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="ORTModule option, e.g. onnx_opset_version=17 (repeatable)")
    add_out_arg(c, help="folder for the check's folder (<stamp>-check: check.json, log.txt)")
    add_in_process_arg(c)
    add_json_arg(c)
    c.set_defaults(func=cmd_check, needs_ortmodule=True)
