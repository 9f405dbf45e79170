"""Upstream MCP servers: the gateway in front of any MCP server's tools (docs/upstream.md).

    pins.py       each tool's definition, pinned at first sight; drift blocks it until accepted
    transport.py  the connections' byte streams: a sandboxed stdio server, a capped HTTP client
    hub.py        the connections (one per upstream, on their own event loop), their listings
    results.py    what reaches the audit log and the agent of a result: redacted, capped, flagged
    replay.py     upstream decisions decided again under a draft (`gateway audit replay`)

Deciding a call (the rules naming the tool, their argument conditions: pure) is one of the
gate's stages, gateway/stages/upstream_rules.py, which the policy's self-tests use too. The gate
never imports this package: calls reach it as the `upstream` tool family (gateway/tools/upstream.py),
like every other family.
"""
