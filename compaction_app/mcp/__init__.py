"""The MCP server: the ledger's tools and resources for any agent that speaks the Model
Context Protocol (Streamable HTTP at /mcp, stdio through `manage.py mcp`).

- `tools.py`: the tools' names, descriptions and JSON schemas, and their sync handlers, each
  thin like a view: validate the arguments, call the services and selectors REST uses,
  serialise for a context window.
- `selectors.py`: which session a call names (id, gateway client key, or the caller's most
  recently active one).
- `server.py`: the SDK's low-level server wired to those handlers, with REST's error format.
- `asgi.py`: /mcp on the site's ASGI app: token auth (401 before the body is read), then the
  SDK's stateless Streamable HTTP transport.
"""
