"""The fitted request in the client's own shape: what every wire's `render_fitted` shares
(the plan, the summary's words). Each wire's own rendering lives in its provider package.
Pure: no Django, no ORM.

Fitting never rebuilds a request from the ledger: it keeps the client's own messages and
drops the ones a compaction folded, puts the summary where the wire format keeps
instructions, and swaps cleared tool results for their placeholders. Whatever the client
put on a kept message (system blocks, `cache_control`, images, the text beside a tool call,
fields the gateway has no rule for) goes out as it came, in its place.

Everything here is a function of the request and the ledger's state (which units are
folded, the summary's text, the cleared placeholders): the same inputs give the same bytes,
so between two compactions each forwarded request is the previous one plus the new turns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# Rendered before the summary's text: fixed words, no counters or timestamps (the bytes of an
# unchanged prefix must not move).
SUMMARY_HEADER = "Summary of the earlier conversation (compacted by Context Ledger):\n"
# The user turn opening a conversation whose first kept message is the model's (Anthropic
# and Gemini want a user turn first).
RESUME_TEXT = "(The earlier conversation is summarized in the system prompt.)"


@dataclass(frozen=True)
class Plan:
    """What to forward: the request's units by index (system units included), the summary
    standing for the folded ones (None: nothing folded), and cleared tool results
    (unit index → tool call id → placeholder text)."""

    kept: tuple[int, ...]
    summary: str | None
    cleared: Mapping[int, Mapping[str, str]]


def summary_text(summary: str) -> str:
    return SUMMARY_HEADER + summary
