"""Policy rollout through the store: one policy for the fleet, signed, taken by every gateway
within seconds, a bad one taken by none.

`publish` checks a policy as `gateway policy test` does (compile, examples, the tests file, for
every principal: a failure publishes nothing), bundles its files (the file and its includes, all
under the file's directory) and stores it as a new revision signed with the publisher's Ed25519
key. `PolicySync`, in each gateway, reads the newest revision every `POLL_S`, verifies it against
the keys pinned in the gateway's own configuration and its digest, and only then writes its files
into the gateway's policy directory; the gateway's `PolicyHolder` picks the change up as it does
an edit on disk: it loads, compiles and checks it, and switches only if it passes, else the
policy in force stays (and `policy_rejected` is recorded). A revision that does not verify, or
fails this gateway's own checks (compiled against its workspace, examples and tests run, in a
staging directory beside it), is never written. The files on disk are the last good revision,
which a restart starts from when the store is away. Each gateway reports the revision it took
(`agw.policy_status`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from gateway.audit.keys import SigningKey, VerifyKey
from gateway.audit.records import canonical
from gateway.decide import example_decisions, test_cases
from gateway.policy.compile import CompiledPolicy
from gateway.policy.layers import layer_files
from gateway.policy.loader import PolicyError
from gateway.policy.reload import PolicyTooOld
from gateway.policy.selftest import example_cases, load_checked
from gateway.store import db

POLL_S = 1.0


class RolloutError(Exception):
    """A revision cannot be published or taken (the message says which and why)."""


def bundle(path: Path) -> dict[str, Any]:
    """The policy's files as {"entry": name, "files": {relative name: text}}. Raises RolloutError
    for an include outside the file's directory (it could not be placed the same on every host)."""
    base = path.resolve().parent
    files: dict[str, str] = {}
    for f in layer_files(path):
        try:
            rel = f.relative_to(base)
        except ValueError:
            raise RolloutError(
                f"{f}: an include outside {base} cannot be published (copy it beside the policy)"
            ) from None
        files[str(rel)] = f.read_text(encoding="utf-8")
    return {"entry": path.name, "files": files}


def _write(directory: Path, body: dict[str, Any]) -> None:
    """A verified revision's files into `directory` (each replaced whole), then its `.entry`."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    for name, content in body["files"].items():
        target = directory / name
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(content, encoding="utf-8")
        os.replace(tmp, target)
    tmp = directory / ".entry.tmp"
    tmp.write_text(str(body["entry"]), encoding="utf-8")
    os.replace(tmp, directory / ".entry")


def _sha(body: dict[str, Any]) -> str:
    return hashlib.sha256(canonical(body).encode("utf-8")).hexdigest()


def failing(path: Path, workspace: Path | None) -> str | None:
    """Why the policy at `path` fails what `gateway policy test` checks (it compiles; its
    examples, and its tests file for every principal, pass), or None when it passes."""
    try:
        policy = load_checked(path, workspace)
    except PolicyError as exc:
        return str(exc)
    failed = [c for c in example_cases(policy) if not c.passed]
    for principal in sorted(policy.grants):
        failed += [c for c in example_decisions(policy, principal) + test_cases(policy, principal) if not c.passed]
    if failed:
        return f"{len(failed)} check(s) fail, first: {failed[0].name}: {failed[0].detail}"
    return None


def publish(store: db.Store, path: Path, workspace: Path | None, key: SigningKey) -> int:
    """Check, bundle, sign and store `path` as the fleet's next revision; returns its number."""
    why = failing(path, workspace)
    if why is not None:
        raise RolloutError(f"not published: {why}")
    body = bundle(path)
    sha = _sha(body)
    with store.connection() as conn:
        row = conn.execute(
            "INSERT INTO agw.policy_revision (sha256, bundle, key, sig) VALUES (%s, %s, %s, %s) RETURNING rev",
            (sha, canonical(body), key.public.line().strip(), key.sign(sha)),
        ).fetchone()
    assert row is not None
    return int(row[0])


class PolicySync:
    """Keeps `directory` holding the newest revision that verifies against `pinned`."""

    def __init__(
        self, store: db.Store, directory: Path, pinned: list[VerifyKey], stream: str, host: str,
        on_reject: Callable[[int, str], None] | None = None, workspace: Path | None = None,
    ) -> None:  # fmt: skip
        if not pinned:
            raise RolloutError("taking the policy from the store needs at least one pinned key (--policy-key)")
        self.store = store
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.staging = self.directory.with_name(self.directory.name + ".next")
        """Where a revision is checked before it is written into `directory`: a sibling, so that
        the paths it names relative to its files resolve as they will there."""
        self.workspace = workspace
        """The gateway's --workspace: the revision is checked against it, as the gateway loads it."""
        self.pinned = {k.raw for k in pinned}
        self.stream, self.host = stream, host
        self.on_reject = on_reject
        self.rev = 0
        self.rejected: set[int] = set()
        self.confirmed = self._confirmed_on_disk()
        """When the store last answered (wall clock): the revision on disk was the newest then."""
        self._stop = threading.Event()

    def entry(self) -> Path | None:
        """The policy file of the revision on disk (the last good one taken), if any."""
        found = self.directory / ".entry"
        return self.directory / found.read_text(encoding="utf-8").strip() if found.exists() else None

    def _confirmed_on_disk(self) -> float:
        """When an earlier run last heard the store (the time stamp of `.entry`), 0: never."""
        try:
            return (self.directory / ".entry").stat().st_mtime
        except OSError:
            return 0.0

    def age(self) -> float:
        """Seconds since the store last answered (since the revision on disk was known newest)."""
        return max(0.0, time.time() - self.confirmed) if self.confirmed else float("inf")

    def admission(self, current: Callable[[], CompiledPolicy]) -> Callable[[], None]:
        """The gateway's check before each call (`Gateway(admit=...)`): raises PolicyTooOld,
        naming the store and the age, once the policy in force (`current()`) is older than its
        `fleet.max_policy_age_seconds` allows. Listing tools and the like go on meanwhile."""

        def checked() -> None:
            policy = current()
            limit = policy.policy.fleet.max_policy_age_seconds
            age = self.age()
            if age > limit:
                heard = "never" if age == float("inf") else f"{age:.0f} s ago"
                raise PolicyTooOld(
                    f"the store {self.store.name} last answered {heard}: the policy in force (revision "
                    f"{self.rev or 'taken before'}) is older than its fleet.max_policy_age_seconds ({limit} s) "
                    "allows; every call is refused until the store answers"
                )

        return checked

    def sync(self) -> bool:
        """Take the newest revision if it is new and verifies; True when files were written.
        Raises StoreUnavailable when the store cannot be read."""
        with self.store.connection() as conn:
            row = conn.execute(
                "SELECT rev, sha256, bundle, key, sig FROM agw.policy_revision ORDER BY rev DESC LIMIT 1"
            ).fetchone()
        taken = self._take(row)
        self._heard()
        return taken

    def _heard(self) -> None:
        self.confirmed = time.time()
        with contextlib.suppress(OSError):  # kept for a restart with the store away
            os.utime(self.directory / ".entry")

    def _take(self, row: Any) -> bool:
        if row is None or int(row[0]) <= self.rev or int(row[0]) in self.rejected:
            return False
        rev, sha, text, key_line, sig = int(row[0]), str(row[1]), str(row[2]), str(row[3]), str(row[4])
        why = self._why_not(sha, text, key_line, sig) or self._fails_here(json.loads(text))
        if why is not None:
            self.rejected.add(rev)
            self._report(rev, "rejected", why)
            if self.on_reject is not None:
                with contextlib.suppress(Exception):
                    self.on_reject(rev, why)
            return False
        _write(self.directory, json.loads(text))
        self.rev = rev
        self._report(rev, "taken", None)
        return True

    def _fails_here(self, body: dict[str, Any]) -> str | None:
        """Why a verified revision fails this gateway's checks (compiled against its workspace,
        its examples and tests run), or None. Only a revision that passes is written where the
        gateway loads it: the directory keeps the last good one, which a restart starts from
        (a revision written there and refused by the running gateway stopped the next start)."""
        shutil.rmtree(self.staging, ignore_errors=True)
        try:
            _write(self.staging, body)
            why = failing(self.staging / str(body["entry"]), self.workspace)
        finally:
            shutil.rmtree(self.staging, ignore_errors=True)
        return None if why is None else f"it fails this gateway's checks: {why}"

    def _why_not(self, sha: str, text: str, key_line: str, sig: str) -> str | None:
        try:
            key = VerifyKey.from_line(key_line, "the revision's key")
            body = json.loads(text)
        except Exception as exc:
            return f"unreadable revision: {exc}"
        if key.raw not in self.pinned:
            return f"signed with key {key.fingerprint}, which this gateway does not pin"
        if _sha(body) != sha or canonical(body) != text:
            return "its files do not match its digest"
        if not key.verify(sha, sig):
            return "its signature does not verify"
        names = list((body.get("files") or {}).keys())
        if body.get("entry") not in names or any(Path(n).is_absolute() or ".." in Path(n).parts for n in names):
            return "its file names are not a policy's"
        return None

    def _report(self, rev: int, state: str, error: str | None) -> None:
        with contextlib.suppress(db.StoreError, psycopg.Error), self.store.connection() as conn:
            conn.execute(
                "INSERT INTO agw.policy_status (stream, host, rev, state, error) VALUES (%s, %s, %s, %s, %s) "
                "ON CONFLICT (stream) DO UPDATE SET rev = EXCLUDED.rev, state = EXCLUDED.state, "
                "error = EXCLUDED.error, at = clock_timestamp()",
                (self.stream, self.host, rev, state, error),
            )

    def start(self) -> PolicySync:
        def loop() -> None:
            while not self._stop.wait(POLL_S):
                with contextlib.suppress(Exception):  # the store away: the policy on disk stays
                    self.sync()

        threading.Thread(target=loop, name="agw-policy-sync", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
