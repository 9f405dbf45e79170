"""A fleet on one PostgreSQL: several real `gateway serve --http --store` processes, agents
calling each through the MCP SDK's client, one ledger checked with `audit verify --store`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx2
import psycopg
import pytest

from tests.conftest import eventually
from tests.server.conftest import HttpGateway, envelope_of, policy_file, ws
from tests.server.test_transports import call_http
from tests.store.test_ledger import gateway

__all__ = ["policy_file", "ws"]
FLEET = 3


@pytest.fixture
def fleet(tmp_path: Path, policy_file: Path, ws: Path, dsn: str) -> Iterator[list[HttpGateway]]:
    servers: list[HttpGateway] = []
    try:
        for i in range(FLEET):
            home = tmp_path / f"gw{i}"
            home.mkdir()
            keys = tmp_path / "keys"  # one host: one key
            servers.append(HttpGateway(home, policy_file, ws, extra=("--store", dsn, "--audit-keys", str(keys))))
        yield servers
    finally:
        for s in servers:
            s.stop()


def fleet_token(dsn: str, policy_file: Path, *extra: str) -> tuple[str, str]:
    """An agent's token made in the store (`gateway token create --store`): (token, its id)."""
    made = gateway("token", "create", "--store", dsn, "--principal", "agent", "--policy", str(policy_file), *extra)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip().splitlines()[-1], made.stderr.split("agent token ")[1].split()[0]


def test_every_gateway_of_the_fleet_records_in_one_ledger(
    fleet: list[HttpGateway], dsn: str, tmp_path: Path, policy_file: Path
) -> None:
    token, _ = fleet_token(dsn, policy_file)
    for i, server in enumerate(fleet):
        (result,) = asyncio.run(call_http(server.url, token, "auto", ("run", {"command": f"echo from {i}"})))
        assert envelope_of(result)["stdout"] == f"from {i}\n"
    with psycopg.connect(dsn) as conn:
        got = conn.execute("SELECT s.stream, r.body FROM agw.record r JOIN agw.stream s USING (stream) "
                           "WHERE r.body::jsonb ->> 'event' = 'decision' ORDER BY s.n").fetchall()  # fmt: skip
        streams = conn.execute("SELECT count(*) FROM agw.stream").fetchone()
    assert streams == (FLEET,)
    assert [json.loads(b)["arguments"]["command"] for _, b in got] == [f"echo from {i}" for i in range(FLEET)]
    assert len({s for s, _ in got}) == FLEET  # one stream each
    for server in fleet:
        assert not any(server.audit.glob("audit-*.jsonl"))  # nothing in the local files
    checked = gateway("audit", "verify", "--store", dsn, "--key", str(tmp_path / "keys" / "signing.pub"))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def status(url: str, token: str) -> int:
    """The HTTP status of an MCP `initialize` with this bearer token (401: not honoured)."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18",
            "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}  # fmt: skip
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
    return int(httpx2.post(url, json=body, headers=headers, timeout=60).status_code)


def test_a_token_revoked_on_one_gateway_is_refused_on_every_one(
    fleet: list[HttpGateway], dsn: str, policy_file: Path
) -> None:
    token, token_id = fleet_token(dsn, policy_file)
    for server in fleet:  # made once, honoured everywhere (not from any tokens file)
        assert not server.tokens.exists()
        (result,) = asyncio.run(call_http(server.url, token, "auto", ("run", {"command": "echo fleet"})))
        assert envelope_of(result)["stdout"] == "fleet\n"
    elsewhere, _ = fleet_token(dsn, policy_file, "--host", "some-other-host")
    assert status(fleet[0].url, elsewhere) == 401  # limited to another host
    gone = gateway("token", "revoke", token_id, "--store", dsn)
    assert gone.returncode == 0 and "on every gateway" in gone.stdout
    for server in fleet:  # refused everywhere within the cache's refresh (1 s; bounded here generously)
        assert eventually(lambda s=server: status(s.url, token) == 401, seconds=60)
    listed = gateway("token", "list", "--store", dsn)
    assert f"{token_id}  agent" in listed.stdout and "revoked" in listed.stdout
