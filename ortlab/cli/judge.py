"""`ortlab judge RUN RUN [--reference RUN]`: the verdict on two run folders made by separate processes, stacks or
machines (ortlab.verdict.folders), as `ortlab compare` gives it in one process; `ortlab judge RUN`: a distributed
run's folder against one process of the same global batch (ortlab.verdict.sharded); `ortlab judge LOG LOG`: two
DebugMode logs (or torchtitan numerics dumps) op by op (ortlab.verdict.debug_logs)."""

from __future__ import annotations

import sys

from ortlab.cli.common import add_float64_arg, add_json_arg, print_json


def cmd_judge(args) -> int:
    from pathlib import Path

    from ortlab.verdict.folders import judge_runs
    from ortlab.verdict.judge import AGREE

    if args.second is None:  # one distributed run's folder, against one process of the same global batch
        from ortlab.verdict.folders import judge_folder

        verdict = judge_folder(args.first, args.float64)
        print_json(verdict.to_dict()) if args.json else print(f"{args.first}:\n  " + "\n  ".join(verdict.lines()))
        return 0 if verdict.status == AGREE else 1
    if Path(args.first).is_file() or Path(args.second).is_file():  # two DebugMode logs
        return _judge_logs(args)
    if args.float64_log is not None:
        print("ortlab judge: --float64-log judges two DebugMode logs, not run folders", file=sys.stderr)
        return 2
    judged = judge_runs(args.first, args.second, args.reference, args.out, args.float64)
    if args.json:
        print_json([j.to_dict() for j in judged])
    else:
        print("\n".join(str(j) for j in judged))
    return 0 if all(j.verdict.status == AGREE for j in judged) else 1


def _judge_logs(args) -> int:
    """Two DebugMode logs (and a float64 one) op by op: the table, exit 1 where an op differs beyond rounding."""
    from ortlab.verdict.debug_logs import compare
    from ortlab.verdict.ops import AGREES, NOT_JUDGED, lines

    table = compare(args.first, args.second, args.float64_log)
    if args.json:
        print_json(table)
    else:
        differs = [o for o in table["ops"] if o["status"] not in (AGREES, NOT_JUDGED)]
        print("\n".join(lines(table)))
        print(f"first op that differs beyond rounding: {table['first']}" if table["first"] else
              "the logs differ from an input no logged op made" if differs else
              "every op agrees within rounding")
    return 0 if all(o["status"] in (AGREES, NOT_JUDGED) for o in table["ops"]) else 1


def register(sub) -> None:
    j = sub.add_parser("judge", help="the verdict on two run folders made anywhere (another process, stack or "
                       "machine), as compare gives it in one process",
                       description="Judge an ORTModule or torch.compile run against a PyTorch run of the same start, "
                       "both parity bursts made by any process on any stack (each records its snapshot's and "
                       "batches' hashes and its first step's gradients): first-step gradients, losses and end state, "
                       "each against float64 computed here from the recorded snapshot and batches. Neither run "
                       "PyTorch's: each is judged against --reference. Refused in one line (exit 2) when the runs "
                       "did not start from the same snapshot, batches or settings. Exit 0 when every verdict "
                       "agrees, 1 when one diverged or could not be judged. Given one distributed parity run's "
                       "folder: its ranks judged against one process of the same global batch (docs/distributed.md). "
                       "Given two DebugMode logs instead "
                       "(torch's DebugMode.save_logs after DebugMode.log_tensor_hashes, from any two processes; or "
                       "two numerics dumps of torchtitan, numerics/rank_N_activations.log): "
                       "the ops in order, each output's norm judged against its dtype's rounding (or against "
                       "--float64-log), the first op that differs while its inputs agree marked, the ops after it "
                       "that inherited it; exit 1 when an op differs.")
    j.add_argument("first", metavar="RUN", help="a run folder: PyTorch's, ORTModule's or torch.compile's; or a "
                   "DebugMode log (.json)")
    j.add_argument("second", metavar="RUN", nargs="?", default=None,
                   help="the other run folder (one of the two PyTorch's, or use --reference); or the other "
                   "DebugMode log; none: RUN is a distributed parity run, judged against one process of the same "
                   "global batch")
    j.add_argument("--float64-log", metavar="LOG", default=None,
                   help="with two DebugMode logs: a log of the same job in float64, the yardstick (the second "
                   "log's distance to it against the first's)")
    j.add_argument("--reference", metavar="RUN", default=None,
                   help="a PyTorch parity run of the same start, when neither RUN is PyTorch's (e.g. ORTModule "
                   "against torch.compile)")
    j.add_argument("--out", default=None, help="folder for the bursts a verdict may need (a noise pair, the "
                   "statistics that localize a divergence) (default: beside the judged run)")
    add_float64_arg(j)
    add_json_arg(j)
    j.set_defaults(func=cmd_judge)
