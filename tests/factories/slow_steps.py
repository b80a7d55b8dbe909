"""Test factories: workloads that misbehave on purpose."""

import signal
import time

from ortlab.demo import gpt


def deaf_after(step: int = 2, **kwargs):
    """The demo, but from `step` on each batch ignores SIGINT and sleeps: a worker stuck like ORT in C++."""
    w = gpt(**kwargs)
    inner = w.batch

    def batch(i):
        if i >= step:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            time.sleep(600)
        return inner(i)

    w.batch = batch
    return w


def slow(delay: float = 0.3, **kwargs):
    """The demo with a pause before every step, so a test can stop it mid-burst."""
    w = gpt(**kwargs)
    inner = w.batch

    def batch(i):
        time.sleep(delay)
        return inner(i)

    w.batch = batch
    return w


def crash_at(step: int = 2, **kwargs):
    """The demo, but the process dies hard (like a segfault in ORT) at `step`."""
    import os

    w = gpt(**kwargs)
    inner = w.batch

    def batch(i):
        if i >= step:
            os.kill(os.getpid(), signal.SIGKILL)
        return inner(i)

    w.batch = batch
    return w
