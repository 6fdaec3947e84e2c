"""A provider's prompt cache, simulated for the stand-in (provider_standin.py): what a real
provider would read from and write to its cache for each request, on a clock the test
controls. Independent of the gateway's own prediction (compaction_app/gateway/
cache_outcome.py): it works on the request's bytes, block by block, with the stand-in's own
token estimate (characters / 4, as the stand-in's usage figures are), the way the providers
document their caches:

- Anthropic: only `cache_control` breakpoints write (a top-level `cache_control` is a
  breakpoint on the last block); tools, then system, then message blocks; each breakpoint
  looks back at most 20 blocks for an entry; 5-minute or 1-hour lifetime, refreshed by
  every read; nothing shorter than the model's minimum is written.
- OpenAI: every prompt of 1,024 tokens or more is cached by prefix (tools, then messages or
  input items); reads come in steps of 128 tokens past the first 1,024.

    cache = PromptCache(clock=clock.timestamp)
    with ProviderStandIn(prompt_cache=cache) as upstream: ...
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

LOOKBACK_BLOCKS = 20
OPENAI_MIN = 1024
OPENAI_STEP = 128
ANTHROPIC_MIN = 1024
DEFAULT_TTL = 300.0
ONE_HOUR = 3600.0


@dataclass(frozen=True)
class Figures:
    """What a request cost the cache: its whole prompt, the part read and the part written
    (of which at the one-hour rate)."""

    prompt: int
    read: int = 0
    write: int = 0
    write_1h: int = 0


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _key(value: Any) -> str:
    return json.dumps(_plain(value), sort_keys=True, separators=(",", ":"))


def _ttl(block: Any) -> float | None:
    control = block.get("cache_control") if isinstance(block, dict) else None
    if not isinstance(control, dict):
        return None
    return ONE_HOUR if control.get("ttl") == "1h" else DEFAULT_TTL


class PromptCache:
    """The simulated cache of one provider account (per model), thread-safe."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        anthropic_min: int = ANTHROPIC_MIN,
        openai_ttl: float = DEFAULT_TTL,
    ) -> None:
        self.clock = clock
        self.anthropic_min = anthropic_min
        self.openai_ttl = openai_ttl
        self._entries: dict[str, float] = {}  # digest of (model, prefix) → expiry
        self._lock = threading.Lock()
        self.log: list[Figures] = []

    # Anthropic ------------------------------------------------------------------------------

    @staticmethod
    def _anthropic_blocks(body: dict[str, Any]) -> list[tuple[str, float | None]]:
        blocks: list[tuple[str, float | None]] = []
        for tool in body.get("tools") or []:
            blocks.append(("tool:" + _key(tool), _ttl(tool)))
        system = body.get("system")
        if isinstance(system, str) and system:
            blocks.append(("system:" + _key({"type": "text", "text": system}), None))
        elif isinstance(system, list):
            for block in system:
                blocks.append(("system:" + _key(block), _ttl(block)))
        for message in body.get("messages") or []:
            content = message.get("content")
            role = str(message.get("role"))
            if isinstance(content, str):
                blocks.append((role + ":" + _key({"type": "text", "text": content}), None))
            else:
                for block in content or []:
                    if isinstance(block, dict) and block.get("type") in (
                        "thinking",
                        "redacted_thinking",
                    ):
                        continue  # earlier turns' thinking is not part of the cached prompt
                    blocks.append((role + ":" + _key(block), _ttl(block)))
        top = _ttl(body)
        if top is not None and blocks:
            text, ttl = blocks[-1]
            blocks[-1] = (text, max(ttl or 0, top))
        return blocks

    def anthropic(self, body: dict[str, Any]) -> Figures:
        model = str(body.get("model") or "")
        blocks = self._anthropic_blocks(body)
        hashes: list[str] = []
        cumulative: list[int] = []
        digest = hashlib.blake2b(model.encode(), digest_size=16)
        total = 0
        for text, _ in blocks:
            digest.update(text.encode())
            hashes.append(digest.copy().hexdigest())
            total += _tokens(text)
            cumulative.append(total)
        points = [i for i, (_, ttl) in enumerate(blocks) if ttl]
        with self._lock:
            now = self.clock()
            self._entries = {h: t for h, t in self._entries.items() if t > now}
            read, hit = 0, None
            for point in points:
                for index in range(point, max(point - LOOKBACK_BLOCKS, -1), -1):
                    if hashes[index] in self._entries and cumulative[index] > read:
                        read, hit = cumulative[index], index
                        break
            if hit is not None:
                # A read refreshes the entry for its own lifetime.
                ttl = max((blocks[i][1] or 0) for i in points) or DEFAULT_TTL
                self._entries[hashes[hit]] = now + ttl
            write = write_1h = 0
            for point in points:
                ttl = blocks[point][1] or DEFAULT_TTL
                if cumulative[point] >= self.anthropic_min and cumulative[point] > read:
                    self._entries[hashes[point]] = now + ttl
                    fresh = cumulative[point] - read - write
                    if fresh > 0:
                        write += fresh
                        if ttl >= ONE_HOUR:
                            write_1h += fresh
            figures = Figures(prompt=total, read=read, write=write, write_1h=write_1h)
            self.log.append(figures)
            return figures

    # OpenAI ---------------------------------------------------------------------------------

    def openai(self, body: dict[str, Any]) -> Figures:
        model = str(body.get("model") or "")
        units: list[Any] = []
        if body.get("tools"):
            units.append({"tools": body["tools"]})
        if body.get("instructions"):
            units.append({"instructions": body["instructions"]})
        items = body.get("messages")
        if items is None:
            raw = body.get("input")
            items = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw or []
        units.extend(items)
        retention = (
            24 * ONE_HOUR if body.get("prompt_cache_retention") == "24h" else self.openai_ttl
        )
        digest = hashlib.blake2b(model.encode(), digest_size=16)
        hashes: list[str] = []
        cumulative: list[int] = []
        total = 0
        for unit in units:
            text = _key(unit)
            digest.update(text.encode())
            hashes.append(digest.copy().hexdigest())
            total += _tokens(text)
            cumulative.append(total)
        with self._lock:
            now = self.clock()
            self._entries = {h: t for h, t in self._entries.items() if t > now}
            shared = 0
            for index, digest_hex in enumerate(hashes):
                if digest_hex not in self._entries:
                    break
                shared = cumulative[index]
            read = 0
            if shared >= OPENAI_MIN:
                read = OPENAI_MIN + (shared - OPENAI_MIN) // OPENAI_STEP * OPENAI_STEP
            if total >= OPENAI_MIN:
                for digest_hex in hashes:
                    self._entries[digest_hex] = now + retention
            figures = Figures(prompt=total, read=read)
            self.log.append(figures)
            return figures
