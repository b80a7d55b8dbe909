"""How long `ortlab.memory` takes: a synthetic 5,000-node training graph (target < 1 s) and, with --gpt2, the
execution model of GPT-2 small (124M parameters, random weights, batch 2, sequence 128; target < 2 s),
exported by a real ORTModule burst with save_onnx first (about half a minute on a 2-core CPU).

The synthetic graph is shaped like ORTModule's: a forward chain (MatMul, Add, Relu, Reshape per layer) up to
a YieldOp, then the backward chain that reads the stashed forward values (ReluGrad, ReduceSum, Reshape, Gemm,
FusedMatMul per layer), symbolic shapes `batch`, `seq`, `batch*seq` as ORT saves them, parameter gradients
as graph outputs. Times are the median of --rounds calls, reading the file included.

The synthetic graph is a file read on the host (no device); `--device` (cuda when torch sees a GPU) is where the
--gpt2 burst runs (ORTModule: it needs onnxruntime-training).

    python benchmarks/memory_account.py [--nodes 5000] [--rounds 5] [--gpt2] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _device

TARGETS = {"synthetic": 1.0, "gpt2-small": 2.0}


def synthetic_graph(path: Path, nodes: int = 5000, hidden: int = 64) -> Path:
    """Write a training-like execution model of about `nodes` nodes (10 per layer) to `path`."""
    import onnx
    from onnx import TensorProto, helper

    node, info = helper.make_node, helper.make_tensor_value_info
    layers = max(1, nodes // 10)
    f32, ms = TensorProto.FLOAT, "com.microsoft"
    bsh, flat = ["batch", "seq", hidden], ["batch*seq", hidden]
    inputs, outputs, infos, body, back = [info("x0", f32, bsh)], [], [], [], []
    for i in range(layers):
        w, b, x, nxt, at = f"w{i}", f"b{i}", f"x{i}", f"x{i + 1}", f"/layers.{i}"
        inputs += [info(w, f32, [hidden, hidden]), info(b, f32, [hidden])]
        outputs += [info(f"{w}_grad", f32, [hidden, hidden]), info(f"{b}_grad", f32, [hidden])]
        body += [node("MatMul", [x, w], [f"mm{i}"], name=f"{at}/MatMul"),
                 node("Add", [f"mm{i}", b], [f"a{i}"], name=f"{at}/Add"),
                 node("Relu", [f"a{i}"], [f"r{i}"], name=f"{at}/Relu"),
                 node("Reshape", [f"r{i}", "shape3"], [nxt], name=f"{at}/Reshape")]
        da = f"a{i}_grad"
        back = [node("ReluGrad", [f"{nxt}_grad", f"r{i}"], [da], name=f"{at}/Relu_Grad", domain=ms),
                node("ReduceSum", [da, "axes"], [f"{b}_grad"], name=f"{at}/Add_Grad", keepdims=0),
                node("Reshape", [x, "shape2"], [f"{x}_2d"], name=f"{at}/MatMul_Grad/Reshape_1"),
                node("Reshape", [da, "shape2"], [f"{da}_2d"], name=f"{at}/MatMul_Grad/Reshape_2"),
                node("Gemm", [f"{x}_2d", f"{da}_2d"], [f"{w}_grad"], name=f"{at}/MatMul_Grad/Gemm", transA=1),
                node("FusedMatMul", [da, w], [f"{x}_grad"], name=f"{at}/MatMul_Grad/FMM", domain=ms,
                     transB=1),
                *back]
        infos += [info(t, f32, bsh) for t in (f"mm{i}", f"a{i}", f"r{i}", nxt, da, f"{x}_grad")]
        infos += [info(t, f32, flat) for t in (f"{x}_2d", f"{da}_2d")]
    body.append(node("YieldOp", [f"x{layers}"], [f"x{layers}_grad"], name="YieldOp", domain=ms,
                     full_shape_outputs=[0]))
    constants = [helper.make_tensor("shape3", TensorProto.INT64, [3], [0, 0, hidden]),
                 helper.make_tensor("shape2", TensorProto.INT64, [2], [-1, hidden]),
                 helper.make_tensor("axes", TensorProto.INT64, [2], [0, 1])]
    graph = helper.make_graph(body + back, "synthetic_training", inputs, outputs, constants, value_info=infos)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(ms, 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets), str(path))
    return path


def timed(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def gpt2_small(batch_size: int = 2, seq_len: int = 128):
    """GPT-2 small's shape with random weights (no download), through ortlab's factory protocol."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from ortlab import Workload

    config = GPT2Config(use_cache=False, attn_implementation="eager")
    model = GPT2LMHeadModel(config)

    def batch(step):
        generator = torch.Generator().manual_seed(step)
        ids = torch.randint(0, config.vocab_size, (batch_size, seq_len), generator=generator)
        return {"input_ids": ids}, ids

    def loss(out, ids):
        logits = out["logits"][:, :-1]
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))

    return Workload(model, batch, loss, name="GPT-2 small (random weights)", batch_size=batch_size)


def gpt2_run(out: str, device: str = "cpu"):
    import ortlab

    with ortlab.Session(gpt2_small, out=out, in_process=True) as session:
        return session.burst("ortmodule", 1, {"save_onnx": True}, progress=False, device=device)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--gpt2", action="store_true",
                        help="also export GPT-2 small through a real ORTModule burst (about a minute)")
    _device.add_argument(parser)
    args = parser.parse_args()
    device = _device.chosen(args, parser).type
    if args.gpt2 and _device.ortmodule_missing():
        parser.error(f"--gpt2 exports through ORTModule: {_device.ortmodule_missing()}")
    from ortlab.account import memory

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = synthetic_graph(Path(tmp) / "synthetic_execution_model_training.onnx", args.nodes)
        dims = {"batch": 8, "seq": 128}
        account = memory(path, dims=dims)
        rows.append(("synthetic", account, timed(lambda: memory(path, dims=dims), args.rounds)))
        if args.gpt2:
            started = time.perf_counter()
            run = gpt2_run(tmp, device)
            print(f"(GPT-2 small burst with save_onnx: {time.perf_counter() - started:.0f} s, {run.status})")
            shapes = {"input_ids": (2, 128)}
            account = memory(run, input_shapes=shapes)
            rows.append(("gpt2-small", account, timed(lambda: memory(run, input_shapes=shapes), args.rounds)))
    failed = False
    print(f"{'graph':<12} {'nodes':>6} {'peak MB':>9} {'uncertain':>9} {'time (s)':>9} {'target':>7}   (read on the "
          f"host; the gpt2 burst on {_device.describe(device)})")
    for name, account, seconds in rows:
        ok = seconds < TARGETS[name]
        failed |= not ok
        target = f"< {TARGETS[name]}"
        print(f"{name:<12} {account.nodes:>6} {account.peak_activation_bytes / 2**20:>9.2f} "
              f"{len(account.uncertain):>9} {seconds:>9.3f} {target:>7} {'ok' if ok else 'SLOW'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
