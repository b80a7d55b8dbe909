"""The suite's own harness (tests/conftest.py): a test stuck where pytest-timeout cannot reach it ends its worker
with every thread's stack, and the suite goes on."""

import subprocess
import sys

import pytest

STUCK = '''
import signal, time

def test_stuck():
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])  # pytest-timeout's alarm never arrives
    time.sleep(120)

def test_after():
    pass
'''


@pytest.mark.slow
def test_a_test_stuck_past_its_timeout_ends_its_worker_and_the_suite_goes_on(tmp_path):
    (tmp_path / "test_stuck.py").write_text(STUCK)
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-n", "1", "--timeout=1",
                           "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir", str(tmp_path), "test_stuck.py"],
                          capture_output=True, text=True, timeout=110, cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "crashed while running 'test_stuck.py::test_stuck'" in out and "1 failed, 1 passed" in out, out
    assert "Timeout (0:00:02)!" in out and 'test_stuck.py", line 6 in test_stuck' in out, out  # the stack, named
