"""Anthropic's prompt cache (pure), as its prompt-caching guide states it
(https://platform.claude.com/docs/en/build-with-claude/prompt-caching):

- only what a `cache_control` breakpoint marks is cached (on a block, on a tool, on a system
  block, or at the top level of the request: the automatic breakpoint on the last block);
- an entry lives 5 minutes after its last use (`"ttl": "1h"`: an hour), every read refreshing it;
- the shortest cacheable prefix is 4,096 tokens for Claude Opus 4.6, Opus 4.5 and Haiku 4.5;
  2,048 for Claude Haiku 3.5 and Haiku 3; 1,024 for Claude Sonnet 4.6, Sonnet 4.5, Opus 4.1,
  Opus 4, Sonnet 4, Sonnet 3.7 (and the 3.5 Sonnets). A model the guide does not list is
  taken at 1,024.
"""

from __future__ import annotations

from compaction_app.gateway.cache_outcome import CacheRules

SOURCE = "https://platform.claude.com/docs/en/build-with-claude/prompt-caching"
DEFAULT_TTL = 300
_AT_4096 = ("opus-4-6", "opus-4-5", "haiku-4-5")
_AT_2048 = ("3-5-haiku", "3-haiku", "haiku-3")


def minimum(model: str) -> int:
    name = model.lower().replace(".", "-")
    if any(tag in name for tag in _AT_4096):
        return 4096
    if any(tag in name for tag in _AT_2048):
        return 2048
    return 1024


def cache_rules(model: str) -> CacheRules:
    return CacheRules(
        provider="anthropic",
        explicit=True,
        min_tokens=minimum(model),
        ttl_seconds=DEFAULT_TTL,
        source=SOURCE,
    )
