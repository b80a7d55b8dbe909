"""What this machine can run: versions, CUDA, and the build of ORTModule's torch C++ extensions."""

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
from dataclasses import asdict, dataclass, field
from pathlib import Path

# The CPU extensions ORTModule loads on every device; the CUDA ones only matter on a GPU.
CPU_EXTENSIONS = ("aten_op_executor", "torch_interop_utils")
CUDA_EXTENSIONS = ("fused_ops", "torch_gpu_allocator")
ORT_CUDA_MAJOR = "11"  # onnxruntime-training 1.19.2's wheel is a CUDA 11.8 build
SUPPORTED_PYTHONS = ((3, 10), (3, 11))  # onnxruntime-training 1.19.2 has wheels up to 3.11; each has a lock


def base_python() -> str:
    """The interpreter a venv was made from (or this one, outside a venv)."""
    if sys.prefix == sys.base_prefix:
        return sys.executable
    return str(Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}")


def cache_root() -> Path:
    """Where ortlab keeps what it builds outside a checkout (bin/_env.sh's environments, the compiled kernels):
    ORTLAB_ENV_ROOT when set, else $XDG_CACHE_HOME/ortlab, else ~/.cache/ortlab. One variable moves all of it."""
    if os.environ.get("ORTLAB_ENV_ROOT"):
        return Path(os.environ["ORTLAB_ENV_ROOT"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ortlab"


class SetupError(RuntimeError):
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


@dataclass
class Problem:
    what: str
    fix: str
    fatal: bool = True


@dataclass
class Report:
    python: str
    platform: str
    interpreter: str  # the Python the environment was made from (a venv's base), then the environment itself
    lock: str | None  # the lock bin/ortlab installed this environment from (None outside bin/ortlab)
    ortlab_from: str  # the checkout (or site-packages) whose ortlab is running
    cache: str  # cache_root(): environments and compiled kernels (ORTLAB_ENV_ROOT moves it)
    versions: dict[str, str | None]
    cuda_available: bool
    gpu_name: str | None
    ort_cuda_provider: str
    extensions: dict[str, bool]
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(p.fatal for p in self.problems)

    def to_dict(self) -> dict:
        return asdict(self) | {"ok": self.ok}

    def __str__(self) -> str:
        lines = [f"Python       {self.python} ({self.platform}; ortlab supports 3.10 and 3.11)",
                 f"interpreter  {self.interpreter}",
                 f"lock         {self.lock or 'none (not an environment bin/ortlab made)'}",
                 f"ortlab from  {self.ortlab_from}",
                 f"cache        {self.cache} (environments, compiled kernels; ORTLAB_ENV_ROOT moves it)"]
        from ortlab.versions import TESTED_TRANSFORMERS

        tested = {"transformers": f" (model families tested with {', '.join(TESTED_TRANSFORMERS)}: "
                                  "docs/compatibility.md)"}
        lines += [f"{name:<12} {ver or 'not installed'}{tested.get(name, '')}" for name, ver in self.versions.items()]
        cuda = f"available: {self.gpu_name}" if self.cuda_available else "not available (CPU only)"
        lines.append(f"CUDA         {cuda}")
        lines.append(f"ORT CUDA EP  {self.ort_cuda_provider}")
        built = [n for n, ok in self.extensions.items() if ok]
        lines.append(f"extensions   {', '.join(built) if built else 'none built'}")
        for p in self.problems:
            lines.append(f"{'PROBLEM' if p.fatal else 'note'}: {p.what} -> {p.fix}")
        lines.append("ORTModule can run." if self.ok else "ORTModule cannot run until the problems above are fixed.")
        return "\n".join(lines)


def _ort_cuda_provider(cuda_available: bool) -> tuple[str, Problem | None]:
    """Whether ORT's CUDA execution provider library can load its CUDA 11.8 dependencies."""
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return "onnxruntime missing", None
    lib = Path(next(iter(spec.submodule_search_locations))) / "capi" / "libonnxruntime_providers_cuda.so"
    if not lib.exists():
        return "not in this build", None
    if not cuda_available:
        return "present, unused (no GPU)", None
    import ctypes

    try:
        ctypes.CDLL(str(lib))
    except OSError as e:
        return f"cannot load: {e}", Problem(
            "ORT's CUDA execution provider cannot load its CUDA 11.8 libraries",
            "install CUDA 11.8 runtime, cuBLAS 11 and cuDNN 8 (e.g. 'pip install nvidia-cuda-runtime-cu11 "
            "nvidia-cublas-cu11 nvidia-cudnn-cu11' and put their lib folders on LD_LIBRARY_PATH), or run on the CPU",
            fatal=False,
        )
    return "loads", None


def doctor() -> Report:
    """Everything that decides whether ORTModule can run here, each problem with its fix."""
    versions = {
        name: _version(dist)
        for name, dist in [
            ("torch", "torch"),
            ("onnxruntime", "onnxruntime-training"),
            ("onnx", "onnx"),
            ("netron", "netron"),
            ("transformers", "transformers"),
            ("ortlab", "ortlab"),
        ]
    }
    problems: list[Problem] = []
    if sys.version_info[:2] not in SUPPORTED_PYTHONS:
        problems.append(Problem(
            f"Python {platform.python_version()}: onnxruntime-training 1.19.2 (ORTModule's last release) ships wheels "
            "for Python 3.8-3.11 and ortlab is tested on 3.10 and 3.11",
            "use Python 3.11 or 3.10 (bin/ortlab finds python3.11 or python3.10, or ORTLAB_PYTHON=/path/to/python)"))
    cuda_available, gpu_name = False, None
    if versions["torch"] is None:
        problems.append(Problem("torch is not installed", "pip install torch==2.6.0"))
    else:
        import torch

        cuda_available = torch.cuda.is_available()
        gpu_name = torch.cuda.get_device_name(0) if cuda_available else None
        major_minor = tuple(int(x) for x in versions["torch"].split("+")[0].split(".")[:2])
        if major_minor > (2, 6):
            problems.append(
                Problem(
                    f"torch {versions['torch']} is too new for onnxruntime-training 1.19.2 (its extensions fail to "
                    "load from torch 2.7 on)",
                    "pip install torch==2.6.0",
                )
            )
    if versions["onnxruntime"] is None:
        problems.append(Problem("onnxruntime-training is not installed", "pip install onnxruntime-training==1.19.2"))
    if versions["onnx"] is None:
        problems.append(Problem("onnx is not installed", "pip install onnx==1.16.2"))
    if versions["netron"] is None:
        problems.append(Problem("netron is not installed", "pip install netron (graphs fall back to ortlab's own view)",
                                fatal=False))
    from ortlab.versions import TESTED_TRANSFORMERS, transformers_note

    note = transformers_note(versions["transformers"])
    if note:
        problems.append(Problem(note, f"pip install transformers=={TESTED_TRANSFORMERS[-1]} (or "
                                f"{TESTED_TRANSFORMERS[0]}); docs/compatibility.md", fatal=False))
    extensions = built_extensions()
    missing = [n for n in CPU_EXTENSIONS if not extensions[n]]
    if versions["onnxruntime"] and missing:
        problems.append(Problem(f"ORTModule's torch C++ extensions are not built ({', '.join(missing)})",
                                "ortlab setup"))
    if cuda_available and not all(extensions[n] for n in CUDA_EXTENSIONS):
        problems.append(
            Problem("ORTModule's CUDA extensions are not built (no fused Adam)",
                    "install a CUDA toolkit matching torch, then: ortlab setup", fatal=False)
        )
    provider, problem = _ort_cuda_provider(cuda_available)
    if problem:
        problems.append(problem)
    interpreter = sys.executable
    if sys.prefix != sys.base_prefix:  # a venv: the Python it was made from (3.10's _base_executable is the venv's)
        interpreter = f"{base_python()} (environment: {sys.prefix})"
    return Report(
        python=platform.python_version(),
        platform=f"{platform.system()} {platform.machine()}",
        interpreter=interpreter,
        lock=os.environ.get("ORTLAB_LOCK"),
        ortlab_from=str(Path(__file__).resolve().parents[1]),
        cache=str(cache_root()),
        versions=versions,
        cuda_available=cuda_available,
        gpu_name=gpu_name,
        ort_cuda_provider=provider,
        extensions=extensions,
        problems=problems,
    )
