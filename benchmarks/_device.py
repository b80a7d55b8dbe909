"""The device a benchmark measures on (`--device`: cuda when torch sees a GPU, else cpu), named with its card in
the ratio line it prints, and what timing on it needs: batches moved to it, the GPU waited for around a timing
(its kernels run behind the host)."""

from __future__ import annotations

import argparse
import os
import platform
from typing import Any

import torch


def add_argument(parser: argparse.ArgumentParser) -> None:
    default = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--device", choices=("cpu", "cuda"), default=default,
                        help=f"where to measure (default here: {default}: cuda when torch sees a GPU)")


def chosen(args: argparse.Namespace, parser: argparse.ArgumentParser) -> torch.device:
    """The device asked for; cuda without a GPU is refused in one line (exit 2)."""
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA GPU here (torch.cuda.is_available() is False); use --device "
                     "cpu")
    return torch.device(args.device)


def describe(device: torch.device | str) -> str:
    """"cuda (NVIDIA H100 80GB HBM3, torch 2.11.0+cu130, CUDA 13.0)" or "cpu (AMD EPYC ..., 2 threads)"."""
    device = torch.device(device)
    if device.type == "cuda":
        return (f"cuda ({torch.cuda.get_device_name(device)}, torch {torch.__version__}, CUDA "
                f"{torch.version.cuda})")
    return f"cpu ({_cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__})"


def sync(device: torch.device | str) -> None:
    """Wait for the device's queued work (a timing on CUDA must include the kernels it launched)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def to(batch: Any, device: torch.device | str) -> Any:
    """A batch (tensors in tuples, lists, dicts) on the device."""
    from ortlab.workload import to_device

    return to_device(batch, torch.device(device))


def ortmodule_missing() -> str | None:
    """Why ORTModule cannot run here (onnxruntime-training is not installed), or None."""
    import importlib.util

    try:
        found = importlib.util.find_spec("onnxruntime.training") is not None
    except (ImportError, ValueError):
        found = False
    return None if found else "onnxruntime-training is not installed here"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or f"{os.cpu_count()} cores"
