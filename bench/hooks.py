"""Benchmark an agent's hook deciding `git status`, as whole processes (run by hand).

    .venv/bin/python bench/hooks.py [--repeats N] [--codex-dir DIR]

Side by side in one run, interleaved round by round so the machine's load falls on all alike:

1. the thin hook client (`python -I -S gateway/hook_client.py claude-code`), Claude Code's
   PreToolUse input for `git status` on stdin, against a resident `gateway daemon` (started by
   the first call, before the timing);
2. the same through the full CLI's entry point (`.venv/bin/gateway hook claude-code`);
3. Codex's own policy check, the native binary (`codex execpolicy check --rules R git status`);
4. the same through Codex's npm wrapper (`node .../@openai/codex/bin/codex.js execpolicy check`);
5. `gateway check -- 'git status'`: the full CLI deciding alone (policy load, parser workers).

Codex comes from `npm install @openai/codex` into --codex-dir (default /tmp/agw-bench-codex),
done here when absent; without npm or the registry those rows are left out and the run says so.
Every sample is a fresh process timed from spawn to exit; min / median / max of `--repeats`.
The numbers go into docs/performance.md ("Hooks") by hand.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
GATEWAY = str(Path(PY).parent / "gateway")
CLIENT = str(ROOT / "gateway" / "hook_client.py")
POLICY = str(ROOT / "policies" / "default.yaml")
RULES = """prefix_rule(pattern = ["git", "status"], decision = "allow")
prefix_rule(pattern = ["rm"], decision = "prompt")
"""


def codex_paths(where: Path) -> tuple[str | None, str | None, str]:
    """(native binary, npm wrapper script, why either is missing)."""
    wrapper = where / "node_modules" / "@openai" / "codex" / "bin" / "codex.js"
    if not wrapper.exists():
        npm = shutil.which("npm")
        if npm is None:
            return None, None, "npm is not installed"
        where.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--prefix", str(where), "@openai/codex"],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if proc.returncode != 0 or not wrapper.exists():
            return None, None, f"npm install @openai/codex failed: {proc.stderr.strip()[-300:]}"
    native = next(iter(sorted((where / "node_modules" / "@openai").glob("codex-*/vendor/*/bin/codex"))), None)
    return (str(native) if native else None), str(wrapper), "" if native else "no native binary in the npm package"


def timed(argv: list[str], stdin: bytes, cwd: str, env: dict[str, str]) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, input=stdin, capture_output=True, cwd=cwd, env=env, timeout=120)
    elapsed = time.perf_counter() - t0
    if proc.returncode not in (0,):
        raise SystemExit(f"{argv[:3]}... exited {proc.returncode}: {proc.stderr.decode()[-500:]}")
    return elapsed * 1000, proc.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--codex-dir", default="/tmp/agw-bench-codex")
    args = ap.parse_args()

    base = Path(tempfile.mkdtemp(prefix="agw-bench-hooks-"))
    ws = base / "ws"
    ws.mkdir()
    env = {**os.environ, "XDG_STATE_HOME": str(base / "state")}
    opts = ["--policy", POLICY, "--workspace", str(ws), "--audit-dir", str(base / "audit"),
            "--audit-keys", str(base / "keys")]  # fmt: skip
    hook_input = json.dumps({
        "session_id": "bench", "transcript_path": "/tmp/bench.jsonl", "cwd": str(ws), "permission_mode": "default",
        "hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": {"command": "git status"},
        "tool_use_id": "toolu_bench",
    }).encode()  # fmt: skip
    (base / "default.rules").write_text(RULES)

    rows: dict[str, list[str]] = {
        "hook client (python -I -S hook_client.py)": [PY, "-I", "-S", CLIENT, "claude-code", *opts],
        "hook via the full CLI (gateway hook)": [GATEWAY, "hook", "claude-code", *opts],
    }
    native, wrapper, missing = codex_paths(Path(args.codex_dir))
    if native:
        rows["codex execpolicy check (native binary)"] = [native, "execpolicy", "check", "--rules",
                                                           str(base / "default.rules"), "git", "status"]  # fmt: skip
    if wrapper:
        rows["codex execpolicy check (npm wrapper)"] = ["node", wrapper, "execpolicy", "check", "--rules",
                                                         str(base / "default.rules"), "git", "status"]  # fmt: skip
    rows["gateway check -- 'git status' (full CLI)"] = [GATEWAY, "check", "--policy", POLICY, "--workspace",
                                                        str(ws), "--", "git status"]  # fmt: skip

    # the first hook starts the daemon (not timed); check each row answers what it should
    _, out = timed(rows["hook client (python -I -S hook_client.py)"], hook_input, str(ws), env)
    assert json.loads(out)["hookSpecificOutput"]["permissionDecision"] == "allow", out
    for argv in rows.values():
        timed(argv, hook_input, str(ws), env)

    samples: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.repeats):
        for name, argv in rows.items():
            samples[name].append(timed(argv, hook_input, str(ws), env)[0])

    print(f"# {platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.2f}, {args.repeats} repeats, interleaved")  # fmt: skip
    if missing:
        print(f"# codex rows missing: {missing}")
    med = {n: statistics.median(s) for n, s in samples.items()}
    print(f"| {'process':44} | {'min ms':>7} | {'median ms':>9} | {'max ms':>7} |")
    print(f"| {'-' * 44} | {'-' * 7}: | {'-' * 9}: | {'-' * 7}: |")
    for name, s in samples.items():
        print(f"| {name:44} | {min(s):7.1f} | {med[name]:9.1f} | {max(s):7.1f} |")
    client = med["hook client (python -I -S hook_client.py)"]
    for name in rows:
        if name.startswith("codex"):
            print(f"hook client / {name}: {client / med[name]:.2f}x (median)")
    full = med["hook via the full CLI (gateway hook)"]
    for name in rows:
        if name.startswith("codex"):
            print(f"gateway hook / {name}: {full / med[name]:.2f}x (median)")

    pid_files = list((base / "state" / "agent-gateway" / "hooks").glob("*.pid"))
    for pid_file in pid_files:  # the daemon this run started
        with contextlib.suppress(ValueError, ProcessLookupError):
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
    time.sleep(0.5)
    shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
