"""The per-step exchange between ranks (ortlab.engine.exchange): exact checksums, and rows carried by DDP's
gradient all-reduce without changing the gradients. One process (a world of one, gloo in this process); the
2-rank bursts of test_distributed.py check it across real ranks."""

import math

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ortlab.engine.exchange import Checksums, Exchange


def checksums(parameters):
    return Checksums(parameters)()


@pytest.fixture
def world_of_one():
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield
    dist.destroy_process_group()


def test_checksums_change_with_any_bit_and_not_with_the_order_of_summation():
    w = torch.randn(64, 33)
    base = checksums([w])
    of_w = Checksums([w])
    w.view(torch.int32)[5, 7] ^= 1  # the last bit of one value, in place as an optimizer updates
    assert of_w() != base
    w.view(torch.int32)[5, 7] ^= 1
    assert of_w() == base
    assert checksums([w.flip(0).contiguous()]) == base  # the same values in another order
    assert checksums([w.half(), w.double()]) == checksums([w.half(), w.double()])
    assert all(0 <= s < 2**32 for s in checksums([w, -w, w.half()]))


def test_the_c_loop_gives_torchs_checksums():
    g = torch.Generator().manual_seed(0)
    parameters = [torch.randn(4099, generator=g) * 1e30, torch.randn(7, 3, generator=g), torch.zeros(0),
                  torch.full((1000,), -1.0)]
    fast, by_torch = Checksums(parameters), Checksums(parameters)
    by_torch._kernel = None
    assert fast._kernel is not None  # a C compiler is part of this environment
    assert fast() == by_torch()
    assert Checksums([p.double() for p in parameters])._kernel is None  # 64-bit values: torch sums them


def test_a_row_rides_on_the_gradient_all_reduce_and_leaves_the_gradients_as_ddp_computes_them(world_of_one):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    plain = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    plain.load_state_dict(model.state_dict())
    params = list(model.parameters())
    exchange = Exchange(rank=0, world=1, n_parameters=len(params), n_figures=2)
    ddp = DistributedDataParallel(exchange.carrier(model, torch.device("cpu")))
    x = torch.randn(4, 8)
    sums = checksums(params)
    exchange.post(sums, stop=True, figures=[0.25, 7.0])
    loss = exchange.ride(ddp(x).sum())
    loss.backward()
    table = exchange.collect(torch.device("cpu"))
    assert table.checksums == [sums] and table.stop == [True] and table.figures == [[0.25, 7.0]]
    assert table.first_difference() is None
    plain_loss = plain(x).sum()
    assert loss.item() == plain_loss.item()
    plain_loss.backward()
    for a, b in zip(model.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)
    # nothing posted: the rider still gets its (zero) gradient, as DDP expects of every parameter in every backward
    exchange.ride(ddp(x).sum()).backward()
    # a row posted without a backward (the check after the last update) is gathered
    exchange.post(checksums(params), stop=False)
    table = exchange.collect(torch.device("cpu"))
    assert table.stop == [False] and all(math.isnan(f) for f in table.figures[0])
    assert table.checksums == [checksums(params)]


def test_rows_survive_ddps_averaging_over_three_ranks():
    """DDP multiplies each gradient by 1/world_size; the rows are sent times world_size and read back exact."""
    world = 3
    exchange = Exchange(rank=1, world=world, n_parameters=2, n_figures=1)
    exchange.carrier(torch.nn.Linear(1, 1), torch.device("cpu"))
    sums = [2**32 - 1, 123456789]
    exchange.post(sums, stop=True, figures=[0.125])
    loss = exchange.ride(torch.ones((), requires_grad=True))
    loss.backward()
    averaged = exchange.rider.grad * torch.tensor(1.0 / world, dtype=torch.float32)  # what DDP's bucket holds
    exchange.rider.grad = averaged
    table = exchange.collect(torch.device("cpu"))
    assert table.checksums[1] == sums and table.checksums[0] == [0, 0] and table.stop == [False, True, False]
    assert table.figures[1] == pytest.approx([0.125])
