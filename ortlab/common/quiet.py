"""Third-party warnings that say nothing about the user's run, silenced by their exact message, so that what ortlab
prints (a summary, a run's log.txt, the Lab's Log tab, a notebook cell) shows only what matters. Each is printed on
every burst and no user action removes it. Warnings about the user's model (the exporter's TracerWarnings, which the
verdict reads as hazards) are never in this list. pyproject.toml's pytest filterwarnings carry the same entries
(tests/test_packaging.py checks it)."""

from __future__ import annotations

import warnings

# (category, the start of the message as a regex without ':' (pytest's filter syntax splits on it), the module it
# is attributed to ("": any), why it says nothing about the run)
QUIET = (
    ("UserWarning", "WARNING. failed to get cudart_version from onnxruntime build info", "",
     "onnxruntime's import on a CPU-only machine: its CUDA build info is not there"),
    ("UserWarning", "DeepSpeed import error", "",
     "onnxruntime-training's ZeRO offload hooks look for DeepSpeed, which ortlab does not use"),
    ("FutureWarning", "Setting `training` to something other than default is deprecated", "",
     "ORTModule's own call of torch.onnx.export (training=TRAINING), not the user's"),
    ("DeprecationWarning", "'[a-zA-Z]+' (argument is )?deprecated", "(matplotlib|pyparsing)",
     "matplotlib 3.9's own calls of pyparsing's renamed methods and arguments, on its first figure and first math "
     "text (14 in the summary of a few of the suite's files)"),
)


def install() -> None:
    """Add the filters (once per process: ortlab's import does it; warnings.filterwarnings drops duplicates)."""
    import builtins

    for category, message, module, _why in QUIET:
        warnings.filterwarnings("ignore", message=message, category=getattr(builtins, category), module=module)
