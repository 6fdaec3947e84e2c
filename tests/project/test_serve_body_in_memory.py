"""`manage.py serve`'s server keeps a request body of up to 1 MiB in memory while it arrives
and hands it to the application in one piece (issue 31, item 5): Twisted wrote any body over
100 kB to a temporary file and daphne handed it over in 8 KiB pieces."""

from __future__ import annotations

from io import BytesIO

import pytest
from daphne.http_protocol import HTTPFactory

from compaction_app import http_server

pytestmark = pytest.mark.profile_independent


def _request(length: int | None) -> http_server.LedgerRequest:
    request = http_server.LedgerRequest.__new__(http_server.LedgerRequest)
    request.gotLength(length)
    return request


def test_it_keeps_a_body_of_up_to_a_mebibyte_in_memory():
    assert isinstance(_request(300_000).content, BytesIO)
    assert isinstance(_request(http_server.BODY_IN_MEMORY).content, BytesIO)


def test_it_spools_a_larger_body_or_one_of_unknown_length_to_a_file():
    for length in (http_server.BODY_IN_MEMORY + 1, None):
        content = _request(length).content
        assert not isinstance(content, BytesIO)
        content.close()


def test_it_hands_such_a_body_over_in_one_piece():
    server = http_server.LedgerServer(
        application=None, endpoints=["tcp:port=0:interface=127.0.0.1"]
    )
    assert server.request_buffer_size == http_server.BODY_IN_MEMORY


def test_it_builds_its_own_requests_once_running():
    server = http_server.LedgerServer(
        application=None, endpoints=["tcp:port=0:interface=127.0.0.1"]
    )
    server.http_factory = HTTPFactory(server)
    server.connections = {}
    server._apply_deadlines()
    assert type(server.http_factory) is http_server.LedgerHTTPFactory
    protocol = server.http_factory.buildProtocol(None)
    assert protocol.requestFactory is http_server.LedgerRequest
