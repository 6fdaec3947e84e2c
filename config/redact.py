"""Provider keys out of every log line (pure: no Django).

Gemini's clients may put their API key in the query (`?key=`). The gateway moves it into a
header before forwarding, but the servers log request URIs: daphne's access log (every line),
and Django's `django.request` logger (a 4xx or 5xx answer, with the request's decoded path, in
which `files%3Fkey=K` reads `files?key=K`). `redacted` replaces a `key` parameter's value,
however it is written (`?key=`, `&KEY=`, `%3Fkey=`, `%26key%3D`), with `***`; `RedactKeys`
applies it to every record the project's log handler writes (issue 42, row 8).
"""

from __future__ import annotations

import logging
import re

# A `key` parameter, its `?`/`&` and `=` plain or percent-encoded, and its value (up to the
# next parameter, plain or encoded, a fragment or a space).
_KEY = re.compile(
    r"((?:[?&]|%3F|%26)key(?:=|%3D))(?:(?!%26)[^&#\s\"'])*",
    re.IGNORECASE,
)


def redacted(text: str) -> str:
    """`text` (a URI, or a log message holding one) with every `key` parameter's value shown
    as `***`."""
    if "key" not in text.lower():
        return text
    return _KEY.sub(r"\1***", text)


class RedactKeys(logging.Filter):
    """A handler's filter: the record's message as `redacted` shows it."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: left for the handler to report
            return True
        clean = redacted(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True
