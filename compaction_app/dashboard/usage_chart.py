"""Usage-over-time charts as SVG geometry (pure: numbers in, coordinates out), drawn by the
usage page's template like the session chart (chart.py): stacked bars per period and group,
and lines (p50 / p99 latency)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# The series' colours, in order (the last for "others").
COLOURS = ("#2f7dd1", "#6a4fc2", "#2e9d62", "#d08a1a", "#c2474f", "#1b9aaa", "#8a6d3b", "#7f8c8d")


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    colour: str
    title: str


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    bars: tuple[Bar, ...]
    lines: tuple[tuple[str, str, str], ...]  # path, colour, label
    y_ticks: tuple[tuple[float, str], ...]
    x_ticks: tuple[tuple[float, str], ...]
    plot_left: int
    plot_right: int
    plot_bottom: int


def _nice(value: float) -> float:
    """The smallest 1, 2, 2.5 or 5 × 10^k at least `value` (an axis people read)."""
    if value <= 0:
        return 1.0
    magnitude = 10.0 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * magnitude >= value:
            return step * magnitude
    return 10 * magnitude


def _label(value: float, money: bool) -> str:
    if money:
        return f"${value:,.2f}" if value >= 1 or value == 0 else f"${value:.4f}"
    if value >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if value >= 1000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def chart(
    *,
    labels: Sequence[str],
    stacks: Sequence[tuple[str, Sequence[float]]] = (),
    lines: Sequence[tuple[str, Sequence[float | None]]] = (),
    money: bool = False,
    width: int = 720,
    height: int = 180,
    pad_left: int = 56,
    pad_right: int = 12,
    pad_top: int = 10,
    pad_bottom: int = 24,
    x_tick_count: int = 6,
) -> Chart:
    """Stacked bars (one stack per period, a segment per series) and/or lines over
    `labels` (one per period)."""
    left, right = pad_left, width - pad_right
    top, bottom = pad_top, height - pad_bottom
    n = max(len(labels), 1)
    totals = [sum(values[i] for _, values in stacks) for i in range(len(labels))]
    line_values = [v for _, values in lines for v in values if v is not None]
    peak = max([*totals, *line_values, 0.0])
    y_max = _nice(peak) if peak > 0 else 1.0
    slot = (right - left) / n
    bar_width = max(slot * 0.8, 0.5)

    def y(value: float) -> float:
        return round(bottom - value * (bottom - top) / y_max, 1)

    bars: list[Bar] = []
    for i in range(len(labels)):
        base = 0.0
        for index, (name, values) in enumerate(stacks):
            value = values[i]
            if value <= 0:
                continue
            y_top, y_base = y(base + value), y(base)
            bars.append(
                Bar(
                    x=round(left + i * slot + (slot - bar_width) / 2, 1),
                    y=y_top,
                    width=round(bar_width, 1),
                    height=round(max(y_base - y_top, 0.5), 1),
                    colour=COLOURS[index % len(COLOURS)],
                    title=f"{labels[i]} · {name}: {_label(value, money)}",
                )
            )
            base += value
    paths = []
    for index, (name, line) in enumerate(lines):
        points = [
            (round(left + i * slot + slot / 2, 1), y(v))
            for i, v in enumerate(line)
            if v is not None
        ]
        path = " ".join(f"{'M' if k == 0 else 'L'}{px},{py}" for k, (px, py) in enumerate(points))
        paths.append((path, COLOURS[(index * 4) % len(COLOURS)], name))
    y_ticks = tuple((y(y_max * k / 4), _label(y_max * k / 4, money)) for k in range(5))
    step = max(n // x_tick_count, 1)
    x_ticks = tuple(
        (round(left + i * slot + slot / 2, 1), labels[i]) for i in range(0, len(labels), step)
    )
    return Chart(
        width=width,
        height=height,
        bars=tuple(bars),
        lines=tuple(paths),
        y_ticks=y_ticks,
        x_ticks=x_ticks,
        plot_left=left,
        plot_right=right,
        plot_bottom=bottom,
    )
