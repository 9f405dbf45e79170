"""The fleet's ledger in the store: one hash chain per gateway process (a stream).

A stream has one writer, the process that opened it, which keeps its end (seq, hash) in memory:
an append is one INSERT of the record the file log would write (gateway/audit/records.py: the
same canonical JSON, hash and chain rules, plus `stream`), committed before `append` returns.
Threads of one process commit together (one transaction for all the records queued while the
last commit ran). `PRIMARY KEY (stream, seq)` refuses a second writer: a fork stops the stream.

A stream starts with `stream_started`, naming the host's stream before it and the record that
stream had reached (under an advisory lock per host, so a host's streams form one sequence,
each naming the one started just before it). A record whose commit went unanswered (the
connection dropped) is never assumed lost or kept: before its next append the writer reads its
stream's end back; a record that did land is voided on the record (`audit_voided`: its call was
denied and did not run), anything else there is a fork and stops the stream.

`verify_store` checks every stream: each row's record is canonical, hashes to its `hash`, names
its stream and seq, links to the record before it, seqs run 1, 2, 3 without a gap; signatures
(each commit's last record is signed with the host's key) verify; every host's streams link in
order; every stream holds at least what the newest signed checkpoint saw it hold
(sequencer.py), so a stream cut short shows.

With a spool (`spool`: spool.py, opt-in per host), a commit the store does not answer puts the
batch in the stream's spool file instead, and the append succeeds; while the spool holds records
every append goes there. `forward` inserts a spool's records in order once the store answers
(at the next append once a probe saw the store back, and from a thread every second), verified
first: a record already in the store with the same hash is that record (skipped), a different one
is a fork, and a spool that fails verification is not inserted at all: both stop the stream.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from gateway.audit import journal
from gateway.audit.keys import SigningKey, VerifyKey
from gateway.audit.records import SECRET_NAME, AuditUnavailable, canonical, digest
from gateway.audit.sink import AuditSink
from gateway.audit.writer import mark_written, open_signed, prepare
from gateway.log import log
from gateway.store import db, sequencer
from gateway.store import spool as spooling
from gateway.store.commitwatch import COMMIT_TIMEOUT_S, CommitWatch, Cut

STREAM_STARTED = "stream_started"
VOIDED = "audit_voided"
_HOST_LOCK = 0x6167  # advisory lock namespace (with hashtext(host)): one stream starts at a time per host
_LAST = "SELECT seq, hash FROM agw.record WHERE stream = %s ORDER BY seq DESC LIMIT 1"
_INSERT = "INSERT INTO agw.record (stream, seq, hash, body) VALUES (%s, %s, %s, %s)"
_FORWARD_EVERY_S = 1.0
_CHUNK = 500  # records a statement of the forwarder inserts


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


class CommitCut(db.StoreUnavailable):
    """A commit the watch cut (commitwatch.py): `backend` holds it until it is ended, and its
    records are neither visible nor gone until then."""

    def __init__(self, message: str, backend: int) -> None:
        super().__init__(message)
        self.backend = backend


@dataclass
class _Pending:
    event: str
    body: dict[str, Any]
    record: dict[str, Any] | None = None
    error: AuditUnavailable | None = None

    @property
    def settled(self) -> bool:
        return self.record is not None or self.error is not None


class StoreLedger:
    """The audit sink of a gateway run with `--store` (gateway/audit/sink.py). `directory` is
    this host's local directory for the ledger (hidden from every sandbox as the file log is);
    `key` signs each commit's last record; `host` names this machine in the fleet."""

    def __init__(
        self,
        store: db.Store,
        directory: Path,
        redact: list[str] | None = None,
        *,
        key: SigningKey | None = None,
        host: str | None = None,
        sequence: bool = False,
        spool: Path | None = None,
        spool_max: int = spooling.DEFAULT_MAX,
        commit_timeout: float = COMMIT_TIMEOUT_S,
    ) -> None:
        self.store = store
        self._watch = CommitWatch(commit_timeout)
        """Cuts a commit's connection left unanswered past `commit_timeout` (commitwatch.py)."""
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.secret_names = re.compile("|".join([SECRET_NAME.pattern, *(redact or [])]), re.IGNORECASE)
        self.key = key
        self.checkpoint: Path | None = None  # its checkpoints are rows of the store (sequencer.py)
        self.host = host or socket.gethostname()
        self.stream = f"{self.host}:{os.getpid()}:{secrets.token_hex(4)}"
        self.on_health: Callable[[str | None], None] | None = None
        self._cond = threading.Condition()
        self._queue: list[_Pending] = []
        self._committing = False
        self._failing = False
        self._seq = 0
        self._prev = ""
        self._sent: dict[int, str] = {}
        """Records of a commit whose outcome is unknown (seq -> hash): read back before going on."""
        self._stuck: int | None = None
        """The backend of a commit the watch cut: ended before the stream's end is read back."""
        self._broken: str | None = None
        """Why this stream takes no more records (a fork): every append is refused."""
        self.spool = spooling.Spool(spool, self.stream, spool_max) if spool is not None else None
        """`--store-spool`: where a batch the store does not take goes (spool.py); None: refused."""
        self._reachable = True
        """Whether the store answered the last probe (an append forwards the spool only then)."""
        self._stop = threading.Event()
        try:
            db.require_current(store)
            if spool is not None:  # an earlier gateway's spool first: its records come before this stream
                self._forward_orphans(Path(spool))
            self._start()
        except db.StoreError as exc:
            self._watch.close()
            raise AuditUnavailable(str(exc)) from exc
        except BaseException:
            self._watch.close()
            raise
        if self.spool is not None:
            threading.Thread(target=self._forwarder, name="agw-spool", daemon=True).start()
        self.sequencer: sequencer.Sequencer | None = None
        """`sequence`: this gateway competes to be the fleet's sequencer (sequencer.py)."""
        if sequence and key is not None:
            self.sequencer = sequencer.Sequencer(store, key).start()

    # --- the stream's start ----------------------------------------------------------------
    def _start(self) -> None:
        """Open this process's stream (its first record names the host's previous one), in one
        transaction, bounded as every commit is: unanswered past the bound, the gateway does not
        start, and says why."""
        cut: Cut | None = None
        backend = 0
        try:
            with self.store.connection() as conn, self._watch.watching(conn) as cut, conn.transaction():
                backend = conn.info.backend_pid
                made = self._open_stream(conn)
        except db.StoreUnavailable as exc:
            if cut is not None and cut.cut:
                self._end_quietly(backend)
                raise db.StoreUnavailable(
                    f"the store {self.store.name} did not answer the start of this gateway's stream within "
                    f"{self._watch.bound_s:g} s (--store-commit-timeout; a synchronous standby that stopped "
                    "answering holds every commit)"
                ) from exc
            raise
        self._advance(made)

    def _open_stream(self, conn: psycopg.Connection[Any]) -> list[tuple[int, str, str]]:
        conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_HOST_LOCK, self.host))
        row = conn.execute(
            "SELECT s.stream, r.seq, r.hash FROM agw.stream s LEFT JOIN LATERAL "
            "(SELECT seq, hash FROM agw.record WHERE stream = s.stream ORDER BY seq DESC LIMIT 1) r ON true "
            "WHERE s.host = %s ORDER BY s.n DESC LIMIT 1",
            (self.host,),
        ).fetchone()
        previous = {"stream": row[0], "seq": row[1] or 0, "hash": row[2] or ""} if row else None
        dead = _dead_streams(conn, self.host)
        conn.execute("INSERT INTO agw.stream (stream, host, pid) VALUES (%s, %s, %s)",
                     (self.stream, self.host, os.getpid()))  # fmt: skip
        data: dict[str, Any] = {"host": self.host, "pid": os.getpid(), "previous": previous}
        if self.key is not None:
            data["key"] = self.key.public.line().strip()
        if dead:
            data["closed"] = [stream for stream, _ in dead]
        marks = [m for stream, pid in dead for m in _interrupted(conn, stream, pid)]
        made = self._made([_Pending(STREAM_STARTED, {"data": data}), *marks])
        for seq, hash_, body in made:
            conn.execute(_INSERT, (self.stream, seq, hash_, body))
        return made

    # --- appending --------------------------------------------------------------------------
    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        """Write one record to this process's stream, committed, and return it. Raises
        AuditUnavailable (naming the store) when it cannot be: the caller denies."""
        if "stream" in fields:
            raise AuditUnavailable("audit field 'stream' is the store ledger's own")
        body, _ = prepare(fields, self.secret_names)
        pending = _Pending(event, body)
        with self._cond:
            self._queue.append(pending)
            while not pending.settled:
                if self._committing:
                    self._cond.wait()
                    continue
                self._committing = True
                batch, self._queue = self._queue, []
                self._cond.release()
                try:
                    self._commit(batch)
                finally:
                    self._cond.acquire()
                    self._committing = False
                    self._cond.notify_all()
        self._health(pending.error)
        if pending.error is not None:
            raise pending.error
        assert pending.record is not None
        call_id = fields.get("call_id")
        if isinstance(call_id, str):
            mark_written(call_id)
        return pending.record

    def _health(self, error: AuditUnavailable | None) -> None:
        with self._cond:
            changed = (error is not None) != self._failing
            self._failing = error is not None
        if changed and self.on_health is not None:
            with contextlib.suppress(Exception):
                self.on_health(None if error is None else str(error))

    def _made(self, batch: list[_Pending]) -> list[tuple[int, str, str]]:
        """The batch as chained records after this stream's end: (seq, hash, canonical body)."""
        seq, prev = self._seq, self._prev
        out = []
        for i, p in enumerate(batch):
            record = {"seq": seq + 1, "ts": _now(), "event": p.event, **p.body, "stream": self.stream, "prev": prev}
            record["hash"] = digest(record)
            if self.key is not None and i == len(batch) - 1:
                record["sig"] = self.key.sign(record["hash"])
            seq, prev = record["seq"], record["hash"]
            out.append((seq, prev, canonical(record)))
            p.body = record  # kept for the caller once committed
        return out

    def _advance(self, made: list[tuple[int, str, str]]) -> None:
        if made:
            self._seq, self._prev = made[-1][0], made[-1][1]

    def _commit(self, batch: list[_Pending]) -> None:
        try:
            if self._broken is not None:
                raise AuditUnavailable(self._broken)
            if self._sent:
                self._settle_unknown(batch)
            if self.spool is not None and self.spool.holding and self._reachable:
                with contextlib.suppress(db.StoreUnavailable):  # still away: the batch joins the spool
                    self._forward_own()
            made = self._made(batch)
            if self.spool is not None and self.spool.holding:  # the chain's order: after what it holds
                self.spool.write([body for _, _, body in made])
            else:
                self._insert(made)
            self._advance(made)
            for p in batch:
                p.record = p.body
        except (AuditUnavailable, db.StoreError) as exc:  # (reading the stream's end back can fail too)
            error = exc if isinstance(exc, AuditUnavailable) else AuditUnavailable(f"{exc} (nothing runs unrecorded)")
            for p in batch:
                if not p.settled:
                    p.error = error
        except BaseException as exc:  # a bug: every caller still gets an answer, and denies
            for p in batch:
                if not p.settled:
                    p.error = AuditUnavailable(f"internal error in the store ledger: {exc!r}")
            if not isinstance(exc, Exception):
                raise

    def _insert(self, made: list[tuple[int, str, str]]) -> None:
        # one statement for the whole batch, in autocommit: one round trip, all or nothing
        sql = _INSERT + ", (%s, %s, %s, %s)" * (len(made) - 1)
        params = [x for seq, hash_, body in made for x in (self.stream, seq, hash_, body)]
        self._sent = {seq: hash_ for seq, hash_, _ in made}
        cut: Cut | None = None
        try:
            with self.store.connection() as conn, self._watch.watching(conn) as cut:
                backend = conn.info.backend_pid
                conn.execute(sql, params)
        except psycopg.errors.UniqueViolation as exc:
            self._sent = {}
            self._broken = (
                f"the store {self.store.name} already holds record seq {made[0][0]} of stream {self.stream}: "
                "another writer claims this stream (a fork); this gateway records nothing more in it: restart it"
            )
            raise AuditUnavailable(self._broken) from exc
        except db.StoreUnavailable as exc:
            why = str(exc)
            if cut is not None and cut.cut:  # its outcome is read back before the next record (_settle_unknown)
                self._stuck = backend
                why = (
                    f"the store {self.store.name} did not answer a commit within {self._watch.bound_s:g} s "
                    "(--store-commit-timeout; a synchronous standby that stopped answering holds every commit)"
                )
            if self.spool is None:
                raise AuditUnavailable(f"{why} (nothing runs unrecorded)") from exc
            # it may have landed all the same: the forwarder skips what the store holds already
            self._sent = {}
            self._reachable = False
            self.spool.write([body for _, _, body in made])
            log.warning("store_spooling", store=self.store.name, spool=str(self.spool.path), error=why)
            return
        except psycopg.Error as exc:
            self._sent = {}
            raise AuditUnavailable(f"the store {self.store.name} refused the record: {exc}") from exc
        self._sent = {}

    def _settle_unknown(self, batch: list[_Pending]) -> None:
        """A commit went unanswered: read the stream's end back. What landed is voided on the
        record (its callers were refused); anything else at the end is a fork."""
        with self.store.connection() as conn:
            if self._stuck is not None:
                self._end_stuck(conn, self._stuck)
                self._stuck = None
            row = conn.execute(_LAST, (self.stream,)).fetchone()
        seq, hash_ = (int(row[0]), str(row[1])) if row else (0, "")
        if (seq, hash_) == (self._seq, self._prev):
            self._sent = {}
            return
        if self._sent.get(seq) != hash_:
            self._broken = (
                f"the stream {self.stream} in the store {self.store.name} ends at seq {seq}, not at what this "
                f"gateway wrote (seq {self._seq}): another writer, or an edit; this gateway records nothing more in it"
            )
            raise AuditUnavailable(self._broken)
        landed = sorted(s for s in self._sent if s <= seq)
        self._seq, self._prev = seq, hash_
        self._sent = {}
        batch.insert(0, _Pending(VOIDED, {"data": {
            "seqs": landed,
            "why": "committed, but the gateway did not hear the commit: their calls were refused and did not run",
        }}))  # fmt: skip

    def _end_quietly(self, pid: int) -> None:
        """End a cut commit's backend on the way out (the gateway is not starting: best effort)."""
        with contextlib.suppress(db.StoreError, psycopg.Error), self.store.connection() as conn:
            self._end_stuck(conn, pid)

    def _end_stuck(self, conn: psycopg.Connection[Any], pid: int) -> None:
        """End the server's side of a commit the watch cut (commitwatch.py), and wait until it
        has ended. Until then its records are neither visible nor gone: the stream's end read
        back would not show them, and the next record's insert would wait on them and then find
        its seq taken (a fork, for good). Ended, a commit done locally stays (the standby gets it
        when it is back) and is voided like any other that landed unheard."""
        mine = "pid = %s AND application_name = %s AND usename = current_user"
        args = (pid, self.store.application_name)
        conn.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {mine}", args)
        deadline = time.monotonic() + self._watch.bound_s
        while conn.execute(f"SELECT 1 FROM pg_stat_activity WHERE {mine}", args).fetchone() is not None:
            if time.monotonic() > deadline:
                raise db.StoreUnavailable(
                    f"the store {self.store.name} still holds the unanswered commit of backend {pid} "
                    f"{self._watch.bound_s:g} s after it was ended"
                )
            time.sleep(0.05)

    # --- the spool ------------------------------------------------------------------------------
    def _forward_own(self) -> None:
        """Forward this stream's spool (the caller holds the commit turn). Raises StoreUnavailable
        while the store is away; AuditUnavailable (the stream stopped) on a fork or a spool that
        fails verification."""
        assert self.spool is not None
        if self._stuck is not None:  # a cut commit's records must be settled before the spool's follow them
            with self.store.connection() as conn:
                self._end_stuck(conn, self._stuck)
            self._stuck = None
        try:
            sent = forward(self.store, self.spool, self._keys(), end=(self._seq, self._prev), watch=self._watch)
        except spooling.SpoolError as exc:
            self._broken = f"{exc}; nothing of it was inserted; this gateway records nothing more: restart it"
            log.error("store_spool_refused", spool=str(self.spool.path), error=self._broken)
            raise AuditUnavailable(self._broken) from exc
        except CommitCut as exc:  # unbounded, it held the commit turn, and every call, for as long as the standby
            self._stuck = exc.backend  # was away; its records stay in the spool and are settled at the next forward
            self._reachable = False
            raise
        except db.StoreUnavailable:
            self._reachable = False
            raise
        self._reachable = True
        log.info("store_spool_forwarded", store=self.store.name, spool=str(self.spool.path), records=sent)

    def _keys(self) -> list[VerifyKey]:
        return [self.key.public] if self.key is not None else []

    def _forward_orphans(self, directory: Path) -> None:
        """Forward the spools of this host's gateways that are gone, before this one starts.
        Raises AuditUnavailable (the gateway does not start) on one that fails verification."""
        try:
            found = spooling.orphans(directory)
        except spooling.SpoolError as exc:
            raise AuditUnavailable(str(exc)) from exc
        try:
            for orphan in found:
                try:
                    # bounded per answer: no call waits on a start, and a large spool on a slow
                    # store would otherwise be cut every time (a running gateway's own forward
                    # holds every call while it runs, so it stays bounded as a whole)
                    sent = forward(self.store, orphan, None, watch=self._watch, per_answer=True)
                except CommitCut as exc:  # the spool stays: the next start forwards what did not land
                    self._end_quietly(exc.backend)
                    raise AuditUnavailable(str(exc)) from exc
                except spooling.SpoolError as exc:
                    raise AuditUnavailable(
                        f"{exc}; nothing of it was inserted. Keep it for whoever investigates, move it out of "
                        f"{directory}, and start again"
                    ) from exc
                log.info("store_spool_forwarded", store=self.store.name, spool=str(orphan.path), records=sent)
        finally:
            for orphan in found:
                orphan.close()

    def _forwarder(self) -> None:
        """Every second while the spool holds records: once the store answers, forward them."""
        assert self.spool is not None
        while not self._stop.wait(_FORWARD_EVERY_S):
            if not self.spool.holding or self._broken is not None:
                continue
            try:  # outside the commit turn: appends go on into the spool while this waits
                with self.store.connection() as conn:
                    conn.execute("SELECT 1")
            except db.StoreUnavailable:
                self._reachable = False
                continue
            self._reachable = True
            with self._cond:
                while self._committing:
                    self._cond.wait()
                self._committing = True
            try:
                if self.spool.holding and self._broken is None:
                    self._forward_own()
            except Exception as exc:  # (a stopped stream is told at its next append; this thread goes on)
                log.warning("store_spool_not_forwarded", spool=str(self.spool.path), error=str(exc))
            finally:
                with self._cond:
                    self._committing = False
                    self._cond.notify_all()

    def close(self) -> None:
        self._stop.set()
        self._watch.close()
        if self.sequencer is not None:
            self.sequencer.stop()
        if self.spool is not None:
            with self._cond:  # not while the forwarder holds the commit turn
                while self._committing:
                    self._cond.wait()
                self._committing = True
            self.spool.close()  # what it still holds is forwarded by the next gateway
        self.store.close()


def forward(
    store: db.Store,
    spool: spooling.Spool,
    keys: list[VerifyKey] | None,
    end: tuple[int, str] | None = None,
    *,
    watch: CommitWatch | None = None,
    per_answer: bool = False,
) -> int:
    """Insert the spool's records into the store, in order, in one transaction, then remove
    the spool; the records inserted. `keys`: what its signatures must verify with (None: the key
    its stream names in the store); `end`: the (seq, hash) its writer knows it ends at. Raises
    SpoolError (nothing inserted) when it fails verification or the store holds something else
    at one of its seqs (a fork); StoreUnavailable while the store is away, CommitCut when `watch`
    cut its commit (commitwatch.py: its outcome is unknown until its backend has ended)."""
    text = spool.read()
    cut: Cut | None = None
    backend = 0
    try:
        with store.connection() as conn, _watching(watch, conn) as cut, conn.transaction():
            backend = conn.info.backend_pid
            answered = _renewer(watch, cut) if per_answer else (lambda: None)
            sent = _forward_in(conn, store, spool, text, keys, end, answered)
    except db.StoreUnavailable as exc:
        if watch is not None and cut is not None and cut.cut:  # its outcome is settled by its writer (_stuck)
            raise CommitCut(
                f"the store {store.name} did not answer the spool's commit within {watch.bound_s:g} s "
                "(--store-commit-timeout; a synchronous standby that stopped answering holds every commit)",
                backend,
            ) from exc
        raise
    spool.clear()  # (a crash before this: the next forward finds them there, the same, and skips them)
    return sent


def _renewer(watch: CommitWatch | None, cut: Cut | None) -> Callable[[], None]:
    """What renews `watch`'s bound for the block `cut` names once a statement is answered."""
    if watch is None or cut is None:
        return lambda: None
    return lambda: watch.progressed(cut)


def _watching(
    watch: CommitWatch | None, conn: psycopg.Connection[Any]
) -> contextlib.AbstractContextManager[Cut | None]:
    return watch.watching(conn) if watch is not None else contextlib.nullcontext(None)


def _forward_in(
    conn: psycopg.Connection[Any],
    store: db.Store,
    spool: spooling.Spool,
    text: str,
    keys: list[VerifyKey] | None,
    end: tuple[int, str] | None,
    answered: Callable[[], None],
) -> int:
    """`forward`'s checks and inserts, in the caller's transaction; the records inserted.
    `answered` is called after the check and after each statement: the commit bound holds for
    each of them and for the commit, not for the whole forward."""
    stream = spool.stream
    if keys is None:  # an earlier gateway's: the file names its stream; the store names its key
        first = text.split("\n", 1)[0]
        with contextlib.suppress(ValueError, AttributeError):
            stream = str(json.loads(first).get("stream"))
        keys = _stream_keys(conn, stream)
    checked = spooling.check(text, spool.path, stream, keys)
    answered()
    records = checked.records
    got = (int(records[-1]["seq"]), str(records[-1]["hash"])) if records else None
    if end is not None and got != end:
        raise spooling.SpoolError(
            f"the spool {spool.path} ends at {f'seq {got[0]}' if got else 'nothing'}, not at the record seq "
            f"{end[0]} this gateway wrote there: records were removed, added or edited"
        )
    if not records:
        return 0
    row = conn.execute(_LAST, (stream,)).fetchone()
    last, last_hash = (int(row[0]), str(row[1])) if row else (0, "")
    first_seq = int(records[0]["seq"])
    if first_seq > last + 1:
        raise spooling.SpoolError(
            f"the spool {spool.path} starts at seq {first_seq} of stream {stream}, and the store {store.name} "
            f"holds it only to seq {last}: records {last + 1}..{first_seq - 1} are missing"
        )
    if first_seq == last + 1 and records[0].get("prev") != last_hash:
        raise spooling.SpoolError(
            f"the spool {spool.path} seq {first_seq} does not link to seq {last} of stream {stream} in the "
            f"store {store.name}: a fork"
        )
    held = {
        int(s): str(h)
        for s, h in conn.execute(
            "SELECT seq, hash FROM agw.record WHERE stream = %s AND seq >= %s", (stream, first_seq)
        )
    }
    for record in records:
        if record["seq"] in held and held[record["seq"]] != record["hash"]:
            raise spooling.SpoolError(
                f"the store {store.name} holds another record at seq {record['seq']} of stream {stream} than "
                f"the spool {spool.path}: a fork"
            )
    new = [(r["seq"], r["hash"], line) for r, line in zip(records, checked.lines, strict=True) if r["seq"] > last]
    try:
        for at in range(0, len(new), _CHUNK):
            part = new[at : at + _CHUNK]
            sql = _INSERT + ", (%s, %s, %s, %s)" * (len(part) - 1)
            conn.execute(sql, [x for seq, hash_, body in part for x in (stream, seq, hash_, body)])
            answered()
    except psycopg.errors.UniqueViolation as exc:
        raise spooling.SpoolError(
            f"another writer put records in stream {stream} while the spool {spool.path} was forwarded: a fork"
        ) from exc
    except psycopg.errors.IntegrityError as exc:
        raise spooling.SpoolError(f"the store {store.name} refused the spool {spool.path}: {exc}") from exc
    return len(new)


def _stream_keys(conn: psycopg.Connection[Any], stream: str) -> list[VerifyKey]:
    row = conn.execute("SELECT body FROM agw.record WHERE stream = %s AND seq = 1", (stream,)).fetchone()
    with contextlib.suppress(Exception):
        line = json.loads(row[0])["data"]["key"] if row else None
        if isinstance(line, str):
            return [VerifyKey.from_line(line, f"stream {stream}")]
    return []


# --- calls a dead gateway left: interrupted ---------------------------------------------------
def _dead_streams(conn: psycopg.Connection[Any], host: str) -> list[tuple[str, int]]:
    """The streams of this host whose gateway is gone and that no later stream closed yet (its
    `stream_started` names those it closed): (stream, pid), oldest first. A stream is alive
    while its pid runs a process started no later than the stream (a pid reused since is not
    it). Called under the host's lock, so two gateways starting at once never both close one."""
    rows = conn.execute(
        "SELECT s.stream, s.pid, s.started_at, r.body FROM agw.stream s "
        "LEFT JOIN agw.record r ON r.stream = s.stream AND r.seq = 1 WHERE s.host = %s ORDER BY s.n",
        (host,),
    ).fetchall()
    closed: set[str] = set()
    for _, _, _, body in rows:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            named = json.loads(body)["data"].get("closed") or []
            closed.update(x for x in named if isinstance(x, str))
    return [(str(s), int(pid)) for s, pid, at, _ in rows if s not in closed and not _alive(int(pid), at)]


def _alive(pid: int, since: datetime) -> bool:
    """Whether `pid` on this host is still the process that started a stream at `since`. When
    that cannot be told, alive: its calls are left alone rather than marked while they run."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return True
    started = boot + ticks / os.sysconf("SC_CLK_TCK")
    return started <= since.timestamp() + 1.0  # (btime and the ticks are whole seconds and jiffies)


def _ends(record: dict[str, Any]) -> bool:
    """A record that ends its call: a result, an error, ... or an approval that did not grant it."""
    event = record.get("event")
    return event in journal.ENDS or (event == "approval" and record.get("decision") != "allow")


def _interrupted(conn: psycopg.Connection[Any], stream: str, pid: int) -> list[_Pending]:
    """An `interrupted` record for each call of the dead `stream` that was decided (allowed, or
    asked) and never ended, and its pending asks expired with the reason (`agw.abandon`)."""
    why = (
        f"the gateway that decided it (stream {stream}, pid {pid}) ended before it recorded how the call ended: "
        "it was killed or it crashed. What the call did is unknown; its sandbox did not outlive that gateway"
    )
    asked = (
        f"the gateway that asked (stream {stream}, pid {pid}) ended while the ask was pending (killed or "
        "crashed): nobody waits for an answer; the call did not run"
    )
    expired = {str(r[0]) for r in conn.execute("SELECT call_id FROM agw.abandon(%s, %s)", (stream, asked))}
    open_: dict[str, dict[str, Any]] = {}
    cur = conn.execute(
        "SELECT body FROM agw.record WHERE stream = %s AND strpos(body, '\"call_id\":') > 0 ORDER BY seq", (stream,)
    )
    for (body,) in cur:
        try:
            record = json.loads(body)
        except ValueError:
            continue
        call_id = record.get("call_id") if isinstance(record, dict) else None
        if not isinstance(call_id, str):
            continue
        if record.get("event") in ("decision", "approval") and record.get("decision") in ("allow", "ask"):
            open_.setdefault(call_id, record)
        elif call_id in open_ and _ends(record):
            del open_[call_id]
    out = []
    for call_id, record in open_.items():
        fields: dict[str, Any] = {"call_id": call_id}
        for name in ("principal", "tool", "parent", "policy_sha256"):
            if isinstance(record.get(name), str):
                fields[name] = record[name]
        pending = call_id in expired or record.get("decision") == "ask"
        data = {"why": asked if pending else why, "stream": stream, "pid": pid, "decided_seq": record.get("seq"),
                "decision": record.get("decision")}  # fmt: skip
        if call_id in expired:
            data["ask"] = "expired"
        out.append(_Pending("interrupted", {**fields, "data": data}))
    return out


def open_ledger(
    dsn: str,
    directory: Path,
    key_dir: Path,
    redact: list[str] | None = None,
    *,
    sequence: bool = True,
    spool: Path | None = None,
    spool_max: int = spooling.DEFAULT_MAX,
    commit_timeout: float = COMMIT_TIMEOUT_S,
) -> StoreLedger:
    """The ledger of a gateway run with `--store`: its records signed with this host's key (the
    one in `key_dir`, made if there is none); `sequence`: it may be the fleet's sequencer (a
    one-shot `gateway run` is not); `spool`: where batches wait while the store is away (None:
    refused). Raises AuditUnavailable naming the store."""
    try:
        store = db.Store(dsn)
    except db.StoreError as exc:
        raise AuditUnavailable(str(exc)) from exc
    try:
        key = SigningKey.load_or_create(Path(key_dir))
        return StoreLedger(store, directory, redact, key=key, sequence=sequence, spool=spool, spool_max=spool_max,
                           commit_timeout=commit_timeout)  # fmt: skip
    except Exception:
        store.close()
        raise


def open_sink(
    dsn: str | None,
    directory: Path,
    key_dir: Path,
    redact: list[str] | None = None,
    *,
    sequence: bool = True,
    spool: tuple[Path | None, int] = (None, spooling.DEFAULT_MAX),
    commit_timeout: float = COMMIT_TIMEOUT_S,
) -> AuditSink:
    """The gateway's ledger: the fleet's store when `dsn` names one (with `spool`: its directory
    and bound, commands.spool_of; `commit_timeout`: commitwatch.py), else the files of one host
    (`directory`, signed with the key in `key_dir`). Raises AuditUnavailable."""
    if dsn:
        return open_ledger(dsn, directory, key_dir, redact, sequence=sequence, spool=spool[0], spool_max=spool[1],
                           commit_timeout=commit_timeout)  # fmt: skip
    return open_signed(directory, key_dir, redact=redact)


# --- verification -------------------------------------------------------------------------------
@dataclass
class StoreVerification:
    """What `verify_store` found: counts, and each problem as one line naming where it is."""

    streams: int = 0
    records: int = 0
    checkpoints: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def lines(self) -> list[str]:
        head = f"{self.streams} streams, {self.records} records, {self.checkpoints} checkpoints"
        if self.ok:
            return [f"ok: {head}"]
        return [f"FAILED: {head}, {len(self.problems)} problem(s)", *(f"  {p}" for p in self.problems)]


@dataclass
class _StreamEnd:
    host: str
    seq: int
    hash: str
    hashes: dict[int, str]
    previous: dict[str, Any] | None
    key: VerifyKey | None


def _check_stream(
    conn: psycopg.Connection[Any], stream: str, host: str, keys: list[VerifyKey], out: StoreVerification
) -> _StreamEnd:
    expected, prev = 1, ""
    hashes: dict[int, str] = {}
    previous: dict[str, Any] | None = None
    key: VerifyKey | None = None
    signed_to = 0
    where = f"stream {stream}"
    with conn.cursor() as cur:
        cur.execute("SELECT seq, hash, body FROM agw.record WHERE stream = %s ORDER BY seq", (stream,))
        for seq, hash_, body in cur:
            out.records += 1
            at = f"{where} seq {seq}"
            if seq != expected:
                out.problems.append(f"{at}: expected seq {expected}: records {expected}..{seq - 1} are missing")
            expected = seq + 1
            try:
                record = json.loads(body)
            except ValueError:
                out.problems.append(f"{at}: the row's record is not JSON (edited)")
                prev = hash_
                continue
            if not isinstance(record, dict) or canonical(record) != body:
                out.problems.append(f"{at}: the row's record is not in canonical form (edited)")
            elif digest(record) != record.get("hash") or record.get("hash") != hash_:
                out.problems.append(f"{at}: the record does not match its hash (edited)")
            elif record.get("seq") != seq or record.get("stream") != stream:
                out.problems.append(
                    f"{at}: the record says stream {record.get('stream')} seq {record.get('seq')} (moved or reordered)"
                )
            elif record.get("prev") != prev:
                out.problems.append(f"{at}: the record does not link to the one before it (reordered or removed)")
            hashes[seq] = hash_
            prev = hash_
            if not isinstance(record, dict):
                continue
            if seq == 1:
                given = record.get("data")
                data: dict[str, Any] = given if isinstance(given, dict) else {}
                if record.get("event") != STREAM_STARTED or data.get("host") != host:
                    out.problems.append(f"{at}: a stream starts with {STREAM_STARTED} naming its host {host}")
                previous = data.get("previous") if isinstance(data.get("previous"), dict) else None
                with contextlib.suppress(Exception):
                    key = VerifyKey.from_line(str(data["key"]), at) if data.get("key") else None
                if keys and (key is None or key.raw not in {k.raw for k in keys}):
                    out.problems.append(f"{at}: the stream is signed with a key you did not pin (--key)")
            sig = record.get("sig")
            if sig is not None:
                checkers = keys or ([key] if key else [])
                if not any(k.verify(hash_, str(sig)) for k in checkers):
                    out.problems.append(f"{at}: the signature does not verify (forged)")
                signed_to = seq
    last = expected - 1
    if last == 0:
        out.problems.append(f"{where}: has no records (its {STREAM_STARTED} was removed)")
    elif (keys or key) and signed_to != last:
        out.problems.append(f"{where}: records {signed_to + 1}..{last} come after its last signature (added)")
    return _StreamEnd(host, last, prev, hashes, previous, key)


def verify_store(
    store: db.Store, keys: list[VerifyKey] | None = None, kept: list[dict[str, Any]] | None = None
) -> StoreVerification:
    """Check every stream of the store's ledger, the links between a host's streams, and the
    signed checkpoints (sequencer.py), including those a reviewer `kept` outside the store.
    Raises StoreUnavailable when the store cannot be read."""
    keys = keys or []
    out = StoreVerification()
    with store.connection() as conn, conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        streams = conn.execute("SELECT stream, host FROM agw.stream ORDER BY n").fetchall()
        ends: dict[str, _StreamEnd] = {}
        for stream, host in streams:
            out.streams += 1
            ends[stream] = _check_stream(conn, stream, host, keys, out)
        last_of_host: dict[str, str] = {}
        for stream, host in streams:
            end = ends[stream]
            before = last_of_host.get(host)
            named = end.previous
            if before is None and named is not None:
                out.problems.append(f"stream {stream}: names a previous stream {named.get('stream')} that is gone")
            elif before is not None and (named is None or named.get("stream") != before):
                out.problems.append(
                    f"stream {stream}: does not name {before}, the host's stream before it (a stream was removed "
                    "or inserted)"
                )
            elif before is not None and named is not None:
                seq = named.get("seq")
                if isinstance(seq, int) and seq > 0 and ends[before].hashes.get(seq) != named.get("hash"):
                    out.problems.append(
                        f"stream {before}: stream {stream} saw it reach seq {seq}, and that record is not there "
                        "as it was (truncated or rewritten)"
                    )
            last_of_host[host] = stream
        hashes = {stream: end.hashes for stream, end in ends.items()}
        out.checkpoints = sequencer.check_checkpoints(conn, hashes, keys, kept or [], out.problems)
    return out
