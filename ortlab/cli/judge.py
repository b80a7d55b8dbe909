"""`ortlab judge RUN RUN [--reference RUN]`: the verdict on two run folders made by separate processes, stacks or
machines (ortlab.verdict.folders), as `ortlab compare` gives it in one process."""

from __future__ import annotations

from ortlab.cli.common import add_float64_arg, add_json_arg, print_json


def cmd_judge(args) -> int:
    from ortlab.verdict.folders import judge_runs
    from ortlab.verdict.judge import AGREE

    judged = judge_runs(args.first, args.second, args.reference, args.out, args.float64)
    if args.json:
        print_json([j.to_dict() for j in judged])
    else:
        print("\n".join(str(j) for j in judged))
    return 0 if all(j.verdict.status == AGREE for j in judged) else 1


def register(sub) -> None:
    j = sub.add_parser("judge", help="the verdict on two run folders made anywhere (another process, stack or "
                       "machine), as compare gives it in one process",
                       description="Judge an ORTModule or torch.compile run against a PyTorch run of the same start, "
                       "both parity bursts made by any process on any stack (each records its snapshot's and "
                       "batches' hashes and its first step's gradients): first-step gradients, losses and end state, "
                       "each against float64 computed here from the recorded snapshot and batches. Neither run "
                       "PyTorch's: each is judged against --reference. Refused in one line (exit 2) when the runs "
                       "did not start from the same snapshot, batches or settings. Exit 0 when every verdict "
                       "agrees, 1 when one diverged or could not be judged.")
    j.add_argument("first", metavar="RUN", help="a run folder: PyTorch's, ORTModule's or torch.compile's")
    j.add_argument("second", metavar="RUN", help="the other run folder (one of the two PyTorch's, or use --reference)")
    j.add_argument("--reference", metavar="RUN", default=None,
                   help="a PyTorch parity run of the same start, when neither RUN is PyTorch's (e.g. ORTModule "
                   "against torch.compile)")
    j.add_argument("--out", default=None, help="folder for the bursts a verdict may need (a noise pair, the "
                   "statistics that localize a divergence) (default: beside the judged run)")
    add_float64_arg(j)
    add_json_arg(j)
    j.set_defaults(func=cmd_judge)
