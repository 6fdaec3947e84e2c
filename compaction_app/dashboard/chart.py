"""Context-size history of a session, for the dashboard's server-side SVG chart.

Pure module: no Django, no ORM. The view turns stored events and compaction runs into the
plain records below; everything here is arithmetic.

The series replays the ledger in `seq` order: each model-visible event adds its stored token
count, and a completed (not reverted) compaction sets the context to the run's `tokens_after`
at the seq of its COMPACTION event. That is the size the context had at each point of the
session's life, which the current counters alone cannot tell.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

# A context that holds any message also pays the reply primer.
from sessions_app.tokens import REPLY_PRIMER

__all__ = [
    "REPLY_PRIMER",
    "CallInput",
    "InputBar",
    "input_bars",
    "ChartCompaction",
    "ChartEvent",
    "ChartGeometry",
    "Mark",
    "Point",
    "Series",
    "chart_geometry",
    "context_series",
    "downsample",
    "stitched_series",
]


@dataclass(frozen=True)
class ChartEvent:
    seq: int
    tokens: int
    # False for events never sent to the model (LOCAL_SYSTEM_MESSAGE, trim markers, reverted
    # compaction markers): they do not change the context's size.
    visible: bool = True
    # When it was stored (seconds since the epoch), for the chart's time axis.
    at: float | None = None


@dataclass(frozen=True)
class ChartCompaction:
    """A completed, not reverted run, placed at the seq of the COMPACTION event it appended.
    `covers_through` is the last seq the run itself appended (a refresh run appends a
    CONTEXT_REFRESH event right after its marker; `tokens_after` already counts it)."""

    seq: int
    tokens_before: int
    tokens_after: int
    covers_through: int | None = None
    label: str = ""
    # When its COMPACTION event was stored (seconds since the epoch), for the time axis.
    at: float | None = None


@dataclass(frozen=True)
class Point:
    seq: int
    tokens: int
    at: float | None = None


@dataclass(frozen=True)
class Mark:
    seq: int
    tokens_before: int
    tokens_after: int
    label: str = ""

    @property
    def freed(self) -> int:
        return max(self.tokens_before - self.tokens_after, 0)


@dataclass(frozen=True)
class Series:
    points: tuple[Point, ...]
    marks: tuple[Mark, ...]
    # How many runs the marks stand for (a long session's marks are buckets of runs).
    run_count: int | None = None

    @property
    def runs(self) -> int:
        return self.run_count if self.run_count is not None else len(self.marks)

    @property
    def max_tokens(self) -> int:
        values = [p.tokens for p in self.points] + [m.tokens_before for m in self.marks]
        return max(values, default=0)


def context_series(
    *,
    events: Sequence[ChartEvent],
    compactions: Sequence[ChartCompaction] = (),
    max_points: int = 300,
) -> Series:
    """Context tokens after each event, with a drop at each compaction, at most `max_points`
    points (compaction drops are kept whenever the budget allows)."""
    by_seq = {c.seq: c for c in compactions}
    skip_until = 0
    total = 0
    count = 0
    points: list[Point] = []
    anchors: set[int] = set()
    marks: list[Mark] = []
    for event in sorted(events, key=lambda e: e.seq):
        run = by_seq.get(event.seq)
        if run is not None:
            before = total + REPLY_PRIMER if count else 0
            # Draw a vertical drop: the size just before the run, then just after it.
            anchors.add(len(points))
            points.append(Point(event.seq, before, event.at))
            anchors.add(len(points))
            points.append(Point(event.seq, run.tokens_after, event.at))
            marks.append(Mark(event.seq, run.tokens_before, run.tokens_after, run.label))
            count = 1 if run.tokens_after else 0
            total = max(run.tokens_after - REPLY_PRIMER, 0) if count else 0
            skip_until = run.covers_through or event.seq
            continue
        if event.seq <= skip_until or not event.visible:
            continue
        total += event.tokens
        count += 1
        points.append(Point(event.seq, total + REPLY_PRIMER, event.at))
    return Series(
        points=tuple(downsample(points, max_points=max_points, keep=anchors)), marks=tuple(marks)
    )


def stitched_series(
    *,
    compactions: Sequence[ChartCompaction],
    tail: Sequence[ChartEvent],
    tail_base: int,
    start: Point | None = None,
    max_points: int = 300,
) -> Series:
    """The context history from stored per-run aggregates instead of every event: a point
    before and after each compaction (its tokens_before / tokens_after), then the events
    since the last one replayed exactly on top of `tail_base` (the active tokens before the
    first of them). Between two compactions the line runs straight from one run's "after" to
    the next run's "before"; the drawing costs O(runs + tail), not O(events)."""
    points: list[Point] = [start] if start is not None else []
    anchors: set[int] = set()
    marks: list[Mark] = []
    for run in sorted(compactions, key=lambda c: c.seq):
        anchors.add(len(points))
        points.append(Point(run.seq, run.tokens_before, run.at))
        anchors.add(len(points))
        points.append(Point(run.seq, run.tokens_after, run.at))
        marks.append(Mark(run.seq, run.tokens_before, run.tokens_after, run.label))
    skip_until = max((c.covers_through or c.seq for c in compactions), default=0)
    total = tail_base
    for event in sorted(tail, key=lambda e: e.seq):
        if event.seq <= skip_until or not event.visible:
            continue
        total += event.tokens
        points.append(Point(event.seq, total + REPLY_PRIMER, event.at))
    return Series(
        points=tuple(downsample(points, max_points=max_points, keep=anchors)), marks=tuple(marks)
    )


def downsample(
    points: Sequence[Point], *, max_points: int, keep: set[int] | None = None
) -> list[Point]:
    """At most `max_points` of `points`, in order: the first and last, the indices in `keep`
    (while they fit), and evenly spaced others."""
    n = len(points)
    if max_points < 2:
        raise ValueError("max_points must be at least 2")
    if n <= max_points:
        return list(points)
    chosen = {0, n - 1}
    anchors = sorted(i for i in (keep or set()) if 0 < i < n - 1)
    room = max_points - len(chosen)
    if len(anchors) > room:
        step = len(anchors) / room
        anchors = [anchors[int(k * step)] for k in range(room)]
    chosen.update(anchors)
    room = max_points - len(chosen)
    if room > 0:
        step = (n - 1) / (room + 1)
        for k in range(1, room + 1):
            chosen.add(round(k * step))
            if len(chosen) >= max_points:
                break
    return [points[i] for i in sorted(chosen)[:max_points]]


@dataclass(frozen=True)
class ChartGeometry:
    """Screen coordinates for an SVG of `width` × `height` with the given padding."""

    width: int
    height: int
    path: str
    area: str
    limit_y: float | None
    marks: tuple[tuple[float, float, float, Mark], ...]  # x, y_before, y_after, mark
    y_ticks: tuple[tuple[float, int], ...]
    x_ticks: tuple[tuple[float, str], ...]
    plot_left: int
    plot_right: int
    plot_top: int
    plot_bottom: int
    # Horizontal lines at the session's thresholds: y, label, css class.
    thresholds: tuple[tuple[float, str, str], ...] = ()
    axis: str = "seq"
    # The drop labels drawn ("−1,234" above a mark, or beside it): x (middle), y (baseline),
    # text. Only those that overlap no other label, no line (threshold, limit, data) and no
    # mark (place_mark_labels).
    mark_labels: tuple[tuple[float, float, str], ...] = ()
    # The thresholds' labels, each where it crosses no line and no other label: x (start), y
    # (baseline), text, css class; a label with no free place is left out (the gauge's legend
    # names the thresholds too).
    threshold_labels: tuple[tuple[float, float, str, str], ...] = ()
    # The limit's label ("limit 128,000"): x (end), y (baseline), text; None when no free place.
    limit_label: tuple[float, float, str] | None = None


# Label boxes are estimated in the viewBox's units (the SVG scales as a whole): the CSS sets
# the drop labels at 11 px bold and the axis labels at 10-11 px; a digit or comma is at most
# this wide at 11 px bold.
CHAR_WIDTH = 7.0
LABEL_HEIGHT = 12.0
# Room around a drop label's text, so two labels side by side keep a gap the eye sees (the
# minus sign is wider than a digit, and fonts differ).
LABEL_PAD = 6.0

Box = tuple[float, float, float, float]  # left, top, right, bottom


def _overlaps(a: Box, b: Box) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _label_half_width(text: str) -> float:
    return (len(text) * CHAR_WIDTH + LABEL_PAD) / 2


def _label_box(center_x: float, baseline: float, text: str) -> Box:
    half = _label_half_width(text)
    return (center_x - half, baseline - LABEL_HEIGHT + 1, center_x + half, baseline + 2)


Segment = tuple[float, float, float, float]  # x1, y1, x2, y2
# Half the data line's stroke, and a little air: a label this close reads as struck through.
LINE_CLEARANCE = 2.0


def _crosses(box: Box, segment: Segment) -> bool:
    """Whether the segment passes through the box (Liang–Barsky clipping), the box grown by
    the line's clearance."""
    left, top, right, bottom = (
        box[0] - LINE_CLEARANCE,
        box[1] - LINE_CLEARANCE,
        box[2] + LINE_CLEARANCE,
        box[3] + LINE_CLEARANCE,
    )
    x1, y1, x2, y2 = segment
    dx, dy = x2 - x1, y2 - y1
    start, end = 0.0, 1.0
    for p, q in ((-dx, x1 - left), (dx, right - x1), (-dy, y1 - top), (dy, bottom - y1)):
        if p == 0:
            if q < 0:
                return False
            continue
        u = q / p
        if p < 0:
            start = max(start, u)
        else:
            end = min(end, u)
        if start > end:
            return False
    return True


def _free(box: Box, taken: Sequence[Box], segments: Sequence[Segment]) -> bool:
    return not any(_overlaps(box, other) for other in taken) and not any(
        _crosses(box, segment) for segment in segments
    )


def place_line_labels(
    *,
    lines: Sequence[tuple[float, str, str]],
    limit: tuple[float, str] | None,
    taken: list[Box],
    segments: Sequence[Segment],
    left: float,
    right: float,
    top: float,
    bottom: float,
) -> tuple[tuple[tuple[float, float, str, str], ...], tuple[float, float, str] | None]:
    """Places for the threshold labels and the limit's: for each, the first spot along its
    line (below it, then above it; from the left, then the right, then between) where it
    crosses no line and no label placed before it. Boxes placed are added to `taken`."""
    placed: list[tuple[float, float, str, str]] = []
    # A line label's box from its baseline: the axis font (up to 12 px on the phone's
    # drawing) rises about 11 px above it and descends 3 below; a pixel of air each way.
    rise, fall = 12.0, 4.0

    def spot(y: float, text: str) -> tuple[float, float] | None:
        width = len(text) * CHAR_WIDTH + 2
        starts = [left + 4, right - 4 - width]
        span = right - 4 - width - (left + 4)
        if span > 0:
            starts += [left + 4 + span * k / 6 for k in range(1, 6)]
        # Below the line (the box's top clear of it), then above it.
        for baseline in (y + rise + 2, y - fall - 2):
            for start in starts:
                box = (start - 1, baseline - rise, start + width, baseline + fall)
                if box[1] < top - 12 or box[3] > bottom or box[0] < 0:
                    continue
                if _free(box, taken, segments):
                    taken.append(box)
                    return start, baseline
        return None

    for y, text, css in lines:
        where = spot(y, text)
        if where is not None:
            placed.append((round(where[0], 1), round(where[1], 1), text, css))
    limit_label = None
    if limit is not None:
        y, text = limit
        width = len(text) * CHAR_WIDTH + 2
        for baseline in (y - fall - 2, y + rise + 2):
            for end in (right, left + 4 + width):
                box = (end - width, baseline - rise, end + 1, baseline + fall)
                if box[1] < -4 or box[3] > bottom:
                    continue
                if _free(box, taken, segments):
                    taken.append(box)
                    limit_label = (round(end, 1), round(baseline, 1), text)
                    break
            if limit_label is not None:
                break
    return tuple(placed), limit_label


def place_mark_labels(
    *,
    marks: Sequence[tuple[float, float, float, Mark]],
    fixed: Sequence[Box],
    width: float,
    height: float | None = None,
    segments: Sequence[Segment] = (),
) -> tuple[tuple[float, float, str], ...]:
    """The drop labels that fit: newest first (the run people look for), each kept only if
    its box overlaps no label already kept, none of the `fixed` boxes (threshold, limit and
    axis labels) and no other mark's line or dot, inside the chart. A label sits above its
    drop; where that is taken it sits beside the drop, left or right of its line, so runs
    close together (twelve in a minute after an idle day, on a time axis) stack their labels
    down the column instead of dropping all but one. No label crosses one of `segments` (the
    data line; its own drop excepted, which the label sits beside). Returned in the marks'
    order; text anchored at its middle."""
    # Every mark's line and dot: a label on them would be read as crossed out.
    glyphs: list[Box] = []
    for x, y_before, y_after, _ in marks:
        glyphs.append((x - 1.5, y_before, x + 1.5, y_after))
        glyphs.append((x - 4.5, y_after - 4.5, x + 4.5, y_after + 4.5))
    kept: list[tuple[int, float, float, str]] = []
    taken: list[Box] = list(fixed) + glyphs
    bottom = height if height is not None else float("inf")
    for index in range(len(marks) - 1, -1, -1):
        x, y_before, y_after, mark = marks[index]
        text = f"−{mark.freed:,}"
        half = _label_half_width(text)
        middle = (y_before + y_after) / 2 + LABEL_HEIGHT / 2 - 2
        candidates = (
            (min(max(x, half), width - half), y_before - 6),  # above the drop
            (x - 6 - half, middle),  # left of its line
            (x + 6 + half, middle),  # right of it
        )
        for center, baseline in candidates:
            box = _label_box(center, baseline, text)
            if box[0] < 0 or box[2] > width or box[1] < 0 or box[3] > bottom:
                continue
            if not _free(box, taken, segments):
                continue
            taken.append(box)
            kept.append((index, round(center, 1), round(baseline, 1), text))
            break
    return tuple((x, baseline, text) for _, x, baseline, text in sorted(kept))


def _nice_ceiling(value: int) -> int:
    if value <= 10:
        return 10
    magnitude = 10 ** (len(str(value)) - 1)
    for step in (1, 2, 2.5, 5, 10):
        candidate = int(step * magnitude)
        if candidate >= value:
            return candidate
    return 10 * magnitude


def _nice_step(raw: float) -> int:
    """The smallest 1, 2, 2.5 or 5 × 10^k at least `raw` (a tick spacing people read)."""
    if raw <= 1:
        return 1
    magnitude = 10 ** (len(str(int(raw))) - 1)
    for step in (1, 2, 2.5, 5, 10):
        if step * magnitude >= raw:
            return int(step * magnitude)
    return 10 * magnitude


def _time_label(at: float, *, span: float) -> str:
    stamp = datetime.fromtimestamp(at, tz=UTC)
    return stamp.strftime("%m-%d %H:%M" if span >= 86_400 else "%H:%M")


def chart_geometry(
    *,
    series: Series,
    limit: int,
    width: int = 720,
    height: int = 200,
    pad_left: int = 56,
    pad_right: int = 40,
    pad_top: int = 18,  # room above the limit line for its label
    pad_bottom: int = 28,
    thresholds: Sequence[tuple[float, str]] = (),
    axis: str = "seq",
    y_tick_count: int = 4,
    x_tick_count: int = 3,
    max_marks: int = 40,
) -> ChartGeometry:
    """Scale a series into an SVG viewBox: a step-free polyline, the limit line, a dashed
    line per threshold (ratio, label) and a vertical marker per compaction.

    The y axis ends at the context limit, so a 128k window reads 0 … 128,000 and the limit line
    is the top of the plot; only a session over its limit stretches it to a round number above.
    With `axis="time"` the x axis is the events' storage time (when every point has one)."""
    left, right = pad_left, width - pad_right
    top, bottom = pad_top, height - pad_bottom
    points = series.points
    peak = max(series.max_tokens, 1)
    y_max = limit if limit and peak <= limit else _nice_ceiling(max(peak, limit))
    use_time = axis == "time" and bool(points) and all(p.at is not None for p in points)

    def coord(point_seq: int, point_at: float | None) -> float:
        return float(point_at) if use_time and point_at is not None else float(point_seq)

    first = coord(points[0].seq, points[0].at) if points else 0.0
    last = coord(points[-1].seq, points[-1].at) if points else 1.0
    span = max(last - first, 1.0)

    def x_of(value: float) -> float:
        return round(left + (value - first) * (right - left) / span, 1)

    def y(tokens: int) -> float:
        return round(bottom - tokens * (bottom - top) / y_max, 1)

    coords = [(x_of(coord(p.seq, p.at)), y(p.tokens)) for p in points]
    path = " ".join(f"{'M' if i == 0 else 'L'}{cx},{cy}" for i, (cx, cy) in enumerate(coords))
    area = f"{path} L{coords[-1][0]},{bottom} L{coords[0][0]},{bottom} Z" if coords else ""
    at_by_seq = {p.seq: p.at for p in points}
    # A long session has thousands of runs: draw at most `max_marks` of them (evenly spread,
    # the newest always), so the SVG's size does not grow with the session.
    drawn = list(series.marks)
    if len(drawn) > max_marks:
        step = len(drawn) / max_marks
        drawn = [drawn[int(k * step)] for k in range(max_marks - 1)] + [drawn[-1]]
    marks = tuple(
        (x_of(coord(m.seq, at_by_seq.get(m.seq))), y(m.tokens_before), y(m.tokens_after), m)
        for m in drawn
    )
    step = _nice_step(y_max / max(y_tick_count, 1))
    y_ticks = tuple((y(value), value) for value in range(0, y_max + 1, step))
    x_ticks: tuple[tuple[float, str], ...] = ()
    if points:
        count = max(x_tick_count, 2)
        # Spread over the points' own range (`span` is at least 1 so a session stored within
        # one second still scales; its ticks must not run past the last point).
        values = [first + (last - first) * k / (count - 1) for k in range(count)]
        if use_time:
            candidates = [(x_of(v), _time_label(v, span=span)) for v in values]
        else:
            candidates = [(x_of(v), f"#{round(v)}") for v in values]
        # A tick that says what the previous one said, or whose label would meet it, is left
        # out (a span of seconds labelled by the minute reads `02:38` once, not three times).
        kept_ticks: list[tuple[float, str]] = []
        for tx, text in candidates:
            if kept_ticks:
                px, ptext = kept_ticks[-1]
                if text == ptext or tx - px < (len(text) + len(ptext)) * CHAR_WIDTH + 4:
                    continue
            kept_ticks.append((tx, text))
        x_ticks = tuple(kept_ticks)
    lines = tuple(
        # Through the window's threshold tokens, as the policy's window level puts them.
        (y(int(limit * ratio)), label, f"threshold-{index}")
        for index, (ratio, label) in enumerate(thresholds)
        if limit and 0 < ratio < 1
    )
    # Nothing may cross a line: the data line, the thresholds' and the limit's (each a thin
    # box), nor the axes' labels (the y ticks right-aligned left of the plot, the x ticks
    # below it).
    segments: list[Segment] = [
        (a[0], a[1], b[0], b[1]) for a, b in zip(coords, coords[1:], strict=False)
    ]
    limit_y = y(limit) if limit else None
    fixed: list[Box] = [(left, ty - 1, right, ty + 1) for ty, _, _ in lines]
    if limit_y is not None:
        fixed.append((left, limit_y - 1, right, limit_y + 1))
    for ty, value in y_ticks:
        text = f"{value:,}"
        fixed.append((left - 6 - len(text) * CHAR_WIDTH, ty - 8, left - 6, ty + 6))
    fixed.extend(
        (tx - len(text) * CHAR_WIDTH, bottom + 6, tx + len(text) * CHAR_WIDTH, bottom + 22)
        for tx, text in x_ticks
    )
    # The marks' lines and dots, for the threshold and limit labels (the drop labels add
    # them themselves).
    glyphs = [
        box
        for x, y_before, y_after, _ in marks
        for box in (
            (x - 1.5, min(y_before, y_after), x + 1.5, max(y_before, y_after)),
            (x - 4.5, y_after - 4.5, x + 4.5, y_after + 4.5),
        )
    ]
    taken = fixed + glyphs
    threshold_labels, limit_label = place_line_labels(
        lines=lines,
        limit=(limit_y, f"limit {limit:,}") if limit_y is not None else None,
        taken=taken,
        segments=segments,
        left=left,
        right=right,
        top=top,
        bottom=bottom,
    )
    # The line labels placed are in `taken` now: the drop labels keep off them too.
    fixed = taken
    return ChartGeometry(
        width=width,
        height=height,
        path=path,
        area=area,
        limit_y=limit_y,
        marks=marks,
        y_ticks=y_ticks,
        x_ticks=x_ticks,
        plot_left=left,
        plot_right=right,
        plot_top=top,
        plot_bottom=bottom,
        thresholds=lines,
        axis="time" if use_time else "seq",
        mark_labels=place_mark_labels(
            marks=marks, fixed=fixed, width=width, height=bottom, segments=segments
        ),
        threshold_labels=threshold_labels,
        limit_label=limit_label,
    )


@dataclass(frozen=True)
class CallInput:
    """One reported provider call's input tokens, and the part read from the provider's
    prompt cache."""

    seq: int
    input_tokens: int
    cached_tokens: int = 0


@dataclass(frozen=True)
class InputBar:
    """A call's bar in the chart's input strip: the cached part stacked under the uncached."""

    x: float
    width: float
    cached_y: float
    cached_height: float
    uncached_y: float
    uncached_height: float
    call: CallInput


def input_bars(
    calls: Sequence[CallInput],
    *,
    width: int = 720,
    height: int = 64,
    pad_left: int = 56,
    pad_right: int = 40,
    pad_top: int = 4,
    pad_bottom: int = 4,
    max_bars: int = 300,
) -> tuple[InputBar, ...]:
    """One bar per call (evenly spaced, at most `max_bars`: a longer session shows every
    n-th call), its height the call's input tokens on a scale of the largest, the cached
    part at the bottom."""
    if not calls:
        return ()
    if len(calls) > max_bars:
        step = len(calls) / max_bars
        calls = [calls[int(k * step)] for k in range(max_bars)]
    left, right = pad_left, width - pad_right
    top, bottom = pad_top, height - pad_bottom
    peak = max(max(c.input_tokens for c in calls), 1)
    slot = (right - left) / len(calls)
    bar = max(round(slot * 0.8, 1), 0.5)
    bars = []
    for index, call in enumerate(calls):
        total = max(call.input_tokens, 0)
        cached = min(max(call.cached_tokens, 0), total)
        full = (bottom - top) * total / peak
        cached_h = round((bottom - top) * cached / peak, 1)
        uncached_h = round(full - cached_h, 1)
        bars.append(
            InputBar(
                x=round(left + index * slot, 1),
                width=bar,
                cached_y=round(bottom - cached_h, 1),
                cached_height=cached_h,
                uncached_y=round(bottom - cached_h - uncached_h, 1),
                uncached_height=uncached_h,
                call=call,
            )
        )
    return tuple(bars)
