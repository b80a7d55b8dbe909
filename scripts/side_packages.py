"""Install requirements-side.lock into a side folder (the newest transformers, for the model-family tests) and
print the folder. Usage: python scripts/side_packages.py [FOLDER] (default: <this environment>/side-<lock hash>).

The folder goes first on PYTHONPATH for the processes that use it; ortlab's environment is not touched. Installed
once: a `.complete` marker is written last, so an interrupted install is redone. On Python 3.10 it prints nothing:
the newest transformers needs Python 3.11 (the family tests with it are skipped there)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

LOCK = Path(__file__).resolve().parents[1] / "requirements-side.lock"


def default_folder() -> Path:
    digest = hashlib.sha256(LOCK.read_bytes()).hexdigest()[:12]
    return Path(sys.prefix) / f"side-{digest}"


def install(folder: Path) -> Path:
    if (folder / ".complete").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    log = folder.with_name(folder.name + ".log")
    with open(log, "w") as out:
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
                               "--no-deps", "--upgrade", "--target", str(folder), "-r", str(LOCK)],
                              stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-20:])
        sys.exit(f"{tail}\nortlab: installing {LOCK.name} into {folder} failed; full log: {log}")
    (folder / ".complete").touch()
    return folder


if __name__ == "__main__":
    if sys.version_info < (3, 11):
        sys.exit(0)
    print(install(Path(sys.argv[1]) if len(sys.argv) > 1 else default_folder()))
