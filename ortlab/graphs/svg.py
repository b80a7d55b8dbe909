"""ortlab's own drawing of a neighbourhood: a layered SVG that needs no graphviz, no server and no browser
extension, so it stays in a saved notebook and works where netron cannot run.

Every edge points down; layers by longest path, order within a layer by the barycentre of the neighbours
(a few sweeps down and up). Deterministic for the same input.
"""

from __future__ import annotations

import html
from collections import defaultdict
from typing import Any

from ortlab.graphs.names import short_name

KIND_COLORS = {  # fill, stroke: one palette for every drawing of node kinds (SVG, DOT, charts)
    "forward": ("#e8f0fe", "#4a6fa5"), "gradient": ("#fdebd9", "#d9822b"),
    "recompute": ("#efe3fb", "#8e44ad"), "yield": ("#fff3bf", "#b7950b"),
    "input": ("#f1f3f5", "#868e96"), "output": ("#e6f4ea", "#2f9e44"),
}
_GAP_X, _GAP_Y, _MARGIN, _LEGEND_H = 14, 34, 12, 26


def _box(row: dict[str, Any]) -> tuple[float, float]:
    """Width and height of a node's box: pseudo-nodes (graph inputs and outputs) are small pills."""
    if row["op"] == "":
        return max(60, 6.2 * len(short_name(row["name"].split(":", 1)[1], 28)) + 18), 22
    return max(70, 6.4 * max(len(row["op"].split("::")[-1]), len(short_name(row["name"]))) + 18), 36


def _ranks(ids: list[str], info: dict, succ: dict, pred: dict) -> dict[str, int]:
    """Longest-path layering (Kahn's order); graph inputs then move right above their first consumer."""
    indeg = {i: len(pred[i]) for i in ids}
    rank = dict.fromkeys(ids, 0)
    queue = [i for i in ids if indeg[i] == 0]
    while queue:  # a cycle cannot occur in an ONNX graph; its nodes would keep rank 0
        n = queue.pop(0)
        for m in succ[n]:
            rank[m] = max(rank[m], rank[n] + 1)
            indeg[m] -= 1
            if indeg[m] == 0:
                queue.append(m)
    for i in ids:
        if info[i]["kind"] == "input" and succ[i]:
            rank[i] = max(0, min(rank[m] for m in succ[i]) - 1)
    return rank


def _x_positions(layers: dict[int, list[str]], sizes: dict, succ: dict, pred: dict) -> dict[str, float]:
    """Centre x of each box, left-aligned per layer; reorders `layers` in place by barycentre."""
    xs: dict[str, float] = {}

    def place(layer: list[str]) -> None:
        x = 0.0
        for i in layer:
            xs[i] = x + sizes[i][0] / 2
            x += sizes[i][0] + _GAP_X

    for r in sorted(layers):
        place(layers[r])
    for sweep in range(4):  # down, up, down, up
        nbrs = pred if sweep % 2 == 0 else succ
        for r in sorted(layers, reverse=sweep % 2 == 1):

            def key(i, nbrs=nbrs):
                near = [xs[m] for m in nbrs[i] if m in xs]
                return (sum(near) / len(near)) if near else xs[i]

            layers[r].sort(key=key)
            place(layers[r])
    return xs


def render_svg(center: str, rows: list[dict[str, Any]], edges: list[tuple[str, str, str]],
               truncated: int = 0, overlay: dict[str, tuple[str, str]] | None = None) -> str:
    """SVG text of a neighbourhood: `rows` its nodes (name, op, kind), `edges` (from, to, tensor); `overlay`: node
    name -> (fill colour, value text) of per-node data (graphs.overlay), drawn instead of the kind's fill."""
    ids = [r["name"] for r in rows]
    info = {r["name"]: r for r in rows}
    succ: dict[str, list[str]] = defaultdict(list)
    pred: dict[str, list[str]] = defaultdict(list)
    seen = set()
    for s, d, _ in edges:
        if (s, d) not in seen and s != d:
            seen.add((s, d))
            succ[s].append(d)
            pred[d].append(s)
    rank = _ranks(ids, info, succ, pred)
    layers: dict[int, list[str]] = defaultdict(list)
    for i in ids:
        layers[rank[i]].append(i)
    sizes = {i: _box(info[i]) for i in ids}
    xs = _x_positions(layers, sizes, succ, pred)

    widths = {r: sum(sizes[i][0] for i in layers[r]) + _GAP_X * (len(layers[r]) - 1) for r in layers}
    legend = [(kind, 22 + 6.2 * len(kind)) for kind in KIND_COLORS]
    note = f"{truncated} more not shown" if truncated else ""
    total_w = max([*widths.values(), sum(w for _, w in legend) + 6.2 * len(note) + 8])
    for r in layers:  # centre each layer
        shift = (total_w - widths[r]) / 2
        for i in layers[r]:
            xs[i] += shift
    ys: dict[int, float] = {}
    y = _MARGIN + _LEGEND_H
    for r in sorted(layers):
        h = max(sizes[i][1] for i in layers[r])
        ys[r] = y + h / 2
        y += h + _GAP_Y
    width, height = total_w + 2 * _MARGIN, y - _GAP_Y + _MARGIN

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="Helvetica, Arial, sans-serif">',
           '<defs><marker id="ortlab-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
           'markerHeight="7" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#666"/>'
           '</marker></defs>',
           f'<rect width="{width:.0f}" height="{height:.0f}" fill="white"/>']
    lx = _MARGIN
    for kind, w in legend:
        fill, stroke = KIND_COLORS[kind]
        out.append(f'<rect x="{lx:.1f}" y="{_MARGIN}" width="12" height="12" rx="2" fill="{fill}" '
                   f'stroke="{stroke}"/><text x="{lx + 16:.1f}" y="{_MARGIN + 10}" font-size="10" '
                   f'fill="#333">{kind}</text>')
        lx += w
    if note:
        out.append(f'<text x="{lx + 8:.1f}" y="{_MARGIN + 10}" font-size="10" fill="#c0392b">{note}</text>')
    for s, d in sorted(seen, key=lambda e: (ids.index(e[0]), ids.index(e[1]))):
        x1, y1 = xs[s], ys[rank[s]] + sizes[s][1] / 2
        x2, y2 = xs[d], ys[rank[d]] - sizes[d][1] / 2
        my = (y1 + y2) / 2
        tensors = ", ".join(t for a, b, t in edges if a == s and b == d)
        out.append(f'<path d="M {x1:.1f} {y1:.1f} C {x1:.1f} {my:.1f}, {x2:.1f} {my:.1f}, '
                   f'{x2:.1f} {y2 - 1:.1f}" fill="none" stroke="#888" stroke-width="1.2" '
                   'marker-end="url(#ortlab-arrow)">'
                   f'<title>{html.escape(tensors)}</title></path>')
    for i in ids:
        out.append(_node_svg(i, info[i], xs[i], ys[rank[i]], sizes[i], i == center, (overlay or {}).get(i)))
    out.append("</svg>")
    return "\n".join(out)


def _node_svg(name: str, row: dict[str, Any], xc: float, yc: float, size: tuple[float, float],
              is_center: bool, overlay: tuple[str, str] | None = None) -> str:
    (w, h), x = size, xc - size[0] / 2
    fill, stroke = KIND_COLORS.get(row["kind"], KIND_COLORS["forward"])
    stroke, sw = ("#d6336c", 3) if is_center else (stroke, 1.2)
    tip = html.escape(name if row["op"] == "" else f"{row['op']}  {name}")
    if overlay is not None:
        fill, tip = overlay[0], f"{tip}  {html.escape(overlay[1])}"
    if row["op"] == "":
        return (f'<g><title>{tip}</title>'
                f'<rect x="{x:.1f}" y="{yc - h / 2:.1f}" width="{w:.1f}" height="{h}" rx="{h / 2}" '
                f'fill="{fill}" stroke="{stroke}" stroke-width="{sw}"/>'
                f'<text x="{xc:.1f}" y="{yc + 4:.1f}" font-size="10" text-anchor="middle" fill="#333">'
                f'{html.escape(short_name(name.split(":", 1)[1], 28))}</text></g>')
    return (f'<g><title>{tip}</title>'
            f'<rect x="{x:.1f}" y="{yc - h / 2:.1f}" width="{w:.1f}" height="{h}" rx="4" '
            f'fill="{fill}" stroke="{stroke}" stroke-width="{sw}"/>'
            f'<text x="{xc:.1f}" y="{yc - 3:.1f}" font-size="12" font-weight="bold" '
            f'text-anchor="middle" fill="#222">{html.escape(row["op"].split("::")[-1])}</text>'
            f'<text x="{xc:.1f}" y="{yc + 11:.1f}" font-size="9.5" text-anchor="middle" fill="#555">'
            f'{html.escape(short_name(name))}</text></g>')
