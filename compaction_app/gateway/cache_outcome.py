"""Why a call hit or missed the provider's prompt cache: a prediction from the ledger's record
of what the gateway forwarded, set beside what the provider reported. Pure: no Django, no
ORM, no settings.

Every provider caches a prompt by its prefix: tools, then the system prompt, then the
messages in order (Anthropic renders them so; OpenAI and Gemini read the prompt from its
start the same way). A call can read from the cache what an earlier call wrote there, up to
the first thing that differs, if that earlier entry is still alive (the provider's
lifetime, refreshed by every read) and long enough (the provider's minimum cacheable size).
So the outcome of a call follows from the previous call of its thread: what each of them
forwarded (a `Fingerprint`: a digest per message, the tools' digest, the model, where the
cache breakpoints were) and how long apart they were.

Outcomes: `hit` (everything the previous call forwarded is read again), `partial` (a
cacheable prefix of it is), `miss` (nothing is), `not_cacheable` (the request cannot be
cached at all: shorter than the provider's minimum, or, on Anthropic, no `cache_control`
breakpoint). Each with a reason: `tools_changed`, `system_changed`, `model_changed`,
`history_edited` (with the index and role of the first message that changed, and how),
`ttl_expired`, `below_minimum`, `compaction` (the gateway's or the client's), `no_cache_marker`,
`first_call`.

Each provider package says its rules (`cache_rules(model)`: minimum, lifetime, explicit or
automatic caching), with the documentation they come from.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

HIT = "hit"
PARTIAL = "partial"
MISS = "miss"
NOT_CACHEABLE = "not_cacheable"
OUTCOMES = (HIT, PARTIAL, MISS, NOT_CACHEABLE)

TOOLS_CHANGED = "tools_changed"
SYSTEM_CHANGED = "system_changed"
MODEL_CHANGED = "model_changed"
HISTORY_EDITED = "history_edited"
TTL_EXPIRED = "ttl_expired"
BELOW_MINIMUM = "below_minimum"
COMPACTION = "compaction"
NO_CACHE_MARKER = "no_cache_marker"
FIRST_CALL = "first_call"
REASONS = (
    TOOLS_CHANGED,
    SYSTEM_CHANGED,
    MODEL_CHANGED,
    HISTORY_EDITED,
    TTL_EXPIRED,
    BELOW_MINIMUM,
    COMPACTION,
    NO_CACHE_MARKER,
    FIRST_CALL,
)

# A digest is this many hex characters of a message's identity hash (48 bits: compared
# position by position within one conversation, two different messages share one with a
# probability of 2^-48).
DIGEST_CHARS = 12
# A client's own compaction rewrites its history shorter: what follows the first change is
# at most this share of what followed it in the previous call.
CLIENT_COMPACTION_SHARE = 0.5
# Message content blocks (or items) that are a client-side or server-side compaction's summary.
COMPACTION_BLOCKS = frozenset({"compaction", "compaction_summary"})


@dataclass(frozen=True)
class CacheRules:
    """A provider's prompt cache, as its documentation states it (`source`).

    `explicit`: only what a `cache_control` breakpoint marks is cached (Anthropic); otherwise
    every prompt's prefix is (OpenAI, Gemini). `min_tokens`: the shortest cacheable prefix.
    `ttl_seconds`: how long an entry lives after its last use. `increment`: reads come in
    steps of this many tokens past the minimum (OpenAI: 128). `best_effort`: the provider
    promises no hit even when everything matches (Gemini's implicit caching)."""

    provider: str
    explicit: bool
    min_tokens: int
    ttl_seconds: int
    source: str
    increment: int = 0
    best_effort: bool = False


# A cut through a request: (u, n) is every unit before unit u and the first n parts (content
# blocks) of unit u; (-1, 0) is the tools alone. A breakpoint on a block ends the prefix it
# caches at the cut after that block.
Cut = tuple[int, int]
TOOLS_CUT: Cut = (-1, 0)


def within(cut: Cut, shared: Cut) -> bool:
    """Whether the prefix up to `cut` lies inside the prefix up to `shared` (both requests
    agree on it)."""
    return cut[0] < shared[0] or (cut[0] == shared[0] and cut[1] <= shared[1])


PART_CHARS = 8
# A role in a stored prefix: one character each.
ROLE_CODES = {
    "system": "s",
    "developer": "d",
    "user": "u",
    "assistant": "a",
    "model": "m",
    "tool": "t",
    "function": "f",
}
ROLE_NAMES = {code: role for role, code in ROLE_CODES.items()}


@dataclass(frozen=True)
class Part:
    """One content block of a message: its digest, its tokens (the message's tokens shared
    by the blocks' sizes) and the lifetime its breakpoint asks for (None: none)."""

    digest: str
    tokens: int
    mark: int | None = None


@dataclass(frozen=True)
class Unit:
    """One message of a forwarded request: its identity digest, its role, its tokens (our
    count), its content blocks when it has several (Anthropic caches at block boundaries:
    a system prompt of two blocks can keep its first one cached), and the lifetime of its
    breakpoint when it has one on the message as a whole."""

    digest: str
    role: str
    tokens: int
    mark: int | None = None
    parts: tuple[Part, ...] = ()


@dataclass(frozen=True)
class Fingerprint:
    """What a forwarded request's cache depends on. `units` are the wire's units (the system
    prompt first where the wire keeps it apart, then the messages); `tools` the digest of the
    tool definitions ("" for none) and `tools_tokens` their cost; `auto` the lifetime of a
    top-level `cache_control` (Anthropic's automatic caching: a breakpoint on the last
    block), `ttl` a lifetime the request asks for (OpenAI's `prompt_cache_retention`)."""

    model: str
    tools: str
    tools_tokens: int
    units: tuple[Unit, ...]
    auto: int | None = None
    ttl: int | None = None
    tools_mark: int | None = None
    compaction_blocks: frozenset[int] = frozenset()

    @property
    def tokens(self) -> int:
        return self.tools_tokens + sum(unit.tokens for unit in self.units)

    def upto(self, count: int) -> int:
        """Tokens of the tools and the first `count` units."""
        return self.tools_tokens + sum(unit.tokens for unit in self.units[:count])

    def at(self, cut: Cut) -> int:
        """Tokens of the prefix up to `cut`."""
        unit, count = cut
        if unit < 0:
            return self.tools_tokens
        tokens = self.upto(unit)
        if count and unit < len(self.units):
            whole = self.units[unit]
            # A message kept without its blocks is one block: the cut after it is all of it.
            tokens += (
                sum(part.tokens for part in whole.parts[:count]) if whole.parts else whole.tokens
            )
        return tokens

    def sizes(self) -> list[int]:
        return [len(unit.parts) or 1 for unit in self.units]

    def marks(self) -> list[tuple[Cut, int]]:
        """(cut, lifetime) of each breakpoint: where the prefix it caches ends."""
        found: list[tuple[Cut, int]] = [(TOOLS_CUT, self.tools_mark)] if self.tools_mark else []
        sizes = self.sizes()
        for index, unit in enumerate(self.units):
            for number, part in enumerate(unit.parts):
                if part.mark:
                    found.append(((index, number + 1), part.mark))
            if unit.mark and not unit.parts:
                found.append(((index, sizes[index]), unit.mark))
        if self.auto and self.units:
            found.append(((len(self.units) - 1, sizes[-1]), self.auto))
        return sorted(found)

    def stored(self) -> dict[str, Any]:
        """What the ledger keeps of it (Call.prefix): digests, roles, block digests of the
        messages that have several blocks, breakpoints as [unit, block, lifetime]."""
        marks: list[list[int]] = []
        for index, unit in enumerate(self.units):
            if unit.parts:
                marks += [[index, n, part.mark] for n, part in enumerate(unit.parts) if part.mark]
            elif unit.mark:
                marks.append([index, 0, unit.mark])
        return {
            "model": self.model,
            "tools": self.tools,
            "digests": "".join(unit.digest for unit in self.units),
            "roles": "".join(ROLE_CODES.get(unit.role, "o") for unit in self.units),
            "parts": {
                str(index): "".join(part.digest for part in unit.parts)
                for index, unit in enumerate(self.units)
                if unit.parts
            },
            "marks": marks,
            "auto": self.auto,
            "ttl": self.ttl,
            "toolsMark": self.tools_mark,
            "tokens": self.tokens,
        }


@dataclass(frozen=True)
class Previous:
    """The previous call's fingerprint as the ledger kept it, and when it was forwarded."""

    model: str
    tools: str
    digests: tuple[str, ...]
    roles: tuple[str, ...]
    marks: tuple[tuple[int, int, int], ...]
    tokens: int
    at: float  # seconds since the epoch
    call_id: str = ""
    thread: str = ""
    auto: int | None = None
    ttl: int | None = None
    tools_mark: int | None = None
    parts: dict[int, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def of(
        cls, stored: dict[str, Any], *, at: float, call_id: str = "", thread: str = ""
    ) -> Previous:
        text = str(stored.get("digests") or "")
        digests = tuple(text[i : i + DIGEST_CHARS] for i in range(0, len(text), DIGEST_CHARS))
        marks = tuple(
            (int(mark[0]), int(mark[1]), int(mark[2]))
            for mark in stored.get("marks") or ()
            if isinstance(mark, list)
            and len(mark) == 3
            and all(isinstance(value, int) for value in mark)
        )
        parts: dict[int, tuple[str, ...]] = {}
        for key, value in (stored.get("parts") or {}).items():
            if str(key).isdigit() and isinstance(value, str):
                parts[int(key)] = tuple(
                    value[i : i + PART_CHARS] for i in range(0, len(value), PART_CHARS)
                )

        def number(name: str) -> int | None:
            value = stored.get(name)
            return value if isinstance(value, int) else None

        return cls(
            model=str(stored.get("model") or ""),
            tools=str(stored.get("tools") or ""),
            digests=digests,
            roles=tuple(ROLE_NAMES.get(code, "other") for code in str(stored.get("roles") or "")),
            marks=marks,
            tokens=int(stored.get("tokens") or 0),
            at=at,
            call_id=call_id,
            thread=thread,
            auto=number("auto"),
            ttl=number("ttl"),
            tools_mark=number("toolsMark"),
            parts=parts,
        )

    def sizes(self) -> list[int]:
        return [len(self.parts.get(index, ())) or 1 for index in range(len(self.digests))]

    def mark_positions(self) -> list[tuple[Cut, int]]:
        """(cut, lifetime) of each breakpoint the previous call had."""
        sizes = self.sizes()
        found: list[tuple[Cut, int]] = [(TOOLS_CUT, self.tools_mark)] if self.tools_mark else []
        found += [((unit, part + 1), ttl) for unit, part, ttl in self.marks]
        if self.auto and self.digests:
            found.append(((len(self.digests) - 1, sizes[-1]), self.auto))
        return sorted(found)


@dataclass(frozen=True)
class Outcome:
    outcome: str
    reason: str | None
    shared_tokens: int = 0
    predicted_read: int = 0
    prompt_tokens: int = 0
    first_changed: dict[str, Any] | None = None
    change: str | None = None
    by: str | None = None
    gap_seconds: float | None = None
    ttl_seconds: int | None = None
    min_tokens: int = 0
    previous_call: str = ""
    previous_thread: str = ""
    # Tokens of the request's newest messages (after the last one the previous call also
    # sent): what is written or read fresh whatever happened before them.
    new_tokens: int = 0

    def document(
        self, *, provider_read: int | None, provider_write: int | None, rules: CacheRules
    ) -> dict[str, Any]:
        """The call's `cache` document: the prediction, the provider's figures, and whether
        they agree."""
        contradiction = contradicts(self, provider_read=provider_read, rules=rules)
        return {
            "outcome": self.outcome,
            "reason": self.reason,
            "change": self.change,
            "by": self.by,
            "firstChangedMessage": self.first_changed,
            "sharedTokens": self.shared_tokens,
            "predictedCachedTokens": self.predicted_read,
            "promptTokens": self.prompt_tokens,
            "gapSeconds": None if self.gap_seconds is None else round(self.gap_seconds, 3),
            "ttlSeconds": self.ttl_seconds,
            "minimumTokens": self.min_tokens,
            "previousCallId": self.previous_call or None,
            "newTokens": self.new_tokens,
            "providerCachedTokens": provider_read,
            "providerCacheWriteTokens": provider_write,
            "agrees": None if provider_read is None else contradiction is None,
            "contradiction": contradiction,
        }


def contradicts(outcome: Outcome, *, provider_read: int | None, rules: CacheRules) -> str | None:
    """What the provider's figures say against the prediction (None: they agree, or the
    provider reported nothing)."""
    if provider_read is None:
        return None
    if outcome.outcome in (HIT, PARTIAL) and provider_read == 0:
        why = (
            " (Gemini's implicit caching is best effort)"
            if rules.best_effort
            else " (evicted early, or served by another cache)"
        )
        return (
            f"predicted {outcome.outcome} ({outcome.predicted_read:,} tokens readable), "
            f"but the provider read nothing from its cache{why}"
        )
    if outcome.outcome in (MISS, NOT_CACHEABLE) and provider_read > 0:
        return (
            f"predicted {outcome.outcome} ({outcome.reason}), but the provider read "
            f"{provider_read:,} tokens from its cache (a prefix another thread or an older "
            "call wrote, or an entry that outlived its documented lifetime)"
        )
    return None


def _readable(rules: CacheRules, tokens: int) -> int:
    """What an automatic cache reads of a `tokens`-long matching prefix."""
    if tokens < rules.min_tokens:
        return 0
    if rules.increment:
        return rules.min_tokens + (tokens - rules.min_tokens) // rules.increment * rules.increment
    return tokens


def first_difference(current: Fingerprint, previous: Previous) -> int:
    """The index of the first unit that differs (len of the shorter when one is a prefix)."""
    count = min(len(current.units), len(previous.digests))
    for index in range(count):
        if current.units[index].digest != previous.digests[index]:
            return index
    return count


def _shared_cut(current: Fingerprint, previous: Previous, first: int) -> Cut:
    """How far the two requests agree: up to unit `first`, and as many of its leading blocks
    as are the same in both."""
    if first >= len(current.units) or first >= len(previous.digests):
        return (first, 0)
    mine = [part.digest[:PART_CHARS] for part in current.units[first].parts]
    theirs = previous.parts.get(first, ())
    same = 0
    for a, b in zip(mine, theirs, strict=False):
        if a != b:
            break
        same += 1
    # A block that is the same but not the last of its unit: the unit itself differs after it.
    return (first, min(same, max(len(mine) - 1, 0)))


def predict(
    *,
    current: Fingerprint,
    previous: Previous | None,
    now: float,
    rules: CacheRules,
    compacted_by_gateway: str | None = None,
    client_marked: bool = False,
) -> Outcome:
    """The cache outcome of a call that forwarded `current`, `previous` being the last call
    of its thread (None: its first). `compacted_by_gateway`: how the gateway changed the
    thread's history since `previous` ("compacted" or "pruned"; None if it did not).
    `client_marked`: the client's own request had cache breakpoints that what the gateway
    forwarded has not (a request rebuilt from the ledger)."""
    prompt = current.tokens
    base: dict[str, Any] = {"prompt_tokens": prompt, "min_tokens": rules.min_tokens}
    if previous is not None:
        base["previous_call"] = previous.call_id
        base["previous_thread"] = previous.thread
    marks = current.marks()
    if rules.explicit and not marks:
        if client_marked:
            # The gateway forwarded a request rebuilt from the ledger, without the client's
            # breakpoints: its fitting, not the client, made the call uncacheable.
            return Outcome(
                NOT_CACHEABLE, COMPACTION, change="breakpoints_dropped", by="gateway", **base
            )
        return Outcome(NOT_CACHEABLE, NO_CACHE_MARKER, **base)
    cacheable = max((current.at(cut) for cut, _ in marks), default=0) if rules.explicit else prompt
    if cacheable < rules.min_tokens:
        return Outcome(NOT_CACHEABLE, BELOW_MINIMUM, **base)
    if previous is None:
        return Outcome(MISS, FIRST_CALL, **base)
    gap = max(now - previous.at, 0.0)
    ttl = _lifetime(rules, previous)
    base.update(gap_seconds=gap, ttl_seconds=ttl, new_tokens=_new_tokens(current, previous))
    if current.model != previous.model:
        return Outcome(MISS, MODEL_CHANGED, change="model", **base)
    if current.tools != previous.tools:
        return Outcome(MISS, TOOLS_CHANGED, change="tools", **base)
    first = first_difference(current, previous)
    if first < len(previous.digests):
        return _changed(current, previous, first, rules, compacted_by_gateway, gap, ttl, base)
    # The request starts with everything the previous one forwarded.
    shared = current.upto(first)
    if gap > ttl:
        return Outcome(MISS, TTL_EXPIRED, change="ttl", shared_tokens=shared, **base)
    read = _read(current, previous, (first, 0), rules, gap)
    if read <= 0:
        # Nothing the previous call wrote is long enough (or marked) to be read.
        return Outcome(MISS, BELOW_MINIMUM, shared_tokens=shared, **base)
    return Outcome(HIT, None, shared_tokens=shared, predicted_read=read, **base)


def _new_tokens(current: Fingerprint, previous: Previous) -> int:
    """Tokens of the units after the last one the previous call also sent."""
    known = set(previous.digests)
    last = -1
    for index, unit in enumerate(current.units):
        if unit.digest in known:
            last = index
    return sum(unit.tokens for unit in current.units[last + 1 :])


def _lifetime(rules: CacheRules, previous: Previous) -> int:
    """How long the previous call's entries live: the longest lifetime its breakpoints asked
    for (Anthropic's 5 minutes or 1 hour), the retention it asked for (OpenAI), else the
    provider's default."""
    asked = [ttl for _, ttl in previous.mark_positions()]
    if previous.ttl:
        asked.append(previous.ttl)
    return max(asked) if asked else rules.ttl_seconds


def _read(
    current: Fingerprint,
    previous: Previous,
    shared: Cut,
    rules: CacheRules,
    gap: float = 0.0,
) -> int:
    """Tokens the provider can read: an automatic cache reads the shared prefix (from its
    minimum, in its increments); an explicit one reads up to the furthest breakpoint of the
    previous call that lies within the shared prefix (if that prefix reaches the minimum and
    the current request has a breakpoint at or after it)."""
    if not rules.explicit:
        tokens = current.at(shared)
        return _readable(rules, min(tokens, previous.tokens or tokens))
    furthest = max((current.at(cut) for cut, _ in current.marks()), default=-1)
    best = 0
    for cut, lifetime in previous.mark_positions():
        # Each breakpoint's entry lives its own lifetime (a 1-hour system block outlives a
        # 5-minute tail).
        if within(cut, shared) and gap <= lifetime:
            tokens = current.at(cut)
            if rules.min_tokens <= tokens <= furthest:
                best = max(best, tokens)
    return best


def _changed(
    current: Fingerprint,
    previous: Previous,
    first: int,
    rules: CacheRules,
    compacted_by_gateway: str | None,
    gap: float,
    ttl: int,
    base: dict[str, Any],
) -> Outcome:
    role = (
        current.units[first].role
        if first < len(current.units)
        else (previous.roles[first] if first < len(previous.roles) else "")
    )
    if first >= len(current.units):
        how = "removed"
    elif first < len(previous.roles) and previous.roles[first] != role:
        how = "role"
    else:
        how = "content"
    cut = _shared_cut(current, previous, first)
    where: dict[str, Any] = {"index": first, "role": role, "change": how}
    if first < len(current.units) and current.units[first].parts:
        where["block"] = cut[1]
    shared = current.at(cut)
    system = role == "system" and all(unit.role == "system" for unit in current.units[:first])
    if compacted_by_gateway:
        reason, change, by = COMPACTION, compacted_by_gateway, "gateway"
    elif system:
        reason, change, by = SYSTEM_CHANGED, "system", None
    elif _client_compacted(current, previous, first):
        reason, change, by = COMPACTION, "compacted", "client"
    else:
        reason, change, by = HISTORY_EDITED, how, None
    if gap > ttl:
        return Outcome(
            MISS, TTL_EXPIRED, shared_tokens=shared, first_changed=where, change="ttl", **base
        )
    read = _read(current, previous, cut, rules, gap)
    return Outcome(
        PARTIAL if read > 0 else MISS,
        reason,
        shared_tokens=shared,
        predicted_read=read,
        first_changed=where,
        change=change,
        by=by,
        **base,
    )


def _client_compacted(current: Fingerprint, previous: Previous, first: int) -> bool:
    """Whether the client rewrote its own history: a compaction block (Anthropic's server-side
    compaction, OpenAI's compacted items) from the first change on, or a history that follows
    the change much shorter than it followed it before."""
    if any(index >= first for index in current.compaction_blocks):
        return True
    before = max(previous.tokens - current.upto(first), 0)
    after = current.tokens - current.upto(first)
    # Something must stand in for what was dropped: a history merely cut short is an edit.
    return before > 0 and 0 < after <= before * CLIENT_COMPACTION_SHARE


# --- fingerprints ---------------------------------------------------------------------------------

# A unit's identity and cost by the digest of its exact JSON: an agent resends its history on
# every call, so after the first call only its new messages are converted and counted.
_MEMO_MAX = 131_072
_memo: OrderedDict[tuple[str, bytes], Unit] = OrderedDict()
_memo_lock = threading.Lock()


def _raw_digest(value: Any) -> bytes:
    try:
        import orjson

        data = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except Exception:  # what orjson cannot write (a lone surrogate, a huge int)
        import json

        data = json.dumps(value, sort_keys=True, ensure_ascii=True, default=str).encode()
    return hashlib.blake2b(data, digest_size=16).digest()


def marks_in(value: Any, depth: int = 0) -> int | None:
    """The lifetime (seconds) of the longest `cache_control` breakpoint inside `value`."""
    if depth > 8:
        return None
    found: int | None = None
    if isinstance(value, dict):
        control = value.get("cache_control")
        if isinstance(control, dict):
            found = 3600 if control.get("ttl") == "1h" else 300
        for key, item in value.items():
            if key != "cache_control" and isinstance(item, dict | list):
                inner = marks_in(item, depth + 1)
                if inner is not None:
                    found = max(found or 0, inner)
    elif isinstance(value, list):
        for item in value:
            inner = marks_in(item, depth + 1)
            if inner is not None:
                found = max(found or 0, inner)
    return found


def _has_compaction_block(unit: Any) -> bool:
    if isinstance(unit, dict) and unit.get("type") in COMPACTION_BLOCKS:
        return True
    content = unit.get("content") if isinstance(unit, dict) else None
    return isinstance(content, list) and any(
        isinstance(block, dict) and block.get("type") in COMPACTION_BLOCKS for block in content
    )


def _blocks(unit: Any) -> list[Any]:
    """A unit's content blocks (Anthropic's blocks, OpenAI's content parts, Gemini's parts);
    text content is one text block, as the providers render it (a system prompt sent as a
    string and later as blocks keeps its first block's cache)."""
    content = unit.get("content") if isinstance(unit, dict) else None
    if isinstance(content, dict) and isinstance(content.get("parts"), list):
        content = content["parts"]
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return content
    return []


def _parts(unit: Any, tokens: int, role: str) -> tuple[Part, ...]:
    """The unit's blocks, kept for a system prompt or a message of several blocks: where a
    change inside a message can leave its first blocks cached (a summary block after the
    client's system blocks, a tool result added beside others). A one-block message changes
    whole, and its own digest says so."""
    blocks = _blocks(unit)
    if not blocks or (len(blocks) == 1 and role != "system"):
        return ()
    keys = [_raw_digest(_plain_block(block)) for block in blocks]
    sizes = [len(repr(block)) for block in blocks]
    whole = sum(sizes) or 1
    shares = [tokens * size // whole for size in sizes]
    shares[-1] += tokens - sum(shares)
    return tuple(
        Part(digest=key.hex()[:PART_CHARS], tokens=share, mark=marks_in(block))
        for key, share, block in zip(keys, shares, blocks, strict=True)
    )


def fingerprint(
    *,
    model: str,
    units: Sequence[dict[str, Any]],
    tools: Any,
    describe: Callable[[dict[str, Any], int], tuple[str, str, Any]],
    count: Callable[[list[Any]], list[int]],
    count_tools: Callable[[Any], int],
    encoding: str,
    auto: int | None = None,
    ttl: int | None = None,
) -> Fingerprint:
    """A forwarded request's fingerprint. `describe(unit, index)` gives a unit's (identity
    hash, role, what to count) as the wire reads it (thinking blocks and cache markers are not
    part of its identity); `count` the tokens of a list of those, in one batch. Both are
    memoized on the unit's exact JSON: a conversation's next call converts and counts only
    its new messages."""
    made: list[Unit | None] = []
    keys: list[tuple[str, bytes]] = []
    missing: list[tuple[int, str, str, Any]] = []
    blocks: set[int] = set()
    for index, unit in enumerate(units):
        key = (encoding, _raw_digest(unit))
        keys.append(key)
        with _memo_lock:
            found = _memo.get(key)
            if found is not None:
                _memo.move_to_end(key)
        if found is None:
            identity, role, rows = describe(unit, index)
            missing.append((index, identity, role, rows))
        made.append(found)
        if _has_compaction_block(unit):
            blocks.add(index)
    if missing:
        counted = count([rows for _, _, _, rows in missing])
        for (index, identity, role, _), tokens in zip(missing, counted, strict=True):
            unit = units[index]
            fresh = Unit(
                digest=identity[:DIGEST_CHARS].ljust(DIGEST_CHARS, "0"),
                role=role,
                tokens=tokens,
                mark=marks_in(unit),
                parts=_parts(unit, tokens, role),
            )
            made[index] = fresh
            with _memo_lock:
                _memo[keys[index]] = fresh
        with _memo_lock:
            while len(_memo) > _MEMO_MAX:
                _memo.popitem(last=False)
    tools_digest = _raw_digest(_without_marks(tools)).hex()[:DIGEST_CHARS] if tools else ""
    return Fingerprint(
        model=model,
        tools=tools_digest,
        tools_tokens=count_tools(tools) if tools else 0,
        units=tuple(unit for unit in made if unit is not None),
        auto=auto,
        ttl=ttl,
        tools_mark=marks_in(tools) if tools else None,
        compaction_blocks=frozenset(blocks),
    )


def _plain_block(block: Any) -> Any:
    """A block as its cache key: without breakpoints; a text part is its text whatever the
    wire calls it (`text`, `input_text`, Gemini's `{"text"}`)."""
    block = _without_marks(block)
    if isinstance(block, dict) and isinstance(block.get("text"), str) and len(block) <= 2:
        return {"type": "text", "text": block["text"]}
    return block


def _without_marks(value: Any) -> Any:
    """`value` without its `cache_control` keys (moving a breakpoint changes no prefix)."""
    if isinstance(value, dict):
        return {k: _without_marks(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_without_marks(v) for v in value]
    return value


@dataclass
class Prediction:
    """What calls.save hands the ledger: the outcome and the fingerprint to keep."""

    outcome: Outcome
    fingerprint: Fingerprint
    rules: CacheRules
    extra: dict[str, Any] = field(default_factory=dict)
