"""The audit log, on real files: the chain, tampering, rotation, concurrency, a full disk."""

from __future__ import annotations

import gc
import itertools
import json
import os
import subprocess
import sys
import threading
from importlib import import_module
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.audit import REDACTED, AuditLog, AuditUnavailable, canonical, digest, records, verify

record_forms = import_module("gateway.audit.records")  # the module (the package's `records` is its reader)


def fill(directory: Path, n: int, **kwargs: object) -> AuditLog:
    log = AuditLog(directory, **kwargs)  # type: ignore[arg-type]
    for i in range(n):
        log.append("decision", call_id=f"c{i}", principal="agent", decision="allow")
    return log


def lines_of(directory: Path) -> list[tuple[Path, list[bytes]]]:
    return [(p, p.read_bytes().splitlines(keepends=True)) for p in sorted(directory.glob("audit-*.jsonl"))]


def test_records_chain_and_verify(tmp_path: Path) -> None:
    fill(tmp_path, 5)
    result = verify(tmp_path)
    assert result.ok and result.records == 5, result.describe()
    recs = [r for _, _, r, _ in records(tmp_path)]
    assert [r["seq"] for r in recs] == [1, 2, 3, 4, 5]  # type: ignore[index]
    assert recs[0]["prev"] == ""  # type: ignore[index]
    assert all(b["prev"] == a["hash"] for a, b in itertools.pairwise(recs))  # type: ignore[index]
    assert all(r["hash"] == digest(r) for r in recs)  # type: ignore[arg-type,index]
    assert recs[0]["ts"].endswith("Z")  # type: ignore[index]


def rewrite(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(lines))


# each tampering: the line of the first record that breaks the chain, and the problem named
@pytest.mark.parametrize(
    ("kind", "line", "problem"),
    [
        ("edit", 3, "edited"),
        ("delete", 3, "chain breaks"),
        ("reorder", 3, "chain breaks"),
        ("truncate", 5, "truncated"),
        ("append_forged", 6, "chain breaks"),
        ("drop_first", 1, "chain breaks"),
    ],
)
def test_every_kind_of_tampering_is_named(tmp_path: Path, kind: str, line: int, problem: str) -> None:
    fill(tmp_path, 5)
    ((path, lines),) = lines_of(tmp_path)
    if kind == "edit":
        rec = json.loads(lines[2])
        rec["decision"] = "deny"
        lines[2] = (json.dumps(rec, sort_keys=True, separators=(",", ":")) + "\n").encode()
    elif kind == "delete":
        del lines[2]
    elif kind == "reorder":
        lines[2], lines[3] = lines[3], lines[2]
    elif kind == "truncate":
        lines[4] = lines[4][:-20]
    elif kind == "append_forged":
        forged = {"seq": 6, "event": "decision", "prev": "0" * 64}
        forged["hash"] = digest(forged)
        lines.append((canonical(forged) + "\n").encode())  # written as the writer would: only the chain tells
    elif kind == "drop_first":
        del lines[0]
    rewrite(path, lines)
    result = verify(tmp_path)
    assert not result.ok
    assert (result.line, problem in result.problem) == (line, True), result.describe()
    assert f"{path.name}:{line}" in result.describe()


def test_a_partial_last_record_stops_further_appends(tmp_path: Path) -> None:
    log = fill(tmp_path, 2)
    ((path, lines),) = lines_of(tmp_path)
    rewrite(path, [*lines[:-1], lines[-1][:-5]])
    with pytest.raises(AuditUnavailable, match="partial record"):
        log.append("decision", call_id="x")


def test_rotation_keeps_the_chain(tmp_path: Path) -> None:
    fill(tmp_path, 40, max_file_bytes=1500)
    files = sorted(tmp_path.glob("audit-*.jsonl"))
    assert len(files) > 3
    result = verify(tmp_path)
    assert result.ok and result.records == 40, result.describe()


def test_a_log_file_that_is_a_link_is_never_written_through(tmp_path: Path) -> None:
    # (a real full disk: tests/audit/test_full_disk.py) a link planted under a log's name, here
    # to /dev/full, is refused rather than followed: the gateway may be root
    log = AuditLog(tmp_path)
    (tmp_path / "audit-000001.jsonl").symlink_to("/dev/full")
    with pytest.raises(AuditUnavailable, match="symbolic links"):
        log.append("decision", call_id="x")
    with pytest.raises(AuditUnavailable, match="symbolic links"):
        AuditLog(tmp_path)


def test_an_unusable_directory_is_an_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(AuditUnavailable):
        AuditLog(blocker / "audit")


def test_eight_threads_never_break_the_chain(tmp_path: Path) -> None:
    log = AuditLog(tmp_path)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(50):
                log.append("decision", call_id=f"t{t}-{i}")
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    result = verify(tmp_path)
    assert result.ok and result.records == 400, result.describe()


WRITER = """
import sys
from pathlib import Path
from gateway.audit import AuditLog
log = AuditLog(Path(sys.argv[1]), max_file_bytes=20000)
for i in range(150):
    log.append("decision", call_id=f"{sys.argv[2]}-{i}")
"""


def test_two_processes_never_break_the_chain(tmp_path: Path) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), name]) for name in ("a", "b")]
    for p in procs:
        assert p.wait(120) == 0
    result = verify(tmp_path)
    assert result.ok and result.records == 300, result.describe()
    assert len(list(tmp_path.glob("audit-*.jsonl"))) > 1  # rotated under contention too


def test_secrets_are_redacted_and_marked(tmp_path: Path) -> None:
    log = AuditLog(tmp_path)
    rec = log.append(
        "decision",
        # secret values that no hash or timestamp can contain (hex digests hold "abc" now and then)
        arguments={"command": "make", "env": {"API_TOKEN": "sekrit-token", "CI": "1"}},
        data={
            "assignments": [{"name": "AWS_SECRET_ACCESS_KEY", "value": "sekrit-key"}],
            "argv": ["env", "GH_TOKEN=x", "make"],
        },
    )
    assert rec["arguments"]["env"] == {"API_TOKEN": REDACTED, "CI": "1"}
    assert rec["data"]["assignments"][0]["value"] == REDACTED
    assert rec["data"]["argv"] == ["env", f"GH_TOKEN={REDACTED}", "make"]
    raw = (tmp_path / "audit-000001.jsonl").read_text()
    assert "sekrit" not in raw


def test_audit_cli_verify_tail_show_query(tmp_path: Path) -> None:
    log = AuditLog(tmp_path)
    log.append("decision", call_id="c1", principal="agent", decision="allow", rule="git-read")
    log.append("decision", call_id="c2", principal="bob", decision="deny", rule="network")
    log.append("result", call_id="c1", principal="agent", data={"exit_code": 0})

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gateway", "audit", *args, "--audit-dir", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
            # a state of its own: a key an earlier test made in the session's state would make
            # this unsigned log "not signed by" it
            env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")},
        )

    assert cli("verify").stdout.startswith("ok: 3 records")
    shown = [json.loads(x) for x in cli("show", "c1", "--json").stdout.splitlines()]
    assert [r["event"] for r in shown] == ["decision", "result"]
    denied = cli("query", "--decision", "deny").stdout
    assert "network" in denied and "git-read" not in denied
    assert len(cli("tail", "-n", "2").stdout.splitlines()) == 2
    (tmp_path / "audit-000001.jsonl").write_text("garbage\\n")
    broken = cli("verify")
    assert broken.returncode == 1 and "audit-000001.jsonl:1" in broken.stdout


def test_prose_about_tokens_is_not_redacted(tmp_path: Path) -> None:
    rec = AuditLog(tmp_path).append("decision", arguments={"command": "git commit -m 'update token handling'"})
    assert rec["arguments"]["command"] == "git commit -m 'update token handling'"


_WORDS = [
    "TOKEN=",
    "--api-key ",
    "Bearer ",
    "basic ",
    "\u017fecret",
    "KEY",
    "--passwd=",
    "AUTH",
    "Credential",
    "abc123XYZ",
]


@settings(max_examples=600, deadline=None)
@example("run --api-key abc123XYZ")
@example("Bearer abc123XYZ")
@example("BASIC abc123XYZ=")
@example("X_\u017fECRET=abc123XYZ and more")
@given(st.lists(st.sampled_from([*_WORDS, "=", " ", "--", "-", ":"]) | st.text(max_size=6), max_size=7).map("".join))
def test_the_quick_check_before_the_text_patterns_skips_nothing_they_would_redact(text: str) -> None:
    # records.redact skips its free-text patterns when no hint word is in the text: that must
    # never change what is redacted (same flags, so the same case folding: a long s is an "s")
    slow = text
    for pattern in record_forms._IN_TEXT:
        slow = pattern.sub(lambda m: m.group(1) + record_forms.REDACTED, slow)
    if record_forms._ASSIGNMENT.match(text) and record_forms.SECRET_NAME.search(text.split("=", 1)[0]):
        return  # the assignment rule decides these, before the text patterns
    assert record_forms.redact(text) == slow


def test_a_record_that_was_not_written_does_not_count_as_the_calls_record(tmp_path: Path) -> None:
    """`Gateway.handle` records a call no stage recorded (no record, no call), judging by the call
    ids the writer saw written. A record that failed on its way to disk must not count: its id
    was counted before the write (review of the third session), so a handler that swallowed
    that failure would have answered with no record at all."""
    from gateway.audit.writer import written_call_ids

    log = AuditLog(tmp_path / "audit")
    with written_call_ids() as written:
        log.append("decision", call_id="kept", principal="agent", tool="run")
        name = next((tmp_path / "audit").glob("audit-*.jsonl"))
        name.unlink()
        name.mkdir()  # the log can no longer be read or extended: the next commit fails
        with pytest.raises(AuditUnavailable):
            log.append("decision", call_id="lost", principal="agent", tool="run")
    assert written == {"kept"}


def _open_under(directory: Path) -> list[str]:
    """This process's descriptors on anything under `directory` (the writers' files and
    directories): counted by what they name, not by how many there are, since a thread of an
    earlier test (a server's, a watcher's) may open or close one of its own meanwhile."""
    named = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed between listing and reading (listdir's own descriptor too)
            continue
        if target == str(directory) or target.startswith(f"{directory}/"):
            named.append(target)
    return named


def test_a_writer_closed_or_dropped_lets_its_descriptors_go(tmp_path: Path) -> None:
    """Each writer held its directory, its lock and its journal open for the life of the process:
    a test run that made a few hundred of them held 500-odd descriptors by its 70% (and pushed the
    pipes it made next past the sandbox's descriptor limit)."""
    gc.collect()  # what earlier tests dropped goes now, not in the middle of this count
    assert not _open_under(tmp_path)
    for i in range(20):
        log = AuditLog(tmp_path / f"a{i}")
        log.append("call", call_id=f"{i:016x}", tool="run")  # a call id: its journal is made
        if i % 2:
            log.close()
            log.close()  # twice is harmless
            with pytest.raises(AuditUnavailable, match="closed"):
                log.append("call", tool="run")
        del log
    gc.collect()
    assert not _open_under(tmp_path)
    for i in range(20):
        assert verify(tmp_path / f"a{i}").ok
