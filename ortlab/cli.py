"""`ortlab doctor | setup | options | burst | runs`: the Python API from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence


def _json(data) -> None:
    print(json.dumps(data, indent=2, default=str))


def cmd_doctor(args) -> int:
    from ortlab.environment import doctor

    report = doctor()
    _json(report.to_dict()) if args.json else print(report)
    return 0 if report.ok else 1


def cmd_setup(args) -> int:
    from ortlab.environment import SetupError, setup

    try:
        setup(force=args.force)
    except SetupError as e:
        print(f"ortlab setup: {e}", file=sys.stderr)
        return 1
    return 0


def cmd_options(args) -> int:
    from ortlab.options import REGISTRY

    specs = [s for s in REGISTRY if not args.area or args.area.lower() in s.area.lower()]
    if args.markdown:
        from ortlab.options import registry_markdown

        print(registry_markdown(), end="")
        return 0
    if args.json:
        _json([s.to_dict() for s in specs])
        return 0
    labels = {s.name: s.env or f"{s.name} (DebugOptions)" for s in specs}
    width = max(map(len, labels.values()))
    area = None
    for s in specs:
        if s.area != area:
            area = s.area
            print(f"\n{area}")
        flags = [s.read_at.value]
        if s.needs_cuda:
            flags.append("CUDA")
        if s.changes_graph:
            flags.append("graph")
        print(f"  {labels[s.name]:<{width}}  default {s.default!r:<10} [{', '.join(flags)}]  {s.description}")
    print("\nread at: import = new worker, construction/export = new wrap; graph = changes the exported graph")
    return 0


def cmd_burst(args) -> int:
    from ortlab.burst import BurstError
    from ortlab.options import Options
    from ortlab.worker import Session, WorkerError
    from ortlab.workload import WorkloadError

    options = Options.parse(args.option)
    model_kwargs = dict(_parse_model_arg(a) for a in args.model_arg)
    kwargs = dict(optimizer=args.optimizer, lr=args.lr, seed=args.seed, precision=args.precision,
                  device=args.device, parity=args.parity, progress=not args.json and sys.stderr.isatty())
    with Session(args.model, model_kwargs, out=args.out, in_process=args.in_process) as session:
        try:
            if args.backend == "both":
                comparison = session.compare(args.steps, options, **kwargs)
                _json(comparison.to_dict()) if args.json else print(comparison)
                runs = [comparison.pytorch, comparison.ortmodule]
            else:
                run = session.burst(args.backend, args.steps, options, **kwargs)
                _json({**run.summary(), "path": str(run.path), "error": run.error}) if args.json else print(
                    _single(run))
                runs = [run]
        except (BurstError, WorkloadError, WorkerError) as e:
            print(f"ortlab burst: {e}", file=sys.stderr)
            return 2
    return 0 if all(r.status in ("ok", "interrupted") for r in runs) else 1


def _single(run) -> str:
    s = run.summary()
    lines = [f"{k:<14} {v}" for k, v in s.items()]
    if run.error:
        lines.append(f"error          {run.error}")
    lines.append(f"path           {run.path}")
    return "\n".join(lines)


def _parse_model_arg(text: str):
    from ortlab.options import OptionError

    if "=" not in text:
        raise OptionError(f"--model-arg {text!r} is not KEY=VALUE (for example n_layer=4)")
    key, value = text.split("=", 1)
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def cmd_runs(args) -> int:
    from ortlab.run import list_runs

    df = list_runs(args.folder)
    if args.json:
        _json(df.to_dict(orient="records"))
    elif len(df):
        print(df.drop(columns=["path"]).to_string(index=False))
    else:
        print(f"no runs in {args.folder}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ortlab", description="Explore ONNX Runtime's ORTModule: options, bursts, runs.")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("doctor", help="versions, CUDA, extensions; each problem with its fix")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_doctor)

    s = sub.add_parser("setup", help="build ORTModule's torch C++ extensions (CPU always, CUDA with a GPU)")
    s.add_argument("--force", action="store_true", help="rebuild even if built")
    s.set_defaults(func=cmd_setup)

    o = sub.add_parser("options", help="every ORTModule option: variable, default, when ORT reads it")
    o.add_argument("--json", action="store_true")
    o.add_argument("--area", help="only options whose feature area contains this text")
    o.add_argument("--markdown", action="store_true", help="the reference page docs/options.md")
    o.set_defaults(func=cmd_options)

    b = sub.add_parser("burst", help="train N steps on PyTorch and/or ORTModule and print a summary")
    b.add_argument("--model", default=None, help="factory: module:callable or file.py:callable (default: the demo)")
    b.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE", help="keyword for the factory")
    b.add_argument("--backend", choices=("pytorch", "ortmodule", "both"), default="both")
    b.add_argument("--steps", type=int, default=20)
    b.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="ORTModule option, e.g. memory_opt_level=1 or ORTMODULE_LOG_LEVEL=INFO (repeatable)")
    b.add_argument("--parity", action="store_true", help="same seeds, dropout 0, compute optimizer off, deterministic")
    b.add_argument("--optimizer", default="adamw", choices=("adamw", "sgd", "fused_adam", "fp16_optimizer"))
    b.add_argument("--lr", type=float, default=1e-3)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--precision", default="fp32", choices=("fp32", "fp16"))
    b.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    b.add_argument("--out", default="runs", help="folder for run folders (default ./runs)")
    b.add_argument("--in-process", action="store_true", help="no worker process (see docs: can hang Jupyter)")
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=cmd_burst)

    # views added by their own modules (each registers its subcommands)
    import importlib

    for module in ("ortlab.graphs", "ortlab.recompute", "ortlab.activations"):
        try:
            register = importlib.import_module(module).register_cli
        except (ImportError, AttributeError):
            continue
        register(sub)

    r = sub.add_parser("runs", help="list the runs in a folder")
    r.add_argument("folder", nargs="?", default="runs")
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cmd_runs)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from ortlab.burst import BurstError
    from ortlab.options import OptionError
    from ortlab.worker import WorkerError
    from ortlab.workload import WorkloadError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (OptionError, BurstError, WorkloadError, WorkerError) as e:
        print(f"ortlab {args.command}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ortlab: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `ortlab options | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
