"""Prove ortlab's CUDA paths on a GPU machine, in one command from a plain checkout (no package registry needed):

    PYTHONPATH=. scripts/gpu_check [--out DIR] [--scale]

It runs the benchmarks whose targets hold on CUDA (statistics <= 1.15x a step, burst bookkeeping <= 1.05x, compile
bookkeeping <= 1.05x; short settings) and the tests marked `cuda` (tests/test_cuda.py: with pytest when it is
installed, else by calling each test itself), then prints ONE table: the card, torch and CUDA, each check with pass
or fail and each ratio against its target. Exit 0 only when all pass (a test that skips itself, e.g. ORTModule
without onnxruntime-training, is not a failure), 1 otherwise, 2 on a machine without a GPU (one line). The table
(table.txt, results.json) and every raw output (the benchmarks' logs and JSON, pytest's output) are written to
--out (default: $OUT when set, else ./gpu_check_out), so they can be brought back. 3 minutes on an H200
(2026-11-28), under 8: each part has a share of --budget (450 s) and is stopped past it. `--scale` adds the verdict
at scale (a 1B model compared and judged, the device's peak against 48 GB; its share: SCALE_SECONDS, and the budget
grows by as much).

ORTLAB_GPU_CHECK_FAKE_DEVICE=cpu (set only by tests/test_gpu_check.py) fakes the device check: the whole script runs
on the CPU with tiny settings, to prove the script itself end to end (its `cuda` tests then skip, saying why).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAKE = "ORTLAB_GPU_CHECK_FAKE_DEVICE"
BUDGET = 450.0  # seconds: the whole check stays under 8 minutes
# (name, script, arguments on CUDA, arguments when faked on the CPU, seconds of the default budget). Rounds: on an
# H200 (2026-11-28) one round of 40 steps is 0.2-0.3 s after the warm-up, and rounds of the same loop differ by up
# to 10%: 3 rounds put a 5% target within the noise, so each figure is the median of 7-15.
BENCHMARKS = [
    ("statistics", "stats_overhead.py",
     ["--models", "demo,gpt4", "--steps", "30", "--rounds", "7", "--backends", "pytorch", "--no-subscriber"],
     ["--models", "demo", "--steps", "4", "--rounds", "1", "--backends", "pytorch", "--no-subscriber"], 150),
    ("burst bookkeeping", "burst_overhead.py", ["--steps", "40", "--rounds", "11", "--backends", "pytorch"],
     ["--steps", "3", "--rounds", "1", "--backends", "pytorch"], 90),
    ("compile bookkeeping", "compile_overhead.py", ["--steps", "40", "--rounds", "15"],
     ["--steps", "3", "--rounds", "1"], 150),
]
TESTS = "tests/test_cuda.py"
SCALE_SECONDS = 300  # the verdict at scale's share of the default budget (when --scale adds it)
SCALE_PEAK_GB = 48.0  # its target: the device's peak while a 1B model is compared and judged (one 80 GB card)
SCALE_MODEL = ("ortlab.demo.sizes:llama_1b", [])  # on the CPU (faked): a small Llama of the same code
SCALE_FAKE = ("ortlab.demo.families:llama", [])
RESULT_LINE = re.compile(r"^(?:tests/)?test_cuda\.py::(\w+) (PASSED|FAILED|SKIPPED|ERROR)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu_check_out"),
                        help="where the table and the raw outputs go (default: $OUT, else ./gpu_check_out)")
    parser.add_argument("--budget", type=float, default=BUDGET,
                        help=f"seconds for the whole check (default {BUDGET:g}), shared among its parts")
    parser.add_argument("--only", choices=("benchmarks", "tests"), help="run only one part")
    parser.add_argument("--scale", action="store_true",
                        help="also the verdict at scale: a 1B model (Llama 3.2 1B's shapes, random weights) compared "
                        "on PyTorch and torch.compile and judged, the device's peak against 48 GB (SCALE_SECONDS of "
                        "the budget)")
    parser.add_argument("--bare-tests", type=Path, help=argparse.SUPPRESS)  # internal: the tests without pytest
    args = parser.parse_args(argv)
    if args.bare_tests:
        return bare_tests(args.bare_tests)
    fake = os.environ.get(FAKE) == "cpu"
    try:
        import torch
    except ImportError as e:
        print(f"gpu_check: torch cannot be imported here ({e}): run it where torch and a GPU are", file=sys.stderr)
        return 2
    if not fake and not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU here (torch.cuda.is_available() is False): it proves ortlab's CUDA paths on a "
              "GPU machine", file=sys.stderr)
        return 2
    device = "cpu" if fake else "cuda"
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    deadline = started + args.budget + (SCALE_SECONDS * args.budget / BUDGET if args.scale else 0.0)
    machine = describe(torch, fake)
    print(f"gpu_check: {machine['card']}; torch {machine['torch']}, CUDA {machine['cuda']}; outputs in {out}",
          flush=True)
    rows: list[dict] = []
    if args.only != "tests":
        for name, script, cuda_args, fake_args, share in BENCHMARKS:
            rows += benchmark(name, script, (fake_args if fake else cuda_args) + ["--device", device], out,
                              min(share * args.budget / BUDGET, remaining(deadline, started)), started)
    if args.scale:
        rows += scale(out, min(SCALE_SECONDS * args.budget / BUDGET, remaining(deadline, started)), started, fake)
    if args.only != "benchmarks":
        rows += tests(out, max(remaining(deadline, started), 30.0), started)
    elapsed = time.monotonic() - started
    ok = bool(rows) and all(r["result"] in ("pass", "skipped") for r in rows)
    table = render(machine, rows, elapsed, ok, out)
    print(table)
    (out / "table.txt").write_text(table + "\n", encoding="utf-8")
    (out / "results.json").write_text(json.dumps({"machine": machine, "rows": rows, "seconds": round(elapsed, 1),
                                                  "passed": ok}, indent=1), encoding="utf-8")
    return 0 if ok else 1


def describe(torch, fake: bool) -> dict:
    """The machine as the table names it."""
    if fake:
        card = "no GPU: the device check faked on the CPU (ORTLAB_GPU_CHECK_FAKE_DEVICE=cpu)"
    else:
        props = torch.cuda.get_device_properties(0)
        card = f"{props.name} ({props.total_memory / 2**30:.0f} GiB)"
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        commit = "?"
    return {"card": card, "torch": torch.__version__, "cuda": torch.version.cuda or "none",
            "python": platform.python_version(), "ortlab": commit, "date": time.strftime("%Y-%m-%d %H:%M")}


def remaining(deadline: float, started: float) -> float:
    return max(deadline - time.monotonic(), 0.0)


def child_env(**extra: str) -> dict:
    """The checkout first on PYTHONPATH (a plain checkout: ortlab is not installed)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "TQDM_DISABLE": "1", **extra}


def run(command: list[str], log: Path, timeout: float, env: dict) -> tuple[int | None, float]:
    """Run `command` with its output in `log`; (its exit code or None when it ran past `timeout`, seconds)."""
    began = time.monotonic()
    with log.open("w", encoding="utf-8") as f:
        f.write("$ " + " ".join(command) + "\n")
        f.flush()
        try:
            code = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                  timeout=max(timeout, 1.0)).returncode
        except subprocess.TimeoutExpired:
            f.write(f"\n[gpu_check] stopped after {timeout:.0f} s (its share of the budget)\n")
            code = None
    return code, time.monotonic() - began


def benchmark(name: str, script: str, arguments: list[str], out: Path, share: float, started: float) -> list[dict]:
    """One benchmark: a row per ratio it printed, against its target (a crash or a time-out is one failed row)."""
    stem = Path(script).stem
    result = out / f"{stem}.json"
    result.unlink(missing_ok=True)
    if share < 1:
        return [{"check": f"{name} ({stem})", "result": "fail", "note": "not run: the time budget was spent"}]
    print(f"[{time.monotonic() - started:5.0f} s] {stem} {' '.join(arguments)}", flush=True)
    code, seconds = run([sys.executable, str(ROOT / "benchmarks" / script), *arguments], out / f"{stem}.log", share,
                        child_env(ORTLAB_BENCHMARK_RESULT=str(result)))
    if not result.is_file():
        why = f"ran past its {share:.0f} s" if code is None else f"exit {code} before its ratios"
        return [{"check": f"{name} ({stem})", "result": "fail", "note": f"{why}: see {stem}.log"}]
    data = json.loads(result.read_text(encoding="utf-8"))
    rows = []
    for key, ratio in data["ratios"].items():
        target = data["targets"][key]
        rows.append({"check": f"{name} ({stem}: {key})", "result": "pass" if ratio <= target else "fail",
                     "measured": ratio, "target": target, "seconds": round(seconds, 1),
                     "device": data.get("device")})
    return rows


def scale(out: Path, share: float, started: float, fake: bool) -> list[dict]:
    """The verdict at scale: `ortlab burst` of a 1B model on PyTorch and torch.compile (aot_eager: AOTAutograd's
    graphs without inductor's minutes of compiling), parity, 3 steps, judged; the GPU's used memory sampled every
    0.2 s while it runs (NVML, else nvidia-smi). One row: the device's peak over its start against SCALE_PEAK_GB, and
    the verdict (a verdict not reached fails the row)."""
    check = "verdict at scale (1B Llama shapes, PyTorch vs torch.compile)"
    if share < 1:
        return [{"check": check, "result": "fail", "note": "not run: the time budget was spent"}]
    model, extra = SCALE_FAKE if fake else SCALE_MODEL
    folder = out / "scale-runs"
    command = [sys.executable, "-m", "ortlab.cli", "burst", "--model", model, *extra, "--backend", "pytorch,compile",
               "--compile-backend", "aot_eager", "--parity", "--steps", "3", "--no-memory", "--json", "--out",
               str(folder), "--device", "cpu" if fake else "cuda"]
    print(f"[{time.monotonic() - started:5.0f} s] verdict at scale: {' '.join(command[3:])}", flush=True)
    sampler = DeviceMemory(None if fake else 0)
    sampler.start()
    code, seconds = run(command, out / "scale.log", share, child_env())
    peak_gb = sampler.stop()
    verdicts = [json.loads((d / "verdict.json").read_text()) for d in sorted(folder.glob("*"))
                if (d / "verdict.json").is_file()] if folder.is_dir() else []
    status = verdicts[0]["status"] if verdicts else None
    (out / "scale.json").write_text(json.dumps({"peak_gb": peak_gb, "seconds": round(seconds, 1), "exit": code,
                                                "verdicts": verdicts}, indent=1), encoding="utf-8")
    note = (f"verdict: {status}" if status else f"no verdict (exit {code}): see scale.log") + \
        f"; {seconds:.0f} s" + ("" if peak_gb is not None else "; the device's memory could not be read")
    judged = status in ("agree", "diverged")
    within = peak_gb is not None and peak_gb < SCALE_PEAK_GB
    return [{"check": check, "result": "pass" if judged and (within or fake) else "fail",
             "measured": peak_gb, "target": SCALE_PEAK_GB, "unit": "GB", "seconds": round(seconds, 1), "note": note}]


class DeviceMemory:
    """The GPU's used memory sampled in a thread: its peak over what was used when sampling began, in GB."""

    def __init__(self, index: int | None):
        import threading

        self.index, self.peak, self.base = index, None, None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._nvml = self._handle() if index is not None else None

    def _handle(self):
        """NVML's handle of the device, once (None where NVML is not there: nvidia-smi is asked instead)."""
        try:
            import pynvml

            pynvml.nvmlInit()
            return pynvml, pynvml.nvmlDeviceGetHandleByIndex(self.index)
        except Exception:
            return None

    def _read(self) -> float | None:
        if self.index is None:
            return None
        try:
            nvml, handle = self._nvml
            return nvml.nvmlDeviceGetMemoryInfo(handle).used / 1e9
        except Exception:  # no NVML: nvidia-smi
            try:
                text = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                       f"--id={self.index}"], capture_output=True, text=True, timeout=5).stdout
                return float(text.strip().splitlines()[0]) * 2**20 / 1e9
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                return None

    def _loop(self) -> None:
        while not self._done.wait(0.2):
            used = self._read()
            if used is not None:
                self.peak = max(self.peak or 0.0, used)

    def start(self) -> None:
        self.base = self._read()
        self._thread.start()

    def stop(self) -> float | None:
        self._done.set()
        self._thread.join()
        if self.peak is None or self.base is None:
            return None
        return round(self.peak - self.base, 2)


def tests(out: Path, share: float, started: float) -> list[dict]:
    """The `cuda` tests: a row each (with pytest: its -v lines and junit XML; without: gpu_check calls them)."""
    import importlib.util

    print(f"[{time.monotonic() - started:5.0f} s] {TESTS}", flush=True)
    log = out / "cuda-tests.log"
    if importlib.util.find_spec("pytest") is not None:
        # addopts cleared: the suite's plugins (xdist, nbval, timeout) need not be there; a newer torch's deprecation
        # warnings are not what this proves (the suite turns ortlab's into errors)
        command = [sys.executable, "-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider", "-W",
                   "ignore::DeprecationWarning", "-m", "cuda", "-v", "-rs", "--junitxml", str(out / "cuda-tests.xml"),
                   TESTS]
        code, seconds = run(command, log, share, child_env())
        found = {m.group(1): m.group(2).lower() for m in map(RESULT_LINE.match, log.read_text().splitlines()) if m}
        reasons = skipped_reasons(out / "cuda-tests.xml")
    else:
        bare = out / "cuda-tests.json"
        code, seconds = run([sys.executable, str(Path(__file__).resolve()), "--bare-tests", str(bare)], log, share,
                            child_env())
        results = json.loads(bare.read_text()) if bare.is_file() else {}
        found = {k: v["result"] for k, v in results.items()}
        reasons = {k: v["note"] for k, v in results.items() if v.get("note")}
    names = test_names()
    rows = []
    for test in names:
        result = {"passed": "pass", "failed": "fail", "error": "fail", "skipped": "skipped"}.get(found.get(test, ""))
        note = reasons.get(test, "")
        if result is None:
            result, note = "fail", ("not run: the time budget was spent" if code is None else
                                    f"no result (exit {code}): see {log.name}")
        rows.append({"check": f"cuda test: {test}", "result": result, "note": note})
    if not names or (code not in (0, None) and all(r["result"] != "fail" for r in rows)):
        rows.append({"check": "cuda tests", "result": "fail", "note": f"exit {code}: see {log.name}"})
    print(f"[{time.monotonic() - started:5.0f} s] tests done in {seconds:.0f} s", flush=True)
    return rows


def test_names() -> list[str]:
    """The test functions of tests/test_cuda.py, in order (read from its source: no import needed here)."""
    return re.findall(r"^def (test_\w+)\(", (ROOT / TESTS).read_text(encoding="utf-8"), re.MULTILINE)


def skipped_reasons(xml: Path) -> dict[str, str]:
    """Why each skipped test skipped, from pytest's junit XML."""
    if not xml.is_file():
        return {}
    import xml.etree.ElementTree as ET

    out = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        skip = case.find("skipped")
        if skip is not None:
            out[case.get("name", "")] = (skip.get("message") or "").removeprefix("Skipped: ")
    return out


def bare_tests(path: Path) -> int:
    """Without pytest: call each test of tests/test_cuda.py with a fresh tmp_path; results to `path` as JSON."""
    import importlib.util
    import inspect
    import tempfile
    import traceback

    spec = importlib.util.spec_from_file_location("test_cuda", ROOT / TESTS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import torch

    results = {}
    for name in test_names():
        if not torch.cuda.is_available():
            results[name] = {"result": "skipped", "note": "no CUDA device: torch.cuda.is_available() is False"}
            continue
        fn = getattr(module, name)
        with tempfile.TemporaryDirectory() as tmp:
            kwargs = {"tmp_path": Path(tmp)} if "tmp_path" in inspect.signature(fn).parameters else {}
            try:
                fn(**kwargs)
                results[name] = {"result": "passed"}
            except module.SkipTest as e:
                results[name] = {"result": "skipped", "note": str(e)}
            except Exception as e:
                traceback.print_exc()
                results[name] = {"result": "failed", "note": f"{type(e).__name__}: {str(e)[:300]}"}
        print(f"{name} {results[name]['result'].upper()}", flush=True)
        path.write_text(json.dumps(results, indent=1), encoding="utf-8")
    path.write_text(json.dumps(results, indent=1), encoding="utf-8")
    return 0 if all(r["result"] != "failed" for r in results.values()) else 1


def render(machine: dict, rows: list[dict], seconds: float, ok: bool, out: Path) -> str:
    """The one table: the machine, then each check with its result, measured ratio and target."""
    width = max([len(r["check"]) for r in rows] + [20])
    lines = ["", f"ortlab gpu_check on {machine['card']}",
             f"torch {machine['torch']}, CUDA {machine['cuda']}, Python {machine['python']}, ortlab "
             f"{machine['ortlab']}, {machine['date']}", "",
             f"{'check':<{width}}  {'result':<7}  {'measured':>8}  {'target':>8}  note"]
    for r in rows:
        unit = r.get("unit")
        measured = ("" if r.get("measured") is None else f"{r['measured']:.1f} {unit}" if unit else
                    f"{r['measured']:.3f}x")
        target = ("" if r.get("target") is None else f"< {r['target']:g} {unit}" if unit else
                  f"<= {r['target']:g}x")
        lines.append(f"{r['check']:<{width}}  {r['result']:<7}  {measured:>8}  {target:>8}  {r.get('note', '')}")
    failed = sum(r["result"] == "fail" for r in rows)
    lines += ["", f"{'ALL PASSED' if ok else f'{failed} FAILED'}: {len(rows)} checks in {seconds / 60:.1f} min; "
              f"raw outputs in {out}"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
