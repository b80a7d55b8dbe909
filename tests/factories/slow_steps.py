"""Test factories: workloads that misbehave on purpose."""

import signal
import time

from ortlab.demo import gpt


def deaf_after(step: int = 2, **kwargs):
    """The demo, but deaf to SIGINT from step `step - 1` on and stuck from `step` on: a worker stuck like ORT in
    C++. (Deaf one step early, so that a Stop sent when step `step - 1` is reported always finds it deaf.)"""
    w = gpt(**kwargs)
    inner = w.batch

    def batch(i):
        if i >= step - 1:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        if i >= step:
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


def exits(code: int = 3, **kwargs):
    """A factory that ends the process instead of returning a model (a script run as a factory)."""
    import sys

    sys.exit(code)
