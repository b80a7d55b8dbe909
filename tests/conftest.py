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


def pytest_addoption(parser):
    parser.addoption("--stress", action="store_true", default=os.environ.get("ORTLAB_STRESS") == "1",
                     help="run the tests marked 'interrupt' (Stop, Ctrl-C, orphans) with the machine loaded: other "
                          "Python processes importing torch and training, and disk traffic (tests/scripts/load.py)")


@pytest.fixture(autouse=True)
def _stress(request, tmp_path_factory):
    """In stress mode, an 'interrupt' test runs beside tests/scripts/load.py, started before it and ended after."""
    if not (request.config.getoption("--stress") and request.node.get_closest_marker("interrupt")):
        yield
        return
    import signal
    import subprocess
    import sys
    import time

    folder = tmp_path_factory.mktemp("load")
    script = Path(__file__).parent / "scripts" / "load.py"
    load = subprocess.Popen([sys.executable, str(script), str(folder)], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while len(list(folder.glob("ready-*"))) < 4 and load.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert load.poll() is None, "the stress load ended by itself"
        yield
    finally:
        os.killpg(load.pid, signal.SIGKILL)
        load.wait()
