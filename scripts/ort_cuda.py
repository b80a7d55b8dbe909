"""The CUDA 11.8 libraries ORT's CUDA execution provider loads, for the ort stack on a machine with a GPU.

onnxruntime-training 1.19.2 is a CUDA 11.8 build: its provider library needs cuBLAS 11, cuDNN 8, cuFFT 10, cuRAND 10
and the CUDA 11.8 runtime, which torch 2.6.0's wheel (CUDA 12) does not bring. Where a GPU is found, bin/_env.sh runs
this once per environment: requirements-ort-cuda.lock is installed into a folder of its own inside the environment
(`ort-cuda11/`, so that torch's CUDA 12 packages are not touched), and every run prints the library folders, which
bin/_env.sh puts on LD_LIBRARY_PATH before Python starts (the dynamic loader reads it only at process start).
Without a GPU it prints nothing and installs nothing. Standard library only.

Usage: python scripts/ort_cuda.py ENV_FOLDER   (ORTLAB_GPU=1 or 0 overrides the GPU check)"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements-ort-cuda.lock"


def gpu_present() -> bool:
    """An NVIDIA GPU the driver sees (its /proc entries, else nvidia-smi); ORTLAB_GPU=1/0 decides instead."""
    asked = os.environ.get("ORTLAB_GPU")
    if asked in ("0", "1"):
        return asked == "1"
    gpus = Path("/proc/driver/nvidia/gpus")
    if gpus.is_dir() and any(gpus.iterdir()):
        return True
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "GPU" in out


def library_dirs(folder: Path) -> list[Path]:
    """The lib folders of the installed packages (nvidia/<name>/lib), in a stable order."""
    return sorted(p for p in folder.glob("nvidia/*/lib") if p.is_dir())


def ensure(env: Path, log=lambda line: print(line, file=sys.stderr, flush=True)) -> list[Path]:
    """Install the lock into env/ort-cuda11 once (a marker with the lock's hash is written last, so an interrupted
    or outdated install is redone), then return its library folders."""
    folder = env / "ort-cuda11"
    marker = folder / f".complete-{hashlib.sha256(LOCK.read_bytes()).hexdigest()[:12]}"
    if not marker.is_file():
        log(f"ortlab: a GPU is here: installing the CUDA 11.8 libraries ORT's CUDA execution provider loads "
            f"({LOCK.name}: about 1.4 GB of downloads) into {folder}, once")
        folder.mkdir(parents=True, exist_ok=True)
        logfile = env / "install-ort-cuda.log"
        with open(logfile, "w") as out:
            done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
                                   "--progress-bar", "off", "--no-deps", "--upgrade", "--target", str(folder),
                                   "-r", str(LOCK)], stdout=out, stderr=subprocess.STDOUT)
        if done.returncode != 0:
            tail = "".join(logfile.read_text(errors="replace").splitlines(keepends=True)[-15:])
            raise SystemExit(f"{tail}\nortlab: installing {LOCK.name} into {folder} failed; full log: {logfile}")
        marker.touch()
    return library_dirs(folder)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    if gpu_present():
        print(":".join(str(p) for p in ensure(Path(argv[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
