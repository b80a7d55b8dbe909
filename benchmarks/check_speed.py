"""How long `ortlab check` takes: GPT-2 small's shape (124M parameters, random weights, batch 2, sequence 128;
target under 30 s on a 2-core CPU, every blocker listed), each tiny family of ortlab.demo.families (target
under 10 s each) and a model holding 19 common torch.nn layers (ortlab.demo.layers:all_layers, ten blockers and
ten fixes; target under 20 s). Absolute times, measured in this process after imports (the worker's start is not
the check's).

    python benchmarks/check_speed.py                 # the transformers of this environment
    python benchmarks/check_speed.py layers          # the torch.nn layers' model only
    PYTHONPATH=$(python scripts/side_packages.py) python benchmarks/check_speed.py   # the newest one

`--device cuda` checks the models on the GPU (cuda when torch sees one); check exports through ORTModule, so it
needs onnxruntime-training (refused in one line without it).
"""

from __future__ import annotations

import argparse
import sys
import time

import _device
import torch
import transformers

from ortlab import Workload
from ortlab.compat.check import check
from ortlab.demo import families, layers

TARGET_GPT2_S, TARGET_FAMILY_S, TARGET_LAYERS_S = 30.0, 10.0, 20.0


def gpt2_small() -> Workload:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(use_cache=False))

    def batch(step):
        ids = torch.randint(0, 50257, (2, 128), generator=torch.Generator().manual_seed(step))
        return {"input_ids": ids, "labels": ids}, None

    return Workload(model, batch, lambda out, _: out.loss, name="GPT-2 small shape")


def timed(workload: Workload, device: str = "cpu") -> tuple[float, object]:
    workload.model.to(device)  # check runs where the model's parameters are
    started = time.perf_counter()
    report = check(workload)
    return time.perf_counter() - started, report


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", nargs="?", choices=("all", "layers"), default="all")
    _device.add_argument(parser)
    args = parser.parse_args(argv)
    device = _device.chosen(args, parser).type
    if _device.ortmodule_missing():
        parser.error(f"ortlab check exports through ORTModule: {_device.ortmodule_missing()}")
    transformers.logging.set_verbosity_error()
    timed(families.vit(), device)  # warm-up: ORT's import and first session
    rows = [("19 torch.nn layers", *timed(layers.all_layers(), device), TARGET_LAYERS_S)]
    if args.which != "layers":
        rows += [("GPT-2 small shape", *timed(gpt2_small(), device), TARGET_GPT2_S)]
        rows += [(name, *timed(getattr(families, name)(), device), TARGET_FAMILY_S) for name in families.FAMILIES]
    print(f"ortlab check, transformers {transformers.__version__}, torch {torch.__version__}, on "
          f"{_device.describe(device)}")
    print(f"{'model':<20} {'seconds':>8} {'target':>7}  blockers  verdict")
    missed = 0
    for name, seconds, report, target in rows:
        missed += seconds > target
        print(f"{name:<20} {seconds:8.1f} {target:7.0f}  {len(report.blockers):8d}  {report.verdict}"
              + ("  (SLOWER THAN THE TARGET)" if seconds > target else ""))
    print("all within their targets" if not missed else f"{missed} over their target")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
