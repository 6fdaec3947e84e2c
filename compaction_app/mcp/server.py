"""The MCP server (the official SDK's low-level `Server`), wired to the ledger's tools and
resources.

Who is calling comes from the transport: over HTTP, the user `asgi.McpApp` authenticated and
put in the request's scope; over stdio, the user `manage.py mcp` was started for. Every
handler's ORM work runs on the gateway's database threads (never on the event loop).

Errors keep REST's format and words, because they come from REST's own exception handler:
- a tool's failure (bad arguments, an unknown session, a compaction already running) is a
  tool result with `isError: true` whose text is REST's body, `{"error", "detail", ...}` plus
  the HTTP `status` REST would have answered: the model reads it and can correct itself;
- a resource's failure is a JSON-RPC error whose message is REST's `detail` and whose data is
  REST's body (a resource read has no result to carry an error in);
- an unknown tool or resource URI is the protocol's invalid-params error.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote

import mcp_types as types
from django.contrib.auth.models import AbstractBaseUser
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError

from compaction_app.gateway import workers
from compaction_app.mcp import selectors
from compaction_app.mcp.tools import TOOLS, TOOLS_BY_NAME
from sessions_app.api.errors import exception_handler

logger = logging.getLogger("compaction_app.mcp")

T = TypeVar("T")

NAME = "context-ledger"
VERSION = "1.0"
# Where the HTTP transport leaves the authenticated user (asgi.McpApp).
SCOPE_USER = "ledger.user"

INSTRUCTIONS = (
    "Context Ledger records this conversation and counts its tokens exactly. ledger_usage says "
    "how full your context window is; ledger_compact folds older events into a summary; "
    "ledger_search and ledger_recall bring back the exact text of anything folded."
)

SUMMARY_URI = "ledger://sessions/{session}/summary"
LOSS_REPORT_URI = "ledger://sessions/{session}/loss-report"
_RESOURCE_URI = re.compile(
    r"ledger://sessions/(?P<session>[^/]{1,200})/(?P<kind>summary|loss-report)"
)
RESOURCES_LISTED = 10


def _caller(ctx: ServerRequestContext[Any, Any], stdio_user: AbstractBaseUser | None) -> Any:
    if stdio_user is not None:
        return stdio_user
    request = ctx.request
    user = request.scope.get(SCOPE_USER) if request is not None else None
    if user is None:
        # asgi.McpApp answers 401 before any handler runs; this is a transport without it.
        raise MCPError(
            code=types.INVALID_REQUEST, message="Authentication credentials were not provided."
        )
    return user


def rest_error(exc: Exception) -> tuple[int, dict[str, Any]] | None:
    """REST's status and body for `exc`, or None when REST would answer 500."""
    response = exception_handler(exc, {})
    if response is None:
        return None
    return response.status_code, dict(response.data)


@dataclass(frozen=True)
class Failed:
    status: int
    body: dict[str, Any]


def _guarded(fn: Callable[..., T], *args: Any) -> T | Failed:
    """Run `fn`; a failure becomes the error REST would answer (a bug: REST's 500 body)."""
    try:
        return fn(*args)
    except Exception as exc:
        known = rest_error(exc)
        if known is None:
            logger.exception("MCP handler %s failed", getattr(fn, "__name__", fn))
            return Failed(
                500,
                {
                    "error": "internal_error",
                    "detail": "An unexpected error occurred; it has been logged.",
                },
            )
        return Failed(*known)


def _text(payload: Any) -> str:
    # Compact separators: the text lands in a context window.
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), default=str)


def _tool(spec: Any) -> types.Tool:
    return types.Tool(
        name=spec.name,
        title=spec.title,
        description=spec.description,
        input_schema=spec.schema,
        annotations=types.ToolAnnotations(
            title=spec.title,
            read_only_hint=spec.read_only,
            destructive_hint=False,
            idempotent_hint=spec.read_only,
            open_world_hint=False,
        ),
    )


def _read_resource(user: Any, uri: str) -> tuple[str, str]:
    """(mime type, text) of a resource URI."""
    from compaction_app.selectors import running_summary_get

    match = _RESOURCE_URI.fullmatch(uri)
    assert match is not None
    # A client key may hold any character; a client sends it percent-encoded in the URI.
    session = selectors.session_named(user=user, name=unquote(match["session"]))
    if match["kind"] == "summary":
        summary = running_summary_get(session=session)
        return "text/markdown", summary.summary
    run = selectors.latest_loss_report_run(session=session)
    report = {
        "sessionId": str(session.pk),
        "compactionId": str(run.pk),
        "strategy": run.strategy,
        "trigger": run.trigger,
        "finishedAt": run.finished_at.isoformat() if run.finished_at else None,
        **(run.loss_report or {}),
    }
    return "application/json", _text(report)


def _resources(user: Any) -> list[types.Resource]:
    out: list[types.Resource] = []
    for session in selectors.recent_sessions(user=user, limit=RESOURCES_LISTED):
        label = session.title or str(session.pk)
        out.append(
            types.Resource(
                uri=SUMMARY_URI.format(session=session.pk),
                name=f"{label} — running summary",
                description="The summary compaction keeps of what it folded; each line cites "
                "the seqs it came from.",
                mime_type="text/markdown",
            )
        )
        out.append(
            types.Resource(
                uri=LOSS_REPORT_URI.format(session=session.pk),
                name=f"{label} — loss report",
                description="What the latest compaction dropped: the evidence in the folded "
                "events and which of it the context still holds.",
                mime_type="application/json",
            )
        )
    return out


def build_server(*, stdio_user: AbstractBaseUser | None = None) -> Server[Any]:
    """The ledger's MCP server. Over stdio every call is `stdio_user`'s."""

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[_tool(spec) for spec in TOOLS])

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        spec = TOOLS_BY_NAME.get(params.name)
        if spec is None:
            raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown tool: {params.name}")
        user = _caller(ctx, stdio_user)
        arguments: Mapping[str, Any] = params.arguments or {}
        outcome = await workers.run(_guarded, spec.handler, user, arguments)
        if isinstance(outcome, Failed):
            error = {**outcome.body, "status": outcome.status}
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=_text(error))],
                structured_content=error,
                is_error=True,
            )
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=_text(outcome))],
            structured_content=outcome,
        )

    async def list_resources(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        user = _caller(ctx, stdio_user)
        return types.ListResourcesResult(resources=await workers.run(_resources, user))

    async def list_resource_templates(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(
            resource_templates=[
                types.ResourceTemplate(
                    uri_template=SUMMARY_URI,
                    name="Running summary",
                    description="A session's running summary (session: its id or client key).",
                    mime_type="text/markdown",
                ),
                types.ResourceTemplate(
                    uri_template=LOSS_REPORT_URI,
                    name="Loss report",
                    description="What a session's latest compaction dropped.",
                    mime_type="application/json",
                ),
            ]
        )

    async def read_resource(
        ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        uri = str(params.uri)
        if _RESOURCE_URI.fullmatch(uri) is None:
            raise MCPError(
                code=types.INVALID_PARAMS,
                message=f"Unknown resource: {uri}",
                data={"uri": uri},
            )
        user = _caller(ctx, stdio_user)
        outcome = await workers.run(_guarded, _read_resource, user, uri)
        if isinstance(outcome, Failed):
            code = types.INTERNAL_ERROR if outcome.status >= 500 else types.INVALID_PARAMS
            raise MCPError(
                code=code,
                message=str(outcome.body.get("detail", "")),
                data={**outcome.body, "status": outcome.status, "uri": uri},
            )
        mime_type, text = outcome
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, text=text, mime_type=mime_type)]
        )

    return Server(
        NAME,
        version=VERSION,
        title="Context Ledger",
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_resource_templates,
        on_read_resource=read_resource,
    )
