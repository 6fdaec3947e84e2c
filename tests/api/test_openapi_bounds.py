"""The OpenAPI document states the range of every numeric query parameter the API enforces,
so a client (or a schema-driven fuzzer) knows which values are accepted."""

from __future__ import annotations

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
