"""The load of the suite's stress mode (`pytest --stress`): what a shared machine does to a burst beside it.

`python tests/scripts/load.py FOLDER` starts, and keeps running until it is ended: two processes that import torch
and train a small model with torch's default thread count (every core), one that starts Python and imports torch
over and over, and one that writes, syncs and deletes files in FOLDER. Each touches FOLDER/ready-<name> once it
is loading the machine. Each process dies with its parent (the suite pauses the load with SIGSTOP between
tests, when it could not end by itself).
"""

import os
import subprocess
import sys
import time
from multiprocessing import Process
from pathlib import Path


def _ready(folder: Path, name: str) -> None:
    (folder / f"ready-{name}").touch()


def _die_with_parent() -> None:
    """SIGKILL this process when its parent ends (Linux prctl PR_SET_PDEATHSIG), stopped or not."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def train(folder: Path, name: str) -> None:
    _die_with_parent()
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512))
    optimizer = torch.optim.AdamW(model.parameters())
    x = torch.randn(256, 512)
    _ready(folder, name)
    while True:
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def imports(folder: Path, name: str) -> None:
    _die_with_parent()
    _ready(folder, name)
    while True:
        subprocess.run([sys.executable, "-c", "import torch, torch.nn"], check=False, preexec_fn=_die_with_parent)


def disk(folder: Path, name: str) -> None:
    _die_with_parent()
    block = os.urandom(8 << 20)
    _ready(folder, name)
    while True:
        path = folder / "load.bin"
        with open(path, "wb") as f:
            for _ in range(8):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        path.unlink()


def main(folder: Path) -> None:
    _die_with_parent()
    folder.mkdir(parents=True, exist_ok=True)
    jobs = [Process(target=train, args=(folder, "train-1")), Process(target=train, args=(folder, "train-2")),
            Process(target=imports, args=(folder, "imports")), Process(target=disk, args=(folder, "disk"))]
    for job in jobs:
        job.start()
    while all(job.is_alive() for job in jobs):
        time.sleep(0.5)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
