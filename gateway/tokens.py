"""Bearer tokens for HTTP clients: each maps to one principal of the policy.

The tokens file holds only SHA-256 digests (a token is 256 random bits, so a plain digest cannot
be reversed or guessed), is written atomically with mode 0600, and is re-read when it changes,
so `gateway token create` and `gateway token revoke` apply to a running server. A token is
shown once, when it is created.

    {"version": 1, "tokens": [{"id": "t-1a2b3c4d", "principal": "agent", "sha256": "...",
                               "created": "2026-11-22T10:00:00+00:00", "label": "quickstart"}],
     "supervisors": [{"id": "s-5e6f7a8b", "principal": "alice", "sha256": "...", "created": "...",
                      "label": ""}]}

Supervisor secrets (`gateway token create --supervisor NAME`, the web console's credentials)
live in their own list, apart from agent tokens: an agent-token lookup (`lookup`) never sees
them, so a supervisor secret never authenticates MCP, whatever its name; a console lookup
(`lookup_supervisor`) never sees agent tokens. A gateway from before supervisors ignores the
list (fail closed). Their secrets begin `agws_`, agents' `agw_`, so a person can tell them apart.

Metrics tokens (`gateway token create --metrics NAME`, a scraper's: `agwm_...`, in `"metrics"`)
read `/metrics` and nothing else: no lookup but `lookup_metrics` sees them.

A shared value (it imports nothing of the gateway): the server and the console look tokens up
here, and the fleet's store keeps them as rows through the same `TokenStore`
(gateway/store/tokens.py).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import tempfile
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

PREFIX = "agw_"
SUPERVISOR_PREFIX = "agws_"
METRICS_PREFIX = "agwm_"
AGENT, SUPERVISOR, METRICS = "agent", "supervisor", "metrics"
LISTS = {AGENT: "tokens", SUPERVISOR: "supervisors", METRICS: "metrics"}
PREFIXES = {AGENT: (PREFIX, "t-"), SUPERVISOR: (SUPERVISOR_PREFIX, "s-"), METRICS: (METRICS_PREFIX, "m-")}


class TokenError(Exception):
    """The tokens file cannot be read or written; the message names the file and the field."""


@dataclass(frozen=True)
class TokenEntry:
    id: str
    principal: str
    sha256: str
    created: str
    label: str
    kind: str = AGENT
    """`agent` (an MCP client acting as `principal`), `supervisor` (a person named `principal`
    answering asks and reading the log in the console) or `metrics` (a scraper of /metrics)."""


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def load(path: Path) -> list[TokenEntry]:
    """The entries of a tokens file, agents' then supervisors' (none if it does not exist).
    Raises TokenError on a bad file."""
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise TokenError(f"{path}: {exc.strerror}") from None
    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("version") != 1 or not isinstance(data.get("tokens"), list):
            raise ValueError('expected {"version": 1, "tokens": [...]}')
        for extra in ("supervisors", "metrics"):
            if not isinstance(data.get(extra, []), list):
                raise ValueError(f'{extra}: expected a list, like "tokens"')
        out = []
        for kind, key in LISTS.items():
            for n, item in enumerate(data.get(key, [])):
                try:
                    out.append(
                        TokenEntry(
                            str(item["id"]),
                            str(item["principal"]),
                            str(item["sha256"]),
                            str(item.get("created", "")),
                            str(item.get("label", "")),
                            kind,
                        )
                    )
                except (KeyError, TypeError) as exc:
                    raise ValueError(f"{key}[{n}]: missing field {exc}") from None
        return out
    except ValueError as exc:
        raise TokenError(f"{path}: {exc}") from None


def _save(path: Path, entries: list[TokenEntry]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    body: dict[str, Any] = {"version": 1}
    for kind, key in LISTS.items():
        mine = [{k: v for k, v in e.__dict__.items() if k != "kind"} for e in entries if e.kind == kind]
        if mine or kind == AGENT:
            body[key] = mine
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tokens.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o600)
            json.dump(body, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def create(
    path: Path, principal: str, label: str = "", replace_label: bool = False, kind: str = AGENT
) -> tuple[str, TokenEntry]:
    """Make a token for `principal` (an agent's, or with `kind` SUPERVISOR a supervisor's secret
    for the person named `principal`); returns (the token, its entry). `replace_label` first
    revokes the principal's tokens of that kind with the same label."""
    if kind not in LISTS:
        raise TokenError(f"{path}: kind {kind!r}: expected one of {sorted(LISTS)}")
    if not principal or any(not ch.isprintable() for ch in principal) or len(principal) > 64:
        raise TokenError(f"{path}: name {principal!r}: expected 1 to 64 printable characters")
    entries = load(path)
    if replace_label:
        entries = [e for e in entries if not (e.kind == kind and e.principal == principal and e.label == label)]
    token = PREFIXES[kind][0] + secrets.token_urlsafe(32)
    entry = TokenEntry(
        PREFIXES[kind][1] + secrets.token_hex(4), principal, digest(token),
        datetime.now(UTC).isoformat(timespec="seconds"), label, kind,
    )  # fmt: skip
    _save(path, [*entries, entry])
    return token, entry


QUICKSTART = "quickstart"


def quickstart(path: Path, principal: str) -> tuple[str | None, TokenEntry]:
    """The quickstart token of `principal`: the one made by an earlier start if it is still
    there (returned as (None, its entry): only its hash is kept, the token was shown when it
    was made), else a new one (the token, its entry). A restart keeps the clients connected."""
    for entry in reversed(load(path)):
        if entry.kind == AGENT and entry.principal == principal and entry.label == QUICKSTART:
            return None, entry
    return create(path, principal, QUICKSTART)


def revoke(path: Path, token_id: str) -> TokenEntry:
    entries = load(path)
    gone = [e for e in entries if e.id == token_id]
    if not gone:
        raise TokenError(f"{path}: no token {token_id!r} (see: gateway token list)")
    _save(path, [e for e in entries if e.id != token_id])
    return gone[0]


class TokenStore:
    """Looks tokens up, re-reading the file when it changes. A file that turns bad keeps no
    token valid (fail closed) until it is fixed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._entries: list[TokenEntry] = []
        self.error: str | None = None
        self._refresh()

    def _refresh(self) -> None:
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            stamp = (0, 0, 0)
        if stamp == self._stamp:
            return
        try:
            self._entries, self.error = load(self.path), None
        except TokenError as exc:
            self._entries, self.error = [], str(exc)
        self._stamp = stamp

    def lookup(self, token: str) -> TokenEntry | None:
        """The agent token `token` is (never a supervisor's secret)."""
        return self._find(token, AGENT)

    def lookup_supervisor(self, token: str) -> TokenEntry | None:
        """The supervisor whose secret `token` is (never an agent token)."""
        return self._find(token, SUPERVISOR)

    def lookup_metrics(self, token: str) -> TokenEntry | None:
        """The scraper whose metrics token `token` is (never an agent's or a supervisor's)."""
        return self._find(token, METRICS)

    def kind_of(self, token: str) -> str | None:
        """Which kind of credential `token` is, if any (to answer an agent token 403, not 401)."""
        found = self._find(token, AGENT) or self._find(token, SUPERVISOR)
        return found.kind if found else None

    def current(self, token_id: str) -> TokenEntry | None:
        """The entry with this id if it is still in the file (a revoked secret ends its sessions)."""
        with self._lock:
            self._refresh()
            return next((e for e in self._entries if e.id == token_id), None)

    def _find(self, token: str, kind: str) -> TokenEntry | None:
        wanted = digest(token)
        with self._lock:
            self._refresh()
            entries = [e for e in self._entries if e.kind == kind]
        found = None
        for e in entries:  # compare every entry, in constant time each
            if hmac.compare_digest(e.sha256, wanted):
                found = e
        return found
