# Sourced by bin/ortlab and bin/test: make sure the project's environment exists, then use it.
# The environment lives outside the checkout, keyed by the lock file and the Python, so every checkout and CI run
# of the same lock reuses it; a missing one is built: venv and pinned packages (redone from nothing unless they
# finished), then ortlab and ORTModule's torch C++ extensions (redone until they finish). The packages are shared; ortlab's own code is not: each run puts its own
# checkout first on PYTHONPATH, so two checkouts (two branches) using one environment never run each other's code.
set -euo pipefail

ORTLAB_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Python 3.10 or 3.11: onnxruntime-training 1.19.2, ORTModule's last release, ships wheels for 3.8-3.11 and torch 2.6
# for 3.9-3.13. Each has its own lock (requirements.lock: 3.11; requirements-py310.lock: 3.10). The choice, in order:
# ORTLAB_PYTHON; the active python3 (so PYENV_VERSION=3.10.13, or a 3.10 bin/ first on PATH, gets 3.10); python3.11;
# python3.10. Prints the interpreter's real path (not a pyenv shim's).
_ortlab_python() {
  local candidate found="" pick='import sys; sys.exit(1) if sys.version_info[:2] not in ((3, 10), (3, 11)) else print(sys.executable)'
  if [ -n "${ORTLAB_PYTHON:-}" ]; then
    "$ORTLAB_PYTHON" -c "$pick" 2>/dev/null && return 0
    echo "ortlab: ORTLAB_PYTHON=$ORTLAB_PYTHON is not a Python 3.10 or 3.11 (one of the two is needed)" >&2
    return 1
  fi
  for candidate in python3 python3.11 python3.10; do
    command -v "$candidate" >/dev/null 2>&1 || continue
    if "$candidate" -c "$pick" 2>/dev/null; then
      [ "$candidate" = python3 ] || echo "ortlab: python3 is not 3.10 or 3.11 ($found); using $candidate" >&2
      return 0
    fi
    found="$found $candidate=$("$candidate" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)"
  done
  echo "ortlab: needs Python 3.10 or 3.11 (found:${found:- none}): onnxruntime-training 1.19.2, ORTModule's last" \
       "release, ships no wheel for Python 3.12 or newer. Install Python 3.11 (apt install python3.11-venv," \
       "pyenv install 3.11, or uv python install 3.11) and set ORTLAB_PYTHON=/path/to/python3.11" >&2
  return 1
}

_ortlab_ensure_env() {
  local python version full key root lock
  python=$(_ortlab_python)
  { read -r version; read -r full; } < <("$python" -c 'import platform, sys; print(platform.python_version()); print(sys.version)')
  lock="$ORTLAB_ROOT/requirements.lock"
  case "$version" in 3.10.*) lock="$ORTLAB_ROOT/requirements-py310.lock" ;; esac
  # ENV_RECIPE: bump it when the way the environment is built changes what is in it
  key=$( (cat "$lock"; echo "$full"; echo "recipe 2") | sha256sum | cut -c1-16)
  root=${ORTLAB_ENV_ROOT:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/ortlab}
  ORTLAB_VENV="$root/env-$key"
  mkdir -p "$root"
  exec 9>"$root/.lock-$key"  # one build at a time per environment; others (another Python) go on
  flock 9
  if [ ! -f "$ORTLAB_VENV/.packages" ]; then  # the packages once: a later step that failed does not redo them
    echo "ortlab: building the environment for Python $version ($python) from ${lock##*/} in $ORTLAB_VENV" >&2
    echo "ortlab: once per lock and Python: 3.5 GB of downloads, 7 GB on disk, then ORTModule's C++ extensions" \
         "compile (~4 min on 2 idle cores; 40+ min at nice 10 on a machine loaded 10x); progress below" >&2
    rm -rf "$ORTLAB_VENV"
    "$python" -m venv "$ORTLAB_VENV"
    "$python" "$ORTLAB_ROOT/scripts/install_progress.py" "$root/install-$key.log" "$ORTLAB_VENV" -- \
      "$ORTLAB_VENV/bin/python" -m pip install --no-input --disable-pip-version-check --progress-bar off \
      -r "$lock" || return 1
    touch "$ORTLAB_VENV/.packages"
  fi
  # ortlab itself, once (its entry point and metadata); the code each run uses is its checkout's (PYTHONPATH below)
  if [ ! -f "$ORTLAB_VENV/.complete" ]; then
    echo "ortlab: installing ortlab's entry point and metadata; then ORTModule's C++ extensions (torch loads first)" >&2
    if ! "$ORTLAB_VENV/bin/python" -m pip install --no-input --disable-pip-version-check --no-deps \
         --no-build-isolation -e "$ORTLAB_ROOT" >"$root/install-ortlab.log" 2>&1; then
      grep -v "^WARNING: Location" "$root/install-ortlab.log" | tail -25 >&2
      echo "ortlab: installing ortlab from $ORTLAB_ROOT failed; full log: $root/install-ortlab.log" >&2
      return 1
    fi
  fi
  export PYTHONPATH="$ORTLAB_ROOT${PYTHONPATH:+:$PYTHONPATH}" ORTLAB_LOCK="$lock"
  if [ ! -f "$ORTLAB_VENV/.complete" ]; then
    "$ORTLAB_VENV/bin/python" -m ortlab.cli setup
    touch "$ORTLAB_VENV/.complete"
  fi
  # the newest transformers in a side folder, for the model-family tests (requirements-side.lock; Python 3.11), and
  # torchvision and timm in another, for the model-zoo tests (requirements-zoo.lock); one Python for both
  local side
  side=$("$ORTLAB_VENV/bin/python" "$ORTLAB_ROOT/scripts/side_packages.py" --lock requirements-side.lock \
         --lock requirements-zoo.lock)
  ORTLAB_SIDE_PACKAGES=$(sed -n 1p <<<"$side")
  ORTLAB_ZOO_PACKAGES=$(sed -n 2p <<<"$side")
  flock -u 9
  export PATH="$ORTLAB_VENV/bin:$PATH" VIRTUAL_ENV="$ORTLAB_VENV" ORTLAB_SIDE_PACKAGES ORTLAB_ZOO_PACKAGES
}

_ortlab_ensure_env
