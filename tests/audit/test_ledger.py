"""The ledger's anchor, attacked through the real `gateway` command (issue 23, points 16-18).

- A log whose key is gone is never signed on top by a new key: removing the key directory and
  rewriting the log used to pass (the next gateway made a key, adopted the unsigned log and
  signed it); removing only the private key made a new key silently.
- A log broken in the middle is never appended to, and `audit repair` cuts only what a crash
  tore: never a record a checkpoint covers, and never without recording the repair.
- A call a gateway allowed and never finished (kill -9) is marked `interrupted` by the next one.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.audit import canonical, digest, records
from gateway.audit.keys import VerifyKey
from gateway.sandbox.identity import hand_over
from tests import crashload
from tests.conftest import PATIENCE_S, eventually

GATEWAY = str(Path(sys.executable).parent / "gateway")
ROOT = Path(__file__).resolve().parent.parent.parent

POLICY = """version: 1
principals: {agent: {roles: [dev]}}
roles: {dev: {level: 1, read_roots: ["."], write_roots: ["."], limits: {timeout_ms: 600000}}}
tools: {run: {allow_from: 1}}
second_opinion: {unconfirmed: allow}
rules:
  - id: basics
    decision: allow
    justification: "harmless programs"
    programs: [echo, "true", sleep]
    examples: {match: ["echo x"]}
"""


@dataclass
class Site:
    """A gateway's files: its policy, workspace, audit directory and key directory."""

    policy: Path
    ws: Path
    audit: Path
    keys: Path

    @property
    def log(self) -> Path:
        return self.audit / "audit-000001.jsonl"

    def args(self) -> list[str]:
        return ["--policy", str(self.policy), "--workspace", str(self.ws),
                "--audit-dir", str(self.audit), "--audit-keys", str(self.keys)]  # fmt: skip

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        """`gateway run`: a gateway starts, decides and runs one call, and exits."""
        return subprocess.run(
            [GATEWAY, "run", *self.args(), "--", command],
            capture_output=True, text=True, timeout=PATIENCE_S, cwd=ROOT,
        )  # fmt: skip

    def start(self, command: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [GATEWAY, "run", *self.args(), "--", command],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True,
        )  # fmt: skip

    def audit_cmd(self, *args: str, keys: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [GATEWAY, "audit", *args, "--audit-dir", str(self.audit), "--audit-keys", str(keys or self.keys)],
            capture_output=True, text=True, timeout=PATIENCE_S, cwd=ROOT,
        )  # fmt: skip

    def records(self) -> list[dict[str, Any]]:
        return [r for _, _, r, _ in records(self.audit) if r] if self.audit.exists() else []


@pytest.fixture
def site(tmp_path: Path) -> Site:
    ws = tmp_path / "ws"
    ws.mkdir()
    hand_over(ws)
    policy = tmp_path / "p.yaml"
    policy.write_text(POLICY)
    return Site(policy, ws, tmp_path / "audit", tmp_path / "keys")


def rechain(kept: list[dict[str, Any]]) -> bytes:
    """What a forger without the key does: renumber, relink and rehash, every signature dropped."""
    out, prev = [], ""
    for seq, rec in enumerate(kept, 1):
        rec = {k: v for k, v in rec.items() if k not in ("hash", "sig")}
        rec.update(seq=seq, prev=prev)
        rec["hash"] = prev = digest(rec)
        out.append((canonical(rec) + "\n").encode())
    return b"".join(out)


def ran(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, done.stdout + done.stderr


# --- 16: the key the log was signed with -----------------------------------------------------------
def test_a_log_rewritten_after_its_key_directory_was_removed_stops_the_gateway(site: Site, tmp_path: Path) -> None:
    ran(site.run("echo deploy-prod"))
    ran(site.run("echo harmless"))
    pinned = tmp_path / "reviewer.pub"  # the reviewer's copy, taken off the machine at setup
    shutil.copy(site.keys / "signing.pub", pinned)
    # the attacker removes every key and checkpoint, and rewrites the log without the first call
    kept = [r for r in site.records() if "deploy-prod" not in json.dumps(r) and r["event"] != "audit_key"]
    shutil.rmtree(site.keys)
    site.log.write_bytes(rechain(kept))
    forged = site.log.read_bytes()

    started = site.run("echo after")
    assert started.returncode != 0, "a gateway started on a log it cannot verify with the key it last used"
    assert "has records, but there is no signing key" in started.stderr, started.stderr
    assert "gateway audit adopt --new-key" in started.stderr
    assert not (site.keys / "signing.key").exists() and site.log.read_bytes() == forged  # no new key, no record

    bare = site.audit_cmd("verify")
    assert bare.returncode == 1 and "no public key" in bare.stdout, bare.stdout
    reviewer = site.audit_cmd("verify", "--key", str(pinned), "--no-checkpoint")
    assert reviewer.returncode == 1 and "not signed by key" in reviewer.stdout, reviewer.stdout


def test_a_private_key_removed_is_an_error_that_names_the_remedy(site: Site) -> None:
    ran(site.run("echo one"))
    before = site.log.read_bytes()
    (site.keys / "signing.key").unlink()
    started = site.run("echo two")
    assert started.returncode != 0, "the gateway made a new key silently"
    assert "signing.key is gone" in started.stderr and "gateway audit adopt --new-key" in started.stderr
    assert not (site.keys / "signing.key").exists() and site.log.read_bytes() == before


def test_verify_warns_when_it_trusts_the_key_found_beside_the_log(site: Site, tmp_path: Path) -> None:
    ran(site.run("echo one"))
    beside = site.audit_cmd("verify")
    assert beside.returncode == 0, beside.stdout
    assert "warning: the key was found beside the log" in beside.stdout and "pass --key" in beside.stdout
    pinned = tmp_path / "reviewer.pub"
    shutil.copy(site.keys / "signing.pub", pinned)
    given = site.audit_cmd("verify", "--key", str(pinned))
    assert given.returncode == 0 and "warning" not in given.stdout, given.stdout
    as_json = json.loads(site.audit_cmd("verify", "--json").stdout)
    assert as_json["ok"] and as_json["warnings"]


def test_a_new_key_is_taken_only_by_an_admin_and_the_log_says_so(site: Site, tmp_path: Path) -> None:
    ran(site.run("echo one"))
    old = tmp_path / "old.pub"
    shutil.copy(site.keys / "signing.pub", old)
    (site.keys / "signing.key").unlink()  # lost
    adopted = site.audit_cmd("adopt", "--new-key")
    assert adopted.returncode == 0, adopted.stdout + adopted.stderr
    last = site.records()[-1]
    new = VerifyKey.load(site.keys / "signing.pub")
    assert last["event"] == "audit_adopted" and last["data"]["fingerprint"] == new.fingerprint
    assert last["data"]["previous"] == VerifyKey.load(old).fingerprint
    assert last["data"]["checked"].startswith(f"signatures with key {VerifyKey.load(old).fingerprint}")
    ran(site.run("echo two"))  # the gateway goes on, under the new key
    both = site.audit_cmd("verify", "--key", str(old), "--key", str(site.keys / "signing.pub"))
    assert both.returncode == 0 and "were adopted under key" not in both.stdout, both.stdout  # all checked
    assert "the log was adopted (`gateway audit adopt`)" in both.stdout  # and the adoption is shown
    new_only = site.audit_cmd("verify", "--key", str(site.keys / "signing.pub"))
    assert new_only.returncode == 0 and "were adopted under key" in new_only.stdout, new_only.stdout
    old_only = site.audit_cmd("verify", "--key", str(old))
    assert old_only.returncode == 1 and f"names key {new.fingerprint}" in old_only.stdout, old_only.stdout
    again = site.audit_cmd("adopt", "--new-key")  # never over a key that is there
    assert again.returncode == 2 and "there is a signing key" in again.stderr


# --- 17: never append to a log that does not verify; repair only what is torn -------------------
def test_a_log_broken_in_the_middle_is_never_appended_to(site: Site) -> None:
    for word in ("one", "two", "three"):
        ran(site.run(f"echo {word}"))
    lines = site.log.read_bytes().splitlines(keepends=True)
    middle = next(i for i, line in enumerate(lines) if b"echo two" in line)
    for broken in (
        lines[middle].replace(b"echo two", b"echo 2wo"),  # edited in place
        b"",  # removed
    ):
        site.log.write_bytes(b"".join(lines[:middle] + [broken] + lines[middle + 1 :]))
        data = site.log.read_bytes()
        started = site.run("echo four")
        assert started.returncode != 0, "a gateway appended to a log broken in the middle"
        assert f"audit-000001.jsonl:{middle + 1} (seq " in started.stderr, started.stderr
        assert "does not verify" in started.stderr and site.log.read_bytes() == data
    site.log.write_bytes(b"".join(lines))
    ran(site.run("echo four"))  # put back as it was, the log goes on


def test_repair_never_cuts_a_record_a_checkpoint_covers(site: Site) -> None:
    for word in ("one", "two", "three"):
        ran(site.run(f"echo {word}"))
    lines = site.log.read_bytes().splitlines(keepends=True)
    cut = b"".join(lines[:-3]) + lines[-3][:40]  # looks torn, but the checkpoint saw those records
    site.log.write_bytes(cut)
    done = site.audit_cmd("repair")
    assert done.returncode == 1 and "checkpoint" in done.stderr and "covers" in done.stderr, done.stderr
    assert site.log.read_bytes() == cut and not list(site.audit.glob("*.torn-*"))  # the evidence stays
    assert "truncated" in site.audit_cmd("verify").stdout or site.audit_cmd("verify").returncode == 1


def test_a_commit_a_crash_cut_short_is_moved_aside_whole_and_recorded(site: Site) -> None:
    ran(site.run("echo one"))
    last = site.records()[-1]
    crashed = []  # the first records of a commit whose signed last record never reached the disk
    prev = last["hash"]
    for n in (1, 2):
        rec = {"seq": last["seq"] + n, "ts": last["ts"], "event": "decision", "call_id": f"lost{n}", "prev": prev}
        rec["hash"] = prev = digest(rec)
        crashed.append((canonical(rec) + "\n").encode())
    tail = b'{"call_id":"lost3","event":"dec'
    with open(site.log, "ab") as f:
        f.write(b"".join(crashed) + tail)
    refused = site.run("echo two")
    assert refused.returncode != 0 and "gateway audit repair" in refused.stderr, refused.stderr
    done = site.audit_cmd("repair")
    assert done.returncode == 0, done.stdout + done.stderr
    repaired = site.records()[-1]
    assert repaired["event"] == "audit_repaired" and repaired["data"]["records"] == 2
    assert repaired["data"]["first_seq"] == last["seq"] + 1 and repaired["data"]["bytes"] == len(tail) + sum(
        map(len, crashed)
    )
    (aside,) = site.audit.glob("audit-000001.jsonl.torn-*")
    assert aside.read_bytes() == b"".join(crashed) + tail  # kept whole
    assert site.audit_cmd("verify").returncode == 0
    ran(site.run("echo two"))


# --- 18: calls a crash cut short ------------------------------------------------------------------
def _allowed(site: Site) -> list[str]:
    return [r["call_id"] for r in site.records() if r["event"] == "decision" and r.get("decision") == "allow"]


def test_calls_cut_short_by_kill_9_are_marked_interrupted_at_the_next_start(site: Site) -> None:
    """Two gateways on one log each run a command; one is killed with SIGKILL. The next gateway
    to start writes one `interrupted` record for the killed one's call, none for the call the
    other gateway is still running; once that one is killed too, the next start marks it."""
    marker = f"4{secrets.randbelow(10**6):06d}.{secrets.randbelow(10**6):06d}"
    procs: list[subprocess.Popen[str]] = []
    try:
        procs.append(site.start(f"sleep {marker}"))
        assert eventually(lambda: len(_allowed(site)) == 1), "the first gateway never allowed its call"
        procs.append(site.start(f"sleep {marker}"))
        assert eventually(lambda: len(_allowed(site)) == 2), "the second gateway never allowed its call"
        first, second = _allowed(site)
        assert eventually(lambda: len(crashload.with_marker(marker)) >= 2), "the commands never started"
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(PATIENCE_S)
        ran(site.run("echo next"))
        marked = [r for r in site.records() if r["event"] == "interrupted"]
        assert [r["call_id"] for r in marked] == [first], marked
        assert marked[0]["principal"] == "agent" and marked[0]["tool"] == "run"
        assert f"pid {procs[0].pid}" in marked[0]["data"]["why"]
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait(PATIENCE_S)
        ran(site.run("echo again"))
        ran(site.run("echo and again"))  # one record per call: never twice
        marked = [r["call_id"] for r in site.records() if r["event"] == "interrupted"]
        assert marked == [first, second], marked
        results = {r["call_id"] for r in site.records() if r["event"] == "result"}
        assert not {first, second} & results
        assert site.audit_cmd("verify").returncode == 0
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(PATIENCE_S)
        crashload.kill_all(crashload.with_marker(marker))


def test_a_finished_call_is_never_marked(site: Site) -> None:
    """A gateway that ends normally leaves its journal behind (nothing removes it when it exits):
    the next start finds its calls ended in the log, and marks none."""
    for word in ("one", "two"):
        ran(site.run(f"echo {word}"))
    assert not [r for r in site.records() if r["event"] == "interrupted"]
    assert len(list(site.audit.glob(".calls-*"))) <= 1  # the last gateway's; the others' were cleared


def test_the_part_a_writer_remembers_as_sound_is_checked_again_at_every_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restart walks only what was written since the writer last remembered the file as sound
    (beside its checkpoint); an edit inside that part changes its digest, and the whole file is
    walked again, and refused."""
    from gateway.audit import AuditUnavailable, open_signed
    from gateway.audit import writer as writer_module

    monkeypatch.setattr(writer_module, "MEMO_EVERY", 2048)
    audit, keys = tmp_path / "audit", tmp_path / "keys"
    log = open_signed(audit, keys)
    for i in range(40):
        log.append("decision", call_id=f"c{i}", decision="deny", arguments={"command": f"rm -rf /data{i}"})
    path = audit / "audit-000001.jsonl"
    memo = json.loads(next((keys / "checkpoints").glob("*.verified")).read_text())
    assert path.stat().st_size - memo["size"] < 2048 + 1024  # kept up to date while appending
    open_signed(audit, keys).append("server_started")  # a restart
    data = path.read_bytes()
    path.write_bytes(data.replace(b"rm -rf /data3", b"rm -rf /dat3a"))
    with pytest.raises(AuditUnavailable, match=r"audit-000001.jsonl:5 \(seq 5\): edited"):
        open_signed(audit, keys)


KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
from gateway.audit import AuditLog
from gateway.audit.writer import written_call_ids

log = AuditLog(Path(sys.argv[1]))
who = {"principal": "agent", "tool": "run"}
with written_call_ids():  # calls being handled
    log.append("decision", call_id="c000000000000001", decision="allow", **who)
    log.append("result", call_id="c000000000000001", data={"exit_code": 0}, **who)
    log.append("decision", call_id="c000000000000002", decision="allow", **who)
    log.append("egress_allowed", call_id="c000000000000002", principal="agent", tool="network", data={"host": "h"})
    log.append("decision", call_id="c000000000000003", decision="ask", **who)
    log.append("approval", call_id="c000000000000003", decision="allow", **who)
    log.append("decision", call_id="c000000000000004", decision="deny", **who)
log.append("decision", call_id="c000000000000005", decision="allow", **who)  # an agent hook's: it runs nothing
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_what_a_killed_writer_leaves_running_is_marked_and_nothing_else(tmp_path: Path) -> None:
    """Marked: a call allowed and never ended, even one whose network was recorded under it
    (its connections do not end it), and one an approval let go. Not marked: a call with its
    result, a denied one, a decision no call was handled for (an agent hook's)."""
    from gateway.audit import AuditLog

    audit = tmp_path / "audit"
    done = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(audit)], cwd=ROOT, timeout=PATIENCE_S)
    assert done.returncode == -signal.SIGKILL
    AuditLog(audit)  # the next start
    marked = [r for _, _, r, _ in records(audit) if r and r["event"] == "interrupted"]
    assert [r["call_id"] for r in marked] == ["c000000000000002", "c000000000000003"], marked
    assert all(r["principal"] == "agent" and r["tool"] == "run" for r in marked)
    assert not list(audit.glob(".calls-*"))  # taken, and gone
    AuditLog(audit)
    assert len([r for _, _, r, _ in records(audit) if r and r["event"] == "interrupted"]) == 2


def test_a_key_directory_swapped_for_another_key_is_refused_even_past_the_pin(tmp_path: Path) -> None:
    """Someone puts another key directory in place (a key of theirs, the checkpoint copied over
    and made to name that key) on a log whose last file has no pin (rotated): the log's last
    signature is not by that key, and the gateway does not start."""
    from gateway.audit import AuditLog, AuditUnavailable, open_signed
    from gateway.audit.checkpoint import default_path
    from gateway.audit.keys import SigningKey

    audit, keys, theirs = tmp_path / "audit", tmp_path / "keys", tmp_path / "theirs"
    log = AuditLog(audit, 2000, key=SigningKey.load_or_create(keys), checkpoint=default_path(audit, keys))
    for i in range(20):
        log.append("decision", call_id=f"c{i}", arguments={"command": "echo " + "x" * 100})
    assert len(list(audit.glob("audit-*.jsonl"))) > 1
    other = SigningKey.load_or_create(theirs)
    heads = default_path(audit, keys).read_text().splitlines()
    forged = json.loads(heads[-1]) | {"key": other.public.fingerprint}
    default_path(audit, theirs).parent.mkdir(parents=True, exist_ok=True)
    default_path(audit, theirs).write_text(json.dumps(forged) + "\n")
    with pytest.raises(AuditUnavailable, match="not signed by this gateway's key"):
        open_signed(audit, theirs)
    open_signed(audit, keys).append("server_started")  # with its own key it goes on
