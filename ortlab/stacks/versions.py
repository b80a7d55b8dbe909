"""The versions of the libraries that shape what ORTModule exports (recorded in every run and check), and the
transformers releases ortlab's model families are tested with (docs/compatibility.md)."""

from __future__ import annotations

import functools
import importlib.metadata as md
import platform

# The lock's transformers, and the newest release that installs beside torch 2.6 (tests: tests/test_families.py).
TESTED_TRANSFORMERS = ("4.51.3", "5.23.0")
# What changes the exported graph or the model's code: a run records each one that is installed.
EXPORT_LIBRARIES = ("torch", "onnxruntime-training", "onnx", "transformers", "torchvision", "numpy", "ortlab")


@functools.cache
def versions() -> dict[str, str]:
    """Python and every installed library of EXPORT_LIBRARIES (torch as torch reports itself, build tag kept)."""
    import torch

    out = {"python": platform.python_version()}
    for dist in EXPORT_LIBRARIES:
        try:
            out[dist] = torch.__version__ if dist == "torch" else md.version(dist)
        except md.PackageNotFoundError:
            continue
    return out


def transformers_note(installed: str | None) -> str | None:
    """A sentence when the installed transformers is not one ortlab's families are tested with."""
    if installed is None or installed in TESTED_TRANSFORMERS:
        return None
    return (f"transformers {installed} is not one of the versions ortlab's model families are tested with "
            f"({', '.join(TESTED_TRANSFORMERS)}): run `ortlab check` on your model")
