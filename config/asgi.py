"""ASGI entry point: HTTP through Django, websockets through Channels."""

import gc
import os
import sys

from django.conf import settings
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_asgi_app = get_asgi_application()

# A light request shares its process with CPU-bound heavy ones (a big session's /context, dry
# runs): it must get the GIL back soon after each database round trip (GIL_SWITCH_INTERVAL_MS).
sys.setswitchinterval(settings.GIL_SWITCH_INTERVAL_MS / 1000)

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from compaction_app.gateway.asgi import GatewayHandler, with_gateway  # noqa: E402
from compaction_app.http_server import harden_daphnes_command_line  # noqa: E402
from compaction_app.mcp.asgi import McpApp, with_mcp  # noqa: E402
from compaction_app.realtime.routing import websocket_urlpatterns  # noqa: E402
from compaction_app.realtime.ws_auth import TokenAuthMiddleware  # noqa: E402
from sessions_app.middleware import StreamingBodyLimit  # noqa: E402

# `daphne config.asgi:application` serves with the project's server (deadlines, no keys in its
# access log), as `manage.py serve` does.
harden_daphnes_command_line()

application = ProtocolTypeRouter(
    {
        # Static files are served by the app itself so the embedded profile needs no other
        # server; production deployments may put a CDN or proxy in front instead.
        # The body limit is enforced while the body streams in (see StreamingBodyLimit).
        # The gateway skips the site's sync middleware (see compaction_app/gateway/asgi.py);
        # /mcp is the MCP SDK's own ASGI transport (compaction_app/mcp/asgi.py).
        "http": StreamingBodyLimit(
            with_mcp(
                with_gateway(ASGIStaticFilesHandler(django_asgi_app), GatewayHandler()), McpApp()
            )
        ),
        # The Origin check lives in TokenAuthMiddleware: it applies to cookie-authenticated
        # connections only (token clients such as Python agents send no Origin).
        "websocket": AuthMiddlewareStack(TokenAuthMiddleware(URLRouter(websocket_urlpatterns))),
    }
)

# Everything imported so far lives as long as the process: move it out of the collector's
# generations so full collections during large ingests do not rescan it (measured: ~25% of
# a 3,000-event bulk append's time on a fresh heap).
gc.freeze()
# Objects a request makes and drops (a gateway call's parsed body) are freed by their reference
# counts before the collector's next pass sees them (settings.GC_GEN0_THRESHOLD).
gc.set_threshold(settings.GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])
