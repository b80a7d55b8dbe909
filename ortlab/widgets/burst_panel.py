"""Burst panel: run PyTorch and/or ORTModule bursts with a live loss curve; Stop really stops. With processes > 1
each burst runs as ranks (ortlab.engine.launch) and the plot shows every rank's curve."""

from __future__ import annotations

import html
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import ipywidgets as W

from ortlab.engine.backends import BACKENDS, has
from ortlab.engine.types import Optimizer, Precision
from ortlab.options import Options
from ortlab.widgets.images import figure_area

PLOT_INTERVAL_S = 0.5


def _table(df) -> str:
    if not len(df):
        return ""
    return df.to_html(index=False, float_format=lambda v: f"{v:.4g}", border=0, escape=True, na_rep="-")


def _rank_losses(folder: Path) -> dict[int, list[float]]:
    """Each rank's losses so far, from its metrics.jsonl (complete lines only)."""
    out = {}
    ranks = folder / "ranks"
    for p in sorted((p for p in ranks.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)) \
            if ranks.is_dir() else []:
        try:
            lines = (p / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
        except OSError:
            continue
        losses = []
        for line in lines:
            try:
                losses.append(json.loads(line)["loss"])
            except (ValueError, KeyError, TypeError):
                break
        out[int(p.name)] = losses
    return out


def _running_ranks_run(out: Path, backend: str) -> Path | None:
    """The folder of the distributed burst this process is running now (its launcher writes our pid)."""
    for meta in sorted(out.glob("*/meta.json"), reverse=True):
        try:
            m = json.loads(meta.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if m.get("pid") == os.getpid() and m.get("status") == "running" and m.get("backend") == backend \
                and "nproc" in m:
            return meta.parent
    return None


def _startup(run, summary: dict):
    """A run's start-up: ORT's init overhead when it exported, torch.compile's compile time, or why there is none."""
    if run.status == "fallback":
        return "fell back to PyTorch"
    if has(run.backend, "onnx_stages") and not run.ort.get("exported"):
        return "reused (no export)"
    return summary.get("startup_s")


def _process_label(run) -> str:
    """The process figure, named as what it is (the accounted columns beside it count activations only)."""
    return "peak CUDA allocated (MB)" if run.meta.get("device") == "cuda" else "peak resident set (MB)"


class BurstPanel(W.VBox):
    """Thin over Session.burst: a background thread runs the bursts so the kernel stays responsive and Stop
    works; each step updates the progress bar and the loss curve."""

    def __init__(self, session, options: Callable[[], Options], on_done: Callable[[list], None] | None = None):
        self.session = session
        self.get_options = options
        self.on_done = on_done
        self.backend = W.ToggleButtons(options=[*((r.label, r.name) for r in BACKENDS.values()), ("both", "both"),
                                                ("all", "all")],
                                       value="both", description="backend",
                                       tooltip="both: PyTorch and ORTModule; all: and torch.compile (its first "
                                       "step compiles: tens of seconds)")
        self.steps = W.BoundedIntText(value=20, min=1, max=100_000, description="steps")
        self.seed = W.IntText(value=0, description="seed")
        self.parity = W.Checkbox(value=True, description="parity mode",
                                 tooltip="same seeds, dropout 0, compute optimizer off, deterministic")
        self.optimizer = W.Dropdown(options=[str(o) for o in Optimizer if o is not Optimizer.ZERO1],  # zero1: ranks
                                    value=Optimizer.AUTO.value, description="optimizer")
        self.precision = W.Dropdown(options=[str(p) for p in Precision], value=Precision.FP32.value,
                                    description="precision")
        self.nproc = W.BoundedIntText(value=1, min=1, max=64, description="processes",
                                      tooltip="more than 1: each burst runs as that many ranks (DDP, gloo on the "
                                      "CPU, one GPU per rank on CUDA); the plot shows every rank")
        self.record_stats = W.Checkbox(value=False, description="record activation statistics",
                                       tooltip="per-step statistics of every module's activations and gradients: "
                                       "the Activations tab compares the two backends")
        self.save_graphs = W.Checkbox(value=False, description="save exported graphs",
                                      tooltip="ORTModule's stage graphs into the run (save_onnx): the Graphs tab")
        self.account_memory = W.Checkbox(value=True, description="account activation memory",
                                         tooltip="what autograd saves for backward (PyTorch) and ORT's execution "
                                         "graph step by step (ORTModule; saves its graphs): the Memory tab")
        self.profile_time = W.Checkbox(value=False, description="profile where the time goes",
                                       tooltip="steps 2-4 profiled (ORT's profiler, torch.profiler): forward, "
                                       "backward, optimizer, modules, operators, ORT nodes: the Time tab")
        from ortlab.compat.registry import FIXES

        choices = [("none", "none"), ("auto: what Check finds", "auto"), *((n, n) for n in FIXES)]
        self.fixes = W.Dropdown(options=choices, value="none", description="fixes",
                                tooltip="ortlab's compatibility fixes for the ORTModule burst (the PyTorch burst "
                                "runs the model as written)")
        self.run_button = W.Button(description="Run", button_style="primary", icon="play")
        self.check_button = W.Button(description="Check", icon="stethoscope",
                                     tooltip="will the model train on ORTModule: every blocker with its source line "
                                     "and the fixes that remove it, then one ORTModule training step")
        self.check_result = W.HTML()
        self.stop_button = W.Button(description="Stop", button_style="danger", icon="stop", disabled=True)
        self.progress = W.IntProgress(value=0, min=0, max=1, description="", layout=W.Layout(width="400px"))
        self.status = W.HTML()
        self.plot = W.Image(format="png", layout=W.Layout(width="600px", display="none"))  # shown from the first step
        self.results = W.HTML()
        self.distances = figure_area("700px")  # the verdict's evidence: each backend's distance to float64
        self.transitions = W.HTML()
        self.run_button.on_click(lambda _: self.run())
        self.check_button.on_click(lambda _: self.check())
        self.stop_button.on_click(lambda _: self.stop())
        self._thread: threading.Thread | None = None
        self._curves: dict[str, list[float]] = {}
        self.last_runs: list = []
        self.last_check = None  # the CheckReport of the last Check
        self.last_verdicts: dict = {}  # backend -> the Verdict on its last burst against the PyTorch one
        super().__init__([
            self.backend, W.HBox([self.steps, self.seed, self.parity]),
            W.HBox([self.optimizer, self.precision, self.nproc]),
            W.HBox([self.record_stats, self.save_graphs, self.account_memory, self.profile_time]),
            W.HBox([self.fixes, self.check_button]),
            self.check_result, W.HBox([self.run_button, self.stop_button, self.progress]), self.status,
            self.plot, self.distances, W.HTML("<b>Results</b>"), self.results,
            W.HTML("<b>Why ORTModule exported (transitions)</b>"), self.transitions])

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def run(self, wait: bool = False) -> None:
        if self.running:
            return
        backends = {"both": ["pytorch", "ortmodule"], "all": list(BACKENDS)}.get(self.backend.value,
                                                                                 [self.backend.value])
        self._curves = {b: [] for b in backends}
        self._rank_runs: dict[str, Path | None] = {}
        self._drawn = 0.0
        self.progress.max, self.progress.value = self.steps.value * len(backends), 0
        self.run_button.disabled, self.check_button.disabled, self.stop_button.disabled = True, True, False
        self.status.value = "starting (the first burst starts a worker process and exports the model)..."
        self._thread = threading.Thread(target=self._work, args=(backends,), daemon=True)
        self._thread.start()
        if wait:
            self.wait()

    def check(self, wait: bool = False) -> None:
        """Session.check on a background thread: the blockers as a table, the verdict in words."""
        if self.running:
            return
        self.run_button.disabled = self.check_button.disabled = True
        self.check_result.value = "<i>checking (export, every operator on ORT, one ORTModule step)...</i>"
        self._thread = threading.Thread(target=self._check_work, daemon=True)
        self._thread.start()
        if wait:
            self.wait()

    def _check_work(self) -> None:
        try:
            report = self.session.check("auto", self.get_options())
            self.last_check = report
            color = {"ok": "#080", "fixed": "#d35400"}.get(report.status, "#c00")
            table = report.table()
            shown = table.drop(columns=["types"]) if len(table) else table
            self.check_result.value = (f"<b style='color:{color}'>{html.escape(report.verdict)}</b>"
                                       + (_table(shown) if len(shown) else ""))
            if report.status == "fixed" and self.fixes.value == "none":
                self.fixes.value = "auto"
        except Exception as e:  # shown in the panel, never printed over the notebook
            first_line = f"{type(e).__name__}: {e}".splitlines()[0]
            self.check_result.value = f"<span style='color:#c00'>{html.escape(first_line)}</span>"
        finally:
            self.run_button.disabled = self.check_button.disabled = False

    def wait(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def stop(self) -> None:
        self.status.value = "stopping..."
        self.session.stop()

    def _work(self, backends: list[str]) -> None:
        runs = []
        try:
            options = self.get_options()
            if self.save_graphs.value:
                options = options.replace(save_onnx=True)
            collect = {name: {} for name, on in (("stats", self.record_stats.value),
                                                 ("memory", self.account_memory.value),
                                                 ("time", self.profile_time.value)) if on} or None
            for backend in backends:
                self.status.value = f"running {backend}..."
                run = self.session.burst(
                    backend, self.steps.value, options, seed=self.seed.value, parity=self.parity.value,
                    optimizer=self.optimizer.value, precision=self.precision.value, progress=False, collect=collect,
                    nproc=self.nproc.value, fixes=self.fixes.value,
                    on_step=lambda row, b=backend: self._step(b, row))
                runs.append(run)
                if run.ranks:  # the final curves: every rank's whole run
                    self._set_rank_curves(backend, {int(r.path.name): r.losses for r in run.ranks})
                if run.status not in ("ok", "fallback"):
                    break
            self.last_verdicts = {}
            if len(runs) > 1 and has(runs[0].backend, "reference"):  # each other backend judged against PyTorch
                self.status.value = self._summary(runs) + "<br><i>judging: first-step gradients, float64...</i>"
                self.last_verdicts = {r.backend: self.session.judge(runs[0], r) for r in runs[1:]
                                      if r.status not in ("interrupted", "stopped")}
            self.status.value = self._summary(runs, self.last_verdicts)
            self._show_distances()
            if self.last_verdicts:
                from ortlab.recommend import recommend

                line = recommend({r.backend: r.summary() for r in runs},
                                 {b: v.status for b, v in self.last_verdicts.items()}).line
                self.status.value += f"<br><b>{html.escape(line)}</b>"
        except Exception as e:  # shown in the panel, never printed over the notebook
            first_line = f"{type(e).__name__}: {e}".splitlines()[0]
            self.status.value = f"<span style='color:#c00'>{html.escape(first_line)}</span>"
        finally:
            if any(self._curves.values()):  # the steps after the last throttled draw (a stopped burst)
                from ortlab.plots import figure_png, loss_figure

                self.plot.value = figure_png(loss_figure(self._curves))
                self.plot.layout.display = None
            self.last_runs = runs
            self._show_results(runs)
            self.run_button.disabled, self.check_button.disabled, self.stop_button.disabled = False, False, True
            if self.on_done:
                self.on_done(runs)

    def _step(self, backend: str, row: dict) -> None:
        from ortlab.plots import figure_png, loss_figure

        if backend in self._curves:
            self._curves[backend].append(row["loss"])
        self.progress.value += 1
        # drawing takes ~50 ms: at most twice a second (in-process bursts call this from their training loop);
        # the final curve is drawn when the bursts end
        now = time.monotonic()
        if now - self._drawn >= PLOT_INTERVAL_S:
            if self.nproc.value > 1:  # the step rows are rank 0's: the other ranks' from their folders
                if self._rank_runs.get(backend) is None:
                    self._rank_runs[backend] = _running_ranks_run(Path(self.session.out).expanduser(), backend)
                if self._rank_runs[backend] is not None:
                    self._set_rank_curves(backend, _rank_losses(self._rank_runs[backend]))
            self.plot.value = figure_png(loss_figure(self._curves))
            self.plot.layout.display = None
            self._drawn = now

    def _set_rank_curves(self, backend: str, losses: dict[int, list[float]]) -> None:
        """One curve per rank ("pytorch rank 1"), in place of the backend's single curve, order kept."""
        curves = {}
        for label, values in self._curves.items():
            if label == backend or label.startswith(f"{backend} rank "):
                curves.update({f"{backend} rank {r}": v for r, v in losses.items()} if losses else {label: values})
            else:
                curves[label] = values
        self._curves = curves

    def _show_distances(self) -> None:
        """The last verdict's gradients against float64, per parameter (nothing when they were not judged so)."""
        from ortlab.plots import figure_png
        from ortlab.verdict.figures import distances_figure
        from ortlab.verdict.judge import LABELS

        figures = [distances_figure(v, LABELS.get(b, b)) for b, v in self.last_verdicts.items()]
        figure = next((f for f in figures if f is not None), None)
        self.distances.value = figure_png(figure) if figure is not None else b""

    @property
    def last_verdict(self):
        """The verdict on the last ORTModule burst against the PyTorch one before it (None without both)."""
        return self.last_verdicts.get("ortmodule")

    @staticmethod
    def _summary(runs, verdicts=None) -> str:
        parts = []
        for run in runs:
            text = f"{run.backend}: {run.status}"
            if run.error:
                text += f" ({run.error}; full log in the Log tab)"
            color = {"ok": "#080", "fallback": "#d35400"}.get(run.status, "#c00")
            parts.append(f"<span style='color:{color}'>{html.escape(text)}</span>")
        for backend, verdict in (verdicts or {}).items():  # each against PyTorch: green only when they agree
            color = {"agree": "#080", "diverged": "#c00"}.get(verdict.status, "#666")
            lines = verdict.lines()
            parts.append(f"<b style='color:{color}'>{backend} verdict: {html.escape(lines[0])}</b>"
                         + "".join(f"<br>&nbsp;&nbsp;{html.escape(line.strip())}" for line in lines[1:]))
        return "<br>".join(parts)

    def _show_results(self, runs) -> None:
        import pandas as pd

        rows = []
        for run in runs:
            s = run.summary()
            rows.append({"backend": run.backend, "status": run.status, "fixes": ", ".join(s.get("fixes") or []) or "-",
                         "steps": s.get("steps"),
                         "final loss": s.get("final_loss"),
                         "median step (ms)": None if run.status == "fallback" else (s.get("median_step_s") or 0) * 1000,
                         _process_label(run): s.get("peak_mem_mb"),
                         "kept for backward (MB)": s.get("saved_for_backward_mb"),
                         "activation peak (MB)": s.get("activation_peak_mb"),
                         "start-up (s)": _startup(run, s),
                         **({"graph breaks": s.get("graph_breaks"), "recompiles": s.get("recompiles")}
                            if "graph_breaks" in s else {}),
                         **({"ranks": len(s["ranks"]), "in sync": s.get("in_sync"),
                             "same graphs on all ranks": (s.get("rank_graphs") or {}).get("identical", "-")}
                            if s.get("ranks") else {})})
        self.results.value = _table(pd.DataFrame(rows))
        transitions = self.session.transitions
        shown = transitions[["run", "action", "reason", "ort_exported"]] if len(transitions) else transitions
        self.transitions.value = _table(shown)

    def __repr__(self) -> str:
        return (f"BurstPanel(backend={self.backend.value!r}, steps={self.steps.value}, parity={self.parity.value}, "
                f"running={self.running})")
