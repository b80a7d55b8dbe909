"""Write notebooks/13_tune.ipynb from its cell sources (then execute it in place with nbconvert:
`jupyter nbconvert --to notebook --execute --inplace notebooks/13_tune.ipynb`)."""

from pathlib import Path

import nbformat as nbf

HERE = Path(__file__).resolve().parents[1] / "notebooks"


def md(text):
    return nbf.v4.new_markdown_cell(text.strip())


def code(text):
    return nbf.v4.new_code_cell(text.strip())


cells = [
    md("""
# Which options make my model fastest or smallest: `ortlab.tune`

ORTModule has some twenty knobs. `ortlab.tune` measures the defaults first (repeated, to know their noise),
prunes what cannot work here with the reason (CUDA-only options on the CPU, recompute plans this model does not
have), tries one knob at a time, combines the winners within a budget in minutes, and guards every candidate
with the verdict: a setting under which ORTModule trains another model than PyTorch is rejected with its cause.
The same from a terminal: `ortlab tune --goal memory`; in the Lab: the **Tune** tab. See docs/tune.md.
"""),
    code("""
%matplotlib inline
import ortlab

session = ortlab.Session(out="runs")  # bursts run in a worker; every candidate starts from its one snapshot
memory = ortlab.tune(session, goal="memory", budget=10, only=["memory_opt_level", "plans"], steps=5, warmup=2,
                     repeats=2, guard_steps=2, on_progress=lambda event: print(event["text"]))
"""),
    md("""
The table: one row per setting, the baseline first. `activation_mb` is the activation peak from ortlab's memory
account of the execution graph ORT ran (exact at the burst's shapes: its noise over the repeats is 0);
`median_step_ms` the median step after the warm-up; `rss_mb` the process's peak resident set. Changes within the
baseline's noise show as 0.
"""),
    code("""
memory.table[["candidate", "outcome", "verdict", "median_step_ms", "time_change_pct", "activation_mb",
              "memory_change_pct", "rss_mb"]]
"""),
    code("""
print(memory.strategy.name, "-", memory.strategy.reason)
memory.pruned_table()
"""),
    code("""
memory.pareto()
"""),
    md("The best setting trains the same model (verdict agree) with less activation memory than the defaults:"),
    code("""
# NBVAL_CHECK_OUTPUT
best = memory.table.set_index("candidate").loc[memory.best_name]
baseline = memory.table.set_index("candidate").loc["baseline"]
print(memory.best, best["verdict"], best["activation_mb"] < baseline["activation_mb"])
"""),
    code("""
print(memory.export_lines())
print()
print(memory.wrap_call())
"""),
    md("""
Re-running the best setting as a plain burst reproduces its figures: the accounted memory to the byte. The step
time is as steady as the machine: compare it with the baseline's noise measured above (on a shared machine the
load can change between two bursts by more than that).
"""),
    code("""
# NBVAL_CHECK_OUTPUT
again = session.burst("ortmodule", 5, memory.best, collect={"memory": {}}, progress=False)
print(again.memory["peak_activation_bytes"] / 2**20 == best["activation_mb"])
"""),
    code("""
step_ms = again.metrics["step_time_s"].iloc[2:].median() * 1000
print(f"step {step_ms:.1f} ms again, {best['median_step_ms']:.1f} ms in the tuning; the baseline's noise: "
      f"{100 * memory.noise['time']:.1f}%")
"""),
    md("""
## The time goal

On the CPU the knobs that remain are few; the answer may well be that none beats the baseline beyond its noise,
and the tuning says so rather than crowning a lucky measurement. Olive's goal types add conditions, here: no
more than 10 % more activation memory.
"""),
    code("""
speed = ortlab.tune(session, goal=["time", "memory: percent-max-degradation 10"], budget=10,
                    only=["enable_compute_optimizer", "deepcopy_before_model_export", "enable_mem_efficient_grad_mgmt"],
                    steps=6, warmup=2, repeats=3, guard_steps=2)
print(speed.headline())
speed.table[["candidate", "outcome", "verdict", "median_step_ms", "time_change_pct", "memory_change_pct"]]
"""),
    md("""
## A setting that changes the model is rejected

This model's forward branches on an environment variable that one ORTModule option sets. ORT freezes the branch
at export, so under that option ORTModule trains another model than PyTorch: the verdict says `diverged`, and the
tuning rejects the candidate with its cause (greyed in the figure).
"""),
    code("""
def flipped():
    import os

    import torch
    from torch import nn
    from torch.nn import functional as F

    import ortlab

    class Flipped(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.out = nn.Linear(16, 16), nn.Linear(16, 16)

        def forward(self, x):
            h = torch.tanh(self.inp(x))
            if os.environ.get("ORTMODULE_DEEPCOPY_BEFORE_MODEL_EXPORT") == "0":
                h = 3 * h + x
            return self.out(h)

    def batch(step):
        g = torch.Generator().manual_seed(step)
        return (torch.randn(8, 16, generator=g),), torch.randn(8, 16, generator=g)

    return ortlab.Workload(Flipped(), batch, F.mse_loss, name="flipped by an option", batch_size=8)


with ortlab.Session(flipped, out="runs") as flipped_session:
    guarded = ortlab.tune(flipped_session, goal="time", budget=10, only=["deepcopy_before_model_export"], steps=4,
                          warmup=2, repeats=2, guard_steps=2)
"""),
    code("""
# NBVAL_CHECK_OUTPUT
row = guarded.table.set_index("candidate").loc["deepcopy_before_model_export=False"]
print(row["outcome"], row["verdict"], guarded.best_name)
"""),
    code("""
print(row["cause"])
guarded.pareto()
"""),
    code("""
session.close()
"""),
]

nb = nbf.v4.new_notebook(cells=cells)
nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
nbf.write(nb, HERE / "13_tune.ipynb")
print("wrote", HERE / "13_tune.ipynb")
