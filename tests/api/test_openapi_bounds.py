"""The OpenAPI document states the bounds the API enforces (the range of every numeric query
parameter, no NUL in stored text, no blank model or query) and the statuses it answers, so a
client (or a schema-driven fuzzer) knows which values are accepted."""

from __future__ import annotations

import re
import sys

import pytest

from tests.api.test_openapi_schema import generated_schema

pytestmark = pytest.mark.django_db


def test_it_documents_the_bounds_of_every_integer_query_parameter():
    unbounded = [
        (method, path, parameter["name"])
        for path, item in generated_schema()["paths"].items()
        for method, operation in item.items()
        if isinstance(operation, dict)
        for parameter in operation.get("parameters", [])
        if parameter["in"] == "query"
        and parameter["schema"].get("type") == "integer"
        and not {"minimum", "maximum"} <= set(parameter["schema"])
    ]
    assert unbounded == []


def test_it_documents_the_ranges_it_enforces():
    paths = generated_schema()["paths"]

    def schema(path: str, method: str, name: str) -> dict:
        (parameter,) = [p for p in paths[path][method]["parameters"] if p["name"] == name]
        return parameter["schema"]

    events = "/api/v1/sessions/{session_id}/events"
    assert schema(events, "get", "limit") == {"type": "integer", "minimum": 1, "maximum": 1000}
    assert schema(events, "get", "after")["minimum"] == 0
    context = "/api/v1/sessions/{session_id}/context"
    for method in ("get", "post"):
        assert schema(context, method, "maxTokens")["minimum"] == 1
        assert schema(context, method, "reserveTokens")["minimum"] == 0
    assert schema("/api/v1/sessions", "get", "page")["minimum"] == 1


def test_it_states_that_no_stored_string_holds_a_nul():
    schemas = generated_schema()["components"]["schemas"]
    event = schemas["EventIn"]["properties"]
    stored = {
        "SessionCreate.model": schemas["SessionCreate"]["properties"]["model"],
        "SessionCreate.title": schemas["SessionCreate"]["properties"]["title"],
        "SessionCreate.systemPrompt": schemas["SessionCreate"]["properties"]["systemPrompt"],
        "PatchedSessionPatch.title": schemas["PatchedSessionPatch"]["properties"]["title"],
        "EventIn.content": next(s for s in event["content"]["oneOf"] if s["type"] == "string"),
        "EventIn.name": event["name"],
        "EventIn.toolCallId": event["toolCallId"],
    }
    for where, schema in stored.items():
        pattern = schema.get("pattern", "")
        assert re.search(pattern, "a\x00b") is None, where
        assert re.search(pattern, "ab") is not None, where


def test_it_states_blank_as_the_api_strips_it():
    """A model or a query of whitespace alone is refused; the schema's patterns spell out
    the characters Python's str.strip() removes (JSON Schema's own \\s is ECMA-262's)."""
    from sessions_app.api.openapi import NOT_BLANK

    assert [
        code
        for code in range(sys.maxunicode + 1)
        if (re.search(NOT_BLANK, chr(code)) is None) != chr(code).isspace()
    ] == []
    paths = generated_schema()["paths"]
    schemas = generated_schema()["components"]["schemas"]
    (q,) = [p for p in paths["/api/v1/search"]["get"]["parameters"] if p["name"] == "q"]
    model = schemas["SessionCreate"]["properties"]["model"]["pattern"]
    for pattern in (q["schema"]["pattern"], schemas["RecallIn"]["properties"]["query"]["pattern"]):
        assert re.search(pattern, "\x85\u3000") is None
        assert re.search(pattern, "\x85a") is not None
    assert re.search(model, " \n\x85") is None
    assert re.search(model, " gpt-4o ") is not None


def test_it_documents_406_on_every_operation():
    undocumented = [
        (method, path)
        for path, item in generated_schema()["paths"].items()
        for method, operation in item.items()
        if "406" not in operation["responses"]
    ]
    assert undocumented == []


def test_it_links_a_compactions_id_to_the_operations_that_take_it():
    paths = generated_schema()["paths"]
    links = paths["/api/v1/sessions/{session_id}/compactions"]["post"]["responses"]["202"]["links"]
    assert {link["operationId"] for link in links.values()} == {
        paths["/api/v1/compactions/{compaction_id}"]["get"]["operationId"],
        paths["/api/v1/compactions/{compaction_id}/revert"]["post"]["operationId"],
    }
    assert {str(link["parameters"]) for link in links.values()} == {
        str({"compaction_id": "$response.body#/id"})
    }
