"""The report's data written as one HTML page that needs nothing else: its style inline, its figures as data URIs,
no script, no font, no request to anywhere; it reads the same offline, in any browser, attached to a bug."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from ortlab.reporting import figures
from ortlab.reporting.gather import SECTIONS
from ortlab.runs import facts
from ortlab.runs.facts import MISSING

STYLE = """
body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:0 auto;max-width:1100px;
padding:0 18px 40px;color:#222;line-height:1.4}
h1{font-size:1.6em;margin:18px 0 4px}h2{font-size:1.25em;border-bottom:1px solid #ddd;padding-bottom:3px;
margin-top:28px}
h3{font-size:1.02em;margin:14px 0 4px}nav a{margin-right:10px;font-size:.9em}
table{border-collapse:collapse;margin:6px 0 10px;font-size:.86em}td,th{border:1px solid #ddd;padding:2px 7px;
text-align:left;vertical-align:top;overflow-wrap:anywhere}th{background:#f4f5f7}td.n{text-align:right;font-variant-numeric:tabular-nums}
pre,code{font-family:Menlo,Consolas,monospace;font-size:.85em}pre{background:#f6f8fa;padding:8px;overflow:auto;
white-space:pre-wrap}.muted{color:#666}.missing{color:#666;font-style:italic}.agree{color:#2b8a3e;font-weight:bold}
.diverged{color:#c00;font-weight:bold}.notjudged{color:#a66200;font-weight:bold}img{max-width:100%}
.first{border-left:4px solid #c00;padding:4px 10px;background:#fff5f5}.ok{border-left:4px solid #2b8a3e;
padding:4px 10px;background:#f4fbf6}
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _anchor(title: str) -> str:
    return title.replace(" ", "-")


def _cell(value: Any) -> str:
    if value is None:
        return f"<td class='missing'>{MISSING}</td>"
    if isinstance(value, float):
        text = f"{value:.4g}" if abs(value) < 1e-3 or abs(value) >= 1e5 else f"{value:.3f}".rstrip("0").rstrip(".")
        return f'<td class="n">{text}</td>'
    if isinstance(value, int) and not isinstance(value, bool):
        return f'<td class="n">{value}</td>'
    if isinstance(value, list | tuple):
        value = ", ".join(str(v) for v in value)
    return f"<td>{_e(value)}</td>"


def table(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    """Records as an HTML table (their keys as the header)."""
    if not rows:
        return '<p class="missing">none</p>'
    columns = columns or list(dict.fromkeys(k for r in rows for k in r))
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(_cell(r.get(c)) for c in columns) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _grid(columns: list[str], rows: list[list[Any]]) -> str:
    head = "<th></th>" + "".join(f"<th>{_e(c)}</th>" for c in columns)
    body = "".join(f"<tr><th>{_e(r[0])}</th>" + "".join(_cell(v) for v in r[1:]) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _missing(section: dict[str, Any]) -> str:
    return f'<p class="missing">{_e(section.get("missing"))}</p>' if section.get("missing") else ""


def _img(uri: str | None, alt: str) -> str:
    return f'<img alt="{_e(alt)}" src="{uri}">' if uri else ""


def _status_class(status: str) -> str:
    return {"agree": "agree", "diverged": "diverged"}.get(status, "notjudged")


def _what_was_run(items: list[dict[str, Any]]) -> str:
    out = []
    for r in items:
        how = (f"<p>command: <code>{_e(r['command'])}</code> <span class='muted'>(in {_e(r['cwd'])})</span></p>"
               if r.get("command") else f"<p>Python call (its arguments): <code>{_e(r['call'])}</code></p>")
        versions = ", ".join(f"{k} {v}" for k, v in r["versions"].items())
        machine = ", ".join(f"{k} {v}" for k, v in r["machine"].items())
        options = ", ".join(f"{k}={v}" for k, v in r["options"].items()) or "ORT's defaults"
        out.append(f"<h3>{_e(r['run'])}: {_e(r['backend'])}, {_e(r['status'])}</h3>{how}"
                   + table([{"model": r["model"], "parameters": r["parameters"], "batch": r["batch_size"],
                             "steps": r["steps"], "parity": r["parity"], "collected": r["collect"],
                             "optimizer": r["optimizer"], "fixes": r["fixes"] or MISSING}])
                   + f"<p>options: <code>{_e(options)}</code><br>stack: {_e(versions)}<br>machine: "
                     f"{_e(r['device'])}{' ' + _e(r['gpu']) if r.get('gpu') else ''}, {_e(machine)}<br>"
                     f"started {_e(r['started'])}, finished {_e(r['finished'])}; folder <code>{_e(r['path'])}"
                     "</code></p>" + (f"<p class='diverged'>error: {_e(r['error'])}</p>" if r.get("error") else ""))
    return "".join(out)


def _summary(s: dict[str, Any]) -> str:
    out = _grid(s["columns"], s["rows"])
    if s["versus"]:
        out += table([{"run": v["run"], "against": v["against"], "max |loss difference|": v["max_loss_diff"],
                       "step time ratio": v["step_time_ratio"], "not compared": v["not_compared"]}
                      for v in s["versus"]])
    return out + "".join(f"<p><b>{_e(line)}</b></p>" for line in s["recommendations"])


def _verdict(s: dict[str, Any]) -> str:
    out = []
    for v in s["items"]:
        lines = [f"<p class='{_status_class(v['status'])}'>{_e(v['run'])} verdict: {_e(v['headline'])}</p>"]
        if v["evidence"]:
            lines.append(f"<p>evidence: {_e(v['evidence'])}</p>")
        lines += [f"<p>{'cause' if i == 0 else 'also'}: {_e(c)}</p>" for i, c in enumerate(v["causes"])]
        lines += [f"<p class='muted'>note: {_e(n)}</p>" for n in v["notes"]]
        if v.get("localized"):
            lines.append(f"<p>localized: {_e(v['localized'])}</p>")
        if v.get("ops"):  # the first op that diverged there marked ">>"
            lines.append(f"<pre class='ops'>{_e(chr(10).join(v['ops']))}</pre>")
        out.append("".join(lines))
    return "".join(out) + _missing(s)


def _items(s: dict[str, Any], title: Callable[[dict[str, Any]], str], body: Callable[[dict[str, Any]], list[str]],
           missing: str = "error", said: str = "") -> str:
    """A section of one block per item: its title, then its error (`missing` key, after `said`) or its body."""
    out = []
    for item in s["items"]:
        out.append(f"<h3>{_e(title(item))}</h3>")
        out += [f"<p class='missing'>{said}{_e(item[missing])}</p>"] if item.get(missing) else body(item)
    return "".join(out) + _missing(s)


def _move(s: dict[str, Any]) -> str:
    return _items(s, lambda m: " -> ".join(m["runs"]), _move_body)


def _move_body(m: dict[str, Any]) -> list[str]:
    out = []
    sides = [(n, m[k]) for n, k in (("ORTModule", "from"), ("torch.compile", "to"))]
    out.append(table([{"": n, "torch": d["torch"], "stack": d["stack"], "verdict": d["verdict"] or "not judged",
                       **{title(key, d): d["figures"].get(key) for key in _MOVE_FIGURES}} for n, d in sides]))
    rows = "".join(f"<tr><td><code>{_e(o['option'])}{'' if o['value'] is None else _e('=' + str(o['value']))}"
                   f"</code></td><td>{_e(o['becomes'])}<br><span class='muted'>{_e(o['why'])}</span>"
                   f"{'<pre>' + _e(o['snippet']) + '</pre>' if o['snippet'] else ''}</td><td>{_e(o['fit'])}</td>"
                   "</tr>" for o in m["options"])
    out.append(f"<table><tr><th>ORTModule</th><th>on the newest torch</th><th>fit</th></tr>{rows}</table>")
    if m["recomputed"]:
        out.append(f"<p>ORTModule recomputed in backward: {_e(', '.join(m['recomputed']))}</p>")
    memory = m.get("memory") or {}
    if memory.get("line"):
        out.append(f"<p>memory: {_e(memory['line'])}" + (f"<br>measure it: <code>{_e(memory['command'])}</code>"
                                                       if memory.get("command") else "") + "</p>")
    out += [f"<p class='muted'>{_e(line)}</p>" for line in (m["verdict"].get("note"), *m["missing"]) if line]
    out.append(f"<p><b>{_e(m['conclusion'])}</b></p>")
    return out


_MOVE_FIGURES = ("median_step_s", "startup_s", "saved_for_backward_mb", "peak_mem_mb")


def title(key: str, side: dict[str, Any]) -> str:
    """A move figure's label: the fact's (ortlab.runs.facts), in seconds (the move report's unit) for the step."""
    return "median step after start-up (s)" if key == "median_step_s" else facts.title(key, side)


def _losses(s: dict[str, Any]) -> str:
    rows = [{"run": label, "steps": len(v), "first loss": next((x for x in v if x is not None), None),
             "final loss": next((x for x in reversed(v) if x is not None), None)} for label, v in s["series"].items()]
    return _img(figures.losses(s["series"]), "loss per step") + (table(rows) if rows else "") + _missing(s)


def _time(s: dict[str, Any]) -> str:
    if s.get("missing"):
        return _missing(s)
    parts = [{k: v for k, v in p.items()} for p in s["parts"]]
    out = [f"<p class='muted'>ms per profiled step (the mean of a run's profiled steps): {_e(', '.join(s['runs']))}"
           "</p>", table(parts), _img(figures.modules(s["modules"]), "where the time goes, by module"),
           "<h3>op types, top 10</h3>", table(s["ops"]), "<h3>ORT graph nodes, top 10</h3>", table(s["nodes"]),
           "<h3>what profiling cost</h3>", table(s["cost"])]
    out += [f"<p class='muted'>{_e(k)}: {_e(v)}</p>" for k, v in s["notes"].items()]
    return "".join(out)


def _time_diff(s: dict[str, Any]) -> str:
    return _items(s, lambda d: d['title'], _time_diff_body)


def _time_diff_body(d: dict[str, Any]) -> list[str]:
    out = []
    counts = ", ".join(f"{n} {k}" for k, n in d["counts"].items())
    out += [f"<pre>{_e(d['headline'])}</pre>", table(d["parts"]), f"<p>{_e(counts)}; the largest changes:</p>",
            table(d["rows"])]
    out += [f"<p class='muted'>note: {_e(n)}</p>" for n in d["notes"]]
    return out


def _memory(s: dict[str, Any]) -> str:
    return (_img(figures.timelines(s["items"]), "live activation memory")
            + _items(s, lambda m: m["run"], _memory_body, "missing", "no account: "))


def _memory_body(m: dict[str, Any]) -> list[str]:
    peak = (f", activation peak {m['peak_mb']:.2f} MB at {_e(m['peak_node'])} ({_e(m['peak_phase'])})"
            if m.get("peak_mb") is not None else "")
    return [f"<p>kept for backward {m['kept_mb'] or 0:.2f} MB{peak}</p>", f"<p class='muted'>{_e(m['counts'])}</p>",
            table(m["top"])]


def _divergence(s: dict[str, Any]) -> str:
    return _items(s, lambda d: d['title'], _divergence_body)


def _divergence_body(d: dict[str, Any]) -> list[str]:
    out = []
    box = (f"<div class='first'>first divergence: {_e(d['first'])}</div>" if d["first"]
           else "<div class='ok'>no divergence beyond tolerance</div>")
    out += [box, f"<p class='muted'>{_e(d['compared'])}</p>"]
    out += [f"<p class='diverged'>first nan/inf in {_e(k)}: {_e(v)}</p>" for k, v in d["nonfinite"].items()]
    out += ["<p>largest differences (relative to tolerance):</p>", table(d["top"])]
    return out


def _graphs(s: dict[str, Any]) -> str:
    out = []
    for g in s["items"]:
        if g.get("error"):
            out.append(f"<h3>{_e(g['run'])}</h3><p class='missing'>{_e(g['error'])}</p>")
            continue
        out += [f"<h3>{_e(g['run'])}: export {_e(g['prefix'])}</h3>", table(g["stages"]),
                f"<p class='muted'>per-node overlays for Model Explorer: <code>{_e(g['overlays'])}</code></p>"]
    return "".join(out) + _missing(s)


def _plans(s: dict[str, Any]) -> str:
    return _items(s, lambda p: p["run"], lambda p: [f"<p>{p['count']} plans, largest saving first:</p>",
                                                    table(p["plans"])])


def _tuning(s: dict[str, Any]) -> str:
    return _items(s, lambda t: t['folder'], _tuning_body)


def _tuning_body(t: dict[str, Any]) -> list[str]:
    out = []
    out += [f"<p>best: <b>{_e(t['best'])}</b></p>", table(t["rows"]),
            f"<pre>{_e(chr(10).join(t['export_lines']))}</pre>" if t["export_lines"] else ""]
    out += [f"<p class='muted'>note: {_e(n)}</p>" for n in t["notes"]]
    return out


def _reproduce(s: dict[str, Any]) -> str:
    out = []
    for item in s["items"]:
        out.append(f"<h3>{_e(', '.join(item['runs']))}</h3>")
        if item["command"]:
            said = "the command that made them" if item["recorded"] else "the command that runs them again"
            where = f" (from {_e(item['cwd'])})" if item.get("cwd") else ""
            out.append(f"<p>{said}{where}:</p><pre>{_e(item['command'])}</pre>")
        else:
            out.append("<p class='missing'>no command: the model was a callable from Python (no factory to name)"
                       "</p>")
        calls = [f"{_e(label)}: {_e(call)}" for label, call in item["calls"].items() if call]
        if calls:
            out.append("<p>in Python, each run:</p><pre>" + "\n".join(calls) + "</pre>")
        for script in item["scripts"]:
            out.append(f"<p>the regression script <code>ortlab repro</code> wrote for {_e(script['run'])} "
                       f"(<code>{_e(script['path'])}</code>; torch and onnxruntime-training only):</p>"
                       f"<details open><summary>{_e(script['path'])}</summary><pre>{_e(script['text'])}</pre>"
                       "</details>")
    return "".join(out) + _missing(s)


def render(data: dict[str, Any]) -> str:
    """The page's HTML."""
    bodies = {"what was run": _what_was_run(data["what was run"]), "summary": _summary(data["summary"]),
              "verdict": _verdict(data["verdict"]), "the move": _move(data["the move"]),
              "loss curves": _losses(data["loss curves"]),
              "where the time goes": _time(data["where the time goes"]),
              "what changed in the time": _time_diff(data["what changed in the time"]),
              "memory": _memory(data["memory"]), "first divergence": _divergence(data["first divergence"]),
              "exported graphs": _graphs(data["exported graphs"]), "recompute plans": _plans(data["recompute plans"]),
              "tuning": _tuning(data["tuning"]), "how to reproduce": _reproduce(data["how to reproduce"])}
    shown = [t for t in SECTIONS if t != "the move" or data["the move"]["items"]]  # only with both runs there
    nav = "".join(f'<a href="#{_anchor(t)}">{_e(t)}</a>' for t in shown)
    sections = "".join(f'<section id="{_anchor(t)}"><h2>{_e(t)}</h2>{bodies[t]}</section>' for t in shown)
    runs = ", ".join(data["labels"].values())
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>ortlab report: {_e(runs)}</title><style>{STYLE}</style></head><body>"
            f"<h1>ortlab report</h1><p class='muted'>{_e(runs)}; made by ortlab {_e(data['ortlab'])} on "
            f"{_e(data['generated'])} from {_e('; '.join(data['given']))}</p><nav>{nav}</nav>{sections}"
            "</body></html>\n")
