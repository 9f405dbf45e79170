"""A red team's attacks on the signed log, each replayed here (found against the first version of
signing; each passed or broke something then).

The attacker can write the audit directory and its parent, but cannot read the key directory
(0700, the gateway's own): that is what keeps the private key and the checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from gateway.audit import AuditLog, AuditUnavailable, canonical, digest, open_signed, verify
from gateway.audit.checkpoint import default_path
from gateway.audit.keys import AuditKeyError, SigningKey
from gateway.audit.writer import MAX_RECORD_BYTES


def cli(audit: Path, keys: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "audit", *args, "--audit-dir", str(audit), "--audit-keys", str(keys)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def made_up(n: int, start: int = 1, prev: str = "") -> bytes:
    """Records as a forger writes them: canonical, hashed, chained, unsigned."""
    out = []
    for seq in range(start, start + n):
        r: dict[str, Any] = {"seq": seq, "ts": "2020-01-01T00:00:00.000000Z", "event": "decision", "prev": prev}
        r.update(call_id=f"fake{seq}", decision="allow", arguments={"command": "echo harmless"})
        r["hash"] = prev = digest(r)
        out.append((canonical(r) + "\n").encode())
    return b"".join(out)


@pytest.fixture
def live(tmp_path: Path) -> tuple[AuditLog, Path, Path]:
    audit, keys = tmp_path / "audit", tmp_path / "keys"
    log = open_signed(audit, keys)
    for i in range(5):
        log.append("decision", call_id=f"c{i}", decision="deny", arguments={"command": f"rm -rf /data{i}"})
    return log, audit, keys


def test_a_live_writer_never_signs_over_a_log_rewritten_under_it(live: tuple[AuditLog, Path, Path]) -> None:
    log, audit, keys = live
    (audit / "audit-000001.jsonl").write_bytes(made_up(7))  # longer than the checkpoint's seq 5
    with pytest.raises(AuditUnavailable, match="no holder of this gateway's key signed"):
        log.append("decision", call_id="next")
    assert cli(audit, keys, "verify").returncode == 1


def test_records_added_while_the_gateway_was_stopped_are_not_signed_over(live: tuple[AuditLog, Path, Path]) -> None:
    _, audit, keys = live
    path = audit / "audit-000001.jsonl"
    last = json.loads(path.read_bytes().splitlines()[-1])
    with open(path, "ab") as f:
        f.write(made_up(1, start=last["seq"] + 1, prev=last["hash"]))  # an "approval" nobody gave
    with pytest.raises(AuditUnavailable, match="no holder of this gateway's key signed"):
        open_signed(audit, keys)  # the gateway does not start on it
    done = cli(audit, keys, "verify")
    assert done.returncode == 1 and "unsigned end" in done.stdout
    assert cli(audit, keys, "head").returncode == 1  # and no head is shipped that vouches for it


def test_swapping_the_directory_for_a_shorter_copy_is_refused(live: tuple[AuditLog, Path, Path]) -> None:
    _, audit, keys = live
    copy = audit.with_name("audit.y")
    copy.mkdir()
    lines = (audit / "audit-000001.jsonl").read_bytes().splitlines(keepends=True)
    (copy / "audit-000001.jsonl").write_bytes(b"".join(lines[:2]))
    audit.rename(audit.with_name("audit.orig"))
    audit.symlink_to(copy)  # its real path changed: another checkpoint name
    with pytest.raises(AuditUnavailable, match="no checkpoint"):
        open_signed(audit, keys)


def test_a_log_without_its_checkpoint_goes_on_only_once_adopted(live: tuple[AuditLog, Path, Path]) -> None:
    _, audit, keys = live
    default_path(audit, keys).unlink()  # lost (a restore from backup, say)
    with pytest.raises(AuditUnavailable, match="gateway audit adopt"):
        open_signed(audit, keys)
    done = cli(audit, keys, "adopt")
    assert done.returncode == 0, done.stderr
    open_signed(audit, keys).append("server_started")
    assert cli(audit, keys, "verify").returncode == 0
    path = audit / "audit-000001.jsonl"
    path.write_bytes(made_up(3))
    default_path(audit, keys).unlink()
    refused = cli(audit, keys, "adopt")  # a forgery is not adopted
    assert refused.returncode == 1 and "nothing vouches for it" in refused.stderr
    last = json.loads(path.read_bytes().splitlines()[-1])
    path.write_bytes(path.read_bytes() + made_up(1, start=4, prev=last["hash"]))
    assert cli(audit, keys, "adopt").returncode == 1


def test_a_full_disk_never_tears_the_checkpoint(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    from tests.audit.test_full_disk import fill_up

    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], check=True)
    try:
        audit, keys = tmp_path / "audit", disk / "keys"  # the checkpoint's disk fills up, not the log's
        log = open_signed(audit, keys)
        for i in range(3):
            log.append("decision", call_id=f"c{i}")
        filler = fill_up(disk)
        failures = 0
        for i in range(200):  # the heads file's last page fills, then every head fails
            try:
                log.append("decision", call_id=f"d{i}", data={"pad": "x" * 300})
            except AuditUnavailable as exc:
                assert "head was not" in str(exc)
                failures += 1
        assert failures
        assert default_path(audit, keys).read_bytes().endswith(b"\n")  # before: a partial head, for good
        filler.unlink()
        log.append("decision", call_id="after")  # space back: the same writer goes on
        assert open_signed(audit, keys).append("server_started")
        assert cli(audit, keys, "verify").returncode == 0
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_links_and_fifos_in_the_directory_are_never_followed(tmp_path: Path) -> None:
    audit, keys = tmp_path / "audit", tmp_path / "keys"
    victim = tmp_path / "machine-id"
    victim.write_text("0123456789abcdef\n")
    log = open_signed(audit, keys)
    log.append("decision", call_id="a")
    (audit / "audit-000002.jsonl").symlink_to(victim)
    assert cli(audit, keys, "repair").returncode == 1
    assert victim.read_text() == "0123456789abcdef\n"  # before: truncated to 0 bytes by root
    (audit / "audit-000002.jsonl").unlink()
    (audit / "audit-000002.jsonl").symlink_to(tmp_path / "outside.jsonl")  # dangling: rotation's next name
    with pytest.raises(AuditUnavailable, match="symbolic links"):
        log.append("decision", call_id="rotates")
    with pytest.raises(AuditUnavailable, match="symbolic links"):
        AuditLog(audit, max_file_bytes=10, key=log.key, checkpoint=log.checkpoint).append("decision")
    assert not (tmp_path / "outside.jsonl").exists()
    (audit / "audit-000002.jsonl").unlink()
    os.mkfifo(audit / "audit-000002.jsonl")
    done = cli(audit, keys, "verify", timeout=60)  # before: blocked forever
    assert done.returncode == 1 and "cannot be read" in done.stdout


def test_a_line_with_duplicate_keys_is_not_canonical(live: tuple[AuditLog, Path, Path]) -> None:
    _, audit, keys = live
    path = audit / "audit-000001.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    # a first-wins reader (grep, a person) sees "allow": the hash covers the last "deny"
    lines[1] = lines[1].replace(b'{"arguments"', b'{"decision":"allow","arguments"', 1)  # after the key's pin
    path.write_bytes(b"".join(lines))
    done = cli(audit, keys, "verify")
    assert done.returncode == 1 and "not canonical" in done.stdout


def test_a_key_directory_someone_else_can_write_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to hand the directory to another user")
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o777)
    os.chown(keys, 65534, 65534)
    keys.chmod(0o777)
    with pytest.raises(AuditKeyError, match="must belong to uid 0 with mode 700"):
        SigningKey.load_or_create(keys)
    assert not (keys / "signing.key").exists()


def test_a_key_with_a_second_link_is_refused(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    SigningKey.load_or_create(keys)
    os.link(keys / "signing.key", tmp_path / "copy")
    with pytest.raises(AuditKeyError, match="linked elsewhere"):
        SigningKey.load_or_create(keys)


@pytest.mark.parametrize(
    "fields",
    [
        {"data": {"k" * 10_000_000: 1}},  # one huge key
        {"data": [[["x" * 1024] * 50] * 50] * 50},  # shared lists: 128 MB before
        {"data": {f"f{i}": "\U0001f600" * 65_000 for i in range(15)}},  # characters, not bytes: 3.9 MB before
    ],
    ids=["huge-key", "shared-lists", "emoji"],
)
def test_no_record_outgrows_its_cap(tmp_path: Path, fields: dict[str, Any]) -> None:
    record = AuditLog(tmp_path).append("rejected", **fields)
    assert len(canonical(record).encode()) < MAX_RECORD_BYTES
    assert verify(tmp_path).ok


def test_deep_nesting_is_recorded_as_such_not_a_crash(tmp_path: Path) -> None:
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    record = AuditLog(tmp_path).append("rejected", data=deep)  # before: RecursionError out of append
    assert "nested deeper" in json.dumps(record)
    with pytest.raises(AuditUnavailable, match="the writer's own"):
        AuditLog(tmp_path).append("decision", seq=1)  # before: the chain broken for good


def test_a_deeply_nested_line_is_named_not_a_traceback(live: tuple[AuditLog, Path, Path]) -> None:
    _, audit, keys = live
    path = audit / "audit-000001.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b"[" * 100_000 + b"]" * 100_000 + b"\n" + b"".join(lines[1:]))
    done = cli(audit, keys, "verify", "--json")
    assert done.returncode == 1 and json.loads(done.stdout)["problem"] == "not a JSON record"


def test_a_same_size_rewrite_under_a_live_writer_is_caught(live: tuple[AuditLog, Path, Path]) -> None:
    log, audit, _ = live
    path = audit / "audit-000001.jsonl"
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"decision":"deny"', b'"decision":"ally"'))  # same size, same inode
    with pytest.raises(AuditUnavailable):
        log.append("decision", call_id="next")


def test_repair_never_makes_a_key_and_moves_an_unsigned_end_aside(live: tuple[AuditLog, Path, Path]) -> None:
    _, audit, keys = live
    path = audit / "audit-000001.jsonl"
    last = json.loads(path.read_bytes().splitlines()[-1])
    with open(path, "ab") as f:  # a commit a power cut left without its signed last record
        f.write(made_up(2, start=last["seq"] + 1, prev=last["hash"]))
    wrong = cli(audit, keys.with_name("keyz"), "repair")  # a mistyped key directory
    assert wrong.returncode != 0 and "no public key" in wrong.stderr and not keys.with_name("keyz").exists()
    done = cli(audit, keys, "repair")
    assert done.returncode == 0 and "2 whole unsigned records" in done.stdout, done.stdout + done.stderr
    assert cli(audit, keys, "verify").returncode == 0


def test_a_checkpoint_of_another_log_is_named(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        log = open_signed(d, keys)
        log.append("decision", call_id=d.name)
    done = cli(a, keys, "verify", "--checkpoint", str(default_path(b, keys)))
    assert done.returncode == 1 and f"names the log {b}" in done.stdout


def test_group_commit_under_two_processes_loses_nothing_it_acknowledged(tmp_path: Path) -> None:
    audit, keys = tmp_path / "audit", tmp_path / "keys"
    open_signed(audit, keys).append("server_started")
    script = (
        "import sys, threading\nfrom pathlib import Path\nfrom gateway.audit import open_signed\n"
        "log = open_signed(Path(sys.argv[1]), Path(sys.argv[2]))\n"
        "def w(t):\n    for i in range(60): log.append('decision', call_id=f'{sys.argv[3]}-{t}-{i}')\n"
        "ts = [threading.Thread(target=w, args=(t,)) for t in range(6)]\n"
        "[t.start() for t in ts]\n[t.join() for t in ts]\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", script, str(audit), str(keys), n]) for n in "ab"]
    for p in procs:
        assert p.wait(120) == 0
    done = cli(audit, keys, "verify")
    assert done.returncode == 0 and "ok: 722 records" in done.stdout, done.stdout  # the pin, 1 + 2 x 360
    _ = threading
