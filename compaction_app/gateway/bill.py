"""The gateway's share of the provider bill: the size of the client's request as it arrived,
against which a fitted call's savings are measured (sessions_app.pricing.saved_tokens).

Counted the way the forwarded request is counted (the session's encoding, the ledger's
message rule, the reply primer, tool definitions by the non-text rule), so the difference is
what fitting removed and nothing else. Only a fitted call pays for the count: a call
forwarded as sent saved nothing.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from compaction_app.gateway.fit import definitions_tokens
from compaction_app.gateway.messages import ClientMessage
from sessions_app import tokens
from sessions_app.models import ROLE_FOR_TYPE

# A message's cost by (model, message hash): an agent resends its history on every call, so
# after the first fitted call only its new messages are tokenized. Bounded (least recently
# used first out); a miss only costs a count.
_MEMO_MAX = 65_536
_memo: OrderedDict[tuple[str, str], int] = OrderedDict()
_memo_lock = threading.Lock()


def client_request_tokens(
    *, model: str, messages: Iterable[ClientMessage], body: dict[str, Any]
) -> int:
    """Tokens of the client's whole request: its messages as the ledger records them, the
    reply primer and the request's tool definitions."""
    costs: list[int] = []
    missing: list[tuple[tuple[str, str], ClientMessage]] = []
    with _memo_lock:
        for message in messages:
            key = (model, message.hash)
            found = _memo.get(key)
            if found is None:
                missing.append((key, message))
            else:
                _memo.move_to_end(key)
                costs.append(found)
    if missing:
        counter = tokens.counter_for_model(model)
        counted = []
        for key, message in missing:
            rows = [(ROLE_FOR_TYPE[d.type], d.content, d.name) for d in message.drafts]
            counted.append((key, sum(tokens.messages_batch_tokens(counter, rows)) if rows else 0))
        with _memo_lock:
            for key, cost in counted:
                _memo[key] = cost
                costs.append(cost)
            while len(_memo) > _MEMO_MAX:
                _memo.popitem(last=False)
    if not costs:
        return definitions_tokens(body)
    return sum(costs) + tokens.REPLY_PRIMER + definitions_tokens(body)
