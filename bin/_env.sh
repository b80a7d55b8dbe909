# Sourced by bin/ortlab and bin/test: make sure the project's environment exists, then use it.
# The environment lives outside the checkout, keyed by the lock file and the Python, so every checkout and CI run
# of the same lock reuses it; a missing one is built: venv and pinned packages (redone from nothing unless they
# finished), then ortlab and ORTModule's torch C++ extensions (redone until they finish). The packages are shared; ortlab's own code is not: each run puts its own
# checkout first on PYTHONPATH, so two checkouts (two branches) using one environment never run each other's code.
set -euo pipefail

ORTLAB_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Two stacks (ortlab/stacks/table.py holds the same table):
#   ort      Python 3.10/3.11, torch 2.6.0, onnxruntime-training 1.19.2 (ORTModule's last release: wheels up to 3.11,
#            extensions that load up to torch 2.6): requirements.lock (3.11), requirements-py310.lock (3.10)
#   current  Python 3.12/3.13, the newest torch pip installs here, no ORTModule (PyTorch and torch.compile):
#            requirements-current.lock (3.12), requirements-current-py313.lock (3.13)
# The stack follows the Python found, or ORTLAB_STACK=ort|current asks for one. The Python, in order: ORTLAB_PYTHON;
# the active python3 (so PYENV_VERSION=3.10.13, or a 3.10 bin/ first on PATH, gets 3.10) when it suits the stack;
# python3.11, python3.10 (ort), python3.12, python3.13 (current), on PATH or installed by pyenv. Prints the
# interpreter's real path (not a pyenv shim's) and its stack.
_ortlab_stack_of() { case "$1" in 3.10|3.11) echo ort ;; 3.12|3.13) echo current ;; *) return 1 ;; esac; }
_ortlab_minor() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null; }
_ortlab_python() {
  local want=${ORTLAB_STACK:-} candidate minor stack found="" versions
  case "$want" in
    ""|ort|current) ;;
    *) echo "ortlab: ORTLAB_STACK=$want is not a stack; allowed: ort (Python 3.10/3.11, ORTModule), current" \
            "(Python 3.12/3.13, the newest torch)" >&2; return 1 ;;
  esac
  if [ -n "${ORTLAB_PYTHON:-}" ]; then
    minor=$(_ortlab_minor "$ORTLAB_PYTHON") || true
    stack=$(_ortlab_stack_of "$minor") || stack=""
    if [ -n "$stack" ] && { [ -z "$want" ] || [ "$want" = "$stack" ]; }; then
      echo "$("$ORTLAB_PYTHON" -c 'import sys; print(sys.executable)') $stack"; return 0
    fi
    echo "ortlab: ORTLAB_PYTHON=$ORTLAB_PYTHON is not a Python ${want:+of the $want stack }(${minor:-not a Python};" \
         "ort: 3.10 or 3.11, current: 3.12 or 3.13)" >&2
    return 1
  fi
  versions=$(pyenv root 2>/dev/null || true)/versions
  for candidate in python3 python3.11 python3.10 python3.12 python3.13; do
    minor=""
    if command -v "$candidate" >/dev/null 2>&1; then minor=$(_ortlab_minor "$candidate") || minor=""; fi
    if [ -z "$minor" ] && [ "$candidate" != python3 ]; then  # a pyenv version not selected: its own binary
      local installed
      installed=$(ls -d "$versions/${candidate#python}".*/bin/"$candidate" 2>/dev/null | head -n 1) || true
      [ -n "$installed" ] && { candidate=$installed; minor=$(_ortlab_minor "$candidate") || minor=""; }
    fi
    [ -n "$minor" ] || continue
    stack=$(_ortlab_stack_of "$minor") || stack=""
    if [ -n "$stack" ] && { [ -z "$want" ] || [ "$want" = "$stack" ]; }; then
      [ "$candidate" = python3 ] || [ -z "$found" ] || echo "ortlab: python3 is not a Python ${want:+of the $want stack }($found); using $candidate" >&2
      echo "$("$candidate" -c 'import sys; print(sys.executable)') $stack"; return 0
    fi
    [ "$candidate" = python3 ] && found="python3=$minor"
  done
  if [ "$want" = current ]; then
    echo "ortlab: the current stack needs Python 3.12 or 3.13 (found: ${found:-no python3}). Install one (pyenv" \
         "install 3.12, or uv python install 3.12) and set ORTLAB_PYTHON=/path/to/python3.12" >&2
  else
    echo "ortlab: needs Python 3.10 or 3.11 for the ort stack (ORTModule), or 3.12 or 3.13 for the current stack" \
         "(found: ${found:-no python3}): onnxruntime-training 1.19.2, ORTModule's last release, ships no wheel for" \
         "Python 3.12 or newer. Install Python 3.11 or 3.12 (pyenv install 3.11, or uv python install 3.11) and set" \
         "ORTLAB_PYTHON=/path/to/python3.11" >&2
  fi
  return 1
}

_ortlab_ensure_env() {
  local python version full key root lock stack chosen
  chosen=$(_ortlab_python)
  python=${chosen% *} stack=${chosen##* }
  { read -r version; read -r full; } < <("$python" -c 'import platform, sys; print(platform.python_version()); print(sys.version)')
  case "$stack:$version" in
    ort:3.10.*) lock="$ORTLAB_ROOT/requirements-py310.lock" ;;
    ort:*) lock="$ORTLAB_ROOT/requirements.lock" ;;
    current:3.13.*) lock="$ORTLAB_ROOT/requirements-current-py313.lock" ;;
    *) lock="$ORTLAB_ROOT/requirements-current.lock" ;;
  esac
  # ENV_RECIPE: bump it when the way the environment is built changes what is in it
  key=$( (cat "$lock"; echo "$full"; echo "recipe 2") | sha256sum | cut -c1-16)
  root=${ORTLAB_ENV_ROOT:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/ortlab}
  ORTLAB_VENV="$root/env-$key"
  mkdir -p "$root"
  exec 9>"$root/.lock-$key"  # one build at a time per environment; others (another Python) go on
  flock 9
  if [ ! -f "$ORTLAB_VENV/.packages" ]; then  # the packages once: a later step that failed does not redo them
    echo "ortlab: building the environment of the $stack stack for Python $version ($python) from ${lock##*/} in" \
         "$ORTLAB_VENV" >&2
    if [ "$stack" = ort ]; then
      echo "ortlab: once per lock and Python: 3.5 GB of downloads, 7 GB on disk, then ORTModule's C++ extensions" \
           "compile (~4 min on 2 idle cores; 40+ min at nice 10 on a machine loaded 10x); progress below" >&2
    else
      echo "ortlab: once per lock and Python: 3.5 GB of downloads, 6.5 GB on disk; PyTorch and torch.compile run" \
           "here, ORTModule on the ort stack (a Python 3.10 or 3.11: ORTLAB_STACK=ort); progress below" >&2
    fi
    rm -rf "$ORTLAB_VENV"
    "$python" -m venv "$ORTLAB_VENV"
    "$python" "$ORTLAB_ROOT/scripts/install_progress.py" "$root/install-$key.log" "$ORTLAB_VENV" -- \
      "$ORTLAB_VENV/bin/python" -m pip install --no-input --disable-pip-version-check --progress-bar off \
      -r "$lock" || return 1
    touch "$ORTLAB_VENV/.packages"
  fi
  # ortlab itself, once (its entry point and metadata); the code each run uses is its checkout's (PYTHONPATH below)
  if [ ! -f "$ORTLAB_VENV/.complete" ]; then
    local then=""
    [ "$stack" = current ] || then="; then ORTModule's C++ extensions (torch loads first)"
    echo "ortlab: installing ortlab's entry point and metadata$then" >&2
    if ! "$ORTLAB_VENV/bin/python" -m pip install --no-input --disable-pip-version-check --no-deps \
         --no-build-isolation -e "$ORTLAB_ROOT" >"$root/install-ortlab.log" 2>&1; then
      grep -v "^WARNING: Location" "$root/install-ortlab.log" | tail -25 >&2
      echo "ortlab: installing ortlab from $ORTLAB_ROOT failed; full log: $root/install-ortlab.log" >&2
      return 1
    fi
  fi
  export PYTHONPATH="$ORTLAB_ROOT${PYTHONPATH:+:$PYTHONPATH}" ORTLAB_LOCK="$lock" ORTLAB_STACK="$stack"
  if [ ! -f "$ORTLAB_VENV/.complete" ]; then
    [ "$stack" = ort ] && "$ORTLAB_VENV/bin/python" -m ortlab.cli setup
    touch "$ORTLAB_VENV/.complete"
  fi
  if [ "$stack" = ort ]; then  # where a GPU is: the CUDA 11.8 libraries ORT's CUDA provider loads (scripts/ort_cuda.py)
    local cuda_libs
    cuda_libs=$("$ORTLAB_VENV/bin/python" "$ORTLAB_ROOT/scripts/ort_cuda.py" "$ORTLAB_VENV") || return 1
    [ -z "$cuda_libs" ] || export LD_LIBRARY_PATH="$cuda_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  # the newest transformers in a side folder, for the model-family tests (requirements-side.lock; Python 3.11), and
  # torchvision and timm in another, for the model-zoo tests (requirements-zoo.lock); one Python for both
  local side=""
  if [ "$stack" = ort ]; then  # both are built for the ort stack's torch 2.6
    side=$("$ORTLAB_VENV/bin/python" "$ORTLAB_ROOT/scripts/side_packages.py" --lock requirements-side.lock \
           --lock requirements-zoo.lock)
  fi
  ORTLAB_SIDE_PACKAGES=$(sed -n 1p <<<"$side")
  ORTLAB_ZOO_PACKAGES=$(sed -n 2p <<<"$side")
  flock -u 9
  export PATH="$ORTLAB_VENV/bin:$PATH" VIRTUAL_ENV="$ORTLAB_VENV" ORTLAB_SIDE_PACKAGES ORTLAB_ZOO_PACKAGES
}

_ortlab_ensure_env
