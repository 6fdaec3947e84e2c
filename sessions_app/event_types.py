"""The event types: the one spelling of the ledger's vocabulary (pure: no Django, so the
renderer, the strategies and the gateway's wire code use it too).

The stored values are the names; `EventType.X == "X"` and a member hashes as its value, so a
type read back from the database (a plain str) finds the member's entries in any mapping.
"""

from __future__ import annotations

from enum import StrEnum


class EventType(StrEnum):
    SYSTEM_PROMPT = "SYSTEM_PROMPT"
    USER_MESSAGE = "USER_MESSAGE"
    AGENT_MESSAGE = "AGENT_MESSAGE"
    TOOL_CALL = "TOOL_CALL"
    TOOL_RESULT = "TOOL_RESULT"
    LOCAL_SYSTEM_MESSAGE = "LOCAL_SYSTEM_MESSAGE"
    COMPACTION = "COMPACTION"
    CONTEXT_REFRESH = "CONTEXT_REFRESH"

    @property
    def label(self) -> str:
        """A human-readable name ("Tool Result"), as Django's TextChoices would give it."""
        return self.name.replace("_", " ").title()

    @classmethod
    def choices(cls) -> list[tuple[str, str]]:
        """(value, label) pairs for a model field's `choices`."""
        return [(member.value, member.label) for member in cls]
