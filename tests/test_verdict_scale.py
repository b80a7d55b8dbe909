"""The verdict at the size people train (ortlab.verdict.blockwise, ortlab.runs.sketch, ortlab.verdict.cost,
ortlab.engine.headroom): float64 one block at a time is the whole model's float64 step; summaries estimate the
distances the verdict judges and say when they cannot decide; the float64 burst is spent only where it fits;
evidence that was not seen is never an agreement; out of memory is named in one line."""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from ortlab.runs import sketch
from ortlab.verdict import blockwise, reference
from ortlab.verdict.gradients import CANDIDATE, PYTORCH, Step, compare, float64_distances
from ortlab.workload import ModelRef, Workload

ROOT = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------- float64 block by block


def _accumulating() -> Workload:
    """A model trained over two micro-batches a step, with a tied weight used by two units."""
    torch.manual_seed(0)
    emb = nn.Embedding(50, 16)
    head = nn.Linear(16, 50, bias=False)
    head.weight = emb.weight
    model = nn.Sequential(emb, nn.Sequential(nn.Linear(16, 16), nn.Tanh()), nn.Sequential(nn.Linear(16, 16),
                                                                                         nn.Tanh()), head)

    def batch(i: int):
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, 50, (4, 6), generator=g)
        return ids, ids

    return Workload(model, batch, lambda out, y: nn.functional.cross_entropy(out.reshape(-1, 50), y.reshape(-1)),
                    accumulation=2)


MODELS = ["ortlab.demo:gpt", "ortlab.demo.families:gpt2", "ortlab.demo.families:t5",
          "ortlab.demo.divergence:counter", "ortlab.demo.divergence:norm", "ortlab.demo.divergence:squeeze_excite"]


@pytest.mark.parametrize("factory", [*MODELS, "accumulating"])
def test_float64_block_by_block_is_the_float64_step_of_the_whole_model(factory):
    """Every trained parameter's float64 gradient, handed over unit by unit, equals the one a float64 copy of the
    whole model gives (to float64's summation order); the model's weights, buffers and gradients are untouched."""
    if factory.startswith("ortlab.demo.families"):
        pytest.importorskip("transformers")
    torch.manual_seed(0)
    work = _accumulating() if factory == "accumulating" else ModelRef.of(factory).build()
    batches = work.micro_batches(work.batch, 0)
    before = {k: v.clone() for k, v in work.model.state_dict().items()}
    marker = {n: torch.full_like(p, 7.0) for n, p in work.model.named_parameters()}
    for n, p in work.model.named_parameters():
        p.grad = marker[n]
    whole = reference.step(work, batches)
    got: dict[str, torch.Tensor] = {}

    def sink(name: str, g: torch.Tensor) -> None:
        assert name not in got, f"{name} handed over twice"
        got[name] = g.clone()

    loss = blockwise.step(work, batches, sink)
    assert loss == pytest.approx(whole.loss, rel=1e-13)
    expected = {n: g for n, g in whole.grads.items() if g is not None}
    assert set(got) == set(expected)
    total = math.sqrt(sum(float(g.norm()) ** 2 for g in expected.values()))
    for name, g in expected.items():
        assert got[name].dtype == torch.float64
        assert float((got[name] - g).norm()) <= 1e-12 * max(float(g.norm()), 1e-6 * total), name
    assert all(torch.equal(before[k], v) for k, v in work.model.state_dict().items())
    assert all(p.grad is marker[n] for n, p in work.model.named_parameters())


def test_the_plan_cuts_repeated_blocks_and_keeps_what_no_unit_owns_whole():
    from ortlab.demo import gpt

    work = gpt(n_layer=3)
    plan = blockwise.plan(work.model)
    paths = [u.path for u in plan.units]
    assert [p for p in paths if p.startswith("blocks.")] == ["blocks.0", "blocks.1", "blocks.2"]
    assert plan.whole_parameters == ["pos"]  # a Parameter the model holds itself
    assert "3 blocks" not in plan.describe() and "pos" in plan.describe()
    assert plan.largest == max(sum(p.numel() for p in u.module.parameters()) for u in plan.units)


class _Twice(nn.Module):
    """A block that keeps state between calls and refuses a second call in one step: it cannot be replayed alone."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls > 1:
            raise RuntimeError("called twice")
        return torch.tanh(self.lin(x))


def test_a_block_that_cannot_be_replayed_alone_is_named_and_judged_whole():
    torch.manual_seed(0)
    blocks = nn.Sequential(_Twice(), nn.Linear(8, 8))
    blocks.register_forward_pre_hook(lambda module, args: setattr(module[0], "calls", 0))  # once a forward

    def batch(i):
        return torch.randn(4, 8, generator=torch.Generator().manual_seed(i)), torch.randn(4, 8)

    work = Workload(blocks, batch, nn.functional.mse_loss)
    batches = work.micro_batches(work.batch, 0)
    with pytest.raises(reference.NoFloat64, match=r"unit 0 \(_Twice\) cannot be replayed alone"):
        blockwise.step(work, batches, lambda n, g: None)
    pt = Step(0.0, {n: p.detach().clone() for n, p in blocks.named_parameters()})
    measured = float64_distances(work, batches, 0, {PYTORCH: pt, CANDIDATE: pt})
    assert measured.note and "taken whole" in measured.note and "unit 0" in measured.note
    assert measured.how == "float64 step" and set(measured.norms) == {n for n, _ in blocks.named_parameters()}


# --------------------------------------------------------------------------- summaries


def test_a_summary_estimates_the_distance_between_two_gradients():
    """|S(a) - S(b)| estimates |a - b| without bias for any difference (dense, sparse, a single value), to about
    1%; identical tensors are 0 apart; small tensors are kept whole (exact); a non-finite one is infinitely far."""
    g = torch.Generator().manual_seed(0)
    base = torch.randn(300_000, generator=g, dtype=torch.float64)
    errors = []
    for k in range(12):
        mask = torch.rand(base.shape, generator=g) < (0.5, 1e-3, 1e-5)[k % 3]
        e = torch.randn(base.shape, generator=g, dtype=torch.float64) * 1e-6 * mask
        e[k] += 1e-6  # never empty
        d, exact = sketch.distance(sketch.summarize(base + e, "w"), sketch.summarize(base, "w"), "w")
        assert not exact
        errors.append(d / float(e.norm()) - 1)
    assert max(map(abs, errors)) < 0.05, errors
    assert abs(sum(errors) / len(errors)) < 0.02
    same = sketch.summarize(base, "w")
    assert sketch.distance(same, sketch.summarize(base.clone(), "w"), "w")[0] == 0.0
    small = torch.randn(100, generator=g, dtype=torch.float64)
    d, exact = sketch.distance(sketch.summarize(small + 1e-3, "b"), sketch.summarize(small, "b"), "b")
    assert exact and d == pytest.approx(1e-3 * 10, rel=1e-9)
    bad = base.clone()
    bad[5] = float("nan")
    assert sketch.distance(sketch.summarize(bad, "w"), same, "w") == (math.inf, True)
    assert sketch.summarize(base, "w").nbytes() == 8 * sketch.WIDTH


def test_a_summary_is_the_same_on_any_dtype_and_across_chunks():
    """The buckets depend on the position and the parameter's name only: an fp32 gradient and its float64 value
    land in the same buckets (their distance is fp32's rounding), and a tensor longer than a hashing chunk is
    sketched as one."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(sketch._CHUNK + 12_345, generator=g)
    d, _ = sketch.distance(sketch.summarize(x, "w"), x.double(), "w")
    assert d <= 1e-12 * float(x.double().norm())
    whole = sketch.sketch(x.double(), "w")
    parts = sketch.sketch(torch.cat([x[: sketch._CHUNK].double(), torch.zeros(12_345, dtype=torch.float64)]), "w") + \
        sketch.sketch(torch.cat([torch.zeros(sketch._CHUNK, dtype=torch.float64), x[sketch._CHUNK:].double()]), "w")
    assert torch.allclose(whole, parts, rtol=0, atol=1e-9)  # linear
    assert not torch.equal(sketch.sketch(x.double(), "w"), sketch.sketch(x.double(), "v"))  # the name hashes


def _truth(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    truth = {"w": torch.randn(200, 200, generator=g, dtype=torch.float64),
             "b": torch.randn(200, generator=g, dtype=torch.float64)}
    return truth, g


def _noisy(truth, g, sizes):
    return {n: (t + sizes.get(n, 1e-6) * torch.randn(t.shape, generator=g, dtype=torch.float64)).float()
            for n, t in truth.items()}


def _summarized(grads):
    return {n: sketch.summarize(t, n) for n, t in grads.items()}


def test_summaries_reach_the_verdict_whole_gradients_reach_and_say_when_they_cannot():
    truth, g = _truth()
    exact = Step(1.0, truth)
    pt = _noisy(truth, g, {})
    for sizes, diverged in (({"w": 1.5e-6}, False), ({"w": 1e-3}, True), ({"b": 1e-2}, True)):
        other = _noisy(truth, g, sizes)
        whole = compare(Step(1.0, pt), Step(1.0, other), exact=exact)
        summed = compare(Step(1.0, _summarized(pt)), Step(1.0, _summarized(other)), exact=exact)
        assert (not whole.agree) == diverged and (not summed.agree) == diverged, (sizes, summed.rows[0])
        assert not summed.to_dict()["undecided"]
        assert summed.to_dict()["estimated"]  # w is sketched; b (200 values) kept whole
    # right at the line: |other - float64| = 3 times PyTorch's (FACTOR) -> the summary cannot decide
    rows = compare(Step(1.0, pt), Step(1.0, pt), exact=exact).rows
    allowed = next(r for r in rows if r["parameter"] == "w")["allowed"]
    line = {n: t.clone() for n, t in truth.items()}
    direction = torch.randn(truth["w"].shape, generator=g, dtype=torch.float64)
    line["w"] = (truth["w"] + allowed * direction / direction.norm()).float()
    line["b"] = pt["b"].clone()
    check = compare(Step(1.0, _summarized(pt)), Step(1.0, _summarized(line)), exact=exact)
    assert check.to_dict()["undecided"] == ["w"] and check.agree, check.rows


# --------------------------------------------------------------------------- the verdict's honesty


class _Run:
    def __init__(self, path: Path, backend: str, losses: list[float]):
        from ortlab.verdict import state

        self.path, self.backend, self.losses, self.status = path, backend, losses, "ok"
        self.meta = {"config": {"parity": True}}
        path.mkdir()
        (path / state.FILE).write_text(json.dumps({"w": {"kind": "parameter", "dtype": "float32", "numel": 4,
                                                         "module_type": "Linear", "sum": 1.0, "sumsq": 1.0}}))


def test_skipped_gradients_are_never_an_agreement(tmp_path):
    from ortlab.verdict.judge import judge

    pt, ort = _Run(tmp_path / "pt", "pytorch", [2.0, 1.9]), _Run(tmp_path / "ort", "ortmodule", [2.0, 1.9])
    skipped = {"agree": None, "skipped": True, "worst": [], "error": "WorkerOutOfMemory: the worker (pid 7) was "
               "killed for memory by the kernel's OOM killer: it held 10.4 GB at its peak (resident set)"}
    verdict = judge(pt, ort, skipped)
    assert verdict.status == "not judged", str(verdict)
    assert verdict.headline.startswith("not judged: the first step's gradients, the main evidence, were not "
                                       "compared (WorkerOutOfMemory: the worker (pid 7) was killed for memory")
    assert "what was judged agrees: the losses (allclose) and the end state" in verdict.headline
    assert judge(pt, ort, {"agree": True, "judged_by": "allclose", "worst": []}).status == "agree"
    undecided = {"agree": True, "judged_by": "float64", "worst": [], "undecided": ["w"], "estimated": True}
    assert judge(pt, ort, undecided).headline.startswith("not judged: the first step's gradient summaries cannot "
                                                          "decide for 1 parameter (w)")


def test_a_failed_gradient_check_reads_as_not_compared_and_names_the_reason():
    from ortlab.verdict import procedure

    class Broken:
        shell_options = None
        float64 = "auto"

        def evidence(self, *args, **kwargs):
            from ortlab.engine.client import WorkerOutOfMemory

            raise WorkerOutOfMemory("the worker (pid 7) was killed for memory by the kernel's OOM killer")

    from ortlab.engine.config import BurstConfig

    out = procedure.gradient_evidence(Broken(), BurstConfig(backend="pytorch", parity=True), ())
    assert out["skipped"] and out["agree"] is None and "killed for memory" in out["error"]


# --------------------------------------------------------------------------- what the float64 burst costs


def test_the_float64_burst_is_spent_only_where_it_fits():
    from ortlab.verdict import cost

    model = nn.Linear(1000, 1000)  # 1.001M parameters
    need = cost.float64_burst(model, "adamw", activations=None)
    assert need.bytes == 40 * 1_001_000  # 8 weights, 8 gradients, 16 moments, 8 the first step's gradients
    assert cost.float64_burst(model, "sgd", 0).bytes == 32 * 1_001_000
    assert cost.decide(model, "adamw", "cpu", "first-step") == (False, "the float64 burst was not asked for "
                                                                       "(float64 first-step)")
    assert cost.decide(model, "adamw", "cpu", "burst") == (True, None)
    assert cost.decide(model, "adamw", "cpu", "auto") == (True, None)  # 40 MB fit
    huge = cost.decide(model, "adamw", "cpu", "auto", peak={"bytes": 1e15, "device": "cpu"})  # a petabyte
    assert not huge[0] and "the float64 burst would need about" in huge[1] and "spends on it unasked" in huge[1]
    assert cost.decide(nn.Linear(8000, 8000), "adamw", "cpu", "auto")[0] is False  # 64M parameters: 2.6 GB
    from ortlab.engine.types import BurstError

    with pytest.raises(BurstError, match="float64 'bursts' is not allowed; allowed: auto, burst, first-step"):
        cost.decide(model, "adamw", "cpu", "bursts")


def test_the_machine_says_what_it_allows():
    from ortlab.engine import headroom

    allowed, free = headroom.limit(), headroom.available()
    if allowed is None or free is None:
        pytest.skip("this system does not say how much memory it has")
    assert 0 < free <= allowed.bytes * 1.01 and allowed.bytes > 2**28
    me = headroom.peak_resident(os.getpid())
    assert me is not None and me > 2**20
    watch = headroom.Watch(os.getpid())
    assert watch.killed_for_memory("SIGTERM") is None
    assert headroom.gb(10.4e9) == "10.4 GB" and headroom.gb(5e8) == "500 MB"
    unfit = headroom.refuse_unfit(nn.Linear(10, 10), "adamw", torch.device("cpu"), "tiny")
    assert unfit is None


# --------------------------------------------------------------------------- real processes under a memory limit


class Cgroup:
    """A memory cgroup of this process's own (cgroup v1 or v2) with a limit, for one test; skips where none can be
    made (not root, no writable hierarchy)."""

    def __init__(self, limit: int):
        from ortlab.engine import headroom

        dirs = headroom._cgroup_dirs()
        if not dirs:
            pytest.skip("no memory cgroup here")
        self.path = dirs[0] / f"ortlab-test-{os.getpid()}-{time.monotonic_ns()}"
        try:
            self.path.mkdir()
        except OSError as e:
            pytest.skip(f"cannot make a memory cgroup here ({e.strerror})")
        for name in ("memory.max", "memory.limit_in_bytes"):
            if (self.path / name).exists():
                (self.path / name).write_text(str(limit))
                break
        for name in ("memory.swap.max", "memory.memsw.limit_in_bytes"):
            if (self.path / name).exists():
                with contextlib.suppress(OSError):
                    (self.path / name).write_text("0" if name == "memory.swap.max" else str(limit))

    def run(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        """`python -m ortlab.cli ARGS` inside the cgroup (the shell moves itself in, then becomes python)."""
        procs = self.path / "cgroup.procs"
        command = " ".join([f"echo $$ > {procs} &&", "exec", sys.executable, "-m", "ortlab.cli", *args])
        return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=timeout, cwd=ROOT)

    def left(self) -> list[str]:
        return (self.path / "cgroup.procs").read_text().split()

    def close(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.2)


WIDE = ("--model", f"{ROOT / 'tests' / 'factories' / 'wide.py'}:mlp", "--model-arg", "width=4000")


@pytest.mark.slow
@pytest.mark.ort
@pytest.mark.timeout(1200)
def test_out_of_memory_is_named_in_one_line_and_the_verdict_that_fits_still_runs(tmp_path):
    """A 96M-parameter MLP compared on PyTorch and ORTModule in a memory cgroup that holds both bursts but not the
    float64 burst (2.5 GB more): forced to run it, the worker is killed for memory and the verdict says so in its
    headline (not judged, exit 1), nothing left running; left to choose, the verdict skips the float64 burst,
    says what it would cost, and judges."""
    limit = 4_500_000_000  # measured (2 cores, 2026-11-28): 3.3 GB with the float64 burst left out, 5.8 GB with it
    group = Cgroup(limit)
    try:
        common = ("burst", *WIDE, "--backend", "both", "--parity", "--steps", "2", "--no-memory", "--json")
        forced = group.run(*common, "--float64", "burst", "--out", str(tmp_path / "forced"))
        assert forced.returncode == 1, forced.stderr[-3000:]
        data = json.loads(forced.stdout)
        verdict = data["verdicts"]["ortmodule"] if "verdicts" in data else None
        lines = [line for line in forced.stderr.splitlines() if "killed for memory" in line]
        assert lines, forced.stderr[-3000:]
        assert "not judged: the first step's gradients, the main evidence, were not compared" in lines[0]
        assert "GB at its peak" in lines[0] and "the limit is 4.5 GB" in lines[0]
        if verdict is not None:
            assert verdict["status"] == "not judged"
        assert not group.left()  # no worker left behind
        chosen = group.run(*common, "--out", str(tmp_path / "auto"))
        assert chosen.returncode in (0, 1), chosen.stderr[-3000:]
        judged = [json.loads((p / "verdict.json").read_text()) for p in (tmp_path / "auto").iterdir()
                  if (p / "verdict.json").is_file()]
        assert judged and judged[0]["status"] in ("agree", "diverged"), judged
        assert any("the float64 burst would need about" in n for n in judged[0]["notes"]), judged[0]["notes"]
        assert not group.left()
    finally:
        group.close()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_model_too_large_for_the_machine_is_refused_before_its_burst(tmp_path):
    group = Cgroup(3_000_000_000)  # holds the 200M-parameter model and its snapshot (1.6 GB), not its training
    try:
        r = group.run("burst", *WIDE, "--model-arg", "width=5000", "--model-arg", "depth=8", "--backend", "pytorch",
                      "--steps", "1", "--no-memory", "--out", str(tmp_path))
        assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
        line = [s for s in r.stderr.splitlines() if "cannot train here" in s]
        assert len(line) == 1 and "200M parameters" in line[0] and "needs at least" in line[0], r.stderr[-2000:]
        assert not any(p.is_dir() and (p / "metrics.jsonl").exists() for p in tmp_path.iterdir())
        assert not group.left()
    finally:
        group.close()


@pytest.mark.parametrize("factory", ["ortlab.demo.families:gpt2", "ortlab.demo.families:llama"])
def test_the_float64_step_keeps_float64_where_the_model_upcasts_to_float32(factory):
    """Hugging Face's causal-LM loss calls logits.float() and Llama's RMSNorm .to(torch.float32): on float64 tensors
    those are downcasts, which would put the yardstick's loss and norms in fp32. Inside the float64 step they stay
    float64: the loss is no float32 number, whole and block by block alike."""
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    work = ModelRef.of(factory).build()
    batches = work.micro_batches(work.batch, 0)
    whole = reference.step(work, batches)
    assert float(torch.tensor(whole.loss, dtype=torch.float32)) != whole.loss
    assert blockwise.step(work, batches, lambda n, g: None) == whole.loss


@pytest.mark.slow
def test_a_run_keeps_summaries_unless_asked_and_either_is_judged_alike(tmp_path):
    """A parity burst keeps its first step summarized (first_step_summary.pt); with evidence "full" its gradients
    whole too. The same two folders (a torch.compile run that lowers one op wrong, its weight matrices sketched)
    judged from either reach the same verdict, the summaries' distances within a few % of the whole gradients'."""
    import shutil

    import ortlab
    from ortlab.engine.session import Session
    from ortlab.runs.evidence import GRADIENTS, SUMMARY

    model = f"{ROOT / 'tests' / 'factories' / 'compile_differs.py'}:model"  # compile lowers one op wrong
    with Session(model, {"width": 2048}, out=tmp_path / "runs", in_process=True) as s:
        pt = s.burst("pytorch", 2, parity=True, progress=False, evidence="full")
        other = s.burst("compile", 2, parity=True, progress=False, evidence="full")
        plain = s.burst("pytorch", 2, parity=True, progress=False)
    assert (plain.path / SUMMARY).is_file() and not (plain.path / GRADIENTS).exists()
    assert all((r.path / SUMMARY).is_file() and (r.path / GRADIENTS).is_file() for r in (pt, other))
    whole = ortlab.judge_runs(pt.path, other.path, out=tmp_path / "whole")[0].verdict
    assert whole.gradients["judged_by"] == "float64", whole.headline
    for run in (pt, other):
        shutil.move(run.path / GRADIENTS, tmp_path / f"{run.backend}-{GRADIENTS}")
    summed = ortlab.judge_runs(pt.path, other.path, out=tmp_path / "summed")[0].verdict
    assert summed.status == whole.status, (summed.headline, whole.headline)
    assert summed.gradients["estimated"] and not whole.gradients["estimated"]
    a = {r["parameter"]: r for r in whole.gradients.get("distances") or whole.gradients["worst"]}
    b = {r["parameter"]: r for r in summed.gradients.get("distances") or summed.gradients["worst"]}
    for name in set(a) & set(b):
        for key in ("to_float64", "pytorch_to_float64"):
            if a[name].get(key):
                assert b[name][key] == pytest.approx(a[name][key], rel=0.05), (name, key)


def test_without_float64_the_end_state_is_judged_together_per_kind():
    """Judged against the noise pair (no float64 burst at this size), the end state's float tensors are judged
    together per kind, as float64 judges them: one of 148 tensors 15 times the pair's spread by chance (what GPT-2
    small's end state showed ORTModule, which trains it right) is no divergence; one tensor 1% off is, named."""
    from ortlab.verdict import state

    g = torch.Generator().manual_seed(0)

    def entry(total: float) -> dict:
        return {"kind": "parameter", "dtype": "float32", "numel": 1000, "module_type": "Linear", "sum": total,
                "sumsq": 1000.0}

    base = {f"h.{i}.w": entry(10.0) for i in range(148)}  # distance: a sum moved by d is d / 1000 of the tensor
    chaos = torch.randn(148, generator=g, dtype=torch.float64).abs() * 1e-6
    noise = {n: entry(10.0 + float(chaos[i]) * 1000) for i, n in enumerate(base)}
    ort = {n: entry(10.0 + float(chaos[i]) * 1000 * (2 if i else 15)) for i, n in enumerate(base)}
    assert state.differing(base, ort, noise) == []
    wrong = {**ort, "h.7.w": entry(11.0)}  # 10% off
    named = [d["name"] for d in state.differing(base, wrong, noise)]
    assert named[0] == "h.7.w", named


class _Rotary(nn.Module):
    """transformers 5.17's Llama rotary frequencies, in miniature: a buffer moved with .to(device=, dtype=float32)
    and positions made .float(), multiplied as matrices (a matmul does not promote: float32 @ float64 raises)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 8, 2, dtype=torch.float) / 8)))
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        positions = torch.arange(x.shape[0], device=x.device)[None, :]
        freqs = self.inv_freq[:, None].to(device=x.device, dtype=torch.float) @ positions.float()
        return self.lin(x + freqs.t().cos().to(x.dtype).sum(-1, keepdim=True, dtype=torch.float32))


def test_the_float64_burst_leaves_the_optimizers_own_tensors_as_torch_makes_them():
    """The float64 keeper holds the model's forward and backward, not the optimizer's step: AdamW's step counters
    stay float32 as torch makes them (inside the keeper they became float64, and CUDA's fused AdamW then gave NaN:
    every float64 burst on an H200 did, 2026-11-28); the burst's losses and end state are finite."""
    from ortlab.engine.sampling import Feed
    from ortlab.runs.snapshot import Snapshot

    torch.manual_seed(0)
    work = ModelRef.of("ortlab.demo:gpt").build()
    seen: list[set] = []
    step = work.optimizer_step

    def spying(model, optimizer, scheduler, scaler=None):
        step(model, optimizer, scheduler, scaler)
        seen.append({s["step"].dtype for s in optimizer.state.values() if "step" in s}
                    | {torch.zeros((), dtype=torch.float32).dtype})

    work.optimizer_step = spying
    run, _ = reference.burst(work, Feed(work), Snapshot.take(work.model), "adamw", 1e-3, 2)
    assert seen and all(dtypes == {torch.float32} for dtypes in seen), seen
    assert all(math.isfinite(x) for x in run["losses"])
    assert all(math.isfinite(e["sum"]) for e in run["state"].values())


def test_inside_the_float64_step_every_request_for_float32_is_float64():
    """.float(), .to(device=..., dtype=torch.float), a dtype= keyword: all float64 inside the step, so a model's own
    upcasts neither downcast the yardstick nor mix float32 into a float64 matmul (what failed on an H200 with
    transformers 5.17's Llama, 2026-11-28)."""
    torch.manual_seed(0)
    work = Workload(_Rotary(), lambda i: (torch.randn(6, 4, generator=torch.Generator().manual_seed(i)),
                                          torch.randn(6, 4)), nn.functional.mse_loss)
    batches = work.micro_batches(work.batch, 0)
    whole = reference.step(work, batches)
    got = {}
    assert blockwise.step(work, batches, lambda n, g: got.__setitem__(n, g)) == whole.loss
    assert all(g.dtype == torch.float64 for g in got.values())
    with reference.keep_float64():
        assert torch.ones(2).to(device="cpu", dtype=torch.float32).dtype == torch.float64
        assert torch.arange(3, dtype=torch.float).dtype == torch.float64
        assert torch.ones(2, dtype=torch.float64).to(torch.ones(1)).dtype == torch.float32  # like another tensor


def test_a_bad_evidence_or_float64_mode_is_refused_in_one_line_before_anything_runs(tmp_path):
    from ortlab.engine.config import BurstConfig
    from ortlab.engine.session import Session
    from ortlab.engine.types import BurstError

    with pytest.raises(BurstError, match=r"^evidence 'whole' is not allowed; allowed: summary, full"):
        BurstConfig(backend="pytorch", evidence="whole")
    with pytest.raises(BurstError, match=r"^float64 'always' is not allowed; allowed: auto, burst, first-step"):
        Session(out=tmp_path, in_process=True, float64="always")
    assert not any(tmp_path.iterdir())  # nothing was started or written
    done = subprocess.run([sys.executable, "-m", "ortlab.cli", "burst", "--float64", "always"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2 and "invalid choice: 'always'" in done.stderr
