"""The build of ORTModule's torch C++ extensions (`ortlab setup`); where it builds is `common.cache`'s, what runs
here is `ortlab.doctor`'s."""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ortlab.errors import OrtlabError

# The CPU extensions ORTModule loads on every device; the CUDA ones only matter on a GPU.
CPU_EXTENSIONS = ("aten_op_executor", "torch_interop_utils")
CUDA_EXTENSIONS = ("fused_ops", "torch_gpu_allocator")
ORT_CUDA_MAJOR = "11"  # onnxruntime-training 1.19.2's wheel is a CUDA 11.8 build


def base_python() -> str:
    """The interpreter a venv was made from (or this one, outside a venv)."""
    if sys.prefix == sys.base_prefix:
        return sys.executable
    return str(Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}")


class SetupError(OrtlabError, RuntimeError):
    """The extension build failed; the message says what is missing and what to install."""


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_cpp_dir() -> Path | None:
    """ORTModule's torch_cpp_extensions folder, found without importing ORTModule (which needs it built)."""
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "training" / "ortmodule" / "torch_cpp_extensions"
    return path if path.is_dir() else None


def built_extensions(cpp_dir: Path | None = None) -> dict[str, bool]:
    cpp_dir = cpp_dir or torch_cpp_dir()
    names = CPU_EXTENSIONS + CUDA_EXTENSIONS
    if cpp_dir is None:
        return dict.fromkeys(names, False)
    return {name: bool(glob.glob(str(cpp_dir / f"{name}*.so"))) for name in names}


def _nvcc_cuda_major() -> str | None:
    cuda_home = os.environ.get("CUDA_HOME")
    nvcc = shutil.which("nvcc") or (cuda_home and shutil.which("nvcc", path=cuda_home + "/bin"))
    if not nvcc:
        return None
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    for token in out.replace(",", " ").split():
        if token.startswith("V") and token[1:2].isdigit():
            return token[1:].split(".")[0]
    return None


def _compile(name: str, command: list[str], cwd: Path, env: dict, log, every: float = 20.0) -> tuple[int, str]:
    """One extension's build, saying every `every` seconds that it is still going (and since when): a cold start
    must never look hung."""
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        while True:
            try:
                proc.wait(timeout=every)
                break
            except subprocess.TimeoutExpired:
                log(f"ortlab setup: still compiling {name} ({_clock(time.monotonic() - start)})")
        out.seek(0)
        output = out.read()
    log(f"ortlab setup: {name} {'compiled' if proc.returncode == 0 else 'failed'} in "
        f"{_clock(time.monotonic() - start)}")
    return proc.returncode, output


def _clock(seconds: float) -> str:
    return f"{int(seconds) // 60}m{int(seconds) % 60:02d}s"


def setup(force: bool = False, log=print) -> dict[str, bool]:
    """Build ORTModule's torch C++ extensions into the installed onnxruntime package.

    The stock installer also compiles the CUDA extensions whenever torch is a CUDA build, which fails on a
    machine without CUDA headers; here the CPU ones are always built and the CUDA ones only when a GPU and
    a CUDA toolkit matching torch's are present. Idempotent: built extensions are left alone. Returns
    {extension: built} of every extension; a build that fails raises SetupError.
    """
    cpp_dir = torch_cpp_dir()
    if cpp_dir is None:
        raise SetupError(
            "onnxruntime-training is not installed in this environment; install it with "
            "'pip install onnxruntime-training==1.19.2' (or run bin/ortlab, which sets up everything)."
        )
    log("ortlab setup: loading torch to see what to build...")  # a cold import takes tens of seconds on a busy machine
    import torch

    wanted = list(CPU_EXTENSIONS)
    if torch.cuda.is_available() and torch.version.cuda:
        nvcc_major = _nvcc_cuda_major()
        if nvcc_major == torch.version.cuda.split(".")[0]:
            wanted += CUDA_EXTENSIONS
        else:
            log(
                f"ortlab setup: GPU found but no CUDA {torch.version.cuda} toolkit (nvcc: {nvcc_major or 'missing'}); "
                "skipping ORTModule's CUDA extensions (fused Adam kernels, torch GPU allocator). "
                f"Install the CUDA {torch.version.cuda} toolkit and set CUDA_HOME to build them."
            )
    state = built_extensions(cpp_dir)
    todo = [name for name in wanted if force or not state[name]]
    if not todo:
        log("ortlab setup: ORTModule's torch C++ extensions are already built.")
        return built_extensions(cpp_dir)
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        raise SetupError("no C++ compiler found: install one (Debian: 'apt-get install g++') and run again.")
    env = dict(os.environ, MAX_JOBS=os.environ.get("MAX_JOBS", str(os.cpu_count() or 2)))
    env.setdefault("ONNXRUNTIME_CUDA_VERSION", "")
    env.setdefault("ONNXRUNTIME_ROCM_VERSION", "")
    for name in todo:
        kind = "cpu" if name in CPU_EXTENSIONS else "cuda"
        setup_py = cpp_dir / kind / name / "setup.py"
        log(f"ortlab setup: compiling {name} ({todo.index(name) + 1} of {len(todo)}; minutes on 2 cores)...")
        returncode, output = _compile(name, [sys.executable, str(setup_py), "build"], cpp_dir, env, log)
        if returncode != 0:
            tail = "\n".join(output.strip().splitlines()[-15:])
            raise SetupError(
                f"compiling ORTModule's '{name}' extension failed (exit {returncode}). Needed: g++, the "
                f"Python {platform.python_version()} headers (python3-dev) and ninja. Last lines:\n{tail}"
            )
        for so in glob.glob(str(cpp_dir / "build" / "lib.*" / f"{name}*.so")):
            shutil.copyfile(so, cpp_dir / Path(so).name)
    state = built_extensions(cpp_dir)
    missing = [name for name in wanted if not state[name]]
    if missing:
        raise SetupError(f"built, but no shared library found for {', '.join(missing)} in {cpp_dir}")
    log("ortlab setup: done: " + ", ".join(name for name in wanted))
    return state
