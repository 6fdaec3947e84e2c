"""The gateway's providers: one package per wire format, and the one registry of them.

Each package (in the spirit of healthchecks' `hc/integrations/<name>/` and LiteLLM's
per-provider configs) satisfies the `Wire` contract (wire.py): its routes under its prefix,
its upstream URL, request parsing, the fitted request in its own shape, usage, errors and
stream events. Everything else reads `PROVIDERS`: the URLs (urls.py), the guard's error
shape for a path (guard.py), the API root's gateway map (compaction_app/api/root.py). Adding
a provider is its package, a line here and its docs.
"""

from __future__ import annotations

from compaction_app.gateway.providers import (
    anthropic_messages,
    gemini,
    openai_chat,
    openai_responses,
)
from compaction_app.gateway.wire import Wire

# Every wire format the gateway speaks, in the order their routes are tried (mypy checks each
# package against the contract). The first one's error shape answers paths no prefix claims.
PROVIDERS: tuple[Wire, ...] = (openai_chat, openai_responses, anthropic_messages, gemini)


def for_path(path: str) -> Wire:
    """The wire whose prefix a path under /gateway/ falls under (its error shape answers
    there); the first wire's for any other path."""
    rest = path.split("/gateway/", 1)[-1]
    for provider in PROVIDERS:
        if rest == provider.PREFIX or rest.startswith(provider.PREFIX + "/"):
            return provider
    return PROVIDERS[0]


def bases() -> dict[str, str]:
    """Each prefix once, under its family's name (its first segment: Chat Completions and
    Responses share OpenAI's), relative to /gateway/: the base URL a client is given."""
    found: dict[str, str] = {}
    for provider in PROVIDERS:
        found.setdefault(provider.PREFIX.split("/")[0], provider.PREFIX)
    return found
