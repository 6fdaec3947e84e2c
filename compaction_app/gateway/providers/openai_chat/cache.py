"""OpenAI's prompt cache (pure), as its prompt-caching guide states it
(https://developers.openai.com/api/docs/guides/prompt-caching), for Chat Completions and
Responses alike:

- automatic on every prompt of 1,024 tokens or more (gpt-4o and newer), matched by exact
  prefix (tools and images included), read in steps of 128 tokens past the first 1,024;
- in-memory retention: entries are typically cleared after 5 to 10 minutes of inactivity and
  always within an hour; the prediction takes the 5 minutes (a hit after them is a bonus,
  flagged as the provider disagreeing). `prompt_cache_retention: "24h"` (extended
  retention) keeps them up to 24 hours.
"""

from __future__ import annotations

from compaction_app.gateway.cache_outcome import CacheRules

SOURCE = "https://developers.openai.com/api/docs/guides/prompt-caching"
MIN_TOKENS = 1024
INCREMENT = 128
DEFAULT_TTL = 300
EXTENDED_TTL = 24 * 3600


def cache_rules(model: str) -> CacheRules:
    return CacheRules(
        provider="openai",
        explicit=False,
        min_tokens=MIN_TOKENS,
        ttl_seconds=DEFAULT_TTL,
        source=SOURCE,
        increment=INCREMENT,
    )
