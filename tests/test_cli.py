"""The `gateway` command, run as a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def gateway(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args], capture_output=True, text=True, timeout=60)


def test_analyze_prints_every_command_and_exits_0() -> None:
    proc = gateway("analyze", "--", "ls | xargs rm")
    assert proc.returncode == 0
    assert '"ls"' in proc.stdout and '"rm"' in proc.stdout
    assert "second opinion: agreed" in proc.stdout


def test_analyze_json_and_exit_1_on_denial() -> None:
    proc = gateway("analyze", "--json", "--", "eval x")
    assert proc.returncode == 1
    out = json.loads(proc.stdout)
    assert out["denied"] is True
    assert out["denial"]["code"] == "forbidden_builtin"
    assert out["commands"] == []


def test_analyze_reads_stdin() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "analyze", "--json"],
        input="cat <<'EOF' > f\nhi\nEOF\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    assert [c["argv"] for c in json.loads(proc.stdout)["commands"]] == [["cat"]]


def test_serve_needs_a_transport() -> None:
    proc = gateway("serve")
    assert proc.returncode == 2
    assert "one of the arguments --stdio --http is required" in proc.stderr


def test_check_json_has_the_contract_fields_and_exit_codes() -> None:
    allow = gateway("check", "--json", "--", "git status")
    assert allow.returncode == 0
    out = json.loads(allow.stdout)
    assert out["decision"] == "allow" and out["rule"] == "git-read"
    assert out["commands"] == [{"argv": ["git", "status"], **out["commands"][0]}]
    assert set(out["reasons"][0]) >= {"stage", "code", "message"}
    assert gateway("check", "--", "curl x").returncode == 1
    assert gateway("check", "--", "rm x").returncode == 3


def test_check_explains_in_plain_text() -> None:
    proc = gateway("check", "--", "cat /etc/passwd")
    assert proc.returncode == 1
    assert proc.stdout.startswith("deny")
    assert "outside the read roots" in proc.stdout


def test_check_batch_echoes_each_command(tmp_path: object) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "check", "--batch", "-"],
        input='{"command": "ls"}\n{"command": "rm x"}\n',
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = [json.loads(x) for x in proc.stdout.splitlines()]
    assert [(x["command"], x["decision"]) for x in lines] == [("ls", "allow"), ("rm x", "ask")]
    assert proc.returncode == 3


def test_a_broken_policy_is_a_usage_error_naming_the_line(tmp_path: object) -> None:
    from pathlib import Path

    bad = Path(str(tmp_path)) / "bad.yaml"
    bad.write_text("version: 1\nrules:\n  - id: a\n    decision: alow\n")
    proc = gateway("check", "--policy", str(bad), "--", "ls")
    assert proc.returncode == 2
    assert "bad.yaml:4:15: rules[0].decision: got 'alow'" in proc.stderr


def test_policy_validate_test_and_schema() -> None:
    assert gateway("policy", "validate").returncode == 0
    tested = gateway("policy", "test", "policies/examples/auditor.yaml")
    assert tested.returncode == 0 and "0 failed" in tested.stdout
    schema = json.loads(gateway("policy", "schema").stdout)
    assert schema["title"] == "Policy"


def test_the_shipped_schema_file_is_current() -> None:
    from pathlib import Path

    current = json.loads(gateway("policy", "schema").stdout)
    assert json.loads(Path("docs/policy.schema.json").read_text()) == current, (
        "run: gateway policy schema > docs/policy.schema.json"
    )


def test_a_reader_that_stops_early_gets_no_traceback() -> None:
    """`gateway check ... | head -1`: the reader closes the pipe after one line; the command
    stops quietly with SIGPIPE's status, as other CLIs do, instead of printing a traceback."""
    read, write = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "check", "--", "date -f /etc/shadow"],
        stdout=write, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    os.close(write)
    os.close(read)  # nobody reads: the first write fails with EPIPE
    _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err and "BrokenPipeError" not in err
    assert proc.returncode == 141


def test_a_bad_store_commit_timeout_is_named_before_the_store_is_tried(tmp_path: object) -> None:
    store = ("--store", "postgresql://nobody@/none?host=/nonexistent")
    policy = ("--policy", os.path.join(os.path.dirname(__file__), "..", "policies", "default.yaml"))
    bad = gateway("run", *store, "--store-commit-timeout", "abc", *policy, "echo hi")
    assert bad.returncode == 2 and "--store-commit-timeout: 'abc' is not a number of seconds" in bad.stderr, bad.stderr
    env = {**os.environ, "AGW_STORE_COMMIT_TIMEOUT": "0"}
    zero = subprocess.run([sys.executable, "-m", "gateway", "run", *store, *policy, "echo hi"], capture_output=True,
                          text=True, env=env, timeout=120)  # fmt: skip
    assert zero.returncode == 2 and "AGW_STORE_COMMIT_TIMEOUT: '0': expected more than 0" in zero.stderr, zero.stderr
