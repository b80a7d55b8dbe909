"""Distributed bursts: real ranks started by torch's elastic launcher over gloo on the CPU (no mocks). Tiny
demo (1 layer, d_model 32), 2-3 steps: the machine has 2 cores."""

import json
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from ortlab import Session
from ortlab.engine.config import BurstConfig, BurstError
from ortlab.runs.run import load_run
from ortlab.runs.snapshot import Snapshot

TINY = {"n_layer": 1, "d_model": 32, "seq_len": 16, "batch_size": 4}
FACTORIES = Path(__file__).parent / "factories"


def tiny_session(tmp_path, model=None, **kwargs) -> Session:
    return Session(model, {**TINY, **kwargs}, out=tmp_path / "runs")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- arguments (no ranks)


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"optimizer": "zero1"}, "zero1"),
    ({"save_checkpoint": True}, "save_checkpoint"),
    ({"nproc": 0}, "nproc"),
    ({"nnodes": 2}, "rdzv_endpoint"),
    ({"nnodes": 2, "node_rank": 2, "rdzv_endpoint": "h:1"}, "node_rank"),
    ({"nproc": 2, "rdzv_endpoint": "nohost"}, "HOST:PORT"),
])
def test_bad_rank_arguments_are_refused_naming_what_is_allowed(kwargs, words):
    with pytest.raises(BurstError, match=words):
        BurstConfig(**kwargs)


def test_what_every_rank_would_refuse_is_refused_before_launching(tmp_path):
    with tiny_session(tmp_path) as s, pytest.raises(BurstError, match="fp16"):
        s.burst("pytorch", 1, nproc=2, precision="fp16", device="cpu", progress=False)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_single_process_config_is_unchanged():
    cfg = BurstConfig(backend="pytorch")
    assert not cfg.distributed and cfg.world_size == 1
    assert BurstConfig.from_dict(cfg.to_dict()) == cfg


def test_a_rank_that_fails_before_its_burst_records_its_stack(tmp_path):
    """A rank whose process group cannot form (no rendezvous address) writes its failed run folder itself: with the
    stack it ran on, as every run's meta.json has it."""
    import os

    from ortlab.stacks.table import this_stack

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"run": str(tmp_path / "run"), "timeout_s": 5,
                                "config": BurstConfig(backend="pytorch", device="cpu").to_dict()}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MASTER_")} | {"RANK": "0", "WORLD_SIZE": "1"}
    r = subprocess.run([sys.executable, "-m", "ortlab.engine.ranks", str(spec)], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    rank = load_run(tmp_path / "run" / "ranks" / "0")
    assert rank.status == "failed" and "the process group did not form" in rank.error, rank.error
    assert rank.meta["stack"] == {"name": str(this_stack()), "python": sys.executable,
                                  "lock": os.environ.get("ORTLAB_LOCK")}


# -- ranks


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """A 2-rank DDP AdamW burst with a checkpoint (shared: rank startup costs seconds on 2 cores)."""
    with tiny_session(tmp_path_factory.mktemp("ddp")) as s:
        return s.burst("pytorch", 3, nproc=2, progress=False, save_checkpoint=True)


@pytest.mark.slow
def test_two_rank_ddp_burst_keeps_every_rank_in_sync_and_saves_a_loadable_checkpoint(ddp_run, tmp_path):
    run = ddp_run
    assert run.status == "ok", run.error
    assert run.meta["nproc"] == 2 and run.meta["in_sync"] is True
    assert [r["rank"] for r in run.meta["ranks"]] == [0, 1]
    for row in run.meta["ranks"]:
        assert row["status"] == "ok" and row["steps"] == 3
        assert row["final_loss"] > 0 and row["median_step_s"] > 0 and row["peak_mem_mb"] > 0
    # the run's metrics are rank 0's, each step checked in sync; each rank saw its own data
    assert len(run.metrics) == 3 and run.metrics["in_sync"].all()
    rank0, rank1 = run.ranks
    assert rank0.losses == run.losses and rank0.losses != rank1.losses
    assert (rank1.path / "log.txt").is_file() and rank1.meta["rank"] == 1
    summary = run.summary()
    assert summary["ranks"] == run.meta["ranks"] and summary["checkpoint"] == str(run.path / "checkpoint.pt")
    weights = torch.load(summary["checkpoint"], weights_only=True)["model"]
    assert all(t.dtype == torch.float32 for t in weights.values() if t.is_floating_point())
    # the checkpoint is the next session's snapshot: it starts where the burst ended
    with Session(None, TINY, out=tmp_path / "next", in_process=True, snapshot=summary["checkpoint"]) as s2:
        s2.burst("pytorch", 1, progress=False)
        start = s2._engine.initial.model
    assert all(torch.equal(start[k], weights[k]) for k in weights)


@pytest.mark.slow
def test_zero1_ends_with_the_same_weights_as_ddp_adamw_and_holds_less_optimizer_state(ddp_run, tmp_path):
    with tiny_session(tmp_path) as s:
        zero = s.burst("pytorch", 3, nproc=2, optimizer="zero1", progress=False, save_checkpoint=True)
    ddp = ddp_run
    assert ddp.status == "ok" and zero.status == "ok", (ddp.error, zero.error)
    a = Snapshot.load(ddp.meta["checkpoint"]).model
    b = Snapshot.load(zero.meta["checkpoint"]).model
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=name)
    assert zero.meta["in_sync"] is True
    for full, shard in zip(ddp.meta["ranks"], zero.meta["ranks"], strict=True):
        assert 0 < shard["optimizer_state_bytes"] < full["optimizer_state_bytes"]
    assert sum(r["optimizer_state_bytes"] for r in zero.meta["ranks"]) == pytest.approx(
        ddp.meta["ranks"][0]["optimizer_state_bytes"], rel=0.05)


@pytest.mark.slow
def test_a_rank_whose_weights_drift_is_out_of_sync_from_the_next_step_with_the_parameter_named(tmp_path):
    with tiny_session(tmp_path, f"{FACTORIES / 'ranks.py'}:drifts", rank=1, step=1) as s:
        run = s.burst("pytorch", 3, nproc=2, progress=False)
    assert run.status == "ok", run.error
    assert run.meta["in_sync"] is False
    assert run.metrics["in_sync"].tolist() == [True, True, False]  # step 2 begins with rank 1's nudged weight
    bad = run.meta["out_of_sync"]
    assert bad["step"] == 2 and bad["parameter"] == "head.weight"
    assert bad["checksums"]["0"] != bad["checksums"]["1"]
    assert run.metrics["started_s"].is_monotonic_increasing and run.metrics["started_s"].iloc[0] == 0


@pytest.mark.slow
@pytest.mark.ort
def test_a_rank_that_dies_ends_the_burst_with_that_rank_named_and_its_log_kept(tmp_path):
    with tiny_session(tmp_path, f"{FACTORIES / 'ranks.py'}:killed", rank=1, step=1) as s:
        run = s.burst("pytorch", 3, nproc=2, progress=False)
    assert run.status == "crashed"
    assert run.meta["failed_rank"] == 1
    assert "rank 1 died (signal SIGKILL)" in run.error and "ranks/1/log.txt" in run.error
    statuses = {r["rank"]: r["status"] for r in run.meta["ranks"]}
    assert statuses == {0: "stopped", 1: "crashed"}
    assert (run.path / "ranks" / "1" / "log.txt").is_file()


@pytest.mark.slow
def test_a_rank_that_fails_names_its_error_and_the_others_are_stopped(tmp_path):
    with tiny_session(tmp_path, f"{FACTORIES / 'ranks.py'}:raises", rank=1, step=1) as s:
        run = s.burst("pytorch", 3, nproc=2, progress=False)
    assert run.status == "failed" and run.meta["failed_rank"] == 1
    assert run.error.startswith("rank 1: pytorch burst failed in data at step 1: RuntimeError: bad batch on purpose")
    assert "the other ranks were stopped" in run.error
    assert [r["status"] for r in run.meta["ranks"]] == ["stopped", "failed"]
    assert "bad batch on purpose" in (run.path / "ranks" / "1" / "log.txt").read_text()


@pytest.mark.slow
def test_a_rank_that_hangs_is_named_after_the_collective_timeout(tmp_path, monkeypatch):
    from ortlab.engine import launch

    monkeypatch.setattr(launch, "COLLECTIVE_TIMEOUT_S", 8.0)
    with tiny_session(tmp_path, f"{FACTORIES / 'ranks.py'}:hangs", rank=1, step=1) as s:
        run = s.burst("pytorch", 3, nproc=2, progress=False)
    assert run.status == "failed" and run.meta["failed_rank"] == 1
    assert run.error.startswith("rank 1 hung in step 1: the other ranks waited 8 s for it in a collective")
    rows = {r["rank"]: r for r in run.meta["ranks"]}
    assert rows[0]["status"] == "stopped" and "timed out" in rows[0]["error"].lower()


@pytest.mark.slow
@pytest.mark.interrupt
def test_stop_ends_every_rank_after_the_same_step(tmp_path):
    with tiny_session(tmp_path, f"{FACTORIES / 'slow_steps.py'}:slow", delay=0.5) as s:
        def stop_after_first(row):
            if row["step"] == 0:
                threading.Thread(target=s.stop).start()

        run = s.burst("pytorch", 50, nproc=2, progress=False, on_step=stop_after_first)
    assert run.status == "interrupted", run.error
    ranks = run.meta["ranks"]
    assert {r["status"] for r in ranks} == {"interrupted"}
    assert ranks[0]["steps"] == ranks[1]["steps"] < 50


@pytest.mark.slow
def test_two_nodes_on_one_machine_form_one_job(tmp_path):
    endpoint = f"127.0.0.1:{free_port()}"
    runs = {}

    def node(rank):
        with tiny_session(tmp_path / f"node{rank}") as s:
            runs[rank] = s.burst("pytorch", 2, nproc=1, nnodes=2, node_rank=rank, rdzv_endpoint=endpoint,
                                 optimizer="zero1", progress=False)

    threads = [threading.Thread(target=node, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert set(runs) == {0, 1}
    assert [r.status for r in runs.values()] == ["ok", "ok"], [r.error for r in runs.values()]
    global_ranks = sorted(row["rank"] for r in runs.values() for row in r.meta["ranks"])
    assert global_ranks == [0, 1]  # each launch holds its own rank's folder
    assert all(r.meta["in_sync"] and r.meta["nnodes"] == 2 for r in runs.values())
    assert all(r.losses == r.ranks[0].losses and len(r.losses) == 2 for r in runs.values())


@pytest.mark.slow
@pytest.mark.ort
def test_cli_compare_two_ranks_reports_ranks_per_backend(tmp_path):
    """ORTModule inside DDP on every rank, parity mode across ranks; --json names each backend's ranks."""
    args = [sys.executable, "-m", "ortlab.cli", "burst", "--backend", "both", "--steps", "2", "--nproc", "2",
            "--parity", "--no-memory", "--json", "--out", str(tmp_path / "runs")]
    for key, value in TINY.items():
        args += ["--model-arg", f"{key}={value}"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    for backend in ("pytorch", "ortmodule"):
        assert report[backend]["status"] == "ok"
        assert report[backend]["in_sync"] is True
        assert [r["rank"] for r in report[backend]["ranks"]] == [0, 1]
    assert report["max_loss_diff"] < 1e-4
    ort = load_run(report["ortmodule"]["path"])
    assert ort.ranks[1].read_json("ort.json")["exported"] is True
    assert ort.transitions["action"].tolist() == ["wrap"]
    from ortlab.comparison.summary import Comparison

    table = str(Comparison(load_run(report["pytorch"]["path"]), ort))  # what `ortlab burst` prints without --json
    assert re.search(r"^ranks\s+2\s+2$", table, re.M) and re.search(r"^in sync\s+yes\s+yes$", table, re.M), table
    assert re.search(r"^strategy\s+ddp\s+ddp$", table, re.M), table
