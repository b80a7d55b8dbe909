"""The worker process (`python -m ortlab.engine.worker FD`): holds one Engine and serves bursts over a socket.

It ends itself when the process that started it dies (checked twice a second, also while a burst runs in C++),
and marks the run it was writing, so that no worker outlives its kernel or CLI and no run stays "running". Its log
(stdout and stderr, `<out>/.worker-*.log`, named by its second argument) goes with it when it ends by itself or is
told to; a worker that crashed or was killed leaves it, and the error that names it says why. An exception it
serves as an error is printed there in full (the user's factory's traceback above all).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path

from ortlab.engine import messages as m
from ortlab.engine.orphan import on_parent_death
from ortlab.runs.run import RunStatus, mark

PARENT_DIED = "the ortlab process that started this burst died (its kernel or command ended); the worker stopped"


class _Orphan:
    """Watches the parent: when it is gone, marks the current run and ends this process."""

    def __init__(self, log: Path | None = None):
        self.current: Path | None = None
        self.log = log
        on_parent_death(self.die, "ortlab-parent-watch")

    def die(self) -> None:
        if self.current is not None:
            with contextlib.suppress(OSError):  # the run's folder may be gone with its disk
                mark(self.current, RunStatus.CRASHED, error=PARENT_DIED)
        remove_log(self.log)  # the run says why it ended; nobody is left to name the log
        os._exit(3)


def remove_log(log: Path | None) -> None:
    if log is not None:
        with contextlib.suppress(OSError):
            log.unlink(missing_ok=True)


def _serve(conn: Connection, log: Path | None = None) -> None:
    from ortlab.engine.config import BurstConfig
    from ortlab.engine.loop import Engine
    from ortlab.engine.types import Transition
    from ortlab.errors import InputError
    from ortlab.options import Options
    from ortlab.workload import ModelRef

    orphan = _Orphan(log)

    def send(msg) -> None:
        try:
            conn.send(msg)
        except OSError:  # the parent closed its end: it died or gave up on us
            orphan.die()

    def started(path: Path) -> None:
        orphan.current = path
        send(m.Started(str(path)))

    engine: Engine | None = None
    while True:
        try:
            msg = conn.recv()
        except KeyboardInterrupt:
            continue  # a Stop that arrived between bursts
        except (EOFError, OSError):
            return
        try:
            if isinstance(msg, m.Init):
                engine = Engine(ModelRef(msg.kind, msg.target, tuple(msg.kwargs), msg.label), seed=msg.seed,
                                import_options=Options(msg.import_options), snapshot=msg.snapshot)
                if msg.reason:
                    engine.pending_transition = Transition("", 0, "new worker", msg.reason, msg.changes)
                send(m.Ready(engine.workload.describe()))
            elif isinstance(msg, m.Shutdown):
                return
            elif engine is None:  # the parent sends Init first: anything else before it is the parent's bug
                raise RuntimeError(f"{type(msg).__name__} before Init")
            elif isinstance(msg, m.RunBurst):
                with _stop_on_sigint() as stop:
                    path = engine.run(BurstConfig.from_dict(msg.config), on_step=lambda row: send(m.Step(row)),
                                      on_start=started, should_stop=stop.is_set)
                orphan.current = None
                send(m.Done(str(path)))
            elif isinstance(msg, m.RunCheck):
                report = engine.check(msg.fixes, Options(msg.options), msg.out)
                send(m.Checked(report.to_dict()))
            elif isinstance(msg, m.RunTask):
                reports = {"progress": lambda n, row: send(m.Tried(n, row))} if msg.progress else {}
                send(m.Checked(engine.task(msg.task, BurstConfig.from_dict(msg.config), **msg.kwargs, **reports)))
        except KeyboardInterrupt:
            send(m.Failed("interrupted", "stopped before the burst started"))
        except InputError as e:
            told = getattr(e, "traceback", None)
            if told:  # the user's own exception (a factory that raised): its log holds it
                print(told, file=sys.stderr, flush=True)
            send(m.Failed(type(e).__name__, str(e), bad_input=True, traceback=told))
        except (ImportError, ValueError) as e:
            traceback.print_exc()
            send(m.Failed(type(e).__name__, str(e)))
        except Exception as e:
            traceback.print_exc()
            send(m.Failed(type(e).__name__, f"{type(e).__name__}: {e}", traceback=traceback.format_exc()))
        except SystemExit as e:  # a factory that calls sys.exit()
            send(m.Failed("SystemExit", f"the model factory called sys.exit({e.code!r})", bad_input=True))


@contextlib.contextmanager
def _stop_on_sigint() -> Iterator[threading.Event]:
    """During a burst, the Session's Stop (SIGINT) is a request the burst honours after the step it is in, where it
    can end cleanly: a KeyboardInterrupt raised anywhere (in the middle of sending a step, of ORT's own Python)
    could leave the pipe or the run half written. A step that never returns is the Session's to end by force."""
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def main() -> None:
    log = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    _serve(Connection(int(sys.argv[1])), log)
    remove_log(log)  # told to end, or its parent closed the socket: an ending, not a crash


if __name__ == "__main__":
    main()
