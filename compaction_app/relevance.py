"""Which records of a tool's output matter, judged by the conversation around it (pure).

A line of tool output is evidence when the conversation says so, not when it merely looks
rare (in real output nearly every id and timestamp is unique). Three things say so:

- **it answers what was asked**: it holds the words of the request it serves — the user's
  latest message, the words the agent said before the call and the call's own arguments
  (`p99` and `checkout-api` in the query, the table named in the `SELECT`, the pod in
  `describe`) — weighted by how few of the output's records hold each word (a word every
  record holds picks none out);
- **the agent reacts to it or refers to it**: a later message of the agent (or the user)
  names one of its values — exactly, or a number rounded (`~2.85 s` for `2.847103921`, `7.3 %`
  for `0.0731`) — or, right after the output, the agent says something unlike its routine
  messages without restating anything ("There it is.", "that's the anomaly"): then the
  output's best records are what it reacted to;
- **it is the output's verdict**: the record that breaks its siblings' pattern (the failing
  row among passing ones, the pod in CrashLoopBackOff among Running ones, the checksum marked
  FAILED), a value far outside its siblings' (the first sample after a jump), a failure among
  lines that report none, a command's outcome (`3 failed`, `BUILD FAILED`, `(1 row)`), and of
  a setting given twice, the one that wins.

Records: the output's lines (long ones cut as the evidence extractor cuts them), a JSON
document's objects in arrays (one object on one line, so `"service": "checkout-api"` and its
`"value"` stay together), a JSON-lines log's lines; a small output is one record whole.

Everything is counted within the output or the conversation, in one pass each; no tool is
known by name.
"""

from __future__ import annotations

import json
import math
import re
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from compaction_app.evidence import extract, own_frames, quoted_line, segmented
from sessions_app.event_types import EventType

__all__ = [
    "Conversation",
    "Message",
    "Outcome",
    "OutputContext",
    "Ranked",
    "Record",
    "conversation_contexts",
    "rank_output",
    "rank_records",
    "records_of",
    "terms_of",
]

# --- words --------------------------------------------------------------------------------------

_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-/:@+=%]*[A-Za-z0-9%]|[A-Za-z0-9]")
_PART = re.compile(r"[-_./:=@+]+")
_COARSE = re.compile(r"[/:=@+]+")
_HAS_DIGIT = re.compile(r"\d")
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.])")
# In prose a number may carry thousands separators (`1,284,871 rows`): one number, the same
# as the output's `1284871`. (Not in output, where a comma separates CSV fields.)
_GROUPED_NUMBER = re.compile(r"(?<![\w.,])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w.]|,\d)")
_HEXISH = re.compile(r"^[0-9a-f]{6,}$")
_STOP = frozenset(
    [
        "a",
        "an",
        "the",
        "and",
        "or",
        "nor",
        "but",
        "if",
        "then",
        "else",
        "when",
        "where",
        "who",
        "whom",
        "whose",
        "why",
        "how",
        "what",
        "which",
        "that",
        "this",
        "these",
        "those",
        "there",
        "here",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "being",
        "am",
        "do",
        "does",
        "did",
        "doing",
        "done",
        "have",
        "has",
        "had",
        "having",
        "not",
        "no",
        "yes",
        "ok",
        "okay",
        "sure",
        "thanks",
        "thank",
        "please",
        "it",
        "its",
        "it's",
        "i",
        "me",
        "my",
        "we",
        "us",
        "our",
        "you",
        "your",
        "they",
        "them",
        "their",
        "he",
        "she",
        "his",
        "her",
        "of",
        "on",
        "in",
        "at",
        "to",
        "from",
        "by",
        "with",
        "without",
        "for",
        "into",
        "onto",
        "over",
        "under",
        "about",
        "above",
        "below",
        "after",
        "before",
        "again",
        "ago",
        "out",
        "off",
        "up",
        "down",
        "now",
        "right",
        "still",
        "yet",
        "just",
        "only",
        "also",
        "very",
        "more",
        "most",
        "much",
        "many",
        "few",
        "lot",
        "lots",
        "one",
        "two",
        "three",
        "some",
        "any",
        "all",
        "each",
        "every",
        "other",
        "such",
        "than",
        "too",
        "can",
        "could",
        "should",
        "would",
        "will",
        "shall",
        "may",
        "might",
        "must",
        "let",
        "lets",
        "see",
        "check",
        "look",
        "show",
        "give",
        "get",
        "got",
        "make",
        "made",
        "want",
        "need",
        "try",
        "tried",
        "use",
        "used",
        "using",
        "run",
        "ran",
        "running",
        "go",
        "going",
        "went",
        "come",
        "came",
        "know",
        "think",
        "seems",
        "seem",
        "like",
        "well",
        "also",
        "so",
        "as",
        "via",
        "per",
        "vs",
    ]
)


# A shell prompt's echo of the command (`$ npx tsc`, `user@host:~$ make`).
_ECHO = re.compile(r"^\s*(?:\$|❯|>>>|\w+@[\w.-]+:[~\w/.-]*[$#])\s")


def _norm(token: str) -> str:
    return token.lower().strip(".:,;=-_/")


_CAMEL = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")


def terms_of(text: str) -> set[str]:
    """The words of `text` a record may share with it: tokens (lower case, 3+ characters, not
    a common English word) and their parts split at `-_./:=@+` (`checkout-api` gives
    `checkout-api`, `checkout`; `stg_shop__orders` gives `stg_shop__orders`, `shop`,
    `orders`)."""
    found: set[str] = set()
    for raw in _TOKEN.findall(text):
        token = _norm(raw)
        if len(token) < 3 or token in _STOP:
            continue
        found.add(token)
        if not raw.islower() and not raw.isupper():
            # camelCase and PascalCase parts (`defaultRounding` gives `rounding`).
            for part in _CAMEL.findall(raw):
                part = part.lower()
                if len(part) >= 3 and part not in _STOP:
                    found.add(part)
        # Parts at path and key separators (`checkout-api`, `v2.31.0` of an image reference),
        # then at every separator (`checkout`, `api`).
        for part in (*_COARSE.split(token), *_PART.split(token)):
            part = _norm(part)
            if len(part) >= 3 and part not in _STOP and not part.isdigit():
                found.add(part)
    return found


def _numbers(text: str, *, prose: bool = False) -> list[tuple[float, int]]:
    """The numbers of `text` with their decimals (`2.85` → (2.85, 2)); in `prose`, a number
    with thousands separators too (`1,284,871` → (1284871, 0))."""
    out = []
    raws = []
    if prose and "," in text:
        raws = [m.group(0).replace(",", "") for m in _GROUPED_NUMBER.finditer(text)]
        text = _GROUPED_NUMBER.sub(" ", text)
    raws += [m.group(0) for m in _NUMBER.finditer(text)]
    for raw in raws:
        try:
            value = float(raw)
        except ValueError:  # pragma: no cover - the pattern only matches numbers
            continue
        decimals = len(raw.split(".", 1)[1]) if "." in raw else 0
        out.append((value, decimals))
    return out


def _significant(raw: str) -> int:
    digits = raw.lstrip("-").replace(".", "").lstrip("0")
    return len(digits)


# --- records ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """One record of an output: what a summary quotes of it (`text`, verbatim but for blanks),
    its first line's index, its words and its template (its words with every value masked)."""

    text: str
    index: int
    words: frozenset[str]
    template: tuple[str, ...]
    # The line it sits under (less indented, just above: a file path over its lint errors, a
    # section over its fields), when it has one; a summary quotes it in front.
    heading: str = ""
    # The evidence extractor finds a failure on it (an error, an error code, a failed exit, a
    # signal, an HTTP status of 400 or more).
    failed: bool = False

    @property
    def quoted(self) -> str:
        return f"{self.heading} › {self.text}" if self.heading else self.text


_MAX_RECORDS = 4_000
_JSON_MAX_CHARS = 400_000
_JSON_RECORD_CHARS = 600


# Where a record's fields part: blanks, and the separators of delimited rows (CSV, psql's `|`).
_FIELDS = re.compile(r"[\s,;|\t]+")
_STRIP = "\"',;:()[]{}<>"


def _fields(text: str) -> list[str]:
    return [f for f in (raw.strip(_STRIP) for raw in _FIELDS.split(text)) if f]


def _template(text: str) -> tuple[str, ...]:
    words = []
    for token in _fields(text):
        lowered = token.lower()
        if _HAS_DIGIT.search(token) or _HEXISH.match(lowered) or len(token) > 40:
            words.append("#")
        else:
            words.append(lowered)
    return tuple(words)


_NUMERIC = re.compile(r"^[-+]?\d+(?:\.\d+)?(?:%|[a-zA-Z]{1,3})?$")


def _numeric_fields(text: str) -> list[float]:
    """The record's fields that are numbers (a unit or `%` after one allowed), in order."""
    out = []
    for value in _fields(text):
        if _NUMERIC.match(value):
            digits = re.match(r"[-+]?\d+(?:\.\d+)?", value)
            if digits:
                out.append(float(digits.group(0)))
    return out


def _record(text: str, index: int, heading: str = "", failed: bool = False) -> Record:
    return Record(
        text=text,
        index=index,
        words=frozenset(terms_of(text)),
        template=_template(text),
        heading=heading,
        failed=failed,
    )


_FAILURE_KINDS = frozenset({"error_code", "exit", "signal"})


def _failed_lines(text: str) -> set[str]:
    """The lines of `text` (as quoted) on which the evidence extractor finds a failure: one
    extractor for the summary, the placeholders and the loss report."""
    found = set()
    for item in extract(text):
        failing = (item.kind in _FAILURE_KINDS and item.key not in ("exit:0", "signal:")) or (
            item.kind == "http_status" and item.key.split(":")[-1][:1] in "45"
        )
        if failing and item.line:
            found.add(quoted_line(item.line))
    return found


# Members of a JSON record that only identify it (a request id, a trace id, a digest): left out
# of what a summary quotes, unless a message names them.
_NOISE_VALUE = re.compile(
    r"^(?:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{16,}"
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?)$",
    re.IGNORECASE,
)


def _compact_json(obj: dict[str, object]) -> str:
    kept = {
        key: value
        for key, value in obj.items()
        if not (isinstance(value, str) and _NOISE_VALUE.match(value))
    }
    return _dumps(kept if kept else obj)


_HEADING_CHARS = 60


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _json_records(data: object) -> list[str]:
    """A JSON document's records: each object in an array, on one line (small enough to quote);
    a big object's members one by one; scalars in an array as one record."""
    out: list[str] = []

    def walk(node: object, key: str = "") -> None:
        if isinstance(node, list):
            if node and all(not isinstance(x, dict | list) for x in node):
                out.append(_dumps(node if not key else {key: node}))
                return
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            # A member keeps its name (`"error": {"code": …}`): the name often says it all.
            text = _dumps({key: node} if key else node)
            if len(text) <= _JSON_RECORD_CHARS:
                out.append(text)
                return
            for name, value in node.items():
                if isinstance(value, dict | list):
                    walk(value, name)
                else:
                    out.append(_dumps({name: value}))
        else:
            out.append(_dumps(node))

    walk(data)
    return out


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


def records_of(output: str) -> list[Record]:
    """The records of one output, in order (at most `_MAX_RECORDS`)."""
    stripped = output.strip()
    if not stripped:
        return []
    if stripped[0] in "{[" and len(stripped) <= _JSON_MAX_CHARS:
        try:
            data = json.loads(stripped)
        except ValueError:
            data = None
        if isinstance(data, dict | list):
            texts = _json_records(data)[:_MAX_RECORDS]
            failed = _failed_lines("\n".join(texts))
            return [_record(text, k, failed=text in failed) for k, text in enumerate(texts)]
    parsed = _json_lines(output.split("\n"))
    if parsed is not None:
        logged = [(index, _compact_json(obj)) for index, obj in parsed[:_MAX_RECORDS]]
        failed = _failed_lines("\n".join(text for _, text in logged))
        return [_record(text, index, failed=text in failed) for index, text in logged]
    lines = segmented(output).split("\n")
    failed = _failed_lines("\n".join(lines))
    records = []
    # (indent, index, text) of the lines above, outermost first.
    headings: list[tuple[int, int, str]] = []
    for index, line in enumerate(lines):
        text = quoted_line(line)
        if not text or not any(ch.isalnum() for ch in text):
            continue
        indent = _indent(line)
        while headings and headings[-1][0] >= indent:
            headings.pop()
        heading = headings[-1][2] if headings else ""
        if _TRACE_HEAD.match(heading):
            heading = ""  # `Traceback (most recent call last):` names nothing
        records.append(
            _record(
                text,
                index,
                heading if len(heading) <= _HEADING_CHARS else "",
                failed=text in failed,
            )
        )
        # A heading is the line itself, never its own heading in turn (a nested failure does
        # not repeat every level above it).
        headings.append((indent, index, text))
        if len(records) >= _MAX_RECORDS:
            break
    return records


def _json_lines(lines: Sequence[str]) -> list[tuple[int, dict[str, object]]] | None:
    """A JSON-lines log's objects (with their line), when most lines are one; else None."""
    objects: list[tuple[int, dict[str, object]]] = []
    other = 0
    for index, line in enumerate(lines):
        text = line.strip()
        if not text:
            continue
        if text.startswith("{") and text.endswith("}"):
            try:
                value = json.loads(text)
            except ValueError:
                value = None
            if isinstance(value, dict):
                objects.append((index, value))
                continue
        other += 1
    if len(objects) >= 3 and other <= len(objects) // 4:
        return objects
    return None


# --- the conversation around an output -----------------------------------------------------------


@dataclass(frozen=True)
class Message:
    """A message of the conversation as relevance reads it (folded events, in order)."""

    type: str
    content: str
    seq: int = 0
    name: str = ""
    tool_call_id: str = ""


@dataclass
class OutputContext:
    """What the conversation says about one output."""

    ask: set[str] = field(default_factory=set)  # the user's latest request
    intent: set[str] = field(default_factory=set)  # what the agent said it would do
    call: set[str] = field(default_factory=set)  # the call's arguments
    command: str = ""  # the call's arguments as a line (for a summary's citation)
    # The agent's first message after the output when it is unlike its routine ones and
    # restates nothing of the output: what it reacted to is in the output.
    reaction: bool = False
    # Words and numbers later messages name, by where they are named (seq or position).
    position: int = 0


@dataclass
class _Mentions:
    """Where each word and each number is named by the agent or the user (positions)."""

    words: dict[str, list[int]] = field(default_factory=dict)
    numbers: dict[tuple[int, str], list[int]] = field(default_factory=dict)
    prefixes: dict[str, list[int]] = field(default_factory=dict)
    task_end: list[int] = field(default_factory=list)  # positions of user messages

    def add(self, text: str, position: int) -> None:
        for word in terms_of(text):
            self.words.setdefault(word, []).append(position)
            hexed = _HEX_RUN.search(word)
            if hexed and len(hexed.group(0)) >= _HEX_PREFIX:
                # An abbreviated digest or commit (`5d3a9c0e…`, `a91f03c`): a prefix of the
                # value it names.
                self.prefixes.setdefault(hexed.group(0)[:_HEX_PREFIX], []).append(position)
        for value, decimals in _numbers(text, prose=True):
            if decimals == 0 and abs(value) < 100:
                continue  # `3`, `42`: too common to point at one record
            self.numbers.setdefault((decimals, _fmt(value, decimals)), []).append(position)

    def next_task_end(self, position: int) -> int:
        k = bisect_right(self.task_end, position)
        return self.task_end[k] if k < len(self.task_end) else 1 << 60

    def weight(self, positions: list[int] | None, after: int, end: int) -> float:
        """1 when named later in the same task, 0.4 when named later at all, else 0."""
        if not positions:
            return 0.0
        k = bisect_right(positions, after)
        if k >= len(positions):
            return 0.0
        return 1.0 if positions[k] < end else 0.4


def _fmt(value: float, decimals: int) -> str:
    return f"{round(value, decimals):.{decimals}f}"


_ROUTINE_SHAPE_MAX = 2
_HEX_RUN = re.compile(r"[0-9a-f]{7,}")
_HEX_PREFIX = 7
_ASK_MIN_WORDS = 3  # an agent message whose shape comes more often than this is routine


def _shape(text: str) -> str:
    return " ".join(w for w in _template(text)[:12] if w != "#")


# A failure or an outcome whose kind comes more often than this in the session's outputs is
# the routine's (the same warning on every build), not one output's verdict.
_VERDICT_ROUTINE = 3


class Conversation:
    """What a conversation says about each of its outputs: built once over the messages of a
    compaction (in order), then asked for any output's ranking (`rank`)."""

    def __init__(self, messages: Sequence[Message], *, later_text: str = "") -> None:
        self.messages = messages
        self.contexts, self.mentions = conversation_contexts(messages, later_text=later_text)
        self.records: dict[int, list[Record]] = {
            position: records_of(messages[position].content) for position in self.contexts
        }
        # In how many outputs each word comes: a word in most of them (the service under
        # investigation, the namespace) singles out none.
        self.spread: Counter[str] = Counter()
        for records in self.records.values():
            words: set[str] = set()
            for record in records:
                words |= record.words
            self.spread.update(words)
        self._call_templates: Counter[tuple[str, ...]] | None = None
        # In how many outputs each record template comes (built on the first verdict asked).
        self._outputs_with: Counter[tuple[str, ...]] | None = None
        # How often each record's template comes in the session's outputs (a failure repeated
        # run after run is one fact, said once with its count).
        self.templates: Counter[tuple[str, ...]] = Counter(
            record.template for records in self.records.values() for record in records
        )

        # Each call's request: the user's latest words and what the agent said before it.
        self._asks: dict[int, set[str]] = {}
        ask: set[str] = set()
        intent: set[str] = set()
        for position, message in enumerate(messages):
            if message.type == EventType.USER_MESSAGE:
                words = terms_of(message.content)
                if len(words) >= _ASK_MIN_WORDS:
                    ask = words
                intent = set()
            elif message.type == EventType.AGENT_MESSAGE:
                intent = terms_of(message.content)
            elif message.type == EventType.TOOL_CALL:
                self._asks[position] = ask | intent

    def rank(self, position: int, *, repeated_failures: bool = True) -> Outcome:
        """The output's records, best first. `repeated_failures`: whether a failure that
        comes back in output after output keeps its verdict (a summary states it once, with
        its count and seqs; a placeholder, which speaks for one output, leaves it out)."""
        outcome = rank_records(
            self.records[position], self.contexts[position], self.mentions, self.spread
        )
        return self._without_routine_verdicts(outcome, failures=not repeated_failures)

    def _without_routine_verdicts(self, outcome: Outcome, *, failures: bool) -> Outcome:
        """`outcome` with no verdict for a record that stands out in its output only as the
        session's routine does in every one (the deprecation warning each build prints, its
        `build finished`): a line of its own kind in this output whose kind comes in more than
        `_VERDICT_ROUTINE` of the session's outputs (a failure only when `failures`). An
        outlier among siblings of its own kind (the row whose figure breaks the column) keeps
        its verdict: its kind is its siblings'."""
        ranked = outcome.ranked
        if not any(r.verdict for r in ranked):
            return outcome
        if self._outputs_with is None:
            self._outputs_with = Counter()
            for records in self.records.values():
                self._outputs_with.update({record.template for record in records})
        here = Counter(r.record.template for r in ranked)
        changed = False
        fixed: list[Ranked] = []
        for r in ranked:
            template = r.record.template
            if (
                r.verdict
                and here[template] == 1
                and self._outputs_with[template] > _VERDICT_ROUTINE
                and (failures or not (r.record.failed or is_failure(r.record.text)))
            ):
                r = replace(r, score=r.score - r.verdict, verdict=0.0)
                changed = True
            fixed.append(r)
        if not changed:
            return outcome
        fixed.sort(key=lambda r: (-r.score, r.record.index))
        return Outcome(fixed, outcome.reaction, outcome.size)

    def verdict_lines(self, outcome: Outcome) -> list[Ranked]:
        """An output's verdicts, failures first, then outcomes, then a diff's added lines,
        each best first: its records that report a failure or a command's outcome (`Got 21
        results, configured to fail`, `BUILD FAILED`) or that a change added (`+ instant =
        …`), of a kind the session's routine does not repeat
        (the template in at most `_VERDICT_ROUTINE` records of all its outputs: the routine
        `0 errors` of every lint run is no verdict). A command's echo never is one. Whatever
        the conversation says of them, these are what the output concluded."""
        failures: list[Ranked] = []
        outcomes: list[Ranked] = []
        added: list[Ranked] = []
        for ranked in outcome.ranked:
            record = ranked.record
            if self.templates[record.template] > _VERDICT_ROUTINE or _ECHO.match(record.text):
                continue
            if record.failed or is_failure(record.text):
                failures.append(ranked)
            elif is_outcome(record.text):
                outcomes.append(ranked)
            elif _DIFF_ADDED.match(record.text):
                added.append(ranked)
        return failures + outcomes + added

    def call(self, position: int) -> CallRank | None:
        """What a call (a TOOL_CALL among the messages) is worth quoting: a change it made
        (an edit's added lines, a command that writes, deploys, commits), a command the user
        asked for in their words, a command later messages name; not a routine check."""
        if self._call_templates is None:
            self._call_templates = Counter(
                _template(_command(m.content))
                for m in self.messages
                if m.type == EventType.TOOL_CALL
            )
        message = self.messages[position]
        return rank_call(
            message,
            ask=self._asks.get(position, set()),
            mentions=self.mentions,
            spread=self.spread,
            repeats=self._call_templates[_template(_command(message.content))],
            position=position,
        )


def conversation_contexts(
    messages: Sequence[Message], *, later_text: str = ""
) -> tuple[dict[int, OutputContext], _Mentions]:
    """For each TOOL_RESULT among `messages` (by its position), what the conversation says
    about it; and where every word and number is named later (`later_text`: what comes after
    all of `messages`, the events a compaction keeps, counted as named after every output)."""
    mentions = _Mentions()
    shapes: Counter[str] = Counter()
    for position, message in enumerate(messages):
        if message.type in (EventType.AGENT_MESSAGE, EventType.USER_MESSAGE):
            mentions.add(message.content, position)
            if message.type == EventType.USER_MESSAGE:
                mentions.task_end.append(position)
            else:
                shapes[_shape(message.content)] += 1
        elif message.type == EventType.TOOL_CALL:
            # A later call that names a value of an output acts on it (`sed -n '1284872p'`
            # after the line that names row 1284872, `grep -rn toMoney` after the error).
            mentions.add(_command(message.content), position)
    if later_text:
        mentions.add(later_text, len(messages))
    calls: dict[str, int] = {}
    contexts: dict[int, OutputContext] = {}
    ask: set[str] = set()
    intent: set[str] = set()
    last_call = -1
    for position, message in enumerate(messages):
        kind = message.type
        if kind == EventType.USER_MESSAGE:
            words = terms_of(message.content)
            # A nudge ("go on", "ok") asks nothing new: the request before it still stands.
            if len(words) >= _ASK_MIN_WORDS:
                ask = words
            intent = set()
        elif kind == EventType.AGENT_MESSAGE:
            intent = terms_of(message.content)
        elif kind == EventType.TOOL_CALL:
            last_call = position
            if message.tool_call_id:
                calls[message.tool_call_id] = position
        elif kind == EventType.TOOL_RESULT:
            at = calls.get(message.tool_call_id, last_call) if message.tool_call_id else last_call
            call = messages[at] if 0 <= at < position else None
            command = _command(call.content) if call is not None else ""
            contexts[position] = OutputContext(
                ask=set(ask),
                intent=set(intent),
                call=terms_of(command),
                command=command,
                reaction=_reacts(messages, position, shapes),
                position=position,
            )
    return contexts, mentions


def _command(arguments: str) -> str:
    """A call's arguments as one line: its command or query when it has one, else its JSON."""
    text = arguments.strip()
    try:
        data = json.loads(text)
    except ValueError:
        return " ".join(text.split())
    if isinstance(data, dict):
        for key in ("command", "cmd", "query", "sql", "path", "file", "url", "pattern", "args"):
            value = data.get(key)
            if isinstance(value, str) and value.strip():
                return " ".join(value.split())
            if isinstance(value, list) and value and all(isinstance(x, str) for x in value):
                return " ".join(value)
    return " ".join(text.split())


def _reacts(messages: Sequence[Message], position: int, shapes: Counter[str]) -> bool:
    """Whether the agent's first message after the output is a reaction to it: unlike its
    routine messages (its shape comes at most twice in the session) and naming no value (a
    message that restates values is read by mentions instead)."""
    for message in messages[position + 1 : position + 4]:
        if message.type == EventType.AGENT_MESSAGE:
            if shapes[_shape(message.content)] > _ROUTINE_SHAPE_MAX:
                return False
            head = message.content.strip().split("\n", 1)[0]
            return len(head.split()) <= 40 and not _numbers(head) and len(head) > 0
        if message.type in (EventType.USER_MESSAGE, EventType.TOOL_CALL):
            return False
    return False


# --- ranking ------------------------------------------------------------------------------------

# A failure or a warning (a failure glyph; a version replaced by another, a conflict resolved:
# `protobuf-java:3.25.3 -> 4.27.2`).
_SIGNAL = re.compile(
    r"error|fail|fatal|panic|exception|denied|refused|conflict|violat|invalid|mismatch"
    r"|did not match|not found|no such|timed out|exceeded|exhausted|insufficient|unable"
    r"|cannot|could not|crashloop|backoff|oomkilled|killed|evict|warning|critical|vulnerab"
    r"|unhealthy|unavailable|rejected|forbidden|unauthori[sz]ed|abort|segfault|traceback"
    r"|no matching|not match|doesn't match|not recognized|first bad commit|exited \(|roll(?:ed)? ?back"
    r"|eacces|eperm|[✕✗✖❌●]|\d[\w.]* -> \d"
    r"|\bexit(?:ed)?(?: with)?(?: status| code)?[:=]?\s*\(?[1-9]\d*",
    re.IGNORECASE,
)
# A command's outcome: its exit status or the line that sums it up.
_OUTCOME = re.compile(
    r"\bexit(?:ed)?(?: with)?(?: status| code)?[:=]?\s*\(?-?\d|\bBUILD (?:FAILED|SUCCESS(?:FUL)?)"
    r"|\b\d+ (?:failed|passed|errors?|warnings?|problems?|vulnerabilit\w+|tests? completed)\b"
    r"|\(\d+ rows?\)|\brows? in set\b|\bTests?:\s+\d|\bTest Suites:|\bFound \d+ errors?"
    r"|\bRan \d+ tests?|\bDone\. PASS=|\btest result:|\bFAILED\b"
    r"|^\s*(?:summary|total|totals|result|results|overall)\b\s*:",
    re.IGNORECASE,
)
_TRACE_HEAD = re.compile(r"^Traceback \(most recent call last\):?$")
# An exception's own line: `KeyError: 'tenant_id_7'`, `java.lang.NoSuchMethodError: …`,
# `Caused by: org.postgresql.util.PSQLException: …`.
_EXCEPTION = re.compile(
    r"^(?:Caused by: )?(?:[\w$]+\.)*[A-Z]\w*(?:Error|Exception|Fault|Panic)\b(?::\s|$)"
)
_SETTING = re.compile(r"^\s*[+-]?([A-Za-z_][\w.-]{2,})\s*(?:=|: )\s*(\S.*)$")
# A diff's added line (not its `+++` file header): what the change made.
_DIFF_ADDED = re.compile(r"^\+(?!\+\+\s)\s*\S")
# A diff's added or removed line (not its `+++`/`---` file headers).
_DIFF_LINE = re.compile(r"^[+-](?![+-]{2}\s)(?=\S)")


@dataclass(frozen=True)
class Ranked:
    """A record with how much the conversation says it matters, and why."""

    record: Record
    score: float
    relevance: float
    mention: float
    verdict: float
    reacted: bool = False
    subject: bool = False

    @property
    def pointed_at(self) -> bool:
        """Whether anything beyond sharing the request's words marks it: a later message
        names it, the agent reacted to it, it stands out among its siblings, or it is the
        one record that names what the call asked about (the pod of `describe`). Words of the
        request alone are what routine output of the same task shares too."""
        return self.mention >= 0.5 or self.verdict >= 1.5 or self.reacted or self.subject


@dataclass(frozen=True)
class Outcome:
    """An output's records best first, and whether the agent reacted to it."""

    ranked: list[Ranked]
    reaction: bool
    size: int  # records in the output


def rank_output(output: str, context: OutputContext, mentions: _Mentions) -> Outcome:
    """The records of `output`, best first, by what the conversation says of them (an output
    judged alone: every word as specific as it is within the output)."""
    return rank_records(records_of(output), context, mentions, Counter())


_SEPARATED = re.compile(r"\w[-_./:@]\w")


def _specific(word: str, spread: Counter[str]) -> bool:
    """A word that names one thing when a message names it: with a digit or a separator in
    it (`v2.31.0`, `checkout-api-7c9d8b6f5-qx2lm`, `stg_shop__orders`), or a long word few
    outputs hold (`oomkilled`, `makeextensionsimmutable`); not `output` or `option`."""
    if len(word) < 4:
        return False
    if _HAS_DIGIT.search(word) or _SEPARATED.search(word):
        return True
    return len(word) >= 8 and spread.get(word, 1) <= 3


def _specificity(spread: int) -> float:
    """How much a word points at one output: 1 when it comes in one or two of them, less the
    more it comes (0.56 in ten, 0.37 in a hundred)."""
    return min(1.0, 2.5 / (1 + math.log2(1 + spread)))


def _combined(contributions: list[float], cap: float) -> float:
    """The best contribution and a little of the rest: a record naming one asked-for thing is
    not outranked by one naming five common ones."""
    if not contributions:
        return 0.0
    best = max(contributions)
    return min(best + 0.3 * (sum(contributions) - best), cap)


_REACTION_BONUS = 3.0
# The relevance at which the best-answering record names the output's subject.
_SUBJECT_RELEVANCE = 2.0
_RELEVANCE_CAP = 4.0
_MENTION_CAP = 4.0


def rank_records(
    records: Sequence[Record],
    context: OutputContext,
    mentions: _Mentions,
    spread: Counter[str],
) -> Outcome:
    """`records` (one output's), best first, by what the conversation says of them."""
    n = len(records)
    if not n:
        return Outcome([], context.reaction, 0)
    df: Counter[str] = Counter()
    for record in records:
        df.update(record.words)

    def weight(word: str) -> float:
        return math.log(1 + n / df[word]) * _specificity(spread.get(word, 1))

    verdicts = _verdicts(records)
    end = mentions.next_task_end(context.position)
    ranked = []
    for k, record in enumerate(records):
        asked = (
            [weight(w) for w in record.words & context.ask]
            + [0.7 * weight(w) for w in record.words & context.intent]
            + [0.5 * weight(w) for w in record.words & context.call]
        )
        relevance = _combined(asked, _RELEVANCE_CAP)
        named = []
        for word in record.words:
            if _specific(word, spread):
                later = mentions.weight(mentions.words.get(word), context.position, end)
                if not later and mentions.prefixes:
                    hexed = _HEX_RUN.search(word)
                    if hexed and len(hexed.group(0)) >= _HEX_PREFIX:
                        later = mentions.weight(
                            mentions.prefixes.get(hexed.group(0)[:_HEX_PREFIX]),
                            context.position,
                            end,
                        )
                if later:
                    named.append(later * weight(word))
        mention = _combined(named, _MENTION_CAP) + _number_mentions(
            record.text, mentions, context.position, end
        )
        verdict = verdicts[k]
        if _ECHO.match(record.text):
            # The command's own echo says what was run, which the call says already.
            relevance = mention = verdict = 0.0
        score = relevance + 1.5 * mention + verdict
        ranked.append(Ranked(record, score, relevance, mention, verdict))
    subject = max(range(n), key=lambda i: (ranked[i].relevance, -i))
    if ranked[subject].relevance >= _SUBJECT_RELEVANCE:
        # The record that best answers the request names the output's subject: one line
        # that says what the cleared output was about.
        r = ranked[subject]
        ranked[subject] = Ranked(r.record, r.score, r.relevance, r.mention, r.verdict, subject=True)
    if context.reaction:
        # What the agent reacted to is among the output's best records by what they answer
        # and how they stand out: those rank as if named.
        best = sorted(range(n), key=lambda i: (-(ranked[i].relevance + ranked[i].verdict), i))
        for i in best[:2]:
            r = ranked[i]
            ranked[i] = Ranked(
                r.record,
                r.score + _REACTION_BONUS,
                r.relevance,
                r.mention,
                r.verdict,
                True,
                r.subject,
            )
    ranked.sort(key=lambda r: (-r.score, r.record.index))
    # The same record twice (a dependency tree repeats a resolved conflict) is one fact.
    seen: set[str] = set()
    unique = []
    for r in ranked:
        if r.record.text not in seen:
            seen.add(r.record.text)
            unique.append(r)
    return Outcome(unique, context.reaction, n)


def _number_mentions(text: str, mentions: _Mentions, position: int, end: int) -> float:
    """Numbers of `text` a later message names, as they are or rounded (also as a percent)."""
    if not mentions.numbers:
        return 0.0
    best = 0.0
    for match in _NUMBER.finditer(text):
        raw = match.group(0)
        if _significant(raw) < 3:
            continue
        value = float(raw)
        for scale in (1.0, 100.0):
            for decimals in range(0, 4):
                scaled = value * scale
                if decimals == 0 and abs(scaled) < 100:
                    continue
                positions = mentions.numbers.get((decimals, _fmt(scaled, decimals)))
                weight = mentions.weight(positions, position, end)
                best = max(best, 2.0 * weight)
    return best


def _verdicts(records: Sequence[Record]) -> list[float]:
    """How much each record stands out among its siblings."""
    n = len(records)
    scores = [0.0] * n
    # A record reports a failure, or details one (it sits under a failure's line).
    signal = [
        r.failed or bool(_SIGNAL.search(r.text)) or bool(r.heading and _SIGNAL.search(r.heading))
        for r in records
    ]
    signal_share = sum(signal) / n
    signs = sum(1 for r in records if _DIFF_LINE.match(r.text))
    diff = any(r.text.startswith(("@@", "diff --git", "--- a/")) for r in records[:50]) or (
        signs and signs * 2 >= len(records)
    )
    # A failure among lines that report none tells, and so does each of a compiler's few
    # errors (one error repeated is one failure); a log of a hundred kinds of warning does not.
    kinds = {r.template for r, failing in zip(records, signal, strict=True) if failing}
    few = len(kinds) <= _FEW_FAILURES or signal_share <= 0.25
    for k, record in enumerate(records):
        if _TRACE_HEAD.match(record.text):
            continue  # `Traceback (most recent call last):` announces; the exception tells
        if _EXCEPTION.match(record.text):
            scores[k] += 2.5  # the exception a trace ends with (or is caused by)
        outcome = _OUTCOME.search(record.text) is not None
        if signal[k]:
            scores[k] += 2.0 if few else 0.5
            if not few and _LOCATION.search(record.text):
                # Among many failure lines (a build's boilerplate around one compiler error),
                # the one that says where it failed (`VatCalculator.java:57: error: …`).
                scores[k] += 1.0
        if outcome:
            # A command's outcome: a failing one is its verdict; a passing one is routine.
            scores[k] += 1.5 if signal[k] else 0.75
        if diff and _DIFF_LINE.match(record.text):
            scores[k] += 2.0  # what a change made (and what it replaced)
    for k in _column_breaks(records):
        scores[k] += 3.0
    templates = Counter(r.template for r in records)
    for k in _outliers(records, templates):
        scores[k] += 2.5
    for k in _settings_that_win(records):
        scores[k] += 2.0
    # Where a stack trace failed: its first frame in the project's own code (not a runtime's,
    # a framework's or an installed package's), and a cause's.
    for k in own_frames([r.text for r in records]):
        scores[k] += 2.5
    for k in _values_that_differ(records):
        scores[k] += 2.0
    return scores


_DIGEST = re.compile(r"\b(?:sha\d+:|md5:)?[0-9a-fA-F]{16,}\b")
# A source location: a file with its extension and a line number (`src/app.ts:41`, `x.go:203:9`).
_LOCATION = re.compile(r"[\w./-]+\.[A-Za-z]\w{0,5}:\d+\b")


def _values_that_differ(records: Sequence[Record]) -> set[int]:
    """Records that say the same of one thing but with another digest (a checksum listed and
    the one computed, an image's expected and actual digest): a mismatch, each side of it."""
    keyed: dict[str, list[tuple[int, tuple[str, ...]]]] = {}
    for k, record in enumerate(records):
        digests = tuple(_DIGEST.findall(record.text))
        if digests:
            key = " ".join(_DIGEST.sub(" ", record.text).split())
            if key:
                keyed.setdefault(key, []).append((k, digests))
    found: set[int] = set()
    for given in keyed.values():
        if 2 <= len(given) <= 3 and len({d for _, d in given}) >= 2:
            found.update(k for k, _ in given)
    return found


# A column is a word position; it has a usual value when this share of the records that reach
# it hold the same word there (`Running` in a pod listing's STATUS column, `UP-TO-DATE`, `OK`).
_USUAL_SHARE = 0.6
_FEW_FAILURES = 8
_COLUMNS = 8


def _column_breaks(records: Sequence[Record]) -> set[int]:
    """Records that break their siblings' pattern: in a column whose records mostly hold one
    and the same word, a word one record (or 5 % of them) holds instead — the pod in
    CrashLoopBackOff among Running ones, the task FAILED among UP-TO-DATE ones, the checksum
    line marked FAILED among OK ones. A column of names or values (all different) has no
    usual word, so a name is never a break; and only a sibling breaks: a record that holds
    the usual word (or value) in most other columns (a table's header holds none)."""
    found: set[int] = set()
    if len(records) < 4:
        return found
    usual: dict[int, str] = {}
    counts: dict[int, Counter[str]] = {}
    for column in range(_COLUMNS):
        words = [r.template[column] for r in records if len(r.template) > column]
        if len(words) < 4:
            continue
        counted = Counter(words)
        word, times = counted.most_common(1)[0]
        if times >= _USUAL_SHARE * len(words):
            usual[column] = word
            counts[column] = counted
    for column, word in usual.items():
        if word == "#":
            continue
        rare = max(1, sum(counts[column].values()) // 20)
        for k, record in enumerate(records):
            if len(record.template) <= column:
                continue
            mine = record.template[column]
            if mine in (word, "#") or counts[column][mine] > rare:
                continue
            others = [c for c in usual if c != column and len(record.template) > c]
            agree = sum(record.template[c] == usual[c] for c in others)
            if others and agree * 2 >= len(others):
                found.add(k)
    return found


def _outliers(records: Sequence[Record], templates: Counter[tuple[str, ...]]) -> set[int]:
    """Records whose value is far outside its siblings' (the same template, five or more, the
    same numeric fields): the extreme ones and the first of a run of them (a jump)."""
    found: set[int] = set()
    groups: dict[tuple[str, ...], list[int]] = {}
    for k, record in enumerate(records):
        if templates[record.template] >= 5:
            groups.setdefault(record.template, []).append(k)
    for members in groups.values():
        rows = {k: _numeric_fields(records[k].text) for k in members}
        width = Counter(len(v) for v in rows.values()).most_common(1)[0][0]
        aligned = [(k, v) for k, v in rows.items() if len(v) == width]
        if len(aligned) < 5:
            continue
        for slot in range(width):
            values = [(k, v[slot]) for k, v in aligned]
            xs = sorted(v for _, v in values)
            median = xs[len(xs) // 2]
            spread = sorted(abs(v - median) for v in xs)[len(xs) // 2]
            if len(set(xs)) > 0.9 * len(xs) and spread > 0.5 * abs(median):
                continue  # ids, counters, times: every value differs widely, none stands out
            limit = max(6 * spread, 0.5 * abs(median), 1e-9)
            far = [k for k, v in values if abs(v - median) > limit]
            if not far or len(far) > max(1, len(values) // 5):
                continue
            found.add(far[0])  # the first of them: where it jumped
            by_key = dict(values)
            found.add(max(far, key=lambda k: abs(by_key[k] - median)))
    return found


def _settings_that_win(records: Sequence[Record]) -> set[int]:
    """Of a setting given more than once with other values (a config and the environment
    that overrides it), the last and the first."""
    seen: dict[str, list[tuple[int, str]]] = {}
    for k, record in enumerate(records):
        match = _SETTING.match(record.text)
        if match:
            seen.setdefault(match.group(1), []).append((k, match.group(2).strip()))
    found: set[int] = set()
    for given in seen.values():
        if len(given) >= 2 and len({value for _, value in given}) >= 2:
            found.add(given[-1][0])
            found.add(given[0][0])
    return found


def messages_of(items: Iterable[tuple[str, str, int, str, str]]) -> list[Message]:
    """`Message`s from (type, content, seq, name, tool_call_id) tuples."""
    return [Message(type=t, content=c, seq=s, name=n, tool_call_id=i) for t, c, s, n, i in items]


def is_failure(text: str) -> bool:
    """Whether a record reports a failure, an error or a warning."""
    return _SIGNAL.search(text) is not None


def is_echo(text: str) -> bool:
    """Whether a record is a command's own echo (`$ make test`)."""
    return _ECHO.match(text) is not None


def is_outcome(text: str) -> bool:
    """Whether a record is a command's outcome (its exit status, its closing summary)."""
    return _OUTCOME.search(text) is not None


# --- calls --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallRank:
    """A call as a summary may quote it, and how much it is worth."""

    text: str
    score: float
    change: bool


# A command that changes something (writes, deploys, commits, installs, migrates, rolls back).
_CHANGE = re.compile(
    r"\b(?:apply|patch|edit|write|commit|push|merge|rebase|revert|undo|rollout|deploy|migrate"
    r"|install|upgrade|uninstall|bump|set|create|delete|drop|alter|insert|update|truncate|scale"
    r"|restart|rm|mv|cp|chmod|chown|tee|touch|mkdir|dbt run|terraform apply|switch -c"
    r"|checkout -b|pr create)\b|\bsed -i|(?<![<>2&])>>?\s*[\w./-]",
    re.IGNORECASE,
)
_EDIT_KEYS = (
    "patch",
    "diff",
    "new_string",
    "new_str",
    "content",
    "contents",
    "new_text",
    "replace",
)
_PATH_KEYS = ("path", "file", "file_path", "filename", "target_file")
_CALL_CHARS = 240
_ADDED_LINES = 6


def _edit_text(arguments: str) -> str | None:
    """An edit's path and the lines it adds, or None when the call is not an edit."""
    try:
        data = json.loads(arguments)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    body = next((data[k] for k in _EDIT_KEYS if isinstance(data.get(k), str)), None)
    if body is None:
        return None
    path = next((data[k] for k in _PATH_KEYS if isinstance(data.get(k), str)), "")
    lines = body.split("\n")
    added = [
        line[1:].strip() for line in lines if line.startswith("+") and not line.startswith("+++")
    ]
    if not added:
        added = [line.strip() for line in lines if line.strip()][:_ADDED_LINES]
    if not path:
        found = re.search(r"\*\*\* (?:Update|Add) File: (\S+)|\+\+\+ b/(\S+)", body)
        if found:
            path = found.group(1) or found.group(2) or ""
    shown = " | ".join(x for x in added[:_ADDED_LINES] if x)
    return f"{path}: {shown}" if path else shown


def rank_call(
    message: Message,
    *,
    ask: set[str],
    mentions: _Mentions,
    spread: Counter[str],
    repeats: int,
    position: int,
) -> CallRank | None:
    edit = _edit_text(message.content)
    command = _command(message.content)
    text = edit if edit is not None else command
    if not text:
        return None
    if len(text) > _CALL_CHARS:
        text = text[: _CALL_CHARS - 1] + "…"
    change = edit is not None or bool(_CHANGE.search(command))
    words = terms_of(text)
    asked = _combined([_specificity(spread.get(w, 1)) for w in words & ask], _RELEVANCE_CAP)
    end = mentions.next_task_end(position)
    named = _combined(
        [
            mentions.weight(mentions.words.get(w), position, end) * _specificity(spread.get(w, 1))
            for w in words
            if _specific(w, spread)
        ],
        _MENTION_CAP,
    )
    novelty = 2.0 if repeats <= 1 else (1.0 if repeats <= 3 else 0.0)
    score = novelty + asked + 1.5 * named + (2.5 if change else 0.0)
    return CallRank(text=text, score=score, change=change)
