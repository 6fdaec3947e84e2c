"""A LangGraph `SummarizationNode`: a drop-in for `langmem.short_term.SummarizationNode`.

Same constructor, same state update (`{output_messages_key: [...], "context":
{"running_summary": RunningSummary}}`), same selection of the messages to summarize, plus:

- `model=None` summarizes with the project's offline `local` summarizer;
- exact counting by default (the project's tiktoken counter for the model) instead of a
  character estimate, and the output is held to `max_tokens` under that counter: summarizing
  starts early when the kept messages plus the summary would not fit, and the summary itself is
  cut to `max_summary_tokens` (langmem only budgets for it);
- `memory_flush_hook(messages)`: called with the messages about to be summarized, on a thread
  (sync graphs, sync hooks) or as an event-loop task (async hooks under `ainvoke`), never inline;
- `ledger=(client, session id or key)`: the graph's messages are also recorded into a Context
  Ledger session through the Python client, and each summarization is noted there.

Pure module: no Django import, so it runs in any LangGraph process (needs the `[langgraph]`
extra: langgraph and langchain-core).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.utils import convert_to_messages, trim_messages
from langchain_core.prompts.chat import ChatPromptTemplate, ChatPromptValue
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from pydantic import BaseModel

from compaction_app.summarizers.base import SummaryMessage
from compaction_app.summarizers.local import LocalSummarizer
from sessions_app import tokens as ledger_tokens
from sessions_app.event_types import EventType

try:
    from langgraph._internal._runnable import RunnableCallable
except ImportError:  # pragma: no cover - older langgraph
    from langgraph.utils.runnable import RunnableCallable  # type: ignore[no-redef]

__all__ = [
    "DEFAULT_EXISTING_SUMMARY_PROMPT",
    "DEFAULT_FINAL_SUMMARY_PROMPT",
    "DEFAULT_INITIAL_SUMMARY_PROMPT",
    "LedgerSink",
    "MSGPACK_ALLOWLIST",
    "RunningSummary",
    "SummarizationNode",
    "SummarizationResult",
    "exact_token_counter",
]

logger = logging.getLogger("compaction_app.integrations.langgraph")

TokenCounter = Callable[[Iterable[Any]], int]
MemoryFlushHook = Callable[[list[AnyMessage]], Any]

# langmem's prompts, verbatim, so a swap changes nothing a chat model sees.
DEFAULT_INITIAL_SUMMARY_PROMPT = ChatPromptTemplate.from_messages(
    [("placeholder", "{messages}"), ("user", "Create a summary of the conversation above:")]
)
DEFAULT_EXISTING_SUMMARY_PROMPT = ChatPromptTemplate.from_messages(
    [
        ("placeholder", "{messages}"),
        (
            "user",
            "This is summary of the conversation so far: {existing_summary}\n\n"
            "Extend this summary by taking into account the new messages above:",
        ),
    ]
)
DEFAULT_FINAL_SUMMARY_PROMPT = ChatPromptTemplate.from_messages(
    [
        ("placeholder", "{system_message}"),
        ("system", "Summary of the conversation so far: {summary}"),
        ("placeholder", "{messages}"),
    ]
)

_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}


# For a LangGraph checkpoint serializer built with an explicit allowlist:
# `JsonPlusSerializer(allowed_msgpack_modules=MSGPACK_ALLOWLIST)` (the default serializer needs
# nothing: see _register_checkpoint_type).
MSGPACK_ALLOWLIST = [("compaction_app.integrations.langgraph", "RunningSummary")]


@dataclass
class RunningSummary:
    """The summary so far and which messages it covers (langmem's fields)."""

    summary: str
    summarized_message_ids: set[str]
    last_summarized_message_id: str | None


def _register_checkpoint_type() -> None:
    """Put RunningSummary among the types LangGraph's checkpoint serializer revives silently.

    The node returns a RunningSummary in the graph state, so every checkpointer stores it and
    revives it on the next step; LangGraph's default serializer warns about (and in strict
    mode blocks) any type outside its built-in SAFE_MSGPACK_TYPES, and a saver's own
    allowlist only applies in strict mode. A plain dataclass of strings and a set is as safe
    to revive as the built-ins, so it joins them once, here, where the type is defined —
    users need no serializer argument (MSGPACK_ALLOWLIST stays for those who pass one)."""
    try:
        from langgraph.checkpoint.serde import _msgpack
    except ImportError:  # pragma: no cover - a langgraph without the allowlist
        return
    key = (RunningSummary.__module__, RunningSummary.__name__)
    safe = getattr(_msgpack, "SAFE_MSGPACK_TYPES", None)
    if isinstance(safe, frozenset) and key not in safe:
        _msgpack.SAFE_MSGPACK_TYPES = safe | {key}


_register_checkpoint_type()


@dataclass
class SummarizationResult:
    messages: list[AnyMessage]
    running_summary: RunningSummary | None = None


# --- exact counting ----------------------------------------------------------------------------


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for part in content or []:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, dict) and part.get("type") == "text":
            parts.append(str(part.get("text", "")))
    return "\n".join(parts)


def exact_token_counter(model: str | None = None) -> TokenCounter:
    """A langmem-style counter (messages → tokens) with the project's exact accounting:
    `3 + tokens(role) + tokens(content)` (+ name, + tool calls as JSON) per message, summed.

    The reply primer (3 tokens) is not included: it is added once per request, not per message.
    """
    counter = ledger_tokens.counter_for_model(model or "gpt-4o")

    def count(messages: Iterable[Any]) -> int:
        total = 0
        for message in convert_to_messages(list(messages)):
            total += ledger_tokens.message_tokens(
                counter,
                role=_ROLES.get(message.type, message.type),
                content=message.content,
                name=message.name or "",
            )
            if isinstance(message, AIMessage) and message.tool_calls:
                calls = [
                    {"id": c["id"], "name": c["name"], "args": c["args"]}
                    for c in message.tool_calls
                ]
                total += ledger_tokens.non_text_tokens(calls)
        return total

    count.encoding = counter.encoding  # type: ignore[attr-defined]
    count.exact = counter.exact  # type: ignore[attr-defined]
    return count


def _model_name(model: Any) -> str | None:
    for attribute in ("model_name", "model"):
        value = getattr(model, attribute, None)
        if isinstance(value, str) and value:
            return value
    bound = getattr(model, "bound", None)  # model.bind(max_tokens=...) wraps the chat model
    return _model_name(bound) if bound is not None else None


# --- selection (langmem's algorithm, held to max_tokens) -----------------------------------------


@dataclass
class _Preprocessed:
    messages_to_summarize: list[AnyMessage]
    n_tokens_to_summarize: int
    max_tokens_to_summarize: int
    total_summarized_messages: int
    existing_system_message: SystemMessage | None


def _preprocess(
    *,
    messages: list[AnyMessage],
    running_summary: RunningSummary | None,
    max_tokens: int,
    max_tokens_before_summary: int | None,
    max_summary_tokens: int,
    token_counter: TokenCounter,
) -> _Preprocessed:
    if max_summary_tokens >= max_tokens:
        raise ValueError("`max_summary_tokens` must be less than `max_tokens`.")
    if max_tokens_before_summary is None:
        max_tokens_before_summary = max_tokens
    max_tokens_to_summarize = max_tokens
    max_remaining_tokens = max_tokens - max_summary_tokens
    system_cost = 0
    existing_system_message: SystemMessage | None = None
    if messages and isinstance(messages[0], SystemMessage):
        existing_system_message = messages[0]
        messages = messages[1:]
        system_cost = token_counter([existing_system_message])
        max_remaining_tokens -= system_cost
    if not messages:
        return _Preprocessed([], 0, max_tokens_to_summarize, 0, existing_system_message)

    summarized_message_ids: set[str] = set()
    total_summarized_messages = 0
    if running_summary:
        summarized_message_ids = set(running_summary.summarized_message_ids)
        max_tokens_to_summarize -= token_counter([SystemMessage(content=running_summary.summary)])
        for i, message in enumerate(messages):
            if message.id == running_summary.last_summarized_message_id:
                total_summarized_messages = i + 1
                break

    total_n_tokens = token_counter(messages[total_summarized_messages:])
    # langmem only summarizes once `max_tokens_before_summary` is reached, so the unsummarized
    # messages plus an existing summary can exceed `max_tokens`; here summarizing also starts as
    # soon as the output would not fit.
    room = max_remaining_tokens if running_summary else max_tokens - system_cost
    overflow = total_n_tokens > room

    n_tokens = 0
    idx = max(0, total_summarized_messages - 1)
    tool_messages: dict[str, ToolMessage] = {}
    should_summarize = False
    n_tokens_to_summarize = 0
    costs: list[int] = []
    for i in range(total_summarized_messages, len(messages)):
        message = messages[i]
        if message.id is None:
            raise ValueError("Messages are required to have ID field.")
        if message.id in summarized_message_ids:
            raise ValueError(f"Message with ID {message.id} has already been summarized.")
        if isinstance(message, ToolMessage) and message.tool_call_id:
            tool_messages[message.tool_call_id] = message
        costs.append(token_counter([message]))
        n_tokens += costs[-1]
        if (
            n_tokens >= max_tokens_before_summary
            and total_n_tokens - n_tokens <= max_remaining_tokens
            and not should_summarize
        ):
            n_tokens_to_summarize = n_tokens
            should_summarize = True
            idx = i
    if not should_summarize and overflow:
        # langmem would return more than max_tokens here: fold the shortest prefix that
        # leaves the rest (plus the summary) within it, or, when even the newest message alone
        # leaves no room, everything but the newest message.
        n_tokens = 0
        for offset, cost in enumerate(costs):
            n_tokens += cost
            if total_n_tokens - n_tokens <= max_remaining_tokens:
                idx = total_summarized_messages + offset
                break
        else:
            logger.warning("the newest message alone exceeds max_tokens - max_summary_tokens")
            idx = len(messages) - 2
            n_tokens = total_n_tokens - costs[-1]
        if idx >= total_summarized_messages:
            should_summarize = True
            n_tokens_to_summarize = n_tokens

    to_summarize = messages[total_summarized_messages : idx + 1] if should_summarize else []
    if to_summarize and isinstance(to_summarize[-1], AIMessage) and to_summarize[-1].tool_calls:
        for tool_call in to_summarize[-1].tool_calls:
            if tool_call["id"] in tool_messages:
                tool_message = tool_messages[tool_call["id"]]
                n_tokens_to_summarize += token_counter([tool_message])
                to_summarize.append(tool_message)
    return _Preprocessed(
        to_summarize,
        n_tokens_to_summarize,
        max_tokens_to_summarize,
        total_summarized_messages,
        existing_system_message,
    )


def _summary_messages(messages: Sequence[AnyMessage]) -> list[SummaryMessage]:
    """LangChain messages as the local summarizer's input."""
    out: list[SummaryMessage] = []
    for message in messages:
        event_id = str(message.id or "")
        text = _text(message.content)
        if isinstance(message, ToolMessage):
            out.append(
                SummaryMessage(event_id, EventType.TOOL_RESULT, "tool", text, message.name or "")
            )
        elif isinstance(message, AIMessage):
            if text:
                out.append(SummaryMessage(event_id, EventType.AGENT_MESSAGE, "assistant", text))
            for call in message.tool_calls:
                args = json.dumps(call["args"], sort_keys=True, default=str)
                out.append(
                    SummaryMessage(event_id, EventType.TOOL_CALL, "assistant", args, call["name"])
                )
        elif message.type == "human":
            out.append(SummaryMessage(event_id, EventType.USER_MESSAGE, "user", text))
        else:
            out.append(
                SummaryMessage(
                    event_id, EventType.AGENT_MESSAGE, _ROLES.get(message.type, "system"), text
                )
            )
    return out


class _Summarize:
    """One summarization call: everything but the model invocation, shared by sync and async."""

    def __init__(self, node: SummarizationNode, messages: list[AnyMessage], running: Any) -> None:
        self.node = node
        self.running = _as_running_summary(running)
        self.messages = messages
        self.pre = _preprocess(
            messages=messages,
            running_summary=self.running,
            max_tokens=node.max_tokens,
            max_tokens_before_summary=node.max_tokens_before_summary,
            max_summary_tokens=node.max_summary_tokens,
            token_counter=node.token_counter,
        )
        if self.pre.existing_system_message:
            self.messages = messages[1:]

    @property
    def folding(self) -> list[AnyMessage]:
        return self.pre.messages_to_summarize if self.messages else []

    def model_input(self) -> list[BaseMessage]:
        pre = self.pre
        to_summarize: list[Any] = list(pre.messages_to_summarize)
        if pre.n_tokens_to_summarize > pre.max_tokens_to_summarize:
            trimmed = trim_messages(
                to_summarize,
                max_tokens=pre.max_tokens_to_summarize,
                token_counter=self.node.token_counter,
                start_on="human",
                strategy="last",
                allow_partial=True,
            )
            to_summarize = trimmed or to_summarize
        if self.running:
            prompt = self.node.existing_summary_prompt.invoke(
                {"messages": to_summarize, "existing_summary": self.running.summary}
            )
        else:
            prompt = self.node.initial_summary_prompt.invoke({"messages": to_summarize})
        return list(cast(ChatPromptValue, prompt).messages)

    def summary_budget(self) -> int:
        """Tokens the summary text may use so the summary message costs max_summary_tokens."""
        wrapper = self.node.final_prompt.invoke(
            {"system_message": [], "summary": "", "messages": []}
        )
        overhead = self.node.token_counter(cast(ChatPromptValue, wrapper).messages)
        return max(1, self.node.max_summary_tokens - overhead)

    def local_summary(self) -> str:
        counter = self.node.text_counter
        summarizer = LocalSummarizer(count_tokens=counter)
        return summarizer.summarize(
            previous_summary=self.running.summary if self.running else "",
            messages=_summary_messages(self.pre.messages_to_summarize),
            max_tokens=self.summary_budget(),
        )

    def finish(self, summary_text: str | None) -> SummarizationResult:
        pre = self.pre
        if not self.messages:
            system = pre.existing_system_message
            return SummarizationResult(
                running_summary=self.running,
                messages=[system] if system is not None else [],
            )
        existing = self.running
        running = self.running
        if summary_text is not None:
            summary_text = ledger_tokens.truncate_to_tokens(
                summary_text, max_tokens=self.summary_budget(), count_tokens=self.node.text_counter
            )
            ids = set(existing.summarized_message_ids) if existing else set()
            running = RunningSummary(
                summary=summary_text,
                summarized_message_ids=ids | {str(m.id) for m in pre.messages_to_summarize},
                last_summarized_message_id=pre.messages_to_summarize[-1].id,
            )
        if running is None:
            out = list(self.messages)
            if pre.existing_system_message is not None:
                out = [pre.existing_system_message, *out]
            return SummarizationResult(messages=out)
        kept = self.messages[pre.total_summarized_messages + len(pre.messages_to_summarize) :]
        include_system = pre.existing_system_message is not None and not (
            existing
            and existing.summary
            and existing.summary in _text(pre.existing_system_message.content)
        )
        system_messages = (
            [pre.existing_system_message]
            if include_system and pre.existing_system_message is not None
            else []
        )
        out = self._render(system_messages, running.summary, kept)
        # Token counts are not additive across a string join: if the rendering is still over,
        # cut the summary by the overflow (a new summary only: an old one is already stored).
        for _ in range(5):
            over = self.node.token_counter(out) - self.node.max_tokens
            if over <= 0 or summary_text is None:
                break
            budget = self.node.text_counter(running.summary) - over
            running.summary = ledger_tokens.truncate_to_tokens(
                running.summary, max_tokens=max(0, budget), count_tokens=self.node.text_counter
            )
            out = self._render(system_messages, running.summary, kept)
        return SummarizationResult(messages=out, running_summary=running)

    def _render(
        self, system: list[SystemMessage], summary: str, kept: list[AnyMessage]
    ) -> list[AnyMessage]:
        value = self.node.final_prompt.invoke(
            {"system_message": system, "summary": summary, "messages": kept}
        )
        return cast(list[AnyMessage], cast(ChatPromptValue, value).messages)


def _as_running_summary(value: Any) -> RunningSummary | None:
    """Ours, langmem's (a checkpoint written before the swap) or a dict from a serializer."""
    if value is None:
        return None
    if isinstance(value, RunningSummary):
        return value
    if isinstance(value, dict):
        return RunningSummary(
            summary=value["summary"],
            summarized_message_ids=set(value.get("summarized_message_ids", ())),
            last_summarized_message_id=value.get("last_summarized_message_id"),
        )
    return RunningSummary(
        summary=value.summary,
        summarized_message_ids=set(value.summarized_message_ids),
        last_summarized_message_id=value.last_summarized_message_id,
    )


def _response_text(response: Any) -> str:
    content = getattr(response, "content", response)
    return _text(content)


# --- the ledger sink ---------------------------------------------------------------------------

_NAMESPACE = uuid.UUID("6f1d3c1e-9a51-4c43-8d0b-6a4c1f0e7b21")


class LedgerSink:
    """Records a graph's messages into a Context Ledger session.

    `session` is a session id (UUID) or any other string used as a key: the first session of
    the client's user titled with that key, created on first use for `model`. Event ids are
    derived from the session and the message ids, so recording a message twice (a retry, a
    restarted process) stores it once.
    """

    def __init__(self, client: Any, session: str, *, model: str = "gpt-4o") -> None:
        self.client = client
        self.session = session
        self.model = model
        self._session_id: str | None = None
        self._recorded: set[str] = set()
        self._lock = threading.Lock()

    def _resolve(self) -> str:
        if self._session_id is None:
            try:
                self._session_id = str(uuid.UUID(self.session))
            except ValueError:
                matches = [s for s in self.client.list_sessions() if s.title == self.session]
                if matches:
                    self._session_id = matches[0].id
                else:
                    created = self.client.create_session(model=self.model, title=self.session)
                    self._session_id = created.id
        return self._session_id

    @property
    def session_id(self) -> str:
        return self._resolve()

    def _event_id(self, session_id: str, *parts: str) -> str:
        return str(uuid.uuid5(_NAMESPACE, ":".join((session_id, *parts))))

    def events_for(
        self, messages: Sequence[AnyMessage], *, summary: str | None
    ) -> tuple[list[dict[str, Any]], list[str]]:
        session_id = self._resolve()
        events: list[dict[str, Any]] = []
        ids: list[str] = []
        for message in messages:
            key = str(message.id)
            if message.id is None or key in self._recorded:
                continue
            # The node's own summary message is not conversation: it is noted separately.
            if summary and isinstance(message, SystemMessage) and summary in _text(message.content):
                continue
            ids.append(key)
            if isinstance(message, ToolMessage):
                events.append(
                    {
                        "id": self._event_id(session_id, key),
                        "type": EventType.TOOL_RESULT,
                        "content": message.content,
                        "toolCallId": message.tool_call_id,
                        "name": message.name or "",
                    }
                )
            elif isinstance(message, AIMessage):
                if message.content or not message.tool_calls:
                    events.append(
                        {
                            "id": self._event_id(session_id, key),
                            "type": EventType.AGENT_MESSAGE,
                            "content": message.content,
                        }
                    )
                for call in message.tool_calls:
                    events.append(
                        {
                            "id": self._event_id(session_id, key, str(call["id"])),
                            "type": EventType.TOOL_CALL,
                            "name": call["name"],
                            "toolCallId": call["id"],
                            "content": json.dumps(call["args"], default=str),
                        }
                    )
            elif isinstance(message, SystemMessage):
                events.append(
                    {
                        "id": self._event_id(session_id, key),
                        "type": EventType.SYSTEM_PROMPT,
                        "content": message.content,
                    }
                )
            else:
                events.append(
                    {
                        "id": self._event_id(session_id, key),
                        "type": EventType.USER_MESSAGE,
                        "content": message.content,
                    }
                )
        return [{k: v for k, v in e.items() if v != ""} for e in events], ids

    def note_for(self, folded: Sequence[AnyMessage], running: RunningSummary) -> dict[str, Any]:
        session_id = self._resolve()
        return {
            "id": self._event_id(session_id, "summary", str(running.last_summarized_message_id)),
            "type": EventType.LOCAL_SYSTEM_MESSAGE,
            "content": f"LangGraph SummarizationNode folded {len(folded)} messages into the "
            f"running summary:\n\n{running.summary}",
            "metadata": {
                "langgraph": {
                    "summarizedMessageIds": sorted(running.summarized_message_ids),
                    "lastSummarizedMessageId": running.last_summarized_message_id,
                }
            },
        }

    def record(
        self,
        messages: Sequence[AnyMessage],
        folded: Sequence[AnyMessage],
        running: RunningSummary | None,
    ) -> None:
        """Append the messages not recorded yet (and a note of a new summary), synchronously."""
        if inspect.iscoroutinefunction(getattr(self.client, "append_many", None)):
            # An AsyncClient is bound to its event loop: it can only serve `ainvoke`.
            logger.warning("ledger=: an AsyncClient records under ainvoke only; use Client")
            return
        try:
            with self._lock:
                events, ids = self.events_for(
                    messages, summary=running.summary if running else None
                )
                if folded and running is not None:
                    events.append(self.note_for(folded, running))
                if events:
                    self.client.append_many(self._resolve(), events)
                self._recorded.update(ids)
        except Exception:  # the ledger is a record: its outage must not stop the graph
            logger.warning("recording into the Context Ledger failed", exc_info=True)

    async def arecord(
        self,
        messages: Sequence[AnyMessage],
        folded: Sequence[AnyMessage],
        running: RunningSummary | None,
    ) -> None:
        if not inspect.iscoroutinefunction(getattr(self.client, "append_many", None)):
            await asyncio.to_thread(self.record, messages, folded, running)
            return
        try:
            if self._session_id is None:
                try:
                    self._session_id = str(uuid.UUID(self.session))
                except ValueError:
                    matches = [
                        s for s in await self.client.list_sessions() if s.title == self.session
                    ]
                    if matches:
                        self._session_id = matches[0].id
                    else:
                        created = await self.client.create_session(
                            model=self.model, title=self.session
                        )
                        self._session_id = created.id
            events, ids = self.events_for(messages, summary=running.summary if running else None)
            if folded and running is not None:
                events.append(self.note_for(folded, running))
            if events:
                await self.client.append_many(self._session_id, events)
            self._recorded.update(ids)
        except Exception:
            logger.warning("recording into the Context Ledger failed", exc_info=True)


# --- the node ----------------------------------------------------------------------------------


class SummarizationNode(RunnableCallable):
    """A LangGraph node that summarizes messages when they exceed a token limit and replaces
    them with a summary message; see the module docstring for what it adds to langmem's."""

    def __init__(
        self,
        *,
        model: Any = None,
        max_tokens: int,
        max_tokens_before_summary: int | None = None,
        max_summary_tokens: int = 256,
        token_counter: TokenCounter | None = None,
        initial_summary_prompt: ChatPromptTemplate = DEFAULT_INITIAL_SUMMARY_PROMPT,
        existing_summary_prompt: ChatPromptTemplate = DEFAULT_EXISTING_SUMMARY_PROMPT,
        final_prompt: ChatPromptTemplate = DEFAULT_FINAL_SUMMARY_PROMPT,
        input_messages_key: str = "messages",
        output_messages_key: str = "summarized_messages",
        name: str = "summarization",
        memory_flush_hook: MemoryFlushHook | None = None,
        ledger: LedgerSink | tuple[Any, str] | None = None,
        token_model: str | None = None,
    ) -> None:
        super().__init__(self._func, self._afunc, name=name, trace=False)
        if max_summary_tokens >= max_tokens:
            raise ValueError("`max_summary_tokens` must be less than `max_tokens`.")
        self.model = model
        self.max_tokens = max_tokens
        self.max_tokens_before_summary = max_tokens_before_summary
        self.max_summary_tokens = max_summary_tokens
        self.token_model = token_model or _model_name(model) or "gpt-4o"
        self.token_counter: TokenCounter = token_counter or exact_token_counter(self.token_model)
        text_counter = ledger_tokens.counter_for_model(self.token_model)
        self.text_counter: Callable[[str], int] = text_counter.count
        self.initial_summary_prompt = initial_summary_prompt
        self.existing_summary_prompt = existing_summary_prompt
        self.final_prompt = final_prompt
        self.input_messages_key = input_messages_key
        self.output_messages_key = output_messages_key
        self.memory_flush_hook = memory_flush_hook
        if isinstance(ledger, tuple):
            ledger = LedgerSink(ledger[0], ledger[1], model=self.token_model)
        self.ledger = ledger
        self._background: set[Any] = set()

    # --- input / output, as langmem ---

    def _parse_input(
        self, input: dict[str, Any] | BaseModel
    ) -> tuple[list[AnyMessage], dict[str, Any]]:
        if isinstance(input, dict):
            messages = input.get(self.input_messages_key)
            context = input.get("context", {}) or {}
        elif isinstance(input, BaseModel):
            messages = getattr(input, self.input_messages_key, None)
            context = getattr(input, "context", {}) or {}
        else:
            raise ValueError(f"Invalid input type: {type(input)}")
        if messages is None:
            raise ValueError(f"Missing required field `{self.input_messages_key}` in the input.")
        return cast(list[AnyMessage], convert_to_messages(messages)), context

    def _state_update(self, context: dict[str, Any], result: SummarizationResult) -> dict[str, Any]:
        update: dict[str, Any] = {self.output_messages_key: result.messages}
        if result.running_summary:
            update["context"] = {**context, "running_summary": result.running_summary}
            if self.input_messages_key == self.output_messages_key:
                update[self.output_messages_key] = [
                    RemoveMessage(id=REMOVE_ALL_MESSAGES),
                    *result.messages,
                ]
        return update

    # --- the memory flush hook, never inline ---

    def _flush_in_thread(self, messages: list[AnyMessage]) -> None:
        hook = self.memory_flush_hook
        assert hook is not None

        def run() -> None:
            try:
                outcome = hook(messages)
                if inspect.isawaitable(outcome):
                    asyncio.run(_awaited(outcome))
            except Exception:
                logger.warning("memory_flush_hook failed", exc_info=True)

        thread = threading.Thread(target=run, name="memory-flush-hook", daemon=True)
        thread.start()

    def _flush_on_loop(self, messages: list[AnyMessage]) -> None:
        hook = self.memory_flush_hook
        assert hook is not None
        if not inspect.iscoroutinefunction(hook):
            self._flush_in_thread(messages)
            return

        async def run() -> None:
            try:
                await hook(messages)
            except Exception:
                logger.warning("memory_flush_hook failed", exc_info=True)

        task = asyncio.get_running_loop().create_task(run())
        # The loop holds tasks weakly: keep a reference until it is done.
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # --- the node ---

    def _func(self, input: dict[str, Any] | BaseModel) -> dict[str, Any]:
        messages, context = self._parse_input(input)
        step = _Summarize(self, messages, context.get("running_summary"))
        folding = list(step.folding)
        summary_text: str | None = None
        if folding:
            if self.memory_flush_hook is not None:
                self._flush_in_thread(folding)
            if self.model is None:
                summary_text = step.local_summary()
            else:
                summary_text = _response_text(self.model.invoke(step.model_input()))
        result = step.finish(summary_text)
        if self.ledger is not None:
            self.ledger.record(messages, folding, result.running_summary)
        return self._state_update(context, result)

    async def _afunc(self, input: dict[str, Any] | BaseModel) -> dict[str, Any]:
        messages, context = self._parse_input(input)
        step = _Summarize(self, messages, context.get("running_summary"))
        folding = list(step.folding)
        summary_text: str | None = None
        if folding:
            if self.memory_flush_hook is not None:
                self._flush_on_loop(folding)
            if self.model is None:
                summary_text = await asyncio.to_thread(step.local_summary)
            else:
                summary_text = _response_text(await self.model.ainvoke(step.model_input()))
        result = step.finish(summary_text)
        if self.ledger is not None:
            await self.ledger.arecord(messages, folding, result.running_summary)
        return self._state_update(context, result)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable
