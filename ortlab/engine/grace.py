"""How long a burst asked to stop may take to end by itself before it is ended by force: for as long as it shows
progress. A fixed grace fails on a busy machine, where one step, or writing a run's results after the last step,
can take many seconds; what tells a stuck process (blocked in C++) from a slow one is whether it still does
anything: sends a step or a message, or uses CPU time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

QUIET_S = 15.0  # after a Stop: this long without a message and without CPU time means stuck
MIN_CPU_S = 0.5  # CPU time that counts as progress (a sleeping process's watcher threads use far less)
CEILING_S = 600.0  # a Stop is carried out within this long even when the process keeps busy without ending
CHECK_EVERY_S = 1.0  # how often CPU time is read (/proc is scanned)
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def session_cpu_seconds(sid: int, leader: bool = True) -> float | None:
    """CPU seconds (user + system) used by the processes of session `sid` (a worker or an agent started with
    start_new_session, and all it started), without the session leader if `leader` is false; None off Linux."""
    total, seen = 0.0, False
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) "
        if len(fields) < 13 or int(fields[3]) != sid or (not leader and int(name) == sid):
            continue
        seen = True
        total += (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime
    return total if seen else None


@dataclass
class StopGrace:
    """Started when a Stop is asked for; `expired()` turns true once the burst shows no progress for `quiet_s`
    (no `progress()` call, no CPU time of session `sid`), after `ceiling_s` in all, or at once when `again()` says
    the Stop was asked for a second time."""

    sid: int
    leader: bool = True  # count the session leader's CPU time (a worker: yes; torch's elastic agent: no, it polls)
    quiet_s: float = QUIET_S
    ceiling_s: float = CEILING_S
    clock: Callable[[], float] = time.monotonic
    again: Callable[[], bool] = lambda: False
    started: float | None = None
    _last: float = 0.0
    _cpu: float | None = None
    _checked: float = 0.0
    reason: str = field(default="", init=False)

    def start(self) -> None:
        if self.started is None:
            self.started = self._last = self._checked = self.clock()
            self._cpu = session_cpu_seconds(self.sid, self.leader)

    def progress(self) -> None:
        """The burst did something visible (a step, a message)."""
        self._last = self.clock()

    def expired(self) -> bool:
        if self.started is None:
            return False
        if self.again():
            self.reason = "the Stop was asked for again (a second Ctrl-C)"
            return True
        now = self.clock()
        if now - self._checked >= CHECK_EVERY_S:
            self._checked = now
            cpu = session_cpu_seconds(self.sid, self.leader)
            if cpu is not None and (self._cpu is None or cpu - self._cpu >= MIN_CPU_S):
                self._cpu, self._last = cpu, now
        if now - self.started > self.ceiling_s:
            self.reason = f"it was still running {self.ceiling_s:.0f} s after the Stop request"
            return True
        if now - self._last > self.quiet_s:
            self.reason = (f"it showed no progress for {self.quiet_s:.0f} s after the Stop request (no step, no "
                           "message, no CPU time: stuck, e.g. in C++)")
            return True
        return False
