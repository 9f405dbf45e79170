"""Tampering someone without the signing key can do, and `gateway audit verify` telling it.

The attacker here can rewrite every file of the audit directory (a backup, a compromised
account, a careless admin) but not read the gateway's signing key. Before signing and the
checkpoint, each of these passed `audit verify`: dropping the last records, and rewriting the
whole log with recomputed hashes (here: every record that mentions `make` gone).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.audit import AuditLog, AuditUnavailable, canonical, digest, open_signed, records, verify
from gateway.audit.checkpoint import default_path
from gateway.audit.keys import SigningKey, VerifyKey


def cli(audit: Path, keys: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "audit", *args, "--audit-dir", str(audit), "--audit-keys", str(keys)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def signed(tmp_path: Path) -> tuple[Path, Path]:
    audit, keys = tmp_path / "audit", tmp_path / "keys"
    log = open_signed(audit, keys)
    for i in range(12):
        command = "make test" if i % 3 == 0 else f"ls dir{i}"
        log.append("decision", call_id=f"c{i}", principal="agent", decision="allow", arguments={"command": command})
    return audit, keys


def lines(audit: Path) -> list[bytes]:
    return (audit / "audit-000001.jsonl").read_bytes().splitlines(keepends=True)


def rechain(kept: list[dict[str, Any]], drop_sig: bool = True) -> bytes:
    """What a forger does: renumber, relink and rehash every record (signatures cannot be made)."""
    out, prev = [], ""
    for seq, rec in enumerate(kept, 1):
        rec = {k: v for k, v in rec.items() if k not in ("hash",) + (("sig",) if drop_sig else ())}
        rec.update(seq=seq, prev=prev)
        rec["hash"] = prev = digest(rec)
        out.append((canonical(rec) + "\n").encode())
    return b"".join(out)


def test_an_intact_signed_log_verifies_with_key_and_checkpoint(signed: tuple[Path, Path]) -> None:
    audit, keys = signed
    done = cli(audit, keys, "verify")
    assert done.returncode == 0, done.stdout + done.stderr
    fingerprint = VerifyKey.load(keys / "signing.pub").fingerprint
    # the log's first record pins its key (`audit_key`), then the 12 decisions
    assert f"covered by 13 signatures valid for key {fingerprint}" in done.stdout
    assert "1 checkpoint(s) matched" in done.stdout
    assert all("sig" in r for _, _, r, _ in records(audit) if r)  # one writer, one at a time: each signed


def test_dropping_the_last_records_is_truncation(signed: tuple[Path, Path]) -> None:
    audit, keys = signed
    (audit / "audit-000001.jsonl").write_bytes(b"".join(lines(audit)[:-3]))
    assert verify(audit).ok  # the chain alone cannot tell: this is what passed before
    done = cli(audit, keys, "verify")
    assert done.returncode == 1
    assert "truncated: the log ends at seq 10 but a checkpoint" in done.stdout and "records 11..13" in done.stdout


def test_a_log_rewritten_with_recomputed_hashes_is_forged(signed: tuple[Path, Path]) -> None:
    audit, keys = signed
    kept = [json.loads(x) for x in lines(audit) if b"make" not in x]
    for drop_sig in (False, True):  # keeping the old signatures, or removing them all
        (audit / "audit-000001.jsonl").write_bytes(rechain(kept, drop_sig))
        assert verify(audit).ok  # consistent: this passed before
        done = cli(audit, keys, "verify")
        assert done.returncode == 1, done.stdout
        assert "forged" in done.stdout or "rewritten" in done.stdout or "not signed" in done.stdout, done.stdout


def test_a_forged_log_without_its_checkpoint_still_fails_on_the_key(signed: tuple[Path, Path]) -> None:
    audit, keys = signed
    kept = [json.loads(x) for x in lines(audit) if b"make" not in x]
    (audit / "audit-000001.jsonl").write_bytes(rechain(kept, drop_sig=False))
    default_path(audit, keys).unlink()
    done = cli(audit, keys, "verify", "--no-checkpoint")
    assert done.returncode == 1 and "forged: the signature does not verify" in done.stdout


def test_an_unsigned_rewrite_fails_when_the_reviewer_holds_the_key(signed: tuple[Path, Path], tmp_path: Path) -> None:
    audit, keys = signed
    pub = tmp_path / "reviewer.pub"  # copied off the machine at setup
    shutil.copy(keys / "signing.pub", pub)
    kept = [json.loads(x) for x in lines(audit) if b"make" not in x]
    (audit / "audit-000001.jsonl").write_bytes(rechain(kept, drop_sig=True))
    shutil.rmtree(keys)  # and every key and checkpoint on the machine gone
    done = cli(audit, tmp_path / "nothing", "verify", "--key", str(pub), "--no-checkpoint")
    assert done.returncode == 1 and "not signed by key" in done.stdout, done.stdout


def test_a_checkpoint_the_attacker_writes_is_not_signed(signed: tuple[Path, Path]) -> None:
    audit, keys = signed
    (audit / "audit-000001.jsonl").write_bytes(b"".join(lines(audit)[:-3]))
    cp_file = default_path(audit, keys)
    cp = json.loads(cp_file.read_text().splitlines()[-1])
    last = json.loads(lines(audit)[-1])
    cp.update(seq=last["seq"], hash="0" * 64)  # moved back, hash made up: no signature fits
    cp_file.write_text(json.dumps(cp) + "\n")  # the whole file replaced: every older head gone
    done = cli(audit, keys, "verify")
    assert done.returncode == 1 and "is not signed by key" in done.stdout


def test_the_writer_refuses_a_log_behind_its_checkpoint(signed: tuple[Path, Path]) -> None:
    audit, keys = signed
    (audit / "audit-000001.jsonl").write_bytes(b"".join(lines(audit)[:-3]))
    with pytest.raises(AuditUnavailable, match="records were removed"):
        open_signed(audit, keys)  # the gateway does not start on it: the head never moves back
    assert cli(audit, keys, "verify").returncode == 1  # the evidence is still there


def test_a_running_writer_refuses_a_log_that_went_backwards(tmp_path: Path) -> None:
    audit, keys = tmp_path / "audit", tmp_path / "keys"
    log = open_signed(audit, keys)
    for i in range(5):
        log.append("decision", call_id=f"c{i}")
    path = audit / "audit-000001.jsonl"
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:2]))
    with pytest.raises(AuditUnavailable, match=r"backwards|removed"):
        log.append("decision", call_id="after")
    assert len(path.read_bytes().splitlines()) == 2  # nothing appended on top of the cut


def test_a_rewritten_head_is_refused_by_the_writer(signed: tuple[Path, Path]) -> None:
    audit, keys = signed
    kept = [json.loads(x) for x in lines(audit)]
    kept[-1]["decision"] = "deny"
    (audit / "audit-000001.jsonl").write_bytes(rechain(kept, drop_sig=True))
    with pytest.raises(AuditUnavailable, match="rewritten"):
        open_signed(audit, keys)


def test_head_ships_a_checkpoint_that_verify_checks(signed: tuple[Path, Path], tmp_path: Path) -> None:
    audit, keys = signed
    shipped = tmp_path / "offsite-heads.jsonl"
    shipped.write_text(cli(audit, keys, "head").stdout)
    log = open_signed(audit, keys)
    log.append("decision", call_id="later")
    shipped.write_text(shipped.read_text() + cli(audit, keys, "head").stdout)
    ok = cli(audit, keys, "verify", "--checkpoint", str(shipped))
    assert ok.returncode == 0 and "2 checkpoint(s) matched" in ok.stdout, ok.stdout
    (audit / "audit-000001.jsonl").write_bytes(b"".join(lines(audit)[:-1]))
    default_path(audit, keys).unlink()  # the local checkpoint gone too: the shipped one still tells
    bad = cli(audit, keys, "verify", "--checkpoint", str(shipped))
    assert bad.returncode == 1 and "truncated" in bad.stdout


def test_a_signed_log_without_a_checkpoint_is_not_called_verified(signed: tuple[Path, Path]) -> None:
    audit, keys = signed
    default_path(audit, keys).unlink()
    done = cli(audit, keys, "verify")
    assert done.returncode == 1 and "no checkpoint for this log" in done.stdout
    assert cli(audit, keys, "verify", "--no-checkpoint").returncode == 0


def test_an_unsigned_log_gains_signatures_that_cover_the_old_part_once_adopted(tmp_path: Path) -> None:
    """A log from before signing is taken on only by an admin's `adopt --new-key`, on the record:
    a key made on the fly for it (as before) is what let an unsigned rewrite pass."""
    audit, keys = tmp_path / "audit", tmp_path / "keys"
    old = AuditLog(audit)  # a log from before signing
    for i in range(3):
        old.append("decision", call_id=f"old{i}")
    with pytest.raises(AuditUnavailable, match="adopt --new-key"):
        open_signed(audit, keys)
    adopted = cli(audit, keys, "adopt", "--new-key")
    assert adopted.returncode == 0, adopted.stdout + adopted.stderr
    assert "consistency only" in adopted.stdout
    log = open_signed(audit, keys)
    log.append("decision", call_id="new")
    done = cli(audit, keys, "verify", "--key", str(keys / "signing.pub"))
    assert done.returncode == 0, done.stdout  # the first signature covers the old records, through the chain
    (audit / "audit-000001.jsonl").write_bytes(b"".join(lines(audit)[:3]))
    cut = cli(audit, keys, "verify", "--no-checkpoint")  # cut back to the unsigned part
    assert cut.returncode == 1 and "not signed by key" in cut.stdout


def test_the_key_is_private_and_one_per_directory(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    a, b = SigningKey.load_or_create(keys), SigningKey.load_or_create(keys)
    assert a.public == b.public
    assert (keys / "signing.key").stat().st_mode & 0o777 == 0o600 and keys.stat().st_mode & 0o777 == 0o700
    (keys / "signing.key").chmod(0o644)
    with pytest.raises(Exception, match="readable by others"):
        SigningKey.load_or_create(keys)


def test_the_checkpoint_is_never_inside_the_audit_directory(tmp_path: Path) -> None:
    with pytest.raises(AuditUnavailable, match="keep it apart"):
        key = SigningKey.load_or_create(tmp_path / "k")
        AuditLog(tmp_path / "audit", key=key, checkpoint=tmp_path / "audit" / "cp")


def test_records_appended_after_the_last_signature_are_refused(signed: tuple[Path, Path]) -> None:
    audit, keys = signed
    last = json.loads(lines(audit)[-1])
    forged = {"seq": last["seq"] + 1, "ts": last["ts"], "event": "decision", "call_id": "x", "prev": last["hash"]}
    forged["hash"] = digest(forged)
    with open(audit / "audit-000001.jsonl", "ab") as f:
        f.write((canonical(forged) + "\n").encode())
    done = cli(audit, keys, "verify")
    assert done.returncode == 1 and "unsigned end" in done.stdout, done.stdout


def test_threads_committing_together_share_one_signature_that_covers_them(tmp_path: Path) -> None:
    import threading

    audit, keys = tmp_path / "audit", tmp_path / "keys"
    log = open_signed(audit, keys)
    threads = [threading.Thread(target=lambda: [log.append("decision") for _ in range(40)]) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [r for _, _, r, _ in records(audit) if r]
    assert len(every) == 321 and "sig" in every[-1]  # the pin, then 320
    done = cli(audit, keys, "verify")
    assert done.returncode == 0, done.stdout
    # a record inside a commit edited, its hash and every later one recomputed: the next signature breaks
    kept = [dict(r) for r in every]
    inside = next(i for i, r in enumerate(kept) if "sig" not in r)
    kept[inside]["call_id"] = "edited"
    prev = kept[inside - 1]["hash"] if inside else ""
    for r in kept[inside:]:
        r["prev"] = prev
        r["hash"] = prev = digest(r)
    (audit / "audit-000001.jsonl").write_bytes(b"".join((canonical(r) + "\n").encode() for r in kept))
    forged = cli(audit, keys, "verify", "--no-checkpoint")
    assert forged.returncode == 1 and "forged" in forged.stdout
