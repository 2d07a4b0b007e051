"""Line charts as server-made SVG: no chart library, no script, readable at a glance."""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape


@dataclass(frozen=True)
class Series:
    name: str
    colour: str
    values: Sequence[float | None]
    # Optional (low, high) per point, drawn as a whisker: a confidence interval, say.
    intervals: Sequence[Sequence[float] | None] = ()


def percent(value: float) -> str:
    return f"{value:.0%}"


def nice_ceiling(value: float) -> float:
    """The axis top for a largest value: 1, 2, 2.5 or 5 times a power of ten above it."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(step * power for step in (1.0, 2.0, 2.5, 5.0, 10.0) if step * power >= value)


def line_chart(
    *,
    title: str,
    x_labels: Sequence[str],
    series: Sequence[Series],
    y_max: float = 1.0,
    y_label: Callable[[float], str] = percent,
    x_title: str = "",
) -> str:
    width, height, left, bottom, top, right = 640, 300, 56, 44, 16, 200
    plot_w, plot_h = width - left - right, height - top - bottom
    y_max = y_max or 1.0
    count = len(x_labels)

    def x(index: int) -> float:
        return left + plot_w * index / max(1, count - 1)

    def y(value: float) -> float:
        return top + plot_h * (1 - min(value, y_max) / y_max)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'font-family="sans-serif" font-size="15" role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        f'<rect width="{width}" height="{height}" fill="#fff"/>',
    ]
    for step in range(5):
        tick = y_max * step / 4
        out.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" '
            'stroke="#e5e7eb"/>'
        )
        out.append(
            f'<text x="{left - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">'
            f"{escape(y_label(tick))}</text>"
        )
    every = max(1, math.ceil(count / 7))  # at most 8 labels: each needs room
    for index, label in enumerate(x_labels):
        # Every few labels, and the last one, unless it would overlap its neighbour.
        if (index % every == 0 and count - 1 - index >= every) or index == count - 1:
            out.append(
                f'<text x="{x(index):.1f}" y="{height - 26}" text-anchor="middle">'
                f"{escape(label)}</text>"
            )
    if x_title:
        out.append(
            f'<text x="{left + plot_w / 2:.1f}" y="{height - 6}" text-anchor="middle">'
            f"{escape(x_title)}</text>"
        )
    for row, line in enumerate(series):
        points = [(x(i), y(v)) for i, v in enumerate(line.values) if v is not None]
        if points:
            path = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
            out.append(
                f'<polyline points="{path}" fill="none" stroke="{line.colour}" stroke-width="2.5"/>'
            )
            # Earlier series get larger rings, so equal values show as concentric marks
            # instead of one point hiding another.
            radius = 3.5 + 2.5 * (len(series) - 1 - row)
            fill = line.colour if row == len(series) - 1 else "#fff"
            out.extend(
                f'<circle cx="{px:.1f}" cy="{py:.1f}" r="{radius}" fill="{fill}" '
                f'stroke="{line.colour}" stroke-width="2"/>'
                for px, py in points
            )
        for index, interval in enumerate(line.intervals):
            if interval:
                low, high = interval
                out.append(
                    f'<line x1="{x(index):.1f}" x2="{x(index):.1f}" y1="{y(low):.1f}" '
                    f'y2="{y(high):.1f}" stroke="{line.colour}" stroke-width="1.5" '
                    'stroke-opacity="0.6"/>'
                )
        legend_y = top + 10 + row * 20
        out.append(
            f'<line x1="{width - right + 15}" x2="{width - right + 35}" y1="{legend_y}" '
            f'y2="{legend_y}" stroke="{line.colour}" stroke-width="3"/>'
        )
        out.append(f'<text x="{width - right + 40}" y="{legend_y + 4}">{escape(line.name)}</text>')
    out.append("</svg>")
    return "\n".join(out)
