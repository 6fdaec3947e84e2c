"""The one announcement both fittings (fit.py's ladder, thread_fit.py's per-thread fitting)
make when a compaction they ran shrank the context: CONTEXT_COMPRESSED to the audit log and
the session's sockets, and into `Fitted.compression` for the response headers."""

from __future__ import annotations

import logging
from typing import Any

from compaction_app.fitting import RunOutcome
from compaction_app.realtime import broadcast, messages
from sessions_app.models import Session

audit = logging.getLogger("context")


def announce_compression(*, session: Session, run: RunOutcome, model: str) -> dict[str, Any]:
    """Log and broadcast the completed compaction `run` (its tokens before and after);
    the CONTEXT_COMPRESSED message."""
    message = messages.context_compressed(
        session_id=session.pk,
        original_tokens=run.tokens_before or 0,
        compressed_tokens=run.tokens_after or 0,
    )
    compression = message.to_json()
    audit.info(
        "context_compressed %s", compression, extra={"session_id": str(session.pk), "model": model}
    )
    broadcast.broadcast(session_id=session.pk, owner_id=session.owner_id, message=message)
    return compression
