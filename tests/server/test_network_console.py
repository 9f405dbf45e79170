"""A host under the network policy's `ask`, answered in the web console of a real `gateway serve`:
the agent's command (over MCP) holds its connection until a supervisor approves it there."""

from __future__ import annotations

import copy
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml

from gateway.sandbox.identity import hand_over
from tests.server.conftest import POLICY, HttpGateway, audit_records, envelope_of, gateway_cmd
from tests.server.test_supervisor_side import ask_in_background, wait_for

CLIENT = """\
import sys, urllib.request
print("status", urllib.request.urlopen(sys.argv[1], timeout=60).status)
"""


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def site() -> Iterator[int]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1]
    httpd.shutdown()


def test_an_asked_host_is_answered_in_the_console_and_the_held_connection_goes_on(
    tmp_path: Path, ws: Path, site: int
) -> None:
    policy = copy.deepcopy(POLICY)
    policy["rules"].append({
        "id": "fetch-script", "decision": "allow", "justification": "the test's fetcher",
        "programs": ["python3"], "args": ["fetch\\.py", "http://.*"], "examples": {"match": ["python3 fetch.py http://x"]},
    })  # fmt: skip
    policy["sandbox"] = {"network": {"ask": [f"localhost:{site}"], "allow": ["127.0.0.1"]}}
    d = tmp_path / "policies"
    d.mkdir()
    (d / "p.yaml").write_text(yaml.safe_dump(policy, sort_keys=False))
    (ws / "fetch.py").write_text(CLIENT)
    hand_over(ws)
    server = HttpGateway(tmp_path, d / "p.yaml", ws, extra=("--pending-after", "600"))
    try:
        base = server.url.removesuffix("/mcp")
        secret = gateway_cmd("token", "create", "--supervisor", "alice", "--tokens", str(server.tokens))
        bearer = {"Authorization": f"Bearer {secret.stdout.strip().splitlines()[-1]}"}
        got = ask_in_background(
            server, server.token("agent"), ("run", {"command": f"python3 fetch.py http://localhost.:{site}/"})
        )

        def waiting() -> list[dict[str, Any]]:
            rows = httpx2.get(base + "/console/api/approvals", headers=bearer, timeout=30).json()["approvals"]
            return [r for r in rows if r["tool"] == "network"]

        (row,) = wait_for("the network question in the console", waiting, agent=got)
        assert row["command"] == f"connect localhost:{site}"
        assert "fetch.py" in str(row)  # the command that wants the host is shown
        answered = httpx2.post(f"{base}/console/api/approvals/{row['call_id']}/approve", json={}, headers=bearer,
                               timeout=30)  # fmt: skip
        assert answered.status_code == 200, answered.text
        result = envelope_of(wait_for("the agent's answer", lambda: got)[0][-1])
        assert result["status"] == "ok" and "status 200" in result["stdout"], result
        approvals = [r for r in audit_records(server.audit) if r["event"] == "approval" and r["tool"] == "network"]
        assert approvals and approvals[0]["data"]["by"] == "alice" and approvals[0]["decision"] == "allow"
        assert approvals[0]["parent"] == result["call_id"]  # under the call that asked
    finally:
        server.stop()
