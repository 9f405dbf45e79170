"""The hook client: what an agent's pre-tool-use hook runs for every tool call.

`gateway hook AGENT [options]` (or, faster, `python3 -I -S .../gateway/hook_client.py AGENT
[options]`) reads the agent's hook input on stdin, forwards it to the resident gateway (`gateway
daemon`) over a Unix socket in a private directory, prints the answer the gateway wrote in that
agent's format, and exits with the code it chose. AGENT is `claude-code`, `codex` or `gemini`.

It is deliberately small: the standard library's C modules and nothing of the gateway (no
parser, no policy, no pydantic), so a call costs a process start and one round trip. Every
failure (no gateway, a gateway that cannot start, a refusal, a torn answer, input too large) is
answered as a denial in the agent's format, never as an allow: the agents treat a hook that
crashes or exits with another code as "no objection", so this file must never do that.

The gateway a hook talks to is named by its configuration: `--policy` (default
`policies/default.yaml`), `--workspace`, `--audit-dir` (default `audit`), `--audit-keys`,
`--principal`, each resolved against the hook's working directory. Its socket is
`STATE/hooks/<digest of the configuration>.sock`, STATE being `--state-dir`, or
`$XDG_STATE_HOME/agent-gateway`, or `~/.local/state/agent-gateway`. When no gateway answers
there, the client starts one (`PYTHON -I -m gateway daemon`, in `/`, PYTHON being `--python`, `$AGW_PYTHON`
or this interpreter), holding a lock so two hooks never start two; `--no-start` turns that off.

Protocol (one request per connection): the client sends `AGW1 AGENT\\n` and the raw hook input,
then shuts its side; the gateway answers `EXIT STDOUT_BYTES\\n`, the bytes to print on stdout,
then the bytes for stderr.
"""

import _socket
import os
import sys

AGENTS = ("claude-code", "codex", "gemini")
MAX_INPUT = 32 << 20
"""The largest hook input forwarded (a Write of a big file carries its content): larger is denied."""
MAX_ANSWER = 1 << 20
ANSWER_TIMEOUT_S = 20.0
START_TIMEOUT_S = 20.0
OPTIONS = ("policy", "workspace", "audit-dir", "audit-keys", "principal", "state-dir", "python")


def _sha256(data: bytes) -> str:
    """The hex SHA-256 of `data`, from the C module itself: `hashlib` costs 3 ms to import."""
    try:
        from _sha256 import sha256  # type: ignore[import-not-found]  # CPython 3.11
    except ImportError:
        try:
            from _sha2 import sha256  # type: ignore[import-not-found]  # CPython 3.12 and later
        except ImportError:
            from hashlib import sha256
    return str(sha256(data).hexdigest())


class Refused(Exception):
    """The gateway could not be asked, or did not answer: the call is denied with this reason."""


def _quote(text: str) -> str:
    """`text` as a JSON string (json is not imported: it costs more than the rest of this file)."""
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch < " " or "\ud800" <= ch <= "\udfff":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def deny(agent: str, reason: str) -> tuple[int, bytes, bytes]:
    """A denial in `agent`'s own format: (exit code, stdout, stderr)."""
    why = _quote(f"agent-gateway: {reason}")
    if agent == "claude-code" or agent == "codex":
        out = (
            '{"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny", '
            f'"permissionDecisionReason": {why}}}}}'
        )
    elif agent == "gemini":
        out = f'{{"decision": "deny", "reason": {why}}}'
    else:  # every agent reads exit 2 as "blocked", with stderr as the reason
        return 2, b"", f"agent-gateway: {reason}\n".encode("utf-8", "replace")
    return 0, (out + "\n").encode("utf-8", "replace"), b""


def parse_options(argv: list[str]) -> dict[str, str]:
    options: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--no-start":
            options["no-start"] = "1"
            i += 1
            continue
        name, eq, value = arg.partition("=")
        if not name.startswith("--") or name[2:] not in OPTIONS:
            raise Refused(f"hook: unknown option {arg!r} (known: --{', --'.join(OPTIONS)}, --no-start)")
        if not eq:
            if i + 1 >= len(argv):
                raise Refused(f"hook: option {name} needs a value")
            value = argv[i + 1]
            i += 1
        options[name[2:]] = value
        i += 1
    return options


def state_dir(options: dict[str, str]) -> str:
    if options.get("state-dir"):
        return os.path.abspath(options["state-dir"])
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "agent-gateway")


def configuration(options: dict[str, str]) -> list[str]:
    """The daemon's arguments: every path made absolute here, against the hook's directory."""
    args = ["--policy", os.path.abspath(options.get("policy") or os.path.join("policies", "default.yaml"))]
    args += ["--audit-dir", os.path.abspath(options.get("audit-dir") or "audit")]
    for name in ("workspace", "audit-keys"):
        if options.get(name):
            args += ["--" + name, os.path.abspath(options[name])]
    if options.get("principal"):
        args += ["--principal", options["principal"]]
    return args


def private_dir(path: str) -> None:
    """Make `path` (0700) or check that it is a directory of this user that nobody else may enter:
    a socket there can only have been put there by this user."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError as exc:
        raise Refused(f"the gateway's socket directory {path}: {exc.strerror}") from None
    if (st.st_mode & 0o170000) != 0o040000 or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise Refused(
            f"the gateway's socket directory {path} is not private to uid {os.geteuid()} "
            f"(owner {st.st_uid}, mode {st.st_mode & 0o7777:o}): refusing to use a socket there"
        )


def ask(sock_path: str, agent: str, payload: bytes) -> tuple[int, bytes, bytes]:
    """One round trip. Raises FileNotFoundError / ConnectionRefusedError when nobody listens."""
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        s.settimeout(ANSWER_TIMEOUT_S)
        s.connect(sock_path)
        s.sendall(b"AGW1 " + agent.encode() + b"\n" + payload)
        s.shutdown(_socket.SHUT_WR)
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_ANSWER:
                raise Refused("the gateway's answer is too large")
            chunks.append(chunk)
    except (FileNotFoundError, ConnectionRefusedError):
        raise
    except TimeoutError:
        raise Refused(f"the gateway did not answer within {ANSWER_TIMEOUT_S:.0f} s") from None
    except OSError as exc:
        raise Refused(f"the gateway at {sock_path} could not be asked: {exc.strerror or exc}") from None
    finally:
        s.close()
    data = b"".join(chunks)
    head, nl, rest = data.partition(b"\n")
    fields = head.split(b" ")
    if not nl or len(fields) != 2 or not fields[0].isdigit() or not fields[1].isdigit():
        raise Refused("the gateway gave no answer (refused this caller, or stopped while deciding)")
    code, n = int(fields[0]), int(fields[1])
    if n > len(rest):
        raise Refused("the gateway's answer was cut short")
    return code, rest[:n], rest[n:]


def start(sock_path: str, options: dict[str, str], config: list[str]) -> None:
    """Start the gateway for `sock_path` unless another hook already did: under a lock, so two
    hooks arriving together start one daemon (the daemon also holds a lock of its own for life)."""
    import fcntl
    import subprocess
    import time

    def spawn() -> subprocess.Popen[bytes]:
        log = os.open(base + ".log", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            return subprocess.Popen(
                # -I and cwd "/": the hook runs in the agent's project, where the agent writes;
                # `python -m gateway` there would run a ./gateway/__main__.py the agent planted
                [python, "-I", "-m", "gateway", "daemon", "--socket", sock_path, *config],
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # not in the agent's process group: its Ctrl-C is not ours
                close_fds=True,
            )
        except OSError as exc:
            raise Refused(f"could not start the gateway ({python}): {exc.strerror}") from None
        finally:
            os.close(log)

    base = sock_path[: -len(".sock")]
    lock = os.open(base + ".start.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:  # another hook may have started it while this one waited for the lock
            s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            try:
                s.connect(sock_path)
                return
            finally:
                s.close()
        except OSError:
            pass
        python = options.get("python") or os.environ.get("AGW_PYTHON") or sys.executable
        deadline = time.monotonic() + START_TIMEOUT_S
        child = spawn()
        respawns = 0
        while time.monotonic() < deadline:
            s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            try:
                s.connect(sock_path)
                return
            except OSError:
                pass
            finally:
                s.close()
            code = child.poll()
            if code == 0 and respawns < 5:  # it found the lock held: a daemon still leaving (idle), or coming up
                respawns += 1
                time.sleep(0.05)
                child = spawn()
            elif code is not None:
                raise Refused(f"the gateway did not start: {_tail(base + '.log')}")
            time.sleep(0.02)
        raise Refused(f"the gateway did not start within {START_TIMEOUT_S:.0f} s (log: {base}.log)")
    finally:
        os.close(lock)


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 600))
            lines = f.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return f"see {path}"
    return (lines[-1] if lines else "no output") + f" (log: {path})"


def run(argv: list[str], stdin: bytes) -> tuple[int, bytes, bytes]:
    """The whole client, minus its I/O: (exit code, stdout, stderr)."""
    agent = argv[0] if argv else ""
    if agent not in AGENTS:
        return deny("", f"hook: the first argument names the agent: one of {', '.join(AGENTS)} (got {agent!r})")
    try:
        options = parse_options(argv[1:])
        if len(stdin) > MAX_INPUT:
            raise Refused(f"the hook input is {len(stdin)} bytes, over the {MAX_INPUT >> 20} MiB this gate reads")
        config = configuration(options)
        digest = _sha256("\0".join(config).encode("utf-8", "surrogateescape"))[:20]
        where = os.path.join(state_dir(options), "hooks")
        private_dir(where)
        sock_path = os.path.join(where, digest + ".sock")
        try:
            return ask(sock_path, agent, stdin)
        except (FileNotFoundError, ConnectionRefusedError):
            if options.get("no-start"):
                raise Refused(f"no gateway is running at {sock_path} (--no-start)") from None
        start(sock_path, options, config)
        try:
            return ask(sock_path, agent, stdin)
        except (FileNotFoundError, ConnectionRefusedError):
            raise Refused(f"the gateway at {sock_path} went away") from None
    except Refused as exc:
        return deny(agent, f"denied, the gate could not decide: {exc}")
    except Exception as exc:  # whatever it is, the answer is a denial, never a crash (a crash allows)
        return deny(agent, f"denied, the gate could not decide: {type(exc).__name__}: {exc}")


def _read_stdin() -> bytes:
    """The hook input, up to one byte over the cap (read in chunks: one read into a buffer of
    the cap's size costs milliseconds of page faults)."""
    chunks: list[bytes] = []
    size = 0
    while size <= MAX_INPUT:
        chunk = os.read(0, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _write(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        stdin = _read_stdin()
    except Exception as exc:
        code, out, err = deny(args[0] if args and args[0] in AGENTS else "", f"the hook input could not be read: {exc}")
    else:
        code, out, err = run(args, stdin)
    sys.stdout.flush()
    sys.stderr.flush()
    _write(1, out)
    _write(2, err)
    return code


if __name__ == "__main__":
    code = main()
    os._exit(code)  # everything is written: the interpreter's teardown would only add milliseconds
