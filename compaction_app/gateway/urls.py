"""The gateway's routes, built from the providers' own (the PROVIDERS registry): each format's routes
under its prefix, then for each prefix its root (HEAD probes) and a passthrough for every
other path below it, then a JSON 404 for anything else under /gateway/."""

import re

from django.urls import URLPattern, path

from compaction_app.gateway import views, wire
from compaction_app.gateway.providers import PROVIDERS

app_name = "gateway"


def _upstream_path(route_path: str) -> str:
    # Django's `<str:name>` becomes `{name}`, filled from the URL's values.
    return re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route_path)


def _patterns() -> list[URLPattern]:
    patterns: list[URLPattern] = []
    prefixes: dict[str, views.Wire] = {}
    for module in PROVIDERS:
        prefixes.setdefault(module.PREFIX, module)
        for route in module.ROUTES:
            patterns.append(
                path(
                    f"{module.PREFIX}/{route.path}",
                    views.view(
                        route.kind,
                        module,
                        upstream_path=_upstream_path(route.path),
                        params=route.params,
                    ),
                    name=route.name,
                )
            )
    for prefix, first in prefixes.items():
        # Errors under a prefix take the shape of its first wire (Responses and Chat
        # Completions share OpenAI's).
        patterns += [
            path(prefix, views.prefix_view(views.root, first)),
            path(f"{prefix}/", views.prefix_view(views.root, first)),
            path(f"{prefix}/<path:rest>", views.view(wire.PASSTHROUGH, first)),
        ]
    fallback = PROVIDERS[0]
    patterns += [
        path("", views.prefix_view(views.not_found, fallback)),
        path("<path:rest>", views.prefix_view(views.not_found, fallback)),
    ]
    return patterns


urlpatterns = _patterns()
