"""Faults and bad input against the CLI and the Python API: one line and exit 2 for bad input, nothing computed
lost, no run left "running", no process left behind (issue: nothing lost, nothing left behind)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ortlab import InputError, Options, Session, load_run
from ortlab.options import OptionError

FACTORIES = str(Path(__file__).parent / "factories" / "slow_steps.py")


def cli(*args, timeout=600, **kwargs):
    return subprocess.run([sys.executable, "-m", "ortlab.cli", *args], capture_output=True, text=True,
                          timeout=timeout, **kwargs)


def one_line_exit_2(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stdout[-1000:], r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def wait_for(condition, what: str, deadline_s: float = 300):
    """Poll until `condition()` holds; the deadline only guards against a hang, it is not a measurement."""
    end = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < end, f"gave up waiting for {what}"
        time.sleep(0.1)


def metrics_lines(folder: Path, backend: str) -> int:
    runs = sorted(folder.glob(f"*-{backend}/metrics.jsonl"))
    return len(runs[0].read_text().splitlines()) if runs else 0


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


# -- Bad: data lost, processes left behind, wrong answers


@pytest.mark.slow
@pytest.mark.interrupt
def test_a_killed_cli_takes_its_worker_with_it_and_the_run_says_why(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "ortlab.cli", "burst", "--model", f"{FACTORIES}:deaf_after",
                             "--model-arg", "step=2", "--backend", "pytorch", "--steps", "50", "--out", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: metrics_lines(tmp_path, "pytorch") >= 2, "two steps")  # then it is stuck and deaf to SIGINT
    run_dir = next(tmp_path.glob("*-pytorch"))
    worker = json.loads((run_dir / "meta.json").read_text())["pid"]
    assert worker != proc.pid and alive(worker)
    proc.kill()
    proc.wait()
    wait_for(lambda: not alive(worker), "the orphaned worker to end itself", 60)
    run = load_run(run_dir)
    assert run.status == "crashed"
    assert "the ortlab process that started this burst died" in run.error
    assert run.metrics["step"].tolist() == [0, 1]


@pytest.mark.slow
@pytest.mark.interrupt
def test_a_killed_cli_takes_the_agent_and_every_rank_of_a_distributed_burst_with_it(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "ortlab.cli", "burst", "--model", f"{FACTORIES}:slow",
                             "--backend", "pytorch", "--nproc", "2", "--steps", "200", "--out", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: metrics_lines(tmp_path, "pytorch") >= 2, "two steps")
    run_dir = next(tmp_path.glob("*-pytorch"))
    ranks = [json.loads((run_dir / "ranks" / str(r) / "meta.json").read_text())["pid"] for r in (0, 1)]
    agent = int(Path(f"/proc/{ranks[0]}/stat").read_text().split()[3])  # a rank's parent: the elastic agent
    assert agent != proc.pid and all(alive(pid) for pid in (agent, *ranks))
    proc.kill()
    proc.wait()
    wait_for(lambda: not any(alive(pid) for pid in (agent, *ranks)), "the agent and the ranks to end", 60)


@pytest.mark.slow
@pytest.mark.interrupt
@pytest.mark.ort
def test_ctrl_c_during_both_ends_the_whole_command_with_130(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "ortlab.cli", "burst", "--model", f"{FACTORIES}:slow",
                             "--backend", "both", "--steps", "200", "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: metrics_lines(tmp_path, "pytorch") >= 2, "two PyTorch steps")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (out, err)
    pytorch = load_run(next(tmp_path.glob("*-pytorch")))
    assert pytorch.status == "interrupted" and 2 <= len(pytorch.metrics) < 200
    assert not list(tmp_path.glob("*-ortmodule")), "the ORTModule half must not start after Ctrl-C"
    assert "interrupted" in err


@pytest.mark.parametrize("value", ["-1", "99999999999"])
@pytest.mark.parametrize("in_process", [False, True])
def test_bad_seed_is_refused_before_anything_starts(tmp_path, value, in_process):
    r = cli("burst", "--backend", "pytorch", "--steps", "1", "--seed", value, "--out", str(tmp_path),
            *(["--in-process"] if in_process else []))
    one_line_exit_2(r, "--seed")
    assert not [p for p in tmp_path.glob("*") if not p.name.startswith(".")]


def test_bad_seed_in_python_names_seed(tmp_path):
    with Session(out=tmp_path, in_process=True) as s, pytest.raises(InputError, match="seed -1 is not allowed"):
        s.burst("pytorch", 1, seed=-1, progress=False)
    assert not list(tmp_path.glob("*-pytorch"))


def _damaged_runs(tmp_path: Path) -> tuple[Path, Path]:
    """A folder with one good run and four damaged copies of it."""
    folder = tmp_path / "runs"
    with Session(out=folder, in_process=True) as s:
        good = s.burst("pytorch", 2, progress=False).path
    damage = {
        "bad-ort": lambda p: (p / "ort.json").write_text("{not json"),
        "meta-list": lambda p: (p / "meta.json").write_text("[1, 2]"),
        "meta-binary": lambda p: (p / "meta.json").write_bytes(b"\xff\xfe\x00garbage"),
        "no-loss": lambda p: (p / "metrics.jsonl").write_text('{"step": 0}\n'),
    }
    for name, hurt in damage.items():
        copy = folder / f"{good.name}-{name}"
        shutil.copytree(good, copy)
        hurt(copy)
    return folder, good


def test_one_broken_run_does_not_break_the_listing(tmp_path):
    folder, good = _damaged_runs(tmp_path)
    r = cli("runs", str(folder), "--json")
    assert r.returncode == 0, r.stderr
    rows = {row["run"]: row for row in json.loads(r.stdout)}
    assert rows[good.name]["status"] == "ok"
    for name in ("bad-ort", "meta-list", "meta-binary"):
        row = rows[f"{good.name}-{name}"]
        assert row["status"] == "unreadable" and row["error"], row
    assert "ort.json" in rows[f"{good.name}-bad-ort"]["error"]
    assert rows[f"{good.name}-no-loss"]["steps"] == 0  # the row without a loss is not a step
    r = cli("runs", str(folder))
    assert r.returncode == 0 and "unreadable" in r.stdout and "Traceback" not in r.stderr


@pytest.mark.slow
def test_a_full_disk_fails_the_run_naming_the_file_and_keeps_every_complete_step(tmp_path):
    # A file-size limit of 8 KB stands in for a full disk: metrics.jsonl reaches it first.
    script = f"ulimit -f 8; exec {sys.executable} -m ortlab.cli burst --backend pytorch --steps 500 --in-process " \
             f"--out {tmp_path}"
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stderr
    run = load_run(next(tmp_path.glob("*-pytorch")))
    assert run.status == "failed"
    assert "metrics.jsonl" in run.error and ("File too large" in run.error or "file-size limit" in run.error)
    assert "metrics.jsonl" in r.stderr
    lines = (run.path / "metrics.jsonl").read_text().splitlines()
    assert all(json.loads(line)["step"] == i for i, line in enumerate(lines))  # no half line
    assert len(run.metrics) == len(lines) > 10 and not run.damaged_lines


# -- Weak: unclear or unchecked


def test_out_naming_a_file_is_one_line_exit_2(tmp_path):
    target = tmp_path / "a-file"
    target.write_text("x")
    line = one_line_exit_2(cli("burst", "--backend", "pytorch", "--steps", "1", "--out", str(target)))
    assert "a-file" in line


def test_out_read_only_is_one_line_exit_2(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    one_line_exit_2(cli("burst", "--backend", "pytorch", "--steps", "1", "--out", str(ro / "runs")))


def test_options_unknown_area_is_one_line_exit_2():
    one_line_exit_2(cli("options", "--area", "nope"), "--area 'nope'", "areas:")


@pytest.mark.parametrize("flag,value", [("--lr", "inf"), ("--lr", "nan"), ("--lr", "-1"), ("--steps", "0")])
def test_unchecked_numbers_are_checked(tmp_path, flag, value):
    one_line_exit_2(cli("burst", "--backend", "pytorch", flag, value, "--out", str(tmp_path)), flag)


def test_a_loss_that_becomes_nan_is_written_as_valid_json(tmp_path):
    with Session(out=tmp_path, in_process=True) as s:
        run = s.burst("pytorch", 6, lr=1e12, progress=False)
    for line in (run.path / "metrics.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c} in metrics.jsonl"))
    if run.metrics["loss"].isna().any():
        assert "non-finite" in run.meta["warning"]


def test_options_from_one_string_and_from_a_number():
    assert Options("memory_opt_level=1")["memory_opt_level"] == 1
    with pytest.raises(OptionError, match="42 are not allowed"):
        Options(42)


def test_demo_refuses_impossible_sizes(tmp_path):
    line = one_line_exit_2(cli("burst", "--backend", "pytorch", "--steps", "1", "--model-arg", "n_layer=-1",
                               "--out", str(tmp_path), "--in-process"))
    assert "n_layer=-1" in line


def test_a_damaged_metrics_line_hides_no_later_step(tmp_path):
    with Session(out=tmp_path, in_process=True) as s:
        run = s.burst("pytorch", 4, progress=False)
    lines = (run.path / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1][:10]  # cut in the middle
    (run.path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    again = load_run(run.path)
    assert again.metrics["step"].tolist() == [0, 2, 3]
    assert again.damaged_lines == [2]
    assert again.summary()["damaged_metrics_lines"] == [2]


def test_runs_on_a_missing_folder_is_exit_2(tmp_path):
    one_line_exit_2(cli("runs", str(tmp_path / "nope")), "does not exist")


@pytest.mark.parametrize("in_process", [False, True])
def test_a_factory_that_calls_sys_exit_says_so(tmp_path, in_process):
    line = one_line_exit_2(cli("burst", "--backend", "pytorch", "--steps", "1", "--model", f"{FACTORIES}:exits",
                               "--out", str(tmp_path), *(["--in-process"] if in_process else [])))
    assert "sys.exit(3)" in line


RAISING = str(Path(__file__).parent / "factories" / "raising.py")


def test_a_factory_that_raises_shows_the_users_exception_the_same_in_both_modes(tmp_path):
    """The user's own exception in one line: its type, its message, the lines of the user's file it went through;
    the same words and exit code whether the factory ran in a worker or in this process; in a worker, the log it
    names holds the whole traceback, and it is the only worker log left."""
    lines = {}
    for mode in ("worker", "in-process"):
        out = tmp_path / mode
        r = cli("burst", "--backend", "pytorch", "--steps", "1", "--model", f"{RAISING}:make", "--out", str(out),
                *(["--in-process"] if mode == "in-process" else []))
        lines[mode] = one_line_exit_2(r, "model factory", "raised KeyError: 'width'", "raising.py:7 in layer",
                                      "raising.py:11 in make")
        assert "a bug in ortlab" not in lines[mode] and "internal error" not in lines[mode]
    logs = list((tmp_path / "worker").glob(".worker-*.log"))
    assert len(logs) == 1 and str(logs[0]) in lines["worker"], lines["worker"]
    text = logs[0].read_text()
    assert "Traceback (most recent call last)" in text and 'raising.py", line 7, in layer' in text
    assert "KeyError: 'width'" in text
    # the same sentence, up to where each mode says to look for the whole traceback
    assert lines["worker"].split("; the whole traceback")[0] == lines["in-process"].split("; the whole traceback")[0]


def test_a_factory_that_raises_in_python_raises_the_same_input_error(tmp_path):
    from ortlab.workload import FactoryError

    for in_process in (False, True):
        with Session(f"{RAISING}:make", out=tmp_path, in_process=in_process) as s, \
                pytest.raises(FactoryError, match=r"raised KeyError: 'width' at .*raising\.py:7 in layer") as e:
            s.burst("pytorch", 1, progress=False)
        assert "raising.py\", line 7, in layer" in e.value.traceback


def test_worker_logs_go_with_workers_that_end_cleanly(tmp_path):
    """A successful API call and a successful command leave no worker log behind (the worker ends with Python)."""
    out = repr(str(tmp_path))
    code = (f"import ortlab; r = ortlab.burst(backend='pytorch', steps=1, progress=False, out={out}); "
            f"assert r.ok; s = ortlab.Session(out={out}); assert s.burst('pytorch', 1, progress=False).ok")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    r = cli("burst", "--backend", "pytorch", "--steps", "1", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    wait_for(lambda: not list(tmp_path.glob(".worker-*.log")), "the workers to end and take their logs", 60)
    assert len([p for p in tmp_path.iterdir() if (p / "meta.json").is_file()]) == 3


@pytest.mark.slow
def test_concurrent_sessions_into_one_folder_keep_their_own_worker_logs_until_they_end(tmp_path):
    with Session(out=tmp_path) as a, Session(out=tmp_path) as b:
        a.burst("pytorch", 1, progress=False)
        b.burst("pytorch", 1, progress=False)
        logs = a._client.worker.log_path, b._client.worker.log_path
        assert logs[0] != logs[1] and all(log.is_file() for log in logs)
    assert not list(tmp_path.glob(".worker-*.log"))  # a worker that ended cleanly takes its log with it


@pytest.mark.slow
@pytest.mark.ort
def test_a_failed_burst_puts_error_and_hint_on_stderr(tmp_path):
    r = cli("burst", "--backend", "ortmodule", "--steps", "1", "--model-arg", "attention=mha", "--option",
            "fallback_policy=FALLBACK_DISABLE", "--out", str(tmp_path))
    assert r.returncode == 1
    assert "MultiheadAttention" in r.stderr and "symbolic shape inference" in r.stderr
    assert "Traceback" not in r.stderr
    assert "status" in r.stdout


def test_ortmodule_variables_in_the_shell_are_the_starting_options(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTMODULE_MEMORY_OPT_LEVEL", "1")
    with Session(out=tmp_path, in_process=True) as s:
        assert s.shell_options == Options(memory_opt_level=1)
        run = s.burst("pytorch", 1, progress=False)
        assert run.meta["config"]["options"] == {"memory_opt_level": 1}
        named = s.burst("pytorch", 1, {"memory_opt_level": 0}, progress=False)  # a named option wins
        assert named.meta["config"]["options"] == {}
    from ortlab.widgets.options_panel import OptionsPanel

    panel = OptionsPanel(cuda_available=False, start=Options.from_environ())
    assert panel.options == Options(memory_opt_level=1)


@pytest.mark.slow
def test_every_view_subcommand_over_damaged_runs_answers_without_a_traceback(tmp_path):
    """A folder of damaged runs through every subcommand that reads runs: each answers (0 or 1), or refuses in
    one line with exit 2 naming what is wrong; none prints a traceback."""
    folder, good = _damaged_runs(tmp_path)
    stage = folder / "zero-byte-stage" / "onnx"
    stage.mkdir(parents=True)
    (stage / "m_execution_model_training.onnx").write_bytes(b"")
    (folder / "truncated-stats").mkdir()
    (folder / "truncated-stats" / "stats.npz").write_bytes(b"PK\x03\x04 cut")
    damaged = sorted(p for p in folder.iterdir() if p != good)
    commands = [["runs", str(folder)]]
    for run in damaged:
        commands += [["graphs", str(run)], ["memory", str(run)], ["diff", str(good), str(run)]]
    commands.append(["merge", "--pt-dir", str(good), "--ort-dir", str(damaged[0]), "--output-dir",
                     str(tmp_path / "merged")])
    for args in commands:
        r = cli(*args, timeout=300)
        assert "Traceback" not in r.stderr + r.stdout, (args, r.stderr[-2000:])
        assert r.returncode in (0, 1, 2), (args, r.returncode, r.stderr[-1000:])
        if r.returncode == 2:
            assert len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)


def _stats_run(folder: Path, **model_kwargs) -> Path:
    with Session(model_kwargs=model_kwargs, out=folder, in_process=True) as s:
        return s.burst("pytorch", 2, collect={"stats": {}}, progress=False).path


def test_merge_refuses_an_output_folder_that_holds_its_inputs(tmp_path):
    run = _stats_run(tmp_path / "runs")
    for side in ("pt", "ort"):
        shutil.copytree(run, tmp_path / side)
    line = one_line_exit_2(cli("merge", "--pt-dir", str(tmp_path / "pt"), "--ort-dir", str(tmp_path / "ort"),
                               "--output-dir", str(tmp_path), "--overwrite"), "is or contains")
    assert "pt_dir" in line
    assert (tmp_path / "pt" / "stats.npz").is_file() and (tmp_path / "ort" / "stats.npz").is_file()
    assert run.is_dir()
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    one_line_exit_2(cli("merge", "--pt-dir", str(tmp_path / "pt"), "--ort-dir", str(tmp_path / "ort"),
                        "--output-dir", str(other), "--overwrite"), "more than an earlier merge")
    assert (other / "keep.txt").read_text() == "mine"


def test_diff_names_a_truncated_stats_file_and_different_models(tmp_path):
    a = _stats_run(tmp_path / "runs")
    cut = tmp_path / "cut"
    shutil.copytree(a, cut)
    data = (cut / "stats.npz").read_bytes()
    (cut / "stats.npz").write_bytes(data[: len(data) // 2])
    one_line_exit_2(cli("diff", str(a), str(cut)), "stats.npz")
    small = _stats_run(tmp_path / "runs", n_layer=1)
    one_line_exit_2(cli("diff", str(a), str(small)), "different models")


@pytest.mark.ort
def test_bisect_checks_its_candidates_before_any_burst(tmp_path):
    one_line_exit_2(cli("bisect", "--candidates", "nope", "--out", str(tmp_path)), "'nope'")
    assert not [p for p in tmp_path.glob("*") if not p.name.startswith(".")]


def test_graphs_of_one_stage_file_and_of_a_zero_byte_one(tmp_path):
    from ortlab.runs.stages import find_stage_files

    source = tmp_path / "onnx"
    source.mkdir()
    # a real stage file is not needed to show the 0-byte case: the name makes it a stage file
    (source / "m_execution_model_training.onnx").write_bytes(b"")
    assert find_stage_files(source)
    one_line_exit_2(cli("graphs", str(source)), "m_execution_model_training.onnx", "no graph")
    one_line_exit_2(cli("graphs", str(source / "m_execution_model_training.onnx")), "no graph")
    (tmp_path / "x.onnx").write_bytes(b"")
    one_line_exit_2(cli("graphs", str(tmp_path / "x.onnx")), "not an ORTModule stage file")


@pytest.mark.parametrize("where", ["write_state", "backend"])
def test_a_ctrl_c_at_either_end_of_a_burst_leaves_it_interrupted_never_running_nor_ok(tmp_path, monkeypatch, where):
    """Ctrl-C lands where the burst's own handler does not reach: while its end state is written (after the last
    step), or while the backend is made (the folder already says "running"). The run says interrupted either way."""
    import ortlab.engine.loop as loop
    from ortlab.runs import evidence

    def press(*args, **kwargs):
        raise KeyboardInterrupt

    if where == "write_state":
        monkeypatch.setattr(evidence, "write_state", press)
    else:
        monkeypatch.setattr(loop.Engine, "backend", press)
    with Session(out=tmp_path, in_process=True) as s:
        if where == "write_state":
            run = s.burst("pytorch", 2, progress=False)
            assert run.status == "interrupted" and "while the run's files were written" in run.error, run.error
        else:
            with pytest.raises(KeyboardInterrupt):
                s.burst("pytorch", 2, progress=False)
    metas = [json.loads(p.read_text()) for p in tmp_path.glob("*/meta.json")]
    assert [m["status"] for m in metas] == ["interrupted"], metas
