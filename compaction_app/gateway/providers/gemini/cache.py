"""Gemini's implicit prompt cache (pure), as the Gemini API's caching guide states it
(https://ai.google.dev/gemini-api/docs/caching):

- implicit caching is on by default for Gemini 2.5 and newer models, and best effort: a
  matching prefix may still miss;
- the shortest cacheable prefix is 2,048 tokens for Gemini 2.5 Flash and 2.5 Pro, and 4,096
  for the Gemini 3 models (3.x Flash, 3.1 Pro) — the guide as updated in 2026;
- the guide gives no lifetime ("send requests with a similar prefix in a short amount of
  time"): the prediction takes 5 minutes, as for OpenAI's in-memory cache.
`usageMetadata.cachedContentTokenCount` is what was read, part of `promptTokenCount`.
"""

from __future__ import annotations

import re

from compaction_app.gateway.cache_outcome import CacheRules

SOURCE = "https://ai.google.dev/gemini-api/docs/caching"
DEFAULT_TTL = 300
_VERSION = re.compile(r"gemini-(\d+)(?:[.-](\d+))?")


def minimum(model: str) -> int:
    found = _VERSION.search(model.lower())
    if found is not None and int(found.group(1)) >= 3:
        return 4096
    return 2048


def cache_rules(model: str) -> CacheRules:
    return CacheRules(
        provider="gemini",
        explicit=False,
        min_tokens=minimum(model),
        ttl_seconds=DEFAULT_TTL,
        source=SOURCE,
        best_effort=True,
    )
