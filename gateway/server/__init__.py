"""`gateway serve`: the MCP server agents connect to.

- `specs.py`: each tool's name, schema (from `gateway/calls.py`), description and hints;
- `app.py`: `GatewayServer`, the MCP tools in front of one `Gateway` (off-loop calls, pending
  approvals, per-principal tool listing, elicitation);
- `approvals.py`: who answers `ask` decisions and `ask_user` questions over MCP;
- `tokens.py`: bearer tokens (hashed at rest) mapping HTTP clients to principals;
- `run.py`: stdio and streamable HTTP, auth, shutdown;
- `front.py`, `limits.py`: the HTTP front (connection caps, deadlines, body cap, aggregated
  auth refusals) and its limits;
- `serve.py`: the `gateway serve` command line.
"""
