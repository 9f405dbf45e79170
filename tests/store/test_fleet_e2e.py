"""Issue 25's "How we will know", end to end: a real PostgreSQL, three `gateway serve --store`
processes on their own ports and one `gateway daemon --store`, all connected as a gateway's
database login (which may not answer approvals). An agent's ask on gateway 1 is answered in the
web console of gateway 2 (its HTTP API, signed in as the browser page signs in, with a
supervisor's secret of the fleet), and the call on gateway 1 then runs; a token revoked from
gateway 3's host is refused on gateway 1; a published policy reaches all three and a broken one
none; `gateway audit verify --store` passes over every stream. And the console's side of it:
a gateway's login cannot answer with what it can read of the tokens (only the secret itself
takes), and a second answer, from the terminal or another console, never takes."""

from __future__ import annotations

import asyncio
import copy
import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import psycopg
import pytest
import yaml

from gateway import hook_client
from tests.conftest import eventually
from tests.server.conftest import GATEWAY, POLICY, HttpGateway, envelope_of, policy_file, ws
from tests.server.test_transports import call_http
from tests.store.test_approvals import login
from tests.store.test_fleet import fleet_token, status
from tests.store.test_ledger import gateway
from tests.store.test_policy import NO_PRINTF, publish, status_of, write

__all__ = ["policy_file", "ws"]


class Fleet:
    """Three served gateways and a hooks daemon on one store, with the fleet's policy."""

    def __init__(self, tmp_path: Path, policy_file: Path, ws: Path, dsn: str, served: int = 3,
                 daemon: bool = True) -> None:  # fmt: skip
        self.dsn = dsn
        self.tmp = tmp_path
        self.ws = ws
        self.policy_file = policy_file
        self.pk = tmp_path / "pk"  # the publisher's signing key; its public half is pinned below
        first = publish(dsn, write(tmp_path / "v1" / "p.yaml", POLICY), self.pk, ws)
        assert first.returncode == 0, first.stderr
        self.host_login = login(dsn, "agw_gateway")  # what every gateway connects as
        self.supervisor_login = login(dsn, "agw_supervisor")  # a person's own login, for the terminal
        self.servers: list[HttpGateway] = []
        self.daemon: subprocess.Popen[str] | None = None
        keys = str(tmp_path / "keys")  # one host: one key
        for i in range(served):
            home = tmp_path / f"gw{i + 1}"
            home.mkdir()
            extra = ("--store", self.host_login, "--audit-keys", keys, "--policy-key", str(self.pk / "signing.pub"),
                     "--pending-after", "600")  # fmt: skip
            self.servers.append(HttpGateway(home, policy_file, ws, extra=extra))
        if daemon:
            self._start_daemon(tmp_path, policy_file, ws, keys)

    def _start_daemon(self, tmp_path: Path, policy_file: Path, ws: Path, keys: str) -> None:
        run = tmp_path / "daemon"
        run.mkdir(mode=0o700)
        self.sock = run / "hooks.sock"
        self.daemon_err = run / "daemon.err"
        argv = [GATEWAY, "daemon", "--socket", str(self.sock), "--store", self.host_login, "--policy",
                str(policy_file), "--workspace", str(ws), "--audit-dir", str(run / "audit"), "--audit-keys", keys,
                "--principal", "agent", "--idle-exit", "0"]  # fmt: skip
        proc = self.daemon = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=self.daemon_err.open("w"),
                                              text=True)  # fmt: skip
        serving = eventually(lambda: "serving" in self.daemon_err.read_text() or proc.poll() is not None, seconds=120)
        assert serving and proc.poll() is None, self.daemon_err.read_text()

    def stop(self) -> None:
        for s in self.servers:
            s.stop()
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.terminate()
            try:
                self.daemon.wait(30)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                self.daemon.wait()


@pytest.fixture
def fleet(tmp_path: Path, policy_file: Path, ws: Path, dsn: str) -> Iterator[Fleet]:
    made = Fleet(tmp_path, policy_file, ws, dsn)
    try:
        yield made
    finally:
        made.stop()


@pytest.fixture
def pair(tmp_path: Path, policy_file: Path, ws: Path, dsn: str) -> Iterator[Fleet]:
    made = Fleet(tmp_path, policy_file, ws, dsn, served=2, daemon=False)
    try:
        yield made
    finally:
        made.stop()


class Browser:
    """The console of one gateway as its page uses it: signed in through the login form with a
    supervisor's secret, then the session's cookie, its key in X-CSRF-Token, and this origin."""

    def __init__(self, server: HttpGateway, secret: str) -> None:
        self.base = server.url.removesuffix("/mcp")
        signed = httpx2.post(self.base + "/console/login", data={"secret": secret}, headers={"Origin": self.base},
                             timeout=60)  # fmt: skip
        assert signed.status_code == 303 and "#key=" in signed.headers["location"], signed.text
        self.cookies = {"agw_console": signed.cookies["agw_console"]}
        self.headers = {"X-CSRF-Token": signed.headers["location"].split("#key=", 1)[1], "Origin": self.base}

    def get(self, route: str) -> httpx2.Response:
        return httpx2.get(f"{self.base}/console/api/{route}", headers=self.headers, cookies=self.cookies, timeout=60)

    def post(self, route: str, body: dict[str, Any]) -> httpx2.Response:
        return httpx2.post(f"{self.base}/console/api/{route}", json=body, headers=self.headers, cookies=self.cookies,
                           timeout=60)  # fmt: skip


def supervisor_secret(dsn: str, name: str) -> tuple[str, str]:
    """A supervisor's console secret of the fleet (`gateway token create --supervisor --store`)."""
    made = gateway("token", "create", "--store", dsn, "--supervisor", name)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip().splitlines()[-1], made.stderr.split("supervisor token ")[1].split()[0]


def hook(fleet: Fleet, command: str) -> dict[str, Any]:
    """Claude Code's PreToolUse for a Bash command, asked of the daemon over its socket."""
    payload = {"session_id": "s1", "transcript_path": "/dev/null", "cwd": str(fleet.ws),
               "hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": {"command": command}}  # fmt: skip
    code, out, err = hook_client.ask(str(fleet.sock), "claude-code", json.dumps(payload).encode(), 120)
    assert code == 0, err
    answer: dict[str, Any] = json.loads(out)
    return answer


def test_an_ask_answered_in_another_gateways_console_tokens_and_policy_reach_the_fleet(
    fleet: Fleet, dsn: str, tmp_path: Path, ws: Path, policy_file: Path
) -> None:
    gw1, gw2, gw3 = fleet.servers
    token, token_id = fleet_token(dsn, policy_file)
    secret, secret_id = supervisor_secret(fleet.supervisor_login, "alice")

    # --- an agent's ask on gateway 1, answered in the console of gateway 2 -------------------------
    (ws / "victim").write_text("delete me once a supervisor says so\n")
    got: list[Any] = []
    caller = threading.Thread(
        target=lambda: got.append(asyncio.run(call_http(gw1.url, token, "auto", ("run", {"command": "rm victim"})))),
        daemon=True,
    )
    caller.start()
    browser = Browser(gw2, secret)
    assert browser.get("session").json()["supervisor"] == "alice"
    rows = eventually(lambda: browser.get("approvals").json()["approvals"], seconds=120)
    assert rows, "the ask on gateway 1 never reached the console of gateway 2"
    (row,) = rows
    call_id = row["call_id"]
    assert row["command"] == "rm victim" and row["principal"] == "agent" and row["host"]
    assert row["card"]  # shaped by the console's own card code, from the fleet's records
    answered = browser.post(f"approvals/{call_id}/approve", {"digest": row["digest"], "reason": "release day"})
    assert answered.status_code == 200, answered.text
    assert answered.json()["by"] == "alice"
    caller.join(180)
    result = envelope_of(got[0][0])
    if result["status"] == "pending":  # answered after gateway 1 said pending: fetch it there
        (awaited,) = asyncio.run(call_http(gw1.url, token, "auto", ("await_call", {"call_id": call_id})))
        result = envelope_of(awaited)
    assert result["status"] == "ok", result
    assert not (ws / "victim").exists()  # the call on gateway 1 ran
    # exactly one answer: the terminal's and another console's come too late, and say why
    late = gateway("approvals", "deny", "--store", fleet.supervisor_login, call_id)
    assert late.returncode == 2 and "already has an answer (approved by alice)" in late.stderr, late.stderr
    again = Browser(gw3, secret).post(f"approvals/{call_id}/deny", {"digest": row["digest"]})
    assert again.status_code in (404, 409), again.text  # gone from the inbox, or refused by the store
    host_login = fleet.host_login.split("//")[1].split("@")[0]
    with psycopg.connect(dsn) as conn:
        state, by, where = conn.execute("SELECT state, answered_by, answered_from FROM agw.approval "
                                        "WHERE call_id = %s", (call_id,)).fetchone() or (None, None, None)  # fmt: skip
        bodies = [json.loads(b) for (b,) in conn.execute("SELECT body FROM agw.record WHERE body::jsonb ->> "
                                                         "'call_id' = %s", (call_id,))]  # fmt: skip
    assert (state, by) == ("approved", "alice")
    assert f":{gw2.port} (console; secret {secret_id}; through login {host_login})" in where
    events = {b["event"]: b for b in bodies}
    assert events["supervisor_answer"]["data"]["supervisor"] == "alice"  # in gateway 2's stream
    assert events["approval"]["data"]["by"] == "alice"  # in gateway 1's
    assert events["supervisor_answer"]["stream"] != events["approval"]["stream"]
    # the console's timeline reads the fleet's ledger: the call of gateway 1 is there, whole
    page = browser.get(f"audit/{call_id}").json()
    assert {r["event"] for r in page["records"]} >= {"decision", "approval", "supervisor_answer", "result"}
    calls = browser.get("calls?principal=agent").json()["calls"]
    assert call_id in {c["call_id"] for c in calls}

    # --- the hooks daemon records in the same ledger --------------------------------------------------
    decided = hook(fleet, "echo from the daemon")
    assert decided["hookSpecificOutput"]["permissionDecision"] == "allow", decided
    assert eventually(lambda: any(r["record"].get("arguments", {}).get("command") == "echo from the daemon"
                                  for r in browser.get("audit?event=decision").json()["items"]))  # fmt: skip

    # --- a token revoked from gateway 3's host is refused on gateway 1 --------------------------------
    for server in (gw1, gw3):
        assert status_of(server, token, "echo still valid") == "ok"
    revoked = gateway("token", "revoke", token_id, "--store", fleet.supervisor_login)
    assert revoked.returncode == 0, revoked.stderr
    assert eventually(lambda: status(gw1.url, token) == 401, seconds=60)  # within the cache's second: bounded
    assert eventually(lambda: status(gw3.url, token) == 401, seconds=60)
    token, _ = fleet_token(dsn, policy_file)

    # --- a published policy reaches all three; a broken one none -------------------------------------
    for server in fleet.servers:
        assert status_of(server, token, "printf hi") == "ok"
    v2 = copy.deepcopy(POLICY)
    v2["rules"].append(NO_PRINTF)
    done = publish(dsn, write(tmp_path / "v2" / "p.yaml", v2), fleet.pk, ws)
    assert done.returncode == 0 and "as revision 2" in done.stdout, done.stderr
    for server in fleet.servers:
        assert eventually(lambda s=server: status_of(s, token, "printf hi") == "denied", seconds=60)
    broken = copy.deepcopy(v2)
    broken["rules"][-1]["examples"] = {"match": ["echo x"]}  # contradicts its rule: its checks fail
    refused = publish(dsn, write(tmp_path / "v3" / "p.yaml", broken), fleet.pk, ws)
    assert refused.returncode == 2 and "not published" in refused.stderr
    unpinned = publish(dsn, write(tmp_path / "v4" / "p.yaml", POLICY), tmp_path / "not-pinned", ws)
    assert unpinned.returncode == 0 and "as revision 3" in unpinned.stdout

    def reported() -> list[tuple[Any, ...]]:
        with psycopg.connect(dsn) as conn:
            return conn.execute("SELECT rev, state FROM agw.policy_status ORDER BY stream").fetchall()

    assert eventually(lambda: reported() == [(3, "rejected")] * 3, seconds=60), reported()
    for server in fleet.servers:  # still the last good revision: printf stays denied everywhere
        assert status_of(server, token, "printf hi") == "denied"

    # --- one ledger for all four processes, and it verifies -------------------------------------------
    with psycopg.connect(dsn) as conn:
        streams = conn.execute("SELECT count(*) FROM agw.stream").fetchone()
    assert streams == (4,)
    checked = gateway("audit", "verify", "--store", dsn, "--key", str(tmp_path / "keys" / "signing.pub"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # the console's verify status runs the same check (in the background, every few seconds)
    shown = eventually(lambda: (v := browser.get("verify").json()).get("streams") == 4 and v, seconds=60)
    assert shown and shown["state"] == "ok", shown


def test_a_gateways_login_answers_nothing_with_what_it_can_read_of_the_tokens(pair: Fleet, dsn: str) -> None:
    """Red team: the console's gateway connects as a login that may pass on a supervisor's
    answer. Whoever holds that login (a stolen host) reads the tokens' digests and every request;
    none of that answers: only a supervisor's secret itself does, checked by the database."""
    secret, secret_id = supervisor_secret(pair.supervisor_login, "alice")
    token, _ = fleet_token(dsn, pair.policy_file)
    got: list[Any] = []
    ask = ("run", {"command": "rm -f nothing"})
    threading.Thread(target=lambda: got.append(asyncio.run(call_http(pair.servers[0].url, token, "auto", ask))),
                     daemon=True).start()  # fmt: skip
    with psycopg.connect(pair.host_login, autocommit=True) as conn:
        row = eventually(lambda: conn.execute("SELECT call_id, digest, host FROM agw.approval "
                                              "WHERE state = 'pending'").fetchone(), seconds=120)  # fmt: skip
        assert row, "never asked"
        call_id, digest, host = row
        (stored,) = conn.execute("SELECT sha256 FROM agw.token WHERE id = %s", (secret_id,)).fetchone() or ("",)
        answer = "SELECT state FROM agw.answer_with_secret(%s, %s, %s, true, %s, '', 'once', 'mallory')"
        for forged in (stored, token, "agws_" + "A" * 43, ""):  # its digest, an agent's token, a guess
            with pytest.raises(psycopg.errors.RaiseException, match="not a supervisor's secret"):
                conn.execute(answer, (forged, host, call_id, digest))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # nor as itself, nor around the check
            conn.execute("SELECT agw.answer_as('alice', %s, true, %s, '', 'once', '')", (call_id, digest))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT agw.answer(%s, true, %s, '', 'once', '')", (call_id, digest))
        gone = gateway("token", "revoke", secret_id, "--store", pair.supervisor_login)
        assert gone.returncode == 0, gone.stderr
        with pytest.raises(psycopg.errors.RaiseException, match="was revoked"):  # a secret revoked: nothing
            conn.execute(answer, (secret, host, call_id, digest))
        still = conn.execute("SELECT state FROM agw.approval WHERE call_id = %s", (call_id,)).fetchone()
    assert still == ("pending",) and not got
    # and the console of another gateway refuses the revoked secret at the door
    base = pair.servers[1].url.removesuffix("/mcp")

    def refused() -> bool:
        r = httpx2.post(f"{base}/console/api/approvals/{call_id}/approve", json={},
                        headers={"Authorization": f"Bearer {secret}"}, timeout=60)  # fmt: skip
        return r.status_code == 401

    assert eventually(refused, seconds=60)


def test_the_consoles_what_if_replay_decides_every_gateways_calls_again(pair: Fleet, dsn: str) -> None:
    """A `--store` gateway's console replays a draft over the fleet's ledger: the calls of both
    gateways are decided again (it answered 409 before: its own files are empty)."""
    gw1, gw2 = pair.servers
    token, _ = fleet_token(dsn, pair.policy_file)
    assert status_of(gw1, token, "printf from-one") == "ok"
    assert status_of(gw2, token, "printf from-two") == "ok"
    secret, _ = supervisor_secret(pair.supervisor_login, "alice")
    browser = Browser(gw2, secret)
    same = browser.post("replay", {"policy": yaml.safe_dump(POLICY, sort_keys=False)})
    assert same.status_code == 200, same.text
    assert same.json()["changed"] == 0 and same.json()["replayed"] >= 2, same.json()
    draft = copy.deepcopy(POLICY)
    draft["rules"].append(NO_PRINTF)
    report = browser.post("replay", {"policy": yaml.safe_dump(draft, sort_keys=False)})
    assert report.status_code == 200, report.text
    (group,) = report.json()["groups"]
    assert (group["from"], group["to"]) == ({"decision": "allow", "rule": "basics"},
                                            {"decision": "deny", "rule": "no-printf"}), group  # fmt: skip
    assert sorted(c["command"] for c in group["calls"]) == ["printf from-one", "printf from-two"]
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT stream, body FROM agw.record WHERE body::jsonb ->> 'event' = 'console_replay' "
                            "ORDER BY received_at").fetchall()  # fmt: skip
        decided = conn.execute("SELECT stream FROM agw.record WHERE body::jsonb #>> '{arguments,command}' = "
                               "'printf from-two'").fetchone()  # fmt: skip
    assert [(json.loads(b)["data"]["supervisor"], json.loads(b)["data"]["changed"]) for _, b in rows] == [
        ("alice", 0), ("alice", 2)]  # fmt: skip
    assert decided is not None and {s for s, _ in rows} == {decided[0]}  # gateway 2's own stream
