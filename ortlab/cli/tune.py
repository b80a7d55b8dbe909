"""`ortlab tune`: which ORTModule options make a model fastest or smallest, guarded by the verdict."""

from __future__ import annotations

import sys

from ortlab.cli.common import (
    add_in_process_arg,
    add_json_arg,
    add_model_args,
    add_out_arg,
    add_threads_arg,
    model_kwargs,
    positive_float,
    positive_int,
    print_json,
)


def cmd_tune(args) -> int:
    from ortlab.cli import EXIT_INTERRUPTED
    from ortlab.options import Options
    from ortlab.tuning import tune
    from ortlab.tuning.result import FILE

    def progress(event: dict) -> None:
        if event["phase"] != "done":
            print(f"ortlab tune: {event['text'].strip()}", file=sys.stderr, flush=True)

    result = tune(args.model, args.goal or ["time"], args.budget, steps=args.steps, warmup=args.warmup,
                  repeats=args.repeats, guard_steps=args.guard_steps, only=args.only or None,
                  options=Options.parse(args.option), top_plans=args.plans, model_kwargs=model_kwargs(args),
                  out=args.out, in_process=args.in_process, on_progress=progress, fixes=args.fix,
                  **({"threads": args.threads} if args.threads is not None else {}))
    if args.json:
        print_json({**result.to_dict(), "path": str(result.path), "wrap_call": result.wrap_call()})
    else:
        print(result)
    if result.stopped:
        print(f"ortlab tune: interrupted {result.stop_text()} (kept in {result.path / FILE})", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


def register(sub) -> None:
    p = sub.add_parser("tune", help="search ORTModule's options for the fastest or smallest setting that trains "
                                    "the same model (the verdict guards every candidate)")
    add_model_args(p)
    p.add_argument("--goal", action="append", default=[], metavar="GOAL",
                   help="time, memory or both, or an Olive-style condition on time, memory or rss such as "
                        "'time: percent-min-improvement 5' or 'memory: percent-max-degradation 10' (repeatable; "
                        "default: time)")
    p.add_argument("--budget", type=positive_float, default=10.0, metavar="MINUTES",
                   help="minutes for the whole search, the baseline included")
    p.add_argument("--steps", type=positive_int, default=8, help="steps per measured burst")
    p.add_argument("--warmup", type=positive_int, default=3, help="steps left out of the median (step 0 exports)")
    p.add_argument("--repeats", type=positive_int, default=3, help="baseline bursts, whose spread is the noise")
    p.add_argument("--guard-steps", type=positive_int, default=3, help="steps of each verdict's parity burst")
    p.add_argument("--only", action="append", default=[], metavar="OPTION",
                   help="search only these options (or 'plans': the recompute plan files) (repeatable; default: "
                        "every option that can change speed or memory)")
    p.add_argument("--plans", type=positive_int, default=2, help="the largest recompute plans tried, each alone")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option every burst keeps (repeatable)")
    p.add_argument("--fix", default="none", metavar="auto|none|NAME[,NAME]",
                   help="ortlab's compatibility fixes for every ORTModule burst (see ortlab check)")
    add_threads_arg(p, "default on the CPU: 1, so that Tune's noise is the model's, not other processes'")
    add_out_arg(p)
    add_in_process_arg(p)
    add_json_arg(p)
    p.set_defaults(func=cmd_tune, needs_ortmodule=True)
