"""Helpers for the gateway tests: official SDK clients pointed at the gateway (the fixtures
`gateway_url` and `upstream` live in conftest.py)."""

from __future__ import annotations

import time
from typing import Any

CANARY = "sk-canary-7f3a9c1e-do-not-store"


def token_for(user: Any) -> str:
    from rest_framework.authtoken.models import Token

    return Token.objects.get_or_create(user=user)[0].key


def _ledger_headers(key: str | None, session: str | None, headers: dict[str, str]) -> dict:
    default_headers = dict(headers)
    if key is not None:
        default_headers["X-Ledger-Key"] = key
    if session is not None:
        default_headers["X-Ledger-Session"] = session
    return default_headers


def openai_client(base: str, *, key: str | None, session: str | None, **headers: str) -> Any:
    import openai

    return openai.OpenAI(
        api_key=CANARY,
        base_url=f"{base}/gateway/openai/v1",
        default_headers=_ledger_headers(key, session, headers),
        max_retries=0,
        timeout=30,
    )


def anthropic_client(base: str, *, key: str | None, session: str | None, **headers: str) -> Any:
    import anthropic

    return anthropic.Anthropic(
        api_key=CANARY,
        base_url=f"{base}/gateway/anthropic",
        default_headers=_ledger_headers(key, session, headers),
        max_retries=0,
        timeout=30,
    )


def wait_until(predicate: Any, *, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def gemini_client(
    gemini_base: str, *, key: str | None, session: str | None, version: str, **headers: str
) -> Any:
    """google-genai pointed at the gateway's Gemini wire (`{gateway}/gateway/gemini`), on
    `version` ("v1" or "v1beta"), without retries."""
    from google import genai
    from google.genai import types

    options = types.HttpOptions(
        base_url=gemini_base,
        api_version=version,
        headers=_ledger_headers(key, session, headers),
        timeout=30_000,  # milliseconds
        retry_options=types.HttpRetryOptions(attempts=1),
    )
    return genai.Client(api_key=CANARY, http_options=options)
