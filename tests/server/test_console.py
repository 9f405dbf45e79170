"""The web console's API and its guards, through a real `gateway serve --http` (issue 15): a
supervisor's secret apart from agent tokens, the approvals inbox and its answers, the audit
timeline, browser sessions (cookie flags, CSRF, Origin) and the limits of its event streams.
Each test here failed on the code before the console (its routes did not exist)."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml

from gateway import approval_queue
from gateway.approval import ApprovalRequest
from gateway.audit import AuditLog
from gateway.server.console import cards
from gateway.server.console.auditview import VerifyStatus
from tests.server.conftest import HttpGateway, audit_records, envelope_of, gateway_cmd
from tests.server.test_supervisor_side import PADDED, approvals, ask_in_background, wait_for
from tests.server.test_transports import call_http

ROUTES = [
    ("GET", "/console/"),
    ("GET", "/console/login"),
    ("POST", "/console/login"),
    ("POST", "/console/logout"),
    ("GET", "/console/static/console.js"),
    ("GET", "/console/api/session"),
    ("GET", "/console/api/approvals"),
    ("POST", "/console/api/approvals/abc/approve"),
    ("POST", "/console/api/approvals/abc/deny"),
    ("GET", "/console/api/audit"),
    ("GET", "/console/api/audit/abc"),
    ("GET", "/console/api/calls"),
    ("GET", "/console/api/overview"),
    ("GET", "/console/api/verify"),
    ("GET", "/console/api/events"),
    ("POST", "/console/api/replay"),
    ("GET", "/console/api/nothing-here"),
]


class Console:
    """A served gateway with an agent token and a supervisor's secret."""

    def __init__(self, server: HttpGateway) -> None:
        self.server = server
        self.base = server.url.removesuffix("/mcp")
        self.origin = self.base
        self.agent = server.token("agent")
        out = gateway_cmd("token", "create", "--supervisor", "alice", "--tokens", str(server.tokens))
        self.secret = out.stdout.strip().splitlines()[-1]
        self.bearer = {"Authorization": f"Bearer {self.secret}"}

    def get(self, path: str, **kw: Any) -> httpx2.Response:
        return httpx2.get(self.base + path, headers=kw.pop("headers", self.bearer), timeout=30, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> httpx2.Response:
        return httpx2.post(self.base + path, json=body, headers=kw.pop("headers", self.bearer), timeout=30, **kw)


@pytest.fixture
def console(tmp_path: Path, policy_file: Path, ws: Path) -> Iterator[Console]:
    server = HttpGateway(tmp_path, policy_file, ws, extra=("--pending-after", "600", "--max-connections", "16",
                                                           "--max-connections-per-peer", "8"))  # fmt: skip
    try:
        yield Console(server)
    finally:
        server.stop()


def pending_one(c: Console, agent: list[Any]) -> dict[str, Any]:
    (row,) = wait_for("a pending request", lambda: c.get("/console/api/approvals").json()["approvals"], agent=agent)
    found: dict[str, Any] = row
    return found


# --- credentials ---------------------------------------------------------------------------------
def test_an_agent_token_is_refused_on_every_console_route(console: Console) -> None:
    for method, path in ROUTES:
        r = httpx2.request(method, console.base + path, headers={"Authorization": f"Bearer {console.agent}"},
                           timeout=30)  # fmt: skip
        assert r.status_code == 403, (method, path, r.status_code, r.text)
    # and nothing answers a request without any credential but the page itself
    for method, path in ROUTES:
        if path.startswith("/console/api/"):
            assert httpx2.request(method, console.base + path, timeout=30).status_code == 401, path


def test_a_supervisor_secret_never_authenticates_mcp(console: Console) -> None:
    assert console.secret.startswith("agws_")
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Authorization": f"Bearer {console.secret}", "Accept": "application/json, text/event-stream"}
    assert httpx2.post(console.server.url, json=body, headers=headers, timeout=30).status_code == 401
    with pytest.raises(Exception) as refused:  # the official client gets nowhere with it either
        asyncio.run(call_http(console.server.url, console.secret, "auto", ("run", {"command": "echo hi"})))
    assert not isinstance(refused.value, AssertionError)
    # the agent's own token still works, and the list tells the kinds apart
    (result,) = asyncio.run(call_http(console.server.url, console.agent, "auto", ("run", {"command": "echo hi"})))
    assert envelope_of(result)["stdout"] == "hi\n"
    listed = gateway_cmd("token", "list", "--tokens", str(console.server.tokens)).stdout
    kinds = {line.split()[1] for line in listed.splitlines()}
    assert kinds == {"agent", "supervisor"}, listed
    assert console.secret not in console.server.tokens.read_text()


def test_a_foreign_host_is_refused(console: Console) -> None:
    r = console.get("/console/api/approvals", headers={**console.bearer, "Host": "evil.example"})
    assert r.status_code == 421, r.text


# --- the inbox and its answers -------------------------------------------------------------------
def test_the_inbox_shows_the_whole_call_and_a_denial_reason_reaches_agent_and_audit(console: Console) -> None:
    command = PADDED + "\n\trm -f b.txt"
    env_call = ("env", {"action": "set", "name": "APP_STORED", "value": "from-store"})
    got = ask_in_background(console.server, console.agent, env_call,
                            ("run", {"command": command}))  # fmt: skip
    row = pending_one(console, got)
    assert row["command"] == PADDED + "\\n\\trm -f b.txt"  # escaped, never cut
    assert row["command_chars"] == len(command)
    assert row["principal"] == "agent" and row["tool"] == "run" and row["cwd"].endswith("/ws")
    env = {e["name"]: (e["value"], e["from"]) for e in row["env"]}
    assert env == {"APP_STORED": ("from-store", "stored")}, row["env"]  # the inherited store, too
    assert {"rule": "rm-by-supervisor", "justification": "deleting needs a supervisor"} in row["asking"]
    assert 0 < row["seconds_left"] <= 120
    # the server's terminal names the console with the waiting call
    link = f"or in the console: {console.base}/console/"
    wait_for("the announcement", lambda: link in console.server.stderr.read_text())
    why = "not today <b>really</b>"
    answered = console.post(f"/console/api/approvals/{row['call_id']}/deny", {"reason": why})
    assert answered.status_code == 200, answered.text
    result = wait_for("the agent's answer", lambda: got)[0][-1]
    error = envelope_of(result)["error"]
    assert error["code"] == "APPROVAL_DENIED" and why in error["message"], error
    records = audit_records(console.server.audit)
    approval = next(r for r in records if r["event"] == "approval")
    assert approval["data"]["by"] == "alice" and approval["data"]["reason"] == why
    said = next(r for r in records if r["event"] == "supervisor_answer")
    assert said["data"]["supervisor"] == "alice" and said["data"]["via"] == "bearer"
    assert said["call_id"] == row["call_id"]
    # the call's page has it all together
    page = console.get(f"/console/api/audit/{row['call_id']}").json()
    assert page["decision"]["decision"] == "ask" and page["records"][0]["event"] == "decision"
    assert [a["event"] for a in page["approvals"]] == ["supervisor_answer", "approval"]


def test_approve_for_the_session_runs_the_same_call_again_without_asking(console: Console, ws: Path) -> None:
    (ws / "a").write_text("x")
    rm = ("run", {"command": "rm -f a"})
    got = ask_in_background(console.server, console.agent, rm, rm, era="legacy")  # one MCP session
    row = pending_one(console, got)
    r = console.post(f"/console/api/approvals/{row['call_id']}/approve", {"scope": "session"})
    assert r.status_code == 200 and r.json()["scope"] == "session", r.text
    first, again = wait_for("the agent's answers", lambda: got)[0]
    assert envelope_of(first)["status"] == "ok" and envelope_of(again)["status"] == "ok"
    # another connection is another session (issue 23): the supervisor is asked again
    other = ask_in_background(console.server, console.agent, rm, era="legacy")
    row = pending_one(console, other)
    assert console.post(f"/console/api/approvals/{row['call_id']}/deny", {}).status_code == 200
    assert envelope_of(wait_for("the answer", lambda: other)[0][0])["error"]["code"] == "APPROVAL_DENIED"
    hows = [
        (r["data"]["how"], r["data"]["by"]) for r in audit_records(console.server.audit) if r["event"] == "approval"
    ]
    # red team (issue 15): the repeat was recorded `by: session`, the supervisor who allowed it unnamed
    assert hows == [("queue-session", "alice"), ("session", "alice"), ("queue", "alice")], hows
    # a denial has no session scope, and an id that is not pending is not a path
    assert console.post("/console/api/approvals/x/deny", {"scope": "session"}).status_code == 400
    assert console.post("/console/api/approvals/..%2F..%2Fetc/approve", {}).status_code == 404


def test_the_audit_timeline_filters(console: Console) -> None:
    asyncio.run(call_http(console.server.url, console.agent, "auto", ("run", {"command": "echo one"}),
                          ("run", {"command": "curl x"})))  # fmt: skip
    denied = console.get("/console/api/audit", params={"decision": "deny", "principal": "agent"}).json()
    assert [i["record"]["rule"] for i in denied["items"]] == ["no-curl"], denied
    assert "curl x" in denied["items"][0]["summary"]
    text = console.get("/console/api/audit", params={"text": "ECHO ONE", "event": "decision"}).json()
    assert [i["record"]["arguments"]["command"] for i in text["items"]] == ["echo one"]
    assert console.get("/console/api/audit", params={"since": "2999-01-01"}).json()["items"] == []
    assert console.get("/console/api/audit", params={"until": "2000-01-01"}).json()["items"] == []
    # the times `gateway audit` takes (`since=yesterday` found nothing: compared as text)
    recent = console.get("/console/api/audit", params={"since": "yesterday", "event": "decision"}).json()
    assert len(recent["items"]) == 2, recent
    assert console.get("/console/api/audit", params={"until": "1h"}).json()["items"] == []
    soon = console.get("/console/api/audit", params={"since": "soon"})
    assert soon.status_code == 400 and "--since 'soon'" in soon.json()["error"]
    bad = console.get("/console/api/audit", params={"colour": "red"})
    assert bad.status_code == 400 and "colour" in bad.json()["error"]


def test_verify_status_is_shown_and_one_check_serves_every_request(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit")
    log.append("something", data={"n": 1})
    status = VerifyStatus(tmp_path / "audit", lambda: None, None, refresh_s=3600)
    for _ in range(50):
        status.get()
    result = wait_for("a verify result", lambda: status.get()["state"] != "checking" and status.get())
    assert result["state"] == "ok" and result["records"] == 1
    assert status.runs == 1


# --- browser sessions ----------------------------------------------------------------------------
def login(c: Console, secret: str, origin: str | None) -> httpx2.Response:
    headers = {"Origin": origin} if origin else {}
    return httpx2.post(c.base + "/console/login", data={"secret": secret}, headers=headers, timeout=30)


def signed_in(c: Console) -> tuple[dict[str, str], dict[str, str]]:
    """A browser session: its cookie, and its key as the page sends it (from the redirect's fragment)."""
    r = login(c, c.secret, c.origin)
    assert r.status_code == 303 and "#key=" in r.headers["location"], r.headers
    return {"agw_console": r.cookies["agw_console"]}, {"X-CSRF-Token": r.headers["location"].split("#key=", 1)[1]}


def test_the_session_cookie_alone_opens_nothing(console: Console) -> None:
    """Red team (issue 15): a browser sends the console's cookie to every port of the host
    (cookies are not kept apart by port, SameSite counts the host only): a page the supervisor
    opens on any other server on 127.0.0.1 (another user's, or an agent's with the network
    allowed) got it, and with it read the CSRF token from /console/api/session, the audit, and
    answered approvals. The key the page holds is now needed for every request."""
    r = login(console, console.secret, console.origin)
    jar = {"agw_console": r.cookies["agw_console"]}  # what a server on another port receives
    for path in ("/console/api/session", "/console/api/approvals", "/console/api/audit", "/console/api/verify"):
        stolen = httpx2.get(console.base + path, cookies=jar, timeout=30)
        assert stolen.status_code == 401 and "csrf" not in stolen.text.lower().replace("x-csrf-token", ""), stolen.text
    key = {"X-CSRF-Token": r.headers["location"].split("#key=", 1)[1]}  # what this origin's page reads
    for path in ("/console/api/session", "/console/api/approvals", "/console/api/audit", "/console/api/verify"):
        wrong = httpx2.get(console.base + path, cookies=jar, headers={"X-CSRF-Token": "guess"}, timeout=30)
        assert wrong.status_code == 403, wrong.text
        assert httpx2.get(console.base + path, cookies=jar, headers=key, timeout=30).status_code == 200
    with httpx2.stream("GET", console.base + "/console/api/events", cookies=jar, timeout=30) as events:
        assert events.status_code == 401 and b"event:" not in events.read()
    with httpx2.stream("GET", console.base + "/console/api/events", params={"csrf": key["X-CSRF-Token"]},
                       cookies=jar, timeout=30) as events:  # fmt: skip
        assert events.status_code == 200


def test_a_session_cookie_is_httponly_strict_and_needs_csrf_and_origin_to_change_anything(console: Console) -> None:
    assert login(console, console.secret, "http://evil.example").status_code == 403
    assert login(console, console.secret, None).status_code == 403
    assert login(console, console.agent, console.origin).status_code == 401
    r = login(console, console.secret, console.origin)
    assert r.status_code == 303, r.text
    cookie = r.headers["set-cookie"]
    flags = {part.strip().lower() for part in cookie.split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/console"} <= flags, cookie
    assert "secure" not in flags  # plain HTTP on loopback; Secure when served over TLS
    jar = {"agw_console": r.cookies["agw_console"]}
    key = r.headers["location"].split("#key=", 1)[1]
    session = httpx2.get(console.base + "/console/api/session", cookies=jar, headers={"X-CSRF-Token": key},
                         timeout=30).json()  # fmt: skip
    assert session["supervisor"] == "alice" and session["csrf"] == key
    path = "/console/api/approvals/nope/deny"
    good = {"Origin": console.origin, "X-CSRF-Token": session["csrf"]}
    for headers in ({"Origin": console.origin}, {**good, "X-CSRF-Token": "guess"}, {**good, "Origin": "http://evil.example"},
                    {"X-CSRF-Token": session["csrf"]}):  # fmt: skip
        refused = httpx2.post(console.base + path, json={}, headers=headers, cookies=jar, timeout=30)
        assert refused.status_code in (401, 403), (headers, refused.text)
    assert httpx2.post(console.base + path, json={}, headers=good, cookies=jar, timeout=30).status_code == 404
    # the page's script and style come from here, under a CSP without inline script
    page = httpx2.get(console.base + "/console/", timeout=30)
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "default-src 'none'" in csp
    assert b'<script src="/console/static/console.js"' in page.content
    # logout ends it
    out = httpx2.post(console.base + "/console/logout", headers=good, cookies=jar, timeout=30)
    assert out.status_code == 303
    assert httpx2.get(console.base + "/console/api/session", cookies=jar, headers=good, timeout=30).status_code == 401


def test_a_revoked_secret_ends_its_sessions(console: Console) -> None:
    jar, key = signed_in(console)
    assert httpx2.get(console.base + "/console/api/approvals", cookies=jar, headers=key, timeout=30).status_code == 200
    listed = gateway_cmd("token", "list", "--tokens", str(console.server.tokens)).stdout
    sid = next(line.split()[0] for line in listed.splitlines() if "supervisor" in line)
    gateway_cmd("token", "revoke", sid, "--tokens", str(console.server.tokens))
    assert httpx2.get(console.base + "/console/api/approvals", cookies=jar, headers=key, timeout=30).status_code == 401
    assert console.get("/console/api/approvals").status_code == 401


@pytest.mark.parametrize("how", ["revoke", "logout"])
def test_an_open_event_stream_ends_with_its_session(console: Console, how: str) -> None:
    """Red team (issue 15): a stream opened before the secret was revoked (or the session signed
    out) went on telling each call that waits and each answer."""
    jar, key = signed_in(console)
    csrf = key["X-CSRF-Token"]
    seen: list[dict[str, Any]] = []
    hello, ended = threading.Event(), threading.Event()

    def listen() -> None:
        with httpx2.stream("GET", console.base + "/console/api/events", params={"csrf": csrf}, cookies=jar,
                           timeout=60) as s:  # fmt: skip
            for line in s.iter_lines():
                if line.startswith("data:"):
                    seen.append(json.loads(line[5:]))
                    hello.set()
        ended.set()

    threading.Thread(target=listen, daemon=True).start()
    assert hello.wait(30)
    if how == "revoke":
        listed = gateway_cmd("token", "list", "--tokens", str(console.server.tokens)).stdout
        sid = next(line.split()[0] for line in listed.splitlines() if "supervisor" in line)
        gateway_cmd("token", "revoke", sid, "--tokens", str(console.server.tokens))
        other = gateway_cmd("token", "create", "--supervisor", "bob", "--tokens", str(console.server.tokens))
        bearer = {"Authorization": f"Bearer {other.stdout.strip().splitlines()[-1]}"}
    else:
        out = httpx2.post(console.base + "/console/logout", headers={"Origin": console.origin, "X-CSRF-Token": csrf},
                          cookies=jar, timeout=30)  # fmt: skip
        assert out.status_code == 303
        bearer = console.bearer
    got = ask_in_background(console.server, console.agent, ("run", {"command": "rm -f nothing"}))
    listed = lambda: console.get("/console/api/approvals", headers=bearer).json()["approvals"]  # noqa: E731
    row = wait_for("a pending request", listed, agent=got)
    assert ended.wait(30), seen  # the first event after it ends the stream, untold
    assert [e["kind"] for e in seen] == ["hello"], seen
    console.post(f"/console/api/approvals/{row[0]['call_id']}/deny", {"reason": "x"}, headers=bearer)
    wait_for("the agent's answer", lambda: got)


# --- events --------------------------------------------------------------------------------------
def test_events_tell_added_and_answered_and_never_an_unauthenticated_client(console: Console) -> None:
    with httpx2.stream("GET", console.base + "/console/api/events", timeout=30) as anon:
        assert anon.status_code == 401
        assert b"event:" not in anon.read()
    kinds: list[dict[str, Any]] = []
    ready = threading.Event()

    def listen() -> None:
        with httpx2.stream("GET", console.base + "/console/api/events", headers=console.bearer, timeout=60) as s:
            for line in s.iter_lines():
                if line.startswith("data:"):
                    kinds.append(json.loads(line[5:]))
                    ready.set()
                    if kinds[-1]["kind"] == "answered":
                        return

    threading.Thread(target=listen, daemon=True).start()
    assert ready.wait(30)
    got = ask_in_background(console.server, console.agent, ("run", {"command": "rm -f nothing"}))
    row = pending_one(console, got)
    wait_for("the added event", lambda: any(k["kind"] == "added" for k in kinds))
    console.post(f"/console/api/approvals/{row['call_id']}/approve", {})
    wait_for("the answered event", lambda: any(k["kind"] == "answered" for k in kinds))
    assert [k["kind"] for k in kinds][:3] == ["hello", "added", "answered"], kinds
    assert all(k.get("call_id") in (None, row["call_id"]) for k in kinds)


def test_a_flood_of_event_streams_is_capped_and_mcp_still_answers(console: Console) -> None:
    # the server runs with 16 connections, 8 per peer: at most 4 streams, the rest 503
    streams = []
    statuses = []
    try:
        for _ in range(10):
            client = httpx2.Client(headers=console.bearer, timeout=30)
            s = client.stream("GET", console.base + "/console/api/events")
            response = s.__enter__()
            statuses.append(response.status_code)
            streams.append((client, s))
        assert statuses.count(200) == 4 and statuses.count(503) == 6, statuses
        (result,) = asyncio.run(call_http(console.server.url, console.agent, "auto", ("run", {"command": "echo ok"})))
        assert envelope_of(result)["stdout"] == "ok\n"
    finally:
        for client, s in streams:
            s.__exit__(None, None, None)
            client.close()


def test_answers_from_the_terminal_reach_the_same_queue(console: Console) -> None:
    """The console and `gateway approvals` answer the same queue: the first answer stands."""
    got = ask_in_background(console.server, console.agent, ("run", {"command": "rm -f t"}))
    row = pending_one(console, got)
    approval_queue.answer(console.server.queue, row["call_id"], False, "bob", "from the terminal")
    second = console.post(f"/console/api/approvals/{row['call_id']}/approve", {})
    assert second.status_code in (404, 409), second.text
    assert envelope_of(wait_for("the agent's answer", lambda: got)[0][0])["error"]["code"] == "APPROVAL_DENIED"


def test_an_approval_shows_the_workspace_files_it_is_bound_to(policy: Any) -> None:
    """Requests that name the files the command runs (`files`: [{path, sha256}], from the
    replay branch's binding) show them; requests without it show none."""
    from gateway.server.console.app import _pending

    base = {"call_id": "c1", "principal": "agent", "tool": "run", "command": "make\tx", "cwd": "/w",
            "rule": "rm-by-supervisor", "asking": ["rm-by-supervisor"], "reason": "r", "expires": 100.0}  # fmt: skip
    shown = _pending({**base, "files": [{"path": "Makefile\n", "sha256": "ab" * 32}]}, policy, 40.0)
    assert shown["files"] == [{"path": "Makefile\\n", "sha256": "ab" * 32, "why": "", "bytes": None}]
    assert shown["command"] == "make\\tx" and shown["seconds_left"] == 60
    assert "files" not in _pending(base, policy, 40.0)


# --- what-if replay --------------------------------------------------------------------------------
def test_replay_reports_exactly_the_calls_a_draft_would_decide_otherwise(console: Console, ws: Path) -> None:
    (ws / "a").write_text("x")
    asyncio.run(call_http(console.server.url, console.agent, "auto", ("run", {"command": "echo one"}),
                          ("run", {"command": "curl x"})))  # fmt: skip
    got = ask_in_background(console.server, console.agent, ("run", {"command": "rm -f a"}))
    row = pending_one(console, got)
    assert console.post(f"/console/api/approvals/{row['call_id']}/deny", {"reason": "no"}).status_code == 200
    wait_for("the agent's answer", lambda: got)
    served = console.server.policy_file.read_text()
    same = console.post("/console/api/replay", {"policy": served})
    assert same.status_code == 200, same.text
    assert same.json()["changed"] == 0 and same.json()["replayed"] == 3, same.json()
    draft = yaml.safe_load(served)
    for rule in draft["rules"]:
        if rule["id"] == "rm-by-supervisor":
            rule["decision"] = "deny"
    (console.server.policy_file.parent / "draft.yaml").write_text(yaml.safe_dump(draft, sort_keys=False))
    report = console.post("/console/api/replay", {"policy_file": "draft.yaml"}).json()
    (group,) = report["groups"]
    assert (group["from"], group["to"], group["count"]) == (
        {"decision": "ask", "rule": "rm-by-supervisor"},
        {"decision": "deny", "rule": "rm-by-supervisor"},
        1,
    ), report
    assert [c["command"] for c in group["calls"]] == ["rm -f a"]
    replays = [r["data"] for r in audit_records(console.server.audit) if r["event"] == "console_replay"]
    assert [(d["supervisor"], d["changed"]) for d in replays] == [("alice", 0), ("alice", 1)]
    # an agent token never replays, and a bad draft is an error naming its line
    assert (
        console.post(
            "/console/api/replay", {"policy": served}, headers={"Authorization": f"Bearer {console.agent}"}
        ).status_code
        == 403
    )
    bad = console.post("/console/api/replay", {"policy": "version: 1\nrules: [\n"})
    assert bad.status_code == 400 and "draft.yaml:3:1" in bad.json()["error"], bad.text


@pytest.mark.parametrize("name", ["../p.yaml", "/etc/shadow", "..", "link.yaml", "sub/p.yaml", "fifo.yaml"])
def test_replay_reads_no_file_of_the_server_but_a_draft_beside_the_policy(console: Console, name: str) -> None:
    folder = console.server.policy_file.parent
    (folder / "link.yaml").symlink_to("/etc/shadow")
    os.mkfifo(folder / "fifo.yaml")
    r = console.post("/console/api/replay", {"policy_file": name})
    assert r.status_code in (400, 404), r.text
    assert "root:" not in r.text


@pytest.mark.parametrize("where", ["/etc/shadow", "tokens", "../../etc/passwd", "beside"])
def test_a_draft_cannot_include_a_file_of_the_server(console: Console, where: str) -> None:
    """Red team (issue 15): `include:` in a draft had the loader read any file as the server and
    quote it in the 400 (/etc/shadow's hashes, the tokens file, the audit signing key...)."""
    folder = console.server.policy_file.parent
    target = {"tokens": str(console.server.tokens), "beside": "base.yaml"}.get(where, where)
    (folder / "base.yaml").write_text("version: 1\nshells: [root:x:SECRET]\n")
    draft = f"version: 1\ninclude: [{json.dumps(target)}]\n"
    for body in ({"policy": draft}, {"policy_file": "draft-inc.yaml"}):
        (folder / "draft-inc.yaml").write_text(draft)
        r = console.post("/console/api/replay", body)
        assert r.status_code == 400, r.text
        assert "include" in r.json()["error"], r.text
        for leak in ("root:", "sha256", "SECRET", "daemon"):
            assert leak not in r.text, r.text


# --- red team (issue 15): what the page shows is what runs -----------------------------------------
RLO = "\u202e"


def test_the_inbox_shows_the_files_a_call_runs_as_approvals_show_does(
    tmp_path: Path, ws: Path, policy_file: Path
) -> None:
    """The inbox listed each file's path and digest only: a supervisor in the browser approved a
    script's content without seeing a line of it, and a file that cannot be bound (a link out of
    the roots: the approval is void) showed as `sha256 None`."""
    spec = yaml.safe_load(policy_file.read_text())
    spec["rules"].append({"id": "scripts-by-supervisor", "decision": "ask", "justification": "a script",
                          "programs": ["bash"], "accept_unknown": True, "accept_unknown_paths": True,
                          "examples": {"match": ["bash x.sh"]}})  # fmt: skip
    policy_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    (ws / "run.sh").write_text(f"echo fine {RLO}txt.exe\nrm -rf \x1b[2Kthe rest\n")
    (ws / "out.sh").symlink_to("/etc/passwd")
    server = HttpGateway(tmp_path, policy_file, ws, extra=("--pending-after", "600"))
    try:
        c = Console(server)
        got = ask_in_background(server, c.agent, ("run", {"command": "bash run.sh && bash out.sh"}))
        row = pending_one(c, got)
        run, out = row["files"]
        assert run["path"] == str(ws / "run.sh") and run["why"] == "bash's script", run
        assert run["bytes"] == len((ws / "run.sh").read_bytes()) and len(run["sha256"]) == 64
        assert run["head"][:2] == ["echo fine \\u{202e}txt.exe", "rm -rf \\u{001b}[2Kthe rest"], run
        assert RLO not in json.dumps(row, ensure_ascii=False) and "\x1b" not in json.dumps(row, ensure_ascii=False)
        assert "leads out of the root" in out["error"] and "head" not in out and "root:" not in json.dumps(out)
        c.post(f"/console/api/approvals/{row['call_id']}/deny", {"reason": "no"})
        wait_for("the agent's answer", lambda: got)
    finally:
        server.stop()


# --- a terminal answer and a console answer race (issue 15's leftover) ---------------------------
def _blocked_on(lock: Path, pid: int) -> bool:
    """Does process `pid` wait for the flock on `lock` (a `->` line of /proc/locks)?"""
    st = os.stat(lock)
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields and str(pid) in fields and fields[-3] == inode:
            return True
    return False


def _answers_agree(records: list[dict[str, Any]], call_id: str) -> None:
    """Every record that says a supervisor answered `call_id` names the answer that took."""
    (took,) = [r for r in records if r["event"] == "approval" and r["call_id"] == call_id]
    for said in (r for r in records if r["event"] == "supervisor_answer" and r["call_id"] == call_id):
        assert said["data"]["supervisor"] == took["data"]["by"], (said, took)
        assert said["data"]["approved"] == (took["decision"] == "allow"), (said, took)


def test_a_console_answer_that_races_a_terminal_answer_is_recorded_truthfully(console: Console, ws: Path) -> None:
    (ws / "a").write_text("x")
    got = ask_in_background(console.server, console.agent, ("run", {"command": "rm -f a"}))
    call_id = pending_one(console, got)["call_id"]
    # hold the audit log's lock: the console's answer stops at its record (the gateway's too)
    lock = console.server.audit / ".lock"
    fd = os.open(lock, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    answered: list[Any] = []
    try:
        post = threading.Thread(
            target=lambda: answered.append(console.post(f"/console/api/approvals/{call_id}/deny", {"reason": "no"})),
            daemon=True,
        )
        post.start()
        wait_for("the console's answer to reach its record", lambda: _blocked_on(lock, console.server.proc.pid))
        # meanwhile a supervisor at a terminal approves the same call
        terminal = approvals(
            console.server, "approve", call_id, "--by", "bob", "--state-dir", str(console.server.queue)
        )
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    post.join(60)
    result = wait_for("the agent's answer", lambda: got)[0][-1]
    records = audit_records(console.server.audit)
    _answers_agree(records, call_id)
    # exactly one of them took, and each was told so
    (status,) = [r.status_code for r in answered]
    if status == 200:  # the console claimed it first: the terminal was refused
        assert terminal.returncode != 0 and "already has an answer" in terminal.stderr, terminal
        assert envelope_of(result)["error"]["code"] == "APPROVAL_DENIED"
    else:
        assert status == 409 and terminal.returncode == 0, (status, terminal)
        assert envelope_of(result)["status"] == "ok"
        refused = [r for r in records if r["event"] == "supervisor_answer_refused"]
        assert [r["data"]["supervisor"] for r in refused] == ["alice"]


def _request(state: Path, call_id: str) -> None:
    req = ApprovalRequest.bind(call_id, "agent", "run", "rm -f a", "/ws", {}, "rm", "why", "sha", ("rm",))
    q = approval_queue.QueueApprover(state, ())
    owner = {"pid": os.getpid(), "start": approval_queue._started(os.getpid())}
    body = {**asdict(req), "created": 0, "expires": 2e10, "owner": owner}
    approval_queue._write_atomically(q.state_dir / f"{call_id}.request.json", body)


def test_only_the_answer_that_wins_the_claim_is_recorded(tmp_path: Path) -> None:
    """Two answers race inside the queue: the second arrives while the first is being recorded.
    The first is recorded and given; the second is refused and its record is never made."""
    state = tmp_path / "approvals"
    _request(state, "c1")
    recorded: list[str] = []
    refused: list[str] = []

    def first_records(answer: dict[str, Any]) -> None:
        recorded.append(answer["by"])
        with pytest.raises(approval_queue.QueueError, match="already has an answer") as lost:
            approval_queue.answer(state, "c1", True, "bob", record=lambda a: recorded.append(a["by"]))
        refused.append(str(lost.value))
        assert not (state / "c1.answer.json").exists()  # not given before it is recorded

    done = approval_queue.answer(state, "c1", False, "alice", "no", record=first_records)
    assert done["by"] == "alice" and recorded == ["alice"] and refused
    assert approval_queue.pending(state) == []  # answered: no longer listed
    # a record that cannot be written gives no answer, and frees the request for another
    _request(state, "c2")

    def fails(answer: dict[str, Any]) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError):
        approval_queue.answer(state, "c2", True, "alice", record=fails)
    assert not (state / "c2.answer.json").exists() and not (state / "c2.claim.json").exists()
    assert approval_queue.answer(state, "c2", True, "bob")["by"] == "bob"


# --- issue 27: calls, stories, cards, the overview -------------------------------------------------
def test_calls_stories_and_the_overview_escape_what_the_agent_wrote(console: Console) -> None:
    """One row per call, its story and the overview's top lists carry the agent's text escaped:
    a right-to-left override or an escape sequence in a command cannot reorder or hide what the
    reviewer reads (the page puts it in as text: no markup either)."""
    tricky = f"curl x{RLO}txt.exe \x1b[2K<img src=x onerror=alert(1)>"
    asyncio.run(call_http(console.server.url, console.agent, "auto", ("run", {"command": "echo one"}),
                          ("run", {"command": tricky})))  # fmt: skip
    rows = console.get("/console/api/calls").json()
    assert rows["matched"] == 2 and [r["decision"] for r in rows["calls"]] == ["deny", "allow"], rows
    denied, allowed = rows["calls"]
    assert denied["command"] == "curl x\\u{202e}txt.exe \\u{001b}[2K<img src=x onerror=alert(1)>", denied["command"]
    assert (denied["outcome"], denied["error"]) == ("denied", "POLICY_DENIED"), denied
    assert (allowed["outcome"], allowed["exit_code"], allowed["bytes"]) == ("ok", 0, 4), allowed
    assert RLO not in json.dumps(rows, ensure_ascii=False)
    page = console.get(f"/console/api/audit/{denied['call_id']}").json()
    assert [s["step"] for s in page["story"]] == ["decided"]
    assert "\\u{202e}" in page["story"][0]["text"] and RLO not in page["story"][0]["text"]
    assert page["records"][0]["arguments"]["command"] == tricky  # the raw JSON is the record as written
    o = console.get("/console/api/overview").json()
    assert (o["calls"], o["denied"]["count"]) == (2, 1)
    assert RLO not in o["denied"]["commands"]["top"][0]["name"]
    # filters: one call by text (looked for in every record of the call), by decision
    found = console.get("/console/api/calls", params={"text": "ECHO ONE"}).json()["calls"]
    assert [c["command"] for c in found] == ["echo one"]
    quoted = console.get("/console/api/calls", params={"text": "onerror=alert(1)>"}).json()["calls"]
    assert [c["call_id"] for c in quoted] == [denied["call_id"]]
    by_decision = console.get("/console/api/calls", params={"decision": "deny"}).json()["calls"]
    assert [c["call_id"] for c in by_decision] == [denied["call_id"]]
    # what a client may ask is bounded: a call id is no path, a range no longer than a year
    assert console.get("/console/api/audit/..%2F..%2Fetc%2Fpasswd").status_code == 404
    assert console.get("/console/api/overview", params={"since": "100000d"}).status_code == 400
    assert console.get("/console/api/overview", params={"colour": "red"}).status_code == 400
    assert console.get("/console/api/calls", params={"since": "soon"}).status_code == 400


def test_a_card_groups_what_an_ask_runs_reads_and_writes(policy: Any) -> None:
    """Seven module lookups that find nothing are one line ("binds 7 module paths as absent"),
    many paths are counted by directory, a file that cannot be bound is a warning."""
    lookups = [{"path": f"/w/helper_{k}", "why": "python imports it", "kind": "python-lookup", "sha256": "ab" * 32}
               for k in range(7)]  # fmt: skip
    files = [*lookups, {"path": "/w/tool.py", "why": "python3's script", "sha256": "cd" * 32, "bytes": 80},
             {"path": "/w/GNUmakefile", "why": "make's makefile", "sha256": None},
             {"path": "/w/out.sh", "why": "bash's script", "error": "a link leads out of the root /w"}]  # fmt: skip
    request = {"call_id": "c1", "principal": "agent", "tool": "run", "command": "python3 tool.py", "cwd": "/w",
               "rule": "rm-by-supervisor", "asking": ["rm-by-supervisor"], "reason": "r", "files": files}  # fmt: skip
    paths = {"read": [f"/w/src/m{k}.py" for k in range(9)] + ["/w/tests/t.py", "/w/README"], "write": ["/w/out"]}
    decision = {"data": {"commands": [{"argv": ["python3", "tool.py"]}]}}
    c = cards.card(request, decision, policy, paths)
    runs = [g["summary"] for g in c["runs"]]
    assert runs == ["runs python3", "runs tool.py, bound by its content", "binds 1 path as absent (make's makefile)",
                    "binds 7 module paths as absent", "1 file cannot be bound: approving is void"], runs  # fmt: skip
    assert c["runs"][3]["count"] == 7 and len(c["runs"][3]["items"]) == 7 and c["runs"][4]["tone"] == "warn"
    assert [g["summary"] for g in c["reads"]] == ["reads 11 paths: 9 in src/, 1 in tests/, 1 in ./"]
    assert [g["summary"] for g in c["writes"]] == ["writes out"]
    assert c["rules"] == [{"rule": "rm-by-supervisor", "why": "deleting needs a supervisor", "risk": None}]
    unknown = cards.card(request, None, policy, None)
    assert not unknown["recorded"] and not unknown["paths_known"] and unknown["reads"] == []
