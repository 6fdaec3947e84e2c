"""The summarizer plugin interface: a base class, a typed error, and a registry."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

TokenCounter = Callable[[str], int]


class SummarizerError(Exception):
    """A summarizer could not produce a summary.

    `permanent` tells the Celery task whether a retry can help (a 429, a 5xx or a timeout are
    transient; a bad key, an unknown model or a malformed answer are permanent).
    """

    def __init__(self, message: str, *, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


@dataclass(frozen=True)
class SummaryMessage:
    """One folded event handed to a summarizer."""

    event_id: str
    type: str
    role: str
    content: str
    name: str = ""
    # The event's seq in its session; summaries cite it (`[#812]`). 0 = unknown.
    seq: int = 0
    # A TOOL_CALL's or TOOL_RESULT's call id: which call an output answers.
    tool_call_id: str = ""


def score_key(text: str) -> str:
    """A summary item's key for its score (its words, case and spacing aside), short."""
    words = " ".join(text.lower().split()).rstrip(".")
    return hashlib.blake2b(words.encode(), digest_size=6).hexdigest()


class Summarizer(ABC):
    """Turns the previous running summary plus newly folded messages into a new summary.

    Subclasses implement `_summarize_piece`. `summarize` cuts the input into pieces that fit
    the summarizer's own window (`input_window_tokens`) and folds them in one after another,
    each piece getting the summary of the pieces before it, so a session already over its
    limit can still be compacted.
    """

    name: ClassVar[str]

    def __init__(self, *, count_tokens: TokenCounter, input_window_tokens: int = 100_000) -> None:
        self.count_tokens = count_tokens
        self.input_window_tokens = input_window_tokens

    # What the context keeps verbatim after this run (the events not folded). A summarizer may
    # use it to avoid repeating what the model will see anyway; providers ignore it.
    kept_text: str = ""
    # The whole conversation the run sees, in order, folded events and kept ones alike (the
    # kept user requests say what each folded output answered; the kept agent messages what
    # it referred to). Empty when the caller has only the folded messages.
    context: Sequence[SummaryMessage] = ()
    # What each item of the previous summary scored when it was chosen (by `score_key` of its
    # text): a summarizer that ranks items keeps an old item against weaker new ones. Filled
    # in by summarizers that rank (`chosen_scores` after a run), ignored by the others.
    previous_scores: Mapping[str, int] = {}
    chosen_scores: dict[str, int] = {}

    def summarize(
        self,
        *,
        previous_summary: str,
        messages: Sequence[SummaryMessage],
        max_tokens: int,
        kept_text: str = "",
        context: Sequence[SummaryMessage] = (),
        previous_scores: Mapping[str, int] | None = None,
    ) -> str:
        self.kept_text = kept_text
        self.context = context
        self.previous_scores = dict(previous_scores or {})
        self.chosen_scores = {}
        summary = previous_summary
        for piece in self._pieces(
            messages, reserve=self._piece_reserve(previous_summary, max_tokens)
        ):
            summary = self._summarize_piece(
                previous_summary=summary, messages=piece, max_tokens=max_tokens
            )
        return summary

    def _piece_reserve(self, previous_summary: str, max_tokens: int) -> int:
        """What of the summarizer's own window a piece must leave free: a model reads the
        previous summary with the piece and writes up to `max_tokens` into the same window."""
        return self.count_tokens(previous_summary) + max_tokens

    def _pieces(
        self, messages: Sequence[SummaryMessage], *, reserve: int
    ) -> list[list[SummaryMessage]]:
        budget = max(self.input_window_tokens - reserve, 1_000)
        pieces: list[list[SummaryMessage]] = []
        current: list[SummaryMessage] = []
        used = 0
        for message in messages:
            cost = self.count_tokens(message.content) + 8
            if cost > budget:
                # One message larger than the whole window: cut its text into window-sized
                # slices by characters (4 chars per token is a safe lower bound for BPE).
                if current:
                    pieces.append(current)
                    current, used = [], 0
                step = budget * 3
                for start in range(0, len(message.content), step):
                    pieces.append(
                        [
                            SummaryMessage(
                                event_id=message.event_id,
                                type=message.type,
                                role=message.role,
                                content=message.content[start : start + step],
                                name=message.name,
                                seq=message.seq,
                            )
                        ]
                    )
                continue
            if current and used + cost > budget:
                pieces.append(current)
                current, used = [], 0
            current.append(message)
            used += cost
        if current:
            pieces.append(current)
        return pieces

    @abstractmethod
    def _summarize_piece(
        self, *, previous_summary: str, messages: Sequence[SummaryMessage], max_tokens: int
    ) -> str:
        """Summarize one window-sized piece, folding in `previous_summary`."""


_REGISTRY: dict[str, type[Summarizer]] = {}


def register(cls: type[Summarizer]) -> type[Summarizer]:
    _REGISTRY[cls.name] = cls
    return cls


def summarizer_class(name: str) -> type[Summarizer]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown summarizer {name!r}") from None


def summarizer_names() -> list[str]:
    return sorted(_REGISTRY)
