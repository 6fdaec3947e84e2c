"""The gateway's share of the provider bill: the size of the client's request as it arrived,
against which a fitted call's savings are measured (sessions_app.pricing.saved_tokens).

Counted the way the forwarded request is counted (the session's encoding, the ledger's
message rule, the reply primer, tool definitions by the non-text rule), so the difference is
what fitting removed and nothing else. Only a fitted call pays for the count: a call
forwarded as sent saved nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from compaction_app.gateway.fit import definitions_tokens
from compaction_app.gateway.messages import ClientMessage
from sessions_app import tokens
from sessions_app.models import ROLE_FOR_TYPE


def client_request_tokens(
    *, model: str, messages: Iterable[ClientMessage], body: dict[str, Any]
) -> int:
    """Tokens of the client's whole request: its messages as the ledger records them, the
    reply primer and the request's tool definitions."""
    counter = tokens.counter_for_model(model)
    rows = [
        (ROLE_FOR_TYPE[draft.type], draft.content, draft.name)
        for message in messages
        for draft in message.drafts
    ]
    counted = sum(tokens.messages_batch_tokens(counter, rows)) if rows else 0
    return counted + (tokens.REPLY_PRIMER if rows else 0) + definitions_tokens(body)
