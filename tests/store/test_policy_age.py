"""The fleet policy's maximum age: a gateway cut off from the store decides under the last
revision it took only up to `fleet.max_policy_age_seconds`, then refuses every call naming the
store and the age, and goes on once the store answers (a real PostgreSQL stopped and started).
A bad value is a load error; a layer may only lower it."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.policy.loader import PolicyError
from gateway.policy.selftest import load_checked
from gateway.store import db
from tests.conftest import eventually
from tests.server.conftest import POLICY, HttpGateway, envelope_of, policy_file, ws
from tests.server.test_transports import call_http
from tests.store.pg import Postgres, bindir
from tests.store.test_fleet import fleet_token
from tests.store.test_policy import publish, write

__all__ = ["policy_file", "ws"]


@pytest.fixture
def own_pg() -> Iterator[Postgres]:
    found = bindir()
    if found is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl, postgres): apt-get install postgresql")
    server = Postgres(found)
    try:
        server.start()
        with db.Store(server.dsn()) as store:
            db.migrate(store, init=True)
        yield server
    finally:
        server.remove()


def _call(server: HttpGateway, token: str) -> dict[str, Any]:
    try:
        (result,) = asyncio.run(call_http(server.url, token, "auto", ("run", {"command": "echo hi"})))
    except Exception as exc:  # (the transport itself failed: not an answer)
        return {"status": "no answer", "error": {"message": repr(exc)}}
    found: dict[str, Any] = envelope_of(result)
    return found


def test_past_its_max_age_the_policy_refuses_every_call_until_the_store_answers(
    own_pg: Postgres, tmp_path: Path, policy_file: Path, ws: Path
) -> None:
    dsn = own_pg.dsn()
    aged = copy.deepcopy(POLICY)
    aged["fleet"] = {"max_policy_age_seconds": 3}
    done = publish(dsn, write(tmp_path / "v1" / "p.yaml", aged), tmp_path / "pk", ws)
    assert done.returncode == 0, done.stderr
    token, _ = fleet_token(dsn, policy_file)
    (tmp_path / "gw").mkdir()
    extra = (
        "--store",
        dsn,
        "--audit-keys",
        str(tmp_path / "keys"),
        "--policy-key",
        str(tmp_path / "pk" / "signing.pub"),
    )
    server = HttpGateway(tmp_path / "gw", policy_file, ws, extra=extra)
    try:
        assert _call(server, token)["status"] == "ok"
        own_pg.stop("immediate")
        refused = eventually(lambda: (e := _call(server, token)).get("error", {}).get("code") == "POLICY_TOO_OLD" and e)
        assert refused, _call(server, token)
        message = refused["error"]["message"]
        assert "the store postgresql://" in message and "max_policy_age_seconds (3 s)" in message
        own_pg.start()
        assert eventually(lambda: _call(server, token)["status"] == "ok")  # no restart: it resumes
    finally:
        server.stop()


def test_a_bad_max_age_is_a_load_error_and_a_layer_may_only_lower_it(tmp_path: Path, ws: Path) -> None:
    bad = copy.deepcopy(POLICY)
    bad["fleet"] = {"max_policy_age_seconds": 0}
    with pytest.raises(PolicyError, match=r"fleet\.max_policy_age_seconds"):
        load_checked(write(tmp_path / "bad.yaml", bad), ws)
    base = copy.deepcopy(POLICY)
    base["fleet"] = {"max_policy_age_seconds": 600}
    write(tmp_path / "base.yaml", base)
    upper = {"version": 1, "include": ["base.yaml"], "fleet": {"max_policy_age_seconds": 7200}}
    with pytest.raises(PolicyError, match="max_policy_age_seconds: 7200 is wider than 600"):
        load_checked(write(tmp_path / "upper.yaml", upper), ws)
    upper["fleet"] = {"max_policy_age_seconds": 60}
    assert load_checked(write(tmp_path / "upper.yaml", upper), ws).policy.fleet.max_policy_age_seconds == 60
