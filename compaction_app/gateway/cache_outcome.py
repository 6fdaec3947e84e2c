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

# A digest is this many hex characters of a message's identity hash (64 bits: two different
# messages of one conversation share one with a probability of 2^-64).
DIGEST_CHARS = 16
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


@dataclass(frozen=True)
class Unit:
    """One message of a forwarded request: its identity digest, its role, its tokens (our
    count) and the lifetime its cache breakpoint asks for (None: no breakpoint on it)."""

    digest: str
    role: str
    tokens: int
    mark: int | None = None


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

    def marks(self) -> list[tuple[int, int]]:
        """(number of units the breakpoint's prefix holds, lifetime) of each breakpoint; the
        tools' breakpoint holds 0 units."""
        found = [(0, self.tools_mark)] if self.tools_mark else []
        found += [(i + 1, unit.mark) for i, unit in enumerate(self.units) if unit.mark]
        if self.auto and self.units:
            found.append((len(self.units), self.auto))
        return sorted(found)

    def stored(self) -> dict[str, Any]:
        """What the ledger keeps of it (CallPrefix)."""
        return {
            "model": self.model,
            "tools": self.tools,
            "digests": "".join(unit.digest for unit in self.units),
            "roles": [unit.role for unit in self.units],
            "marks": [[i, unit.mark] for i, unit in enumerate(self.units) if unit.mark],
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
    marks: tuple[tuple[int, int], ...]
    tokens: int
    at: float  # seconds since the epoch
    call_id: str = ""
    thread: str = ""
    auto: int | None = None
    ttl: int | None = None
    tools_mark: int | None = None

    @classmethod
    def of(
        cls, stored: dict[str, Any], *, at: float, call_id: str = "", thread: str = ""
    ) -> Previous:
        text = str(stored.get("digests") or "")
        digests = tuple(text[i : i + DIGEST_CHARS] for i in range(0, len(text), DIGEST_CHARS))
        marks = tuple(
            (int(index), int(ttl))
            for index, ttl in stored.get("marks") or ()
            if isinstance(index, int) and isinstance(ttl, int)
        )
        return cls(
            model=str(stored.get("model") or ""),
            tools=str(stored.get("tools") or ""),
            digests=digests,
            roles=tuple(str(role) for role in stored.get("roles") or ()),
            marks=marks,
            tokens=int(stored.get("tokens") or 0),
            at=at,
            call_id=call_id,
            thread=thread,
            auto=stored.get("auto") if isinstance(stored.get("auto"), int) else None,
            ttl=stored.get("ttl") if isinstance(stored.get("ttl"), int) else None,
            tools_mark=stored.get("toolsMark")
            if isinstance(stored.get("toolsMark"), int)
            else None,
        )

    def mark_positions(self) -> list[tuple[int, int]]:
        """(units held, lifetime) of each breakpoint the previous call had."""
        found = [(0, self.tools_mark)] if self.tools_mark else []
        found += [(index + 1, ttl) for index, ttl in self.marks]
        if self.auto and self.digests:
            found.append((len(self.digests), self.auto))
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


def _first_difference(current: Fingerprint, previous: Previous) -> int:
    """The index of the first unit that differs (len of the shorter when one is a prefix)."""
    count = min(len(current.units), len(previous.digests))
    for index in range(count):
        if current.units[index].digest != previous.digests[index]:
            return index
    return count


def predict(
    *,
    current: Fingerprint,
    previous: Previous | None,
    now: float,
    rules: CacheRules,
    compacted_by_gateway: str | None = None,
) -> Outcome:
    """The cache outcome of a call that forwarded `current`, `previous` being the last call
    of its thread (None: its first). `compacted_by_gateway`: how the gateway changed the
    thread's history since `previous` ("compacted" or "pruned"; None if it did not)."""
    prompt = current.tokens
    base: dict[str, Any] = {"prompt_tokens": prompt, "min_tokens": rules.min_tokens}
    if previous is not None:
        base["previous_call"] = previous.call_id
        base["previous_thread"] = previous.thread
    marks = current.marks()
    if rules.explicit and not marks:
        return Outcome(NOT_CACHEABLE, NO_CACHE_MARKER, **base)
    cacheable = max((current.upto(units) for units, _ in marks), default=prompt)
    if not rules.explicit:
        cacheable = prompt
    if cacheable < rules.min_tokens:
        return Outcome(NOT_CACHEABLE, BELOW_MINIMUM, **base)
    if previous is None:
        return Outcome(MISS, FIRST_CALL, **base)
    gap = max(now - previous.at, 0.0)
    ttl = _lifetime(rules, previous)
    base.update(gap_seconds=gap, ttl_seconds=ttl)
    if current.model != previous.model:
        return Outcome(MISS, MODEL_CHANGED, change="model", **base)
    if current.tools != previous.tools:
        return Outcome(MISS, TOOLS_CHANGED, change="tools", **base)
    first = _first_difference(current, previous)
    if first < len(previous.digests):
        return _changed(current, previous, first, rules, compacted_by_gateway, gap, ttl, base)
    # The request starts with everything the previous one forwarded.
    if gap > ttl:
        return Outcome(MISS, TTL_EXPIRED, change="ttl", **base)
    read = _read(current, previous, len(previous.digests), rules)
    if read <= 0:
        # Nothing the previous call wrote is long enough (or marked) to be read.
        return Outcome(MISS, BELOW_MINIMUM, shared_tokens=current.upto(first), **base)
    return Outcome(HIT, None, shared_tokens=current.upto(first), predicted_read=read, **base)


def _lifetime(rules: CacheRules, previous: Previous) -> int:
    """How long the previous call's entries live: the longest lifetime its breakpoints asked
    for (Anthropic's 5 minutes or 1 hour), the retention it asked for (OpenAI), else the
    provider's default."""
    asked = [ttl for _, ttl in previous.mark_positions()]
    if previous.ttl:
        asked.append(previous.ttl)
    return max(asked) if asked else rules.ttl_seconds


def _read(current: Fingerprint, previous: Previous, shared_units: int, rules: CacheRules) -> int:
    """Tokens the provider can read: an automatic cache reads the shared prefix (from its
    minimum, in its increments); an explicit one reads up to the furthest breakpoint of the
    previous call that lies within the shared prefix (if that prefix reaches the minimum and
    the current request has a breakpoint at or after it)."""
    if not rules.explicit:
        limit = min(current.upto(shared_units), previous.tokens or current.upto(shared_units))
        return _readable(rules, limit)
    furthest = max((units for units, _ in current.marks()), default=-1)
    best = 0
    for units, _ in previous.mark_positions():
        if units <= shared_units and units <= furthest:
            tokens = current.upto(units)
            if tokens >= rules.min_tokens:
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
    where = {"index": first, "role": role, "change": how}
    shared = current.upto(first)
    if role == "system" and all(unit.role == "system" for unit in current.units[:first]):
        reason, change, by = SYSTEM_CHANGED, "system", None
    elif compacted_by_gateway:
        reason, change, by = COMPACTION, compacted_by_gateway, "gateway"
    elif _client_compacted(current, previous, first):
        reason, change, by = COMPACTION, "compacted", "client"
    else:
        reason, change, by = HISTORY_EDITED, how, None
    if gap > ttl:
        return Outcome(
            MISS,
            TTL_EXPIRED,
            shared_tokens=shared,
            first_changed=where,
            change="ttl",
            **base,
        )
    read = _read(current, previous, first, rules)
    outcome = PARTIAL if read > 0 else MISS
    return Outcome(
        outcome,
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
    return before > 0 and after <= before * CLIENT_COMPACTION_SHARE


# --- fingerprints ---------------------------------------------------------------------------------

# A unit's identity and cost by the digest of its exact JSON: an agent resends its history on
# every call, so after the first call only its new messages are converted and counted.
_MEMO_MAX = 131_072
_memo: OrderedDict[tuple[str, bytes], tuple[str, str, int]] = OrderedDict()
_memo_lock = threading.Lock()


def _raw_digest(value: Any) -> bytes:
    try:
        import orjson

        data = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except Exception:  # what orjson cannot write (a lone surrogate, a huge int)
        import json

        data = json.dumps(value, sort_keys=True, ensure_ascii=True, default=str).encode()
    return hashlib.blake2b(data, digest_size=16).digest()


def _marks_in(value: Any, depth: int = 0) -> int | None:
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
                inner = _marks_in(item, depth + 1)
                if inner is not None:
                    found = max(found or 0, inner)
    elif isinstance(value, list):
        for item in value:
            inner = _marks_in(item, depth + 1)
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


def fingerprint(
    *,
    model: str,
    units: Sequence[dict[str, Any]],
    tools: Any,
    identify: Callable[[dict[str, Any], int], tuple[str, str]],
    count: Callable[[dict[str, Any], int], int],
    count_tools: Callable[[Any], int],
    encoding: str,
    auto: int | None = None,
    ttl: int | None = None,
) -> Fingerprint:
    """A forwarded request's fingerprint. `identify(unit, index)` gives a unit's (identity
    hash, role) as the wire reads it (thinking blocks and cache markers are not part of it);
    `count(unit, index)` its tokens. Both are memoized on the unit's exact JSON."""
    made: list[Unit] = []
    blocks: set[int] = set()
    for index, unit in enumerate(units):
        key = (encoding, _raw_digest(unit))
        with _memo_lock:
            found = _memo.get(key)
            if found is not None:
                _memo.move_to_end(key)
        if found is None:
            identity, role = identify(unit, index)
            found = (identity[:DIGEST_CHARS].ljust(DIGEST_CHARS, "0"), role, count(unit, index))
            with _memo_lock:
                _memo[key] = found
                while len(_memo) > _MEMO_MAX:
                    _memo.popitem(last=False)
        digest, role, tokens = found
        made.append(Unit(digest=digest, role=role, tokens=tokens, mark=_marks_in(unit)))
        if _has_compaction_block(unit):
            blocks.add(index)
    tools_digest = _raw_digest(_without_marks(tools)).hex()[:DIGEST_CHARS] if tools else ""
    return Fingerprint(
        model=model,
        tools=tools_digest,
        tools_tokens=count_tools(tools) if tools else 0,
        units=tuple(made),
        auto=auto,
        ttl=ttl,
        tools_mark=_marks_in(tools) if tools else None,
        compaction_blocks=frozenset(blocks),
    )


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
