"""Kill-loop harness: a real gateway process that keeps spawning sandboxes from several threads,
killed with SIGKILL at a random moment, and a scan of /proc for what it left behind.

The load runs in a child Python process (`load()`), which builds a `Gateway` on the test's policy
and calls `handle()` in a loop from `threads` threads. Its configuration comes in an environment
variable, never on its command line, so the marker the scan looks for is only in the command
lines of the sandboxes (bwrap's and the helper's argv carry the command text) and their commands.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ENV = "AGW_CRASHLOAD"

SCRIPT = r"""
import json, os, sys, threading
from pathlib import Path
import gateway.tools  # noqa: F401  (the tool families register with the gate, as in every face)
from gateway.approval import DenyAll
from gateway.audit import AuditLog
from gateway.calls import ProcessCall, RunCall
from gateway.pipeline import Gateway
from gateway.policy.compile import compile_policy
from gateway.policy.schema import Policy

cfg = json.loads(os.environ["AGW_CRASHLOAD"])
policy = compile_policy(Policy.model_validate(cfg["policy"]), Path(cfg["policy_path"]), Path(cfg["ws"]), sha256="t")
gw = Gateway(policy, AuditLog(Path(cfg["audit"])), DenyAll(), state_dir=Path(cfg["state"]))
calls = 0
lock = threading.Lock()

def loop():
    global calls
    while True:
        if cfg["mode"] == "run":
            out = gw.handle(RunCall(principal="agent", command=cfg["command"], timeout_ms=cfg["timeout_ms"]))
        else:
            out = gw.handle(ProcessCall(principal="agent", action="start", command=cfg["command"]))
        with lock:
            calls += 1
            if calls == 1:
                print("first:" + json.dumps(out), flush=True)

for _ in range(cfg["threads"]):
    threading.Thread(target=loop, daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""


def start_load(cfg: dict[str, Any]) -> subprocess.Popen[str]:
    env = {**os.environ, ENV: json.dumps(cfg)}
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise RuntimeError(f"the load did not start: {line} {proc.stderr.read() if proc.stderr else ''}")
    return proc


def wait_first(proc: subprocess.Popen[str], timeout: float = 60.0) -> dict[str, Any]:
    """The first call's envelope (the load is spawning by then)."""
    assert proc.stdout is not None
    line = proc.stdout.readline()  # bounded by the first call's timeout
    assert line.startswith("first:"), line
    out: dict[str, Any] = json.loads(line[len("first:") :])
    return out


def with_marker(marker: str) -> list[int]:
    """Every process whose command line holds `marker`."""
    found = []
    needle = marker.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in Path(f"/proc/{entry}/cmdline").read_bytes():
                state = Path(f"/proc/{entry}/stat").read_bytes()
                if state[state.rfind(b")") + 2 :].split()[0] != b"Z":
                    found.append(int(entry))
    return found


def survivors(marker: str, settle_s: float = 15.0) -> list[int]:
    """What still runs with `marker` once `settle_s` has passed without it all ending (deaths
    by parent-death signal take a moment to ripple through a namespace)."""
    deadline = time.monotonic() + settle_s
    left = with_marker(marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = with_marker(marker)
    return left


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
