"""Burst panel: run PyTorch and/or ORTModule bursts with a live loss curve; Stop really stops. With processes > 1
each burst runs as ranks (ortlab.engine.launch) and the plot shows every rank's curve."""

from __future__ import annotations

import html
import time
from collections.abc import Callable
from pathlib import Path

import ipywidgets as W

from ortlab.comparison import drift
from ortlab.engine.backends import BACKENDS, aliased, default_backends, has, unavailable
from ortlab.engine.progress import Pace
from ortlab.engine.types import Optimizer, Precision, Strategy
from ortlab.options import Options
from ortlab.runs import facts, files
from ortlab.runs.groups import users
from ortlab.runs.run import RunStatus
from ortlab.stacks.table import this_stack
from ortlab.widgets.background import Background, error_html
from ortlab.widgets.export import SaveButton
from ortlab.widgets.images import figure_area
from ortlab.widgets.layout import STOPPED, checkbox, flexible, row, status_color, stop_button, table
from ortlab.widgets.stack_choices import elsewhere_choices, stack_choices

PLOT_INTERVAL_S = 0.5
# the step shown and its pace, at most this often: each widget update costs tens of ms on a loaded machine, and a
# display updated for every step fell behind the worker (a Stop clicked at "step 30" ended it at 110, the line then
# replaying 80 steps); the rows are all kept, the display shows the newest (a timer shows the last one)
SHOW_INTERVAL_S = 0.2
GREYED = "<div style='opacity:0.45'><i>the previous burst's, until this one ends</i>{}</div>"
SAVE_GRAPHS = "save exported graphs"  # the checkbox's label: other tabs name it where they need graphs


def first_step(backend: str, seconds: float) -> str:
    """What a burst does before its first step ends, and for how long so far: ORTModule exports, torch.compile
    compiles (tens of seconds on a CPU), PyTorch just runs."""
    from ortlab.engine.progress import duration

    name = BACKENDS[backend].label if backend in BACKENDS else backend
    if has(backend, "reference"):
        doing = f"running {name}"
    elif has(backend, "onnx_stages"):
        doing = f"exporting to ONNX ({name}'s first step)"
    else:
        doing = f"compiling ({name}'s first step)"
    return f"{doing} ... {duration(seconds)}"


class BurstPanel(Background, W.VBox):
    """Thin over Session.burst: a background thread runs the bursts so the kernel stays responsive and Stop
    works; each step updates the progress bar and the loss curve."""

    def __init__(self, session, options: Callable[[], Options], on_done: Callable[[list], None] | None = None):
        self.session = session
        self.get_options = options
        self.on_done = on_done
        # what runs here (ORTModule only on the ort stack): "both" is the comparison a user gets when not asked
        runnable = [r for r in BACKENDS.values() if unavailable(r.name) is None]
        self.choices = {"both": list(default_backends()), "all": [r.name for r in runnable]}
        both = " and ".join(BACKENDS[b].label for b in self.choices["both"])
        others = [r.label for r in runnable if r.name not in self.choices["both"]]
        # "both" means PyTorch and ORTModule (the registry's ALIASES, the CLI's --backend both); where the default
        # pair is another one (the current stack: torch.compile), its button says which
        pair = "both" if tuple(self.choices["both"]) == aliased("both") else " + ".join(
            BACKENDS[b].label for b in self.choices["both"])
        elsewhere = elsewhere_choices()  # e.g. on the current stack, PyTorch + ORTModule in the ort stack's worker
        self.choices.update(elsewhere)
        across = [(" + ".join(BACKENDS[b].label for b in v) + f" ({k.split('@')[1]} stack)", k)
                  for k, v in elsewhere.items()]
        self.backend = W.ToggleButtons(options=[*((r.label, r.name) for r in runnable), (pair, "both"),
                                                *([("all", "all")] if others else []), *across],
                                       value="both", description="backend", style={"button_width": "auto"},
                                       tooltip=f"{pair}: {both}" + (f"; all: and {', '.join(others)} (torch.compile's "
                                       "first step compiles: tens of seconds)" if others else ""),
                                       layout=W.Layout(max_width="100%"))
        # each backend's stack, where another stack's environment exists or can be built (ortlab.comparison.cross_stack)
        self.stacks = {b: W.Dropdown(options=choices, value=str(this_stack()), description=f"{BACKENDS[b].label} on",
                                     tooltip="another stack runs this backend in a worker of its own Python and "
                                     "torch, from the same snapshot, judged against PyTorch from the run folders",
                                     style={"description_width": "auto"}, layout=W.Layout(width="300px"))
                       for b, choices in stack_choices([r.name for r in runnable]).items()}
        small = {"layout": W.Layout(width="170px")}
        self.steps = W.BoundedIntText(value=20, min=1, max=100_000, description="steps", **small)
        self.seed = W.IntText(value=0, description="seed", **small)
        self.threads = W.Dropdown(options=[("torch's", 0), ("1: CPU time", 1)], value=0, description="threads",
                                  tooltip="the CPU threads a step runs on: 1 times each step by its thread's CPU "
                                  "time, which other processes do not count (ignored on CUDA)", **small)
        self.parity = checkbox("parity mode", True, "same seeds, dropout 0, compute optimizer off, deterministic")
        self.optimizer = flexible(W.Dropdown(options=[str(o) for o in Optimizer if o is not Optimizer.ZERO1],
                                             value=Optimizer.AUTO.value, description="optimizer"), "220px", "300px")
        self.precision = flexible(W.Dropdown(options=[str(p) for p in Precision], value=Precision.FP32.value,
                                             description="precision"), "200px", "300px")  # the engine's choices
        self.nproc = W.BoundedIntText(value=1, min=1, max=64, description="processes",
                                      tooltip="more than 1: each burst runs as that many ranks (DDP, gloo on the "
                                      "CPU, one GPU per rank on CUDA); the plot shows every rank", **small)
        # how the ranks share the model (docs/distributed.md); a parity burst of ranks is judged against one process
        self.strategy = flexible(W.Dropdown(options=[str(s) for s in Strategy if s is not Strategy.SINGLE],
                                            value=Strategy.DDP.value, description="strategy", disabled=True,
                                            tooltip="with more than 1 process: ddp, zero1 (AdamW's state sharded) "
                                            "or fsdp2 (fully_shard per block; not ORTModule)"), "200px", "280px")
        self.nproc.observe(lambda change: setattr(self.strategy, "disabled", change["new"] < 2), "value")
        self.record_stats = checkbox("record activation statistics", False, "per-step statistics of every module's "
                                     "activations and gradients: the Activations tab compares the two backends")
        self.save_graphs = checkbox(SAVE_GRAPHS, False, "ORTModule's stage graphs into the run "
                                    "(save_onnx): the Graphs tab")
        self.account_memory = checkbox("account activation memory", True, "what autograd saves for backward "
                                       "(PyTorch) and ORT's execution graph step by step (ORTModule; saves its "
                                       "graphs): the Memory tab")
        self.profile_time = checkbox("profile where the time goes", False, "steps 2-4 profiled (ORT's profiler, "
                                     "torch.profiler): forward, backward, optimizer, modules, operators, ORT nodes: "
                                     "the Time tab")
        self.overlay = checkbox("overlay earlier runs", False, "the loss curves of this session's earlier bursts in "
                                "the plot, each named by what sets it apart")
        from ortlab.compat.registry import FIXES

        choices = [("none", "none"), ("auto: what Check finds", "auto"), *((n, n) for n in FIXES)]
        self.fixes = flexible(W.Dropdown(options=choices, value="none", description="fixes",
                                         tooltip="ortlab's compatibility fixes for the ORTModule burst (the PyTorch "
                                         "burst runs the model as written)"), "260px", "360px")
        self.run_button = W.Button(description="Run", button_style="primary", icon="play")
        self.check_button = W.Button(description="Check", icon="stethoscope",
                                     tooltip="will the model train on ORTModule: every blocker with its source line "
                                     "and the fixes that remove it, then one ORTModule training step")
        self.check_result = W.HTML()
        self.stop_button = stop_button("end the burst after the step it is in; what ran is kept")
        self.progress = W.IntProgress(value=0, min=0, max=1, description="",
                                      layout=W.Layout(width="260px", max_width="100%"))
        self.pace = W.HTML()  # "pytorch: step 330/6000 · 12 s · ~40 s left"
        self.status = W.HTML()
        self.plot = figure_area("600px")  # shown from the first step
        self.results = W.HTML()
        self.results_frame = None  # the results table shown (a DataFrame: what "save CSV" writes)
        self.distances = figure_area("700px")  # the verdict's evidence: each backend's distance to float64
        self.transitions = W.HTML()
        out = lambda: self.session.out  # noqa: E731
        self.save_plot = SaveButton("loss curve", lambda: self.plot.value, out)
        self.save_results = SaveButton("burst results", lambda: self.results_frame, out, kind="CSV")
        self.run_button.on_click(lambda _: self.run())
        self.check_button.on_click(lambda _: self.check())
        self.stop_button.on_click(lambda _: self.stop())
        self._curves: dict[str, list[float]] = {}
        self._earlier: dict[str, list[float]] = {}  # earlier runs' curves, overlaid when asked
        self._pace: Pace | None = None
        self._seen, self._shown, self._drawn, self._show_later = 0, 0.0, 0.0, None  # steps reported; when shown
        self._after_first: str | None = None  # the status once a backend's first step ended (None: keep it)
        self.last_runs: list = []
        self.last_check = None  # the CheckReport of the last Check
        self.last_verdicts: dict = {}  # backend -> the Verdict on its last burst against the PyTorch one
        super().__init__([
            self.backend, row(*self.stacks.values()), row(self.steps, self.seed, self.threads, self.parity),
            row(self.optimizer, self.precision, self.nproc, self.strategy),
            row(self.record_stats, self.save_graphs, self.account_memory, self.profile_time),
            row(self.fixes, self.check_button),
            self.check_result, row(self.run_button, self.stop_button, self.progress, self.pace), self.status,
            self.plot, row(self.overlay, self.save_plot), self.distances,
            row(W.HTML("<b>Results</b>"), self.save_results), self.results,
            W.HTML("<b>Why ORTModule exported (transitions)</b>"), self.transitions])

    def run(self, wait: bool = False) -> None:
        if self.running:
            return
        backends = self.choices.get(self.backend.value, [self.backend.value])
        self._curves = {b: [] for b in backends}
        self._earlier = self._earlier_curves() if self.overlay.value else {}
        self._rank_runs: dict[str, Path | None] = {}
        self._drawn, self._seen = 0.0, 0
        self._pace = None
        self.progress.max, self.progress.value = self.steps.value * len(backends), 0
        self.run_button.disabled, self.check_button.disabled, self.stop_button.disabled = True, True, False
        # what the last burst showed stays readable, greyed, until this one replaces it
        self.results.value = GREYED.format(self.results.value) if self.results.value else ""
        self.transitions.value = GREYED.format(self.transitions.value) if self.transitions.value else ""
        self.distances.value, self.plot.value, self.pace.value = b"", b"", ""
        self.last_verdicts = {}
        self.status.value = "starting (the first burst starts a worker process and exports the model)..."
        self._in_background(self._work, backends, wait=wait)

    def check(self, wait: bool = False) -> None:
        """Session.check on a background thread: the blockers as a table, the verdict in words."""
        if self.running:
            return
        self.run_button.disabled = self.check_button.disabled = True
        self.check_result.value = "<i>checking (export, every operator on ORT, one ORTModule step)...</i>"
        self._in_background(self._check_work, wait=wait)

    def _check_work(self) -> None:
        try:
            report = self.session.check("auto", self.get_options())
            self.last_check = report
            color = {"ok": "#080", "fixed": "#d35400"}.get(report.status, "#c00")
            found = report.table()
            shown = found.drop(columns=["types"]) if len(found) else found
            self.check_result.value = f"<b style='color:{color}'>{html.escape(report.verdict)}</b>" + table(shown)
            if report.status == "fixed" and self.fixes.value == "none":
                self.fixes.value = "auto"
        except Exception as e:  # shown in the panel, never printed over the notebook
            self.check_result.value = error_html(e)
        finally:
            self.run_button.disabled = self.check_button.disabled = False

    def stop(self) -> None:
        self.status.value = "<span style='color:#666'>stopping after the step in progress...</span>"
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
            placed = self._placed(backends)
            if placed is not None:  # a backend on another stack: the comparison across stacks
                runs = self._across(placed, options, collect)
                return
            settings = dict(seed=self.seed.value, parity=self.parity.value, optimizer=self.optimizer.value,
                            precision=self.precision.value, progress=False, collect=collect, nproc=self.nproc.value,
                            strategy=self.strategy.value if self.nproc.value > 1 else None, fixes=self.fixes.value,
                            threads=self.threads.value or None)
            for i, backend in enumerate(backends):
                then = f" (then {', '.join(backends[i + 1:])})" if i + 1 < len(backends) else ""
                self._pace = Pace(self.steps.value, backend)
                self._until_first_step(backend, then)
                run = self.session.burst(backend, self.steps.value, options, **settings,
                                         on_step=lambda row, b=backend: self._step(b, row))
                runs.append(run)
                if run.ranks:  # the final curves: every rank's whole run
                    self._set_rank_curves(backend, {int(r.path.name): r.losses for r in run.ranks})
                if run.status not in (RunStatus.OK, RunStatus.FALLBACK) or self.session.stop_asked:
                    break
            self.last_verdicts = {}
            timing = f"{self._summary(runs)}<br><i>{drift.SAYS}...</i>"
            drift.after(self.session, {r.backend: r for r in runs}, self.steps.value, options, settings,
                        stopped=self.session.stop_asked,  # on the CPU: PyTorch timed again (the machine drifts)
                        announce=lambda: setattr(self.status, "value", timing))
            if len(runs) > 1 and has(runs[0].backend, "reference"):  # each other backend judged against PyTorch
                self.status.value = self._summary(runs) + "<br><i>judging: first-step gradients, float64...</i>"
                self.last_verdicts = {r.backend: self.session.judge(runs[0], r) for r in runs[1:]
                                      if r.status not in STOPPED}
            self.status.value = self._summary(runs, self.last_verdicts)
            self._show_distances()
            if self.last_verdicts and all(r.status == RunStatus.OK for r in runs):
                from ortlab.comparison.recommend import recommend_runs

                earlier = [r for r in users(self.session.runs) if r not in runs]
                line = recommend_runs(runs, {b: v.status for b, v in self.last_verdicts.items()}, earlier).line
                self.status.value += f"<br><b>{html.escape(line)}</b>"
        except Exception as e:  # shown in the panel, never printed over the notebook
            self.status.value = error_html(e)
        finally:
            self.progress.value = self._seen  # every step the worker reported
            if self._pace is not None:  # how it ended, not an estimate of a time left that will not come
                stopped = any(r.status in STOPPED for r in runs)
                self._pace.end("stopped" if stopped else "finished" if runs and all(r.ok for r in runs) else "ended")
                self.pace.value = f"<span style='color:#444'>{html.escape(self._pace.line())}</span>"
            if self._earlier and runs:  # named against the new runs too ("steps 20" beside this burst's 50)
                self._earlier = self._earlier_curves(runs)
            if any(self._curves.values()):  # the steps after the last throttled draw (a stopped burst)
                self._draw()
            self.last_runs = runs
            self._show_results(runs)
            self.run_button.disabled, self.check_button.disabled, self.stop_button.disabled = False, False, True
            if self.on_done:
                self.on_done(runs)

    def _placed(self, backends: list[str]):
        """The backends placed on the stacks chosen, when one runs on another stack than this process's (None:
        every burst in this session's worker)."""
        from ortlab.comparison.cross_stack import crosses, parse_placed

        if len(backends) < 2:  # one burst: the session's
            return None
        placed = parse_placed([f"{b}@{self.stacks[b].value}" if b in self.stacks else b for b in backends])
        return placed if crosses(placed) else None

    def _across(self, placed, options, collect) -> list:
        """The comparison across stacks (ortlab.comparison.cross_stack.compare): runs, verdicts and recommendation
        shown as a comparison in one process shows them; its runs join the session's."""
        from ortlab.comparison.cross_stack import compare

        self.status.value = html.escape("running " + ", ".join(map(str, placed)) + " (each on its stack's worker; "
                                        "then judged from the run folders)...")
        self._pace, self._after_first = Pace(self.steps.value, str(placed[0])), None
        comparison = compare(self.session.ref, {}, placed, self.steps.value, options, out=self.session.out,
                             model_seed=self.session.seed, snapshot=self.session.snapshot, seed=self.seed.value,
                             optimizer=self.optimizer.value, precision=self.precision.value, progress=False,
                             collect=collect, fixes=self.fixes.value, parity=self.parity.value, on_step=self._step,
                             threads=self.threads.value or None)
        runs = comparison.runs
        self.session.runs.extend(runs)
        self.last_verdicts = {b: v for b in comparison.others if (v := comparison.verdict_of(b)) is not None}
        self.status.value = self._summary(runs, self.last_verdicts)
        self._show_distances()
        self.status.value += f"<br><b>{html.escape(comparison.recommendation().line)}</b>"
        return runs

    def _until_first_step(self, backend: str, then: str) -> None:
        """Until the backend's first step ends, the status says what that step does and for how long so far
        (torch.compile's first step compiles for tens of seconds), once a second."""
        import threading

        pace, started = self._pace, time.monotonic()

        self._after_first = html.escape(f"running {backend}{then}...")  # the status once that step ended

        def tick() -> None:
            while self._pace is pace and pace is not None and pace.done == 0 and pace.ended is None:
                text = html.escape(first_step(backend, time.monotonic() - started) + then)
                if pace.done == 0:
                    self.status.value = text
                time.sleep(1.0)

        threading.Thread(target=tick, name=f"ortlab-first-step-{backend}", daemon=True).start()

    def _step(self, backend: str, row: dict) -> None:
        if backend in self._curves:
            self._curves[backend].append(row["loss"])
        self._seen += 1
        if self._pace is not None:
            self._pace.step(row)
            if self._pace.done == 1 and self._after_first is not None:
                self.status.value = self._after_first
        if time.monotonic() - self._shown >= SHOW_INTERVAL_S:
            self._show_step()
        elif self._show_later is None:  # the newest step is shown once the interval is over, even if none follows
            import threading

            self._show_later = threading.Timer(SHOW_INTERVAL_S, self._show_step)
            self._show_later.daemon = True
            self._show_later.start()
        # drawing takes ~50 ms: at most twice a second (in-process bursts call this from their training loop);
        # the final curve is drawn when the bursts end
        now = time.monotonic()
        if now - self._drawn >= PLOT_INTERVAL_S:
            if self.nproc.value > 1:  # the step rows are rank 0's: the other ranks' from their folders
                if self._rank_runs.get(backend) is None:
                    self._rank_runs[backend] = files.running_distributed(Path(self.session.out).expanduser(), backend)
                if self._rank_runs[backend] is not None:
                    self._set_rank_curves(backend, files.rank_losses(self._rank_runs[backend]))
            self._draw()
            self._drawn = now

    def _show_step(self) -> None:
        """The progress bar and the pace line at the newest step the worker reported."""
        self._shown, self._show_later = time.monotonic(), None
        self.progress.value = self._seen
        if self._pace is not None:
            self.pace.value = f"<span style='color:#444'>{html.escape(self._pace.line())}</span>"

    def _draw(self) -> None:
        """The loss curves that have steps (a backend a Stop kept from running has no curve, nor a legend entry),
        over the earlier runs' when overlaid."""
        from ortlab.common.plots import figure_png, loss_figure

        curves = {label: values for label, values in self._curves.items() if values}
        if curves:
            self.plot.value = figure_png(loss_figure(curves, earlier=self._earlier))

    def _earlier_curves(self, new: list | tuple = ()) -> dict[str, list[float]]:
        """This session's earlier bursts' losses (the user's last 6 before `new`), each named by what sets it apart from
        the others and from the `new` runs once they exist (ortlab.reporting.labels)."""
        from ortlab.reporting.labels import labels

        runs = [r for r in users(self.session.runs) if len(r.metrics) and not r.ranks and r not in new][-6:]
        named = labels([*runs, *new])[:len(runs)]
        return {f"earlier: {label}": r.losses for label, r in zip(named, runs, strict=True)}

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
        from ortlab.common.plots import figure_png
        from ortlab.engine.backends import label
        from ortlab.verdict.figures import distances_figure

        figures = [distances_figure(v, label(b)) for b, v in self.last_verdicts.items()]
        figure = next((f for f in figures if f is not None), None)
        self.distances.value = figure_png(figure) if figure is not None else b""

    @property
    def last_verdict(self):
        """The verdict on the last ORTModule burst (the backend with ONNX stages) against the PyTorch one before it
        (None without both)."""
        return next((v for b, v in self.last_verdicts.items() if has(b, "onnx_stages")), None)

    @staticmethod
    def _summary(runs, verdicts=None) -> str:
        parts = []
        for run in runs:
            if run.status in STOPPED:  # the user's own Stop: said as such, not as a failure
                text = f"{run.backend}: stopped by you after step {len(run.metrics)} of " \
                       f"{(run.meta.get('config') or {}).get('steps', '?')} (what ran is kept)"
            else:
                text = f"{run.backend}: {run.status}"
                if run.error:
                    text += f" ({run.error}; full log in the Log tab)"
            parts.append(f"<span style='color:{status_color(run.status)}'>{html.escape(text)}</span>")
        for backend, verdict in (verdicts or {}).items():  # each against PyTorch: green only when they agree
            color = {"agree": "#080", "diverged": "#c00"}.get(verdict.status, "#666")
            lines = verdict.lines()
            parts.append(f"<b style='color:{color}'>{backend} verdict: {html.escape(lines[0])}</b>"
                         + "".join(f"<br>&nbsp;&nbsp;{html.escape(line.strip())}" for line in lines[1:]))
        return "<br>".join(parts)

    def _show_results(self, runs) -> None:
        """The runs' facts (ortlab.runs.facts): one row per fact, one column per backend, as the CLI prints them."""
        self.results_frame = facts.frame([r.summary() for r in runs], [r.backend for r in runs])
        self.results.value = table(self.results_frame, index=True)
        transitions = self.session.transitions
        shown = transitions[["run", "action", "reason", "ort_exported"]] if len(transitions) else transitions
        self.transitions.value = table(shown, headers={"ort_exported": "ORT exported"})

    def __repr__(self) -> str:
        return (f"BurstPanel(backend={self.backend.value!r}, steps={self.steps.value}, parity={self.parity.value}, "
                f"running={self.running})")
