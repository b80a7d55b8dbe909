import pickle

import pytest
import torch

from ortlab import Snapshot
from ortlab.demo import gpt


def test_round_trip_with_optimizer(tmp_path):
    w = gpt()
    opt = torch.optim.AdamW(w.model.parameters(), lr=1e-3)
    x, y = w.batch(0)
    w.loss(w.model(x), y).backward()
    opt.step()
    snap = Snapshot.take(w.model, opt)
    path = snap.save(tmp_path / "s.pt")
    other = gpt()
    with torch.no_grad():
        for p in other.model.parameters():
            p.add_(1.0)  # differs from w everywhere, so the restore below has something to undo
    assert not torch.equal(other.model.head.weight, w.model.head.weight)
    other_opt = torch.optim.AdamW(other.model.parameters(), lr=1e-3)
    Snapshot.load(path).restore(other.model, other_opt)
    for (name, a), b in zip(w.model.state_dict().items(), other.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert other_opt.state_dict()["state"][0]["step"] == 1


def test_fp16_model_keeps_fp32_master_weights(tmp_path):
    w = gpt()
    w.model.half()
    snap = Snapshot.take(w.model)
    assert all(t.dtype == torch.float32 for t in snap.model.values() if t.is_floating_point())
    assert snap.dtypes["head.weight"] == "float16"
    before = w.model.head.weight.detach().clone()
    with torch.no_grad():
        w.model.head.weight.zero_()
    Snapshot.load(snap.save(tmp_path / "h.pt")).restore(w.model)
    assert w.model.head.weight.dtype == torch.float16
    assert torch.equal(w.model.head.weight, before)


def test_model_only_state_dict_loads(tmp_path):
    w = gpt()
    with torch.no_grad():
        for p in w.model.parameters():
            p.add_(1.0)  # weights a fresh model does not have
    torch.save(w.model.state_dict(), tmp_path / "plain.pt")
    snap = Snapshot.load(tmp_path / "plain.pt")
    assert snap.optimizer is None
    fresh = gpt().model
    assert not torch.equal(fresh.head.weight, w.model.head.weight)
    snap.restore(fresh)
    saved = w.model.state_dict()
    assert all(torch.equal(v, saved[k]) for k, v in fresh.state_dict().items())


class _Evil:
    def __reduce__(self):
        return (print, ("code ran",))


def test_loading_never_executes_code(tmp_path, capsys):
    with open(tmp_path / "evil.pt", "wb") as f:
        pickle.dump({"x": _Evil()}, f)
    with pytest.raises(pickle.UnpicklingError):
        Snapshot.load(tmp_path / "evil.pt")
    assert "code ran" not in capsys.readouterr().out
