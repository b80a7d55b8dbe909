"""matplotlib figures from ortlab's data (runs, comparisons); nothing here touches widgets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def loss_figure(series: Mapping[str, Sequence[float]], title: str = "loss per step",
                earlier: Mapping[str, Sequence[float]] | None = None):
    """One line per backend (or run): {label: [loss at step 0, 1, ...]}; `earlier` runs' curves thin and faint
    beneath them (overlaid for comparison)."""
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure state
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(6, 3), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    for label, values in (earlier or {}).items():
        ax.plot(range(len(values)), list(values), linewidth=1.0, alpha=0.55, label=label)
    styles = ["-", "--", ":", "-."]  # identical curves (parity mode) stay visible on top of each other
    for i, (label, values) in enumerate(series.items()):
        ax.plot(range(len(values)), list(values), styles[i % len(styles)], marker="." if len(values) < 40 else None,
                label=label, linewidth=1.5 + (len(series) - i - 1))
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # whole steps: 0, 2, 4, never 2.5
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if series or earlier:
        ax.legend(fontsize=8 if earlier else None)
    return fig


def imbalance_figure(table, summaries: Mapping[str, Mapping] | None = None):
    """Load imbalance per step (max over ranks / mean) for each label of `table` (ortlab.engine.balance.
    sampler_comparison: label, step, load_imbalance, ...), and beside it each label's mean load and tokens
    imbalance as the busiest rank's excess over the mean, and the share of the step time ranks waited (from
    `summaries`, ortlab.engine.balance.summary)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3), dpi=100, layout="constrained")
    steps, bars = fig.subplots(1, 2, width_ratios=[3, 2])
    labels = list(dict.fromkeys(table["label"])) if len(table) else []
    for i, label in enumerate(labels):
        rows = table[table["label"] == label]
        if "load_imbalance" in rows:
            steps.plot(rows["step"], rows["load_imbalance"], ["-", "--", ":"][i % 3], marker=".", label=label)
    steps.axhline(1.0, color="grey", linewidth=0.8)
    steps.set_xlabel("step")
    steps.xaxis.get_major_locator().set_params(integer=True)
    steps.set_ylabel("max / mean load over ranks")
    steps.set_title("load imbalance per step")
    steps.grid(alpha=0.3)
    if labels:
        steps.legend()
    keys = [("load", "load"), ("tokens", "padded tokens")]
    width = 0.8 / max(len(labels), 1)
    for i, label in enumerate(labels):
        s = (summaries or {}).get(label) or {}
        values = [100 * (s[k] - 1) if s.get(k) is not None else float("nan") for k, _ in keys]
        share = s.get("wait_share")
        name = f"{label} (waited {share:.0%} of the step time)" if share is not None else label
        bars.bar([j + i * width for j in range(len(keys))], values, width, label=name)
    bars.set_xticks([j + width * (len(labels) - 1) / 2 for j in range(len(keys))], [name for _, name in keys])
    bars.set_ylabel("busiest rank, % above the mean")
    if labels:
        bars.set_ylim(top=bars.get_ylim()[1] * 1.4)  # room for the legend above the bars
        bars.legend(fontsize="small", loc="upper right")
    bars.set_title("per burst (mean over steps)", fontsize="medium")
    bars.grid(alpha=0.3, axis="y")
    return fig


def figure_png(fig) -> bytes:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (time, memory) points no other point beats on both, sorted by time: the line a pareto figure draws."""
    front, best = [], float("inf")
    for x, y in sorted(points):
        if y < best:
            front.append((x, y))
            best = y
    return front


def label_points(ax, points: Sequence[tuple[float, float]], texts: Sequence[str], colors: Sequence[str],
                 fontsize: float = 7) -> list:
    """Name each point beside it where the name overlaps no other name, no point and stays inside the axes: the
    nearest free place of eight around it, farther out when those are taken; a name with no free place is numbered
    at its point and listed under the axes. The Text artists placed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = ax.figure
    if fig.canvas is None or not hasattr(fig.canvas, "get_renderer"):
        FigureCanvasAgg(fig)
    renderer = fig.canvas.get_renderer()
    fig.draw_without_rendering()  # the layout (constrained) settles the axes' box first
    inside = ax.get_window_extent(renderer)
    taken = [ax.transData.transform(p) for p in points]  # every point, as a 6-pixel square
    boxes = [(x - 3, y - 3, x + 3, y + 3) for x, y in taken]
    placed, listed = [], []
    directions = [(1, 1), (1, -1), (-1, 1), (-1, -1), (1, 0), (-1, 0), (0, 1), (0, -1)]
    for (x, y), text, color in zip(points, texts, colors, strict=True):
        artist = None
        for radius in (6, 14, 26, 40):
            for dx, dy in directions:
                candidate = ax.annotate(text, (x, y), xytext=(dx * radius, dy * radius), textcoords="offset points",
                                        fontsize=fontsize, color=color, ha="left" if dx > 0 else "right" if dx < 0
                                        else "center", va="bottom" if dy > 0 else "top" if dy < 0 else "center")
                box = candidate.get_window_extent(renderer)
                edges = (box.x0, box.y0, box.x1, box.y1)
                fits = (box.x0 >= inside.x0 and box.x1 <= inside.x1 and box.y0 >= inside.y0 and box.y1 <= inside.y1
                        and not any(_overlap(edges, other) for other in boxes))
                if fits:
                    artist = candidate
                    boxes.append(edges)
                    break
                candidate.remove()
            if artist is not None:
                break
        if artist is None:  # no free place: a number at the point, the name under the axes
            listed.append(text)
            artist = ax.annotate(str(len(listed)), (x, y), xytext=(3, 3), textcoords="offset points",
                                 fontsize=fontsize, color=color, annotation_clip=True)
        placed.append(artist)
    if listed:
        ax.set_xlabel(ax.get_xlabel() + "\n" + "; ".join(f"{i}: {t}" for i, t in enumerate(listed, 1)))
    return placed


def _overlap(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]
