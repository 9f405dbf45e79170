"""The audit log's signing key: Ed25519, kept apart from the log, out of every sandbox's reach.

The gateway signs each record's hash with a private key it keeps in a directory of its own
(`signing.key`, mode 0600, in a 0700 directory the sandbox never mounts). Anyone holding only the
public key (`signing.pub`, one line `ed25519 BASE64`) can check every signature, and cannot make
one: a reviewer copies the public key (or its fingerprint) off the machine once, and from then on
a log rewritten by someone without the private key fails `gateway audit verify`.

A key is made only for a log that has no records yet. A log with records and no key, or a
`signing.pub` whose `signing.key` is gone, stops the gateway: the key the log was signed with
was lost, and a new key would sign over whatever the log now holds. Going on under a new key
takes `gateway audit adopt --new-key` (`replace` here), which the log records.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import os
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

KEY_FILE = "signing.key"
PUB_FILE = "signing.pub"
_PUB_PREFIX = "ed25519 "


class AuditKeyError(Exception):
    """The key could not be read, made or parsed; the message says which file and why."""


@dataclass(frozen=True)
class VerifyKey:
    """A public key: checks signatures, cannot make them."""

    raw: bytes

    @property
    def fingerprint(self) -> str:
        return "SHA256:" + base64.b64encode(hashlib.sha256(self.raw).digest()).decode().rstrip("=")

    def line(self) -> str:
        return _PUB_PREFIX + base64.b64encode(self.raw).decode() + "\n"

    def verify(self, hash_hex: str, signature: str) -> bool:
        try:
            sig = base64.b64decode(signature, validate=True)
            Ed25519PublicKey.from_public_bytes(self.raw).verify(sig, hash_hex.encode("ascii"))
        except (InvalidSignature, ValueError, TypeError):
            return False
        return True

    @classmethod
    def load(cls, path: Path) -> VerifyKey:
        """A `signing.pub` file, or a key directory holding one."""
        path = Path(path)
        if path.is_dir():
            path = path / PUB_FILE
        try:
            text = path.read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError) as exc:
            raise AuditKeyError(f"cannot read the public key {path}: {getattr(exc, 'strerror', None) or exc}") from None
        return cls.from_line(text, str(path))

    @classmethod
    def from_line(cls, text: str, where: str) -> VerifyKey:
        """The key in one `ed25519 BASE64` line (a `signing.pub`, or a pin in the log)."""
        text = text.strip()
        if not text.startswith(_PUB_PREFIX):
            raise AuditKeyError(f"{where}: not an audit public key (expected one line `ed25519 BASE64`)")
        try:
            raw = base64.b64decode(text[len(_PUB_PREFIX) :], validate=True)
        except ValueError:
            raise AuditKeyError(f"{where}: the key is not valid base64") from None
        if len(raw) != 32:
            raise AuditKeyError(f"{where}: an Ed25519 public key is 32 bytes, this one is {len(raw)}")
        return cls(raw)


class SigningKey:
    """The private key. `load_or_create(directory)` makes a key pair on first use (only for an
    empty log: writer.open_signed); `created` says this process made it."""

    def __init__(self, private: Ed25519PrivateKey, directory: Path, created: bool = False) -> None:
        self._private = private
        self.directory = directory
        self.created = created
        self.public = VerifyKey(
            private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        )

    def sign(self, hash_hex: str) -> str:
        return base64.b64encode(self._private.sign(hash_hex.encode("ascii"))).decode("ascii")

    @classmethod
    def load(cls, directory: Path) -> SigningKey:
        """The existing key; never makes one (a mistyped directory is an error, not a new key)."""
        directory = Path(directory)
        _check_private_dir(directory)
        return cls._load(directory / KEY_FILE, directory)

    @classmethod
    def load_or_create(cls, directory: Path, *, may_create: bool = True) -> SigningKey:
        """The key in `directory`, made now if there is none and `may_create` (the log it is for
        is empty). A public key without its private key is always an error, never a new key:
        the key a log was signed with was lost, and a new one would sign on top of it silently."""
        directory = Path(directory)
        if not may_create and not os.path.lexists(directory):
            raise AuditKeyError(f"no audit key directory {directory}")
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise AuditKeyError(f"cannot make the audit key directory {directory}: {exc.strerror}") from None
        _check_private_dir(directory)
        with _key_lock(directory):  # two gateways starting at once make one key, not two
            path = directory / KEY_FILE
            if os.path.lexists(path):
                return cls._load(path, directory)
            orphan = _orphan_public(directory)
            if orphan:
                raise AuditKeyError(
                    f"the audit signing key {path} is gone, but its public key {directory / PUB_FILE} ({orphan}) "
                    "is still there: the key the log was signed with was deleted or moved, and a new one would "
                    "sign on top of that log. Restore signing.key from a backup, or go on under a new key with "
                    "`gateway audit adopt --new-key` (it checks the log with the old public key and records the "
                    "change in the log)"
                )
            if not may_create:
                raise AuditKeyError(f"no audit signing key in {directory}")
            cls._create(directory)
            key = cls._load(path, directory)
            key.created = True
            return key

    @classmethod
    def replace(cls, directory: Path) -> tuple[SigningKey, str]:
        """A new key for a log whose key is gone (`gateway audit adopt --new-key`): never over a
        private key that is there. The old public key, if any, is kept beside it as
        `signing.pub.replaced-TIME`; returns the new key and that name ("" if there was none)."""
        directory = Path(directory)
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise AuditKeyError(f"cannot make the audit key directory {directory}: {exc.strerror}") from None
        _check_private_dir(directory)
        with _key_lock(directory):
            if os.path.lexists(directory / KEY_FILE):
                raise AuditKeyError(
                    f"there is a signing key in {directory}: a new key replaces only one that is gone "
                    "(`gateway audit adopt` without --new-key goes on with this one)"
                )
            kept = ""
            if os.path.lexists(directory / PUB_FILE):
                kept = f"{PUB_FILE}.replaced-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S%fZ')}"
                try:
                    os.rename(directory / PUB_FILE, directory / kept)
                except OSError as exc:
                    raise AuditKeyError(f"cannot move the old public key aside: {exc.strerror}") from None
            cls._create(directory)
            key = cls._load(directory / KEY_FILE, directory)
            key.created = True
            return key, kept

    @classmethod
    def _create(cls, directory: Path) -> None:
        private = Ed25519PrivateKey.generate()
        pem = private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        public = cls(private, directory).public.line().encode()
        try:
            for name, data, mode in ((KEY_FILE, pem, 0o600), (PUB_FILE, public, 0o644)):
                # a fresh name made here (O_EXCL): never a file someone planted or linked in advance
                tmp = directory / f".{name}.{secrets.token_hex(8)}"
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                try:
                    os.fchmod(fd, mode)
                    os.write(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, directory / name)
        except OSError as exc:
            raise AuditKeyError(f"cannot write the audit key in {directory}: {exc.strerror}") from None

    @classmethod
    def _load(cls, path: Path, directory: Path) -> SigningKey:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):
                    raise AuditKeyError(f"{path} is not a regular file")
                data = f.read(64 * 1024)
        except OSError as exc:
            raise AuditKeyError(f"cannot read the audit signing key {path}: {exc.strerror}") from None
        if st.st_uid != os.geteuid():
            raise AuditKeyError(f"{path} belongs to uid {st.st_uid}, not to the gateway's user ({os.geteuid()})")
        if st.st_mode & 0o077 or st.st_nlink != 1:
            raise AuditKeyError(
                f"{path} is readable by others or linked elsewhere (mode {st.st_mode & 0o777:o}, {st.st_nlink} "
                "links): the key may be known; make a new key directory"
            )
        try:
            private = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise AuditKeyError(f"{path}: not a PEM private key ({exc})") from None
        if not isinstance(private, Ed25519PrivateKey):
            raise AuditKeyError(f"{path}: not an Ed25519 key")
        return cls(private, directory)


@contextlib.contextmanager
def _key_lock(directory: Path) -> Iterator[None]:
    try:
        lock = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise AuditKeyError(f"cannot use the audit key directory {directory}: {exc.strerror}") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
    finally:
        os.close(lock)


def _orphan_public(directory: Path) -> str:
    """The fingerprint of a `signing.pub` left without its private key ("" when there is none;
    the file's name when it cannot be read as a key)."""
    pub = directory / PUB_FILE
    if not os.path.lexists(pub):
        return ""
    try:
        return f"key {VerifyKey.load(pub).fingerprint}"
    except AuditKeyError:
        return "a public key file that does not parse"


def _check_private_dir(directory: Path) -> None:
    """The key directory must be the gateway user's own, closed to everyone else: otherwise
    someone else could have planted or read what is in it."""
    try:
        st = os.lstat(directory)
    except OSError as exc:
        raise AuditKeyError(f"no audit key directory {directory}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise AuditKeyError(f"{directory} is not a directory (a link or a file)")
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise AuditKeyError(
            f"the audit key directory {directory} must belong to uid {os.geteuid()} with mode 700 "
            f"(it is uid {st.st_uid}, mode {st.st_mode & 0o777:o})"
        )
