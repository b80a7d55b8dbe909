"""Reading ORTModule's exported graphs at scale: summaries and stage diffs of a >= 5,000-node training graph.

Exports a larger GPT from ortlab.demo once with the real ORTModule (save_onnx), then, from a cold start each
round (files read from disk again), times every stage's summary (node counts by kind, op histogram, inputs,
outputs, sizes) and every stage diff (each consecutive pair and first -> last). Target: under 2 s.

The export runs on `--device` (cuda when torch sees a GPU; ORTModule, so it needs onnxruntime-training: refused in
one line without it); reading the graphs is the host's work wherever they were exported.

    python benchmarks/graphs.py [--n-layer 52] [--rounds 5] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

import _device

TARGET_S = 2.0
MIN_NODES = 5000


def summaries_and_diffs(run) -> list:
    """Everything a summary and the diffs show, returned so that none of it is computed for nothing."""
    from ortlab.graphs import load

    g = load(run)  # a new reader: nothing cached from the previous round
    shown = [g.summary()]
    for stage in g.stages():
        s = g.stage(stage)
        shown += [s.histogram(), s.inputs, s.outputs]
    return [*shown, g.diffs(), g.diff()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-layer", type=int, default=52,
                        help="GPT blocks (52 gives a ~5,200-node training graph)")
    parser.add_argument("--rounds", type=int, default=5)
    _device.add_argument(parser)
    args = parser.parse_args()
    device = _device.chosen(args, parser).type
    if _device.ortmodule_missing():
        parser.error(f"the graphs are ORTModule's: {_device.ortmodule_missing()}")

    from ortlab import Session
    from ortlab.graphs import load

    model = {"n_layer": args.n_layer, "d_model": 32, "n_head": 2, "seq_len": 32, "batch_size": 2}
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        with Session(model_kwargs=model, out=out, in_process=True) as s:
            run = s.burst("ortmodule", 1, {"save_onnx": True}, progress=False, device=device)
        if not run.ok:
            print(f"the export failed: {run.error}")
            return 1
        export_s = time.perf_counter() - started
        g = load(run)
        nodes = {name: g.stage(name).node_count for name in g.stages()}
        print(f"model: TinyGPT {model}; ORTModule export {export_s:.1f} s (not timed below)")
        print("nodes per stage: " + ", ".join(f"{k} {v}" for k, v in nodes.items()))
        largest = nodes["optimized"]  # the training graph: forward + gradient
        if largest < MIN_NODES:
            print(f"FAIL: the training graph has {largest} nodes, fewer than {MIN_NODES}: raise --n-layer")
            return 1

        times = []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            summaries_and_diffs(run)
            times.append(time.perf_counter() - t0)
        g = load(run)
        stage = g.stage("optimized")
        t0 = time.perf_counter()
        hits = stage.search("blocks.7.attn", limit=None)
        search_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        stage.neighbourhood(hits["name"].iloc[0], hops=3).svg(engine="ortlab")
        neighbourhood_s = time.perf_counter() - t0

    median = statistics.median(times)
    print(f"summaries + diffs of {len(nodes)} stages ({sum(nodes.values())} nodes in all), cold, "
          f"{args.rounds} rounds: median {median:.2f} s, best {min(times):.2f} s, worst {max(times):.2f} s")
    print(f"(for reference: search {search_s * 1000:.0f} ms, 3-hop neighbourhood drawn "
          f"{neighbourhood_s * 1000:.0f} ms)")
    ok = median < TARGET_S
    print(f"{'PASS' if ok else 'FAIL'}: median {median:.2f} s {'<' if ok else '>='} target {TARGET_S:.1f} s (exported "
          f"on {_device.describe(device)})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
