"""`ortlab memory RUN`: the activation-memory account of a run's execution graph: the peak, where and in which
phase, the largest tensors alive then, parameters and gradients apart, what is uncertain; text or JSON."""

from __future__ import annotations

from ortlab.cli.common import CliError, add_json_arg, positive_int, print_result


def _pairs(items: list[str], flag: str, parse) -> dict:
    out = {}
    for text in items:
        key, sep, value = text.partition("=")
        try:
            if not sep or not key.strip():
                raise ValueError
            out[key.strip()] = parse(value.strip())
        except ValueError:
            example = "idx_dim0=8" if flag == "--dim" else "input_ids=2x128"
            raise CliError(f"{flag} {text!r} is not {'SYMBOL=VALUE' if flag == '--dim' else 'NAME=SHAPE'} "
                           f"(for example {example})") from None
    return out


def _dim(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError
    return value


def _shape(text: str) -> tuple[int, ...]:
    return tuple(_dim(part) for part in text.lower().replace(",", "x").split("x")) if text else ()


def cmd_memory(args) -> int:
    """Bad input (no execution model, a symbol without value, a malformed flag) raises an InputError: the CLI
    prints one line and exits 2."""
    from ortlab.account import memory

    dims = _pairs(args.dim, "--dim", _dim) or None
    shapes = _pairs(args.input_shape, "--input-shape", _shape) or None
    account = memory(args.run, dims=dims, input_shapes=shapes, order=args.order, prefix=args.prefix)
    def data():
        out = account.to_dict(timeline=args.timeline)
        out["top_tensors"] = out["top_tensors"][: args.top]
        return out

    return print_result(args, data, lambda: account.report(args.top))


def register(sub) -> None:
    from ortlab.account.build import ORDER_CHOICES

    description = ("The activation-memory account of an ORTModule training graph (a burst run with "
                   "save_onnx): peak live activation bytes, the step and phase where it peaks, the largest "
                   "tensors alive then and their PyTorch modules; parameters, gradients and optimizer state "
                   "apart; uncertain sizes named.")
    p = sub.add_parser("memory", help="activation memory from a run's execution graph: peak, where, tensors",
                       description=description)
    p.add_argument("run", metavar="RUN",
                   help="a run folder, a folder of ORTModule stage files, or an execution model .onnx")
    add_json_arg(p)
    p.add_argument("--dim", action="append", default=[], metavar="SYMBOL=VALUE",
                   help="value of a symbolic dimension of the graph inputs, e.g. idx_dim0=8; the run's "
                        "recorded shapes give the symbols not named (repeatable)")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=SHAPE",
                   help="shape of a graph input, e.g. input_ids=2x128; the run's recorded shapes give the "
                        "others (repeatable)")
    p.add_argument("--order", choices=ORDER_CHOICES, default="auto",
                   help="execution order to walk (auto: the one ORT used)")
    p.add_argument("--prefix", help="which export, when the folder holds several")
    p.add_argument("--top", type=positive_int, default=10, help="largest tensors to list")
    p.add_argument("--timeline", action="store_true", help="with --json: include the per-step timeline")
    p.set_defaults(func=cmd_memory)
