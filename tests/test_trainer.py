"""Bursts from a Hugging Face Trainer (ortlab.integrations.trainer) with a PEFT LoRA adapter, and the KV-cache fix:
real Trainer, PEFT and ORTModule objects, no mocks. The fast tier checks what the adapter computes against the
Trainer's own `train()`, the float64 reference, the fix's pure logic and the one-line refusals; the slow tier
bursts the LoRA Trainer on both backends through the CLI, as a user would."""

import json
import subprocess
import sys

import pytest
import torch

from ortlab.workload import Workload, WorkloadError

TRAINER = "ortlab.demo.trainers:lora_llama"


def _trainer(**kwargs):
    from ortlab.demo.trainers import lora_llama

    torch.manual_seed(0)  # as ortlab seeds a factory
    return lora_llama(**kwargs)


def _logged_losses(steps: int) -> list[float]:
    """The losses `trainer.train()` logs (rounded to 4 decimals by transformers 4, as they are by 5)."""
    trainer = _trainer()
    trainer.args.max_steps = steps
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_a_trainer_burst_trains_what_trainer_train_logs(tmp_path):
    import ortlab

    run = ortlab.burst(TRAINER, "pytorch", 3, out=tmp_path, in_process=True, progress=False)
    assert run.status == "ok"
    assert run.losses == pytest.approx(_logged_losses(3), abs=1e-4)  # warmup, accumulation, clipping, token count
    model = run.meta["model"]
    assert model["accumulation"] == 2 and model["clip_grad_norm"] == 1.0 and model["own_optimizer"]
    assert model["trainable_parameters"] < model["parameters"] / 10  # LoRA: the base is frozen
    state = json.loads((run.path / "final_state.json").read_text())
    assert {e["kind"] for n, e in state.items() if "lora_" in n} == {"parameter"}
    assert {e["kind"] for n, e in state.items() if n.endswith("q_proj.base_layer.weight")} == {"frozen parameter"}


def test_the_workload_takes_the_trainers_batches_optimizer_and_scheduler():
    w = Workload.coerce(_trainer(), "test")
    assert w.accumulation == 2 and w.clip_grad_norm == 1.0 and w.batch_size == 2
    inputs, count = w.batch(1)
    again, _ = Workload.coerce(_trainer(), "test").batch(1)  # the same batches from a new Trainer of the same seed
    assert torch.equal(inputs["input_ids"], again["input_ids"])
    trainer = _trainer()  # the whole optimizer step's labels, as the Trainer itself counts them (transformers 5
    _, expected = trainer.get_batch_samples(iter(trainer.get_train_dataloader()), 2, torch.device("cpu"))
    assert int(count) == int(expected) and int(count) in (2 * 2 * 16, 2 * 2 * 15)  # counts the shifted labels)
    assert w.micro_batches(w.batch, 1)[0][0]["input_ids"].equal(w.batch(2)[0]["input_ids"])
    optimizer, scheduler = w.optimizer(w.model)
    trained = {id(p) for p in w.model.parameters() if p.requires_grad}
    assert {id(p) for g in optimizer.param_groups for p in g["params"]} == trained
    assert {g["weight_decay"] for g in optimizer.param_groups} == {0.01, 0.0}
    assert scheduler.get_last_lr() == [0.0, 0.0]  # warmup_steps=2: the first step's learning rate is 0


def test_the_float64_reference_trains_the_trainers_step():
    from ortlab.engine.sampling import Feed
    from ortlab.runs.snapshot import Snapshot
    from ortlab.verdict import reference

    w = Workload.coerce(_trainer(), "test")
    run, first = reference.burst(w, Feed(w), Snapshot.take(w.model), "auto", 1e-3, 3)
    assert run["losses"] == pytest.approx(_logged_losses(3), abs=1e-4)
    assert set(first.grads) == {n for n, p in w.model.named_parameters() if p.requires_grad}
    assert {g.dtype for g in first.grads.values()} == {torch.float64}
    assert next(p for p in w.model.parameters()).dtype == torch.float32  # the model itself is untouched


class _Regressor(torch.nn.Module):
    """A model without **kwargs in forward: the Trainer divides its loss by the accumulation itself."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

    def forward(self, x, labels):
        return {"loss": torch.nn.functional.mse_loss(self.net(x).squeeze(-1), labels)}


def _regression_trainer(tmp_path):
    from transformers import Trainer, TrainingArguments

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    data = [{"x": x, "labels": x.sum()} for x in torch.randn(24, 4, generator=g)]
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", per_device_train_batch_size=4,
                             gradient_accumulation_steps=3, max_grad_norm=0.1, learning_rate=1e-2, max_steps=4,
                             lr_scheduler_type="cosine", warmup_steps=1, seed=3, use_cpu=True, logging_steps=1,
                             save_strategy="no", disable_tqdm=True)
    return Trainer(model=_Regressor(), args=args, train_dataset=data)


def test_a_model_without_loss_kwargs_is_scaled_as_the_trainer_scales_it(tmp_path):
    trainer = _regression_trainer(tmp_path)
    w = Workload.coerce(trainer, "test")
    assert w.batch(0)[1] is None  # no token count: the loss is divided by the accumulation instead
    optimizer, scheduler = w.optimizer(w.model)
    losses = []
    for k in range(4):  # two epochs of 2 steps
        losses.append(w.backward(w.model, w.micro_batches(w.batch, k)))
        w.optimizer_step(w.model, optimizer, scheduler)
    trained = _regression_trainer(tmp_path)
    trained.train()
    assert losses == pytest.approx([h["loss"] for h in trained.state.log_history if "loss" in h], abs=1e-4)


@pytest.mark.parametrize("change, says", [
    (lambda t: setattr(t, "train_dataset", None), "without a train_dataset"),
    (lambda t: setattr(t.state, "global_step", 4), "has trained already"),
    (lambda t: setattr(t, "optimizer", torch.optim.SGD(t.model.parameters(), lr=0.1)), "optimizers=(...)"),
])
def test_a_trainer_a_burst_cannot_reproduce_is_refused_in_one_line(change, says):
    from ortlab.integrations.trainer import TrainerError

    trainer = _trainer()
    change(trainer)
    with pytest.raises(TrainerError) as e:
        Workload.coerce(trainer, "train.py:make")
    assert says in str(e.value) and "train.py:make" in str(e.value) and "\n" not in str(e.value)


def test_what_is_neither_a_workload_nor_a_trainer_is_refused():
    with pytest.raises(WorkloadError, match=r"transformers\.Trainer"):
        Workload.coerce(object(), "train.py:make")
    with pytest.raises(WorkloadError, match="accumulation"):
        Workload(torch.nn.Linear(2, 2), lambda i: (torch.ones(2), None), lambda o, t: o.sum(), accumulation=0)
    with pytest.raises(WorkloadError, match="step_loss"):
        Workload(torch.nn.Linear(2, 2), lambda i: (torch.ones(2), None), None)


def test_a_workloads_own_step_accumulates_clips_and_schedules(tmp_path):
    """A plain Workload with its own pieces: the burst's losses are the sums a hand-written loop computes."""
    import ortlab

    run = ortlab.burst(_own_step, "pytorch", 3, out=tmp_path, in_process=True, progress=False)
    w = _own_step()
    optimizer, scheduler = w.optimizer(w.model)
    expected = []
    for k in range(3):
        expected.append(sum(w.backward(w.model, [w.batch(2 * k + j)]) for j in range(2)))
        torch.nn.utils.clip_grad_norm_(w.model.parameters(), 0.5)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    assert run.losses == pytest.approx(expected, rel=1e-6)


def _own_step() -> Workload:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    model[0].weight.requires_grad_(False)

    def batch(i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)

    def optimizer(m):
        opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-2)
        return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 2))

    return Workload(model, batch, None, step_loss=lambda r, x, y: torch.nn.functional.mse_loss(r(x), y) / 2,
                    optimizer=optimizer, accumulation=2, clip_grad_norm=0.5)


def test_a_frozen_parameter_must_stay_equal():
    from ortlab.verdict import state

    model = torch.nn.Linear(3, 2)
    model.weight.requires_grad_(False)
    before = state.summarize(model)
    assert before["weight"]["kind"] == state.FROZEN and state.whole(before["weight"])
    with torch.no_grad():
        model.weight.add_(1e-3)
    differ = state.differing(before, state.summarize(model), exact=before)
    assert [d["name"] for d in differ] == ["weight"]


def test_the_kv_cache_is_named_and_the_fix_turns_it_off_for_the_burst():
    from ortlab.compat import registry
    from ortlab.compat.blockers import UNSUPPORTED_OUTPUT
    from ortlab.compat.failures import step_failure
    from ortlab.compat.fixes.kv_cache import caching
    from ortlab.compat.probe import unflattenable
    from ortlab.demo.trainers import tiny_llama

    model = tiny_llama()
    ids = torch.randint(0, 128, (1, 8))
    found = unflattenable(model(input_ids=ids, labels=ids))
    assert [(where, cls.__name__) for where, cls in found] == [("output.past_key_values", "DynamicCache")]
    assert caching(model) == ("", ["LlamaConfig.use_cache=True"])
    failed = step_failure(RuntimeError("ORTModule fails to extract schema from data: Unsupported flatten data type: "
                                       "<class 'transformers.cache_utils.DynamicCache'>"), None)
    assert (failed.kind, failed.op) == (UNSUPPORTED_OUTPUT, "DynamicCache")
    assert registry.for_blocker(failed, model) == ["no-kv-cache"]
    with registry.applied(model, ["no-kv-cache"]):
        assert unflattenable(model(input_ids=ids, labels=ids)) == []
    assert model.config.use_cache is True  # undone after the burst


@pytest.mark.slow
@pytest.mark.ort
def test_the_lora_trainer_bursts_on_ortmodule_to_agree_with_the_kv_cache_fix(tmp_path):
    """The LoRA Trainer as written (use_cache on, accumulation 2, clipping, warmup): check names the cache, --fix
    auto applies no-kv-cache, and ORTModule trains the adapter as PyTorch does."""
    r = subprocess.run([sys.executable, "-m", "ortlab.cli", "burst", "--model", TRAINER, "--backend", "both",
                        "--parity", "--fix", "auto", "--steps", "3", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "verdict: agree" in r.stdout
    [ort] = tmp_path.glob("*-ortmodule")
    meta = json.loads((ort / "meta.json").read_text())
    assert meta["status"] == "ok" and meta["fixes"]["applied"] == ["no-kv-cache"]
    [found] = meta["fixes"]["found"]
    assert found["kind"] == "unsupported output" and found["op"] == "DynamicCache at output.past_key_values"
    assert found["module"] == "base_model.model" and found["source"] == "LlamaConfig.use_cache=True"
    verdict = json.loads((ort / "verdict.json").read_text())
    assert verdict["gradients"]["parameters"] == 8  # the LoRA A and B of q_proj and v_proj in 2 layers
