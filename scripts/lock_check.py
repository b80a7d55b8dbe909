"""Is each lock installable on its Python? Two checks, run with the project's environment's Python (packaging).

`python scripts/lock_check.py report REPORT.json VERSION`: every package of a pip `--report` must admit Python
VERSION by its requires_python (scripts/lock runs it on each lock's resolve: a dry run does not enforce
requires_python when the index does not publish it, so a pin like networkx 3.6.1, which needs 3.11, passed).

`python scripts/lock_check.py install LOCK PYTHON`: install LOCK with PYTHON into a throwaway venv exactly
(`--no-deps`: nothing unpinned slips in), then `pip check` (every dependency pinned, for that Python's markers).
Done once per lock text and Python (a marker under ORTLAB_ENV_ROOT), so CI pays for it only when a lock changed
(.ci/run runs it for the lock bin/test does not build: ~2.5 GB of downloads, a few minutes, no compiling)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.specifiers import SpecifierSet


def inadmissible(report: dict, version: str) -> list[str]:
    """The packages of a pip report whose requires_python excludes `version`, as 'name==version (requires ...)'."""
    bad = []
    for item in report["install"]:
        meta = item["metadata"]
        spec = meta.get("requires_python")
        if spec and not SpecifierSet(spec).contains(version, prereleases=True):
            bad.append(f"{meta['name']}=={meta['version']} (requires Python {spec})")
    return bad


def check_report(path: str, version: str) -> int:
    bad = inadmissible(json.loads(Path(path).read_text()), version)
    for line in bad:
        print(f"lock_check: {line} does not install on Python {version}", file=sys.stderr)
    return 1 if bad else 0


def check_install(lock: str, python: str) -> int:
    version = subprocess.run([python, "-c", "import sys; print(sys.version)"], capture_output=True, text=True,
                             check=True).stdout
    key = hashlib.sha256(Path(lock).read_bytes() + version.encode()).hexdigest()[:16]
    root = Path(os.environ.get("ORTLAB_ENV_ROOT") or Path(os.environ.get("XDG_CACHE_HOME") or
                                                          Path.home() / ".cache") / "ortlab")
    marker = root / f"lock-installed-{key}"
    if marker.is_file():
        print(f"lock_check: {Path(lock).name} already installed on Python {version.split()[0]} ({marker})")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "--no-input"]
        print(f"lock_check: installing {Path(lock).name} on Python {version.split()[0]} into a throwaway venv",
              flush=True)
        for step in (["install", "--progress-bar", "off", "--no-deps", "--only-binary=:all:", "-r", lock],
                     ["check"]):
            done = subprocess.run(pip + step, capture_output=True, text=True)
            if done.returncode != 0:
                lines = (done.stdout + done.stderr).splitlines()
                print("\n".join([ln for ln in lines if ln.startswith("ERROR")] + lines[-15:]), file=sys.stderr)
                print(f"lock_check: `pip {step[0]}` of {lock} on Python {version.split()[0]} failed", file=sys.stderr)
                return 1
    root.mkdir(parents=True, exist_ok=True)
    marker.touch()
    print(f"lock_check: {Path(lock).name} installs on Python {version.split()[0]}, every dependency pinned")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "report":
        return check_report(argv[1], argv[2])
    if len(argv) == 3 and argv[0] == "install":
        return check_install(argv[1], argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
