import faulthandler
import os
import signal
import warnings
from pathlib import Path

import pytest

REFERENCE = Path(__file__).resolve().parents[1].parent / "shared" / "reference"
os.environ.setdefault("TQDM_DISABLE", "1")


def _threads_per_worker() -> None:
    """Under xdist, torch in each worker (and its children) on its share of the cores, set before anything imports
    torch. Two workers that each take every core run twice the threads the cores can take: their pools spin against
    each other and a burst takes 8x as long (EfficientNet-B0's comparison: 13 s on one thread each, 121 s beside a
    trainer on two). The cores stay visible: a test sees the machine a user has (two ranks on two cores do not warn)."""
    from ortlab.engine.machine import available_cores  # torch-free: the affinity and a container's quota

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw") and workers > 1:
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, available_cores() // workers)))


_threads_per_worker()
_STDERR: list[int] = []  # a copy of the real stderr, taken while pytest does not capture it


def pytest_configure(config):
    _STDERR.append(os.dup(2))


def _allowed_seconds(item) -> float | None:
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.args[0] if marker.args else marker.kwargs.get("timeout")
    else:
        value = item.config.getoption("timeout", None)
    return float(value) if value else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test still running well past its timeout (twice it, at most two minutes more) is stuck where pytest-timeout's
    SIGALRM cannot reach it (C code that never returns to Python, a blocked signal): faulthandler's own thread prints
    every thread's stack and ends this process, so that xdist names the test, replaces the worker and the suite goes
    on instead of hanging until CI's limit."""
    allowed = _allowed_seconds(item)
    if allowed:
        faulthandler.dump_traceback_later(allowed + min(allowed, 120), exit=True, file=_STDERR[0] if _STDERR else 2)
    try:
        yield
    finally:
        if allowed:
            faulthandler.cancel_dump_traceback_later()


def _skip_cuda_without_a_gpu(items) -> None:
    """Tests marked `cuda` skip, saying why, where torch sees no CUDA GPU (torch is imported only when such a test
    was collected)."""
    marked = [item for item in items if item.get_closest_marker("cuda")]
    if not marked:
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="no CUDA device: torch.cuda.is_available() is False")
        for item in marked:
            item.add_marker(skip)


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


def _notebook_uses_ortmodule(path: Path, seen: dict[Path, bool]) -> bool:
    """A tutorial whose code names ORTModule (a burst, an option, the Lab's ORTModule runs) needs the ort stack."""
    if path not in seen:
        import json

        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        code = " ".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        seen[path] = "ortmodule" in code.lower()
    return seen[path]


def pytest_collection_modifyitems(config, items):
    """Tests marked `ort`, and the notebooks whose code uses ORTModule, need ORTModule: on the current stack (Python
    3.12+, the newest torch) they are skipped with the reason ortlab itself gives a user there. Tests marked `cuda`
    need a GPU."""
    from ortlab.stacks.table import ortmodule_line

    _skip_cuda_without_a_gpu(items)
    why = ortmodule_line()
    if why is None:
        return
    skip, seen = pytest.mark.skip(reason=why), {}
    for item in items:
        notebook = item.path.suffix == ".ipynb" and _notebook_uses_ortmodule(item.path, seen)
        if notebook or item.get_closest_marker("ort"):
            item.add_marker(pytest.mark.ort)
            item.add_marker(skip)


def pytest_addoption(parser):
    parser.addoption("--stress", action="store_true", default=os.environ.get("ORTLAB_STRESS") == "1",
                     help="run the tests marked 'interrupt' (Stop, Ctrl-C, orphans) with the machine loaded: other "
                          "Python processes importing torch and training, and disk traffic (tests/scripts/load.py)")


class _Load:
    """tests/scripts/load.py for one test process: started at its first 'interrupt' test, paused (SIGSTOP to its
    process group) between them, so the load is there for every such test without paying its start each time."""

    def __init__(self, folder: Path):
        self.folder, self.process = folder, None

    def resume(self) -> None:
        import signal
        import subprocess
        import sys
        import time

        if self.process is None:
            script = Path(__file__).parent / "scripts" / "load.py"
            env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # the load takes every core
            self.process = subprocess.Popen([sys.executable, str(script), str(self.folder)], start_new_session=True,
                                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 300
            while (len(list(self.folder.glob("ready-*"))) < 4 and self.process.poll() is None
                   and time.monotonic() < deadline):
                time.sleep(0.2)
        assert self.process.poll() is None, "the stress load ended by itself"
        os.killpg(self.process.pid, signal.SIGCONT)

    def pause(self) -> None:
        import signal

        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGSTOP)

    def end(self) -> None:
        import signal

        if self.process is not None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@pytest.fixture(scope="session")
def _load(tmp_path_factory):
    load = _Load(tmp_path_factory.mktemp("load"))
    yield load
    load.end()


@pytest.fixture(autouse=True)
def _stress(request):
    """In stress mode, an 'interrupt' test runs beside tests/scripts/load.py, running from before it to after it."""
    if not (request.config.getoption("--stress") and request.node.get_closest_marker("interrupt")):
        yield
        return
    load = request.getfixturevalue("_load")
    load.resume()
    try:
        yield
    finally:
        load.pause()


@pytest.fixture(autouse=True)
def _sigint_as_python_sets_it(request):
    """Every test starts with SIGINT raising KeyboardInterrupt, as in a Python started from a terminal (and its
    subprocesses inherit that), whatever a test before it in the same worker left, or the shell that started the
    suite: a shell without job control starts a background job with SIGINT ignored, which Python and every process it
    starts keep, so that the Ctrl-C tests would find nothing to interrupt. The warnings summary names a test that
    left another handler."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    left = signal.getsignal(signal.SIGINT)
    if left is not signal.default_int_handler:
        warnings.warn(f"{request.node.nodeid} left SIGINT's handler as {left!r}", stacklevel=1)
        signal.signal(signal.SIGINT, signal.default_int_handler)
