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


@pytest.fixture(scope="session")
def shots_dir(tmp_path_factory) -> Path:
    """Where browser tests save screenshots: a temporary folder, so a test run leaves the checkout unchanged;
    docs/img/ only when asked (ORTLAB_UPDATE_SCREENSHOTS=1) to refresh the pictures the docs show."""
    if os.environ.get("ORTLAB_UPDATE_SCREENSHOTS") == "1":
        return Path(__file__).resolve().parents[1] / "docs" / "img"
    return tmp_path_factory.mktemp("screenshots")
