"""A full disk, a crash mid-write, and a request the size of a disk: the log stays whole.

The disk here is a real tmpfs of a few hundred KiB (mounted for the test; root only). Before:
the record that hit the limit was left half-written (92 of 557 bytes), every later append was
refused after space came back, and the server would not start again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.audit import AuditLog, AuditUnavailable, open_signed, records, verify
from gateway.audit.writer import MAX_RECORD_BYTES
from gateway.calls import RunCall
from gateway.pipeline import Gateway
from gateway.policy.compile import CompiledPolicy, compile_policy
from gateway.policy.schema import Policy
from gateway.sandbox.identity import hand_over
from tests.conftest import eventually
from tests.test_gateway import PERMISSIVE


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0755", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill_up(disk: Path) -> Path:
    """Take all the free space."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0")
    finally:
        os.close(fd)
    return filler


def append_until_full(log: AuditLog) -> int:
    n = 0
    with contextlib.suppress(AuditUnavailable):
        while True:
            log.append("decision", call_id=f"c{n}", arguments={"command": "x" * 500})
            n += 1
    return n


def test_an_append_on_a_full_disk_leaves_the_file_as_it_was_and_resumes(small_disk: Path, tmp_path: Path) -> None:
    audit = small_disk / "audit"
    log = open_signed(audit, tmp_path / "keys")
    for i in range(3):
        log.append("decision", call_id=f"early{i}")
    filler = fill_up(small_disk)
    written = 4 + append_until_full(log)  # (the key's pin first) the last page of the file fills up, then ENOSPC
    path = audit / "audit-000001.jsonl"
    before = path.read_bytes()
    assert before.endswith(b"\n")
    for _ in range(20):  # each failing append leaves no byte behind
        with pytest.raises(AuditUnavailable, match="No space left"):
            log.append("decision", call_id="refused", arguments={"command": "y" * 557})
        assert path.read_bytes() == before
    filler.unlink()  # space comes back: the same writer goes on, no repair, no restart
    log.append("decision", call_id="after")
    result = verify(audit)
    assert result.ok and result.records == written + 1, result.describe()
    assert open_signed(audit, tmp_path / "keys").append("server_started")["seq"] == written + 2  # a restart works


def test_the_gateway_refuses_calls_while_full_and_runs_them_when_space_returns(
    small_disk: Path, tmp_path: Path, policy: CompiledPolicy, ws: Path
) -> None:
    audit = small_disk / "audit"
    log = open_signed(audit, tmp_path / "keys")
    gw = Gateway(policy, log, hidden=(tmp_path / "keys",))
    try:
        assert gw.handle(RunCall(principal="agent", command="echo before"))["status"] == "ok"
        filler = fill_up(small_disk)
        append_until_full(log)
        refused = gw.handle(RunCall(principal="agent", command="echo x > ran-while-full"))
        assert refused["error"]["code"] == "AUDIT_UNAVAILABLE"
        assert not (ws / "ran-while-full").exists()
        filler.unlink()
        again = gw.handle(RunCall(principal="agent", command="echo after"))
        assert again["status"] == "ok" and again["stdout"] == "after\n", again
    finally:
        gw.close()
    assert verify(audit).ok


def cli(audit: Path, keys: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "audit", *args, "--audit-dir", str(audit), "--audit-keys", str(keys)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_torn_tail_from_a_crash_is_repaired_and_the_repair_recorded(tmp_path: Path) -> None:
    audit, keys = tmp_path / "audit", tmp_path / "keys"
    log = open_signed(audit, keys)
    for i in range(4):
        log.append("decision", call_id=f"c{i}")
    path = audit / "audit-000001.jsonl"
    torn = b'{"call_id":"c4","event":"decision","prev":"'  # a power cut in the middle of a write
    with open(path, "ab") as f:
        f.write(torn)
    with pytest.raises(AuditUnavailable, match="gateway audit repair"):
        open_signed(audit, keys).append("server_started")
    broken = cli(audit, keys, "verify")
    assert broken.returncode == 1 and "torn" in broken.stdout and "gateway audit repair" in broken.stdout
    done = cli(audit, keys, "repair")
    assert done.returncode == 0, done.stdout + done.stderr
    (aside,) = audit.glob("audit-000001.jsonl.torn-*")
    assert aside.read_bytes() == torn  # kept, not destroyed
    last = json.loads(path.read_bytes().splitlines()[-1])
    assert last["event"] == "audit_repaired" and last["seq"] == 6  # the pin, 4 decisions, the repair
    assert last["data"]["sha256"] == hashlib.sha256(torn).hexdigest() and last["data"]["bytes"] == len(torn)
    assert cli(audit, keys, "verify").returncode == 0
    open_signed(audit, keys).append("server_started")  # the gateway starts again
    assert cli(audit, keys, "repair").stdout.startswith("nothing to repair")


def test_repair_never_hides_tampering(tmp_path: Path) -> None:
    audit, keys = tmp_path / "audit", tmp_path / "keys"
    log = open_signed(audit, keys)
    for i in range(4):
        log.append("decision", call_id=f"c{i}", decision="deny")
    path = audit / "audit-000001.jsonl"
    data = path.read_bytes().replace(b'"decision":"deny"', b'"decision":"allo"', 1) + b'{"torn'
    path.write_bytes(data)
    done = cli(audit, keys, "repair")
    assert done.returncode == 1 and "not repairable" in done.stderr and "edited" in done.stderr
    assert path.read_bytes() == data


def test_a_huge_command_is_recorded_by_size_and_digest(tmp_path: Path, policy: CompiledPolicy) -> None:
    log = AuditLog(tmp_path / "audit")
    gw = Gateway(policy, log)
    command = "echo " + "A" * (1 << 20) + "\n"  # 1 MiB: the largest a call may carry
    try:
        result = gw.handle(RunCall(principal="agent", command=command[: 1 << 20]))
    finally:
        gw.close()
    assert result["status"] == "denied"
    size = max(p.stat().st_size for p in (tmp_path / "audit").glob("audit-*.jsonl"))
    assert size < 200_000, size  # before: the command in full, in every record of the call
    raw = (tmp_path / "audit" / "audit-000001.jsonl").read_text()
    assert hashlib.sha256(command[: 1 << 20].encode()).hexdigest() in raw


def test_no_record_outgrows_its_cap_however_many_fields_are_long(tmp_path: Path) -> None:
    log = AuditLog(tmp_path)
    record = log.append("rejected", data={f"f{i}": "z" * 60_000 for i in range(100)}, arguments={"l": ["x"] * 10**6})
    size = len(json.dumps(record))
    assert size < MAX_RECORD_BYTES, size
    assert verify(tmp_path).ok


def test_one_bad_record_in_a_group_commit_fails_only_its_caller(tmp_path: Path) -> None:
    import threading

    log = AuditLog(tmp_path)
    results: dict[int, str] = {}

    def work(i: int) -> None:
        try:
            log.append("decision", call_id=f"c{i}", data=object() if i == 3 else {"i": i})
            results[i] = "ok"
        except AuditUnavailable as exc:
            results[i] = str(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert "not serialisable" in results[3]
    assert all(results[i] == "ok" for i in range(8) if i != 3)
    assert verify(tmp_path).records == 7


# --- the reserve: a full disk is a refused call, recorded ---------------------------------------


@pytest.fixture
def shared_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of 8 MiB that holds both the audit log and the agent's workspace."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    mnt = tmp_path / "shared"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0711", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def records_of(audit: Path, call_id: str) -> list[dict[str, object]]:
    return [r for _, _, r, _ in records(audit) if r and r.get("call_id") == call_id]


def test_an_agent_that_fills_the_disk_gets_refused_calls_on_the_record_not_a_dead_gateway(
    shared_disk: Path, tmp_path: Path
) -> None:
    """The agent's workspace and the audit log share a disk; the agent fills it (its budget is
    larger than the disk). Before: the call that filled it ended with no result record, and
    every later call was refused with nothing in the log to say so. Now the refusals and the
    result are written from the writer's reserve, the call that would run is still refused
    (an allowed decision never uses the reserve), and all works again once space returns."""
    ws = shared_disk / "ws"
    ws.mkdir()
    hand_over(ws)
    audit, keys = shared_disk / "audit", tmp_path / "keys"
    policy = compile_policy(Policy.model_validate(PERMISSIVE), tmp_path / "p.yaml", ws, sha256="test")
    gw = Gateway(policy, open_signed(audit, keys), hidden=(keys,))
    try:
        assert gw.handle(RunCall(principal="agent", command="echo before"))["status"] == "ok"
        reserve = audit / ".reserve"
        held = reserve.stat().st_size
        assert held >= 512 << 10, held  # an eighth of the free space, here
        filled = gw.handle(RunCall(principal="agent", command="cat /dev/zero > fill; echo done"))
        assert filled["status"] == "ok" and "No space left" in filled["stderr"], filled
        assert [r["event"] for r in records_of(audit, filled["call_id"])] == ["decision", "result"]
        for _ in range(50):  # (the last page of the log's file may hold a few more records)
            refused = gw.handle(RunCall(principal="agent", command="echo x > ran-while-full"))
            if refused["status"] != "ok":
                break
            (ws / "ran-while-full").unlink()
        assert refused["error"]["code"] == "AUDIT_UNAVAILABLE" and "warning" not in refused, refused
        assert not (ws / "ran-while-full").exists()
        (rejected,) = records_of(audit, refused["call_id"])
        assert rejected["event"] == "rejected" and rejected["decision"] == "deny"
        assert "No space left" in str(rejected["data"])
        denied = gw.handle(RunCall(principal="agent", command="curl http://x"))  # a denial needs no space of its own
        assert denied["status"] == "denied" and records_of(audit, denied["call_id"])[0]["decision"] == "deny"
        assert reserve.stat().st_size < held  # what was recorded came from the reserve
        (ws / "fill").unlink()  # space comes back
        again = gw.handle(RunCall(principal="agent", command="echo after"))
        assert again["status"] == "ok" and again["stdout"] == "after\n", again
        refilled = eventually(
            lambda: gw.handle(RunCall(principal="agent", command="true")) and reserve.stat().st_size >= held, every=0.2
        )
        assert refilled, reserve.stat().st_size
    finally:
        gw.close()
    assert verify(audit).ok
