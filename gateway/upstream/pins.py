"""Pinned tool definitions: what an upstream's tools were when they were first seen, or last
accepted, and what they turned into since.

A tool's definition is what the agent is shown of it: name, title, description, input and
output schemas, annotations. Its SHA-256 is taken over its canonical JSON (keys sorted, no
spaces). The first listing of an upstream pins every tool it offers (`upstream_pinned` in the
audit log); from then on a tool whose definition differs from its pin, and a tool the upstream
had not offered before (a rename is a new tool), is drift: it is blocked, recorded
(`upstream_drift`), and kept pending with its new definition until an admin (`gateway upstream
accept`) or a supervisor (the console) accepts it (`upstream_accepted`, recorded before the pin
changes), after seeing the diff.

The pins live in the gateway's state directory (`upstream/pins.json`, mode 0600, written
atomically), shared by the server and the CLI under a lock; each reader notices another's write.
"""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

PINNED_FIELDS = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")
"""What of a listed tool is pinned: everything the agent is shown of it."""
MAX_DRIFT_RECORDS = 20
"""Drift records one listing writes one by one; the rest are one record with their count."""
FILE = "pins.json"
LOCK = "pins.lock"


class PinError(Exception):
    """The pins cannot be read, written or changed as asked (the message says why)."""


def definition(tool: dict[str, Any]) -> dict[str, Any]:
    """The pinned part of a tool as an upstream lists it (JSON, the protocol's field names)."""
    return {k: tool[k] for k in PINNED_FIELDS if tool.get(k) is not None}


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fingerprint(defined: dict[str, Any]) -> str:
    """The SHA-256 of a definition's canonical JSON."""
    return hashlib.sha256(canonical(defined).encode("utf-8", "surrogatepass")).hexdigest()


def diff(old: dict[str, Any] | None, new: dict[str, Any], label: str) -> str:
    """A unified diff of two definitions, as indented JSON (an empty `old` for a new tool)."""
    before = json.dumps(old, indent=2, sort_keys=True, ensure_ascii=False).splitlines() if old else []
    after = json.dumps(new, indent=2, sort_keys=True, ensure_ascii=False).splitlines()
    was = f"{label} (pinned)" if old else "(not pinned)"
    return "\n".join(difflib.unified_diff(before, after, was, f"{label} (now)", lineterm=""))


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Drift:
    """A tool whose definition is not its pin: `changed`, or `new` (never pinned)."""

    upstream: str
    tool: str
    kind: str
    pinned: dict[str, Any] | None
    pinned_sha256: str | None
    seen: dict[str, Any]
    seen_sha256: str
    since: str

    def to_json(self) -> dict[str, Any]:
        return {
            "upstream": self.upstream, "tool": self.tool, "kind": self.kind, "pinned_sha256": self.pinned_sha256,
            "seen_sha256": self.seen_sha256, "since": self.since,
            "diff": diff(self.pinned, self.seen, f"{self.upstream}.{self.tool}"),
        }  # fmt: skip


@dataclass(frozen=True)
class Observed:
    """What a listing changed: tools pinned at first sight, drift seen for the first time."""

    pinned: dict[str, str]
    drift: list[Drift]
    first_sight: bool


class PinStore:
    """The pins of every upstream, in `directory` (the gateway's state: never in a write root)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.path = self.directory / FILE
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int] | None = None
        self._state: dict[str, Any] = {"version": 1, "upstreams": {}}

    # --- reading -------------------------------------------------------------------------------
    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _read(self) -> dict[str, Any]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return {"version": 1, "upstreams": {}}
        except OSError as exc:
            raise PinError(f"cannot read the upstream pins {self.path}: {exc.strerror}") from exc
        with os.fdopen(fd, "rb") as f:
            raw = f.read()
        try:
            state = json.loads(raw)
        except ValueError as exc:
            raise PinError(f"the upstream pins {self.path} are not JSON ({exc}): restore or remove the file") from None
        if not isinstance(state, dict) or not isinstance(state.get("upstreams"), dict):
            raise PinError(f"the upstream pins {self.path} are not pins: restore or remove the file")
        return state

    def state(self) -> dict[str, Any]:
        """The pins as on disk (read again when another process changed them). Raises PinError."""
        with self._lock:
            now = self._stat()
            if now != self._seen:
                self._state, self._seen = self._read(), now
            return self._state

    def upstream(self, upstream: str) -> dict[str, Any]:
        found = self.state()["upstreams"].get(upstream)
        return found if isinstance(found, dict) else {}

    def pinned_sha256(self, upstream: str, tool: str) -> str | None:
        pin = self.upstream(upstream).get("pinned", {}).get(tool)
        return str(pin["sha256"]) if isinstance(pin, dict) and "sha256" in pin else None

    def drifts(self, upstream: str | None = None) -> list[Drift]:
        out = []
        for name, entry in sorted(self.state()["upstreams"].items()):
            if upstream is not None and name != upstream:
                continue
            for tool, seen in sorted(entry.get("drift", {}).items()):
                pin = entry.get("pinned", {}).get(tool)
                out.append(
                    Drift(
                        name, tool, str(seen.get("kind")), pin.get("definition") if pin else None,
                        pin.get("sha256") if pin else None, seen["definition"], seen["sha256"], str(seen.get("since")),
                    )
                )  # fmt: skip
        return out

    # --- changing ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        """The state read fresh under the file lock (other processes: the CLI, another server);
        what the block leaves in it is written back atomically."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.directory / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with self._lock:
                state = self._read()
                before = canonical(state)
                yield state
                if canonical(state) != before:
                    self._write(state)
                self._state, self._seen = state, self._stat()
        finally:
            os.close(fd)

    def _write(self, state: dict[str, Any]) -> None:
        tmp = self.directory / f".{FILE}.{os.getpid()}.{threading.get_ident()}.tmp"
        data = json.dumps(state, indent=1, sort_keys=True, ensure_ascii=False).encode("utf-8", "surrogatepass")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            dirfd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(dirfd)
            finally:
                os.close(dirfd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise PinError(f"cannot write the upstream pins {self.path}: {exc.strerror}") from exc

    def observe(
        self, upstream: str, listing: dict[str, dict[str, Any]], record: Callable[[str, dict[str, Any]], None]
    ) -> Observed:
        """Take a listing (tool name -> its definition). The first listing of an upstream pins
        all of it; later, each tool that differs from its pin (or has none) is drift, pending
        until accepted. `record(event, data)` writes the audit record of what changed before the
        pins change (it raises when it cannot: nothing is pinned then)."""
        hashed = {tool: (fingerprint(d), d) for tool, d in listing.items()}
        with self._locked() as state:
            entry = state["upstreams"].get(upstream)
            if not isinstance(entry, dict) or "pinned" not in entry:
                tools = {tool: sha for tool, (sha, _) in sorted(hashed.items())}
                record("upstream_pinned", {"upstream": upstream, "first_sight": True, "tools": tools})
                when = _now()
                first = {"since": when, "by": "first sight"}
                pins = {t: {"sha256": h, "definition": d, **first} for t, (h, d) in hashed.items()}
                state["upstreams"][upstream] = {"pinned": pins, "drift": {}}
                return Observed(tools, [], True)
            pinned: dict[str, Any] = entry.setdefault("pinned", {})
            pending: dict[str, Any] = entry.setdefault("drift", {})
            fresh: list[Drift] = []
            unrecorded: list[str] = []
            now_pending: dict[str, Any] = {}
            for tool, (sha, defined) in sorted(hashed.items()):
                pin = pinned.get(tool)
                if isinstance(pin, dict) and pin.get("sha256") == sha:
                    continue
                kind = "changed" if isinstance(pin, dict) else "new"
                old = pending.get(tool)
                if isinstance(old, dict) and old.get("sha256") == sha:
                    now_pending[tool] = old
                    continue
                drift = Drift(upstream, tool, kind, pin.get("definition") if pin else None,
                              pin.get("sha256") if pin else None, defined, sha, _now())  # fmt: skip
                if len(fresh) < MAX_DRIFT_RECORDS:
                    record(
                        "upstream_drift",
                        {"upstream": upstream, "tool": tool, "kind": kind, "pinned_sha256": drift.pinned_sha256,
                         "seen_sha256": sha},
                    )  # fmt: skip
                else:
                    unrecorded.append(tool)
                now_pending[tool] = {"sha256": sha, "definition": defined, "since": drift.since, "kind": kind}
                fresh.append(drift)
            if unrecorded:  # a server changing everything at once gets one record more, not thousands
                record("upstream_drift", {"upstream": upstream, "more": len(unrecorded), "tools": unrecorded[:100]})
            entry["drift"] = now_pending  # drift that went away (back as pinned, or gone) is no longer pending
            return Observed({}, fresh, False)

    def accept(
        self, upstream: str, tool: str, sha256: str | None, by: str, record: Callable[[str, dict[str, Any]], None]
    ) -> Drift:
        """Pin the pending definition of `tool` (the one whose SHA-256 starts with `sha256`, when
        given: the definition the accepting person saw). `record` writes `upstream_accepted`
        first; it raises when it cannot, and then nothing changes. Raises PinError."""
        with self._locked() as state:
            entry = state["upstreams"].get(upstream)
            seen = entry.get("drift", {}).get(tool) if isinstance(entry, dict) else None
            if not isinstance(seen, dict):
                raise PinError(f"{upstream}.{tool}: no pending definition to accept (gateway upstream list)")
            if sha256 is not None and (len(sha256) < 8 or not str(seen["sha256"]).startswith(sha256)):
                raise PinError(
                    f"{upstream}.{tool}: the pending definition is {str(seen['sha256'])[:16]}, not {sha256}: it "
                    "changed since you looked; review the diff again (gateway upstream diff)"
                )
            assert isinstance(entry, dict)
            pin = entry.get("pinned", {}).get(tool)
            drift = Drift(upstream, tool, str(seen.get("kind")), pin.get("definition") if pin else None,
                          pin.get("sha256") if pin else None, seen["definition"], seen["sha256"],
                          str(seen.get("since")))  # fmt: skip
            record(
                "upstream_accepted",
                {"upstream": upstream, "tool": tool, "kind": drift.kind, "by": by,
                 "pinned_sha256": drift.pinned_sha256, "accepted_sha256": drift.seen_sha256},
            )  # fmt: skip
            entry.setdefault("pinned", {})[tool] = {
                "sha256": seen["sha256"], "definition": seen["definition"], "since": _now(), "by": by,
            }  # fmt: skip
            del entry["drift"][tool]
            return drift


def store_dir(state_dir: Path) -> Path:
    """Where a gateway with this state directory keeps its upstream pins."""
    return Path(state_dir) / "upstream"
