# Sourced by bin/_env.sh (and by ortlab.engine.stack_env's probe, which builds nothing): the stacks' table,
# ortlab/stacks/stacks.txt, read in plain bash (no Python environment exists yet, and only bash's builtins are
# used), and the Python finder that follows it. ortlab/stacks/table.py reads the same file, so the two cannot
# disagree. Its rows:
#   python STACK MINOR LOCK TORCH      a Python the stack is locked for, its lock and torch, in the order tried
#   stack  NAME RUNS PROMISED WORDS    the backends that run on the stack, those `ortlab doctor` promises, in words
# Where a stack runs ORTModule (onnxruntime-training 1.19.2, its last release: wheels up to Python 3.11, extensions
# that load up to torch 2.6), bin/_env.sh builds its extensions and, on a GPU, the CUDA 11 libraries it loads.

_ORTLAB_TABLE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/ortlab/stacks/stacks.txt"
_ORTLAB_ROW_STACK=() _ORTLAB_ROW_MINOR=() _ORTLAB_ROW_LOCK=()  # the python rows, in the table's order
_ORTLAB_NAME=() _ORTLAB_RUNS=() _ORTLAB_WORDS=()  # the stack rows

_ortlab_read_stacks() {  # TABLE: the rows above into the arrays above; fails naming a row of no known shape
  local kind a b c d number=0
  _ORTLAB_ROW_STACK=() _ORTLAB_ROW_MINOR=() _ORTLAB_ROW_LOCK=() _ORTLAB_NAME=() _ORTLAB_RUNS=() _ORTLAB_WORDS=()
  if [ ! -r "$1" ]; then echo "ortlab: the stacks' table $1 cannot be read" >&2; return 1; fi
  while read -r kind a b c d || [ -n "$kind" ]; do
    number=$((number + 1))
    case "$kind" in
      ""|"#"*) ;;
      python) _ORTLAB_ROW_STACK+=("$a") _ORTLAB_ROW_MINOR+=("$b") _ORTLAB_ROW_LOCK+=("$c") ;;
      stack) _ORTLAB_NAME+=("$a") _ORTLAB_RUNS+=("$b") _ORTLAB_WORDS+=("$d") ;;
      *) echo "ortlab: $1 line $number: '$kind' is not a row; allowed: python, stack" >&2; return 1 ;;
    esac
  done < "$1"
}

_ortlab_stack_of() {  # MINOR [STACK]: the first stack the table locks Python MINOR for (STACK: that one only)
  local i
  for i in "${!_ORTLAB_ROW_MINOR[@]}"; do
    if [ "${_ORTLAB_ROW_MINOR[i]}" = "$1" ] && { [ -z "${2:-}" ] || [ "${_ORTLAB_ROW_STACK[i]}" = "$2" ]; }; then
      echo "${_ORTLAB_ROW_STACK[i]}"; return 0
    fi
  done
  return 1
}

_ortlab_lock_of() {  # STACK MINOR: the lock the table names for that stack and Python
  local i
  for i in "${!_ORTLAB_ROW_MINOR[@]}"; do
    if [ "${_ORTLAB_ROW_STACK[i]}" = "$1" ] && [ "${_ORTLAB_ROW_MINOR[i]}" = "$2" ]; then
      echo "${_ORTLAB_ROW_LOCK[i]}"; return 0
    fi
  done
  return 1
}

_ortlab_first_python() {  # STACK: the Python the table names first for it (the one bin/_env.sh tries first)
  local i
  for i in "${!_ORTLAB_ROW_MINOR[@]}"; do
    [ "${_ORTLAB_ROW_STACK[i]}" = "$1" ] && { echo "${_ORTLAB_ROW_MINOR[i]}"; return 0; }
  done
  return 1
}

_ortlab_pythons_of() {  # STACK [SEPARATOR]: its Pythons, oldest first, joined by SEPARATOR (" or ")
  local i j v sorted=() out=""
  for i in "${!_ORTLAB_ROW_MINOR[@]}"; do
    [ "${_ORTLAB_ROW_STACK[i]}" = "$1" ] || continue
    v=${_ORTLAB_ROW_MINOR[i]} j=${#sorted[@]}
    sorted+=("$v")
    while [ "$j" -gt 0 ] && [ $(( ${sorted[j-1]%%.*} * 1000 + ${sorted[j-1]#*.} )) -gt $(( ${v%%.*} * 1000 + ${v#*.} )) ]
    do sorted[j]=${sorted[j-1]} j=$((j - 1)); done
    sorted[j]=$v
  done
  for v in "${sorted[@]}"; do out+="${out:+${2:- or }}$v"; done
  echo "$out"
}

_ortlab_candidates() {  # the Pythons to try, in order: python3 (the active one), then each python row's
  local seen=" python3 " minor
  echo python3
  for minor in "${_ORTLAB_ROW_MINOR[@]}"; do
    case "$seen" in *" python$minor "*) continue ;; esac
    seen+="python$minor "
    echo "python$minor"
  done
}

_ortlab_runs() {  # STACK BACKEND: whether the table says BACKEND runs on STACK
  local i
  for i in "${!_ORTLAB_NAME[@]}"; do
    [ "${_ORTLAB_NAME[i]}" = "$1" ] || continue
    case ",${_ORTLAB_RUNS[i]}," in *",$2,"*) return 0 ;; esac
  done
  return 1
}

_ortlab_read_stacks "$_ORTLAB_TABLE"

_ortlab_minor() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null; }

# The stack follows the Python found, or ORTLAB_STACK asks for one. The Python, in order: ORTLAB_PYTHON; the active
# python3 (so PYENV_VERSION=3.10.13, or a 3.10 bin/ first on PATH, gets 3.10) when it suits the stack; then each
# python row's python3.X, on PATH or installed by pyenv. Prints the interpreter's real path (not a pyenv shim's) and
# its stack.
_ortlab_python() {
  local want=${ORTLAB_STACK:-} candidate minor stack found="" versions name i allowed="" each="" why="" newest
  for i in "${!_ORTLAB_NAME[@]}"; do
    name=${_ORTLAB_NAME[i]}
    allowed+="${allowed:+, }$name (Python $(_ortlab_pythons_of "$name" /): ${_ORTLAB_WORDS[i]})"
  done
  if [ -n "$want" ] && ! _ortlab_first_python "$want" >/dev/null; then
    echo "ortlab: ORTLAB_STACK=$want is not a stack; allowed: $allowed" >&2; return 1
  fi
  if [ -n "${ORTLAB_PYTHON:-}" ]; then
    minor=$(_ortlab_minor "$ORTLAB_PYTHON") || true
    if [ -n "$minor" ] && stack=$(_ortlab_stack_of "$minor" "$want"); then
      echo "$("$ORTLAB_PYTHON" -c 'import sys; print(sys.executable)') $stack"; return 0
    fi
    each=""
    for name in "${_ORTLAB_NAME[@]}"; do each+="${each:+, }$name: $(_ortlab_pythons_of "$name")"; done
    echo "ortlab: ORTLAB_PYTHON=$ORTLAB_PYTHON is not a Python ${want:+of the $want stack }(${minor:-not a Python};" \
         "$each)" >&2
    return 1
  fi
  versions=$(pyenv root 2>/dev/null || true)/versions
  for candidate in $(_ortlab_candidates); do
    minor=""
    if command -v "$candidate" >/dev/null 2>&1; then minor=$(_ortlab_minor "$candidate") || minor=""; fi
    if [ -z "$minor" ] && [ "$candidate" != python3 ]; then  # a pyenv version not selected: its own binary
      local installed
      for installed in "$versions/${candidate#python}".*/bin/"$candidate"; do [ -x "$installed" ] && break; done
      [ -x "$installed" ] && { candidate=$installed; minor=$(_ortlab_minor "$candidate") || minor=""; }
    fi
    [ -n "$minor" ] || continue
    if stack=$(_ortlab_stack_of "$minor" "$want"); then
      [ "$candidate" = python3 ] || [ -z "$found" ] || echo "ortlab: python3 is not a Python ${want:+of the $want stack }($found); using $candidate" >&2
      echo "$("$candidate" -c 'import sys; print(sys.executable)') $stack"; return 0
    fi
    [ "$candidate" = python3 ] && found="python3=$minor"
  done
  if [ -n "$want" ]; then
    minor=$(_ortlab_first_python "$want")
    echo "ortlab: the $want stack needs Python $(_ortlab_pythons_of "$want") (found: ${found:-no python3}). Install" \
         "one (pyenv install $minor, or uv python install $minor) and set ORTLAB_PYTHON=/path/to/python$minor" >&2
    return 1
  fi
  each="" minor=""
  for name in "${_ORTLAB_NAME[@]}"; do
    each+="${each:+, or }$(_ortlab_pythons_of "$name") for the $name stack"
    minor+="${minor:+ or }$(_ortlab_first_python "$name")"
    if _ortlab_runs "$name" ortmodule; then  # why no newer Python serves ORTModule
      newest=$(_ortlab_pythons_of "$name" " ")
      why=": ORTModule runs on the $name stack only (onnxruntime-training 1.19.2, its last release, ships no wheel past Python ${newest##* })"
    fi
  done
  echo "ortlab: needs Python $each (found: ${found:-no python3})$why. Install Python $minor (pyenv install" \
       "${minor%% *}, or uv python install ${minor%% *}) and set ORTLAB_PYTHON=/path/to/python${minor%% *}" >&2
  return 1
}
