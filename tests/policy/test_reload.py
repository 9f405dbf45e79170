"""A policy changed on disk takes over atomically once it validates; a broken one is refused."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from gateway.decision import Verdict
from gateway.pipeline import evaluate
from gateway.policy.reload import PolicyHolder

POLICY = """version: 1
principals: {{agent: {{roles: [r]}}}}
roles: {{r: {{level: 1, read_roots: ["."]}}}}
tools: {{run: {{allow_from: 1}}}}
rules:
  - id: ls
    decision: {decision}
    justification: "ls"
    programs: [ls]
    examples: {{match: ["ls"]}}
"""


def write(path: Path, text: str, bump: int) -> None:
    path.write_text(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + bump * 1_000_000_000))  # a visible change


def test_a_valid_change_takes_over_and_a_broken_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    write(path, POLICY.format(decision="allow"), 0)
    events: list[tuple[str, dict[str, Any]]] = []
    holder = PolicyHolder(path, tmp_path, on_event=lambda k, d: events.append((k, d)), interval=0)
    assert evaluate(holder.current(), "ls", "agent").decision.verdict is Verdict.ALLOW

    write(path, POLICY.format(decision="deny"), 1)
    assert evaluate(holder.current(), "ls", "agent").decision.verdict is Verdict.DENY
    good = holder.current().sha256

    write(path, POLICY.format(decision="alow"), 2)  # a typo: refused, the old policy stays
    assert evaluate(holder.current(), "ls", "agent").decision.verdict is Verdict.DENY
    assert holder.current().sha256 == good
    assert holder.last_error is not None and "got 'alow'" in holder.last_error
    assert [k for k, _ in events] == ["policy_loaded", "policy_loaded", "policy_rejected"]
    assert events[-1][1]["kept"] == good


def test_an_unchanged_file_is_not_reloaded(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    write(path, POLICY.format(decision="allow"), 0)
    holder = PolicyHolder(path, tmp_path, interval=0)
    first = holder.current()
    assert holder.reload_if_changed() is False
    assert holder.current() is first


def test_a_policy_whose_record_cannot_be_written_does_not_take_effect(tmp_path: Path) -> None:
    """Before: the new policy went into force with no policy_loaded record, decisions carried a
    policy hash the log never named, and the reload's exception reached the caller (HTTP 500)."""
    from gateway.audit import AuditLog, AuditUnavailable, records

    path = tmp_path / "p.yaml"
    write(path, POLICY.format(decision="allow"), 0)
    audit = AuditLog(tmp_path / "audit")
    broken = [False]

    def record(kind: str, data: dict[str, Any]) -> None:
        if broken[0]:
            raise AuditUnavailable("disk full")
        audit.append(kind, data=data)

    holder = PolicyHolder(path, tmp_path, on_event=record, interval=0)
    first = holder.current().sha256
    broken[0] = True
    write(path, POLICY.format(decision="deny"), 1)
    for _ in range(3):  # no exception, the old policy decides, every check tries again
        assert holder.current().sha256 == first
        assert evaluate(holder.current(), "ls", "agent").decision.verdict is Verdict.ALLOW
    assert holder.last_error is not None and "could not be recorded" in holder.last_error
    broken[0] = False
    fresh = holder.current()
    assert fresh.sha256 != first and evaluate(fresh, "ls", "agent").decision.verdict is Verdict.DENY
    named = [r["data"]["sha256"] for _, _, r, _ in records(tmp_path / "audit") if r and r["event"] == "policy_loaded"]
    assert named == [first, fresh.sha256]  # every policy that decided is on the record


def test_a_failed_record_at_shutdown_is_logged_not_raised(tmp_path: Path) -> None:
    """`_record` turned a failed append into TypeError (structlog's `event` clash): a bad token got
    500 instead of 401, and SIGTERM exited 1 with a traceback before the gateway was closed."""
    from gateway.audit import AuditLog
    from gateway.server.run import _record

    audit = tmp_path / "audit"
    log = AuditLog(audit)
    (audit / "audit-000001.jsonl").symlink_to("/dev/full")  # every append fails from now on
    assert _record(log, "server_stopped", data={"how": "SIGTERM"}) is False


def test_a_check_with_nothing_changed_reads_no_policy_file(tmp_path: Path, monkeypatch: Any) -> None:
    """Before: every check (once a second while calls run) parsed the YAML again to list the
    includes: 50-70 ms of a serving gateway's time each second."""
    import gateway.policy.layers as layers

    path = tmp_path / "p.yaml"
    write(path, POLICY.format(decision="allow"), 0)
    holder = PolicyHolder(path, tmp_path, interval=0)
    parsed: list[Path] = []
    real = layers.parse_policy_at
    monkeypatch.setattr(layers, "parse_policy_at", lambda p: (parsed.append(p), real(p))[1])
    for _ in range(20):
        holder.current()
    assert parsed == []
    write(path, POLICY.format(decision="deny"), 1)
    assert evaluate(holder.current(), "ls", "agent").decision.verdict is Verdict.DENY
    assert parsed  # a change is read


def test_a_change_in_an_include_added_later_is_seen(tmp_path: Path) -> None:
    path, extra = tmp_path / "p.yaml", tmp_path / "extra.yaml"
    write(path, POLICY.format(decision="allow"), 0)
    holder = PolicyHolder(path, tmp_path, interval=0)
    # (on `ls -l` only: the upper layer's allow rule keeps its example, `ls`, allowed)
    rule = 'version: 1\nrules:\n  - {{id: r, decision: {}, justification: "x", programs: [ls], when_options: [-l], '
    rule += 'examples: {{match: ["ls -l"]}}}}\n'
    write(extra, rule.format("deny"), 0)
    write(path, "include: [extra.yaml]\n" + POLICY.format(decision="allow"), 1)
    assert evaluate(holder.current(), "ls -l", "agent").decision.verdict is Verdict.DENY, holder.last_error
    write(extra, rule.format("ask"), 2)
    assert evaluate(holder.current(), "ls -l", "agent").decision.verdict is Verdict.ASK


def test_a_same_size_same_time_save_by_rename_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    write(path, POLICY.format(decision="allow"), 0)
    holder = PolicyHolder(path, tmp_path, interval=0)
    st = path.stat()
    fresh = tmp_path / "p.yaml.new"
    fresh.write_text(POLICY.format(decision="deny "))  # as long as "allow"
    os.utime(fresh, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.rename(fresh, path)  # an editor's save: a new inode, same size and mtime
    assert evaluate(holder.current(), "ls", "agent").decision.verdict is Verdict.DENY


def test_an_edit_saved_while_the_first_load_runs_is_seen_by_the_next_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files are stamped before they are read: an admin's save that lands while the policy
    is loading (here, made at the end of the load) is a change the next check picks up. Stamped
    after the read, the old policy stayed in force until some later edit."""
    from gateway.policy import reload

    path = tmp_path / "p.yaml"
    write(path, POLICY.format(decision="allow"), 0)
    real = reload.load_checked
    saved = []

    def load_then_the_admin_saves(*args: Any, **kwargs: Any) -> Any:
        loaded = real(*args, **kwargs)
        if not saved:
            saved.append(True)
            write(path, POLICY.format(decision="deny"), 5)
        return loaded

    monkeypatch.setattr(reload, "load_checked", load_then_the_admin_saves)
    holder = PolicyHolder(path, tmp_path, interval=0)
    assert holder.reload_if_changed() is True
    assert evaluate(holder.current(), "ls", "agent").decision.verdict is Verdict.DENY


FLIP = """version: 1
principals: {{agent: {{roles: [r]}}}}
roles: {{r: {{level: 1, read_roots: ["."]}}}}
tools: {{run: {{allow_from: 1}}}}
rules:
  - id: version-{name}
    decision: deny
    justification: "which version decided"
    programs: [ls]
    examples: {{match: ["ls"]}}
{padding}"""


def flip_versions() -> dict[str, bytes]:
    """Two versions of one policy, each deciding `ls` by a rule that names it. The padding (rules
    for other programs) makes each load take a while, as a real policy's does."""
    padding = "".join(
        f'  - id: pad-{i}\n    decision: allow\n    justification: "padding"\n    programs: [prog{i}]\n'
        f'    examples: {{match: ["prog{i}"]}}\n'
        for i in range(80)
    )
    return {name: FLIP.format(name=name, padding=padding).encode() for name in ("a", "b")}


def test_a_decision_names_the_bytes_that_decided_it_while_the_file_flips(tmp_path: Path) -> None:
    """Before: the loader parsed the file, then read it again to hash it. A save in between made
    a policy decide under the digest of another version: in a red team's reload race 32% of
    1,198 decisions carried a digest that never loaded. Here a writer saves the two versions
    in turn (an editor's save by rename) while calls are decided through the gateway's reload
    path; every decision's `policy_sha256` must be the version whose rule decided it, and one
    that a `policy_loaded` record names."""
    import hashlib
    import threading

    from gateway.audit import AuditLog, records
    from gateway.calls import RunCall
    from gateway.pipeline import Gateway

    versions = flip_versions()
    digests = {hashlib.sha256(text).hexdigest(): f"version-{name}" for name, text in versions.items()}
    path = tmp_path / "p.yaml"
    path.write_bytes(versions["a"])
    audit = AuditLog(tmp_path / "audit")
    holder = PolicyHolder(path, tmp_path, on_event=lambda kind, data: audit.append(kind, data=data), interval=0)
    gw = Gateway(holder.current, audit)
    stop = threading.Event()
    saves = [0]

    def editor() -> None:
        while not stop.is_set():
            name = "ab"[saves[0] % 2]
            fresh = tmp_path / f".p.yaml.{saves[0]}"
            fresh.write_bytes(versions[name])
            os.rename(fresh, path)
            saves[0] += 1

    writer = threading.Thread(target=editor, daemon=True)
    writer.start()
    try:
        for _ in range(60):
            out = gw.handle(RunCall(principal="agent", command="ls"))
            assert out["status"] == "denied", out
    finally:
        stop.set()
        writer.join(timeout=60)
        gw.close()
    every = [r for _, _, r, _ in records(tmp_path / "audit") if r]
    loaded = {r["data"]["sha256"] for r in every if r["event"] == "policy_loaded"}
    decided = [r for r in every if r["event"] == "decision"]
    assert len(decided) == 60 and saves[0] > 10 and len(loaded) == 2
    wrong = [(r["rule"], digests.get(r["policy_sha256"], "bytes that never loaded")) for r in decided
             if digests.get(r["policy_sha256"]) != r["rule"] or r["policy_sha256"] not in loaded]  # fmt: skip
    assert not wrong, f"{len(wrong)} of {len(decided)} decisions name a policy that did not decide them: {wrong[:5]}"
