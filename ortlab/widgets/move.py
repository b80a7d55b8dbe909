"""The Move tab: the move report (ortlab.move) of the Lab's newest ORTModule run and newest torch.compile run, or of
run folders named in its fields (an ORTModule run made on the ort stack, a torch.compile run made on the newest
torch): what each option becomes, both sides' figures, the verdict. Thin over ortlab.move.report."""

from __future__ import annotations

import html
from collections.abc import Callable

import ipywidgets as W

from ortlab.widgets.layout import row, table


def newest_pair(runs: list) -> tuple:
    """The newest ORTModule run and the newest torch.compile run among `runs` (oldest first); None for one missing."""
    from ortlab.engine.backends import BACKENDS
    from ortlab.runs.groups import newest

    # ORTModule's; torch.compile's: neither ORTModule's nor the reference
    return newest(runs, BACKENDS, "onnx_stages"), newest(runs, BACKENDS, None)


class MovePanel(W.VBox):
    """`MovePanel(runs)`: `runs()` returns the Lab's runs, oldest first. The fields take run folders instead
    (empty: the Lab's newest of that backend); `show()` from code."""

    def __init__(self, runs: Callable[[], list]):
        self._runs_fn = runs
        self.ortmodule_path = W.Text(placeholder="the Lab's newest ORTModule run", description="ORTModule run",
                                     style={"description_width": "initial"}, layout=W.Layout(width="340px"))
        self.target_path = W.Text(placeholder="the Lab's newest torch.compile run", description="torch.compile run",
                                  style={"description_width": "initial"}, layout=W.Layout(width="340px"))
        self.button = W.Button(description="Show", icon="exchange", tooltip="the move report of these two runs")
        self.button.on_click(lambda _: self.show())
        self.result = W.HTML()
        self.report = None
        super().__init__([row(self.ortmodule_path, self.target_path, self.button), self.result])
        self.refresh()

    def refresh(self) -> None:
        """Show the report of the newest pair (after a burst)."""
        self.show()

    def show(self):
        """The report of the fields' runs (or the Lab's newest pair), shown; the MoveReport, or None."""
        from ortlab.move.report import move_report
        from ortlab.runs.run import load_run
        from ortlab.widgets.background import error_html

        ort, comp = newest_pair(list(self._runs_fn() or []))
        try:  # a folder named in a field is read first: a wrong one is said before anything else
            ort = load_run(self.ortmodule_path.value.strip()) if self.ortmodule_path.value.strip() else ort
            comp = load_run(self.target_path.value.strip()) if self.target_path.value.strip() else comp
        except Exception as e:
            self.report, self.result.value = None, error_html(e)
            return None
        if ort is None or comp is None:
            lacking = " and ".join(n for n, r in (("an ORTModule run", ort), ("a torch.compile run", comp))
                                   if r is None)
            self.report = None
            self.result.value = (f"<p style='color:#555'>the move needs {lacking}: burst one (the Burst tab), or name "
                                 "a run folder above (an ORTModule run from the ort stack, a torch.compile run from "
                                 "the newest torch); <code>ortlab move RUN RUN</code> writes the same</p>")
            return None
        try:
            self.report = move_report(ort, comp)
        except Exception as e:
            self.report = None
            self.result.value = error_html(e)
            return None
        self.result.value = render(self.report)
        return self.report


def render(report) -> str:
    """A MoveReport as HTML: the two sides, the figures, each option's equivalent with its snippet, the verdict."""
    e = html.escape
    o, t = report.ortmodule, report.target
    head = (f"<p><b>ORTModule</b> {e(o.run)} (torch {e(str(o.torch))}, {e(o.where)}) &rarr; "
            f"<b>torch.compile</b> {e(t.run)} (torch {e(str(t.torch))}, {e(t.where)})</p>")
    import pandas as pd

    figures = table(pd.DataFrame(report.table()), digits=3, headers={"figure": "measured"})
    rows = []
    for entry in report.options:
        value = "" if entry["value"] is None else f"={entry['value']}"
        by = "" if entry["set_by"] == "the run" else f"<br><span style='color:#777'>set by {e(entry['set_by'])}</span>"
        why = f"<br><span style='color:#555'>{e(entry['why'])}</span>" if entry["why"] else ""
        snippet = f"<pre style='margin:2px 0'>{e(entry['snippet'])}</pre>" if entry["snippet"] else ""
        rows.append(f"<tr><td{_TD}><code>{e(entry['option'] + value)}</code>{by}</td><td{_TD}>{e(entry['becomes'])}"
                    f"{why}{snippet}</td><td{_TD} nowrap>{e(entry['fit'])}</td></tr>")
    heads = "".join(f"<th style='text-align:left;padding:2px 4px'>{h}</th>" for h in ("ORTModule", "on the newest "
                                                                                     "torch", "fit"))
    options = ("<table style='border-collapse:collapse;font-size:12px;margin-top:6px'>"
               f"<thead><tr>{heads}</tr></thead><tbody>{''.join(rows)}</tbody></table>")
    extra = [f"ORTModule recomputed in backward: {e(', '.join(report.recomputed))} (checkpoint these modules)"
             if report.recomputed else ""]
    if report.memory.get("line"):
        extra.append(f"memory: {e(report.memory['line'])}" + (f"<br>measure it: <code>{e(report.memory['command'])}"
                                                              "</code>" if report.memory.get("command") else ""))
    extra += [f"verdict, {name}: {e(side.verdict or 'not judged')}" for name, side in (("ORTModule", o),
                                                                                     ("torch.compile", t))]
    extra += [e(report.verdict.get("note") or ""), *(f"missing: {e(m)}" for m in report.missing),
              *(f"busy machine during {e(s.run)}: {e(s.busy)}" for s in (o, t) if s.busy),
              f"<b>{e(report.conclusion)}</b>"]
    return head + figures + options + "".join(f"<p style='margin:2px 0'>{x}</p>" for x in extra if x)


_TD = " style='text-align:left;padding:1px 4px;vertical-align:top'"
