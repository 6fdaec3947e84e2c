"""Template filters of the dashboard."""

from __future__ import annotations

import re
from typing import Any

from django import template
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from sessions_app.pricing import usd_text
from sessions_app.scope import unpriced_text

register = template.Library()

# `[#812]` or `[#812-#840]`: the seqs a summary line came from.
CITATION = re.compile(r"\[#(\d+)(?:-#(\d+))?\]")


@register.filter
def cite_links(text: str, base: str = "") -> SafeString:
    """Escape `text`, then turn each citation into a link to its event on the session page.
    Escaping first is what makes this safe: the pattern has no character escaping changes."""

    def link(match: re.Match[str]) -> str:
        first = match.group(1)
        return f'<a class="cite" href="{escape(base)}#event-{first}">{match.group(0)}</a>'

    return mark_safe(CITATION.sub(link, str(escape(text or ""))))  # noqa: S308 - escaped above


@register.filter
def usd(amount: Any) -> str:
    """A dollar amount as every page shows it (sessions_app.pricing.usd_text)."""
    return usd_text(amount)


@register.filter
def unpriced(count: Any) -> str:
    """ "1 call with no price" (sessions_app.scope.unpriced_text)."""
    return unpriced_text(int(count or 0))
