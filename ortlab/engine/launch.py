"""Distributed bursts, the launching side: one burst as N ranks started by torch's elastic agent (the machinery
behind torchrun), on one machine or many.

`run()` (Session, for nproc * nnodes > 1) makes the run folder, writes the spec, starts
`python -m ortlab.engine.launch SPEC_DIR` (whose `main()` runs `elastic_launch`: rendezvous, the ranks of
ortlab.engine.ranks, their monitoring, ending the others when one fails), forwards the lowest local rank's steps,
turns Stop into a request every rank honours after the same step (then SIGTERM to the agent), and finally maps
the agent's result and each rank's run onto the run: `status`, `error`, `ranks`, `in_sync`, `checkpoint`.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ortlab.engine import balance
from ortlab.engine.backends import registered
from ortlab.engine.config import BurstConfig, BurstError, resolve_device
from ortlab.engine.machine import available_cores, load_average, warn_oversubscribed
from ortlab.engine.orphan import on_parent_death
from ortlab.options import Options
from ortlab.runs.files import appended, read_json
from ortlab.runs.run import Run, RunStatus, RunWriter, load_run, mark, new_run_dir, write_json
from ortlab.stacks import table as stacks

KILL_GRACE_S = 5.0  # after SIGTERM to the agent, before SIGKILL
COLLECTIVE_TIMEOUT_S = float(os.environ.get("ORTLAB_COLLECTIVE_TIMEOUT_S", 300))  # no collective waits forever
RENDEZVOUS_TIMEOUT_S = 600  # how long the launches of a job wait for each other
MULTI_NODE_RUN_ID = "ortlab"  # one id for every launch of a job: they meet at the same endpoint
# What every rank's environment has unless the user set it. One thread per rank, as torchrun does: N ranks must not
# each take every core. glibc's heap: a rank otherwise gives memory back to the system and takes it again every
# step (a dozen brk calls and ~1000 page faults per step on the demo, measured by
# benchmarks/distributed_overhead.py); fixed thresholds keep each step's buffers in the heap (up to 32 MB each,
# glibc's own adaptive ceiling).
RANK_ENV = {"OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(64 << 20)}
RANK_KEYS = ("rank", "status", "steps", "final_loss", "median_step_s", "peak_mem_mb", "optimizer_state_bytes",
             "comm_s", "comm_share")  # comm: the median step's time with a collective in flight (ortlab.engine.comm)


def run(ref, seed: int, snapshot: str | Path | None, cfg: BurstConfig,
        on_step: Callable[[dict], None] | None = None, should_stop: Callable[[], bool] | None = None,
        stop_again: Callable[[], bool] = lambda: False, stack: str | None = None) -> Path:
    """Run `cfg` as cfg.nproc ranks on this machine (one node of cfg.nnodes) and return the run folder. `stack`:
    the stack whose Python runs the agent and its ranks (ortlab.engine.stack_env; None: this process's)."""
    _check_devices(cfg)
    warn_oversubscribed(cfg.nproc)
    path = new_run_dir(cfg.out, cfg.backend, cfg.name)
    writer = RunWriter(path, {
        "backend": cfg.backend, "config": cfg.to_dict(), "effective_options": cfg.effective_options().to_dict(),
        "model": {"factory": ref.describe()}, "nproc": cfg.nproc, "nnodes": cfg.nnodes, "node_rank": cfg.node_rank,
        "strategy": str(cfg.strategy),
        "world_size": cfg.world_size, "pid": os.getpid(), "stack": stacks.recorded(),
        "machine": {"cores": available_cores(), "ranks": cfg.nproc, "load": load_average()},
    })
    spec_dir = path / ".launch"
    spec_dir.mkdir()
    (spec_dir / "ref.pkl").write_bytes(pickle.dumps(ref))
    write_json(spec_dir / "spec.json", {
        "run": str(path), "config": cfg.to_dict(), "seed": seed, "snapshot": str(snapshot) if snapshot else None,
        "timeout_s": COLLECTIVE_TIMEOUT_S,
        "run_id": MULTI_NODE_RUN_ID if cfg.nnodes > 1 else uuid.uuid4().hex,
    })
    proc = _start_agent(spec_dir, cfg, path / "log.txt", stack)
    try:
        stop = _follow(proc, path, cfg.nproc, writer, on_step, should_stop, stop_again)
    except BaseException as e:  # e.g. a callback that raised: no rank outlives the burst, no run stays "running"
        _end(proc)
        writer.finish(RunStatus.FAILED, error=f"the launching process failed while following the ranks: {e!r}")
        raise
    result = _read_json(spec_dir / "result.json") or {"error": f"the launcher ended with code {proc.returncode} "
                                                               f"without a result; its log: {path / 'log.txt'}"}
    shutil.rmtree(spec_dir, ignore_errors=True)
    (path / "stop").unlink(missing_ok=True)
    status, extra = _outcome(path, result, stop)
    waits = [w for rank in load_run(path).ranks if (w := (rank.meta.get("machine") or {}).get("cpu_wait")) is not None]
    if waits:  # the rank that waited most for a core (ortlab.engine.machine)
        extra["machine"] = {**writer.meta.get("machine", {}), "cpu_wait": max(waits)}
    local = _rank_dirs(path)
    _check_graphs(local, extra)
    lowest = load_run(local[0]).meta if local and (local[0] / "meta.json").is_file() else {}
    for key in ("versions", "stack"):  # what the ranks ran on (another stack's Python: not this process's)
        if lowest.get(key):
            extra[key] = lowest[key]
    # the views read them here: the lowest rank's
    for name in ("ort.json", "transitions.json", "memory.json", "compile.json"):
        source = (local[0] if local else path) / name
        if source.is_file():
            shutil.copyfile(source, path / name)
    writer.finish(status, **extra)
    bad_input = [run.meta["bad_input"] for run in _rank_runs(path).values() if run.meta.get("bad_input")]
    if bad_input:  # e.g. a sampler for a workload without a dataset: the caller's error, as in one process
        raise BurstError(bad_input[0])
    return path


def _check_graphs(local: list[Path], extra: dict[str, Any]) -> None:
    """Whether every rank that finished exported the same graphs (save_onnx): `rank_graphs` in the run's meta."""
    from ortlab.runs.stages import check, run_stage_folders

    runs = [load_run(p) for p in local if (p / "meta.json").is_file()]
    info = check({int(r.path.name): run_stage_folders(r) for r in runs
                  if r.status in (RunStatus.OK, RunStatus.INTERRUPTED)})
    if info is not None:
        extra["rank_graphs"] = info
        if not info["identical"]:
            extra["warning"] = f"the ranks exported different graphs: {', '.join(info['differ'])}"


def _check_devices(cfg: BurstConfig) -> None:
    """What every rank would refuse, refused once before anything starts: one GPU per rank on CUDA (the precision
    and the device: BurstConfig checked them)."""
    if cfg.device == "cpu":
        return
    import torch

    device = resolve_device(cfg.device)
    if device.type == "cuda" and cfg.nproc > torch.cuda.device_count():
        raise BurstError(f"nproc {cfg.nproc} is more than this machine's {torch.cuda.device_count()} GPUs (one rank "
                         "per GPU with NCCL); use fewer ranks or device='cpu'")


def _start_agent(spec_dir: Path, cfg: BurstConfig, log_path: Path, stack: str | None = None) -> subprocess.Popen:
    from ortlab.engine.stack_env import worker_interpreter

    python, elsewhere = worker_interpreter(stack)  # another stack: its Python and environment, as a worker's
    env = {**RANK_ENV, **(os.environ if elsewhere is None else elsewhere)}  # the user's own values win
    imports = registered(cfg.backend).imports(cfg.effective_options()) or Options()
    with imports.applied(env):
        env["PYTHONUNBUFFERED"] = "1"
        if elsewhere is None:
            env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p and Path(p).is_dir()])
        with open(log_path, "ab") as log:
            return subprocess.Popen([python, "-m", "ortlab.engine.launch", str(spec_dir)],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, cwd=os.getcwd(),
                                    start_new_session=True)


def _rank_dirs(path: Path) -> list[Path]:
    """This machine's rank folders, lowest rank first (the rendezvous decides which global ranks they are)."""
    folder = path / "ranks"
    if not folder.is_dir():
        return []
    return sorted((p for p in folder.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))


def _follow(proc: subprocess.Popen, path: Path, nproc: int, writer: RunWriter, on_step, should_stop,
            stop_again: Callable[[], bool]) -> str | None:
    """Forward the lowest local rank's steps until the agent ends; a Stop (or Ctrl-C) becomes the stop file the
    ranks read after every step; ranks that show no progress after it, or a second Stop (ortlab.engine.grace), end
    them: SIGTERM to the agent (it ends its ranks), then SIGKILL. None if not stopped, else why the ranks were
    ended ("": they ended by themselves)."""
    from ortlab.engine.grace import StopGrace

    offset, stopped, ended_by_us, metrics = 0, False, False, None
    # the agent polls its ranks all along: its CPU time is no progress
    grace = StopGrace(proc.pid, leader=False, again=stop_again)
    while True:
        try:
            ended = proc.poll() is not None
            if metrics is None:
                local = _rank_dirs(path)
                if ended or len(local) == nproc:
                    metrics = local[0] / "metrics.jsonl" if local else path / "no-ranks"
            if metrics is not None:
                new = _forward(metrics, offset, writer, on_step)
                if new != offset:
                    grace.progress()
                offset = new
            if ended:
                return grace.reason if stopped else None
            if not stopped and should_stop is not None and should_stop():
                stopped = True
            if stopped and grace.started is None:
                (path / "stop").touch()
                grace.start()
            if not ended_by_us and grace.expired():
                _end(proc)
                ended_by_us = True
            time.sleep(0.1)
        except KeyboardInterrupt:
            stopped = True


def _end(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()


def _forward(metrics: Path, offset: int, writer: RunWriter, on_step) -> int:
    """Copy the complete new lines of a rank's metrics into the run's metrics (and to `on_step`)."""
    rows, offset = appended(metrics, offset)
    for row in rows:
        writer.step(row)
        if on_step:
            on_step(row)
    return offset


def _read_json(path: Path) -> Any:
    return read_json(path, strict=False)


def _outcome(path: Path, result: dict[str, Any], stopped: str | None) -> tuple[str, dict[str, Any]]:
    """The run's status and what it reports, from the agent's result and each rank's own run."""
    ranks = _rank_runs(path)
    failures = _own_failures(result.get("failures") or {}, ranks)
    culprit = None if stopped is not None else _culprit(ranks, failures)
    for r, run in ranks.items():
        if r == culprit:
            _mark_culprit(r, run, failures.get(str(r)))
        elif run.status == RunStatus.RUNNING:  # ended by the agent
            why = ("the Stop request" if stopped is not None else f"rank {culprit} failed" if culprit is not None
                   else "the launch")
            mark(run.path, RunStatus.STOPPED, error=f"rank {r} was ended by the launcher after {why}")
        elif culprit is not None and run.status == RunStatus.FAILED and run.meta.get("collective"):
            write_json(run.path / "meta.json", {**run.meta, "status": str(RunStatus.STOPPED),
                                                "error": f"stopped after rank {culprit} failed: {run.error}"})
    ranks = _rank_runs(path)
    rows = [_rank_row(r, run) for r, run in ranks.items()]
    rows += [{"rank": int(r), "status": RunStatus.CRASHED, "error": f"ended ({_signal_name(f['exitcode'])}) before its "
              f"burst started: {f['message']}"} for r, f in failures.items() if int(r) not in ranks]
    extra: dict[str, Any] = {"ranks": sorted(rows, key=lambda row: row["rank"])}
    synced = [run.meta["in_sync"] for run in ranks.values() if "in_sync" in run.meta]
    if synced:
        extra["in_sync"] = all(synced)
        bad = [run.meta["out_of_sync"] for run in ranks.values() if run.meta.get("out_of_sync")]
        if bad:
            extra["out_of_sync"] = min(bad, key=lambda d: d["step"])
    if ranks:
        lowest = ranks[min(ranks)]
        figures = balance.summary(lowest.metrics, lowest.meta.get("config", {}).get("sampler"))
        if figures:
            extra["imbalance"] = figures
    checkpoints = [run.meta["checkpoint"] for run in ranks.values() if run.meta.get("checkpoint")]
    if checkpoints:
        extra["checkpoint"] = checkpoints[0]
    if culprit is not None:
        run = ranks[culprit]
        others = "; the other ranks were stopped" if len(ranks) > 1 else ""
        extra["error"] = f"{run.error or f'rank {culprit} failed'}{others}; its log: {run.path / 'log.txt'}"
        extra["failed_rank"] = culprit
        return (RunStatus.CRASHED if run.status == RunStatus.CRASHED else RunStatus.FAILED), extra
    if stopped is not None:
        clean = bool(rows) and {row["status"] for row in rows} <= {RunStatus.OK, RunStatus.INTERRUPTED}
        extra["error"] = ("interrupted by the user: every rank ended after the same step" if clean else
                          f"stopped: the ranks were ended because {stopped or 'they did not end after the Stop'}")
        return (RunStatus.INTERRUPTED if clean else RunStatus.STOPPED), extra
    if result.get("ok") and rows and all(row["status"] == RunStatus.OK for row in rows):
        return RunStatus.OK, extra
    fell_back = [run for run in ranks.values() if run.status == RunStatus.FALLBACK]
    if result.get("ok") and rows and fell_back and all(row["status"] in (RunStatus.OK, RunStatus.FALLBACK)
                                                       for row in rows):
        first = fell_back[0]
        extra.update(error=f"rank {first.meta.get('rank')}: {first.error}", fallback=first.meta.get("fallback"))
        return RunStatus.FALLBACK, extra
    detail = result.get("error") or "; ".join(f"rank {row['rank']}: {row['error']}" for row in rows if "error" in row)
    extra["error"] = f"the launch failed: {detail or 'no rank reported'}; see {path / 'log.txt'}"
    return RunStatus.FAILED, extra


def _rank_runs(path: Path) -> dict[int, Run]:
    return {int(run.path.name): run for run in load_run(path).ranks}


def _rank_row(rank: int, run: Run) -> dict[str, Any]:
    merged = {**run.summary(), **run.meta, "rank": rank, "status": run.status}
    row = {k: merged.get(k) for k in RANK_KEYS}
    row.update(balance.rank_fields(run.metrics))
    if run.status != RunStatus.OK and run.error:
        row["error"] = run.error
    return row


def _own_failures(failures: dict[str, Any], ranks: dict[int, Run]) -> dict[str, Any]:
    """The agent's failure records less the ranks it ended itself: once a rank fails, torch 2.7+'s agent ends the
    ones still running with SIGTERM and reports them too (2.6 reported only the first). A rank it ended while
    another had failed waiting for it in a collective did not die by itself: it hung."""
    waited = any(run.status == RunStatus.FAILED and run.meta.get("collective") for run in ranks.values())
    return {r: f for r, f in failures.items()
            if not (waited and f.get("exitcode") == -signal.SIGTERM and int(r) in ranks
                    and ranks[int(r)].status == RunStatus.RUNNING)}


def _culprit(ranks: dict[int, Run], failures: dict[str, Any]) -> int | None:
    """The rank that ended the burst: one that failed by itself (not in a collective because a peer was gone),
    else one that died, else one still running while the others timed out waiting for it (it hung)."""
    own = [(run.meta.get("failed_at") or float("inf"), r) for r, run in ranks.items()
           if run.status == RunStatus.FAILED and not run.meta.get("collective")]
    if own:
        return min(own)[1]
    died = [(f.get("timestamp") or 0, int(r)) for r, f in failures.items()
            if int(r) in ranks and ranks[int(r)].status == RunStatus.RUNNING]
    if died:
        return min(died)[1]
    waited = [r for r, run in ranks.items() if run.status == RunStatus.FAILED]
    running = [(len(run.metrics), r) for r, run in ranks.items() if run.status == RunStatus.RUNNING]
    if waited and running:
        return min(running)[1]
    return min(waited) if waited else None


def _mark_culprit(rank: int, run: Run, failure: dict[str, Any] | None) -> None:
    if run.status != RunStatus.RUNNING:
        return
    step = len(run.metrics)
    if failure is not None:
        mark(run.path, RunStatus.CRASHED,
             error=f"rank {rank} died ({_signal_name(failure['exitcode'])}) during step {step}")
    else:
        mark(run.path, RunStatus.FAILED, error=f"rank {rank} hung in step {step}: the other ranks waited "
                                                 f"{COLLECTIVE_TIMEOUT_S:.0f} s for it in a collective")


def _signal_name(code: int) -> str:
    with contextlib.suppress(ValueError):
        return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"


# -- the agent process: `python -m ortlab.engine.launch SPEC_DIR`


def main(spec_dir: str) -> int:
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    folder = Path(spec_dir)
    spec = read_json(folder / "spec.json")
    cfg = BurstConfig.from_dict(spec["config"])
    # the ortlab process that started this agent is gone: SIGTERM ends the agent, and the agent its ranks
    on_parent_death(lambda: os.kill(os.getpid(), signal.SIGTERM), "ortlab-parent-watch")
    rdzv_configs: dict[str, Any] = {"timeout": RENDEZVOUS_TIMEOUT_S}
    if cfg.nnodes > 1:
        rdzv_configs["is_host"] = cfg.node_rank == 0  # the first machine holds the rendezvous store
    config = LaunchConfig(min_nodes=cfg.nnodes, max_nodes=cfg.nnodes, nproc_per_node=cfg.nproc,
                          run_id=spec["run_id"], rdzv_backend="c10d",
                          rdzv_endpoint=cfg.rdzv_endpoint or "localhost:0", rdzv_configs=rdzv_configs,
                          max_restarts=0, monitor_interval=0.5, start_method="spawn")
    result: dict[str, Any] = {}
    try:
        elastic_launch(config, sys.executable)("-m", "ortlab.engine.ranks", str(folder / "spec.json"))
        result["ok"] = True
    except ChildFailedError as e:
        result["failures"] = {str(r): {"exitcode": f.exitcode, "message": f.message, "timestamp": f.timestamp}
                              for r, f in e.failures.items()}
    except SignalException as e:
        result["signal"] = signal.Signals(e.sigval).name
    except Exception as e:  # the rendezvous timed out, the endpoint is unreachable, ...
        result["error"] = f"{type(e).__name__}: {e}"
    write_json(folder / "result.json", result)
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
