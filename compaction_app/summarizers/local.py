"""The offline, deterministic, extractive summarizer (`local`).

No model is called: sentences are picked out of the folded messages by cheap regex scores
(user constraints, decisions and stated state with their numbers, errors, file paths,
identifiers, URLs beat filler), and lines of tool output by how much they tell against the
whole session (`evidence.Salience`: a rare template, rare values, a failure, a command's
outcome; never a bare `$ command` echo), sorted into fixed Markdown sections, merged with the previous summary's sections
(deduplicated), and the highest-priority items are kept within `max_tokens`. Repeats of one
sentence template (same words once paths, identifiers and numbers are removed) lose priority
with each repeat, so boilerplate cannot crowd out one-off facts. Whole items are dropped,
lowest priority first; nothing is cut mid-word.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from compaction_app import relevance
from compaction_app.evidence import (
    CITATION,
    FILE_PATH,
    URL,
    Salience,
    extract,
    parameters_of,
    present_literals,
    quoted_line,
    segmented,
    shape_of,
    template_of,
)
from sessions_app.event_types import EventType
from sessions_app.tokens import truncate_to_tokens

from .base import Summarizer, SummaryMessage, register, score_key

__all__ = ["SECTIONS", "LocalSummarizer"]


SECTIONS: tuple[str, ...] = (
    "Request and intent",
    "Status",
    "Key technical context",
    "Changes made",
    "Issues and solutions",
    "User preferences",
    "Context for continuing",
    "Working state",
)
_REQUEST, _STATUS, _TECH, _CHANGES, _ISSUES, _PREFS, _CONTINUE, _WORKING = SECTIONS
_EMPTY = "None."

# --- scoring -----------------------------------------------------------------------------------

# Paths and URLs are recognised as the evidence extractor recognises them (one definition).
_PATH = FILE_PATH
_IDENT = re.compile(
    r"`[^`\n]{1,80}`|\b[A-Z][a-z0-9]+(?:[A-Z][A-Za-z0-9]*)+\b|\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b"
)
_NUMBER = re.compile(r"\b\d[\d,._:]*\b")
_ERROR = re.compile(
    r"Traceback \(most recent call last\)|\b[A-Z]\w*(?:Error|Exception)\b|\bFAILED\b"
    r"|\b(?:failed|failing|fails|crash(?:ed|es)?|error|exception|broken|regression)\b",
    re.IGNORECASE,
)
_CONSTRAINT = re.compile(
    r"\b(?:never|always|must(?: not)?|do not|don't|avoid|prefer(?:ably)?|make sure|should(?:n't| not)?"
    r"|only use|required?|important|constraint|keep (?:that|this|it) in mind|stay (?:below|under|within)"
    r"|no more than|at most|at least|please (?:do not|don't|use|keep))\b",
    re.IGNORECASE,
)
_DECISION = re.compile(
    r"\b(?:decided|decision|we will|we'll|going with|go with|instead of|chose|opted|switch(?:ed)? to"
    r"|settled on|agreed|confirm(?:ed)?|correction|actually|I was wrong|scratch that|turns out)\b",
    re.IGNORECASE,
)
# Statements of state a continuation must honour: what was chosen, kept, rolled back, pinned,
# retained or limited, and the plan. With their numbers they outrank any routine tool line.
_STATE = re.compile(
    r"\b(?:I (?:chose|picked|decided|went with|settled on)|we(?:'ll| will) (?:keep|use|stay|pin|go)"
    r"|roll(?:ed|ing)? ?back(?: to)?|revert(?:ed|ing)? to|pinn?(?:ed|ing)? (?:to|at)"
    r"|retention|retain(?:ed|ing)?|keep(?:ing)? (?:it|them|only|the last|\d)|limit(?:ed)? (?:to|at)"
    r"|cap(?:ped)? at|the plan(?: is)?|plan:|freeze|budget of|quota of|threshold of)",
    re.IGNORECASE,
)
_CHANGE = re.compile(
    r"\b(?:added|changed|updated|created|fixed|refactored|removed|renamed|implemented|replaced"
    r"|moved|rewrote|wrote|modified|deleted|introduced|migrated|bumped)\b",
    re.IGNORECASE,
)
_CAUSE = re.compile(
    r"\b(?:the (?:problem|issue|cause|bug) (?:is|was)|root cause|caused by|because|workaround"
    r"|fixed by|the fix)\b",
    re.IGNORECASE,
)
_NEXT = re.compile(
    r"\b(?:next|todo|to do|remaining|still need|not yet|will (?:now|then|continue)|then I|follow-up"
    r"|pending)\b",
    re.IGNORECASE,
)
_DONE = re.compile(
    r"\b(?:done|pass(?:es|ed|ing)?|green|complete[d]?|works now|succeed(?:s|ed)?)\b", re.I
)
# Lines of tool output worth keeping: real error lines, not code that merely names an error.
_TOOL_ERROR = re.compile(
    r"Traceback \(most recent call last\)|\b[A-Z]\w*(?:Error|Exception): \S|\bFAILED\b"
    r"|\b\d+ failed\b|\berror: |\bfatal: |\bpanic: "
)
# Literals every `_TOOL_ERROR` match contains: str.find over megabytes of output is far
# faster than the regex's scan (its `\b[A-Z]\w*` branch tries every capitalised word), so the
# regex only runs on the lines these find.
_TOOL_ERROR_NEEDLES = (
    "Traceback (most recent call last)",
    "Error: ",
    "Exception: ",
    "FAILED",
    " failed",
    "error: ",
    "fatal: ",
    "panic: ",
)
_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z`'\"(\[])|\s*\n+\s*")
_BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+")
_FOLDED_SO_FAR = re.compile(r"Folded so far: (\d+) messages")
_REFRESH_PREFIX = "[CONTEXT REFRESH]"

_MAX_ITEM_CHARS = 280
_MAX_TOOL_ERRORS = 12
_MAX_FILES = 6
_TOP_UP_TRIES = 12
# How far the count of a rendering may fall below the sum of its line counts, in tokens: a
# blank line before a heading can merge with the newline before it ("\n\n" is one token),
# so the sum overshoots by 1 at most on o200k; 2 leaves a margin for other vocabularies.
_ESTIMATE_SLACK = 2
_MAX_CALLS = 5
_BOOKKEEPING_MIN_TOKENS = 128


_STRONG_ERROR = re.compile(
    r"Traceback \(most recent call last\)|\b[A-Z]\w*(?:Error|Exception)\b(?=[:(\s])|\bFAILED\b"
)
# Specific literals (ports, ids, versions, counts) and identifiers with digits are what a
# continuation most often needs verbatim and cannot re-derive.
_SPECIFIC = re.compile(r"\b\d{3,}\b|\b[A-Za-z_]+\d+\w*\b|\b\d+\.\d+(?:\.\d+)*\b")


# An identifier with digits in it (`LimitQuotaResolver1418`, `tenant_id_7`) names one specific
# thing a continuation cannot re-derive, worth more than a file path, which later items tend
# to repeat. Matched outside paths (`mod_3.py` is a path) and not in quoted tool output, where
# test ids such as `test_load_run_64` come by the dozen.
_DIGIT_IDENT = re.compile(
    r"\b(?=[A-Za-z_]*\d)(?:[A-Z][a-z0-9]+(?:[A-Z][A-Za-z0-9]*)+|[a-z][a-z0-9]*(?:_[a-z0-9]+)+)\b"
)


_SETTING_LIKE = re.compile(r"\b[A-Z][A-Z0-9_]{2,}=\S")


def _features(text: str) -> int:
    score = 0
    if _PATH.search(text):
        score += 3
    if URL.search(text):
        score += 2
    if _IDENT.search(text):
        score += 2
    if _NUMBER.search(text):
        score += 1
    if _SPECIFIC.search(text):
        score += 2
    if _SETTING_LIKE.search(text):
        score += 3
    return score


# Base priority of an item by section; decisions and real error signatures earn a bonus.
_BASE = {
    "Request and intent": 4,
    "Status": 6,
    "Key technical context": 4,
    "Changes made": 3,
    "Issues and solutions": 4,
    "User preferences": 9,
    "Context for continuing": 6,
    "Working state": 3,
}


_TOOL_LINE = re.compile(r"^[\w.-]+ output: ")
# What a sentence of the conversation's own (not a line of tool output) is worth for being one.
_PROSE_POINTS = 3


def _score(section: str, text: str) -> int:
    """Priority of an item, from its section and text alone.

    Origin-independent on purpose: a previous summary's items are re-scored with this same
    function, so incremental runs rank old and new items consistently.
    """
    score = _BASE[section] + _features(text)
    decision = _DECISION.search(text) is not None
    if not _TOOL_LINE.match(text) and (decision or _STATE.search(text)):
        # A decision or a state in prose ("rolled back to revision 43", "we'll keep 30 days",
        # "we decided to use LedgerLock3014"), more so with the number or name it settles.
        specific = _NUMBER.search(text) or _SPECIFIC.search(text)
        score += 7 if specific else 3
        decision = True
    elif decision:
        score += 3
    strong = _STRONG_ERROR.search(text)
    if strong:
        score += 3
    if (
        not _TOOL_LINE.match(text)
        and _DIGIT_IDENT.search(text)
        and _DIGIT_IDENT.search(_PATH.sub(" ", text))
    ):
        score += 2
    if not _TOOL_LINE.match(text):
        # The agent's and the user's own words are the conversation's reasoning: what was
        # concluded, found, tried, asked. Kept by structure before any tool output (the
        # observations), whatever verbs they use.
        score += _PROSE_POINTS
    if _TOOL_LINE.match(text):
        # Quoted tool output: exception lines matter; a test id marked FAILED much less.
        score -= 4 if strong and "FAILED" not in strong.group() else 8
    return score


_FILLER_START = re.compile(
    r"^(?:ok(?:ay)?|sure|thanks?|thank you|great|cool|nice|perfect|yes|yep|no|alright|got it"
    r"|sounds good|makes sense|let me|i will|i'll|hmm|right)\b",
    re.IGNORECASE,
)


def _is_filler(sentence: str) -> bool:
    """Pleasantries and acknowledgements that carry nothing a continuation needs."""
    if _features(sentence) or _CONSTRAINT.search(sentence) or _STRONG_ERROR.search(sentence):
        return False
    return len(sentence.split()) < 4 or _FILLER_START.match(sentence) is not None


def _clip(text: str) -> str:
    text = " ".join(text.split())
    if len(text) <= _MAX_ITEM_CHARS:
        return text
    cut = text.rfind(" ", 0, _MAX_ITEM_CHARS - 1)
    return text[: cut if cut > 0 else _MAX_ITEM_CHARS - 1] + "…"


def _sentences(text: str) -> list[str]:
    return [s for s in (_BULLET.sub("", p).strip() for p in _SENTENCE_SPLIT.split(text)) if s]


def _key(text: str) -> str:
    return " ".join(text.lower().split()).rstrip(".")


@dataclass
class _Item:
    section: str
    text: str
    score: int
    order: int  # chronological position; previous-summary items come first
    first: int = 0  # seq range the item was seen in (its citation); 0 = unknown
    last: int = 0
    count: int = 1  # > 1 for a collapsed repeated pattern
    spare: bool = False  # a next-best tool line, offered only when the budget has room left


# A line's trailing `… ×N [#a-#b]` (evidence.CITATION, with a count before it).
_CITE = re.compile(r"\s*(?:…\s*)?(?:×(\d+)\s*)?" + CITATION + r"\s*$")
_COUNT_ONLY = re.compile(r"\s*…\s*×(\d+)\s*$")


def split_citation(line: str) -> tuple[str, int, int, int]:
    """`text … ×N [#a-#b]` -> (text, a, b, N); missing parts are 0 (N: 1)."""
    match = _CITE.search(line)
    if match:
        first = int(match.group(2))
        last = int(match.group(3) or first)
        return line[: match.start()].rstrip(" …"), first, last, int(match.group(1) or 1)
    match = _COUNT_ONLY.search(line)
    if match:
        return line[: match.start()], 0, 0, int(match.group(1))
    return line, 0, 0, 1


def _cite(item: _Item) -> str:
    repeat = f" … ×{item.count}" if item.count > 1 else ""
    if not item.first:
        return repeat
    span = f"#{item.first}" if item.last == item.first else f"#{item.first}-#{item.last}"
    return f"{repeat} [{span}]"


class _Collector:
    """Accumulates scored, deduplicated items; the first occurrence keeps its position."""

    def __init__(self) -> None:
        self.items: dict[str, _Item] = {}
        self._order = 0
        # Citations of the previous summary's items, by their text's key.
        self.cites: dict[str, tuple[int, int, int]] = {}
        # Next-best tool-output lines by their text's key, and the template of each (see
        # `add_spare`).
        self.spares: dict[str, _Item] = {}
        self.spare_templates: dict[str, str] = {}

    def add_spare(self, text: str, score: int, *, template: str, seq: int) -> None:
        """Offer a tool-output line below the salient cut, for a budget the salient lines
        leave unused. Every such line is offered, but the lines of one template rank below
        one another by their order of merit (see `_fit`): twenty lines of one listing do not
        take the room of twenty different facts, yet a large budget can hold the listing."""
        text = _clip(text)
        key = _key(text)
        existing = self.spares.get(key)
        if existing is not None and existing.score >= score:
            return
        self._order += 1
        self.spares[key] = _Item(_TECH, text, score, self._order, seq, seq, spare=True)
        self.spare_templates[key] = template

    def add(
        self,
        section: str,
        text: str,
        score: int,
        *,
        seq: int = 0,
        last: int = 0,
        collapse: bool = False,
    ) -> None:
        """Add an item cited at `seq`. `collapse` merges items of one shape (the same line
        with other numbers or quoted values) into one, counting the repeats."""
        text = _clip(text)
        if not text or score <= 0:
            return
        key = _key(text)
        first, last, count = self.cites.get(key, (seq, last or seq, 1))
        if collapse:
            key = "shape:" + shape_of(text)
        self._order += 1
        existing = self.items.get(key)
        if existing is None:
            self.items[key] = _Item(section, text, score, self._order, first, last, count)
            return
        existing.score = max(existing.score, score)
        if first and (not existing.first or first < existing.first):
            existing.first = first
        existing.last = max(existing.last, last)
        if collapse:
            existing.count += count


# --- repeated sentence shapes ------------------------------------------------------------------

# A word is part of a sentence's shape unless it is a specific: anything with a digit, a path
# or dotted name, a snake_case or CamelCase identifier. What is left is the template.
_SHAPE_WORD = re.compile(r"\S+")
_SHAPE_STRIP = "`'\"()[]{}<>,;:!?*"
_NOT_SHAPE = re.compile(r"[\d/_.\\@=]|[a-z][A-Z]|[A-Z]{2}[a-z]")
_SHAPE_PENALTY = 3  # points per higher-ranked item of the same shape
_SHAPE_MIN_WORDS = 3  # fewer template words say too little to call two items the same shape
# Jaccard similarity of two shapes counts as "the same shape" at >= 7/10 (in integers, so the
# prefix filter below never misses a pair through rounding). Bounds of the join: see there.
_SHAPE_NUM, _SHAPE_DEN = 7, 10
_SHAPE_SCAN = 32  # latest shapes compared per prefix word
_SHAPE_MAX_NEIGHBOURS = 64  # similar shapes remembered per shape
# Items that exist once by construction (tally, latest status, latest request, working state).
_SHAPE_EXEMPT = frozenset({_STATUS, _CONTINUE, _WORKING})


def _shape(text: str) -> frozenset[str]:
    """The template words of `text`, lower-cased, specifics removed."""
    words = set()
    for raw in _SHAPE_WORD.findall(text):
        word = raw.strip(_SHAPE_STRIP)
        word = word[:-1] if word.endswith(".") else word
        if word and not _NOT_SHAPE.search(word):
            words.add(word.lower())
    return frozenset(words)


def _similar_shapes(shapes: list[frozenset[str]]) -> list[list[int]]:
    """For each distinct shape, indices of other shapes with Jaccard similarity >= 7/10.

    A prefix-filtered similarity join (AllPairs): with each shape's words sorted rarest
    first, two shapes that similar must share a word among their first `n - ceil(0.7 n) + 1`
    words, so only shapes meeting in an inverted index of those prefixes are compared.
    Bounded so thousands of near-identical shapes stay linear: a shape is compared only with
    the latest `_SHAPE_SCAN` shapes per prefix word (shapes arrive in rank order, so these
    are its nearest better-ranked relatives), and keeps at most `_SHAPE_MAX_NEIGHBOURS`.
    Past those bounds an item is already penalised far below any one-off fact.
    """
    frequency: dict[str, int] = {}
    for shape in shapes:
        for word in shape:
            frequency[word] = frequency.get(word, 0) + 1
    neighbours: list[list[int]] = [[] for _ in shapes]
    index: dict[str, list[int]] = {}
    for i, shape in enumerate(shapes):
        size = len(shape)
        ordered = sorted(shape, key=lambda w: (frequency[w], w))
        prefix = ordered[: size - (_SHAPE_NUM * size + _SHAPE_DEN - 1) // _SHAPE_DEN + 1]
        candidates: set[int] = set()
        for word in prefix:
            candidates.update(index.get(word, ())[-_SHAPE_SCAN:])
        for j in sorted(candidates, reverse=True):
            if len(neighbours[i]) >= _SHAPE_MAX_NEIGHBOURS:
                break
            other = shapes[j]
            # Length filter, then the exact test |a & b| / |a | b| >= 7/10, in integers.
            if _SHAPE_DEN * min(size, len(other)) < _SHAPE_NUM * max(size, len(other)):
                continue
            common = len(shape & other)
            if _SHAPE_DEN * common >= _SHAPE_NUM * (size + len(other) - common):
                neighbours[i].append(j)
                if len(neighbours[j]) < _SHAPE_MAX_NEIGHBOURS:
                    neighbours[j].append(i)
        for word in prefix:
            index.setdefault(word, []).append(i)
    return neighbours


def _shape_penalties(ranked: Sequence[_Item]) -> list[int]:
    """Per item of `ranked`, 3 points for each higher-ranked item of (nearly) the same shape."""
    group_of: dict[frozenset[str], int] = {}
    groups: list[int | None] = []
    for item in ranked:
        exempt = item.section in _SHAPE_EXEMPT and not _TOOL_LINE.match(item.text)
        shape = _shape(item.text) if not exempt else frozenset()
        if len(shape) < _SHAPE_MIN_WORDS:
            groups.append(None)
            continue
        groups.append(group_of.setdefault(shape, len(group_of)))
    neighbours = _similar_shapes(list(group_of))
    seen = [0] * len(group_of)
    penalties: list[int] = []
    for group in groups:
        if group is None:
            penalties.append(0)
            continue
        earlier = seen[group] + sum(seen[j] for j in neighbours[group])
        penalties.append(_SHAPE_PENALTY * earlier)
        seen[group] += 1
    return penalties


# The n-th spare line of one template (the n-th checksum of a listing, the n-th routine log line
# with its request id) loses this many points per better line of that template before it.
_SPARE_TEMPLATE_STEP = 2


def _spares_by_merit(spares: list[_Item], templates: dict[str, str]) -> list[_Item]:
    """The spare lines with each line's score lowered by `_SPARE_TEMPLATE_STEP` for every
    better-scored spare of its template: the best line of each template first, then the
    second-best, and routine repeated across the session last."""
    seen: dict[str, int] = {}
    for item in sorted(spares, key=lambda i: (-i.score, i.order)):
        template = templates.get(_key(item.text), item.text)
        rank = seen.get(template, 0)
        seen[template] = rank + 1
        item.score -= _SPARE_TEMPLATE_STEP * rank
    return spares


def _named(text: str) -> set[str]:
    """What an item names: its evidence keys and its parameters (identifiers, numbers, paths,
    versions: the values a template masks), so a spare line counts as new when it names a
    value the summary does not hold yet, whether or not the extractor has a rule for it."""
    keys = {e.key for e in extract(text)}
    keys.update(f"value:{value}" for value in parameters_of(text) if len(value) >= 2)
    return keys


# --- the summarizer ----------------------------------------------------------------------------

_COLLAPSE_AFTER = 3
# An output's records (compaction_app/relevance.py): offered, kept as items, and the least a
# record's relevance score must be to be an item or a spare.
_RECORDS_OFFERED = 8
_RECORDS_KEPT = 4
_RECORD_CUT = 2.0
_CALL_CUT = 3.5
_SPARE_CUT = 1.0
# An item's points per point of relevance score, less this per better record of its output.
_RECORD_POINTS = 1
_RECORD_RANK_STEP = 1
# A spare line (see `_Collector.add_spare`) ranks by its salience plus this per evidence item.
_SPARE_POINTS_PER_ITEM = 2
# ... less a point per this many characters of it (about four tokens).
_SPARE_CHARS_PER_POINT = 15
# A long line costs more of the budget for what it tells: a point per this many characters.
_CHARS_PER_POINT = 60
# Kinds of evidence that make a tool-output line an issue (collapsed with its repeats).
_ISSUE_KINDS = frozenset({"exit", "signal", "error", "error_code", "http_status"})


# At a small budget each bullet is a large share of the summary: a 30-token line is an eighth
# of 256 tokens and a hundredth of 4,000. An item loses a point per 1/64 of the budget it takes
# (about 4 characters a token, its citation included), so at 256 tokens three short facts
# outrank one long line that tells as much, while at the auto budget the ranking barely moves.
_ROOM_SHARE = 64
# Diversity within a section: its n-th best item loses a point per better one, up to this many
# (a section of many strong facts must not lose them to a weak item of an empty section).
_SECTION_RANK_CAP = 4
_CITATION_CHARS = 12


def _output_label(name: str) -> str:
    """The tool's name as a summary line names its output (`bash output: …`)."""
    return re.sub(r"[^\w.-]", "_", name) or "tool"


def _room_cost(item: _Item, max_tokens: int) -> float:
    return _ROOM_SHARE * (len(item.text) + _CITATION_CHARS) / (4 * max(max_tokens, 1))


def _tool_line_section(signal: bool, outcome: bool, kinds: Sequence[str]) -> str:
    """Where a salient tool-output line goes: failures and error evidence under issues, a
    command's closing summary under status, anything else under key technical context."""
    if signal or any(kind in _ISSUE_KINDS for kind in kinds if kind != "http_status"):
        return _ISSUES
    if outcome or "test_tally" in kinds:
        return _STATUS
    return _TECH


_PROSE_KINDS = frozenset({"decision", "plan", "cause", "todo", "correction"})


def _parse_summary(
    text: str, cites: dict[str, tuple[int, int, int]] | None = None
) -> dict[str, list[str]]:
    """Section -> items of a previous summary (ours or another summarizer's Markdown), their
    citations stripped into `cites` (by the item's key) when given."""
    sections: dict[str, list[str]] = {}
    known = {name.lower(): name for name in SECTIONS}
    current = _TECH
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            title = line.lstrip("#").strip().rstrip(":").lower()
            current = known.get(title, _TECH)
            continue
        line = _BULLET.sub("", line).strip()
        line, first, last, count = split_citation(line)
        if line and line != _EMPTY:
            sections.setdefault(current, []).append(line)
            if cites is not None:
                cites[_key(_clip(line))] = (first, last, count)
    return sections


def _call_summary(message: SummaryMessage) -> tuple[str, list[str]]:
    """`name target` for a tool call, plus the file paths it names."""
    content = message.content.strip()
    target = content
    try:
        args = json.loads(content)
    except ValueError:
        args = None
    if isinstance(args, dict) and args:
        for field in ("path", "file", "command", "cmd", "url", "pattern", "query"):
            if isinstance(args.get(field), str):
                target = args[field]
                break
        else:
            target = json.dumps(args, sort_keys=True)
    label = f"{message.name or 'tool'} {_clip(target)[:120]}".strip()
    return label, _PATH.findall(content)


def _rescore(section: str, text: str, salience: Salience) -> int:
    """`_score`, except that a quoted tool-output line is scored by what it tells (so a
    previous summary's evidence lines keep their rank in the next run)."""
    if _TOOL_LINE.match(text):
        line = _TOOL_LINE.sub("", text)
        information, _outcome, _signal = salience.information(line)
        # What the line told when it was news: the batch it came from is folded and gone, and
        # a newer batch repeating it (the same failing test run again) must not make the
        # session's main failure look routine and let weaker new lines evict it.
        then, _outcome, _signal = _NEWS.information(line)
        return _BASE[section] + max(information, then - _OLD_DISCOUNT)
    return _score(section, text)


# A salience that has seen nothing: how much a line tells as news. Never fed.
_NEWS = Salience()
# An old line ranks this much below a new line that tells as much.
_OLD_DISCOUNT = 1


# Every subject (a setting, a version, a correction naming a setting) needs one of these.
_MAY_HAVE_SUBJECT = re.compile(r"[=@]|\d\.\d|[A-Z]_[A-Z]")


def _subjects(text: str) -> set[str]:
    if not _MAY_HAVE_SUBJECT.search(text):
        return set()
    return {item.subject for item in extract(text) if item.subject}


def _latest_statements(items: list[_Item]) -> list[_Item]:
    """Drop an item when a later one states another value for the same subject (a setting's
    name, a package's version, a correction naming a setting): the newest statement wins.
    "Later" is a later event when the items are cited (lines of one output, such as a table
    of releases, do not supersede each other), else a later position."""
    cited = any(item.last for item in items)

    def when(item: _Item) -> int:
        return item.last if cited else item.order

    latest: dict[str, int] = {}
    subjects: dict[int, set[str]] = {}
    for item in items:
        if item.section in (_STATUS, _WORKING):
            continue
        found = _subjects(item.text)
        if found:
            subjects[id(item)] = found
            for subject in found:
                latest[subject] = max(latest.get(subject, 0), when(item))
    return [
        item
        for item in items
        if all(latest[subject] == when(item) for subject in subjects.get(id(item), ()))
    ]


_LABEL = re.compile(r"^(?:Latest request|Latest agent status|[\w.-]+ output): ")


def _superseded_by_kept(items: list[_Item], kept_text: str) -> list[_Item]:
    """Drop items stating a setting or version the kept events state differently: what the
    model still sees verbatim is the current word (a user's "Correction: X=4, not 8" stays
    in the context while the agent's earlier "X=8" is folded)."""
    current: dict[str, set[str]] = {}
    for found in extract(kept_text):
        if found.subject and found.kind in ("setting", "version"):
            current.setdefault(found.subject, set()).add(found.key)
    if not current:
        return items
    result = []
    for item in items:
        stale = False
        if item.section != _WORKING:
            for found in extract(item.text):
                keys = current.get(found.subject)
                if keys and found.kind in ("setting", "version") and found.key not in keys:
                    stale = True
                    break
        if not stale:
            result.append(item)
    return result


def _novel(items: list[_Item], kept_text: str) -> list[_Item]:
    """Items the kept events do not already say: neither the sentence itself nor, for an item
    carrying evidence, every literal of it appears in `kept_text`."""
    if not kept_text.strip():
        return items
    items = _superseded_by_kept(items, kept_text)
    kept = " ".join(kept_text.lower().split())
    texts: dict[int, str] = {}
    literals: dict[int, list[str]] = {}
    for item in items:
        if item.text.startswith("Folded so far:"):
            continue
        texts[id(item)] = _key(_LABEL.sub("", item.text))
        literals[id(item)] = [
            e.key.split(":", 1)[1]
            for e in extract(item.text)
            if e.kind not in _PROSE_KINDS and e.kind != "path"
        ]
    # Which of them the kept text holds: one pass over it for all (a search per item read the
    # whole kept text once per item: quadratic in the session).
    present = present_literals(
        [t for t in texts.values() if len(t) >= 24]
        + [x for found in literals.values() for x in found if len(x) >= 5],
        kept,
    )
    result = []
    for item in items:
        if id(item) not in texts:
            result.append(item)
            continue
        if texts[id(item)] in present:
            continue
        found = literals[id(item)]
        # Only literals specific enough to be the same fact: "100%" in a kept test run's
        # `[100%]` does not make a full disk's `/dev/nvme1n1 … 100%` line old news.
        if found and all(len(x) >= 5 and x in present for x in found):
            continue
        result.append(item)
    return result


def _lines_matching(text: str, needles: tuple[str, ...], pattern: re.Pattern[str]) -> Iterator[str]:
    """The lines of `text`, in order, that `pattern` matches, given literals one of which
    every match contains (the pattern never spans lines)."""
    starts: set[int] = set()
    for needle in needles:
        pos = text.find(needle)
        while pos >= 0:
            starts.add(text.rfind("\n", 0, pos) + 1)
            line_end = text.find("\n", pos)
            if line_end < 0:
                break
            pos = text.find(needle, line_end + 1)
    for start in sorted(starts):
        end = text.find("\n", start)
        line = text[start : len(text) if end < 0 else end]
        if pattern.search(line):
            yield line


@register
class LocalSummarizer(Summarizer):
    """Extractive summarizer: offline, deterministic, no model call.

    Keeps user requests and constraints, decisions, errors, file paths, identifiers, numbers
    and URLs, under the headings of `SECTIONS`. Incremental: the previous summary's items are
    merged with the new ones (deduplicated); Status, Context for continuing and the tool-call
    list in Working state describe the latest state, so new items replace old ones there.
    """

    name = "local"
    # What is routine in the session being summarized (set per `summarize` call).
    salience: Salience | None = None
    # What the conversation says about each folded output (set per `summarize` call), and
    # where each folded message sits in it.
    conversation: relevance.Conversation | None = None
    _positions: dict[int, int]
    _by_seq = False

    def summarize(
        self,
        *,
        previous_summary: str,
        messages: Sequence[SummaryMessage],
        max_tokens: int,
        kept_text: str = "",
        context: Sequence[SummaryMessage] = (),
        previous_scores: Mapping[str, int] | None = None,
    ) -> str:
        # Rarity is judged against everything folded in this run, not one input piece: a line
        # routine across the session stays routine in the piece that happens to hold it once.
        self.salience = Salience(message.content for message in messages)
        # An output's records are judged by the conversation around it: the request it
        # serves, what the agent says of it later, its siblings. The whole conversation when
        # the caller gives it (the kept requests and messages in their places), else the
        # folded messages with the kept text after them.
        whole = bool(context) and all(m.seq for m in context) and all(m.seq for m in messages)
        sequence = context if whole else messages
        self.conversation = relevance.Conversation(
            [
                relevance.Message(
                    type=m.type,
                    content=m.content,
                    seq=m.seq,
                    name=m.name,
                    tool_call_id=m.tool_call_id,
                )
                for m in sequence
            ],
            later_text="" if whole else kept_text,
        )
        self._positions = (
            {m.seq: k for k, m in enumerate(sequence)}
            if whole
            else {id(m): k for k, m in enumerate(messages)}
        )
        self._by_seq = whole
        try:
            return super().summarize(
                previous_summary=previous_summary,
                messages=messages,
                max_tokens=max_tokens,
                kept_text=kept_text,
                context=context,
                previous_scores=previous_scores,
            )
        finally:
            self.salience = None
            self.conversation = None

    def _position(self, message: SummaryMessage) -> int | None:
        return self._positions.get(message.seq if self._by_seq else id(message))

    def _pieces(
        self, messages: Sequence[SummaryMessage], *, reserve: int
    ) -> list[list[SummaryMessage]]:
        # No model window to respect: one pass over everything folded. Pieces would each
        # re-read and re-rank the running summary, and with the room as budget that summary
        # can be most of the session (quadratic in the session's size).
        del reserve
        return [list(messages)] if messages else []

    def _summarize_piece(
        self, *, previous_summary: str, messages: Sequence[SummaryMessage], max_tokens: int
    ) -> str:
        collector = _Collector()
        previous = (
            _parse_summary(previous_summary, collector.cites) if previous_summary.strip() else {}
        )
        seqs = [m.seq for m in messages if m.seq]
        batch_first, batch_last = (min(seqs), max(seqs)) if seqs else (0, 0)
        folded_before = 0
        match = _FOLDED_SO_FAR.search(previous_summary)
        if match:
            folded_before = int(match.group(1))

        files: list[str] = []  # newest first
        calls: list[str] = []
        latest_request = ""
        last_agent: list[str] = []
        request_seq = agent_seq = 0
        counts = {"user": 0, "assistant": 0, "tool": 0}

        # Old items first (they keep their place), slightly favoured: they already survived.
        replaced = {_STATUS, _CONTINUE}
        previous_first_seen = False
        for section in SECTIONS:
            for text in previous.get(section, []):
                if section in replaced:
                    continue
                if section == _WORKING:
                    if text.startswith("Files touched:"):
                        files.extend(p.strip() for p in text.split(":", 1)[1].split(","))
                    elif not text.startswith("Recent tool calls:"):
                        collector.add(section, text, 3)
                    continue
                # The first request of the session is its intent: keep it above later ones.
                bonus = 4 if section == _REQUEST and not previous_first_seen else 1
                previous_first_seen = previous_first_seen or section == _REQUEST
                # An old item keeps the score it earned when it was chosen (a weaker new item
                # never evicts it); one whose score was not kept is scored again.
                earned = self.previous_scores.get(score_key(text))
                score = (
                    earned
                    if earned is not None
                    else _rescore(section, text, self._salience()) + bonus
                )
                collector.add(section, text, score)

        for index, message in enumerate(messages):
            role = message.role
            content = message.content
            if message.type == EventType.TOOL_CALL:
                label, paths = _call_summary(message)
                calls.append(label)
                files[:0] = [p for p in paths if p not in files]
                counts["tool"] += 1
                self._tool_call(collector, self._position(message), message.name, seq=message.seq)
                continue
            if message.type == EventType.TOOL_RESULT or role == "tool":
                self._tool_result(collector, self._position(message), message.name, seq=message.seq)
                self._salient_fill(collector, message.content, message.name, seq=message.seq)
                counts["tool"] += 1
                continue
            if content.startswith(_REFRESH_PREFIX) and "## " in content:
                # A folded context refresh carries an earlier summary: merge it like one.
                for section, items in _parse_summary(content[len(_REFRESH_PREFIX) :]).items():
                    for text in items:
                        if section not in replaced and section != _WORKING:
                            collector.add(
                                section,
                                text,
                                _rescore(section, text, self._salience()),
                                seq=message.seq,
                            )
                continue
            if role == "user":
                counts["user"] += 1
                sentences = [t for t in _sentences(content) if not _is_filler(t)]
                if sentences:
                    latest_request, request_seq = sentences[0], message.seq
                self._user(
                    collector,
                    sentences,
                    first_message=index == 0 and not previous,
                    seq=message.seq,
                )
            else:
                counts["assistant"] += 1
                sentences = [t for t in _sentences(content) if not _is_filler(t)]
                if sentences:
                    last_agent, agent_seq = sentences, message.seq
                self._agent(collector, sentences, seq=message.seq)
            for path in _PATH.findall(content):
                if path not in files and "/" in path:
                    files.insert(0, path)

        total = folded_before + len(messages)
        collector.add(
            _STATUS,
            f"Folded so far: {total} messages ({counts['user']} user, {counts['assistant']} "
            f"assistant, {counts['tool']} tool in the latest batch).",
            # Bookkeeping: first in a summary of normal size, after the content in a tiny one
            # (a fold of a few dozen tokens has room for one fact, not for its count).
            50 if max_tokens >= _BOOKKEEPING_MIN_TOKENS else 1,
            seq=batch_first,
            last=batch_last,
        )
        done = [s for s in last_agent if _DONE.search(s) or _ERROR.search(s)]
        if done:
            collector.add(_STATUS, f"Latest agent status: {done[-1]}", 12, seq=agent_seq)
        elif last_agent:
            collector.add(_STATUS, f"Latest agent status: {last_agent[0]}", 9, seq=agent_seq)
        else:
            for text in previous.get(_STATUS, []):
                if not _FOLDED_SO_FAR.search(text):
                    collector.add(_STATUS, text, 8)
        if latest_request:
            collector.add(_CONTINUE, f"Latest request: {latest_request}", 14, seq=request_seq)
        next_steps = [s for s in last_agent if _NEXT.search(s)]
        for text in next_steps[-2:]:
            collector.add(_CONTINUE, text, 9, seq=agent_seq)
        if not latest_request and not next_steps:
            for text in previous.get(_CONTINUE, []):
                collector.add(_CONTINUE, text, 8)
        if files:
            unique = list(dict.fromkeys(f for f in files if f))[:_MAX_FILES]
            collector.add(_WORKING, "Files touched: " + ", ".join(unique), 10, seq=batch_last)
        # The calls worth quoting are items of their own (`_tool_call`): an edit's lines, a
        # command that changed something, one asked for or named later; no list of the last
        # few calls whatever they were.
        keys = set(collector.items)
        spares = _spares_by_merit(
            [i for i in collector.spares.values() if _key(i.text) not in keys],
            collector.spare_templates,
        )
        candidates = _latest_statements([*collector.items.values(), *spares])
        return self._fit(_novel(candidates, self.kept_text), max_tokens=max_tokens)

    # --- extraction ---------------------------------------------------------------------------

    @staticmethod
    def _user(
        collector: _Collector, sentences: list[str], *, first_message: bool, seq: int
    ) -> None:
        for position, sentence in enumerate(sentences):
            if _CONSTRAINT.search(sentence):
                section = _PREFS
            elif _STRONG_ERROR.search(sentence):
                section = _ISSUES
            elif _DECISION.search(sentence) or _STATE.search(sentence):
                section = _TECH
            elif position == 0 or _features(sentence):
                # The opening sentence states the request; the very first one the intent.
                section = _REQUEST
            else:
                continue
            bonus = 4 if first_message and position == 0 and section == _REQUEST else 0
            collector.add(section, sentence, _score(section, sentence) + bonus, seq=seq)

    @staticmethod
    def _agent(collector: _Collector, sentences: list[str], *, seq: int) -> None:
        for sentence in sentences:
            if _STRONG_ERROR.search(sentence) or _CAUSE.search(sentence):
                section = _ISSUES
            elif _DECISION.search(sentence) or _STATE.search(sentence):
                section = _TECH
            elif _CHANGE.search(sentence):
                section = _CHANGES
            else:
                # A finding or conclusion in the agent's own words ("the culprit turned out to
                # be the stale DNS cache on node-7"): kept by structure, ranked by what it names.
                section = _TECH
            collector.add(section, sentence, _score(section, sentence), seq=seq)

    def _tool_call(
        self, collector: _Collector, position: int | None, name: str, *, seq: int
    ) -> None:
        """A call worth quoting (`relevance.Conversation.call`): an edit's added lines, a
        command that changed something, one the user asked for or later messages name."""
        conversation = self.conversation
        if conversation is None or position is None:
            return
        ranked = conversation.call(position)
        if ranked is None or ranked.score < _CALL_CUT:
            return
        label = _output_label(name)
        section = _CHANGES if ranked.change else _TECH
        text = f"{label} call: {ranked.text}"
        collector.add(
            section, text, _BASE[section] + int(round(_RECORD_POINTS * ranked.score)), seq=seq
        )

    def _tool_result(
        self, collector: _Collector, position: int | None, name: str, *, seq: int
    ) -> None:
        """An output's records as items, by what the conversation says of them
        (`relevance`): what answers the request, what the agent later names or reacted to,
        the verdict among siblings. The best few are items; the next ones spares."""
        conversation = self.conversation
        if conversation is None or position is None or position not in conversation.contexts:
            return
        outcome = conversation.rank(position)
        label = _output_label(name)
        kept = offered = 0
        itemized: set[tuple[str, ...]] = set()
        for ranked in outcome.ranked:
            template = ranked.record.template
            text = f"{label} output: {ranked.record.quoted}"
            if template in itemized:
                # Another line of a kind this output already gave an item for (the fortieth
                # `bad row N`): counted into it, not a line of its own.
                collector.add(_ISSUES, text, 1, seq=seq, collapse=True)
                continue
            if offered >= _RECORDS_OFFERED:
                continue
            score = int(round(_RECORD_POINTS * ranked.score)) - _RECORD_RANK_STEP * offered
            offered += 1
            if ranked.score >= _RECORD_CUT and ranked.pointed_at and kept < _RECORDS_KEPT:
                if relevance.is_failure(ranked.record.text):
                    section = _ISSUES
                elif relevance.is_outcome(ranked.record.text):
                    section = _STATUS
                else:
                    section = _TECH
                # A failure that comes again and again (the same bad row, run after run) is
                # one line with its count and the seqs it spans.
                repeated = conversation.templates[template] > _COLLAPSE_AFTER
                collapse = repeated and section in (_ISSUES, _STATUS)
                collector.add(section, text, _BASE[section] + score, seq=seq, collapse=collapse)
                if collapse:
                    itemized.add(template)
                kept += 1
            elif ranked.score >= _SPARE_CUT:
                collector.add_spare(text, score, template=" ".join(template), seq=seq)

    def _salient_fill(self, collector: _Collector, content: str, name: str, *, seq: int) -> None:
        """The lines that tell the most against the whole session (`Salience`). A failure or
        a command's outcome is a verdict: an item beside the records the conversation points
        at. A line that is only rare (a template or values seen once) is a spare: it fills
        what the bound leaves once the items are in, never takes their place (rarity alone is
        no evidence, but a budget left empty keeps nothing)."""
        salience = self._salience()
        label = _output_label(name)
        shapes: set[str] = set()
        for raw in itertools.islice(
            _lines_matching(content, _TOOL_ERROR_NEEDLES, _TOOL_ERROR), _MAX_TOOL_ERRORS
        ):
            item = f"{label} output: {quoted_line(raw)}"
            clipped = _clip(item)
            if _key(clipped) in collector.items:
                continue  # an item already, ranked by what the conversation says of it
            shape = shape_of(clipped)
            if shape in shapes or "shape:" + shape in collector.items:
                # The fortieth `bad row N`: one line of its kind is enough, and none when
                # the kind is an item already (counted into its `… ×N`).
                continue
            shapes.add(shape)
            # A failure is a verdict whatever the conversation says of it: an item, ranked
            # by what it tells in this session (one of a kind above the eightieth repeat).
            information, _outcome, _signal = salience.information(raw)
            score = max(_score(_ISSUES, item), _BASE[_ISSUES] + information)
            collector.add(_ISSUES, item, score, seq=seq, collapse=True)
        on_line: dict[str, list[str]] = {}
        for found in extract(segmented(content), seq=seq):
            on_line.setdefault(found.line, []).append(found.kind)
        salient, spares = salience.ranked(content)

        def collapsed(line: str) -> bool:
            return "shape:" + shape_of(_clip(f"{label} output: {line}")) in collector.items

        for rank, candidate in enumerate(salient):
            line = quoted_line(candidate.line)
            if collapsed(line) or relevance.is_echo(line):
                # An echo says what was run, which the call says already.
                continue
            if candidate.signal or candidate.outcome:
                # A failure or a command's outcome (`Got 21 results, configured to fail`,
                # `Expected 7 columns, found 6`): a verdict, an item like the records above.
                kinds = on_line.get(candidate.line, ())
                section = _tool_line_section(candidate.signal, candidate.outcome, kinds)
                collector.add(
                    section,
                    f"{label} output: {line}",
                    max(
                        1,
                        _BASE[section]
                        + candidate.information
                        - rank
                        - len(line) // _CHARS_PER_POINT,
                    ),
                    seq=seq,
                    collapse=section in (_ISSUES, _STATUS) and candidate.repeats > _COLLAPSE_AFTER,
                )
                continue
            collector.add_spare(
                f"{label} output: {line}",
                max(1, candidate.information - rank - len(line) // _CHARS_PER_POINT),
                template=candidate.template or template_of(line),
                seq=seq,
            )
        for candidate in spares:
            kinds = on_line.get(candidate.line, ())
            rare = salience.rare_values(candidate.line)
            if not kinds and not rare:
                continue
            line = quoted_line(candidate.line)
            if collapsed(line):
                continue
            score = (
                candidate.information
                + _SPARE_POINTS_PER_ITEM * max(len(kinds), len(rare))
                - len(line) // _SPARE_CHARS_PER_POINT
            )
            if score <= 0:
                continue  # routine with new ids on it (every request id is unique)
            collector.add_spare(
                f"{label} output: {line}",
                score,
                template=candidate.template or template_of(line),
                seq=seq,
            )

    def _salience(self) -> Salience:
        if self.salience is None:
            self.salience = Salience()
        return self.salience

    # --- assembly ------------------------------------------------------------------------------

    @staticmethod
    def _render(items: Sequence[_Item]) -> str:
        by_section: dict[str, list[_Item]] = {name: [] for name in SECTIONS}
        for item in items:
            by_section[item.section].append(item)
        lines: list[str] = []
        for name in SECTIONS:
            chosen = sorted(by_section[name], key=lambda i: i.order)
            if not chosen:
                continue  # an empty section says nothing ("None." cost tokens)
            lines.append(f"## {name}")
            lines.extend(f"- {item.text}{_cite(item)}" for item in chosen)
            lines.append("")
        return "\n".join(lines).rstrip() + "\n"

    def _fit(self, items: list[_Item], *, max_tokens: int) -> str:
        """Render the highest-priority items that fit in `max_tokens`, dropping the rest."""
        # Diversity of sentence shapes first: an agent repeating one template with a new path
        # each time ("I updated the two in {path}; ...") must neither outrank one-off facts
        # nor take their places in the per-section ranking below.
        spares = sorted((i for i in items if i.spare), key=lambda i: (-i.score, i.order))
        items = [i for i in items if not i.spare]
        ranked = sorted(items, key=lambda i: (-i.score, -i.order))
        adjusted = {
            id(item): item.score - penalty
            for item, penalty in zip(ranked, _shape_penalties(ranked), strict=True)
        }
        # Diversity within a section: the n-th best item of a section loses n points (at most
        # _SECTION_RANK_CAP), so one chatty section cannot crowd the others out.
        by_section: dict[str, list[_Item]] = {}
        for item in sorted(ranked, key=lambda i: (-adjusted[id(i)], -i.score, -i.order)):
            by_section.setdefault(item.section, []).append(item)
        effective = {
            id(item): adjusted[id(item)]
            - min(rank, _SECTION_RANK_CAP)
            - _room_cost(item, max_tokens)
            for section_items in by_section.values()
            for rank, item in enumerate(section_items)
        }
        ranked = sorted(items, key=lambda i: (-effective[id(i)], -i.score, -i.order))
        # A cheap character cap bounds the pool before any exact counting: no summary of
        # max_tokens tokens holds more than ~12 characters per token of bullet text.
        pool: list[_Item] = []
        chars = 0
        cap = max_tokens * 12 + 200
        for item in ranked:
            chars += len(item.text) + 3
            if chars > cap:
                break
            pool.append(item)
        else:
            # Every salient item is in the pool, so the budget may have room they leave
            # unused: the spare lines follow them, each only if it names something the pool
            # does not already hold (a prefix of the pool is what gets rendered).
            held = {key for item in pool for key in _named(item.text)}
            again: list[_Item] = []
            for item in spares:
                new = _named(item.text) - held
                if not new:
                    again.append(item)
                    continue
                chars += len(item.text) + 3
                if chars > cap:
                    break
                held |= new
                pool.append(item)
            else:
                # Room still left: the lines whose values the summary already names somewhere
                # else (`"Code": "X"` beside `"Message": "X: …"`), in their rank, for the
                # pairing of key and value they add.
                for item in again:
                    chars += len(item.text) + 3
                    if chars > cap:
                        break
                    pool.append(item)
        return self._fill(pool, max_tokens=max_tokens)

    def _fill(self, pool: list[_Item], *, max_tokens: int) -> str:
        """Render the longest prefix of the ranked `pool` that fits in `max_tokens`, topped up
        with a few later items that still fit."""
        # Each bullet and heading is counted once: the tokenizer splits at newlines, so the
        # tokens of a rendering are the sum of its lines' within a token or two at the blank
        # lines between sections. The estimate picks the prefix; exact counts of the rendered
        # text (a handful, not one per bisection step) settle its edge.
        costs: dict[int, int] = {}

        def cost(index: int) -> int:
            if index not in costs:
                item = pool[index]
                costs[index] = self.count_tokens(f"- {item.text}{_cite(item)}\n")
            return costs[index]

        heading = {name: self.count_tokens(f"## {name}\n") + 1 for name in SECTIONS}
        opened: set[str] = set()
        estimate = 0
        size = 0
        for index, item in enumerate(pool):
            extra = cost(index) + (0 if item.section in opened else heading[item.section])
            if estimate + extra > max_tokens:
                break
            estimate += extra
            opened.add(item.section)
            size += 1
        # The largest prefix whose rendering fits.
        used = self.count_tokens(self._render(pool[:size])) if size else 0
        if used <= max_tokens:
            while size < len(pool):
                longer = self.count_tokens(self._render(pool[: size + 1]))
                if longer > max_tokens:
                    break
                size, used = size + 1, longer
        while size and used > max_tokens:
            size -= 1
            used = self.count_tokens(self._render(pool[:size])) if size else 0
        chosen = pool[:size]
        # The item that stopped the prefix may be long while later ones are short: offer a few
        # of the next-ranked items individually (only those the estimate says might fit are
        # rendered and counted).
        sections = {item.section for item in chosen}
        for index in range(len(chosen) + 1, min(len(chosen) + 1 + _TOP_UP_TRIES, len(pool))):
            item = pool[index]
            extra = cost(index) + (0 if item.section in sections else heading[item.section])
            if used + extra > max_tokens + _ESTIMATE_SLACK:
                continue
            rendered = self.count_tokens(self._render([*chosen, item]))
            if rendered <= max_tokens:
                chosen.append(item)
                sections.add(item.section)
                used = rendered
        if not chosen and pool:
            # Not even one whole item fits: the best one, cut at a word end, beats nothing. No
            # heading then (a heading alone says nothing), and its citation goes first, so a
            # cut keeps where the words came from.
            item = next(
                (i for i in pool if not _FOLDED_SO_FAR.match(i.text) and i.section != _WORKING),
                pool[0],
            )
            cite = _cite(item).strip()
            return truncate_to_tokens(
                f"- {cite} {item.text}" if cite else f"- {item.text}",
                max_tokens=max_tokens,
                count_tokens=self.count_tokens,
            )
        self.chosen_scores = {
            score_key(item.text): item.score
            for item in chosen
            if not _FOLDED_SO_FAR.match(item.text)
        }
        return self._render(chosen)
