"""The console's ASGI app: everything under `/console`.

Who may ask (`identify`, before any route runs):

- a request carrying `Authorization: Bearer ...` is a script's: the secret must be a
  supervisor's (`gateway token create --supervisor NAME`). An agent token is answered 403 on
  every path under /console (it is known, and it is not allowed here); anything else 401. Such
  a request needs no CSRF token: a browser never adds that header by itself.
- otherwise the session cookie (`sessions.py`) and the session's key in `X-CSRF-Token` (the
  cookie alone reaches any port of this host); a state-changing request from a session also
  needs an `Origin` equal to this server's own origin, or it is refused 403. The login form
  needs that Origin too.
- the page itself (`/console/`, `/console/login`, `/console/static/...`) is the same for
  everyone and holds no data: it asks the API.

Every request's `Host` must be one this server answers to (421 otherwise: a DNS-rebinding page
reaches the port under a name of its own). Every answer carries a strict Content-Security-Policy
(no inline script, nothing from elsewhere) and is not cached. Refusals (401, 403) are audited by
the front (`auth_refused`), like the MCP endpoint's.

Every answer to an approval is audited (`supervisor_answer`: the supervisor's name, their
secret's id, how they came: bearer or session) once it has won the queue's claim and before it is
given to the gateway; if it cannot be recorded, nothing is answered (503). An answer that lost
the race (a terminal or another console answered first) is recorded as
`supervisor_answer_refused` with why, never as an answer (409). The gateway's own `approval`
record then names the supervisor whose answer took (`by`).

With `--store` (`ConsoleConfig.fleet`, fleet.py) the inbox is the fleet's and the timeline,
calls, overview and verify status read the fleet's ledger: an answer is given as the supervisor
whose secret signed in (the store checks the secret itself), and recorded in this gateway's
stream before it commits. A store that cannot be read is answered 503, naming it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import stat
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, MutableMapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from gateway import approval_queue, replay
from gateway.approval import escaped
from gateway.audit import SECRET_NAME, AuditUnavailable
from gateway.audit.describe import describe_record
from gateway.audit.keys import VerifyKey
from gateway.audit.overview import overview
from gateway.audit.selection import Selection
from gateway.audit.sink import AuditSink
from gateway.audit.timespec import TimeSpecError
from gateway.audit.timespec import parse as parse_time
from gateway.policy.compile import CompiledPolicy
from gateway.server.console import cards
from gateway.server.console.auditview import FILTERS, AuditView, CallIndex, VerifyStatus
from gateway.server.console.feed import END, AnswerRefused, Feed, Inbox, QueueInbox
from gateway.server.console.fleet import Fleet
from gateway.server.console.sessions import COOKIE, Session, Sessions
from gateway.store.db import StoreError
from gateway.tokens import AGENT, TokenEntry, TokenStore
from gateway.upstream.pins import PinError, PinStore

PREFIX = "/console"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
STATIC = {"console.js": "text/javascript", "console.css": "text/css"}
PAGES = {"/console/": "index.html", "/console/login": "login.html"}
MAX_BODY = 256 << 10
MAX_DRAFT = MAX_BODY
"""A draft policy replayed from a file next to the served one (text in a body is capped by MAX_BODY)."""
"""The largest body the console reads (an answer, a login, a reason)."""
MAX_REASON = 4000
HEAD_LINES = 40
"""Lines of each file the command runs shown in the inbox (as `approvals show`)."""
AUDIT_LIMIT_DEFAULT, AUDIT_LIMIT_MAX = 200, 2000
PING_S = 15.0
MAX_OVERVIEW_DAYS = 366


@dataclass(frozen=True)
class ConsoleConfig:
    """What the console needs of the server it is part of."""

    tokens: TokenStore
    audit: AuditSink
    policy: Callable[[], CompiledPolicy]
    state_dir: Path | None
    """The approvals queue (None: this server's asks are not answered through the queue, so the
    inbox stays empty and answers are refused 409)."""
    hosts: tuple[str, ...]
    """`host:port` values of `Host` this server answers to."""
    max_streams: int = 8
    """Event streams open at once (each holds a connection): well under the front's caps."""
    verify_key: VerifyKey | None = None
    checkpoint: Path | None = None
    secure_cookie: bool = False
    pins: PinStore | None = None
    """The pinned definitions of upstream tools (gateway/upstream/pins.py): drift is shown and
    accepted here (None: this server keeps none)."""
    fleet: Fleet | None = None
    """With `--store`: the fleet's inbox and ledger, read and answered instead of this host's
    files (fleet.py)."""


class Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Who:
    supervisor: str
    token_id: str
    via: str  # "bearer" or "session"
    session: Session | None = None
    session_id: str = ""
    secret: str = ""
    """Their secret, known only where the inbox checks it itself (the fleet's: the store does)."""


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=headers)


def _error(status: int, message: str) -> JSONResponse:
    return _json({"error": message}, status)


def _static(name: str) -> bytes:
    return resources.files("gateway.server.console").joinpath("static", name).read_bytes()


_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
CALL_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")


class Console:
    def __init__(self, config: ConsoleConfig) -> None:
        self.config = config
        self.sessions = Sessions()
        fleet = config.fleet
        self.inbox: Inbox | None = fleet.inbox if fleet else QueueInbox(config.state_dir) if config.state_dir else None
        self.feed = Feed(self.inbox)
        self.view = fleet.view() if fleet else AuditView(config.audit.directory)
        self.calls = fleet.calls() if fleet else CallIndex(config.audit.directory)
        self._cards: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._cards_lock = threading.Lock()
        self.verify = fleet.verify() if fleet else \
            VerifyStatus(config.audit.directory, lambda: config.verify_key, config.checkpoint)  # fmt: skip
        self.files = {name: _static(name) for name in (*STATIC, *PAGES.values())}
        self._replaying = threading.Lock()

    def start(self) -> None:
        self.feed.start()
        self.verify.get()  # the first check starts now, not at the first visit
        # the calls are folded now too (a large log takes seconds), not at the first visit
        threading.Thread(target=self.calls.warm, name="console-calls", daemon=True).start()

    def stop(self) -> None:
        self.feed.stop()

    # --- ASGI ----------------------------------------------------------------------------------
    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        request = Request(scope, receive)
        try:
            try:
                response = await self._handle(request)
            except StoreError as exc:  # the fleet's store (--store) cannot be read now: named, never a guess
                raise Refused(503, str(exc)) from None
        except Refused as exc:
            response = _error(exc.status, exc.message)
            if exc.status == 401:
                response.headers["WWW-Authenticate"] = 'Bearer realm="agent-gateway console"'
        response.headers.setdefault("Content-Security-Policy", CSP)
        response.headers.setdefault("Cache-Control", "no-store")
        response.headers["X-Content-Type-Options"] = "nosniff"
        # not no-referrer: under it a browser sends `Origin: null` with the login form, which the
        # Origin check must refuse; same-origin tells nothing to other sites all the same
        response.headers["Referrer-Policy"] = "same-origin"
        response.headers["X-Frame-Options"] = "DENY"
        await response(scope, receive, send)

    async def _handle(self, request: Request) -> Response:
        path, method = request.url.path, request.method
        host = request.headers.get("host", "")
        if host not in self.config.hosts:
            raise Refused(421, f"Host {host!r} is not one this server answers to ({', '.join(self.config.hosts)})")
        bearer = self._bearer(request)  # an agent token is refused here, whatever the path
        if path == PREFIX:
            return RedirectResponse(f"{PREFIX}/", 303)
        if method == "GET" and path in PAGES:
            return Response(self.files[PAGES[path]], media_type="text/html; charset=utf-8")
        if method == "GET" and path.startswith(f"{PREFIX}/static/") and path.rsplit("/", 1)[1] in STATIC:
            name = path.rsplit("/", 1)[1]
            return Response(self.files[name], media_type=f"{STATIC[name]}; charset=utf-8")
        if path == f"{PREFIX}/login" and method == "POST":
            return await self._login(request)
        if path == f"{PREFIX}/logout" and method == "POST":
            who = self._who(request, bearer, changes=True)
            if who.session_id:
                self.sessions.close(who.session_id)
            response = RedirectResponse(f"{PREFIX}/login", 303)
            response.delete_cookie(COOKIE, path=PREFIX, secure=self.config.secure_cookie, httponly=True,
                                   samesite="strict")  # fmt: skip
            return response
        if not path.startswith(f"{PREFIX}/api/"):
            raise Refused(404, f"no such page: {path}")
        who = self._who(request, bearer, changes=method not in ("GET", "HEAD"))
        return await self._api(request, who, path[len(f"{PREFIX}/api/") :], method)

    # --- who is asking -------------------------------------------------------------------------
    def _bearer(self, request: Request) -> TokenEntry | None:
        auth = request.headers.get("authorization")
        if auth is None:
            return None
        scheme, _, secret = auth.partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise Refused(401, "Authorization: expected 'Bearer <a supervisor's secret>'")
        secret = secret.strip()
        entry = self.config.tokens.lookup_supervisor(secret)
        if entry is not None:
            return entry
        if self.config.tokens.kind_of(secret) == AGENT:
            raise Refused(403, "an agent token has no access to the console: a supervisor's secret is needed "
                               "(gateway token create --supervisor NAME)")  # fmt: skip
        raise Refused(401, "unknown secret: a supervisor's secret is needed (gateway token create --supervisor NAME)")

    def _who(self, request: Request, bearer: TokenEntry | None, changes: bool) -> Who:
        if bearer is not None:
            secret = self._secret(request) if self.inbox is not None and self.inbox.needs_secret else ""
            return Who(bearer.principal, bearer.id, "bearer", secret=secret)
        session_id = request.cookies.get(COOKIE)
        session = self.sessions.get(session_id) if session_id else None
        if session is None or session_id is None:
            raise Refused(401, "not signed in (or the session ended): sign in at /console/login")
        if self.config.tokens.current(session.token_id) is None:
            self.sessions.end_for(session.token_id)
            raise Refused(401, "the secret this session signed in with was revoked: sign in again")
        # the cookie alone is not enough, even to read: a browser sends it to every port of this
        # host (cookies are not kept apart by port), so any other server on 127.0.0.1 the
        # supervisor visits would get it. The session's key is not a cookie: the sign-in hands it
        # to this origin's page only (in the redirect's fragment), which keeps it in its storage.
        key = request.headers.get("x-csrf-token")
        if key is None and request.url.path == f"{PREFIX}/api/events":
            key = request.query_params.get("csrf")  # an EventSource sends no header of its own
        if key is None:
            raise Refused(401, "X-CSRF-Token: missing: this page has not this session's key; sign in again here")
        if not Sessions.csrf_ok(session, key):
            raise Refused(403, "X-CSRF-Token: not this session's")
        if changes:
            self._same_origin(request)
        return Who(session.supervisor, session.token_id, "session", session, session_id, session.secret)

    @staticmethod
    def _secret(request: Request) -> str:
        return request.headers.get("authorization", "").partition(" ")[2].strip()

    def _same_origin(self, request: Request) -> None:
        origin = request.headers.get("origin")
        mine = f"{'https' if self.config.secure_cookie else 'http'}://{request.headers.get('host', '')}"
        if origin != mine:
            raise Refused(403, f"Origin {origin!r} is not this console's ({mine}): changes come from its own page")

    async def _login(self, request: Request) -> Response:
        self._same_origin(request)
        form = urllib.parse.parse_qs((await self._body(request)).decode("utf-8", "replace"), max_num_fields=4)
        secret = (form.get("secret") or [""])[0].strip()
        entry = self.config.tokens.lookup_supervisor(secret) if secret else None
        if entry is None:
            page = self.files["login.html"].replace(b'<p id="failed" hidden>', b'<p id="failed">')
            return Response(page, status_code=401, media_type="text/html; charset=utf-8")
        # the fleet's inbox checks the secret itself with every answer: the session keeps it (in
        # this server's memory only, as the session itself); this host's queue never needs it
        kept = secret if self.inbox is not None and self.inbox.needs_secret else ""
        session_id, session = self.sessions.open(entry.principal, entry.id, kept)
        try:
            await run_in_threadpool(self.config.audit.append, "console_login", data={"supervisor": entry.principal,
                                    "token": entry.id})  # fmt: skip
        except AuditUnavailable as exc:
            self.sessions.close(session_id)
            raise Refused(503, f"the sign-in could not be recorded: {exc}") from None
        # the key in the fragment: never sent to a server, read by the page and kept per tab
        response = RedirectResponse(f"{PREFIX}/#key={session.csrf}", 303)
        response.set_cookie(COOKIE, session_id, path=PREFIX, httponly=True, samesite="strict",
                            secure=self.config.secure_cookie)  # fmt: skip
        return response

    async def _body(self, request: Request) -> bytes:
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY:
                raise Refused(413, f"request body over the console's {MAX_BODY} bytes")
        return body

    async def _json_body(self, request: Request) -> dict[str, Any]:
        raw = await self._body(request)
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw)
        except ValueError:
            raise Refused(400, "body: expected a JSON object") from None
        if not isinstance(body, dict):
            raise Refused(400, "body: expected a JSON object")
        return body

    # --- the API -------------------------------------------------------------------------------
    async def _api(self, request: Request, who: Who, route: str, method: str) -> Response:
        parts = route.split("/")
        if method == "GET" and route == "session":
            return _json({"supervisor": who.supervisor, "via": who.via,
                          **({"csrf": who.session.csrf} if who.session else {})})  # fmt: skip
        if method == "GET" and route == "approvals":
            return _json(await run_in_threadpool(self.approvals))
        if method == "POST" and len(parts) == 3 and parts[0] == "approvals" and parts[2] in ("approve", "deny"):
            return await self._answer(request, who, parts[1], parts[2] == "approve")
        if method == "GET" and route == "audit":
            return _json(await run_in_threadpool(self._audit, dict(request.query_params)))
        if method == "GET" and route == "calls":
            return _json(await run_in_threadpool(self._calls, dict(request.query_params)))
        if method == "GET" and route == "overview":
            return _json(await run_in_threadpool(self._overview, dict(request.query_params)))
        if method == "GET" and len(parts) == 2 and parts[0] == "audit":
            found = await run_in_threadpool(self.calls.call, parts[1]) if CALL_ID.fullmatch(parts[1]) else None
            return _json(cards.call_page(found)) if found else _error(404, f"no records for call {escaped(parts[1])!r}")
        if method == "GET" and route == "verify":
            return _json(self.verify.get())
        if method == "GET" and route == "events":
            return self._events(who)
        if method == "POST" and route == "replay":
            return await self._replay(request, who)
        if method == "GET" and route == "upstreams/drift":
            pins = self.config.pins
            drift = await run_in_threadpool(pins.drifts) if pins is not None else []
            return _json({"drift": [d.to_json() for d in drift]})
        if method == "POST" and route == "upstreams/accept":
            return await self._accept(request, who)
        raise Refused(404 if method in ("GET", "POST") else 405, f"no such API route: {method} /console/api/{route}")

    async def _replay(self, request: Request, who: Who) -> Response:
        """`POST /console/api/replay` {"policy": YAML text | "policy_file": a name in the served
        policy's directory, "since", "until", "max_rows"}: what-if replay of a draft over the
        recorded calls (gateway/replay.py). Nothing runs and no approval is asked; the
        request is audited (`console_replay`) with the supervisor's name and the draft's digest.
        One replay at a time: a second one meanwhile gets 429."""
        body = await self._json_body(request)
        draft = self._draft(body)
        since, until, rows = body.get("since"), body.get("until"), body.get("max_rows", 200)
        for name, value in (("since", since), ("until", until)):
            if value is not None and not isinstance(value, str):
                raise Refused(400, f"{name}: expected a time (ISO 8601) or nothing")
        if not isinstance(rows, int) or isinstance(rows, bool) or not 0 <= rows <= 1000:
            raise Refused(400, "max_rows: expected a whole number from 0 to 1000")
        if not self._replaying.acquire(blocking=False):
            raise Refused(429, "a replay is already running: try again when it has finished")
        try:
            fleet = self.config.fleet  # with --store: every stream of the fleet's ledger, in its global order
            source = fleet.records if fleet is not None else None
            report = await run_in_threadpool(lambda: replay.replay(
                draft, self.config.audit.directory, since, until, max_rows=rows, confined=True, source=source,
            ))  # fmt: skip
        except replay.ReplayError as exc:
            raise Refused(400, str(exc)) from None
        finally:
            self._replaying.release()
        out = report.to_json()
        try:
            await run_in_threadpool(lambda: self.config.audit.append(
                "console_replay", data={"supervisor": who.supervisor, "token_id": who.token_id, "via": who.via,
                                        "draft": out["draft"], "draft_sha256": out["draft_sha256"],
                                        "since": since, "until": until, "changed": out["changed"]},
            ))  # fmt: skip
        except AuditUnavailable:
            raise Refused(503, "the audit log cannot be written: no replay is answered unrecorded") from None
        return _json(out)

    async def _accept(self, request: Request, who: Who) -> Response:
        """`POST /console/api/upstreams/accept` {"upstream", "tool", "sha256"}: pin the pending
        definition the supervisor saw (`sha256`, from `GET upstreams/drift`; refused with 409 if
        the upstream changed it again since). Recorded (`upstream_accepted`) before it is pinned."""
        body = await self._json_body(request)
        upstream, tool, sha = body.get("upstream"), body.get("tool"), body.get("sha256")
        if not all(isinstance(v, str) and 0 < len(v) <= 200 for v in (upstream, tool, sha)):
            raise Refused(400, "expected upstream, tool and sha256 (the pending definition's, from upstreams/drift)")
        assert isinstance(upstream, str) and isinstance(tool, str) and isinstance(sha, str)
        pins = self.config.pins
        if pins is None:
            raise Refused(409, "this server keeps no pins of upstream tools")

        def record(event: str, data: dict[str, Any]) -> None:
            self.config.audit.append(
                event, tool="upstream",
                data={**data, "supervisor": who.supervisor, "token_id": who.token_id, "via": who.via},
            )  # fmt: skip

        try:
            done = await run_in_threadpool(pins.accept, upstream, tool, sha, who.supervisor, record)
        except AuditUnavailable as exc:
            raise Refused(503, f"the acceptance could not be recorded, so nothing changed: {exc}") from None
        except PinError as exc:
            raise Refused(409, str(exc)) from None
        return _json({"upstream": done.upstream, "tool": done.tool, "accepted_sha256": done.seen_sha256,
                      "by": who.supervisor})  # fmt: skip

    def _draft(self, body: dict[str, Any]) -> Path | str:
        """The draft to replay: YAML text, or a file next to the served policy (a name, not a path:
        the console reads nothing else of the server's disk)."""
        text, name = body.get("policy"), body.get("policy_file")
        if (text is None) == (name is None):
            raise Refused(400, "expected one of policy (the draft's YAML text) or policy_file (a file name)")
        if text is not None:
            if not isinstance(text, str) or not text.strip():
                raise Refused(400, "policy: expected the draft's YAML text")
            return text
        if not isinstance(name, str) or not _FILE_NAME.fullmatch(name):
            raise Refused(400, "policy_file: expected a file name (letters, digits, . _ -) next to the served policy")
        folder = self.config.policy().files[0].parent
        try:
            dfd = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
            finally:
                os.close(dfd)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise Refused(400, f"policy_file: {name} in {folder} is not a regular file")
        except OSError as exc:
            raise Refused(404, f"policy_file: {name} in {folder}: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_DRAFT + 1)
        if len(data) > MAX_DRAFT:
            raise Refused(413, f"policy_file: over {MAX_DRAFT} bytes")
        return data.decode("utf-8", "replace")

    def approvals(self) -> dict[str, Any]:
        if self.inbox is None:
            return {"approvals": [], "note": "this server's asks are not answered through the approvals queue"}
        policy = self.config.policy()
        now = time.time()
        shown = []
        pending = self.inbox.pending()
        with self._cards_lock:
            for r in pending:
                row = _pending(r, policy, now)
                if r.get("host"):  # the fleet's: which gateway asks
                    row["host"] = escaped(str(r["host"]))
                key = (r["call_id"], str(r.get("digest")), policy.sha256)
                made = self._cards.get(key)
                if made is None or not made["recorded"]:  # made once per call: it analyses the command
                    try:
                        paths = cards.jail_paths(policy, r)
                        made = cards.card(r, self.calls.ask(r["call_id"]), policy, paths)
                    except Exception as exc:  # the call is still shown whole, and can be answered
                        made = cards.unknown(f"{type(exc).__name__}: {exc}")
                    self._cards[key] = made
                row["card"] = made
                shown.append(row)
            waiting = {r["call_id"] for r in pending}
            for key in [k for k in self._cards if k[0] not in waiting]:
                del self._cards[key]
        return {"approvals": shown}

    async def _answer(self, request: Request, who: Who, call_id: str, approved: bool) -> Response:
        body = await self._json_body(request)
        reason = body.get("reason", "")
        scope = body.get("scope", "once")
        if not isinstance(reason, str) or len(reason) > MAX_REASON:
            raise Refused(400, f"reason: expected a string of at most {MAX_REASON} characters")
        if scope not in approval_queue.SCOPES or (scope == "session" and not approved):
            raise Refused(400, "scope: expected 'once' or, to approve, 'session'")
        shown = body.get("digest")
        if shown is not None and (not isinstance(shown, str) or not 0 < len(shown) <= 128):
            raise Refused(400, "digest: expected the digest of the request shown (from GET approvals)")
        inbox = self.inbox
        if inbox is None:
            raise Refused(409, "this server's asks are not answered through the approvals queue")
        pending = {r["call_id"]: r for r in await run_in_threadpool(inbox.pending)}
        if not CALL_ID.fullmatch(call_id) or call_id not in pending:  # never a path from the URL
            raise Refused(404, f"no pending request {escaped(call_id)!r} (answered, withdrawn or expired?)")
        record = {"supervisor": who.supervisor, "token": who.token_id, "via": who.via,
                  "approved": approved, "scope": scope, **({"reason": reason} if reason else {})}  # fmt: skip
        req = pending[call_id]
        about = {"call_id": call_id, "principal": req.get("principal"), "tool": req.get("tool")}
        if req.get("host"):  # the fleet's: the gateway that asked
            record["host"] = req["host"]

        def recorded(given: dict[str, Any]) -> None:
            # called by the queue only for the answer that won the claim, before it is given
            self.config.audit.append("supervisor_answer", **about, data={**record, "digest": given.get("digest")})

        try:
            done = await run_in_threadpool(lambda: inbox.answer(
                who.supervisor, who.secret, call_id, approved, reason, scope, shown, recorded))  # fmt: skip
        except AuditUnavailable as exc:
            raise Refused(503, f"the answer could not be recorded, so it was not given: {exc}") from None
        except StoreError as exc:  # the fleet's: the store failed on the way (its commit unconfirmed)
            raise Refused(503, f"the store did not confirm the answer ({exc}): see gateway approvals show "
                               f"--store ... {call_id}") from None  # fmt: skip
        except AnswerRefused as exc:
            # another answer took (a terminal's, another console's) or the request went: this
            # attempt is recorded as one that did not take, never as an answer
            lost = {**record, "why": str(exc)}
            with contextlib.suppress(AuditUnavailable):
                await run_in_threadpool(
                    lambda: self.config.audit.append("supervisor_answer_refused", **about, data=lost)
                )
            raise Refused(409, str(exc)) from None
        self.feed.publish({"kind": "answered", "call_id": call_id})
        return _json({"call_id": call_id, "approved": done["approved"], "by": done["by"], "scope": scope,
                      **({"reason": reason} if reason else {})})  # fmt: skip

    def _audit(self, params: dict[str, str]) -> dict[str, Any]:
        known = {*FILTERS, "since", "until", "text", "limit", "before_seq"}
        unknown = sorted(set(params) - known)
        if unknown:
            raise Refused(400, f"unknown filter {unknown[0]!r}: expected one of {', '.join(sorted(known))}")
        try:
            limit = int(params.get("limit", AUDIT_LIMIT_DEFAULT))
            before = int(params["before_seq"]) if params.get("before_seq") else None
        except ValueError:
            raise Refused(400, "limit, before_seq: expected whole numbers") from None
        if not 1 <= limit <= AUDIT_LIMIT_MAX:
            raise Refused(400, f"limit: expected 1 to {AUDIT_LIMIT_MAX}, got {limit}")
        filters = {k: v for k, v in params.items() if k not in ("limit", "before_seq") and v}
        try:
            found = self.view.query(filters, limit, before)
        except TimeSpecError as exc:
            raise Refused(400, str(exc)) from None
        items = [{"record": r, "summary": describe_record(r)} for r in found.pop("records")]
        return {"items": items, **found}

    def _calls(self, params: dict[str, str]) -> dict[str, Any]:
        """`GET calls`: one row per call (gateway/audit/calls.py, as `gateway audit calls`),
        newest first, with the timeline's filters; `before_seq` pages (a call's `first_seq`)."""
        chosen, limit, before = self._filters(params)
        texts = self.calls.text_calls(chosen) if chosen.text is not None else None
        found = self.calls.calls(chosen, limit, before, texts)
        return {"calls": [cards.call_row(c) for c in found.pop("calls")], **found}

    def _filters(self, params: dict[str, str]) -> tuple[Selection, int, int | None]:
        known = {*FILTERS, "since", "until", "text", "limit", "before_seq"}
        unknown = sorted(set(params) - known)
        if unknown:
            raise Refused(400, f"unknown filter {unknown[0]!r}: expected one of {', '.join(sorted(known))}")
        try:
            limit = int(params.get("limit", AUDIT_LIMIT_DEFAULT))
            before = int(params["before_seq"]) if params.get("before_seq") else None
        except ValueError:
            raise Refused(400, "limit, before_seq: expected whole numbers") from None
        if not 1 <= limit <= AUDIT_LIMIT_MAX:
            raise Refused(400, f"limit: expected 1 to {AUDIT_LIMIT_MAX}, got {limit}")
        f = {k: v for k, v in params.items() if v}
        try:
            chosen = Selection.of(
                since=f.get("since"), until=f.get("until"), events=[f.get("event", "")],
                call_ids=[f.get("call_id", "")], principal=f.get("principal"), tool=f.get("tool"),
                decision=f.get("decision"), rule=f.get("rule"), host=f.get("host"), text=f.get("text"),
            )  # fmt: skip
        except TimeSpecError as exc:
            raise Refused(400, str(exc)) from None
        return chosen, limit, before

    def _overview(self, params: dict[str, str]) -> dict[str, Any]:
        """`GET overview?since=&until=`: the ledger counted (gateway/audit/overview.py); by
        default the last 24 hours."""
        unknown = sorted(set(params) - {"since", "until"})
        if unknown:
            raise Refused(400, f"unknown parameter {unknown[0]!r}: expected since, until")
        now = datetime.now(UTC)
        try:
            until = parse_time(params["until"], "until", now) if params.get("until") else now
            since = parse_time(params["since"], "since", now) if params.get("since") else until - timedelta(days=1)
        except TimeSpecError as exc:
            raise Refused(400, str(exc)) from None
        if not since < until:
            raise Refused(400, "since: expected a time before until")
        if until - since > timedelta(days=MAX_OVERVIEW_DAYS):
            raise Refused(400, f"since, until: at most {MAX_OVERVIEW_DAYS} days at once")
        counted = overview(self.calls.all_calls(), since, until)
        return {**cards.overview_shown(counted), "dropped": self.calls.dropped}

    def _still_signed_in(self, who: Who) -> bool:
        """Is the one who opened a stream still allowed to read it (secret not revoked, session
        not ended)? Checked before each event: a stream outlives no sign-out or revocation."""
        if self.config.tokens.current(who.token_id) is None:
            if who.session_id:
                self.sessions.end_for(who.token_id)
            return False
        return not who.session_id or self.sessions.get(who.session_id) is not None

    def _events(self, who: Who) -> Response:
        queue = self.feed.subscribe(self.config.max_streams)
        if queue is None:
            raise Refused(503, f"{self.config.max_streams} event streams are open already (the console's limit)")

        async def stream() -> AsyncIterator[ServerSentEvent]:
            try:
                yield ServerSentEvent(json.dumps({"kind": "hello"}), event="hello")
                while True:
                    event = await queue.get()
                    if event is END or not await run_in_threadpool(self._still_signed_in, who):
                        return
                    yield ServerSentEvent(json.dumps(event), event=str(event["kind"]))
            except asyncio.CancelledError:
                raise
            finally:
                self.feed.unsubscribe(queue)

        return EventSourceResponse(stream(), ping=PING_S, headers={"Cache-Control": "no-store"})


def _pending(r: dict[str, Any], policy: CompiledPolicy, now: float) -> dict[str, Any]:
    """One pending request as the inbox shows it: the whole command (escaped, never cut), the
    environment it runs with, the rules asking and why."""
    inherited: dict[str, Any] = r["inherited"] if isinstance(r.get("inherited"), dict) else {}
    own: dict[str, Any] = r["env"] if isinstance(r.get("env"), dict) else {}
    env = []
    for name in sorted({**inherited, **own}):
        value = str(own[name] if name in own else inherited[name])
        secret = bool(SECRET_NAME.search(name))
        env.append({"name": escaped(name), "value": f"[secret: {len(value)} chars]" if secret else escaped(value),
                    "from": "call" if name in own else "stored", "overrides": name in own and name in inherited,
                    "secret": secret})  # fmt: skip
    asking = []
    for rule_id in r.get("asking") or [r.get("rule")]:
        rule = policy.rules.get(rule_id) if isinstance(rule_id, str) else None
        asking.append({"rule": rule_id, "justification": rule.justification if rule else None})
    command = str(r.get("command", ""))
    out = {
        "call_id": r["call_id"],
        "principal": escaped(str(r.get("principal", ""))),
        "tool": escaped(str(r.get("tool", ""))),
        "command": escaped(command),
        "command_chars": len(command),
        "cwd": escaped(str(r.get("cwd", ""))),
        "env": env,
        "rule": r.get("rule"),
        "asking": asking,
        "reason": escaped(str(r.get("reason", ""))),
        "digest": r.get("digest"),
        "created": r.get("created"),
        "expires": r.get("expires"),
        "seconds_left": max(0, int(float(r.get("expires", now)) - now)),
    }
    files = r.get("files")
    if isinstance(files, list):
        out["files"] = [_file_shown(f) for f in files if isinstance(f, dict)]
    return out


def _file_shown(f: dict[str, Any]) -> dict[str, Any]:
    """A file the asked command runs as the inbox shows it, like `approvals show`: what runs it,
    its digest and size, or why it cannot be bound (then the approval is void), and its first
    lines, escaped line by line."""
    head = str(f.get("head") or "")
    shown: dict[str, Any] = {"path": escaped(str(f.get("path", ""))), "sha256": str(f.get("sha256", "")),
                             "why": escaped(str(f.get("why", ""))), "bytes": f.get("bytes")}  # fmt: skip
    if f.get("kind") not in (None, "file"):
        shown["kind"] = str(f["kind"])
    if f.get("error"):
        shown["error"] = escaped(str(f["error"]))
    elif f.get("sha256") is None:
        shown["absent"] = True
    if head:
        lines = head.split("\n")
        shown["head"] = [escaped(line) for line in lines[:HEAD_LINES]]
        whole = isinstance(f.get("bytes"), int) and len(head.encode()) >= f["bytes"]
        shown["head_complete"] = len(lines) <= HEAD_LINES and whole
    return shown
