"""Write the tutorial notebooks 01, 02, 08, 09, 11, 12, 13 and 14 from their cell sources (then execute them in place
with nbconvert): `python scripts/make_notebooks.py [NAME.ipynb ...]` (default: all of them)."""

import sys
from pathlib import Path

import nbformat as nbf

HERE = Path(__file__).resolve().parents[1] / "notebooks"


def md(text):
    return nbf.v4.new_markdown_cell(text.strip())


def code(text):
    return nbf.v4.new_code_cell(text.strip())


quickstart = [
    md("""
# ortlab quickstart

`ortlab.Lab()` is the whole user interface: tabs for ORTModule's options, training bursts beside a plain
PyTorch baseline, the captured logs, and (when present) exported graphs, recompute plans and activation
statistics. It runs over the bundled demo, a tiny GPT-style character model, unless you give it your own
model factory.

Bursts run in a worker process, so ORTModule's C-level output and crashes never reach this kernel.
"""),
    code("""
%matplotlib inline
import ortlab

lab = ortlab.Lab(out="runs")
lab
"""),
    md("""
Open the **Burst** tab and press **Run**, or do the same from code: a PyTorch burst and an ORTModule burst
from the same snapshot, in parity mode (same seeds, dropout 0, compute optimizer off, deterministic algorithms).
"""),
    code("""
comparison = lab.compare(steps=10, parity=True, progress=False)
print(comparison)
"""),
    code("""
comparison.losses()
"""),
    code("""
from ortlab.common.plots import loss_figure

loss_figure({"pytorch": comparison.pytorch.losses, "ortmodule": comparison.ortmodule.losses})
"""),
    md("In parity mode the two backends agree to float rounding; the check below must print `ok ok True`."),
    code("""
# NBVAL_CHECK_OUTPUT
summary = comparison.to_dict()
print(summary["pytorch"]["status"], summary["ortmodule"]["status"], summary["max_loss_diff"] < 1e-4)
"""),
    md("What ORT spent on its first-time initialization, in seconds, and the runs on disk:"),
    code("""
comparison.ortmodule.ort["overhead"]
"""),
    code("""
ortlab.list_runs("runs")[["run", "backend", "status", "steps", "final_loss"]].head()
"""),
]

options = [
    md("""
# Options, re-export reasons, parity, your own model

Every ORTModule option is in ortlab's registry, with when ORT 1.19.2 reads it: at **import** (a change needs a
new process: ortlab starts a new worker), at **construction** (a new `ORTModule` wrap, which re-exports), or
during **export**.
"""),
    code("""
import ortlab

table = ortlab.registry_table()
table[["env", "default", "read_at", "changes_graph", "needs_cuda", "area"]].head(12)
"""),
    code("""
# NBVAL_CHECK_OUTPUT
opts = ortlab.Options(memory_opt_level=1, log_level="INFO")
print(opts)
print(opts.export_lines())
"""),
    md("A bad name or value says what is allowed:"),
    code("""
# NBVAL_CHECK_OUTPUT
for bad in ({"memory_opt_level": 3}, {"memory_opt_levl": 1}):
    try:
        ortlab.Options(bad)
    except ortlab.OptionError as e:
        print(e)
"""),
    md("""
## Why ORTModule exported

One session, four bursts: the same options reuse the ORTModule (no export), a construction-time option
re-wraps it, an import-time option needs a new worker process. `ort_exported` is read from ORT's own state.
"""),
    code("""
s = ortlab.Session(out="runs")
s.burst("ortmodule", 3, progress=False)
s.burst("ortmodule", 3, progress=False)
s.burst("ortmodule", 3, {"memory_opt_level": 1}, progress=False)
s.burst("ortmodule", 3, {"enable_custom_autograd": False}, progress=False)
"""),
    code("""
# NBVAL_CHECK_OUTPUT
print(s.transitions[["action", "reason", "ort_exported"]].to_string(index=False))
"""),
    md("""
## Parity mode

Without parity mode, dropout (0.1 in the demo) and ORT's compute optimizer make the losses differ; with it,
they agree to float rounding.
"""),
    code("""
loose = s.compare(steps=8, parity=False, progress=False).to_dict()["max_loss_diff"]
strict = s.compare(steps=8, parity=True, progress=False).to_dict()["max_loss_diff"]
print(f"max |loss difference|: without parity {loose:.2e}, with parity {strict:.2e}")
"""),
    code("""
# NBVAL_CHECK_OUTPUT
print(loose > 1e-3, strict < 1e-4)
s.close()
"""),
    md("""
## Your own model

A factory returns `ortlab.Workload(model, batch, loss)`: the model, the batch of each step (deterministic in the
step, so both backends see the same data) and the loss. A factory defined in the notebook is sent to the worker
by value. Here, a Hugging Face GPT-2 from a tiny random config (no download), with the loss computed in PyTorch.
"""),
    code("""
def tiny_gpt2():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    import ortlab

    config = GPT2Config(vocab_size=128, n_positions=64, n_embd=32, n_layer=2, n_head=2, use_cache=False,
                        attn_implementation="eager")
    model = GPT2LMHeadModel(config)

    def batch(step):
        ids = torch.randint(0, 128, (4, 32), generator=torch.Generator().manual_seed(step))
        return {"input_ids": ids}, ids

    def loss(out, ids):
        logits = out["logits"][:, :-1]
        return torch.nn.functional.cross_entropy(logits.reshape(-1, 128), ids[:, 1:].reshape(-1))

    return ortlab.Workload(model, batch, loss, name="tiny GPT-2", batch_size=4)


try:
    import transformers  # noqa: F401
except ImportError:
    print("transformers is not installed: pip install transformers to run this part")
else:
    with ortlab.Session(tiny_gpt2, out="runs") as hf:
        print(hf.compare(steps=5, parity=True, progress=False))
"""),
]

will_it_run = [
    md("""
# Will my model run on ORTModule?

ORTModule (onnxruntime-training 1.19.2) is frozen while the model libraries move on: code written for today's
transformers can stop it at the export, in ORT's graph, or in its gradient builder. When that happens ORTModule
may quietly fall back to PyTorch. This notebook takes a model written the way transformers 5 writes its
attention-mask code (`mask_model.py` beside this notebook) from "does not run" to "trains, and agrees with
PyTorch":

1. `ortlab.check` lists **every** blocker at once, with the module and the Python line it comes from and the
   fix that removes it, verifies the fixes by exporting again and runs one ORTModule training step;
2. a burst without the fixes ends with status `fallback`, never `ok`, and nothing is compared against it;
3. the same burst with `fixes="auto"` trains on ORTModule and agrees with PyTorch.
"""),
    code("""
# NBVAL_CHECK_OUTPUT
import ortlab

report = ortlab.check("mask_model.py:make", out="runs")
print(report)
"""),
    md("""
Two blockers, found in one pass: the exporter of torch 2.6 has no ONNX form of `torch.diff`, and ORT rejects a
cumulative sum over a bool tensor. Both come with their line in `mask_model.py` and with the ortlab fix that
removes them. The same as a table (the full record is `report.to_dict()`, also saved as `check.json` in the
check's folder):
"""),
    code("""
report.table()[["kind", "op", "source", "fix", "left after fixes"]]
"""),
    md("""
What a burst without the fixes does: ORTModule's export fails and, under its default fallback policy, ORTModule
trains the model with PyTorch instead. ortlab says so: the run's status is `fallback`, its loss difference and
step-time ratio are not computed (they would compare PyTorch with PyTorch), and `ortlab burst` exits 1 (or 0 with
`--allow-fallback`).
"""),
    code("""
# NBVAL_CHECK_OUTPUT
session = ortlab.Session("mask_model.py:make", out="runs")
plain = session.compare(steps=10, parity=True, progress=False)
print("ortmodule status:", plain.ortmodule.status)
print("fell back on:", plain.ortmodule.meta["fallback"]["op"], "at", plain.ortmodule.meta["fallback"]["source"])
print("loss difference:", plain.to_dict()["max_loss_diff"])
"""),
    md("""
With the fixes `check` recommends (`fixes="auto"`, or `--fix auto` on the command line). The fixes apply to the
ORTModule burst only: the PyTorch baseline runs the model as you wrote it, so agreement in parity mode shows that
the fixes keep the math.
"""),
    code("""
# NBVAL_CHECK_OUTPUT
fixed = session.compare(steps=10, parity=True, progress=False, fixes="auto")
print("ortmodule status:", fixed.ortmodule.status, "with fixes", fixed.ortmodule.meta["fixes"]["applied"])
print("losses agree within 1e-5:", fixed.to_dict()["max_loss_diff"] <= 1e-5)
"""),
    code("""
print(fixed)
"""),
    md("""
Every fix ortlab has, each a small documented transformation with its own parity test (the parameters and
`state_dict` keys of your model never change):
"""),
    code("""
ortlab.compat.registry.catalogue()
"""),
    md("""
Hugging Face models bring their own blockers. `ortlab.demo.families` has tiny random configs of common families;
with this environment's transformers, BERT's default sdpa attention writes its attention dropout in a form whose
gradient ORT cannot build, and the `eager-attention` fix computes the same attention the eager way.
`docs/compatibility.md` has the table for every family and both tested transformers releases.
"""),
    code("""
# NBVAL_CHECK_OUTPUT
bert = ortlab.check("ortlab.demo.families:bert", out="runs")
print(bert.verdict)
print([(b.kind, b.op, b.fixes) for b in bert.blockers])
"""),
    md("""
When a blocker has no fix, `check` says what can be done instead (its `remedy`), and the verdict stays
`blocked`: the first question, "does my model run on ORTModule, and if not, why", always has an answer.

## A torch.nn layer, from blocked to agree

Some of torch.nn's own layers stop ORTModule 1.19.2 on the CPU (`docs/compatibility.md` has the table of 35).
`nn.MultiheadAttention`, the heart of ViT and of every `nn.Transformer`, is one: torch's attention function
splits the heads with sizes it reads at run time, and ORT's symbolic shape inference fails on the Reshape that
makes. `ortlab.demo.layers:multihead_attention` is a small model around it, written as people write it (batch
first, a key padding mask, the attention weights returned). Without fixes, `check` names the cause and the fix:
"""),
    code("""
# NBVAL_CHECK_OUTPUT
attention = ortlab.Session("ortlab.demo.layers:multihead_attention", out="runs")
blocked = attention.check("none")
print(blocked.status)
for blocker in blocked.blockers:
    print(blocker.line())
"""),
    md("""
The fix `explicit-attention` computes the same attention with the module's own projection weights (q, k, v from
`in_proj_weight`, softmax of the scaled products plus the masks, `out_proj`), replacing torch's function for the
burst only: the parameters, `state_dict` keys and optimizer state are the model's. The PyTorch baseline runs
torch's own attention, so agreement is the proof:
"""),
    code("""
# NBVAL_CHECK_OUTPUT
layer = attention.compare(steps=5, parity=True, progress=False, fixes="auto")
print("ortmodule status:", layer.ortmodule.status, "with fixes", layer.ortmodule.meta["fixes"]["applied"])
print("losses agree within 1e-5:", layer.to_dict()["max_loss_diff"] <= 1e-5)
print("verdict:", layer.verdict.status)
attention.close()
"""),
    code("""
session.close()
"""),
]

different_model = [
    md("""
# When ORTModule trains a different model

ORTModule can train another model than yours **without any error**: Python control flow frozen at export, buffers
that forward mutates, and (for some common CNN blocks) wrong gradients on the CPU. A loss difference alone cannot
tell: a few AdamW steps can push two correct runs apart, and buffers can differ with equal losses. ortlab judges
every comparison of the two backends from evidence that noise cannot fool, names the cause, and has fixes that
keep the math. Two models from `ortlab.demo.divergence`:

- `flag`: `forward(x, use_residual)` with `if use_residual:`, the flag flipping from step to step;
- `squeeze_excite`: a squeeze-and-excitation block (`nn.AdaptiveAvgPool2d(1)`, 1x1 convolutions, a sigmoid gate).
"""),
    code("""
# NBVAL_CHECK_OUTPUT
import ortlab

flag = ortlab.Session("ortlab.demo.divergence:flag", out="runs")
comparison = flag.compare(steps=4, parity=True, progress=False)
print("statuses:", comparison.pytorch.status, comparison.ortmodule.status)
print(comparison.verdict.status)
for cause in comparison.verdict.causes:
    print("-", cause["kind"])
"""),
    md("""
Both bursts ran without an error, yet the verdict is **diverged**: the losses drift apart far beyond the spread of a
PyTorch pair from a start 1e-7 away, and the first cause is in the transitions table: at step 1 `use_residual`
became `True`, and ORT reused the graph exported for `False` (the value was baked into it; ORT's re-export check
compares types, not values). The export hazard (the `if` on a bool converted to a tensor) points at the line.
"""),
    code("""
flag.transitions[["step", "action", "reason"]]
"""),
    md("""
`ortlab check` names the same cause before any burst and the fix that removes it: `graph-per-value` gives each
value of the argument a graph of its own (one export per value, parameters and optimizer state shared).
"""),
    code("""
# NBVAL_CHECK_OUTPUT
report = flag.check()
print(report.verdict)
fixed = flag.compare(steps=4, parity=True, progress=False, fixes="auto")
print(fixed.verdict.status, "with", fixed.ortmodule.meta["fixes"]["applied"])
print("losses agree within 1e-5:", fixed.to_dict()["max_loss_diff"] <= 1e-5)
flag.close()
"""),
    md("""
The squeeze-and-excitation block: the forward agrees, the gradients do not. The first-step gradient check (every
parameter, the same state and batch, dropout off) names the parameter; `ortlab check` recognizes the pattern and
names the fix, `global-avg-pool`, which computes the pool as a spatial mean (the same math, whose ORT gradients
agree).
"""),
    code("""
# NBVAL_CHECK_OUTPUT
se = ortlab.Session("ortlab.demo.divergence:squeeze_excite", out="runs")
plain = se.compare(steps=3, parity=True, progress=False)
worst = plain.verdict.gradients["worst"][0]
print(plain.verdict.status, "- worst gradient:", worst["parameter"], "in module", worst["module"])
print("forward agrees:", plain.verdict.gradients["forward_agrees"])
print([c["text"] for c in plain.verdict.causes if c["kind"] == "fix"])
"""),
    code("""
# NBVAL_CHECK_OUTPUT
cured = se.compare(steps=3, parity=True, progress=False, fixes="auto")
print(cured.verdict.status, "with", cured.ortmodule.meta["fixes"]["applied"])
se.close()
"""),
    md("""
The whole report, as `ortlab burst --backend both` prints it (a diverged burst exits 1):
"""),
    code("""
print(plain)
"""),
]

stay_or_move = [
    md("""
# ORTModule or torch.compile?

onnxruntime-training 1.19.2 is the last release of ORT's training package, and ORTModule depends on the TorchScript
exporter PyTorch is retiring. People who train with ORTModule now ask whether to stay or move to PyTorch's own
compiler, and what changes if they do. `compare` answers it on your model: PyTorch, ORTModule and torch.compile from
one snapshot, the same steps, each judged against PyTorch, with speed after start-up, start-up cost, the steps
after which a backend has made its start-up back, memory (what each keeps for backward, from ortlab's exact
activation account) and numerics. Here on the bundled demo (one layer, to keep torch.compile's first compilation
short). `backends="all"` is every backend that runs here: on the ort stack (Python 3.10/3.11, torch 2.6) PyTorch,
ORTModule and torch.compile; on the current stack (Python 3.12+, the newest torch) PyTorch and torch.compile, since
ORTModule does not install there (`ortlab doctor` says which stack you are on).
"""),
    code("""
# NBVAL_CHECK_OUTPUT
import ortlab

session = ortlab.Session(model_kwargs={"n_layer": 1}, out="runs")
cmp = session.compare(steps=30, parity=True, backends="all", progress=False, collect={"memory": {}})
print("every run ok:", all(run.status == "ok" for run in cmp.runs))
print("every verdict agree:", all(cmp.verdict_of(b).status == "agree" for b in cmp.others))
print("torch.compile's losses within 1e-5 of PyTorch's:", cmp.versus("compile")["max_loss_diff"] <= 1e-5)
"""),
    md("""
The decision, per backend. *median step after warm-up* leaves the first steps out (they export, compile, warm up);
*step time vs PyTorch* is the ratio with its 99 % interval, from the spread of the steps and the machine's load;
*start-up* is ORT's export and session creation, or torch.compile's compilation (its first step; any step that
re-compiles adds to it); *steps to break even* is the start-up divided by the time a step saves against PyTorch,
"never (slower)", or "can't tell" while the interval holds 1. On a model this small, on two CPU cores, neither pays
back; on your model and device the table says.
"""),
    code("""
cmp.decision()
"""),
    md("""
The recommendation follows from the same figures: a backend only when it is faster beyond the noise and trains the
same model; "can't tell at this length" otherwise, with about how many more steps would tell (the CLI's
`ortlab compare` and the Lab's Burst panel say the same).
"""),
    code("""
print(cmp.recommendation().line)
"""),
    code("""
print(cmp)
"""),
    md("""
What breaks under torch.compile is named like ORTModule's export blockers: a *graph break* (Python dynamo cannot
capture; the graph is split there) with its reason and your line, and a *re-compilation* with the guard that failed
(here the batch size changes). `fullgraph=True` turns a graph break into a failure of the burst, in one line.
"""),
    code("""
# NBVAL_CHECK_OUTPUT
chatty = ortlab.Session("ortlab.demo.breaks:model", {"batch_sizes": [8, 12]}, out="runs")
run = chatty.burst("compile", 4, parity=True, progress=False, compile={"backend": "aot_eager"})
info = run.read_json("compile.json")
for b in info["graph_breaks"]:
    print(f"graph break at {b['file']}:{b['line']}, at the print: {'print' in b['reason']}")
print("re-compiled at step", info["recompiles"][0]["step"])
failed = chatty.burst("compile", 2, progress=False, compile={"backend": "aot_eager", "fullgraph": True})
print(failed.status, "-", failed.meta["failed_stage"])
chatty.close()
session.close()
"""),
]

tune = [
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
`median_step_ms` the median step after the warm-up; `rss_mb` the process's peak resident set. Changes are shown as
measured; `inside_noise` names the metrics whose change the baseline's noise covers (they count as no change).
"""),
    code("""
memory.table[["candidate", "outcome", "verdict", "median_step_ms", "time_change_pct", "activation_mb",
              "memory_change_pct", "rss_mb", "inside_noise"]]
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
    guarded = ortlab.tune(flipped_session, goal="time", budget=10, only=["deepcopy_before_model_export"], steps=5,
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

trainer = [
    md("""
# Your Trainer: a LoRA fine-tune in a Hugging Face Trainer

Most people meet ORTModule inside a `transformers.Trainer`, often with a PEFT LoRA adapter. This notebook takes
such a Trainer as it is (a tiny random Llama, so that it runs on a laptop CPU in a minute or two):

1. **a burst from the Trainer**: the factory returns the Trainer, not yet trained; ortlab trains its model, its
   first batches, its optimizer and scheduler, its gradient accumulation and clipping, on PyTorch and on
   ORTModule, and judges whether they train the same model;
2. **a real run**: the same Trainer's `train()` with `ortlab.wrap(model)` (ORTModule with ortlab's fixes, no silent
   fallback to PyTorch) and `ortlab.hf.RecordCallback`, which writes the run as a run folder every view reads;
   PyTorch's and ORTModule's runs side by side.
"""),
    code("""
%matplotlib inline
import warnings

import torch

import ortlab

# the exporter's notes on transformers' own code when ORTModule exports in this kernel (`ortlab check` reads them
# as hazards and found none that matter here)
warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
warnings.filterwarnings("ignore", message="Constant folding")


def lora_trainer(wrap=False, callbacks=None, steps=6):
    \"\"\"A Trainer of a LoRA adapter on a tiny random Llama (its KV cache left on, as decoders have it):
    gradient accumulation 2, clipping 1.0, a warmup.\"\"\"
    import tempfile

    from peft import LoraConfig, get_peft_model
    from transformers import Trainer, TrainingArguments, default_data_collator

    from ortlab.demo.trainers import Tokens, tiny_llama

    torch.manual_seed(0)
    model = get_peft_model(tiny_llama(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                    lora_dropout=0.0))
    args = TrainingArguments(tempfile.mkdtemp(), max_steps=steps, per_device_train_batch_size=2,
                             gradient_accumulation_steps=2, max_grad_norm=1.0, warmup_steps=2, learning_rate=1e-3,
                             logging_steps=1, seed=0, report_to="none", save_strategy="no", use_cpu=True,
                             disable_tqdm=True, label_names=["labels"])  # PEFT hides them from the Trainer
    return Trainer(model=ortlab.wrap(model) if wrap else model, args=args, train_dataset=Tokens(),
                   data_collator=default_data_collator, callbacks=callbacks)
"""),
    md("""
## 1. A burst from the Trainer

The Lab runs the factory in its worker process. `fixes="auto"` applies what `ortlab check` recommends for the
model: here `no-kv-cache`, because ORTModule cannot take the KV cache a decoder returns while `use_cache` is on.
Parity mode makes both backends compute alike, so that the verdict can judge them against float64.
"""),
    code("""
lab = ortlab.Lab(lora_trainer, out="runs")
comparison = lab.compare(steps=4, parity=True, fixes="auto", progress=False)
print(comparison)
"""),
    code("""
# NBVAL_CHECK_OUTPUT
print(comparison.verdict.status, "with", comparison.ortmodule.meta["fixes"]["applied"])
"""),
    md("""
## 2. A real run: `ortlab.wrap` and `RecordCallback`

The same Trainer, trained for real in this kernel: once as it is (PyTorch), once with its model in
`ortlab.wrap`. `wrap` checks the model on its first batch (`fixes="auto"`, the default) and keeps the fixes with
the model for its life, applied around each of its forwards only; a failure raises with its reason instead of
falling back to PyTorch. The callback only observes: the losses it records are the Trainer's own logged losses,
one row per optimizer step (two micro-batches each here).
"""),
    code("""
runs = {}
for wrap in (False, True):
    record = ortlab.hf.RecordCallback(out="runs")
    trainer = lora_trainer(wrap=wrap, callbacks=[record])
    trainer.train()
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    runs["ortmodule" if wrap else "pytorch"] = run = ortlab.load_run(record.path)
    print(run.path.name, run.status, "rows are the logged losses:", run.losses == logged)
"""),
    code("""
# NBVAL_CHECK_OUTPUT
print({name: (run.status, len(run.metrics)) for name, run in runs.items()})
print(runs["ortmodule"].meta["fixes"]["applied"])
"""),
    code("""
from ortlab.common.plots import loss_figure

loss_figure({name: run.losses for name, run in runs.items()}, title="Trainer.train(): logged loss per step")
"""),
    md("""
ORTModule's run folder also holds what ORT did: why it exported (its transitions) and what its start-up cost.
Both recorded runs are in `runs/` beside the bursts, where `ortlab runs`, `ortlab diff`, `ortlab time` and the
Lab's tabs read them.
"""),
    code("""
print(runs["ortmodule"].transitions[["action", "reason"]].to_string(index=False))
print(runs["ortmodule"].ort["overhead"])
"""),
    code("""
ortlab.list_runs("runs")[["run", "backend", "status", "steps", "final_loss"]].head()
"""),
    code("""
lab.close()
"""),
]

the_move = [
    md("""
# The move, written out

ORTModule runs on its own stack (onnxruntime-training 1.19.2, torch 2.6); the torch you move to is newer and
cannot share a process with it. `ortlab.move_report` takes an ORTModule run and a torch.compile run, made in one
process or on two stacks, and writes the move out: what each option the ORTModule run used becomes on the newest
torch (with a snippet to paste), both sides' step time after start-up, start-up and memory as their run folders
recorded them, the torch and stack of each, and the verdict on each against PyTorch. `ortlab move RUN RUN` prints
the same; the Lab's **Move** tab shows it for the Lab's newest runs.

Here on the bundled demo, small (one layer, 32 wide) so that torch.compile's first compilation stays short, with
ORT's layer-wise recompute on (`memory_opt_level=1`): PyTorch, ORTModule and torch.compile from one snapshot, in
parity mode, each judged against PyTorch.
"""),
    code("""
import ortlab

session = ortlab.Session(model_kwargs={"n_layer": 1, "d_model": 32}, out="runs")
cmp = session.compare(4, {"memory_opt_level": 1}, backends="all", parity=True, progress=False,
                      collect={"memory": {}})
report = ortlab.move_report(cmp.ortmodule, cmp.compile)
"""),
    md("Both sides ran and trained the same model as PyTorch; the check below must print the same every time."),
    code("""
# NBVAL_CHECK_OUTPUT
print(report.ortmodule.backend, report.target.backend, report.ortmodule.verdict, report.target.verdict)
print("options the ORTModule run used:", [row["option"] for row in report.options])
print("ORT recomputed in backward:", report.recomputed)
print("missing figures:", report.missing)
"""),
    md("""
The measured figures side by side (a figure a run did not record would say so; torch.compile has no graph
activation account, so its activation peak is missing):
"""),
    code("""
import pandas as pd

pd.DataFrame(report.table())
"""),
    md("""
What each option becomes. *fit* says how close the newest torch comes: *same*, *partial*, *built in* (nothing to
set) or *no equivalent* (nothing to set, and why none is needed). `memory_opt_level=1` becomes activation
checkpointing of the modules ORT recomputed, or torch.compile's activation memory budget; ortlab's own settings
(parity's `enable_compute_optimizer=False`, the memory account's `save_onnx`) are said as such.
"""),
    code("""
pd.DataFrame(report.options)[["option", "value", "becomes", "fit", "set_by"]]
"""),
    code("""
print(report)
"""),
    md("""
The memory equivalent. ORT's recompute kept far less for backward than torch.compile did by default; the move report
says the equivalent was not measured and gives the command that measures it. torch.compile's activation memory
budget (`compile={"memory_budget": B}`, CLI `--compile-memory-budget B`) is that equivalent: a burst with it, set
beside the same ORTModule run, measures it.
"""),
    code("""
print(report.memory["line"])
budget = session.burst("compile", 4, parity=True, progress=False, collect={"memory": {}},
                       compile={"memory_budget": 0.05})
measured = ortlab.move_report(cmp.ortmodule, budget, reference_run=cmp.pytorch)
print(measured.memory["line"])
"""),
    code("""
# NBVAL_CHECK_OUTPUT
without, with_budget = (r.summary()["saved_for_backward_mb"] for r in (cmp.compile, budget))
print("measured:", measured.memory["measured"], "| torch.compile's verdict:", measured.target.verdict)
print("the budget keeps less for backward:", with_budget < without / 2)
"""),
    md("""
Options this run did not use have their entries too (`ortlab.move.mapping`), e.g. ORT's FusedAdam and its fallback
policy:
"""),
    code("""
# NBVAL_CHECK_OUTPUT
from ortlab.move.mapping import equivalent

print(equivalent("optimizer", "fused_adam").snippet)
print(equivalent("fallback_policy", "FALLBACK_DISABLE").snippet)
print(equivalent("onnx_opset_version", 17).why)
"""),
    md("""
To the newest torch: burst torch.compile on the current stack (Python 3.12+, torch 2.14) from the same model and
seed, in parity mode, then set its folder beside the ORTModule run; `reference_run` (the PyTorch parity run) judges
both now when a run has no verdict. On the command line:

```bash
ORTLAB_STACK=current bin/ortlab burst --backend compile --parity --steps 4 \\
    --model-arg n_layer=1 --model-arg d_model=32 --out runs-current
bin/ortlab move runs/<the ORTModule run> runs-current/<the compile run> --reference runs/<the PyTorch run>
```

In Python: `ortlab.move_report(cmp.ortmodule, "runs-current/<the compile run>", reference_run=cmp.pytorch)`.
docs/compile.md has the full table and the figures measured on both stacks.
"""),
    code("""
session.close()
"""),
]


NOTEBOOKS = {"01_quickstart.ipynb": quickstart, "02_options_and_bursts.ipynb": options,
             "08_will_my_model_run.ipynb": will_it_run, "09_ortmodule_or_torch_compile.ipynb": stay_or_move,
             "11_when_ortmodule_trains_a_different_model.ipynb": different_model, "12_trainer.ipynb": trainer,
             "13_tune.ipynb": tune, "14_the_move.ipynb": the_move}

for name in sys.argv[1:] or NOTEBOOKS:  # the names given (e.g. 13_tune.ipynb), or every notebook here
    nb = nbf.v4.new_notebook(cells=NOTEBOOKS[name])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbf.write(nb, HERE / name)
    print("wrote", HERE / name)
