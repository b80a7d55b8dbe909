"""The kernel side of the worker process (ortlab.engine.worker): start one for a set of import-time options, keep
it while it can serve the next burst, send it a burst or a request and read its answers, end it.

A worker's output goes to `<out>/.worker-<pid>-<n>.log`: removed with the worker (by the worker itself when it ends
on its own: its parent gone), kept only when it crashed or holds the traceback of the error that names it (a model
factory that raised). A Stop is the Session's: the client is handed its request and honours it after the current step,
or ends a worker that shows no progress (ortlab.engine.grace).
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ortlab.engine import messages as m
from ortlab.engine.headroom import Watch
from ortlab.errors import OrtlabError
from ortlab.options import Options, ReadAt
from ortlab.runs.run import RunStatus, mark

KILL_GRACE_S = 3.0  # after SIGTERM, before SIGKILL
_log_numbers = itertools.count()


class WorkerError(OrtlabError, RuntimeError):
    """The worker could not start or answered with an error; the message says why."""


class WorkerOutOfMemory(WorkerError):
    """The worker was killed for memory (the kernel's OOM killer, a cgroup's limit): the message says what it held
    and what is allowed, in one line."""


@dataclass
class Worker:
    """One worker process, its socket, the import-time options it was started with and its log."""

    proc: subprocess.Popen
    conn: Connection
    import_options: Options
    log_path: Path
    watch: Watch | None = None  # its memory: a SIGKILL is named "killed for memory" when that is why

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def receive_step(self) -> Any:
        """A message, "tick" when none came within 0.1 s, or None when the worker died with nothing left to read."""
        try:
            if self.conn.poll(0.1):
                return self.conn.recv()
        except (EOFError, OSError):
            return None
        if self.watch is not None:
            self.watch.sample()
        return None if not self.alive and not _has_data(self.conn) else "tick"

    def receive(self, timeout: float) -> Any:
        """The next message, or None when the worker died or `timeout` seconds passed."""
        deadline = time.monotonic() + timeout
        while (msg := self.receive_step()) == "tick":
            if time.monotonic() > deadline:
                return None
        return msg

    def end(self) -> None:
        """Ask it to end (killed if it does not), and remove its log."""
        try:
            self.conn.send(m.Shutdown())
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            kill(self.proc)
        self.conn.close()
        self.log_path.unlink(missing_ok=True)

    def crashed(self) -> str:
        """What ended it ("exit code 1", "signal SIGKILL"), once it is gone; its log is kept."""
        code = self.proc.wait()
        self.conn.close()
        return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"

    def out_of_memory(self) -> str | None:
        """Once it is gone: "killed for memory by ...: it held ..., the limit is ..." when memory is why it died."""
        code = self.proc.wait()
        if self.watch is None or code >= 0:
            return None
        return self.watch.killed_for_memory(signal.Signals(-code).name)

    def stopped(self) -> str:
        """What ended it after a Stop (it was ended on purpose: its log goes)."""
        what = self.crashed()
        self.log_path.unlink(missing_ok=True)
        return what


class Client:
    """The worker of one Session: `ref`'s model, its seed and snapshot, logs under `out`."""

    def __init__(self, ref: Any, seed: int, snapshot: str | Path | None, out: str | Path, stack: str | None = None):
        self.ref, self.seed, self.snapshot, self.out = ref, seed, snapshot, out
        self.stack = stack  # the stack its workers run on (ortlab.engine.stack_env); None: this process's
        self.worker: Worker | None = None
        self.starts = 0  # workers started so far
        self.new_worker_reason: tuple[str, dict] | None = None  # why the next worker starts (a crash, a Stop)

    @property
    def pid(self) -> int | None:
        return self.worker.proc.pid if self.worker and self.worker.alive else None

    def interrupt(self) -> None:
        """A Stop: SIGINT to a running worker (it ends its burst after the current step)."""
        if self.worker is not None and self.worker.alive:
            self.worker.proc.send_signal(signal.SIGINT)

    def close(self) -> None:
        w, self.worker = self.worker, None
        if w is not None:
            w.end()

    def for_options(self, options: Options | None) -> Worker:
        """A worker whose import-time options are those of `options` (None: any worker serves, e.g. PyTorch)."""
        wanted = options.with_read_at(ReadAt.IMPORT) if options is not None else None
        w = self.worker
        reason, changes = None, {}
        if w is not None and not w.alive:
            reason = f"the previous worker had exited ({w.crashed()}; its log: {w.log_path})"
            self.worker = w = None
        if w is not None and wanted is not None and Options(wanted) != w.import_options:
            old = w.import_options
            changes = {k: {"old": o, "new": n} for k, (o, n) in old.diff(Options(wanted)).items()}
            reason = "import-time options changed: " + ", ".join(
                f"{k} {v['old']!r} -> {v['new']!r}" for k, v in changes.items()) + " (ORT reads them once per process)"
            self.close()
            w = None
        if w is None:
            if self.new_worker_reason:
                reason, changes = self.new_worker_reason
                self.new_worker_reason = None
            w = self._start(Options(wanted or {}), reason, changes)
        return w

    def _start(self, import_options: Options, reason: str | None, changes: dict) -> Worker:
        parent, child = socket.socketpair()
        out = Path(self.out).expanduser().resolve()
        out.mkdir(parents=True, exist_ok=True)
        log_path = out / f".worker-{os.getpid()}-{next(_log_numbers)}.log"  # one per worker: bursts may share out
        from ortlab.engine.stack_env import worker_interpreter

        python, elsewhere = worker_interpreter(self.stack)  # another stack: its Python and environment
        env = dict(os.environ if elsewhere is None else elsewhere)
        with import_options.applied(env):
            env["PYTHONUNBUFFERED"] = "1"
            if elsewhere is None:
                env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p and Path(p).is_dir()])
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(
                    [python, "-m", "ortlab.engine.worker", str(child.fileno()), str(log_path)],
                    pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                    env=env, cwd=os.getcwd(), start_new_session=True,
                )
        child.close()
        conn = Connection(os.dup(parent.fileno()))
        parent.close()
        self.starts += 1
        w = self.worker = Worker(proc, conn, import_options, log_path, Watch(proc.pid))
        ref = self.ref
        conn.send(m.Init(ref.kind, ref.target, tuple(ref.kwargs), ref.label, self.seed, import_options.to_dict(),
                         str(self.snapshot) if self.snapshot else None, reason, changes))
        msg = w.receive(timeout=600)
        if not isinstance(msg, m.Ready):
            self.worker = None
            kill(proc)
            if isinstance(msg, m.Failed) and msg.bad_input:
                from ortlab.workload import FactoryError, WorkloadError

                if msg.traceback:  # the factory raised: its traceback stays in the log the error names
                    raise FactoryError(f"{msg.message}; the whole traceback: {log_path}", msg.traceback)
                w.log_path.unlink(missing_ok=True)  # the factory's error, said in full: not a crash
                raise WorkloadError(msg.message)
            detail = (msg.message if isinstance(msg, m.Failed) else None) or tail(log_path) or "no reason given"
            raise WorkerError(f"the worker for model {ref.describe()} did not start: {detail}; its log: {log_path}")
        return w

    def request(self, msg: Any, options: Options | None, what: str, stop: Callable[[], None],
                on_tried: Callable[[Any], None] | None = None) -> Any:
        """Send one request to a worker for these options and wait for its answer (Checked); Ctrl-C calls
        `stop` and, once the worker has answered, raises KeyboardInterrupt (the request was interrupted, whatever
        it answered); `on_tried(msg)` for each Tried on the way (the localizer's progress)."""
        w = self.for_options(options)
        if w.watch is not None:
            w.watch.restart()
        w.conn.send(msg)
        interrupted = False
        while True:
            try:
                reply = w.receive_step()
            except KeyboardInterrupt:
                if not interrupted:  # once: a second SIGINT could reach the worker while it answers the first
                    stop()
                interrupted = True
                continue
            if interrupted and isinstance(reply, m.Checked | m.Failed):
                raise KeyboardInterrupt
            if reply is None:
                self.worker = None
                died, memory = w.crashed(), w.out_of_memory()
                if memory is not None:
                    raise WorkerOutOfMemory(f"the worker (pid {w.proc.pid}) was {memory}, while {what}; its log: "
                                            f"{w.log_path}")
                raise WorkerError(f"the worker died ({died}) while {what}; its log: {w.log_path}\n"
                                  f"{tail(w.log_path)}")
            if isinstance(reply, m.Tried) and on_tried:
                on_tried(reply)
            if isinstance(reply, m.Checked):
                return reply.report
            if isinstance(reply, m.Failed):
                raise _failure(reply)

    def run(self, cfg: Any, callback: Callable[[dict], None] | None, stop_requested: threading.Event,
            force: Callable[[], bool]) -> Path:
        """Run one burst in a worker and return its folder. After a Stop (`stop_requested`), a worker that shows
        no progress is ended (`force()`: a second Stop, end it now); the run is then marked "stopped", and
        "crashed" when the worker died by itself."""
        from ortlab.engine.backends import registered
        from ortlab.engine.grace import StopGrace

        w = self.for_options(registered(cfg.backend).imports(cfg.effective_options()))
        w.conn.send(m.RunBurst(cfg.to_dict()))
        path: Path | None = None
        grace, killed = StopGrace(w.proc.pid, again=force), False
        while True:
            msg = w.receive_step()
            if stop_requested.is_set():
                grace.start()
            if msg == "tick":
                if not killed and grace.expired():
                    kill(w.proc)
                    killed = True
                continue
            grace.progress()
            if msg is None:  # the worker died
                self.worker = None
                if stop_requested.is_set():
                    what = w.stopped()
                    self.new_worker_reason = ("the previous worker was stopped", {})
                else:
                    what = w.crashed()
                    self.new_worker_reason = (f"the previous worker crashed ({what})", {})
                if path is None:
                    raise WorkerError(f"the worker died ({what}) before the burst started; its log: {w.log_path}\n"
                                      f"{tail(w.log_path)}")
                if stop_requested.is_set():
                    mark(path, RunStatus.STOPPED,
                         error=f"stopped: the worker was terminated ({what}) because "
                               f"{grace.reason or 'it did not end the burst after the Stop request'}")
                elif (memory := w.out_of_memory()) is not None:
                    mark(path, RunStatus.CRASHED,
                         error=f"out of memory: the worker process (pid {w.proc.pid}) was {memory}, during the "
                               f"burst (the steps done are kept); the log is kept in {path / 'log.txt'}, the "
                               f"worker's in {w.log_path}")
                else:
                    mark(path, RunStatus.CRASHED,
                         error=f"the worker process died ({what}) during the burst; the log is kept "
                               f"in {path / 'log.txt'}, the worker's in {w.log_path}")
                return path
            if isinstance(msg, m.Started):
                path = Path(msg.path)
            elif isinstance(msg, m.Step):
                if callback:
                    callback(msg.row)
            elif isinstance(msg, m.Done):
                return Path(msg.path)
            elif isinstance(msg, m.Failed):
                raise _failure(msg)


def _failure(msg: m.Failed) -> Exception:
    from ortlab.engine.types import BurstError

    return BurstError(msg.message) if msg.bad_input else WorkerError(msg.message)


def _has_data(conn: Connection) -> bool:
    try:
        return conn.poll(0)
    except (EOFError, OSError):
        return False


def kill(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
