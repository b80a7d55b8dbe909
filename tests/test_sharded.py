"""Strategies (single, ddp, zero1, fsdp2) and a distributed run judged against one process of the same global batch
(ortlab.verdict.sharded). The refusals and the pieces run in the fast tier; the real 2-rank gloo bursts on the CPU
are slow (a rank starts in seconds on 2 cores)."""

from pathlib import Path

import pytest
import torch

from ortlab import Session
from ortlab.engine.config import BurstConfig, BurstError, fsdp2_cpu_missing, fully_shard_missing

TINY = {"n_layer": 1, "d_model": 32, "seq_len": 16, "batch_size": 4}
RANKS = str(Path(__file__).parent / "factories" / "ranks.py")


# -- a strategy of its own (no ranks)


def test_the_default_strategy_keeps_what_runs_meant():
    assert BurstConfig(backend="pytorch").strategy == "single"
    assert BurstConfig(backend="pytorch", nproc=2).strategy == "ddp"
    zero1 = BurstConfig(backend="pytorch", nproc=2, optimizer="zero1")
    assert zero1.strategy == "zero1" and BurstConfig(backend="pytorch", nproc=2, strategy="zero1") == zero1
    old = {k: v for k, v in BurstConfig(backend="pytorch", nproc=2).to_dict().items() if k != "strategy"}
    assert BurstConfig.from_dict(old).strategy == "ddp"  # a run folder written before strategies
    assert BurstConfig.from_dict(zero1.to_dict()) == zero1


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"strategy": "fsdp2"}, r"needs nproc \* nnodes >= 2"),
    ({"strategy": "ddp"}, r"needs nproc \* nnodes >= 2"),
    ({"nproc": 2, "strategy": "single"}, "allowed with several: ddp, zero1, fsdp2"),
    ({"nproc": 2, "strategy": "zero1", "optimizer": "sgd"}, "zero1 shards AdamW"),
    ({"nproc": 2, "strategy": "ddp", "optimizer": "zero1"}, "optimizer zero1 is strategy zero1 with AdamW"),
    ({"nproc": 2, "strategy": "fsdp3"}, "allowed: single, ddp, zero1, fsdp2"),
    ({"nproc": 2, "strategy": "ddp", "sync_batchnorm": "yes"}, "sync_batchnorm"),
])
def test_a_strategy_that_cannot_run_is_refused_in_one_line(kwargs, words):
    with pytest.raises(BurstError, match=words) as e:
        BurstConfig(backend="pytorch", **kwargs)
    assert "\n" not in str(e.value)


def test_fsdp2_is_refused_for_ortmodule_and_where_torch_cannot_run_it():
    with pytest.raises(BurstError, match=r"strategy 'fsdp2' cannot run backend 'ortmodule'.*single, ddp, zero1"):
        BurstConfig(backend="ortmodule", nproc=2, strategy="fsdp2")  # before whether ORTModule runs here
    with pytest.raises(BurstError, match="save_checkpoint with strategy 'fsdp2'"):
        BurstConfig(backend="pytorch", nproc=2, strategy="fsdp2", save_checkpoint=True)
    if fully_shard_missing() or fsdp2_cpu_missing():
        with pytest.raises(BurstError, match=r"strategy 'fsdp2' .*torch"):
            BurstConfig(backend="pytorch", nproc=2, strategy="fsdp2", device="cpu")
    else:
        assert BurstConfig(backend="pytorch", nproc=2, strategy="fsdp2", device="cpu").strategy == "fsdp2"


def test_a_refused_strategy_starts_no_rank(tmp_path):
    with Session(None, TINY, out=tmp_path / "runs") as s, pytest.raises(BurstError, match="strategy 'single'"):
        s.burst("pytorch", 1, nproc=2, strategy="single", device="cpu", progress=False)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_cli_strategy_is_a_burst_and_compare_argument():
    from ortlab.cli import build_parser
    from ortlab.cli.burst import burst_kwargs

    for command in ("burst", "compare"):
        args = build_parser().parse_args([command, "--nproc", "2", "--strategy", "fsdp2", "--no-reshard-after-forward",
                                          "--sync-batchnorm"])
        kwargs, _ = burst_kwargs(args)
        assert (kwargs["strategy"], kwargs["reshard_after_forward"], kwargs["sync_batchnorm"]) == ("fsdp2", False, True)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["burst", "--strategy", "zero3"])


def test_judging_one_folder_that_is_no_distributed_run_is_refused_in_one_line(tmp_path, capsys):
    from ortlab.cli import main

    folder = tmp_path / "20261128-000000-pytorch"
    folder.mkdir()
    (folder / "meta.json").write_text('{"backend": "pytorch", "status": "ok", "config": {}}')
    assert main(["judge", str(folder)]) == 2
    assert "is not a distributed run (no ranks/ folder)" in capsys.readouterr().err


def test_fsdp2_shards_each_block_a_container_s_items_and_leaves_tied_weights_to_the_root():
    from ortlab.demo import gpt
    from ortlab.engine.sharding import blocks

    model = gpt(n_layer=2, d_model=32, seq_len=16).model
    assert blocks(model) == ["tok", "blocks.0", "blocks.1", "ln_f", "head"]
    model.head.weight = model.tok.weight  # tied: neither is a block of its own
    assert blocks(model) == ["blocks.0", "blocks.1", "ln_f"]
    assert blocks(model, ["blocks.1"]) == ["blocks.1"]
    with pytest.raises(BurstError, match=r"'nope'.*named_modules"):
        blocks(model, ["nope"])


def test_the_global_batch_is_every_rank_s_batch_in_rank_order():
    from ortlab.demo import gpt
    from ortlab.verdict.sharded import GlobalFeed, concatenated

    w = gpt(**TINY)
    inputs, target = GlobalFeed(w, None, 2, 0).batch(3)
    assert torch.equal(inputs, torch.cat([w.batch(6)[0], w.batch(7)[0]]))
    assert torch.equal(target, torch.cat([w.batch(6)[1], w.batch(7)[1]]))
    joined = concatenated([({"x": torch.ones(2), "n": 3}, torch.zeros(2)),
                           ({"x": torch.ones(1), "n": 3}, torch.zeros(1))])
    assert joined[0]["x"].shape == (3,) and joined[0]["n"] == 3
    with pytest.raises(ValueError, match="different int"):
        concatenated([{"n": 3}, {"n": 4}])


# -- ranks simulated in one process (torch's LocalTensorMode, the current stack)


def _simulated_ddp_step(workload, world=2):
    """The first step of `world` DDP ranks simulated in this process: each rank's batch (ortlab's share), its
    backward, the gradients all-reduced and averaged as DDP does; rank 0's Step and the global loss."""
    import torch.distributed as dist
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from ortlab.engine.sampling import Feed
    from ortlab.verdict.gradients import Step

    shares = [Feed(workload, None, world, r).batch(0) for r in range(world)]
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        with LocalTensorMode(world) as mode:
            inputs = mode.rank_map(lambda r: shares[r][0])
            target = mode.rank_map(lambda r: shares[r][1])
            loss = workload.forward_loss(workload.model, inputs, target)
            loss.backward()
            grads = {}
            for name, p in workload.model.named_parameters():
                dist.all_reduce(p.grad)
                grads[name] = (p.grad / world)._local_tensors[0]
            losses = [float(loss._local_tensors[r]) for r in range(world)]
    finally:
        dist.destroy_process_group()
    for p in workload.model.parameters():
        p.grad = None
    return Step(sum(losses) / world, grads)


@pytest.mark.parametrize(("factory", "kwargs", "agree"), [
    ("plain_cnn", {}, True),
    ("plain_cnn", {"sum_loss": True}, False),  # each rank's gradient of its half's sum, averaged: 1/2
    ("batch_norm_cnn", {}, False),  # each rank normalizes its own half
])
def test_simulated_ddp_ranks_are_judged_against_one_process_of_the_global_batch(factory, kwargs, agree):
    pytest.importorskip("torch.distributed._local_tensor", reason="LocalTensorMode is not in this torch")
    from ortlab.verdict.gradients import judged_steps, step
    from ortlab.verdict.sharded import GlobalFeed
    from ortlab.workload import ModelRef

    torch.manual_seed(0)
    workload = ModelRef.of(f"{RANKS}:{factory}", **kwargs).build()
    ranks = _simulated_ddp_step(workload)
    batches = workload.micro_batches(GlobalFeed(workload, None, 2, 0).batch, 0)
    one = step(workload, batches)
    check = judged_steps(workload, batches, 0, (), one, ranks)
    assert check.agree is agree, check.rows[:2]


# -- real ranks: 2 processes over gloo on the CPU


def _judged(tmp_path, model, kwargs, steps=3, **burst):
    with Session(model, kwargs, out=tmp_path / "runs") as s:
        run = s.burst("pytorch", steps, nproc=2, parity=True, device="cpu", progress=False, **burst)
    from ortlab.verdict.judge import Verdict

    assert run.status == "ok", run.error
    return run, Verdict.from_dict(run.read_json("verdict.json"))


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "zero1"])
def test_the_demo_under_ddp_and_zero1_agrees_with_one_process_of_the_global_batch(tmp_path, strategy):
    run, verdict = _judged(tmp_path, None, TINY, strategy=strategy)
    assert verdict.status == "agree", verdict
    assert f"against one process of the same global batch, 2 ranks, {strategy}" in verdict.headline
    assert verdict.losses["judged"] and verdict.state["count"] == 0 and verdict.gradients["agree"]
    assert run.meta["strategy"] == strategy and all(r.meta["strategy"] == strategy for r in run.ranks)
    assert (run.path / "one-process" / "final_state.json").is_file()
    if strategy == "ddp":  # its folder judged again, by another process
        from ortlab.cli import main

        assert main(["judge", str(run.path), "--json"]) == 0


@pytest.mark.slow
def test_batch_norm_under_ddp_diverges_with_per_rank_statistics_named_and_sync_batchnorm_verified(tmp_path):
    _, verdict = _judged(tmp_path, f"{RANKS}:batch_norm_cnn", {})
    assert verdict.diverged, verdict
    assert verdict.losses["judged_by"] == "float64" and verdict.losses["members"], verdict.losses  # beyond fp32's
    # ensemble on the global batch, not one fp32 process alone
    cause = verdict.causes[0]
    assert cause["cause"] == "batch norm" and "per-rank normalization statistics" in cause["text"], verdict
    assert cause["verified"] is True and "verified: with it the run agrees" in cause["text"], cause
    _, fixed = _judged(tmp_path, f"{RANKS}:batch_norm_cnn", {}, sync_batchnorm=True)
    assert fixed.status == "agree", fixed


@pytest.mark.slow
def test_a_sum_reduced_loss_meeting_ddp_s_averaging_is_named(tmp_path):
    _, verdict = _judged(tmp_path, f"{RANKS}:plain_cnn", {"sum_loss": True}, steps=2)
    assert verdict.diverged, verdict
    assert verdict.causes[0]["cause"] == "reduction" and "1/2 of one process's" in verdict.causes[0]["text"]


@pytest.mark.slow
@pytest.mark.skipif(bool(fully_shard_missing() or fsdp2_cpu_missing()), reason="FSDP2 does not run on this torch's CPU")
def test_fsdp2_on_the_demo_agrees_with_one_process_of_the_global_batch(tmp_path):
    run, verdict = _judged(tmp_path, None, TINY, strategy="fsdp2")
    assert verdict.status == "agree", verdict
    assert "fsdp2" in verdict.headline
    assert [r.meta["fsdp2_units"] for r in run.ranks] == [["tok", "blocks.0", "ln_f", "head"]] * 2


@pytest.mark.slow
@pytest.mark.ort
def test_ortmodule_under_ddp_is_judged_against_one_pytorch_process_of_the_global_batch(tmp_path):
    with Session(None, TINY, out=tmp_path / "runs") as s:
        run = s.burst("ortmodule", 2, nproc=2, parity=True, device="cpu", progress=False)
    from ortlab.verdict.judge import Verdict

    assert run.status == "ok", run.error
    verdict = Verdict.from_dict(run.read_json("verdict.json"))
    assert verdict.status == "agree", verdict
    assert verdict.headline.endswith("(against one process of the same global batch, 2 ranks, ddp)")
    assert verdict.gradients["agree"] and verdict.losses["judged"] and verdict.state["count"] == 0


@pytest.mark.slow
@pytest.mark.parametrize(("factory", "cause", "words"), [
    ("other_data", "other data", "rank 1 saw other data than its share of the global batch from step 0"),
    ("drifts", "out of sync", "parameters out of sync: the ranks hold different values (from step 2, head.weight"),
])
def test_a_rank_that_saw_other_data_or_drifted_is_named(tmp_path, factory, cause, words):
    _, verdict = _judged(tmp_path, f"{RANKS}:{factory}", TINY)
    named = [c for c in verdict.causes if c.get("cause") == cause]
    assert named and words in named[0]["text"], verdict


# -- the one-process reference: replayed once for every run of the same snapshot, global batches and training


def test_the_one_process_replays_are_made_once_per_snapshot_global_batches_and_training():
    from dataclasses import replace

    from ortlab.engine.loop import Engine
    from ortlab.verdict import sharded
    from ortlab.workload import ModelRef

    engine = Engine(ModelRef.of("ortlab.demo:gpt", **TINY))
    cfg = BurstConfig(backend="pytorch", steps=1, nproc=2, parity=True, device="cpu", optimizer="adamw")
    key = sharded.ahead(engine, cfg, "auto")["key"]  # made while the ranks run: for the run judged first
    first, reused = sharded.replays(engine, cfg, "auto", "ddp-run")
    assert not reused and first["for"] == "ddp-run" and first["key"] == key and len(first["fp32"]["losses"]) == 1
    assert "float64" not in first  # made where a run is not allclose to fp32 (sharded.arbiter), then kept too
    sharded.arbiter(engine, cfg, first, "auto", "bn-run")
    assert len(first["float64"]["losses"]) == 1 and first["float64_for"] == "bn-run"
    for same in (replace(cfg, name="fixed", sync_batchnorm=True), replace(cfg, strategy="zero1"),
                 replace(cfg, backend="compile")):
        again, reused = sharded.replays(engine, same, "auto", "other-run")
        assert reused and again is first and again["for"] == "ddp-run"
    for other in (replace(cfg, lr=cfg.lr * 2), replace(cfg, steps=2), replace(cfg, seed=1)):
        made, reused = sharded.replays(engine, other, "auto", "other-run")
        assert not reused and made["for"] == "other-run"


@pytest.mark.slow
@pytest.mark.ort
def test_a_distributed_comparison_replays_its_one_process_reference_once(tmp_path):
    from ortlab.runs.files import read_json

    with Session(None, TINY, out=tmp_path / "runs") as s:
        comparison = s.compare(2, backends="pytorch,ortmodule", nproc=2, parity=True, device="cpu", progress=False)
    runs = comparison.runs
    assert [r.status for r in runs] == ["ok", "ok"], [r.error for r in runs]
    made = [read_json(r.path / "one-process" / "replays.json") for r in runs]
    assert "fp32" in made[0]["made"] and "fp32" not in made[1]["made"], made  # for the first, reused by the second
    replayed = made[0]["made"] + made[1]["made"]
    assert len(replayed) == len(set(replayed)), made  # the float64 one too, where either needed it
    assert {m["for"] for m in made} == {runs[0].path.name} and made[0]["key"] == made[1]["key"]
    assert f"the replays made for {runs[0].path.name}" in " ".join(comparison.verdict_of("ortmodule").notes)
