"""The LangGraph SummarizationNode: real StateGraphs with MessagesState and an InMemorySaver
over 50+ turns (both key modes, invoke and ainvoke), side by side with langmem's own node, the
memory-flush hook, recording into a live ledger, and a Django-free import."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage, SystemMessage
from langchain_core.runnables import RunnableLambda
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.message import REMOVE_ALL_MESSAGES

from compaction_app.integrations.langgraph import (
    MSGPACK_ALLOWLIST,
    RunningSummary,
    SummarizationNode,
    exact_token_counter,
)

pytestmark = pytest.mark.profile_independent

ROOT = Path(__file__).resolve().parents[2]
MAX_TOKENS = 400
SUMMARY_TOKENS = 128
COUNT = exact_token_counter("gpt-4o")


class State(MessagesState):
    context: dict[str, Any]


class ModelInput(MessagesState):
    summarized_messages: list
    context: dict[str, Any]


def user_turn(i: int) -> HumanMessage:
    digest = hashlib.sha256(str(i).encode()).hexdigest()[:24]
    return HumanMessage(
        id=f"h{i}", content=f"Turn {i}: fix src/app_{i}.py, build {digest}, error E{i * 7}."
    )


def agent_turn(i: int) -> AIMessage:
    return AIMessage(
        id=f"a{i}",
        content=f"Edited src/app_{i}.py at 0x{i * 99991:08x}; {i * 13}/{i * 17 + 1} tests pass.",
    )


def conversation(turns: int) -> list:
    return [m for i in range(turns) for m in (user_turn(i), agent_turn(i))]


def build_graph(node: SummarizationNode, *, same_key: bool, seen: list[int]):
    """summarize → call_model; call_model checks and records what it was given."""
    key = "messages" if same_key else "summarized_messages"

    def call_model(state: dict) -> dict:
        given = state[key]
        seen.append(COUNT(given))
        return {"messages": [agent_turn(len(seen) + 10_000)]}

    graph = StateGraph(State)
    graph.add_node("summarize", node)
    graph.add_node("call_model", call_model, input_schema=ModelInput)
    graph.add_edge(START, "summarize")
    graph.add_edge("summarize", "call_model")
    saver = InMemorySaver(serde=JsonPlusSerializer(allowed_msgpack_modules=MSGPACK_ALLOWLIST))
    return graph.compile(checkpointer=saver)


def node_for(same_key: bool, **kwargs) -> SummarizationNode:
    key = "messages" if same_key else "summarized_messages"
    return SummarizationNode(
        model=kwargs.pop("model", None),
        max_tokens=MAX_TOKENS,
        max_summary_tokens=SUMMARY_TOKENS,
        output_messages_key=key,
        **kwargs,
    )


@pytest.mark.parametrize("same_key", [False, True], ids=["separate-keys", "same-key"])
@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_it_keeps_a_55_turn_graph_within_max_tokens_with_an_incremental_summary(same_key, mode):
    seen: list[int] = []
    graph = build_graph(node_for(same_key), same_key=same_key, seen=seen)
    config = {"configurable": {"thread_id": f"{mode}-{same_key}"}}
    summaries: list[RunningSummary] = []

    async def run_async() -> None:
        for i in range(55):
            await graph.ainvoke({"messages": [user_turn(i)]}, config)
            summaries.append(
                graph.get_state(config).values.get("context", {}).get("running_summary")
            )

    if mode == "ainvoke":
        asyncio.run(run_async())
    else:
        for i in range(55):
            graph.invoke({"messages": [user_turn(i)]}, config)
            summaries.append(
                graph.get_state(config).values.get("context", {}).get("running_summary")
            )

    assert len(seen) == 55
    assert max(seen) <= MAX_TOKENS
    done = [s for s in summaries if s is not None]
    assert isinstance(done[-1], RunningSummary)
    # Incremental: the summarized ids only grow, the last id moves, the first request survives.
    for earlier, later in zip(done, done[1:], strict=False):
        assert earlier.summarized_message_ids <= later.summarized_message_ids
    assert len({s.last_summarized_message_id for s in done}) > 3
    assert "h0" in done[-1].summarized_message_ids
    assert "src/app_0.py" in done[-1].summary
    assert (
        COUNT([SystemMessage(f"Summary of the conversation so far: {done[-1].summary}")])
        <= SUMMARY_TOKENS
    )
    state = graph.get_state(config).values
    if same_key:
        # The summary replaced the folded messages in the graph's own list.
        assert COUNT(state["messages"]) <= MAX_TOKENS + COUNT([agent_turn(0)]) * 2
        assert state["messages"][0].content.startswith("Summary of the conversation so far")
    else:
        assert len(state["messages"]) == 110  # the full history stays in the state


def test_it_revives_its_running_summary_from_a_default_checkpointer_without_a_warning(
    monkeypatch, caplog
):
    """The documented graph (docs/integrations.md): a plain InMemorySaver(), no serializer argument."""
    from langgraph.checkpoint.serde import jsonplus

    monkeypatch.setattr(jsonplus, "_warned_unregistered_types", set())
    graph = StateGraph(State)
    graph.add_node("summarize", node_for(False))
    graph.add_node("call_model", lambda state: {"messages": [agent_turn(0)]})
    graph.add_edge(START, "summarize")
    graph.add_edge("summarize", "call_model")
    app = graph.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "default-serde"}}
    with caplog.at_level("WARNING"):
        for i in range(30):
            app.invoke({"messages": [user_turn(i)]}, config)
    assert isinstance(app.get_state(config).values["context"]["running_summary"], RunningSummary)
    assert not [r for r in caplog.records if "unregistered" in r.getMessage()]


def test_it_starts_a_same_key_update_with_remove_all_messages():
    node = node_for(True)
    update = node.invoke({"messages": conversation(30)})
    first, summary = update["messages"][0], update["messages"][1]
    assert isinstance(first, RemoveMessage) and first.id == REMOVE_ALL_MESSAGES
    assert isinstance(summary, SystemMessage)
    assert summary.content.startswith("Summary of the conversation so far")
    assert isinstance(update["context"]["running_summary"], RunningSummary)
    assert COUNT(update["messages"][1:]) <= MAX_TOKENS


def test_it_returns_messages_unchanged_below_the_limit():
    messages = conversation(2)
    update = node_for(False).invoke({"messages": messages})
    assert update == {"summarized_messages": messages}


def test_it_uses_langmems_prompts_with_a_chat_model_and_holds_the_summary_to_its_budget():
    prompts: list[list] = []

    def model(messages: list) -> AIMessage:
        prompts.append(messages)
        return AIMessage(content="Long summary sentence about src/app.py. " * 200)

    node = node_for(False, model=RunnableLambda(model))
    first = node.invoke({"messages": conversation(20)})
    running = first["context"]["running_summary"]
    assert prompts[0][-1].content == "Create a summary of the conversation above:"
    assert COUNT(first["summarized_messages"]) <= MAX_TOKENS
    assert COUNT([first["summarized_messages"][0]]) <= SUMMARY_TOKENS
    second = node.invoke({"messages": conversation(40), "context": first["context"]})
    assert prompts[1][-1].content.startswith("This is summary of the conversation so far: ")
    assert running.summary in prompts[1][-1].content
    # Only messages not yet summarized were sent the second time.
    sent = {m.id for m in prompts[1][:-1]}
    assert not sent & running.summarized_message_ids
    assert COUNT(second["summarized_messages"]) <= MAX_TOKENS


def test_it_matches_langmems_node_and_does_not_overshoot_where_langmem_does():
    from langchain_core.messages.utils import count_tokens_approximately
    from langmem.short_term import SummarizationNode as LangmemNode

    messages = conversation(40)
    model = FakeListChatModel(responses=["A short summary of the conversation."] * 400)
    worst_langmem = worst_ours = agreements = 0
    for n in range(2, len(messages) + 1):
        state = {"messages": messages[:n]}
        # Same counter on both sides: same keys and the same message ids kept.
        theirs = LangmemNode(
            model=model, max_tokens=300, max_summary_tokens=64, token_counter=COUNT
        ).invoke(state)
        ours = SummarizationNode(model=model, max_tokens=300, max_summary_tokens=64).invoke(state)
        assert set(theirs) == set(ours)
        if COUNT(theirs["summarized_messages"]) <= 300:
            assert [m.id for m in theirs["summarized_messages"][1:]] == [
                m.id for m in ours["summarized_messages"][1:]
            ]
            agreements += 1
        # langmem's default, approximate counter against the exact count of what it returns.
        approx = LangmemNode(model=model, max_tokens=300, max_summary_tokens=64).invoke(state)
        assert count_tokens_approximately(approx["summarized_messages"]) <= 300 + 64
        worst_langmem = max(worst_langmem, COUNT(approx["summarized_messages"]))
        worst_ours = max(worst_ours, COUNT(ours["summarized_messages"]))
    print(f"\nmax_tokens=300: langmem (approximate) up to {worst_langmem}, ours up to {worst_ours}")
    assert agreements > 30
    assert worst_langmem > 300
    assert worst_ours <= 300


def test_it_runs_the_memory_flush_hook_on_a_thread_without_blocking_the_node():
    release = threading.Event()
    received: list[list] = []
    finished = threading.Event()

    def hook(messages: list) -> None:
        release.wait(10)
        received.append(messages)
        finished.set()

    node = node_for(False, memory_flush_hook=hook)
    update = node.invoke({"messages": conversation(30)})  # returns while the hook waits
    assert not finished.is_set()
    release.set()
    assert finished.wait(10)
    assert {m.id for m in received[0]} == update["context"][
        "running_summary"
    ].summarized_message_ids


def test_it_runs_an_async_memory_flush_hook_as_a_loop_task_under_ainvoke():
    async def scenario() -> tuple[list, dict]:
        release = asyncio.Event()
        received: list[list] = []

        async def hook(messages: list) -> None:
            await release.wait()
            received.append(messages)

        node = node_for(False, memory_flush_hook=hook)
        update = await node.ainvoke({"messages": conversation(30)})
        assert received == []  # the node returned; the hook is still waiting
        release.set()
        for _ in range(100):
            if received:
                break
            await asyncio.sleep(0.01)
        return received, update

    received, update = asyncio.run(scenario())
    assert {m.id for m in received[0]} == update["context"][
        "running_summary"
    ].summarized_message_ids


def test_it_imports_and_summarizes_without_django_settings():
    script = (
        "import sys\n"
        "from langchain_core.messages import HumanMessage\n"
        "from compaction_app.integrations.langgraph import SummarizationNode\n"
        "msgs = [HumanMessage(id=str(i), content=f'Fix src/app_{i}.py now, error E{i}.') "
        "for i in range(80)]\n"
        "update = SummarizationNode(model=None, max_tokens=300).invoke({'messages': msgs})\n"
        "assert update['context']['running_summary'].summary\n"
        "assert 'django' not in sys.modules, 'django was imported'\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


@pytest.fixture(scope="module")
def live():
    from tests.support.live_ledger import live_ledger

    with live_ledger() as server:
        yield server


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_it_records_the_graphs_messages_into_a_ledger_session(live, mode):
    from compaction_app.integrations.client import AsyncClient, Client

    client = Client(live.base_url, live.tokens["alice"])
    key = f"graph-{mode}"
    if mode == "ainvoke":
        node = node_for(False, ledger=(AsyncClient(live.base_url, live.tokens["alice"]), key))
    else:
        node = node_for(False, ledger=(client, key))
    seen: list[int] = []
    graph = build_graph(node, same_key=False, seen=seen)
    config = {"configurable": {"thread_id": key}}

    async def run_async() -> None:
        for i in range(25):
            await graph.ainvoke({"messages": [user_turn(i)]}, config)

    if mode == "ainvoke":
        asyncio.run(run_async())
    else:
        for i in range(25):
            graph.invoke({"messages": [user_turn(i)]}, config)

    sessions = [s for s in client.list_sessions() if s.title == key]
    assert len(sessions) == 1
    events = client.events(sessions[0].id)
    users = [e for e in events if e.type == "USER_MESSAGE"]
    agents = [e for e in events if e.type == "AGENT_MESSAGE"]
    notes = [e for e in events if e.type == "LOCAL_SYSTEM_MESSAGE"]
    # Every user turn once; every agent reply that came back through the node once (the last
    # reply is recorded on the next call).
    assert [e.content for e in users] == [user_turn(i).content for i in range(25)]
    assert len(agents) == 24
    assert notes and "folded" in notes[0].content
    # Recording the same messages again (a restarted process) stores nothing twice.
    again = node_for(False, ledger=(client, key))
    again.invoke({"messages": graph.get_state(config).values["messages"]})
    after = client.events(sessions[0].id)
    assert [e.type for e in after].count("USER_MESSAGE") == 25
    assert [e.type for e in after].count("AGENT_MESSAGE") == 25  # only the last reply was new
