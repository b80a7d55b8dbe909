"""A user's own model through the factory protocol: a Hugging Face model from a tiny random config."""

from pathlib import Path

import pytest

pytest.importorskip("transformers")

FACTORY = str(Path(__file__).parent / "factories" / "hf_gpt2.py") + ":tiny_gpt2"


@pytest.mark.timeout(600)
def test_transformers_gpt2_trains_under_ortmodule(tmp_path):
    from ortlab import Session

    with Session(FACTORY, out=tmp_path, in_process=True) as s:
        comparison = s.compare(steps=3, parity=True, progress=False)
    assert comparison.pytorch.ok and comparison.ortmodule.ok, comparison.ortmodule.error
    assert not comparison.ortmodule.ort.get("fallback")
    assert comparison.to_dict()["max_loss_diff"] < 1e-3
    assert comparison.ortmodule.meta["model"]["name"] == "tiny GPT-2"
