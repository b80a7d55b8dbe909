"""What `ortlab.hf.RecordCallback` (no collectors) adds to a real `Trainer.train()`: a 20-step run of a small random
Llama (4 layers, d=64, batch 4, sequence 64, logging every step) with the callback against the same run without
it, in paired rounds (benchmarks/_paired.py: back to back, alternating which goes first); a round runs each side
`--repeats` times, interleaved, and its figure is each side's shortest wall time of `trainer.train()` (the Trainer
is built outside it; other jobs on a shared machine only ever add time). Each side gets a fresh model from the
same seed. The callback's whole cost is in it: the run folder and meta.json at the start, a metrics line
per step, final_state.json at the end. Target: ratio <= 1.05.

A second figure that a loaded machine moves less: the time spent inside the callback's hooks (timed in the runs
with it) over those runs' wall time, the median over the rounds.

On `--device` (cuda when torch sees a GPU) the Trainer trains there (use_cpu off), both sides alike.

    python benchmarks/callback_overhead.py [--steps 20] [--rounds 7] [--repeats 3] [--threads N] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import _device
import torch
from _paired import paired, verdict

import ortlab

TARGET = 1.05
SEQ, BATCH = 64, 4


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        ids = torch.randint(0, 256, (SEQ,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


HOOKS = ("on_train_begin", "on_step_begin", "on_step_end", "on_log", "on_train_end")
inside: list[float] = []  # per run with the callback: seconds spent in its hooks


class Timed(ortlab.hf.RecordCallback):
    """RecordCallback whose hooks add the time they take to `inside[-1]`."""


def _timed(name: str):
    hook = getattr(ortlab.hf.RecordCallback, name)

    def timed(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return hook(self, *args, **kwargs)
        finally:
            inside[-1] += time.perf_counter() - started

    return timed


for _name in HOOKS:
    setattr(Timed, _name, _timed(_name))


DEVICE = ["cpu"]  # where the Trainer trains (--device)


def train_seconds(steps: int, out: str | None) -> float:
    """The wall time of one Trainer.train() of `steps` steps (with the callback when `out` is given)."""
    from transformers import LlamaConfig, LlamaForCausalLM, PrinterCallback, Trainer, TrainingArguments

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ, use_cache=False)
    model = LlamaForCausalLM(config)
    with tempfile.TemporaryDirectory() as scratch:
        args = TrainingArguments(scratch, max_steps=steps, per_device_train_batch_size=BATCH, logging_steps=1,
                                 report_to=[], save_strategy="no", use_cpu=DEVICE[0] == "cpu", disable_tqdm=True,
                                 seed=0, log_level="error")
        callbacks = [Timed(out=out)] if out else None
        if out:
            inside.append(0.0)
        trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=callbacks)
        trainer.remove_callback(PrinterCallback)  # its print per step is the same on both sides: noise only
        _device.sync(DEVICE[0])
        started = time.perf_counter()
        trainer.train()
        _device.sync(DEVICE[0])
        return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side per round (its shortest counts)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    _device.add_argument(parser)
    a = parser.parse_args()
    DEVICE[0] = _device.chosen(a, parser).type
    if a.threads:
        torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as out:
        train_seconds(2, None), train_seconds(2, out)  # warm up: imports, the first run folder
        runs = paired(a.rounds * a.repeats, lambda: train_seconds(a.steps, None),
                      lambda: train_seconds(a.steps, out))
    r = a.repeats
    theirs = [min(runs.theirs[k:k + r]) for k in range(0, len(runs.theirs), r)]
    ours = [min(runs.ours[k:k + r]) for k in range(0, len(runs.ours), r)]
    ratios = [o / t for o, t in zip(ours, theirs, strict=True)]
    for i, (t, o) in enumerate(zip(theirs, ours, strict=True)):
        print(f"round {i}: without {t:.3f} s, with {o:.3f} s, ratio {o / t:.3f}")
    ratio = statistics.median(ratios)
    print(f"{a.steps}-step Trainer.train(): without the callback {statistics.median(theirs):.3f} s, with it "
          f"{statistics.median(ours):.3f} s (medians over {a.rounds} rounds of the shortest of {r})")
    print(f"ratio with / without: {ratio:.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f}); target <= {TARGET}; on "
          f"{_device.describe(DEVICE[0])}")
    shares = [h / w for h, w in zip(inside[1:], runs.ours, strict=True)]  # inside[0]: the warm-up's
    print(f"time inside the callback's hooks: {100 * statistics.median(shares):.2f}% of train() "
          f"({100 * min(shares):.2f}-{100 * max(shares):.2f}%)")
    return verdict({"callback": ratio}, {"callback": TARGET}, _device.describe(DEVICE[0]))


if __name__ == "__main__":
    raise SystemExit(main())
