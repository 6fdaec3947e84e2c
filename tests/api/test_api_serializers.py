"""The hand-built fast paths of the events API must match the DRF serializers exactly."""

import uuid

import pytest

from sessions_app import services
from sessions_app.api import serializers as s
from sessions_app.models import Event

VALID_EVENTS = [
    {"type": "SYSTEM_PROMPT", "content": "be terse"},
    {"type": "USER_MESSAGE", "content": "  keep my spaces  ", "pinned": True},
    {"id": str(uuid.uuid4()), "type": "AGENT_MESSAGE", "content": "", "metadata": {"k": [1, 2]}},
    {
        "type": "AGENT_MESSAGE",
        "content": "hi",
        "tokenUsage": {"promptTokens": 3, "totalTokens": None},
    },
    {"type": "TOOL_CALL", "name": "ls", "toolCallId": "c1", "content": '{"path": "."}'},
    {"type": "TOOL_RESULT", "toolCallId": "c1", "content": "a.py"},
    {"type": "CONTEXT_REFRESH", "content": "[CONTEXT REFRESH] go on", "unknownKey": 1},
    {"type": "LOCAL_SYSTEM_MESSAGE", "content": "for people", "tokenUsage": None},
    {"id": uuid.uuid4().hex, "type": "USER_MESSAGE", "content": "hex id"},
]


def test_it_parses_plain_events_exactly_as_the_serializer_does():
    fast = s.parse_events(VALID_EVENTS, single=False)
    body = s.EventInSerializer(data=VALID_EVENTS, many=True)
    assert body.is_valid(), body.errors
    assert fast == [s.to_event_input(item) for item in body.validated_data]


@pytest.mark.parametrize(
    "event",
    [
        {"type": "USER_MESSAGE", "content": 5},
        {"type": "USER_MESSAGE", "content": "x", "pinned": "yes"},
        {"type": "USER_MESSAGE", "content": "x", "tokenUsage": {"promptTokens": "5"}},
        {"type": "USER_MESSAGE", "content": "x", "tokenUsage": {"promptTokens": True}},
        {"type": "USER_MESSAGE", "content": "x", "tokenUsage": {"promptTokens": -1}},
        {"type": "TOOL_CALL", "content": "x", "toolCallId": "c"},
        {"type": "COMPACTION", "content": "x"},
        {"type": "USER_MESSAGE", "content": "x", "id": "not-a-uuid"},
        {"type": "CONTEXT_REFRESH", "content": "no prefix"},
    ],
)
def test_it_sends_anything_doubtful_to_the_serializer_for_its_error(event):
    assert not s._plainly_valid(event)
    with pytest.raises(Exception) as info:
        s.parse_events([VALID_EVENTS[1], event], single=False)
    assert type(info.value).__name__ == "ValidationError"


@pytest.mark.django_db
def test_it_renders_events_exactly_as_the_serializer_does(alice):
    session = services.session_create(owner=alice, model="gpt-4o", system_prompt="sys")
    inputs = s.parse_events(VALID_EVENTS[1:], single=False) + [
        services.EventInput(type="USER_MESSAGE", content=[{"type": "text", "text": "parts"}])
    ]
    services.event_append(session=session, events=inputs)
    events = list(Event.objects.filter(session=session).order_by("seq"))
    events[1].compacted_by = events[2]
    events[3].cleared_content = "[cleared]"
    events[2].reverted = True
    assert s.event_out(events) == s.EventOutSerializer(events, many=True).data
