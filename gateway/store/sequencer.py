"""The sequencer: one gateway of the fleet, elected by a PostgreSQL advisory lock, folds the head
of every stream into a signed checkpoint, every `interval` (100 ms) while records come in.

Checkpoint n (a row of `agw.checkpoint`, its body canonical JSON, as records are):

    n       1, 2, 3 ...
    ts      when it was made (UTC ISO 8601)
    prev    the hash of checkpoint n-1 ("" for the first)
    heads   {stream: [seq, hash]}: every stream's last record when it was made
    records how many records the heads cover (the sum of their seqs)
    key     the signer's public key (`ed25519 BASE64`); `sig` its Ed25519 signature of `hash`
    hash    SHA-256 of the body without `hash` and `sig`

Any gateway run with `--store` may be the sequencer: each tries the lock on a connection of its
own; the one that holds it folds, the others try again every second, so when the leader dies its
connection (and the lock) goes with it and another takes over. Before signing, the leader checks
the last checkpoint against the ledger (every head it named is still there, with its hash); a
ledger that went back on a checkpoint is never signed over: the sequencer stops folding and
says so. The decision path never waits on it: appends go on whatever it does.

`check_checkpoints` (used by `verify_store`) checks the chain of checkpoints, their signatures,
and every stream against every checkpoint: a stream shorter than a checkpoint saw it, or whose
record differs, was cut short or rewritten.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg

from gateway.audit.keys import SigningKey, VerifyKey
from gateway.audit.records import canonical
from gateway.store import db

LOCK = 0x61677702
"""The advisory lock (session-scoped) whoever sequences holds."""
INTERVAL_S = 0.1
RETRY_S = 1.0

_HEADS = (
    "SELECT s.stream, r.seq, r.hash FROM agw.stream s CROSS JOIN LATERAL "
    "(SELECT seq, hash FROM agw.record WHERE stream = s.stream ORDER BY seq DESC LIMIT 1) r"
)


class CheckpointConflict(Exception):
    """The ledger no longer holds what the last checkpoint saw: the sequencer will not sign."""


def checkpoint_hash(body: dict[str, Any]) -> str:
    return hashlib.sha256(canonical({k: v for k, v in body.items() if k not in ("hash", "sig")}).encode()).hexdigest()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def latest(conn: psycopg.Connection[Any]) -> dict[str, Any] | None:
    """The newest checkpoint's body, or None."""
    row = conn.execute("SELECT body FROM agw.checkpoint ORDER BY n DESC LIMIT 1").fetchone()
    if row is None:
        return None
    found: dict[str, Any] = json.loads(row[0])
    return found


def _missing(conn: psycopg.Connection[Any], heads: dict[str, list[Any]]) -> list[str]:
    """Streams whose record at the seq `heads` names is gone or is another record."""
    if not heads:
        return []
    names = list(heads)
    rows = conn.execute(
        "SELECT r.stream, r.hash FROM agw.record r JOIN unnest(%s::text[], %s::bigint[]) AS h(stream, seq) "
        "ON r.stream = h.stream AND r.seq = h.seq",
        (names, [int(heads[n][0]) for n in names]),
    ).fetchall()
    found = dict(rows)
    return [n for n in names if found.get(n) != heads[n][1]]


def fold(conn: psycopg.Connection[Any], key: SigningKey) -> dict[str, Any] | None:
    """Write checkpoint n+1 if a stream moved since checkpoint n; return it (None: nothing new).
    Raises CheckpointConflict when the ledger went back on checkpoint n."""
    last = latest(conn)
    heads = {str(s): [int(q), str(h)] for s, q, h in conn.execute(_HEADS).fetchall()}
    if last is not None and last.get("heads") == heads:
        return None
    if last is not None:
        gone = _missing(conn, last.get("heads") or {})
        if gone:
            raise CheckpointConflict(
                f"checkpoint {last.get('n')} saw streams the ledger no longer holds as they were: {', '.join(gone[:5])}"
            )
    body: dict[str, Any] = {
        "n": int(last["n"]) + 1 if last else 1,
        "ts": _now(),
        "prev": str(last["hash"]) if last else "",
        "heads": heads,
        "records": sum(q for q, _ in heads.values()),
        "key": key.public.line().strip(),
    }
    body["hash"] = checkpoint_hash(body)
    body["sig"] = key.sign(body["hash"])
    conn.execute(
        "INSERT INTO agw.checkpoint (n, hash, body) VALUES (%s, %s, %s)", (body["n"], body["hash"], canonical(body))
    )
    return body


class Sequencer:
    """The thread that competes for the sequencer's lock and, while it holds it, folds. `on_alarm`
    hears a conflict (the ledger went back on a checkpoint) once per change."""

    def __init__(self, store: db.Store, key: SigningKey, interval: float = INTERVAL_S, retry: float = RETRY_S) -> None:
        self.store = store
        self.key = key
        self.interval = interval
        self.retry = retry
        self.leading = False
        self.alarm: str | None = None
        self.on_alarm: Callable[[str], None] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="agw-sequencer", daemon=True)

    def start(self) -> Sequencer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.is_set():
            conn: psycopg.Connection[Any] | None = None
            try:
                conn = self.store.connect()
                while not self._stop.is_set():
                    row = conn.execute("SELECT pg_try_advisory_lock(%s)", (LOCK,)).fetchone()
                    if row and row[0]:
                        self.leading = True
                        self._lead(conn)
                    self._stop.wait(self.retry)
            except (db.StoreError, psycopg.Error):
                pass  # the store is away: try again (appends fail closed on their own)
            finally:
                self.leading = False
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
            self._stop.wait(self.retry)

    def _lead(self, conn: psycopg.Connection[Any]) -> None:
        while not self._stop.is_set():
            try:
                fold(conn, self.key)
                self.alarm = None
            except CheckpointConflict as exc:
                if str(exc) != self.alarm and self.on_alarm is not None:
                    with contextlib.suppress(Exception):
                        self.on_alarm(str(exc))
                self.alarm = str(exc)
            self._stop.wait(self.interval)


def check_checkpoints(
    conn: psycopg.Connection[Any],
    hashes: dict[str, dict[int, str]],
    keys: list[VerifyKey],
    kept: list[dict[str, Any]],
    problems: list[str],
) -> int:
    """Check the chain of checkpoints and every stream (`hashes`: stream -> seq -> hash, as read
    by the verifier) against each; `kept`: checkpoints a reviewer kept outside the store, which
    must still be there. Appends what is wrong to `problems`; returns how many were read."""
    prev, expected, count = "", 1, 0
    pinned = {k.raw for k in keys}
    cut: set[str] = set()
    seen: dict[int, str] = {}
    for n, hash_, text in conn.execute("SELECT n, hash, body FROM agw.checkpoint ORDER BY n"):
        count += 1
        at = f"checkpoint {n}"
        if n != expected:
            problems.append(f"{at}: expected checkpoint {expected}: checkpoints {expected}..{n - 1} are missing")
        expected = n + 1
        try:
            body = json.loads(text)
        except ValueError:
            problems.append(f"{at}: not JSON (edited)")
            continue
        if (
            not isinstance(body, dict)
            or canonical(body) != text
            or checkpoint_hash(body) != body.get("hash")
            or hash_ != body.get("hash")
            or body.get("n") != n
        ):
            problems.append(f"{at}: does not match its hash (edited)")
            continue
        if body.get("prev") != prev:
            problems.append(f"{at}: does not link to checkpoint {n - 1} (removed or rewritten)")
        prev = hash_
        seen[n] = hash_
        key: VerifyKey | None = None
        with contextlib.suppress(Exception):
            key = VerifyKey.from_line(str(body.get("key")), at)
        if key is None or (pinned and key.raw not in pinned):
            problems.append(f"{at}: signed with a key you did not pin (--key)")
        elif not key.verify(hash_, str(body.get("sig"))):
            problems.append(f"{at}: the signature does not verify (forged)")
        for stream, head in (body.get("heads") or {}).items():
            if stream in cut or not isinstance(head, list) or len(head) != 2:
                continue
            if hashes.get(stream, {}).get(int(head[0])) != head[1]:
                cut.add(stream)
                problems.append(
                    f"stream {stream}: checkpoint {n} saw it at seq {head[0]}, and that record is not there as it "
                    "was (cut short or rewritten)"
                )
    for k in kept:
        n = k.get("n")
        if not isinstance(n, int) or seen.get(n) != k.get("hash"):
            what = (
                "is not in the store (rolled back)" if isinstance(n, int) and n not in seen else "differs (rewritten)"
            )
            problems.append(f"checkpoint {n} you kept {what}")
    return count
