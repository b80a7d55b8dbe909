"""The parts of ortlab's CUDA paths that can run without a GPU: CUDA kernels in a torch.profiler trace attributed to
the op, module, step and phase that launched them (a trace in the format torch.profiler writes on a GPU, built here:
no GPU is at hand to record one), and the CUDA allocator's figures in a run's summary. tests/test_cuda.py runs the
real thing on a GPU."""

from __future__ import annotations

from ortlab.comparison.summary import table
from ortlab.runs.memory import summary_fields
from ortlab.timing import profile

HOST, MAIN, AUTOGRAD, STREAM = 4242, 1001, 1002, 7


def x(cat: str, name: str, ts: float, dur: float, tid: int = MAIN, pid: int = HOST, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def launch(ts: float, correlation: int, tid: int = MAIN, name: str = "cudaLaunchKernel", cat: str = "cuda_runtime"):
    return x(cat, name, ts, 4, tid, correlation=correlation, cbid=211)


def kernel(name: str, ts: float, dur: float, correlation: int, cat: str = "kernel") -> list[dict]:
    """A kernel on GPU 0's stream and its flow arrows from the launch, as Kineto writes them."""
    return [x(cat, name, ts, dur, STREAM, 0, correlation=correlation, device=0, stream=STREAM),
            {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": correlation, "pid": HOST, "tid": MAIN, "ts": ts - 50},
            {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": correlation, "pid": 0, "tid": STREAM, "ts": ts,
             "bp": "e"}]


def trace() -> list[dict]:
    """One profiled step of a model with one Linear `lin`: its forward launches a GEMM; the autograd engine's thread
    launches the backward's GEMM (attributed to `lin` by sequence number) and reads the loss back (a memcpy); the
    optimizer launches a foreach kernel; torch.compile's region launches a Triton kernel through the driver API.
    Kernels run later than their launch (the GPU runs behind the host)."""
    ev = [x("user_annotation", "ortlab: step 2 forward", 0, 1000), x("user_annotation", "module: lin", 10, 400),
          x("cpu_op", "aten::linear", 20, 370, **{"External id": 5, "Sequence number": 7}),
          x("cpu_op", "aten::addmm", 30, 300, **{"External id": 6, "Sequence number": 7}), launch(40, 101),
          *kernel("ampere_sgemm_64x32_sliced1x4_tn", 900, 120, 101),
          x("cpu_op", "Torch-Compiled Region", 500, 300), launch(520, 105, name="cuLaunchKernel", cat="cuda_driver"),
          *kernel("triton_poi_fused_add_0", 1100, 15, 105),
          x("user_annotation", "ortlab: step 2 backward", 1000, 1000),
          x("cpu_op", "autograd::engine::evaluate_function: AddmmBackward0", 1100, 300, AUTOGRAD,
            **{"Sequence number": 7}),
          x("cpu_op", "aten::mm", 1120, 200, AUTOGRAD, **{"External id": 9}), launch(1130, 102, AUTOGRAD),
          *kernel("ampere_sgemm_64x32_sliced1x4_nt", 1300, 200, 102),
          x("cpu_op", "aten::_local_scalar_dense", 1800, 100, **{"External id": 11}),
          launch(1810, 104, name="cudaMemcpyAsync"), *kernel("Memcpy DtoH (Device -> Pageable)", 1820, 5, 104,
                                                               "gpu_memcpy"),
          x("user_annotation", "ortlab: step 2 optimizer", 2000, 500),
          x("cpu_op", "aten::_foreach_add_", 2010, 100, **{"External id": 12}), launch(2020, 103),
          *kernel("void at::native::multi_tensor_apply_kernel", 2600, 50, 103),
          launch(3000, 106), *kernel("after_the_profiled_steps", 3100, 99, 106),  # outside every phase
          x("gpu_user_annotation", "ortlab: step 2 forward", 900, 400, STREAM, 0)]
    return ev


def test_cuda_kernels_are_attributed_to_the_op_module_and_phase_that_launched_them():
    rows, kernels = profile.cuda_rows(trace(), compiled=True)
    got = {(phase, module, op): seconds for _step, phase, module, op, _node, seconds in rows}
    assert got == {("forward", "lin", "aten::addmm"): 120e-6,
                   ("forward", profile.COMPILED, "Torch-Compiled Region"): 15e-6,
                   ("backward", "lin", "aten::mm"): 200e-6,  # the autograd thread: by sequence number
                   ("backward", profile.NONE, "aten::_local_scalar_dense"): 5e-6,
                   ("optimizer", profile.OPTIMIZER, "aten::_foreach_add_"): 50e-6}
    assert {r[0] for r in rows} == {2}
    assert kernels[0] == {"kernel": "ampere_sgemm_64x32_sliced1x4_nt", "phase": "backward", "s": 200e-6, "count": 1}
    assert "after_the_profiled_steps" not in {k["kernel"] for k in kernels}
    walls = {2: {"forward": 1000e-6, "backward": 1000e-6, "optimizer": 500e-6}}
    shown = profile.breakdown(rows, walls, kernels="CUDA kernels", outside="the rest")
    parts = {(p["phase"], p["kind"]): p["s"] for p in shown["parts"]}
    assert parts[("forward", "kernels")] == 135e-6 and parts[("forward", "outside")] == 1000e-6 - 135e-6
    assert {m["module"] for m in shown["modules"]} >= {"lin", profile.COMPILED, profile.OPTIMIZER}


def test_the_host_rows_of_the_same_trace_keep_their_launch_time():
    """The CPU op rows (what a CPU burst reports) are unchanged by the launches inside them: an op's self time
    includes its launch calls, as without CUDA."""
    rows = profile.torch_rows(trace())
    addmm = next(r for r in rows if r[3] == "aten::addmm")
    assert addmm[1:3] == ("forward", "lin") and addmm[5] == 300e-6


def test_the_cuda_allocator_figures_reach_the_summary():
    mb = 2**20
    data = {"kind": "autograd", "counts": "PyTorch: ...", "saved_bytes": 3 * mb,
            "allocator": {"peak_allocated_bytes": 512 * mb, "peak_reserved_bytes": 640 * mb,
                          "allocated_bytes": 100 * mb, "reserved_bytes": 640 * mb}}
    fields = summary_fields(data)
    assert fields["saved_for_backward_mb"] == 3.0
    assert fields["cuda_allocator_mb"] == {"peak_allocated": 512.0, "peak_reserved": 640.0, "allocated": 100.0,
                                           "reserved": 640.0}
    assert summary_fields({**data, "kind": "graph", "missing": "no graph"})["cuda_allocator_mb"]["peak_reserved"] == 640
    lines = table({"pytorch": {"status": "ok", "peak_mem_mb": 512.0, "peak_reserved_mb": 640.0}}, ["pytorch"],
                  cuda=True)
    assert any(line.startswith("peak CUDA allocated (MB)") and line.endswith("512") for line in lines)
    assert any(line.startswith("peak CUDA reserved (MB)") and line.endswith("640") for line in lines)
    assert not any("reserved" in line for line in table({"pytorch": {"status": "ok"}}, ["pytorch"]))


def test_a_burst_needs_neither_ipywidgets_nor_netron(tmp_path):
    """The GPU machines ortlab is proven on have neither (nor a registry to install them): a burst from the CLI (a
    comparison with its verdict and every collector that runs there) and from Python must not import them. Here
    both are shadowed by packages whose import fails, in this process's children and their workers alike."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    for name in ("ipywidgets", "netron"):
        (tmp_path / "shadow" / name).mkdir(parents=True)
        (tmp_path / "shadow" / name / "__init__.py").write_text(f"raise ImportError('{name} is not installed here')\n")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "shadow"), str(root),
                                                         os.environ.get("PYTHONPATH", "")])}
    cli = subprocess.run([sys.executable, "-m", "ortlab.cli", "burst", "--backend", "pytorch,compile",
                          "--compile-backend", "eager", "--parity", "--steps", "3", "--collect", "stats", "--collect",
                          "time", "--time-steps", "1", "--out", str(tmp_path / "cli")], capture_output=True, text=True,
                         env=env, timeout=600)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert "compile verdict: agree" in cli.stdout
    code = ("import sys, ortlab; run = ortlab.burst(backend='pytorch', steps=2, out=sys.argv[1], progress=False); "
            "print(run.status, [m for m in sys.modules if m.split('.')[0] in ('ipywidgets', 'netron')])")
    api = subprocess.run([sys.executable, "-c", code, str(tmp_path / "api")], capture_output=True, text=True, env=env,
                         timeout=600)
    assert api.returncode == 0 and api.stdout.split() == ["ok", "[]"], api.stdout + api.stderr
