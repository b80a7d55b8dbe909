"""A user's own model through the factory protocol: a Hugging Face model from a tiny random config."""

from pathlib import Path

import pytest

pytest.importorskip("transformers")

FACTORY = str(Path(__file__).parent / "factories" / "hf_gpt2.py") + ":tiny_gpt2"


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.ort
def test_transformers_gpt2_trains_under_ortmodule(tmp_path):
    from ortlab import Session

    with Session(FACTORY, out=tmp_path, in_process=True) as s:
        comparison = s.compare(steps=3, parity=True, progress=False)
    assert comparison.pytorch.ok and comparison.ortmodule.ok, comparison.ortmodule.error
    assert not comparison.ortmodule.ort.get("fallback")
    assert comparison.to_dict()["max_loss_diff"] < 1e-3
    assert comparison.ortmodule.meta["model"]["name"] == "tiny GPT-2"


HF = str(Path(__file__).parent / "factories" / "hf_models.py")


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("factory", ["gpt2_own_loss", "bert_mlm"])
@pytest.mark.ort
def test_models_that_compute_their_own_loss_agree_in_parity(tmp_path, factory):
    """Labels passed in, the model's own `.loss` returned: the usual Hugging Face way works on both backends."""
    from ortlab import Session

    with Session(f"{HF}:{factory}", out=tmp_path, in_process=True) as s:
        comparison = s.compare(steps=3, parity=True, progress=False)
    assert comparison.pytorch.ok and comparison.ortmodule.ok, comparison.ortmodule.error
    assert not comparison.ortmodule.ort.get("fallback")
    assert comparison.to_dict()["max_loss_diff"] < 1e-4


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.ort
def test_t5_default_dropout_is_off_in_parity_mode(tmp_path):
    """T5's attention calls nn.functional.dropout with its config's rate (0.1): parity mode must reach it."""
    from ortlab import Session

    with Session(f"{HF}:t5", out=tmp_path, in_process=True) as s:
        parity = s.compare(steps=3, parity=True, progress=False)
        noisy = s.compare(steps=3, parity=False, progress=False)
    assert parity.pytorch.ok and parity.ortmodule.ok, parity.ortmodule.error
    assert parity.to_dict()["max_loss_diff"] < 1e-5
    assert noisy.to_dict()["max_loss_diff"] > 1e-3  # the same check fails while dropout is on: it can fail
    import torch

    assert torch.nn.functional.dropout.__name__ == "dropout" and not hasattr(torch.nn.functional.dropout,
                                                                              "_ortlab_original")


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.ort
def test_bert_with_sdpa_fails_with_the_fix_named_and_trains_with_it(tmp_path):
    """sdpa's attention dropout exports as a Dropout without its mask, whose gradient ORT 1.19.2 cannot build: the
    failed run names the blocker and the eager-attention fix; with fixes="auto" the same burst trains."""
    from ortlab import Session

    with Session(f"{HF}:bert_mlm", {"attention": "sdpa"}, out=tmp_path, in_process=True) as s:
        run = s.burst("ortmodule", 2, {"fallback_policy": "FALLBACK_DISABLE"}, progress=False)
        fixed = s.burst("ortmodule", 2, {"fallback_policy": "FALLBACK_DISABLE"}, progress=False, fixes="auto")
    assert run.status == "failed" and "gradient graph" in run.error
    assert [(b["kind"], b["op"]) for b in run.meta["blockers"]] == [("no gradient", "Dropout")]
    assert "eager-attention" in run.meta["hint"] and "--fix auto" in run.meta["hint"]
    assert fixed.ok, fixed.error
    assert fixed.meta["fixes"]["applied"] == ["eager-attention"]
