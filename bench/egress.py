"""Benchmark the network as a policy (run by hand: `.venv/bin/python bench/egress.py`).

In one run, side by side, the same Python client against a real HTTP server on this host's
loopback: run on the host (direct), and run in a sandbox whose policy allows the server by
name, every connection going through the gateway's resolver and proxy (decided, checked,
recorded durably, relayed). Two measures, each the client's own clock (the sandbox's start is
not counted): a 20 MB download (median of ROUNDS), and the set-up of a connection (connect, one
small request, its first byte), median over CONNECTIONS. The ratios go to docs/performance.md.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import gateway.tools  # noqa: F401  (the tool families register with the gate, as in every face)
from gateway.audit import AuditLog
from gateway.calls import RunCall
from gateway.pipeline import Gateway
from gateway.policy.compile import compile_policy
from gateway.policy.schema import Policy
from gateway.sandbox.identity import hand_over

SIZE = 20 << 20
ROUNDS = 15
CONNECTIONS = 200
BODY = b"x" * SIZE

CLIENT = """\
import json, socket, sys, time
host, port, rounds, connections = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def fetch(path):
    s = socket.create_connection((host, port))
    s.sendall(f"GET {path} HTTP/1.1\\r\\nHost: {host.rstrip('.')}:{port}\\r\\nConnection: close\\r\\n\\r\\n".encode())
    first = s.recv(65536)
    got = len(first)
    t = time.perf_counter()
    while True:
        chunk = s.recv(1 << 20)
        if not chunk:
            break
        got += len(chunk)
    s.close()
    return got, t
downloads = []
for _ in range(rounds):
    t0 = time.perf_counter()
    got, _ = fetch("/big")
    downloads.append(time.perf_counter() - t0)
    assert got > 20 << 20, got
setups = []
for _ in range(connections):
    t0 = time.perf_counter()
    s = socket.create_connection((host, port))
    s.sendall(f"GET /small HTTP/1.1\\r\\nHost: {host.rstrip('.')}:{port}\\r\\nConnection: close\\r\\n\\r\\n".encode())
    s.recv(1)
    setups.append(time.perf_counter() - t0)
    s.close()
print(json.dumps({"downloads": downloads, "setups": setups}))
"""


class _Server(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        body = BODY if self.path == "/big" else b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def handle(self) -> None:
        with contextlib.suppress(ConnectionError):  # a set-up probe closes after the first byte
            super().handle()


def main() -> None:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = httpd.server_address[1]
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp).chmod(0o755)  # the sandbox's account walks to its workspace
        ws = Path(tmp) / "ws"
        ws.mkdir()
        (ws / "client.py").write_text(CLIENT)
        hand_over(ws)
        policy = Policy.model_validate({
            "version": 1,
            "principals": {"agent": {"roles": ["dev"]}},
            "roles": {"dev": {"level": 1, "read_roots": ["."], "write_roots": ["."],
                              "limits": {"timeout_ms": 600000, "output_bytes": 1 << 20}}},
            "tools": {"run": {"allow_from": 1}},
            "rules": [{"id": "a", "decision": "allow", "justification": "j", "programs": ["python3"],
                       "accept_unknown": True, "examples": {"match": ["python3 client.py"]}}],
            "sandbox": {"network": {"allow": [f"localhost:{port}", "127.0.0.1"], "max_bytes": 1 << 40}},
        })  # fmt: skip
        gw = Gateway(compile_policy(policy, Path(tmp) / "p.yaml", ws), AuditLog(Path(tmp) / "audit"))
        args = [str(ROUNDS), str(CONNECTIONS)]
        host = subprocess.run(
            [sys.executable, str(ws / "client.py"), "127.0.0.1", str(port), *args],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        out = gw.handle(RunCall(principal="agent", command=f"python3 client.py localhost. {port} {' '.join(args)}"))
        gw.close()
        if out.get("status") != "ok" or out.get("exit_code") != 0:
            raise SystemExit(f"the sandboxed client failed: {out}")
    direct, proxied = json.loads(host.stdout), json.loads(out["stdout"])
    d_dl, p_dl = statistics.median(direct["downloads"]), statistics.median(proxied["downloads"])
    d_set, p_set = statistics.median(direct["setups"]), statistics.median(proxied["setups"])
    print(f"20 MB download, median of {ROUNDS}: direct {d_dl * 1000:.1f} ms ({SIZE / d_dl / 1e6:.0f} MB/s), "
          f"through the proxy {p_dl * 1000:.1f} ms ({SIZE / p_dl / 1e6:.0f} MB/s): {p_dl / d_dl:.2f}x")  # fmt: skip
    print(f"connection set-up to first byte, median of {CONNECTIONS}: direct {d_set * 1000:.2f} ms, through the "
          f"proxy {p_set * 1000:.2f} ms: +{(p_set - d_set) * 1000:.2f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
