"""How much memory this process may use (its cgroup's limit, else the machine's), how much is free now, and whether
the kernel killed a process for memory: what turns a worker's SIGKILL into "out of memory" in one line, and a model
too large for the machine into a refusal before its burst starts. Linux (cgroup v1 and v2); elsewhere the machine's
figures are unknown and nothing is refused.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CGROUP_ROOT = Path("/sys/fs/cgroup")
MOMENTS = {"sgd": 1, "adamw": 2, "auto": 2, "zero1": 2, "fused_adam": 2}  # optimizer state a parameter, in its size
UNLIMITED = 2**60  # a cgroup limit at or above this is no limit (v1 writes 9223372036854771712)


@dataclass(frozen=True)
class Limit:
    """The most memory this process's processes may hold together, and who sets it."""

    bytes: int
    source: str  # "cgroup memory.max (/sys/fs/cgroup/...)", "the machine's memory (MemTotal)"

    def __str__(self) -> str:
        return f"{gb(self.bytes)} ({self.source})"


def gb(n: float | None) -> str:
    """Bytes as a person reads them: "10.4 GB", "512 MB"."""
    if n is None:
        return "an unknown amount"
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def _cgroup_dirs() -> list[Path]:
    """This process's memory cgroup and its ancestors, innermost first (cgroup v2's unified hierarchy, else v1's
    memory controller); [] where there is none."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: the unified hierarchy, at the root or under unified/ (hybrid)
            bases = [CGROUP_ROOT, CGROUP_ROOT / "unified"]
        elif "memory" in controllers.split(","):
            bases = [CGROUP_ROOT / "memory"]
        else:
            continue
        for base in bases:
            here = base / path.lstrip("/")
            if not ((here / "memory.max").exists() or (here / "memory.limit_in_bytes").exists()):
                continue
            chain = []
            while True:
                chain.append(here)
                if here == base:
                    return chain
                here = here.parent
    return []


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _meminfo(key: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def limit() -> Limit | None:
    """The tightest memory limit over this process: its cgroups' (v2 memory.max, v1 memory.limit_in_bytes), or the
    machine's memory; None where neither can be read."""
    best: Limit | None = None
    for d in _cgroup_dirs():
        for name in ("memory.max", "memory.limit_in_bytes"):
            value = _read_int(d / name)
            if value is not None and value < UNLIMITED and (best is None or value < best.bytes):
                best = Limit(value, f"its cgroup's {name}")
    total = _meminfo("MemTotal")
    if total is not None and (best is None or total < best.bytes):
        best = Limit(total, "the machine's memory (MemTotal)")
    return best


def available() -> int | None:
    """Bytes this process could still take: the machine's MemAvailable, capped by what its cgroups have left."""
    free = _meminfo("MemAvailable")
    for d in _cgroup_dirs():
        for cap, used in (("memory.max", "memory.current"), ("memory.limit_in_bytes", "memory.usage_in_bytes")):
            c, u = _read_int(d / cap), _read_int(d / used)
            if c is not None and u is not None and c < UNLIMITED:
                left = max(c - u, 0)
                free = left if free is None else min(free, left)
    return free


def oom_kills() -> int | None:
    """How many processes of this process's cgroup the kernel's OOM killer has killed so far (v2 memory.events'
    oom_kill, v1 memory.oom_control's), None where it is not counted."""
    for d in _cgroup_dirs():
        for name in ("memory.events", "memory.oom_control"):
            with contextlib.suppress(OSError, ValueError):
                for line in (d / name).read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
    return None


def peak_resident(pid: int) -> int | None:
    """A live process's peak resident set (VmHWM) in bytes, None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            with contextlib.suppress(ValueError, IndexError):
                return int(line.split()[1]) * 1024
    return None


class Watch:
    """A child process watched for memory: its peak resident set as last seen (sampled at most every `every`
    seconds while it lives), and the OOM kills counted since the watch began, to name a SIGKILL."""

    def __init__(self, pid: int, every: float = 0.5):
        self.pid, self.every = pid, every
        self.peak: int | None = None
        self.kills_before = oom_kills()
        self._next = time.monotonic()

    def sample(self) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.every
        seen = peak_resident(self.pid)
        if seen is not None:
            self.peak = max(self.peak or 0, seen)

    def restart(self) -> None:
        """Count OOM kills from now (a new request to the same process)."""
        self.kills_before = oom_kills()

    def killed_for_memory(self, signal_name: str | None) -> str | None:
        """Why the process died, when memory is the reason: the OOM killer counted a kill since the watch began (or
        a SIGKILL with its peak within 10% of the limit). A sentence naming what it held and what is allowed;
        None when memory is not the reason that can be shown."""
        if signal_name != "SIGKILL":
            return None
        after = oom_kills()
        counted = after is not None and self.kills_before is not None and after > self.kills_before
        allowed = limit()
        near = self.peak is not None and allowed is not None and self.peak >= 0.9 * allowed.bytes
        if not (counted or near):
            return None
        how = "the kernel's OOM killer" + (" (its cgroup's count of OOM kills went up)" if counted else "")
        held = f"it held {gb(self.peak)} at its peak (resident set)" if self.peak else "its peak is not known"
        return f"killed for memory by {how}: {held}; the limit is {allowed if allowed else 'unknown'}"


def free(device: Any) -> tuple[int | None, str]:
    """Bytes free where `device` trains, and what was read: the GPU's free memory plus what torch's caching
    allocator holds unused, or this machine's available memory (capped by its cgroup's); None where it cannot be
    read."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        try:
            free_now, total = torch.cuda.mem_get_info(device)
        except (RuntimeError, AssertionError):
            return None, "free on the GPU"
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return free_now + cached, f"free on the GPU ({torch.cuda.get_device_name(device)}, of {gb(total)})"
    allowed = limit()
    return available(), "available on this machine" + (f" (its limit: {allowed})" if allowed else "")


def training_need(model: Any, optimizer: str, device: Any) -> dict[str, int]:
    """What a burst adds to hold the model's training state, at least (its activations are not counted: unknown
    before a step runs): the gradients, the optimizer's state (AdamW: two moments; SGD: momentum) and, on a GPU,
    the weights themselves, in the parameters' dtypes."""
    trained = [p for p in model.parameters() if p.requires_grad]
    grads = sum(p.numel() * p.element_size() for p in trained)
    parts = {"gradients": grads, "the optimizer's state": MOMENTS.get(str(optimizer), 2) * grads}
    if getattr(device, "type", str(device)) == "cuda":
        on_cpu = sum(p.numel() * p.element_size() for p in model.parameters() if p.device.type != "cuda")
        parts = {"the weights": on_cpu, **parts}
    return parts


def refuse_unfit(model: Any, optimizer: str, device: Any, label: str) -> str | None:
    """One line when the model's training state alone (training_need) exceeds the memory free where it trains:
    the machine's available memory (and its cgroup's), or the GPU's free memory; None when it fits or the free
    memory cannot be read."""
    parts = training_need(model, optimizer, device)
    need = sum(parts.values())
    have, where = free(device)
    if have is None or need <= have:
        return None
    count = sum(p.numel() for p in model.parameters())
    return (f"{label} ({count / 1e6:.0f}M parameters) needs at least {gb(need)} more to train with "
            f"{optimizer} (" + ", ".join(f"{k} {gb(v)}" for k, v in parts.items() if v) + "; its activations not "
            f"counted), and {gb(have)} is {where}: it cannot train here; a machine with more memory, a smaller "
            "model, or optimizer sgd (one moment, not two)")
