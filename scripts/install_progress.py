"""Run a pip install for bin/_env.sh and say what it is doing: pip's full output goes to a log, the terminal gets a
line per download with its size and the total so far, and a line at least every ~20 s while pip is quiet (a large
download, unpacking), with the elapsed time and the environment's size. A failed install shows pip's error lines
first (the resolver's notices bury them otherwise), then the log's path. Standard library only: it runs with the
Python the environment is built from, before the environment exists.

Usage: python scripts/install_progress.py LOG ENV_FOLDER -- pip-command..."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
import time

QUIET_S = 15  # pip quiet this long gets a line (measuring the environment adds seconds on a busy machine)
# pip's "Downloading torch-2.6.0-cp310-...whl (766.7 MB)", "Using cached ...whl (1.2 MB)"
FETCH = re.compile(r"^\s*(Downloading|Using cached) (\S+) \((\d+(?:\.\d+)?) (kB|MB|GB)\)")
UNITS = {"kB": 1e3, "MB": 1e6, "GB": 1e9}


def _size(path: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # a file pip just moved
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def _human(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def _clock(seconds: float) -> str:
    return f"{int(seconds) // 60}m{int(seconds) % 60:02d}s"


class Progress:
    def __init__(self, env: str):
        self.env, self.start, self.last = env, time.monotonic(), time.monotonic()
        self.downloaded = self.cached = 0.0
        self.doing = "resolving the pinned packages"
        self.lock = threading.Lock()

    def say(self, text: str) -> None:
        with self.lock:
            print(f"ortlab: [{_clock(time.monotonic() - self.start)}] {text}", file=sys.stderr, flush=True)
            self.last = time.monotonic()

    def line(self, line: str) -> None:
        fetched = FETCH.match(line)
        if fetched and not fetched.group(2).endswith(".metadata"):
            verb, file, amount, unit = fetched.groups()
            name = "-".join(file.rsplit("/", 1)[-1].split("-")[:2])  # torch-2.6.0
            size = float(amount) * UNITS[unit]
            if verb == "Downloading":
                self.downloaded += size
                self.doing = f"downloading {name} ({amount} {unit})"
                self.say(f"{self.doing}; {_human(self.downloaded)} downloaded so far")
            else:
                self.cached += size
                self.doing = f"taking {name} from pip's cache"
        elif line.startswith("Installing collected packages"):
            self.doing = "unpacking the packages into the environment"
            self.say(f"downloads done ({_human(self.downloaded)} downloaded, {_human(self.cached)} from pip's "
                     f"cache); {self.doing}")

    def heartbeat(self, done: threading.Event) -> None:
        while not done.wait(2):
            if time.monotonic() - self.last >= QUIET_S:
                self.say(f"still {self.doing} (environment: {_human(_size(self.env))})")


def main(argv: list[str]) -> int:
    log_path, env, command = argv[0], argv[1], argv[argv.index("--") + 1:]
    progress = Progress(env)
    done = threading.Event()
    threading.Thread(target=progress.heartbeat, args=(done,), daemon=True).start()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", env=dict(os.environ, PYTHONUNBUFFERED="1"))
        lines = []
        for line in proc.stdout:
            log.write(line)
            log.flush()
            lines.append(line.rstrip("\n"))
            progress.line(line)
        code = proc.wait()
    done.set()
    if code == 0:
        progress.say(f"packages installed: {_human(progress.downloaded)} downloaded, environment "
                     f"{_human(_size(env))}")
        return 0
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    rest = [ln for ln in lines[-12:] if ln not in errors and not ln.startswith("WARNING: Location")]
    print("\n".join([*errors, "", "pip's last lines:", *rest]), file=sys.stderr)
    print(f"ortlab: installing the pinned packages failed (pip exit {code}); full log: {log_path}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
