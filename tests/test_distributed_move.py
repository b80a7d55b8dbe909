"""The move of a distributed job (ortlab.comparison.distributed, ortlab.move.ranks, ortlab.engine.comm): each
backend's strategy, refused before any rank where its backend or stack cannot take it; a rank's time in
communication; a transformers model's FSDP2 blocks. Slow: ORTModule with DDP on the ort stack beside torch.compile
with FSDP2 on the current one, and a tiny GPT-2 under DDP, ZeRO-1 and FSDP2 against one process (2 gloo ranks)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ortlab.engine.config import BurstError, backend_strategies, fsdp2_cpu_missing, fully_shard_missing
from ortlab.stacks.table import Stack, this_stack

FACTORIES = Path(__file__).parent / "factories"
GPT2 = f"{FACTORIES / 'hf_gpt2.py'}:tiny_gpt2"
TINY = ["--model-arg", "n_layer=1", "--model-arg", "d_model=32", "--model-arg", "seq_len=16", "--model-arg",
        "batch_size=4"]
NO_FSDP2_HERE = bool(fully_shard_missing() or fsdp2_cpu_missing())
BACKENDS = ["pytorch", "ortmodule", "compile"]


def test_a_strategy_is_one_for_all_or_each_backend_s():
    assert backend_strategies(None, BACKENDS) == dict.fromkeys(BACKENDS)
    assert backend_strategies("ddp", BACKENDS) == dict.fromkeys(BACKENDS, "ddp")
    assert backend_strategies("ortmodule=ddp,compile=fsdp2", BACKENDS) == {
        "pytorch": None, "ortmodule": "ddp", "compile": "fsdp2"}  # PyTorch: its default (ddp with several ranks)
    assert backend_strategies("fsdp2, ortmodule=zero1", BACKENDS) == {
        "pytorch": "fsdp2", "ortmodule": "zero1", "compile": "fsdp2"}  # a bare one is the others'
    assert backend_strategies({"compile": "fsdp2"}, BACKENDS)["compile"] == "fsdp2"


@pytest.mark.parametrize(("value", "words"), [
    ("fsdp3", "strategy 'fsdp3' (in 'fsdp3') is not allowed; allowed: single, ddp, zero1, fsdp2"),
    ("onnx=ddp", "names backend 'onnx', which is not compared here; allowed: pytorch, ortmodule, compile"),
])
def test_a_bad_strategy_spelling_is_refused_in_one_line(value, words):
    with pytest.raises(BurstError) as e:
        backend_strategies(value, BACKENDS)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_compare_takes_each_backend_s_strategy_and_burst_one():
    from ortlab.cli import build_parser
    from ortlab.cli.burst import burst_kwargs

    args = build_parser().parse_args(["compare", "--nproc", "2", "--strategy", "ortmodule=ddp,compile=fsdp2"])
    assert burst_kwargs(args)[0]["strategy"] == "ortmodule=ddp,compile=fsdp2"
    for command in ("burst", "compare"):  # burst takes one strategy; compare's words are strategies
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--strategy", "ortmodule=ddp" if command == "burst" else "zero3"])


def test_a_strategy_a_backend_cannot_take_is_refused_before_any_rank(tmp_path):
    from ortlab import Session
    from ortlab.stacks.table import ortmodule_unavailable

    if ortmodule_unavailable():
        pytest.skip(f"ORTModule does not run here: {ortmodule_unavailable()}")

    with Session(None, {"n_layer": 1}, out=tmp_path / "runs") as s, pytest.raises(
            BurstError, match="strategy 'fsdp2' cannot run backend 'ortmodule'"):
        s.compare(2, backends="pytorch,ortmodule", nproc=2, strategy="ortmodule=fsdp2", device="cpu", progress=False)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_fsdp2_placed_on_the_ort_stack_s_cpu_is_refused_before_any_rank(tmp_path):
    """Here by BurstConfig on the ort stack; from the current stack by the ort stack's Python, whose torch it is."""
    import ortlab
    from ortlab.engine.stack_env import ready

    if ready(Stack.ORT) is not None:
        pytest.skip(f"the ort stack's environment cannot be built here: {ready(Stack.ORT)}")
    with pytest.raises(BurstError) as e:
        ortlab.compare_stacks("ortlab.demo:gpt", "pytorch,compile@ort", 2, nproc=2, strategy="compile=fsdp2",
                              device="cpu", out=tmp_path, progress=False)
    assert "strategy 'fsdp2' on the CPU fails" in str(e.value) and "record_event" in str(e.value)
    assert "\n" not in str(e.value)
    if this_stack() == Stack.CURRENT:
        assert str(e.value).startswith("compile@ort (torch 2.6")
    assert not any(p for p in tmp_path.iterdir() if p.name != ".snapshots")


def test_time_in_communication_is_the_union_of_collectives_in_flight():
    from ortlab.engine.comm import CommClock, step_fields

    clock = CommClock()
    clock.begin()
    start = clock._since
    clock.add(start + 1.0, start + 3.0)
    clock.add(start + 2.0, start + 4.0)  # overlaps the first: counted once
    clock.add(start + 6.0, start + 7.0)
    clock.add(start - 5.0, start + 0.5)  # began before the step: its part inside
    assert clock.seconds() == pytest.approx(4.5)
    assert step_fields(4.5, 9.0) == {"comm_s": 4.5, "comm_share": 0.5}
    assert step_fields(4.5, 2.0)["comm_share"] == 1.0
    clock.begin()
    assert clock.seconds() == 0.0


def test_fsdp2_shards_a_transformers_model_s_declared_blocks():
    pytest.importorskip("transformers")
    from ortlab.engine.sharding import blocks
    from ortlab.workload import ModelRef

    gpt2 = ModelRef.of(GPT2).build().model  # lm_head tied to transformer.wte: both stay with the root
    assert blocks(gpt2) == ["transformer.h.0", "transformer.h.1"]
    bert = ModelRef.of(f"{FACTORIES / 'hf_models.py'}:bert_mlm").build().model
    if "BertEmbeddings" in (bert._no_split_modules or ()):  # declared by newer transformers (5.x), not 4.51
        # its word embeddings are the MLM head's decoder weight: BertEmbeddings is left to the root
        assert blocks(bert) == ["bert.encoder.layer.0", "bert.encoder.layer.1"]


# -- real ranks: 2 processes over gloo on the CPU


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "zero1", "fsdp2"])
def test_a_transformers_model_under_each_strategy_agrees_with_one_process(tmp_path, strategy):
    pytest.importorskip("transformers")
    if strategy == "fsdp2" and NO_FSDP2_HERE:
        pytest.skip(f"FSDP2 does not run on this torch's CPU ({fsdp2_cpu_missing() or fully_shard_missing()})")
    r = subprocess.run([sys.executable, "-m", "ortlab.cli", "burst", "--backend", "pytorch", "--model", GPT2,
                        "--nproc", "2", "--strategy", strategy, "--parity", "--steps", "3", "--device", "cpu",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    headline = [line for line in r.stdout.splitlines() if "against one process of the same global batch" in line]
    assert headline and ": agree" in headline[0], r.stdout[-3000:]
    assert headline[0].rstrip().endswith(f"(against one process of the same global batch, 2 ranks, {strategy})")
    run = next(p for p in tmp_path.iterdir() if p.name.endswith("-pytorch"))
    meta = json.loads((run / "meta.json").read_text())
    assert all(0 <= row["comm_share"] <= 1 for row in meta["ranks"]), meta["ranks"]  # engine.comm, per rank
    if strategy == "fsdp2":
        rank = json.loads((run / "ranks" / "0" / "meta.json").read_text())
        assert rank["fsdp2_units"] == ["transformer.h.0", "transformer.h.1"]


@pytest.mark.slow
def test_ortmodule_with_ddp_on_the_ort_stack_moves_to_compile_with_fsdp2_on_the_current_stack(tmp_path):
    """One snapshot; ORTModule's ranks on the ort stack, torch.compile's on the current one, each judged against one
    process of the same global batch, the two against each other from their folders, the move rank by rank."""
    from ortlab.engine.stack_env import ready

    for stack in Stack:
        if ready(stack) is not None:
            pytest.skip(f"the {stack} stack's environment cannot be built here: {ready(stack)}")
    r = subprocess.run([sys.executable, "-m", "ortlab.cli", "compare", "--nproc", "2", "--backends",
                        "ortmodule@ort,compile@current", "--strategy", "ortmodule=ddp,compile=fsdp2", "--steps", "3",
                        *TINY, "--device", "cpu", "--out", str(tmp_path), "--json"],
                       capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stderr[-4000:]
    d = json.loads(r.stdout)
    assert {b: s["stack"] for b, s in d["stacks"].items()} == {"pytorch": str(this_stack()), "ortmodule": "ort",
                                                                "compile": "current"}
    for backend, strategy in (("ortmodule", "ddp"), ("compile", "fsdp2")):
        verdict = d["versus"][backend]["verdict"]
        assert verdict["status"] == "agree", verdict
        assert verdict["headline"].endswith(f"(against one process of the same global batch, 2 ranks, {strategy})")
        assert any(n.startswith("judged against each other from their folders") and "started alike" in n
                   for n in verdict["notes"]), verdict["notes"]
        meta = json.loads((Path(d[backend]["path"]) / "meta.json").read_text())
        assert meta["strategy"] == strategy and meta["stack"]["name"] == d["stacks"][backend]["stack"]
        assert meta["versions"]["torch"].startswith("2.6" if backend == "ortmodule" else "2.14")
    from ortlab.move.report import move_report

    report = move_report(d["ortmodule"]["path"], d["compile"]["path"])
    assert (report.ortmodule.strategy, report.target.strategy) == ("ddp", "fsdp2")
    assert [row["rank"] for row in report.ranks] == [0, 1]
    for row in report.ranks:
        for key in ("peak_mem_mb", "median_step_s", "comm_share"):
            assert row[key]["from"] is not None and row[key]["to"] is not None, row
    text = str(report)
    assert "per rank: ORTModule ddp, 2 ranks -> torch.compile fsdp2, 2 ranks" in text
    assert "in communication (% of step)" in text and "both train the same model as PyTorch" in text
