"""Load-balanced sampling: the demo's variable-length mode, workloads with a dataset, the two samplers and the
load and imbalance figures. The samplers' batches are checked without ranks (they are plain data); the slow tests
run real 2-rank bursts over gloo."""

import hashlib
import subprocess
import sys

import pytest
import torch
from torch.nn import functional as F

import ortlab
from ortlab import Session
from ortlab.demo import gpt
from ortlab.engine.balance import step_fields
from ortlab.engine.config import BurstConfig, BurstError
from ortlab.engine.sampling import Feed
from ortlab.workload import Workload, WorkloadError

TINY = {"n_layer": 1, "d_model": 32, "seq_len": 16, "batch_size": 4}
VARIABLE = {"n_layer": 1, "d_model": 32, "seq_len": 32, "batch_size": 4, "variable_length": True, "dataset_size": 64}


def test_default_demo_is_unchanged():
    """The batches and initial weights of the fixed-length demo, as before variable-length mode existed."""
    torch.manual_seed(0)
    w = gpt(**TINY)
    h = hashlib.sha256()
    for step in range(3):
        x, y = w.batch(step)
        h.update(x.numpy().tobytes())
        h.update(y.numpy().tobytes())
    for t in w.model.state_dict().values():
        h.update(t.numpy().tobytes())
    assert h.hexdigest() == "ab154080a4b1867d23c63b6009dd74941ea871005dc573f7ecded3fa0c335463"
    assert w.dataset is None and "dataset_size" not in w.describe()


def test_variable_length_passages_are_deterministic_and_padding_is_ignored_by_the_loss():
    w = gpt(**{**VARIABLE, "dropout": 0.0})
    again = gpt(**{**VARIABLE, "dropout": 0.0})
    lengths = [w.complexity(w.dataset[i]) for i in range(len(w.dataset))]
    assert len(w.dataset) == 64 and len(set(lengths)) > 10 and min(lengths) >= 4 and max(lengths) <= 32
    assert all(torch.equal(w.dataset[i], again.dataset[i]) for i in range(64))
    x, y = w.batch(0)  # samples 0-3 in order, padded to the longest
    assert x.shape == (4, max(lengths[:4])) and (y == -100).sum() == x.numel() - sum(lengths[:4])
    w.model.eval()
    with torch.no_grad():
        padded = w.loss(w.model(x), y)
        alone = [F.cross_entropy(w.model(s[None, :-1])[0], s[1:], reduction="sum") for s in
                 (w.dataset[i] for i in range(4))]
    torch.testing.assert_close(padded, sum(alone) / sum(lengths[:4]))


def test_a_dataset_workload_needs_collate_and_batch_size():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(WorkloadError, match="collate"):
        Workload(model, None, F.mse_loss, dataset=[1, 2, 3])
    with pytest.raises(WorkloadError, match="batch"):
        Workload(model, None, F.mse_loss)


def _loads(sampler: str, steps: int = 4) -> list[tuple[dict, dict]]:
    w = gpt(**VARIABLE)
    ranks = [Feed(w, sampler, world=2, rank=r, seed=0) for r in (0, 1)]
    return [(ranks[0].load(s), ranks[1].load(s)) for s in range(steps)]


def test_samplers_share_an_epoch_between_ranks_the_same_way_every_time():
    from ortlab.stacks.table import ortmodule_unavailable

    w = gpt(**VARIABLE)
    for sampler in ("distributed", "load_balancing")[:1 if ortmodule_unavailable() else 2]:  # ORT's: the ort stack
        ranks = [Feed(w, sampler, world=2, rank=r, seed=0) for r in (0, 1)]
        epoch = [[i for s in range(8) for i in feed.indices(s)] for feed in ranks]  # 64 samples, 2 x 8 x 4
        assert sorted(epoch[0] + epoch[1]) == list(range(64)), sampler
        # a second burst (e.g. ORTModule after PyTorch) builds the same batches
        assert Feed(w, sampler, world=2, rank=1, seed=0).indices(9) == ranks[1].indices(9)
        assert Feed(w, sampler, world=2, rank=1, seed=1).indices(0) != ranks[1].indices(0)


@pytest.mark.ort
def test_load_balancing_gives_the_ranks_more_even_loads_than_the_distributed_sampler():
    def mean_imbalance(sampler):
        rows = [step_fields(0, [0.0, 0.0], [[a["load"], a["tokens"]], [b["load"], b["tokens"]]])
                for a, b in _loads(sampler)]
        return sum(r["load_imbalance"] for r in rows) / len(rows)

    assert mean_imbalance("load_balancing") < 1.03 < 1.06 < mean_imbalance("distributed")


@pytest.mark.parametrize("value", ["random", "", 1, "Distributed"])
def test_bad_sampler_values_are_refused_naming_the_samplers(value):
    with pytest.raises(BurstError, match="distributed, load_balancing"):
        BurstConfig(sampler=value)


def test_a_sampler_for_a_workload_without_a_dataset_is_refused(tmp_path):
    with Session(None, TINY, out=tmp_path / "runs", in_process=True) as s, \
            pytest.raises(BurstError, match="needs a workload with a dataset"):
        s.burst("pytorch", 1, sampler="distributed", progress=False)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_cli_refuses_a_bad_sampler():
    done = subprocess.run([sys.executable, "-m", "ortlab.cli", "burst", "--sampler", "random"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "distributed" in done.stderr and "load_balancing" in done.stderr


def test_one_process_trains_a_dataset_in_order_with_its_load(tmp_path):
    with Session(None, VARIABLE, out=tmp_path / "runs", in_process=True) as s:
        run = s.burst("pytorch", 2, progress=False)
    w = gpt(**VARIABLE)
    lengths = [w.complexity(w.dataset[i]) for i in range(8)]
    assert run.status == "ok", run.error
    assert run.metrics["load"].tolist() == [sum(lengths[:4]), sum(lengths[4:])]
    assert run.metrics["tokens"].tolist() == [4 * max(lengths[:4]), 4 * max(lengths[4:])]
    assert (run.metrics["padding"] == run.metrics["tokens"] - run.metrics["load"]).all()


# -- real ranks


@pytest.mark.slow
@pytest.mark.ort
def test_two_ranks_load_balancing_lowers_the_imbalance_and_both_backends_see_the_same_batches(tmp_path):
    with Session(None, VARIABLE, out=tmp_path / "runs") as s:
        plain = s.burst("pytorch", 4, nproc=2, sampler="distributed", progress=False)
        balanced = s.compare(4, nproc=2, sampler="load_balancing", progress=False)
    runs = {"distributed": plain, "load_balancing": balanced.pytorch}
    for run in [plain, balanced.pytorch, balanced.ortmodule]:
        assert run.status == "ok" and run.meta["in_sync"] is True, run.error
    # the load figures, not times: deterministic in the seed
    assert ortlab.imbalance(balanced.pytorch)["load"] < ortlab.imbalance(plain)["load"]
    assert ortlab.imbalance(balanced.pytorch)["sampler"] == "load_balancing"
    assert plain.meta["imbalance"]["load"] == pytest.approx(ortlab.imbalance(plain)["load"])
    assert ortlab.imbalance(plain)["wait_s"] >= 0
    table = ortlab.imbalance_table(plain)
    assert table[["step", "rank"]].values.tolist() == [[s, r] for s in range(4) for r in (0, 1)]
    assert (table["padding"] == table["tokens"] - table["load"]).all() and (table["wait_s"] >= 0).all()
    per_step = table.groupby("step")["load"]
    assert plain.metrics["load_imbalance"].tolist() == pytest.approx((per_step.max() / per_step.mean()).tolist())
    # PyTorch and ORTModule ranks trained on the same samples
    pt_rows, ort_rows = balanced.pytorch.meta["ranks"], balanced.ortmodule.meta["ranks"]
    assert [r["mean_load"] for r in pt_rows] == [r["mean_load"] for r in ort_rows]
    assert ortlab.sampler_comparison(runs)["label"].unique().tolist() == list(runs)
    assert ortlab.sampler_figure(runs).axes


@pytest.mark.slow
@pytest.mark.ort
def test_two_ranks_refuse_a_sampler_for_a_workload_without_a_dataset(tmp_path):
    with Session(None, TINY, out=tmp_path / "runs") as s, pytest.raises(BurstError, match="with a dataset"):
        s.burst("pytorch", 1, nproc=2, sampler="load_balancing", progress=False)
