"""A fleet on one PostgreSQL: several real `gateway serve --http --store` processes, agents
calling each through the MCP SDK's client, one ledger checked with `audit verify --store`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

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


def test_every_gateway_of_the_fleet_records_in_one_ledger(fleet: list[HttpGateway], dsn: str, tmp_path: Path) -> None:
    for i, server in enumerate(fleet):
        token = server.token("agent")
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
