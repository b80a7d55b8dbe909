"""Which clock judges a step's speed on a shared CPU: the demo model's steps on PyTorch and ORTModule, each step timed
by several clocks at once, with other work busy beside them (`--busy`: processes spinning in Python, on top of
whatever else the machine runs). For each clock: ORTModule's step time over PyTorch's and its 99 % interval after 20
and after 40 steps (ortlab.comparison.speed, the recommendation's), and Tune's baseline noise (three 8-step bursts,
3 of warm-up: `ortlab tune`'s defaults).

    python benchmarks/step_clock.py                     # 1 busy neighbour, 3 rounds, torch's threads on the cores
    python benchmarks/step_clock.py --busy 0            # the machine as it is
    python benchmarks/step_clock.py --threads 1         # one thread per step (torch's and ORT's)
    OMP_WAIT_POLICY=PASSIVE python benchmarks/step_clock.py   # torch's threads sleep rather than spin between ops

The clocks:
- wall: time.perf_counter (the neighbours' turns on the cores count);
- process CPU: time.process_time, every thread of the process (ORT's intra-op threads spin while they wait for
  work, and that spinning counts);
- thread CPU: time.thread_time, the calling thread's (work done on other threads is not counted): what the engine
  records as `step_cpu_s` for a step on one thread and judges it by (ortlab.engine.machine.StepClock,
  ortlab.runs.clock);
- wall - wait: wall time less the calling thread's wait for a core (/proc/thread-self/schedstat's second field; the
  kernel dates it by the scheduler's clock, so a step is now and then off by a tick, several ms).

Found on 2 shared cores (2026-11-28, load average 7-8, one busy neighbour added; two runs of 3 rounds each): with
`--threads 1` the thread's CPU time gave Tune's noise 6-26 % in five rounds of six (108 % in one) where wall time
gave 4,300-25,000 %, and its interval narrowed from 20 to 40 steps in five rounds of six (0.94x-1.08x to
0.92x-1.01x; in the sixth it stayed as narrow, 1.00x-1.13x and 1.02x-1.17x); with torch's two threads on the two
cores every clock failed (each thread spins at the end of each op for the other, which waits for a core: the CPU
time swells with the load; Tune's noise by it 48-2,600 %), OMP_WAIT_POLICY=PASSIVE brought the thread's CPU time to
23-44 %, but its ratio moved with where the work ran (1.62x, 0.95x, 1.29x over the rounds).

An interval counts the wait for a core as a fixed error for the wall clock (`speed.load_share`), none for the others.
"fastest" is the ratio of the fastest steps' wall times (the median of each backend's 5 fastest). Measured on the
CPU only: a CUDA step's time is the GPU's, kept as wall time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

from ortlab.comparison import speed
from ortlab.demo import gpt
from ortlab.engine.machine import available_cores, cpu_wait_seconds

CLOCKS = ("wall", "process CPU", "thread CPU", "wall - wait")


def _now() -> tuple[float, ...]:
    return time.perf_counter(), time.process_time(), time.thread_time(), cpu_wait_seconds() or 0.0


def _clocks(start: tuple[float, ...], end: tuple[float, ...]) -> dict[str, float]:
    wall, process, thread, waited = (b - a for a, b in zip(start, end, strict=True))
    return {"wall": wall, "process CPU": process, "thread CPU": thread, "wall - wait": max(wall - waited, 1e-9)}


class Backend:
    """The demo model on one backend, trained step after step (its bursts follow each other, as a session's do)."""

    def __init__(self, name: str, threads: int):
        self.workload = gpt()
        self.model = self.workload.model
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.runner = self.model
        self.step = 0
        if name == "ortmodule":
            from onnxruntime.training.ortmodule import ORTModule

            from ortlab import _ort

            _ort.session_threads(threads)  # as the engine does: ORT's pool on the cores this process gets
            self.runner = ORTModule(self.model)

    def burst(self, steps: int) -> tuple[list[dict[str, float]], float]:
        """Each step's clocks, and the share of the burst's wall time the main thread waited for a core."""
        rows, wait, started = [], cpu_wait_seconds() or 0.0, time.perf_counter()
        for _ in range(steps):
            x, y = self.workload.batch(self.step)
            self.step += 1
            begin = _now()
            loss = self.workload.loss(self.runner(x), y)
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            rows.append(_clocks(begin, _now()))
        return rows, ((cpu_wait_seconds() or 0.0) - wait) / max(time.perf_counter() - started, 1e-9)


def _interval(pt: list[list[float]], ort: list[list[float]], loads: tuple[list[float], list[float]]) -> speed.Ratio:
    return speed.ratio(speed.spread(ort, loads[1]), speed.spread(pt, loads[0]))


def _round(backends: dict[str, Backend], clock_loads: bool) -> dict[str, dict[str, object]]:
    """One round: a 40-step burst of each backend, then three 8-step ORTModule bursts (Tune's baseline)."""
    long = {name: b.burst(40) for name, b in backends.items()}
    tune = [backends["ortmodule"].burst(8) for _ in range(3)]
    out = {}
    fastest = {n: statistics.median(sorted(r["wall"] for r in rows[2:])[:5]) for n, (rows, _) in long.items()}
    for clock in CLOCKS:
        def times(rows: list[dict[str, float]], clock: str = clock) -> list[float]:
            return [r[clock] for r in rows]

        load = clock == "wall" and clock_loads
        loads = tuple([long[n][1]] if load else [0.0] for n in ("pytorch", "ortmodule"))
        r20 = _interval([times(long["pytorch"][0][:20])], [times(long["ortmodule"][0][:20])], loads)
        r40 = _interval([times(long["pytorch"][0])], [times(long["ortmodule"][0])], loads)
        base = speed.spread([times(rows)[3:] for rows, _ in tune], [w if load else 0.0 for _, w in tune], warmup=0)
        out[clock] = {"r20": r20, "r40": r40, "noise": speed.relative_noise(base) if base else float("inf"),
                      "truth": fastest["ortmodule"] / fastest["pytorch"],
                      **{f"{k}_ms": 1000 * statistics.median(times(long[n][0][2:]))
                         for k, n in (("pt", "pytorch"), ("ort", "ortmodule"))}}
    out["_wait"] = {n: long[n][1] for n in long}
    return out


def _spinner() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while 1: pass"])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=1, help="processes spinning beside the steps (default 1)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=available_cores(),
                        help="torch's and ORT's intra-op threads (default: the cores this process gets, as a burst)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    backends = {"pytorch": Backend("pytorch", args.threads), "ortmodule": Backend("ortmodule", args.threads)}
    for b in backends.values():
        b.burst(3)  # ORT's export and first session; caches
    neighbours = [_spinner() for _ in range(args.busy)]
    try:
        rounds = [_round(backends, clock_loads=True) for _ in range(args.rounds)]
    finally:
        for p in neighbours:
            p.kill()
            p.wait()
    policy = os.environ.get("OMP_WAIT_POLICY", "unset")
    print(f"the demo model on cpu ({available_cores()} cores, torch {torch.__version__}, {torch.get_num_threads()} "
          f"threads, OMP_WAIT_POLICY {policy}), {args.busy} busy neighbour{'s' * (args.busy != 1)} beside the "
          f"machine's own load (load average {os.getloadavg()[0]:.1f})")
    for i, r in enumerate(rounds, 1):
        waits = ", ".join(f"{n} {w:.0%}" for n, w in r["_wait"].items())
        print(f"\nround {i}: the main thread waited for a core {waits} of its 40-step burst; the fastest steps' "
              f"ratio (ORTModule / PyTorch wall): {r['wall']['truth']:.2f}x")
        print(f"{'clock':<12} {'PyTorch ms':>10} {'ORT ms':>7} {'ratio 20':>9} {'interval 20 steps':>18} "
              f"{'ratio 40':>9} {'interval 40 steps':>18} {'narrower':>8} {'Tune noise':>11}")
        for clock in CLOCKS:
            c = r[clock]
            r20, r40, noise = c["r20"], c["r40"], c["noise"]
            print(f"{clock:<12} {c['pt_ms']:10.1f} {c['ort_ms']:7.1f} {r20.value:8.2f}x {_span(r20):>18} "
                  f"{r40.value:8.2f}x {_span(r40):>18} {'yes' if _width(r40) < _width(r20) else 'NO':>8} "
                  f"{'>1000x' if noise >= 1000 else f'{100 * noise:.0f}%':>11}")
    print("\nper clock over the rounds: the interval narrower at 40 steps than at 20; Tune's noise under 50 %; its "
          "median ratio over the fastest steps' ratio")
    for clock in CLOCKS:
        narrower = sum(_width(r[clock]["r40"]) < _width(r[clock]["r20"]) for r in rounds)
        quiet = sum(r[clock]["noise"] < 0.5 for r in rounds)
        bias = statistics.median(r[clock]["r40"].value / r[clock]["truth"] for r in rounds)
        noises = ", ".join(f"{100 * r[clock]['noise']:.0f}%" if r[clock]["noise"] < 1000 else ">1000x"
                           for r in rounds)
        print(f"{clock:<12} narrower {narrower}/{len(rounds)}, noise < 50 % {quiet}/{len(rounds)} ({noises}), "
              f"ratio / fastest steps' ratio {bias:.2f}")
    return 0


def _span(r: speed.Ratio) -> str:
    return f"{speed.times(r.low)}-{speed.times(r.high)}"


def _width(r: speed.Ratio) -> float:
    return r.high / r.low if r.low > 0 else float("inf")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
