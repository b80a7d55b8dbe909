"""Install side locks into side folders and print each folder, a line per lock. Usage:
python scripts/side_packages.py [--lock NAME]... [FOLDER] (default lock: requirements-side.lock; default folder:
<this environment>/side-<lock hash>; FOLDER only with one lock).

Four side locks: requirements-side.lock (the newest transformers, for the model-family tests),
requirements-zoo.lock (torchvision and timm, for the model-zoo tests of the verdict and of `check`),
requirements-report.lock (Google Model Explorer and its ONNX adapter, for the per-node overlay test) and
requirements-typecheck.lock (mypy, for the type check of the fast tier, tests/test_types.py). Each is
installed with --no-deps beside the pinned torch, into its own folder, which goes first on PYTHONPATH for the
processes that use it; ortlab's environment is not touched. Installed once: a `.complete` marker is written last,
so an interrupted install is redone. A lock whose packages need a newer Python prints an empty line (the newest
transformers needs Python 3.11: the family tests with it are skipped on 3.10)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCKS = {"requirements-side.lock": (3, 11), "requirements-zoo.lock": (3, 10),  # each lock's oldest Python
         "requirements-report.lock": (3, 10), "requirements-typecheck.lock": (3, 10)}


def default_folder(lock: Path) -> Path:
    digest = hashlib.sha256(lock.read_bytes()).hexdigest()[:12]
    return Path(sys.prefix) / f"side-{digest}"


def _names(lock: Path) -> list[str]:
    return [line.split("==")[0] for line in lock.read_text().splitlines() if "==" in line and not line.startswith("#")]


def install(lock: Path, folder: Path) -> Path:
    if (folder / ".complete").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    log = folder.with_name(folder.name + ".log")
    print(f"ortlab: installing {lock.name} ({', '.join(_names(lock))}) into {folder}, once, for the tests that use "
          f"it; log: {log}", file=sys.stderr, flush=True)
    with open(log, "w") as out:
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
                               "--no-deps", "--upgrade", "--target", str(folder), "-r", str(lock)],
                              stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-20:])
        sys.exit(f"{tail}\nortlab: installing {lock.name} into {folder} failed; full log: {log}")
    (folder / ".complete").touch()
    return folder


def main(argv: list[str]) -> None:
    names = []
    while argv[:1] == ["--lock"]:
        names, argv = [*names, argv[1]], argv[2:]
    for name in names or ["requirements-side.lock"]:
        if name not in LOCKS:
            sys.exit(f"side_packages: unknown lock {name!r}; one of {', '.join(LOCKS)}")
        if sys.version_info < LOCKS[name]:
            print()  # an empty line: this lock's packages need a newer Python
            continue
        lock = ROOT / name
        print(install(lock, Path(argv[0]) if argv else default_folder(lock)))


if __name__ == "__main__":
    main(sys.argv[1:])
