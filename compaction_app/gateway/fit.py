"""Fit: what is forwarded to a model, decided against that model's window.

The gateway's side of the fitting core (compaction_app/fitting.py): the window a model is
fitted to (its window less the request's tool definitions), a thread's own fitting
(thread_fit.py), else the ledger's ladder (`fitting.fit_context`: prune between the
thresholds, a synchronous compaction at the hard limit, `context_window_exhausted` when even
that cannot fit).
"""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.auth.models import AbstractBaseUser

from compaction_app import fitting
from compaction_app.gateway.compressed import announce_compression
from compaction_app.gateway.fitted import Fitted, Wire, context_length_exceeded
from compaction_app.gateway.thread_fit import ThreadRequest, fit_thread
from compaction_app.models import Trigger
from sessions_app import tokens
from sessions_app.errors import Unprocessable
from sessions_app.models import Event, EventType, Session
from sessions_app.services import model_registry

logger = logging.getLogger("compaction_app.gateway")


def model_window(session: Session, model: str) -> int:
    """The window `model` is fitted to: the session's own limit for its model; for another
    model (a fallback) the registry's window, never more than the session's limit."""
    if model == session.model:
        return session.context_limit
    info = model_registry().lookup(model)
    if info is None:
        return session.context_limit
    return min(info.context_limit, session.context_limit)


def definitions_tokens(body: dict[str, Any]) -> int:
    """What the request's tool (and legacy function) definitions cost: the model reads them
    with the messages, so they take room in the window the messages must leave free. Counted
    by the non-text rule, as count_tokens counts them."""
    return sum(
        tokens.non_text_tokens(body[name]) for name in ("tools", "functions") if body.get(name)
    )


def room(session: Session, body: dict[str, Any], model: str) -> int:
    """What the messages may take of `model`'s window: what the request's tool definitions
    leave of it."""
    return max(model_window(session, model) - definitions_tokens(body), 0)


def has_compaction(session: Session) -> bool:
    """Whether a compaction is in effect (the client's history then is not what the model
    should see). A session never compacted skips the query."""
    if not session.last_compaction:
        return False
    return Event.objects.filter(session=session, type=EventType.COMPACTION, reverted=False).exists()


def fit(
    *,
    session: Session,
    user: AbstractBaseUser,
    wire: Wire,
    body: dict[str, Any],
    model: str,
    enabled: bool,
    same_model_as_request: bool,
    request: ThreadRequest | None = None,
) -> Fitted:
    """Fit the session's context to `model` (sync: may compact). The request's tool
    definitions are part of what the model reads: the messages are fitted to what they leave
    of the window, and the counts reported include them."""
    limit = model_window(session, model)
    definitions = definitions_tokens(body)
    context = session.context_tokens
    # The client's own messages, as sent (to another model: with that model's name).
    as_sent = Fitted(
        model=model,
        body=None if same_model_as_request else wire.with_model(body, model),
        token_count=context + definitions,
        limit=limit,
        compacted=False,
    )
    if not enabled:
        return as_sent
    compacted = has_compaction(session)
    if request is not None:
        fitted = fit_thread(
            session=session,
            user=user,
            wire=wire,
            body=body,
            model=model,
            limit=limit,
            definitions=definitions,
            as_sent=as_sent,
            compacted=compacted,
            request=request,
        )
        if fitted is not None:
            return fitted
        # Some of the request's messages are not in the ledger under their chain ids (a
        # bookkeeping failure, a session recorded through the REST API): the ledger's ladder.
    if fitting.passes_through(
        tokens=context,
        window=max(limit - definitions, 0),
        policy=fitting.session_policy(session),
        compacted=compacted,
    ):
        return as_sent
    try:
        prepared = fitting.fit_context(
            session=session,
            user=user,
            max_tokens=limit if limit < session.context_limit else None,
            reserve_tokens=definitions,
            fmt=wire.RENDER_FORMAT,
            trigger=Trigger.GATEWAY,
            compact=True,  # the gateway compacts on its own POSTs (hardening, issue 22)
        )
    except Unprocessable as exc:
        needed = int(exc.extra.get("tokenCount") or 0) + definitions
        raise context_length_exceeded(
            limit=limit, needed=needed, definitions=definitions, model=model
        ) from None
    compression = None
    if prepared.run is not None and prepared.run.shrank:
        compression = announce_compression(session=session, run=prepared.run, model=model)
    return Fitted(
        model=model,
        body=wire.with_context(
            body, messages=prepared.messages, system=prepared.system, model=model
        ),
        token_count=prepared.token_count + definitions,
        limit=limit,
        compacted=bool(compacted or prepared.pruned or compression),
        compression=compression,
    )
