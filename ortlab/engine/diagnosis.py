"""`ortlab doctor`: what runs here and what does not, per backend, each with its reason and fix; the stack, the
interpreter and lock, the GPU and its memory. Exit 0 when the stack asked for is healthy: every backend it promises
(StackInfo.required: PyTorch and ORTModule on the ort stack, PyTorch and torch.compile on the current one) can run.
Each backend's check is named by its registry entry (`health`), so a backend says itself what it needs."""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ortlab.common.cache import cache_root
from ortlab.stacks.environment import (
    CPU_EXTENSIONS,
    CUDA_EXTENSIONS,
    _version,
    base_python,
    built_extensions,
)
from ortlab.stacks.table import STACKS, Stack, ort_stack_hint, ortmodule_unavailable, pythons_running, this_stack


@dataclass
class Machine:
    """What the backends' checks read: the versions installed, the GPU, ORTModule's built extensions."""

    versions: dict[str, str | None]
    cuda_available: bool
    gpu_name: str | None
    extensions: dict[str, bool]


@dataclass
class Problem:
    what: str
    fix: str
    fatal: bool = True


@dataclass
class BackendStatus:
    """One backend on this machine: whether it runs, on what, and if not why and how."""

    name: str
    label: str
    runs: bool
    detail: str  # what it runs on (the device, the compiler), or why it does not
    fix: str | None = None
    problems: list[Problem] = field(default_factory=list)  # what else to know (notes), or what keeps it from running


@dataclass
class Report:
    stack: str
    python: str
    platform: str
    interpreter: str  # the Python the environment was made from (a venv's base), then the environment itself
    lock: str | None  # the lock bin/ortlab installed this environment from (None outside bin/ortlab)
    ortlab_from: str  # the checkout (or site-packages) whose ortlab is running
    cache: str  # cache_root(): environments and compiled kernels (ORTLAB_ENV_ROOT moves it)
    versions: dict[str, str | None]
    cuda_available: bool
    gpu_name: str | None
    gpu_memory_gib: float | None
    extensions: dict[str, bool]
    backends: list[BackendStatus] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(p.fatal for p in self.problems)

    def to_dict(self) -> dict:
        return asdict(self) | {"ok": self.ok}

    def __str__(self) -> str:
        info = STACKS[Stack(self.stack)]
        lines = [f"stack        {self.stack} (Python {', '.join(info.pythons)}, torch {info.torch}): {info.runs}",
                 f"Python       {self.python} ({self.platform})",
                 f"interpreter  {self.interpreter}",
                 f"lock         {self.lock or 'none (not an environment bin/ortlab made)'}",
                 f"ortlab from  {self.ortlab_from}",
                 f"cache        {self.cache} (environments, compiled kernels; ORTLAB_ENV_ROOT moves it)"]
        from ortlab.stacks.versions import TESTED_TRANSFORMERS

        tested = {"transformers": f" (model families tested with {', '.join(TESTED_TRANSFORMERS)}: "
                                  "docs/compatibility.md)"}
        lines += [f"{name:<12} {ver or 'not installed'}{tested.get(name, '')}" for name, ver in self.versions.items()]
        gpu = (f"{self.gpu_name}, {self.gpu_memory_gib:.1f} GiB" if self.cuda_available
               else "none (torch sees no CUDA device): the CPU")
        lines.append(f"GPU          {gpu}")
        if self.versions.get("onnxruntime"):
            built = [n for n, ok in self.extensions.items() if ok]
            lines.append(f"extensions   {', '.join(built) if built else 'none built'}")
        lines.append("backends")
        for b in self.backends:
            lines.append(f"  {b.label:<14} {'runs' if b.runs else 'NOT HERE'}: {b.detail}"
                         + (f" -> {b.fix}" if b.fix else ""))
        for p in self.problems:
            lines.append(f"{'PROBLEM' if p.fatal else 'note'}: {p.what} -> {p.fix}")
        runs = ", ".join(b.label for b in self.backends if b.runs)
        lines.append(f"the {self.stack} stack is healthy: {runs} can run." if self.ok else
                     f"the {self.stack} stack cannot run until the problems above are fixed.")
        return "\n".join(lines)


def _ort_cuda_provider(cuda_available: bool) -> tuple[str, Problem | None]:
    """Whether ORT's CUDA execution provider library can load its CUDA 11.8 dependencies (bin/_env.sh installs them
    from requirements-ort-cuda.lock where it finds a GPU and puts them on LD_LIBRARY_PATH)."""
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
            "ORT's CUDA execution provider cannot load its CUDA 11.8 libraries (cuBLAS 11, cuDNN 8, cuFFT 10, "
            "cuRAND 10, the CUDA 11.8 runtime)",
            "run ortlab through bin/ortlab, which installs them from requirements-ort-cuda.lock where it finds a GPU "
            "and puts them on LD_LIBRARY_PATH (or: pip install -r requirements-ort-cuda.lock and add each "
            "nvidia/*/lib folder to LD_LIBRARY_PATH); else ORTModule runs on the CPU", fatal=False)
    return "loads", None


def pytorch_health(m: Machine) -> BackendStatus:
    """PyTorch runs wherever torch imports."""
    if m.versions["torch"] is None:
        return BackendStatus("pytorch", "PyTorch", False, "torch is not installed",
                             f"pip install torch=={STACKS[this_stack()].torch}")
    device = f"on {m.gpu_name}" if m.cuda_available else "on the CPU"
    return BackendStatus("pytorch", "PyTorch", True, f"torch {m.versions['torch']} {device}")


def compile_health(m: Machine) -> BackendStatus:
    """torch.compile's default compiler (inductor) needs a C++ compiler for the CPU and triton for a GPU."""
    label = "torch.compile"
    if m.versions["torch"] is None:
        return BackendStatus("compile", label, False, "torch is not installed", None)
    if m.cuda_available:
        import torch

        if importlib.util.find_spec("triton") is None:
            return BackendStatus("compile", label, False, "inductor needs triton on a GPU, and it is not installed",
                                 "pip install triton (the version torch's wheel names)")
        major, _ = torch.cuda.get_device_capability(0)
        if major < 7:
            return BackendStatus("compile", label, False, f"triton needs a GPU of compute capability 7.0 or newer "
                                 f"(this one: {major}.x)", "--compile-backend aot_eager (no code generation)")
        return BackendStatus("compile", label, True, f"inductor with triton {_version('triton')} on the GPU")
    cxx = shutil.which(os.environ.get("CXX") or "g++") or shutil.which("c++")
    if cxx is None:
        return BackendStatus("compile", label, False, "inductor needs a C++ compiler for the CPU, and none is found",
                             "install one (Debian: apt-get install g++), or --compile-backend aot_eager")
    return BackendStatus("compile", label, True, f"inductor with the C++ compiler {cxx} on the CPU")


def ortmodule_health(m: Machine) -> BackendStatus:
    """What keeps ORTModule from running in this environment, and what else to know (notes)."""
    versions, problems = m.versions, []
    why = ortmodule_unavailable()
    if f"{sys.version_info[0]}.{sys.version_info[1]}" not in pythons_running("ortmodule"):  # the stacks' table
        problems.append(Problem(f"Python {platform.python_version()}: onnxruntime-training 1.19.2 (ORTModule's last "
                                "release) ships wheels for Python 3.8-3.11", ort_stack_hint()))
    elif versions["onnxruntime"] is None:
        problems.append(Problem("onnxruntime-training is not installed", "pip install onnxruntime-training==1.19.2"))
    elif why is not None:
        problems.append(Problem(why, "pip install torch==2.6.0"))
    missing = [n for n in CPU_EXTENSIONS if not m.extensions[n]]
    if versions["onnxruntime"] and missing:
        problems.append(Problem(f"ORTModule's torch C++ extensions are not built ({', '.join(missing)})",
                                "ortlab setup"))
    if versions["onnxruntime"] and m.cuda_available and not all(m.extensions[n] for n in CUDA_EXTENSIONS):
        problems.append(Problem("ORTModule's CUDA extensions are not built (no fused Adam)",
                                "install a CUDA toolkit matching torch, then: ortlab setup", fatal=False))
    provider, problem = _ort_cuda_provider(m.cuda_available)
    if problem:
        problems.append(problem)
    fatal = [p for p in problems if p.fatal]
    runs = not fatal and versions["torch"] is not None
    detail = fatal[0].what if fatal else f"onnxruntime-training {versions['onnxruntime']} (ORT's CUDA EP: {provider})"
    return BackendStatus("ortmodule", "ORTModule", runs, detail, fatal[0].fix if fatal else None, problems)


def _health(name: str, m: Machine) -> BackendStatus:
    from ortlab.engine.backends import BACKENDS

    health = BACKENDS[name].health
    assert health is not None, f"{name} has no health check"  # _health is asked only of backends that name one
    return health.resolve()(m)


def doctor() -> Report:
    """Everything that decides what can run here, each problem with its fix."""
    from ortlab.engine.backends import BACKENDS

    versions = {name: _version(dist) for name, dist in [
        ("torch", "torch"), ("onnxruntime", "onnxruntime-training"), ("onnx", "onnx"), ("netron", "netron"),
        ("ipywidgets", "ipywidgets"), ("transformers", "transformers"), ("ortlab", "ortlab")]}
    stack = STACKS[this_stack()]
    cuda_available, gpu_name, gpu_memory = False, None, None
    if versions["torch"] is not None:
        import torch

        cuda_available = torch.cuda.is_available()
        if cuda_available:
            props = torch.cuda.get_device_properties(0)
            gpu_name, gpu_memory = props.name, props.total_memory / 2**30
    machine = Machine(versions, cuda_available, gpu_name, built_extensions())
    backends = [_health(name, machine) for name in BACKENDS if BACKENDS[name].health]
    problems: list[Problem] = []
    for b in backends:  # a backend the stack promises: what keeps it from running is the stack's problem
        promised = b.name in stack.required
        problems += [p for p in b.problems if promised or not p.fatal]
        if promised and not b.runs and not any(p.fatal for p in b.problems):
            problems.append(Problem(f"{b.label} cannot run: {b.detail}", b.fix or ""))
    if versions["onnx"] is None and stack.name is Stack.ORT:
        problems.append(Problem("onnx is not installed", "pip install onnx==1.16.2"))
    for name, missing in (("netron", "graphs fall back to ortlab's own view"),
                          ("ipywidgets", "the Lab's panels need it; bursts, the CLI and the API do not")):
        if versions[name] is None:
            problems.append(Problem(f"{name} is not installed", f"pip install {name} ({missing})", fatal=False))
    from ortlab.stacks.versions import TESTED_TRANSFORMERS, transformers_note

    note = transformers_note(versions["transformers"])
    if note:
        problems.append(Problem(note, f"pip install transformers=={TESTED_TRANSFORMERS[-1]} (or "
                                f"{TESTED_TRANSFORMERS[0]}); docs/compatibility.md", fatal=False))
    interpreter = sys.executable
    if sys.prefix != sys.base_prefix:  # a venv: the Python it was made from (3.10's _base_executable is the venv's)
        interpreter = f"{base_python()} (environment: {sys.prefix})"
    return Report(
        stack=str(stack.name),
        python=platform.python_version(),
        platform=f"{platform.system()} {platform.machine()}",
        interpreter=interpreter,
        lock=os.environ.get("ORTLAB_LOCK"),
        ortlab_from=str(Path(__file__).resolve().parents[2]),
        cache=str(cache_root()),
        versions=versions,
        cuda_available=cuda_available,
        gpu_name=gpu_name,
        gpu_memory_gib=gpu_memory,
        extensions=machine.extensions,
        backends=backends,
        problems=problems,
    )
