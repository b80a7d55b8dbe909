import os
from pathlib import Path

import pytest

REFERENCE = Path(__file__).resolve().parents[1].parent / "shared" / "reference"
os.environ.setdefault("TQDM_DISABLE", "1")


@pytest.fixture(scope="session")
def demo_session(tmp_path_factory):
    """One in-process session over the demo, shared by tests that only need bursts (one ORT export per wrap)."""
    from ortlab import Session

    with Session(out=tmp_path_factory.mktemp("runs"), in_process=True) as s:
        yield s
