"""Policy rollout through the store: a policy published once (checked, signed) reaches every
gateway of the fleet within seconds; one that fails its checks is not published; one signed with
a key the gateways do not pin reaches none; each gateway reports what it took."""

from __future__ import annotations

import asyncio
import copy
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from gateway.audit.keys import SigningKey
from gateway.audit.records import canonical
from gateway.store import policy as rollout
from tests.conftest import eventually
from tests.server.conftest import POLICY, HttpGateway, envelope_of, policy_file, ws
from tests.server.test_transports import call_http
from tests.store.test_fleet import fleet_token
from tests.store.test_ledger import gateway

__all__ = ["policy_file", "ws"]

NO_PRINTF = {"id": "no-printf", "decision": "deny", "justification": "printf is out, fleet-wide",
             "programs": ["printf"], "examples": {"match": ["printf x"]}}  # fmt: skip


def write(path: Path, policy: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(policy, sort_keys=False))
    return path


def publish(dsn: str, path: Path, key: Path, ws: Path) -> Any:
    return gateway("policy", "publish", str(path), "--store", dsn, "--signing-key", str(key), "--workspace", str(ws))


@pytest.fixture
def published_fleet(tmp_path: Path, policy_file: Path, ws: Path, dsn: str) -> Iterator[list[HttpGateway]]:
    first = publish(dsn, write(tmp_path / "v1" / "p.yaml", POLICY), tmp_path / "pk", ws)
    assert first.returncode == 0, first.stderr
    servers: list[HttpGateway] = []
    try:
        for i in range(2):
            home = tmp_path / f"gw{i}"
            home.mkdir()
            extra = ("--store", dsn, "--audit-keys", str(tmp_path / "keys"), "--policy-key",
                     str(tmp_path / "pk" / "signing.pub"))  # fmt: skip
            servers.append(HttpGateway(home, policy_file, ws, extra=extra))
        yield servers
    finally:
        for s in servers:
            s.stop()


def status_of(server: HttpGateway, token: str, command: str) -> str:
    (result,) = asyncio.run(call_http(server.url, token, "auto", ("run", {"command": command})))
    return str(envelope_of(result)["status"])


def test_a_published_policy_reaches_every_gateway_and_a_bad_one_none(
    published_fleet: list[HttpGateway], dsn: str, tmp_path: Path, ws: Path, policy_file: Path
) -> None:
    token, _ = fleet_token(dsn, policy_file)
    for server in published_fleet:
        assert status_of(server, token, "printf hi") == "ok"
    v2 = copy.deepcopy(POLICY)
    v2["rules"].append(NO_PRINTF)
    done = publish(dsn, write(tmp_path / "v2" / "p.yaml", v2), tmp_path / "pk", ws)
    assert done.returncode == 0 and "as revision 2" in done.stdout, done.stderr
    for server in published_fleet:  # within the sync's second and the holder's: bounded generously
        assert eventually(lambda s=server: status_of(s, token, "printf hi") == "denied", seconds=60)
    # a policy whose checks fail is not published at all
    broken = copy.deepcopy(v2)
    broken["rules"][-1]["examples"] = {"match": ["echo x"]}  # the example contradicts the rule
    refused = publish(dsn, write(tmp_path / "v3" / "p.yaml", broken), tmp_path / "pk", ws)
    assert refused.returncode == 2 and "not published" in refused.stderr
    # one signed with a key the gateways do not pin reaches none (it would allow printf again)
    other = publish(dsn, write(tmp_path / "v4" / "p.yaml", POLICY), tmp_path / "not-pinned", ws)
    assert other.returncode == 0 and "as revision 3" in other.stdout

    def reported() -> list[tuple[Any, ...]]:
        with psycopg.connect(dsn) as conn:
            return conn.execute("SELECT rev, state, error FROM agw.policy_status ORDER BY stream").fetchall()

    assert eventually(lambda: [r[:2] for r in reported()] == [(3, "rejected"), (3, "rejected")])
    assert all("does not pin" in str(r[2]) for r in reported())
    for server in published_fleet:
        assert status_of(server, token, "printf hi") == "denied"
        assert "policy revision 3 from the store refused" in server.stderr.read_text()


def _insert_signed(dsn: str, path: Path, key_dir: Path) -> int:
    """A revision stored as `publish` stores it, without its checks (an older publisher, or
    someone with the key and SQL): signed with the pinned key, so it verifies."""
    body = rollout.bundle(path)
    sha = hashlib.sha256(canonical(body).encode()).hexdigest()
    key = SigningKey.load_or_create(key_dir)
    with psycopg.connect(dsn) as conn:
        values = (sha, canonical(body), key.public.line().strip(), key.sign(sha))
        row = conn.execute("INSERT INTO agw.policy_revision (sha256, bundle, key, sig) VALUES (%s, %s, %s, %s) "
                           "RETURNING rev", values).fetchone()  # fmt: skip
    assert row is not None
    return int(row[0])


def test_a_signed_revision_that_fails_a_gateways_checks_is_never_its_last_good_one(
    published_fleet: list[HttpGateway], dsn: str, tmp_path: Path, ws: Path, policy_file: Path
) -> None:
    """A revision that verifies but fails the gateway's own checks was written into its policy
    directory all the same: the running gateway refused to switch, but the next start loaded
    it from disk and stopped. The gateway checks a revision before it writes it: the directory
    keeps the last good one, and a restart serves it."""
    token, _ = fleet_token(dsn, policy_file)
    v2 = copy.deepcopy(POLICY)
    v2["rules"].append(NO_PRINTF)
    assert publish(dsn, write(tmp_path / "v2" / "p.yaml", v2), tmp_path / "pk", ws).returncode == 0
    for server in published_fleet:
        assert eventually(lambda s=server: status_of(s, token, "printf hi") == "denied", seconds=60)
    broken = copy.deepcopy(POLICY)  # printf allowed again, but its own example contradicts its rule
    broken["rules"].append({**NO_PRINTF, "examples": {"match": ["echo x"]}})
    rev = _insert_signed(dsn, write(tmp_path / "v3" / "p.yaml", broken), tmp_path / "pk")

    def reported() -> list[tuple[Any, ...]]:
        with psycopg.connect(dsn) as conn:
            return conn.execute("SELECT rev, state, error FROM agw.policy_status ORDER BY stream").fetchall()

    assert eventually(lambda: [r[:2] for r in reported()] == [(rev, "rejected")] * 2, seconds=60), reported()
    assert all("fails this gateway's checks" in str(r[2]) for r in reported()), reported()
    first = published_fleet[0]
    on_disk = first.tmp / "processes" / "policy" / "p.yaml"
    assert yaml.safe_load(on_disk.read_text()) == v2  # the last good revision, whole
    assert not (first.tmp / "processes" / "policy.next").exists()
    first.stop()
    extra = ("--store", dsn, "--audit-keys", str(tmp_path / "keys"), "--policy-key",
             str(tmp_path / "pk" / "signing.pub"))  # fmt: skip
    again = HttpGateway(first.tmp, policy_file, ws, extra=extra)
    published_fleet[0] = again  # stopped by the fixture
    assert status_of(again, token, "printf hi") == "denied"  # v2, still
    assert f"policy revision {rev} from the store refused: it fails this gateway's checks" in again.stderr.read_text()
