"""What the subcommands share: the model arguments, output folder, JSON output, checked number types."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from typing import Any

from ortlab.errors import InputError


class CliError(InputError):
    """Bad command-line input found after parsing (the message names the flag)."""


def _plain(data: Any) -> Any:
    """JSON has no NaN or infinity: they become null."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _plain(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_plain(v) for v in data]
    return data


def print_json(data: Any) -> None:
    print(json.dumps(_plain(data), indent=2, default=str, allow_nan=False))


def print_result(args: argparse.Namespace, data: Callable[[], Any], text: Callable[[], str]) -> int:
    """A view's result as JSON with --json, else as its text report; exit 0."""
    if args.json:
        print_json(data())
    else:
        print(text())
    return 0


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="factory: module:callable or file.py:callable (default: the demo)")
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="keyword for the factory, value read as JSON when it parses (repeatable)")


def model_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    out = {}
    for text in args.model_arg:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise CliError(f"--model-arg {text!r} is not KEY=VALUE (for example n_layer=4)")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def add_out_arg(p: argparse.ArgumentParser, default: str = "runs",
                help: str = "folder for run folders") -> None:
    p.add_argument("--out", default=default, help=help)


def add_in_process_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--in-process", action="store_true", help="no worker process (see docs: can hang Jupyter)")


def add_json_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _number(kind, text: str, test, allowed: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {allowed}") from None
    if not test(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not {allowed}")
    return value


def positive_int(text: str) -> int:
    return _number(int, text, lambda v: v >= 1, "a whole number >= 1")


def non_negative_int(text: str) -> int:
    return _number(int, text, lambda v: v >= 0, "a whole number >= 0")


def positive_float(text: str) -> float:
    return _number(float, text, lambda v: math.isfinite(v) and v > 0, "a finite number > 0")


def seed(text: str) -> int:
    return _number(int, text, lambda v: 0 <= v <= 2**32 - 1, "a whole number from 0 to 4294967295")


def add_float64_arg(p) -> None:
    """--float64: whether the verdict runs its float64 burst (ortlab.verdict.cost)."""
    from ortlab.engine.types import Float64

    p.add_argument("--float64", default="auto", choices=[str(f) for f in Float64],
                   help="the verdict's float64 burst, which judges the losses and end state against float64 and "
                   "costs about 40 bytes a parameter with AdamW: auto runs it where its estimated need is at most 2 "
                   "GB and fits the free memory (else the losses and end state are judged against fp32's spread, "
                   "said in the verdict), burst always, first-step never (the first step's gradients are judged "
                   "against float64 block by block either way)")


def add_threads_arg(p, default: str) -> None:
    """--threads: the CPU threads each step runs on (BurstConfig.threads)."""
    p.add_argument("--threads", type=positive_int, default=None, metavar="N",
                   help="the CPU threads each step runs on (torch's intra-op threads; with 1, ORTModule's session "
                   "runs on one thread too): 1 times each step by its thread's CPU time, which other processes on a "
                   f"shared machine do not count ({default}; ignored on CUDA)")
