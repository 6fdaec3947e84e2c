"""schemathesis hooks for `st run` against a live server (schemathesis.toml loads them).

Valid (positive) cases are kept to the API's documented rules that a JSON schema cannot
state (tests/support/api_rules.py), reading what is stored through the server's own API with
the run's headers: a generated request breaking one of them is a request the API rightly
refuses, not a schema the API fails to honour. Invalid (negative) cases are left alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import requests
import schemathesis
from schemathesis import GenerationMode

from tests.support.api_rules import within_documented_rules

API = "/api/v1"
LOOKUP_TIMEOUT_SECONDS = 10


class ServerState:
    """The rules' StoredState, read from the live server as the run's user."""

    def __init__(self, base_url: str, headers: Mapping[str, str]) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = dict(headers)

    def _get(self, path: str) -> Any:
        response = requests.get(
            self.base_url + API + path, headers=self.headers, timeout=LOOKUP_TIMEOUT_SECONDS
        )
        return response.json() if response.status_code == 200 else None

    def _session(self, session_id: str) -> Any:
        return self._get(f"/sessions/{quote(session_id, safe='')}")

    def stored_settings(self, session_id: str) -> Mapping[str, Any] | None:
        session = self._session(session_id)
        return session.get("settings") if isinstance(session, dict) else None

    def context_limit(self, session_id: str) -> int | None:
        session = self._session(session_id)
        return session.get("contextLimit") if isinstance(session, dict) else None

    def has_thread(self, session_id: str, key: str) -> bool | None:
        threads = self._get(f"/sessions/{quote(session_id, safe='')}/threads")
        if not isinstance(threads, dict):
            return None
        return any(thread.get("key") == key for thread in threads.get("results", []))


def _mode(case: Any) -> GenerationMode | None:
    meta = getattr(case, "meta", None)
    return meta.generation.mode if meta is not None else None


@schemathesis.hook
def filter_case(context: Any, case: Any) -> bool:
    if _mode(case) != GenerationMode.POSITIVE:
        return True
    schema = case.operation.schema
    state = ServerState(schema.get_base_url(), schema.config.headers or {})
    body = case.body if isinstance(case.body, dict | list | str) else None
    return within_documented_rules(
        method=case.method,
        path=case.operation.path,
        body=body,
        path_parameters=case.path_parameters,
        state=state,
        query=case.query,
    )
