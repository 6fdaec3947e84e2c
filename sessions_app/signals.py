"""Signals through which sessions_app reaches compaction without importing it.

- `events_appended` fires after an append transaction commits, once per request (bulk
  included): kwargs `session_id`, `event_ids`, `event_types` (the distinct types appended) and
  `session` (the row as committed, counters included), so receivers need not query again.
- `compaction_command` fires when a client sends a `/compact` user message; a receiver
  returns the serialised compaction it started (the first non-None response is used).
- `context_hard_limit` fires when `/context` finds the session at its hard limit; a receiver
  compacts synchronously and returns the compaction (or raises a LedgerError).
- `session_compaction_requested` is for the Django admin action; kwargs `session_ids`, `user`.
- `token_counts_updated` fires after exact counts (Anthropic's count-tokens API) replaced local
  ones and moved the session's counters; kwargs `session` (as committed).
"""

from django.dispatch import Signal

events_appended = Signal()
compaction_command = Signal()
context_hard_limit = Signal()
session_compaction_requested = Signal()
token_counts_updated = Signal()
