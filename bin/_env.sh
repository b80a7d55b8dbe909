# Sourced by bin/ortlab and bin/test: make sure the project's environment exists, then use it.
# The environment lives outside the checkout, keyed by the lock file and the Python, so every checkout and CI run
# of the same lock reuses it; a missing one is built: venv and pinned packages (redone from nothing unless they
# finished), then ortlab and ORTModule's torch C++ extensions (redone until they finish). The packages are shared; ortlab's own code is not: each run puts its own
# checkout first on PYTHONPATH, so two checkouts (two branches) using one environment never run each other's code.
set -euo pipefail

ORTLAB_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# The stacks (ort: ORTModule's; current: the newest torch), which Pythons serve each and the lock each Python builds
# from are data, ortlab/stacks/stacks.txt (the table ortlab/stacks/table.py reads too), read here in plain bash by
# bin/_stacks.sh, which also finds the Python: ORTLAB_PYTHON; the active python3 when it suits the stack; each
# python row's python3.X in the table's order; of the stack ORTLAB_STACK asks for, if it does.
source "$ORTLAB_ROOT/bin/_stacks.sh"

_ortlab_ensure_env() {
  local python version minor full key root lock stack chosen
  chosen=$(_ortlab_python)
  python=${chosen% *} stack=${chosen##* }
  { read -r version; read -r full; } < <("$python" -c 'import platform, sys; print(platform.python_version()); print(sys.version)')
  minor=${version#*.} minor=${version%%.*}.${minor%%.*}
  lock=$(_ortlab_lock_of "$stack" "$minor") || {
    echo "ortlab: $_ORTLAB_TABLE names no lock of the $stack stack for Python $version ($python)" >&2; return 1; }
  lock="$ORTLAB_ROOT/$lock"
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
    if _ortlab_runs "$stack" ortmodule; then
      echo "ortlab: once per lock and Python: 3.5 GB of downloads, 7 GB on disk, then ORTModule's C++ extensions" \
           "compile (~4 min on 2 idle cores; 40+ min at nice 10 on a machine loaded 10x); progress below" >&2
    else
      local ort="" name
      for name in "${_ORTLAB_NAME[@]}"; do _ortlab_runs "$name" ortmodule && { ort=$name; break; }; done
      echo "ortlab: once per lock and Python: 3.5 GB of downloads, 6.5 GB on disk; PyTorch and torch.compile run" \
           "here, ORTModule on the $ort stack (a Python $(_ortlab_pythons_of "$ort"): ORTLAB_STACK=$ort); progress" \
           "below" >&2
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
    _ortlab_runs "$stack" ortmodule && then="; then ORTModule's C++ extensions (torch loads first)"
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
    _ortlab_runs "$stack" ortmodule && "$ORTLAB_VENV/bin/python" -m ortlab.cli setup
    touch "$ORTLAB_VENV/.complete"
  fi
  if _ortlab_runs "$stack" ortmodule; then  # where a GPU is: the CUDA 11.8 libraries ORT's CUDA provider loads (scripts/ort_cuda.py)
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
