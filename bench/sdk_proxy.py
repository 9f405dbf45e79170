"""The least an MCP server in front of an MCP server can cost: a bare proxy made of the official
SDK alone, for bench/upstream.py's `bare SDK proxy` row (run by it, not by hand).

    python bench/sdk_proxy.py UPSTREAM_SCRIPT [--site DIR]

It serves `echo` and `slow` over streamable HTTP on 127.0.0.1 (a free port, printed as
`listening on PORT`), and answers each call by calling the same tool of one upstream, the
script given, which it runs over stdio (as the gateway runs its upstream by default) through one
SDK `Client`. Nothing else: no token, no rule, no record, no sandbox, no checks on the result.
What the gateway adds above this row is its own work; what this row costs above `direct` is
the price of any SDK-built pass-through on the same machine.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import uvicorn
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.server import MCPServer
from mcp.types import TextContent

server = MCPServer("sdk-proxy", log_level="WARNING")
upstream: Client | None = None


async def _forward(tool: str, arguments: dict[str, Any]) -> str:
    assert upstream is not None
    result = await upstream.call_tool(tool, arguments)
    if result.is_error:
        raise RuntimeError(str(result.content)[:300])
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


@server.tool()
async def echo(text: str) -> str:
    """The upstream's `echo`."""
    return await _forward("echo", {"text": text})


@server.tool()
async def slow(seconds: float) -> str:
    """The upstream's `slow`."""
    return await _forward("slow", {"seconds": seconds})


async def main(script: str, extra: list[str]) -> None:
    global upstream
    params = StdioServerParameters(command=sys.executable, args=[script, "stdio", *extra])
    async with Client(params) as client:
        upstream = client
        app = server.streamable_http_app(host="127.0.0.1")
        http = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
        started = http.startup

        async def startup(sockets: Any = None) -> None:  # the port the kernel chose, once it listens
            await started(sockets)
            print(f"listening on {http.servers[0].sockets[0].getsockname()[1]}", flush=True)

        http.startup = startup  # type: ignore[method-assign]
        await http.serve()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2:]))
