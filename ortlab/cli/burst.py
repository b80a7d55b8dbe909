"""`ortlab burst`: train N steps on PyTorch and/or ORTModule and print a summary."""

from __future__ import annotations

import sys

from ortlab.cli.common import (
    CliError,
    add_float64_arg,
    add_in_process_arg,
    add_json_arg,
    add_model_args,
    add_out_arg,
    add_threads_arg,
    model_kwargs,
    non_negative_int,
    positive_float,
    positive_int,
    print_json,
    seed,
)
from ortlab.runs.run import ENDED_EARLY, RunStatus


def cmd_burst(args) -> int:
    from ortlab.engine.backends import BACKENDS, check_available, has
    from ortlab.engine.session import Session

    kwargs, options = burst_kwargs(args)  # bad flags first, then what cannot run here
    if args.backend in BACKENDS:
        check_available(args.backend)
        backends = (args.backend,)
    else:
        backends = chosen_backends(args.backend)
    with Session(args.model, model_kwargs(args), out=args.out, in_process=args.in_process,
                 float64=args.float64) as session:
        if len(backends) > 1:
            comparison = session.compare(args.steps, options, backends=backends, **kwargs)
            print_json(comparison.to_dict()) if args.json else print(comparison)
            if not args.json:  # PyTorch's own ranks: the comparison shows the others' verdicts
                print_distributed([r for r in comparison.runs if has(r.backend, "reference")])
            _time_hint(comparison.runs, kwargs)
            return outcome(comparison.runs, comparison, args.allow_fallback)
        run = session.burst(backends[0], args.steps, options, **kwargs)
        if args.json:
            verdict = distributed_verdict(run)
            print_json({**run.summary(), "path": str(run.path), "error": run.error,
                        **({"verdict": verdict.to_dict()} if verdict else {})})
        else:
            from ortlab.comparison.summary import run_text

            print(run_text(run))
            print_distributed([run])
        _time_hint([run], kwargs)
    return outcome([run], None, args.allow_fallback)


def distributed_verdict(run):
    """The verdict on a distributed parity run against one process of the same global batch (Session.burst wrote
    it to the run's folder), or None."""
    from ortlab.verdict.judge import FILE, Verdict
    from ortlab.verdict.sharded import AGAINST

    data = run.read_json(FILE)
    return Verdict.from_dict(data) if data and AGAINST in data.get("headline", "") else None


def print_distributed(runs) -> None:
    """Each distributed run's verdict against one process of the same global batch, where no comparison shows it."""
    for run in runs:
        verdict = distributed_verdict(run)
        if verdict is not None:
            print(f"{run.backend} ({run.path.name}): " + "\n  ".join(verdict.lines()))


def chosen_backends(value: str | None) -> tuple[str, ...]:
    """--backend(s) as a comparison's backends; where a default or "all" leaves out a backend that cannot run here
    (ORTModule on the current stack), one line on stderr says why and where it runs."""
    from ortlab.engine.backends import BACKENDS, parse_backends, unavailable

    backends = parse_backends(value)
    if value in (None, "all"):
        for name in BACKENDS:
            why = unavailable(name) if name not in backends else None
            if why:
                print(f"ortlab: {why}", file=sys.stderr)
    return backends


def _time_hint(runs, kwargs) -> None:
    """With --collect time: the command that shows where the time went (on stderr, with the other hints)."""
    if "time" in (kwargs.get("collect") or {}):
        print(f"where the time goes: ortlab time {' '.join(str(r.path) for r in runs)}", file=sys.stderr)


def burst_kwargs(args) -> tuple[dict, object]:
    """Session.burst's keywords and the options from `ortlab burst`'s (and `ortlab compare`'s) arguments."""
    from ortlab.engine.types import Precision
    from ortlab.options import Options

    options = Options.parse(args.option)
    collect = collect_settings(args)
    if args.save_graphs:
        options = options.replace(save_onnx=True)
    compile_settings = {"mode": args.compile_mode, "fullgraph": args.compile_fullgraph,
                        "backend": args.compile_backend, "memory_budget": args.compile_memory_budget,
                        "dynamic": {"auto": None, "true": True, "false": False}[args.compile_dynamic]}
    return dict(optimizer=args.optimizer, lr=args.lr, seed=args.seed, precision=Precision(args.precision),
                device=args.device,
                parity=args.parity, progress=not args.json and sys.stderr.isatty(), collect=collect,
                nproc=args.nproc, nnodes=args.nnodes, node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint,
                save_checkpoint=args.save_checkpoint, sampler=args.sampler, fixes=args.fix,
                strategy=args.strategy, reshard_after_forward=args.reshard_after_forward,
                sync_batchnorm=args.sync_batchnorm,
                compile=compile_settings, evidence=args.evidence, threads=args.threads), options


def outcome(runs, comparison, allow_fallback: bool) -> int:
    """The exit code, after each failure's error and hint on stderr: 130 interrupted; 1 a run that failed, fell
    back (unless allowed) or a verdict that diverged; else 0."""
    for run in runs:
        for key in ("error", "hint"):
            if run.meta.get(key) and run.status != RunStatus.OK:
                print(f"ortlab burst: {run.backend}: {run.meta[key]}", file=sys.stderr)
    if any(r.status in ENDED_EARLY for r in runs):
        return 130
    verdicts = [v for v in (comparison.verdict_of(b) for b in comparison.others) if v is not None] \
        if comparison is not None else []
    verdicts += [v for r in runs if (v := distributed_verdict(r)) is not None and v not in verdicts]
    diverged = [v for v in verdicts if v.diverged or _unjudged(v, runs)]
    for verdict in diverged:
        print(f"ortlab burst: {verdict.headline}", file=sys.stderr)
    accepted = (RunStatus.OK, RunStatus.FALLBACK) if allow_fallback else (RunStatus.OK,)
    return 1 if diverged or not all(r.status in accepted for r in runs) else 0


def _unjudged(verdict, runs) -> bool:
    """A verdict not judged although every run ended ok: its evidence could not be gathered (out of memory, a
    worker that died), which is never an agreement."""
    from ortlab.verdict.judge import NOT_JUDGED

    return verdict.status == NOT_JUDGED and all(r.status == RunStatus.OK for r in runs)


def collect_settings(args) -> dict[str, dict]:
    """`--collect stats --stats-modules 'blocks.*' --stats-samples 4` -> Session.burst's collect= argument."""
    collect = {name: {} for name in args.collect}
    if args.memory:
        collect["memory"] = {}
    if "stats" in collect:
        if args.stats_modules:
            collect["stats"]["modules"] = list(args.stats_modules)
        if args.stats_samples is not None:
            collect["stats"]["samples"] = args.stats_samples
        if args.stats_no_grads:
            collect["stats"]["grads"] = False
    elif args.stats_modules or args.stats_samples is not None or args.stats_no_grads:
        raise CliError("--stats-modules, --stats-samples and --stats-no-grads need --collect stats")
    if args.time_steps:
        if "time" not in collect:
            raise CliError("--time-steps needs --collect time")
        collect["time"]["steps"] = list(args.time_steps)
    return collect


def register(sub) -> None:
    b = sub.add_parser("burst", help="train N steps on PyTorch, ORTModule and/or torch.compile and print a summary",
                       description="Train N steps of the model on each backend asked for, from one snapshot, and "
                       "print a summary: one column per backend, and a verdict on each backend against PyTorch. "
                       "Exit 1 when a run failed, fell back to PyTorch or diverged.")
    b.add_argument("--backend", default=None, type=backend_list, metavar="BACKEND[,BACKEND]",
                   help="pytorch, ortmodule, compile (torch.compile), both (= pytorch,ortmodule), all (every backend "
                   "that runs here), or a comma list: several are compared with PyTorch, each judged against it "
                   "(default: pytorch,ortmodule on the ort stack, pytorch,compile on the current stack, where "
                   "ORTModule does not run; in Python, ortlab.burst() runs one backend, ortmodule unless told)")
    b.add_argument("--parity", action="store_true", help="same seeds, dropout 0, compute optimizer off, deterministic")
    add_burst_args(b)
    b.set_defaults(func=cmd_burst)


def _strategy_spec(text: str) -> str:
    """--strategy of `ortlab compare` (ortlab.engine.config.strategy_spec), its refusal argparse's one line."""
    import argparse

    from ortlab.engine.config import BurstError, strategy_spec

    try:
        return strategy_spec(text)
    except BurstError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_burst_args(b, per_backend: bool = False) -> None:
    """The arguments `ortlab burst` and `ortlab compare` share: the model, the steps and how they train
    (`per_backend`: `ortlab compare`'s --strategy may name each backend's)."""
    import argparse

    from ortlab.compat.registry import FIXES
    from ortlab.engine.collectors import COLLECTORS
    from ortlab.engine.types import Device, Evidence, Optimizer, Precision, Sampler, Strategy

    add_model_args(b)
    b.add_argument("--steps", type=positive_int, default=20, help="training steps per backend")
    b.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="ORTModule option, e.g. memory_opt_level=1 or ORTMODULE_LOG_LEVEL=INFO (repeatable)")
    b.add_argument("--fix", default="none", metavar="auto|none|NAME[,NAME]",
                   help="ortlab's compatibility fixes for the ORTModule burst: auto = the ones `ortlab check` "
                   f"recommends for this model, or names ({', '.join(FIXES)}); the PyTorch burst runs the model "
                   "as written")
    b.add_argument("--allow-fallback", action="store_true",
                   help="exit 0 even when ORTModule fell back to PyTorch (the run's status stays 'fallback')")
    add_compile_args(b)
    b.add_argument("--optimizer", default="auto", choices=[str(o) for o in Optimizer],
                   help="zero1: AdamW with its state sharded over the ranks (ZeRO stage 1, with --nproc > 1); "
                   "fused_adam needs CUDA")
    b.add_argument("--lr", type=positive_float, default=1e-3, help="learning rate")
    b.add_argument("--seed", type=seed, default=0,
                   help="seeds the burst's random numbers: dropout, a sampler's shuffle (the model starts from "
                   "the session's snapshot)")
    b.add_argument("--precision", default="fp32", choices=[str(p) for p in Precision],
                   help="fp16: torch.autocast float16 and a GradScaler (CUDA only); bf16: torch.autocast bfloat16, "
                        "no GradScaler (the CPU and CUDA; ORTModule: CUDA only)")
    b.add_argument("--device", default="auto", choices=[str(d) for d in Device],
                   help="auto: CUDA when there is a GPU, else the CPU")
    add_threads_arg(b, "default: torch's threads, fitted to the cores")
    b.add_argument("--save-graphs", action="store_true",
                   help="save ORTModule's exported graphs into the run (the option save_onnx=true)")
    b.add_argument("--memory", action=argparse.BooleanOptionalAction, default=True,
                   help="account activation memory per backend (memory.json; ORTModule bursts then save their "
                   "graphs): what autograd saves for backward, and ORT's execution graph step by step")
    b.add_argument("--collect", action="append", default=[], choices=sorted(COLLECTORS),
                   help="record per-burst data: stats = activation statistics (for ortlab diff), plans = "
                   "the memory optimizer's recompute plans, memory = the activation-memory account (on by "
                   "default: --memory), time = where a step's time goes (profiled steps: time.json, trace.json; "
                   "ortlab time RUN...) (repeatable)")
    b.add_argument("--time-steps", type=positive_int, nargs="+", metavar="STEP",
                   help="with --collect time: the steps to profile (default: 2 3 4; step 0 exports)")
    b.add_argument("--stats-modules", action="append", metavar="GLOB",
                   help="with --collect stats: only modules whose name matches (repeatable; default: all)")
    b.add_argument("--stats-samples", type=non_negative_int, metavar="N",
                   help="with --collect stats: values sampled per tensor (default: 8)")
    b.add_argument("--stats-no-grads", action="store_true", help="with --collect stats: no gradient statistics")
    d = b.add_argument_group("several processes and machines (ranks started by torch's elastic launcher)")
    d.add_argument("--nproc", type=positive_int, default=1, help="ranks on this machine (1: one process)")
    strategies = "how the ranks share the model: single (one process), ddp (DistributedDataParallel), zero1 " \
        "(DDP with AdamW's state sharded: the same as --optimizer zero1), fsdp2 (fully_shard per block; not " \
        "ORTModule) (default: single for one process, ddp for several); a parity burst of several ranks is judged " \
        "against one process of the same global batch"
    if per_backend:
        d.add_argument("--strategy", type=_strategy_spec, metavar="STRATEGY|BACKEND=STRATEGY[,...]",
                       help=f"{strategies}; one for every backend, or each backend's: ortmodule=ddp,compile=fsdp2 "
                       "(a bare one is the others': fsdp2,ortmodule=ddp)")
    else:
        d.add_argument("--strategy", choices=[str(s) for s in Strategy], help=strategies)
    d.add_argument("--reshard-after-forward", action=argparse.BooleanOptionalAction, default=True,
                   help="fsdp2: free each block's gathered parameters after its forward (gathered again for backward)")
    d.add_argument("--sync-batchnorm", action="store_true",
                   help="BatchNorm normalizes over every rank's samples (SyncBatchNorm), as one process of the "
                   "global batch does")
    d.add_argument("--nnodes", type=positive_int, default=1, help="machines in the job (start the same command "
                   "on each, with its --node-rank)")
    d.add_argument("--node-rank", type=non_negative_int, default=0, help="this machine's index, 0 to nnodes - 1")
    d.add_argument("--rdzv-endpoint", metavar="HOST:PORT",
                   help="where the machines meet: node 0's address and a free port (needed with --nnodes > 1)")
    d.add_argument("--save-checkpoint", action="store_true",
                   help="write the full fp32 weights at the end (checkpoint.pt; ZeRO-1 shards gathered); loads "
                   "as Session(snapshot=PATH)")
    d.add_argument("--sampler", choices=[str(s) for s in Sampler],
                   help="how the ranks share a workload's dataset (e.g. --model-arg "
                   "variable_length=true): torch's DistributedSampler or ORT's load-balancing sampler, which gives "
                   "every rank samples of similar complexity each step (default: the dataset in order)")
    b.add_argument("--evidence", default="summary", choices=[str(e) for e in Evidence],
                   help="what a parity burst keeps of its first step's gradients for `ortlab judge`: summary (a "
                   "fixed size a parameter: tens of MB a run at any size) or full (every gradient too: 4 bytes a "
                   "parameter)")
    add_float64_arg(b)
    add_out_arg(b)
    add_in_process_arg(b)
    add_json_arg(b)


def backend_list(text: str) -> str:
    """--backend(s)'s value, checked by the one reader of BACKEND[@STACK] (ortlab.engine.backends.named_backends):
    one backend, both, all, or a comma list of backends, each optionally on a stack."""
    import argparse

    from ortlab.engine.backends import named_backends
    from ortlab.errors import InputError

    try:
        named_backends(text)
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def add_compile_args(p) -> None:
    from ortlab.engine.backends.compiled import SETTINGS

    c = p.add_argument_group("torch.compile (the compile backend)")
    c.add_argument("--compile-mode", default=SETTINGS["mode"][0], choices=SETTINGS["mode"],
                   help="torch.compile's mode")
    c.add_argument("--compile-backend", default=SETTINGS["backend"][0], choices=SETTINGS["backend"],
                   help="inductor generates code; aot_eager and eager help debug a divergence")
    c.add_argument("--compile-dynamic", default="auto", choices=("auto", "true", "false"),
                   help="dynamic shapes (auto: torch decides, dynamic after a shape changes)")
    c.add_argument("--compile-fullgraph", action="store_true",
                   help="a graph break fails the burst, with its reason and line")
    c.add_argument("--compile-memory-budget", type=memory_budget, default=None, metavar="FRACTION",
                   help="torch._functorch.config.activation_memory_budget while the model compiles: the share of "
                   "activations kept for backward, in (0, 1]; the partitioner recomputes the rest (the equivalent "
                   "of ORTModule's memory_opt_level; default: torch's, 1.0)")


def memory_budget(text: str) -> float:
    """--compile-memory-budget's value: a number, which the compiled backend's rule (the one BurstConfig applies)
    takes or refuses."""
    import argparse

    from ortlab.engine.backends.compiled import memory_budget as checked
    from ortlab.engine.types import BurstError

    try:
        value = checked(float(text))
    except (ValueError, BurstError):  # not a number, or outside the rule
        value = None
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number in (0, 1] (the share of activations kept for "
                                         "backward)")
    return value
