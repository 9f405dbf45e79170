"""The `gateway` command, run as a real process."""

from __future__ import annotations

import json
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


def test_serve_says_it_is_not_built_yet() -> None:
    proc = gateway("serve")
    assert proc.returncode == 2
    assert "not built yet" in proc.stderr
