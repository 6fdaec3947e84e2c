"""The dashboard chart's series math (pure: no database, no Django)."""

from __future__ import annotations

import pytest

from compaction_app.dashboard.chart import (
    REPLY_PRIMER,
    ChartCompaction,
    ChartEvent,
    Point,
    _crosses,
    chart_geometry,
    context_series,
    downsample,
)

pytestmark = pytest.mark.profile_independent


def test_it_accumulates_visible_event_tokens_with_the_reply_primer():
    series = context_series(
        events=[ChartEvent(1, 10), ChartEvent(2, 5, visible=False), ChartEvent(3, 20)]
    )
    assert [(p.seq, p.tokens) for p in series.points] == [
        (1, 10 + REPLY_PRIMER),
        (3, 30 + REPLY_PRIMER),
    ]
    assert series.marks == ()


def test_it_drops_to_tokens_after_at_a_compaction_and_marks_the_tokens_freed():
    events = [ChartEvent(seq, 100) for seq in range(1, 6)] + [ChartEvent(6, 40), ChartEvent(7, 50)]
    run = ChartCompaction(seq=6, tokens_before=503, tokens_after=143, label="summarize · manual")
    series = context_series(events=events, compactions=[run])
    values = [(p.seq, p.tokens) for p in series.points]
    # The vertical drop: the size just before the run, then the run's result, at the same seq.
    assert (6, 503) in values and (6, 143) in values
    assert values.index((6, 503)) + 1 == values.index((6, 143))
    # The marker event's own tokens are part of tokens_after, not added again.
    assert values[-1] == (7, 143 + 50)
    (mark,) = series.marks
    assert (mark.seq, mark.freed, mark.label) == (6, 360, "summarize · manual")


def test_it_does_not_count_a_refresh_event_the_run_already_counted():
    events = [ChartEvent(1, 300), ChartEvent(2, 60), ChartEvent(3, 20), ChartEvent(4, 7)]
    run = ChartCompaction(seq=2, tokens_before=303, tokens_after=86, covers_through=3)
    series = context_series(events=events, compactions=[run])
    assert series.points[-1] == Point(4, 93)


def test_it_starts_from_zero_when_a_compaction_empties_the_context():
    series = context_series(
        events=[ChartEvent(1, 50), ChartEvent(2, 0), ChartEvent(3, 10)],
        compactions=[ChartCompaction(seq=2, tokens_before=53, tokens_after=0)],
    )
    assert series.points[-1] == Point(3, 10 + REPLY_PRIMER)


def test_it_downsamples_to_at_most_max_points_keeping_ends_and_compaction_drops():
    events = [ChartEvent(seq, 10) for seq in range(1, 5001)]
    runs = [ChartCompaction(seq=s, tokens_before=1, tokens_after=100) for s in (1000, 2500, 4000)]
    series = context_series(events=events, compactions=runs, max_points=300)
    assert len(series.points) <= 300
    seqs = [p.seq for p in series.points]
    assert seqs == sorted(seqs)
    assert seqs[0] == 1 and seqs[-1] == 5000
    for seq in (1000, 2500, 4000):
        assert seqs.count(seq) == 2  # both ends of each drop survive
    assert len(series.marks) == 3


def test_it_keeps_short_series_whole_and_refuses_a_silly_budget():
    points = [Point(i, i) for i in range(10)]
    assert downsample(points, max_points=300) == points
    assert len(downsample(points, max_points=4)) == 4
    with pytest.raises(ValueError):
        downsample(points, max_points=1)


def test_it_scales_the_series_into_the_svg_box():
    series = context_series(
        events=[ChartEvent(1, 100), ChartEvent(2, 100), ChartEvent(3, 50)],
        compactions=[ChartCompaction(seq=3, tokens_before=203, tokens_after=60)],
    )
    geometry = chart_geometry(series=series, limit=1000, width=400, height=200)
    assert geometry.path.startswith("M")
    assert geometry.limit_y == geometry.plot_top  # the limit is the top of a 1,000 axis
    ((x, y_before, y_after, mark),) = geometry.marks
    assert x == geometry.plot_right and y_before < y_after and mark.freed == 143
    assert geometry.y_ticks[0] == (geometry.plot_bottom, 0)
    assert all(geometry.plot_left <= tx <= geometry.plot_right for tx, _ in geometry.x_ticks)


def test_it_scales_the_y_axis_to_the_limit_with_round_ticks():
    series = context_series(events=[ChartEvent(1, 50_000), ChartEvent(2, 30_000)])
    geometry = chart_geometry(series=series, limit=128_000)
    assert geometry.limit_y == geometry.plot_top  # not a 200,000 axis for a 128k window
    assert [value for _, value in geometry.y_ticks] == [0, 50_000, 100_000]
    over = chart_geometry(series=series, limit=60_000)
    assert over.limit_y is not None and over.limit_y > over.plot_top  # over its limit: stretched


def test_it_draws_a_line_per_threshold():
    series = context_series(events=[ChartEvent(1, 10)])
    geometry = chart_geometry(
        series=series, limit=1000, thresholds=[(0.8, "compact 80 %"), (0.95, "hard limit 95 %")]
    )
    (compact, hard) = geometry.thresholds
    assert compact[1:] == ("compact 80 %", "threshold-0") and hard[1] == "hard limit 95 %"
    assert geometry.plot_top < hard[0] < compact[0] < geometry.plot_bottom


def test_it_offers_a_time_axis_and_falls_back_to_seq_without_times():
    base = 1_800_000_000.0
    series = context_series(
        events=[
            ChartEvent(1, 10, at=base),
            ChartEvent(2, 10, at=base + 60),
            ChartEvent(3, 10, at=base + 3600),
        ]
    )
    geometry = chart_geometry(series=series, limit=100, axis="time", x_tick_count=2)
    assert geometry.axis == "time"
    xs = [x for x, _ in geometry.x_ticks]
    assert [label for _, label in geometry.x_ticks] == ["14:00", "15:00"] or all(
        ":" in label for _, label in geometry.x_ticks
    )
    assert xs[0] == geometry.plot_left and xs[-1] == geometry.plot_right
    # Event 2 sits near the left on a time axis (one minute of an hour), mid-way by seq.
    path_x = [float(part[1:].split(",")[0]) for part in geometry.path.split()]
    assert path_x[1] < geometry.plot_left + 30
    untimed = context_series(events=[ChartEvent(1, 10), ChartEvent(2, 10)])
    assert chart_geometry(series=untimed, limit=100, axis="time").axis == "seq"


@pytest.mark.parametrize("seconds", [0.4, 0.55, 0.9, 20.0])
def test_it_labels_a_session_stored_within_a_minute_once_and_inside_its_range(seconds):
    # A session written in well under a second (a fast test, a bulk import): the axis scales
    # over at least one second, but its ticks stay on the points' range and do not repeat
    # `02:38` at nearly the same place.
    base = 1_800_000_000.0
    series = context_series(events=[ChartEvent(k, 10, at=base + seconds * k / 5) for k in range(6)])
    geometry = chart_geometry(series=series, limit=100, axis="time", x_tick_count=3)
    labels = [label for _, label in geometry.x_ticks]
    xs = [x for x, _ in geometry.x_ticks]
    assert len(labels) == len(set(labels)) >= 1
    assert all(geometry.plot_left <= x <= geometry.plot_right for x in xs)
    path_x = [float(part[1:].split(",")[0]) for part in geometry.path.split()]
    assert max(xs) <= max(path_x)


def _segments(geometry) -> list[tuple[float, float, float, float]]:
    """The data line's segments, and each threshold's and the limit's line."""
    points = [tuple(map(float, part[1:].split(","))) for part in geometry.path.split()]
    lines = [y for y, _, _ in geometry.thresholds] + (
        [geometry.limit_y] if geometry.limit_y is not None else []
    )
    return [(a[0], a[1], b[0], b[1]) for a, b in zip(points, points[1:], strict=False)] + [
        (geometry.plot_left, y, geometry.plot_right, y) for y in lines
    ]


def test_it_places_the_line_labels_off_the_data_line_and_each_other():
    """A context that climbs through the thresholds' left ends: their labels move along
    their lines (or above them) to where nothing crosses them; the limit's too."""
    events = [ChartEvent(seq, 784 if seq == 1 else 2) for seq in range(1, 40)]
    series = context_series(events=events)
    thresholds = [(0.8, "compact 80 %"), (0.95, "hard limit 95 %")]
    for width, left in ((720, 56), (360, 60)):
        geometry = chart_geometry(
            series=series, limit=1000, thresholds=thresholds, width=width, pad_left=left
        )
        assert len(geometry.threshold_labels) == 2 and geometry.limit_label is not None
        boxes = [
            (x, y - 11, x + len(text) * 7.0, y + 2) for x, y, text, _ in geometry.threshold_labels
        ]
        end, baseline, text = geometry.limit_label
        boxes.append((end - len(text) * 7.0, baseline - 11, end, baseline + 2))
        for index, box in enumerate(boxes):
            assert not any(_crosses(box, segment) for segment in _segments(geometry)[:-3])
            for other in boxes[index + 1 :]:
                assert not (
                    box[0] < other[2]
                    and other[0] < box[2]
                    and box[1] < other[3]
                    and other[1] < box[3]
                )
        # The compact label left its usual place (the line climbs through it there).
        assert geometry.threshold_labels[0][0] > geometry.plot_left + 4 or (
            geometry.threshold_labels[0][1] < geometry.thresholds[0][0]
        )


def _boxes(geometry) -> list[tuple[float, float, float, float]]:
    from compaction_app.dashboard.chart import CHAR_WIDTH, LABEL_HEIGHT, LABEL_PAD

    return [
        (
            x - (len(text) * CHAR_WIDTH + LABEL_PAD) / 2,
            y - LABEL_HEIGHT + 1,
            x + (len(text) * CHAR_WIDTH + LABEL_PAD) / 2,
            y + 2,
        )
        for x, y, text in geometry.mark_labels
    ]


@pytest.mark.parametrize("axis", ["seq", "time"])
def test_it_draws_only_drop_labels_that_overlap_nothing(axis):
    # Twelve compactions after an idle gap: by time they stand almost on one x.
    events = [ChartEvent(seq, 20, at=1000.0 if seq < 3 else 90_000.0 + seq) for seq in range(1, 40)]
    runs = [
        ChartCompaction(seq=seq, tokens_before=760, tokens_after=400, at=90_000.0 + seq)
        for seq in range(5, 29, 2)
    ]
    series = context_series(events=events, compactions=runs)
    thresholds = [(0.8, "compact 80 %"), (0.95, "hard limit 95 %")]
    geometry = chart_geometry(series=series, limit=1000, thresholds=thresholds, axis=axis)
    assert len(geometry.marks) == 12
    boxes = _boxes(geometry)
    assert boxes, "the newest drop keeps its label"
    for index, box in enumerate(boxes):
        for other in boxes[index + 1 :]:
            assert not (
                box[0] < other[2] and other[0] < box[2] and box[1] < other[3] and other[1] < box[3]
            )
        for x, y, label, _ in geometry.threshold_labels:
            label_box = (x, y - 11, x + len(label) * 7.0, y + 2)
            assert not (
                box[0] < label_box[2]
                and label_box[0] < box[2]
                and box[1] < label_box[3]
                and label_box[1] < box[3]
            )
        # Nor on a line: the data line, a threshold's or the limit's.
        assert not any(_crosses(box, segment) for segment in _segments(geometry))
        assert box[0] >= 0 and box[2] <= geometry.width
        # Nor on any mark's line or dot (a label there reads as crossed out).
        for x, y_before, y_after, _ in geometry.marks:
            for glyph in (
                (x - 1.5, y_before, x + 1.5, y_after),
                (x - 4, y_after - 4, x + 4, y_after + 4),
            ):
                assert not (
                    box[0] < glyph[2]
                    and glyph[0] < box[2]
                    and box[1] < glyph[3]
                    and glyph[1] < box[3]
                )
    if axis == "time":
        # Collapsed onto one x: the labels stack beside the column, left and right of it,
        # rather than all but the newest giving way.
        assert 2 <= len(boxes) < 12
        centres = {round(x) for x, _, _ in geometry.mark_labels}
        assert len(centres) >= 2
