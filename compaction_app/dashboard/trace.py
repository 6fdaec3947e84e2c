"""The session page's conversation trace: ledger events grouped the way people read them.

Pure module (no ORM, no settings): it takes event records in `seq` order and returns entries —
one chat bubble per turn, a tool call and its results as one span, and the events a compaction
folded kept in place as one greyed group. The view loads the events; the template renders the
entries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol

from sessions_app.event_types import EventType

# Content longer than this shows its first lines with a "show all" control.
CLAMP_LINES = 6
CLAMP_CHARS = 900
# What "show all" reveals at most (the API has the rest).
FULL_CHARS = 20_000
# The newest entries are open; older ones are one summary line each until clicked.
EXPANDED_TAIL = 3


class TraceEvent(Protocol):
    seq: int
    type: str
    name: str
    tool_call_id: str
    content: str
    token_count: int
    compacted_by_id: Any
    cleared_content: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    reverted: bool
    pinned: bool


LABELS = {
    EventType.SYSTEM_PROMPT: "System prompt",
    EventType.USER_MESSAGE: "You",
    EventType.AGENT_MESSAGE: "Agent",
    EventType.TOOL_RESULT: "Tool result",
    EventType.LOCAL_SYSTEM_MESSAGE: "Note (not sent to the model)",
    EventType.COMPACTION: "Summary",
    EventType.CONTEXT_REFRESH: "Context refresh",
}
# CSS side of the bubble: the user on the right, everything else on the left.
SIDES = {EventType.USER_MESSAGE: "user", EventType.CONTEXT_REFRESH: "user"}


def _first_line(text: str, limit: int = 110) -> str:
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


@dataclass
class Body:
    """One piece of content: its clamped preview, and the rest behind "show all"."""

    text: str
    preview: str
    clamped: bool
    truncated: bool
    lines: int

    @classmethod
    def of(cls, text: str) -> Body:
        lines = text.splitlines()
        clamped = len(lines) > CLAMP_LINES or len(text) > CLAMP_CHARS
        preview = "\n".join(lines[:CLAMP_LINES])[:CLAMP_CHARS] if clamped else text
        return cls(
            text=text[:FULL_CHARS],
            preview=preview,
            clamped=clamped,
            truncated=len(text) > FULL_CHARS,
            lines=len(lines),
        )


@dataclass
class Entry:
    """One bubble (a turn) or one tool span (a call with its results)."""

    event: Any
    kind: str  # turn | tool | summary | marker
    label: str
    side: str
    results: list[Any] = field(default_factory=list)
    open: bool = True
    cost: Decimal | None = None
    run: Any = None
    # A folded event's compaction: the seq of its marker (the summary that holds it now, as
    # the chart names runs) and the run, for the entry's "folded at #n" badge.
    folded_at: int | None = None
    folded_run: Any = None

    @property
    def is_group(self) -> bool:
        return False

    @property
    def is_run(self) -> bool:
        return False

    @property
    def seq(self) -> int:
        return int(self.event.seq)

    @property
    def tokens(self) -> int:
        return int(self.event.token_count) + sum(int(r.token_count) for r in self.results)

    @property
    def body(self) -> Body:
        event = self.event
        return Body.of(
            event.cleared_content if event.cleared_content is not None else event.content
        )

    @property
    def original(self) -> Body | None:
        """A cleared tool result's original text (the model sees the placeholder)."""
        if self.event.cleared_content is None:
            return None
        return Body.of(self.event.content)

    @property
    def result_bodies(self) -> list[tuple[Any, Body]]:
        return [
            (r, Body.of(r.cleared_content if r.cleared_content is not None else r.content))
            for r in self.results
        ]

    @property
    def headline(self) -> str:
        """The one line a collapsed entry shows."""
        if self.kind == "tool" and self.results:
            return _first_line(self.results[0].content) or _first_line(self.event.content)
        return _first_line(self.event.content)

    @property
    def folded(self) -> bool:
        return self.event.compacted_by_id is not None

    @property
    def superseded(self) -> bool:
        """An older summary a later compaction folded: the newer summary carries its content,
        so the page shows its first lines only (the API and "show all" have the text)."""
        return self.folded and self.kind == "summary"


@dataclass
class FoldGroup:
    """Consecutive events one compaction folded, kept where they happened."""

    marker_id: Any
    entries: list[Entry]
    marker_seq: int | None = None
    summarized: bool = True

    @property
    def is_group(self) -> bool:
        return True

    @property
    def is_run(self) -> bool:
        return False

    @property
    def seq(self) -> int:
        return self.entries[0].seq

    @property
    def event_count(self) -> int:
        return sum(1 + len(entry.results) for entry in self.entries)

    @property
    def tokens(self) -> int:
        return sum(entry.tokens for entry in self.entries)

    @property
    def first_seq(self) -> int:
        return self.entries[0].seq

    @property
    def last_seq(self) -> int:
        last = self.entries[-1]
        return max([last.seq, *(int(r.seq) for r in last.results)])


@dataclass
class FoldRun:
    """A stretch of the timeline that several compactions folded in turn: their fold groups
    and the few messages kept in context between them (a summarized session keeps the user's
    turns), shown as one expandable row instead of one "folded" row per compaction."""

    items: list[Entry | FoldGroup]

    @property
    def is_group(self) -> bool:
        return False

    @property
    def is_run(self) -> bool:
        return True

    @property
    def groups(self) -> list[FoldGroup]:
        return [item for item in self.items if isinstance(item, FoldGroup)]

    @property
    def compactions(self) -> int:
        return len({group.marker_id for group in self.groups})

    @property
    def event_count(self) -> int:
        return sum(group.event_count for group in self.groups)

    @property
    def kept_count(self) -> int:
        return sum(1 for item in self.items if isinstance(item, Entry))

    @property
    def tokens(self) -> int:
        return sum(group.tokens for group in self.groups)

    @property
    def seq(self) -> int:
        return self.items[0].seq

    @property
    def first_seq(self) -> int:
        return self.items[0].seq

    @property
    def last_seq(self) -> int:
        last = self.items[-1]
        return last.last_seq if isinstance(last, FoldGroup) else last.seq

    @property
    def summarized(self) -> bool:
        return any(group.summarized for group in self.groups)


Item = Entry | FoldGroup | FoldRun


def collapse_fold_runs(items: Sequence[Item], *, min_groups: int = 2) -> list[Item]:
    """Join each stretch that starts and ends with a fold group, holding only fold groups and
    plain turns in between, into one FoldRun when it spans `min_groups` groups or more."""
    out: list[Item] = []
    index = 0
    while index < len(items):
        item = items[index]
        if not isinstance(item, FoldGroup):
            out.append(item)
            index += 1
            continue
        end = index
        probe = index + 1
        while probe < len(items):
            nxt = items[probe]
            if isinstance(nxt, FoldGroup):
                end = probe
            elif not (isinstance(nxt, Entry) and nxt.kind == "turn" and not nxt.open):
                break
            probe += 1
        stretch = [x for x in items[index : end + 1] if isinstance(x, Entry | FoldGroup)]
        if sum(isinstance(x, FoldGroup) for x in stretch) >= min_groups:
            out.append(FoldRun(items=stretch))
        else:
            out.extend(items[index : end + 1])
        index = end + 1
    return out


def _entry(event: Any, *, cost_of: Callable[[Any], Decimal | None]) -> Entry:
    kind = "turn"
    label = LABELS.get(event.type, event.type)
    if event.type == EventType.TOOL_CALL:
        kind = "tool"
        label = f"Tool: {event.name}" if event.name else "Tool call"
    elif event.type == EventType.TOOL_RESULT:
        label = f"Tool result: {event.name}" if event.name else "Tool result"
    elif event.type == EventType.COMPACTION:
        kind = "summary" if event.content else "marker"
        label = "Summary" if event.content else "Trim marker"
    return Entry(
        event=event,
        kind=kind,
        label=label,
        side=SIDES.get(event.type, "other"),
        cost=cost_of(event),
    )


def build_trace(
    events: Sequence[Any],
    *,
    runs_by_marker: dict[Any, Any] | None = None,
    marker_seqs: dict[Any, int] | None = None,
    cost_of: Callable[[Any], Decimal | None] = lambda event: None,
    expanded_tail: int = EXPANDED_TAIL,
) -> list[Item]:
    """Entries in `seq` order. A TOOL_CALL takes the TOOL_RESULTs with its `tool_call_id` into
    its span (wherever they sit, as parallel calls interleave); a result without a call stands
    alone. Consecutive events folded by the same compaction become one group at their own
    place. The newest `expanded_tail` top-level entries are open, the rest collapsed."""
    runs_by_marker = runs_by_marker or {}
    marker_seqs = marker_seqs or {}
    calls: dict[tuple[Any, str], Entry] = {}
    flat: list[Entry] = []
    for event in events:
        if event.type == EventType.TOOL_RESULT and event.tool_call_id:
            owner = calls.get((event.compacted_by_id, event.tool_call_id))
            if owner is not None:
                owner.results.append(event)
                continue
        entry = _entry(event, cost_of=cost_of)
        if event.type == EventType.COMPACTION:
            entry.run = runs_by_marker.get(event.id) if hasattr(event, "id") else None
        if event.type == EventType.TOOL_CALL and event.tool_call_id:
            calls[(event.compacted_by_id, event.tool_call_id)] = entry
        flat.append(entry)

    items: list[Item] = []
    for entry in flat:
        marker = entry.event.compacted_by_id
        if marker is None:
            items.append(entry)
            continue
        entry.folded_at = marker_seqs.get(marker)
        entry.folded_run = runs_by_marker.get(marker)
        last = items[-1] if items else None
        if isinstance(last, FoldGroup) and last.marker_id == marker:
            last.entries.append(entry)
        else:
            run = runs_by_marker.get(marker)
            items.append(
                FoldGroup(
                    marker_id=marker,
                    entries=[entry],
                    marker_seq=marker_seqs.get(marker),
                    summarized=run is None or getattr(run, "strategy", "") != "trim",
                )
            )
    top_level = [item for item in items if isinstance(item, Entry)]
    for index, entry in enumerate(top_level):
        entry.open = index >= len(top_level) - expanded_tail
    for item in items:
        if isinstance(item, FoldGroup):
            for entry in item.entries:
                entry.open = False
    return collapse_fold_runs(items)
