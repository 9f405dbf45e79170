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

The agent's HOME travels with each call: `~` in a command means what the agent's shell will
take it for (docs/hooks.md, "What ~ means").

`exec` (`hook_client.py exec --socket PATH --call ID --sha256 HEX [-- COMMAND]`) is what an
allowed shell call is rewritten into where the agent lets a hook rewrite it (Claude Code,
Codex): the gateway runs the command it decided, and only that one, in its sandbox, and this
client prints its output and exits with its status. A call id that is not a decided, allowed
and still unused call, or a digest or command that differs from the decided one, is refused
(status 126).

Time: the agents read a hook they kill for its time as "no objection". This client answers
within TOTAL_S in the worst case (starting the gateway included), and the gateway answers a
call it has not decided within its deadline (`--deadline`, DEADLINE_S by default) with a
denial; docs/hooks.md gives the limit to set in each agent.

Protocol (one request per connection): the client sends `AGW2 KIND HOME LENGTH\n` (KIND an
agent or `exec`, HOME the agent's HOME in hex or `-` when it is unset) and LENGTH bytes (the raw
hook input, or the exec request as JSON); the gateway answers `EXIT STDOUT_BYTES\n`, the bytes
to print on stdout, then the bytes for stderr. An exec's connection stays open while its
command runs: closing it (the agent killed this client) stops the command.
"""

import _socket
import os
import sys

AGENTS = ("claude-code", "codex", "gemini")
MAX_INPUT = 32 << 20
"""The largest hook input forwarded (a Write of a big file carries its content): larger is denied."""
MAX_ANSWER = 1 << 20
MAX_EXEC_ANSWER = 256 << 20
"""An exec's answer carries the command's output (the policy bounds it: limits.output_bytes)."""
PROTOCOL = "AGW2"
DEADLINE_S = 10.0
"""The gateway's default deadline for a decision: past it, the call is denied."""
TOTAL_S = 30.0
"""The most this client takes for a hook call, starting the gateway included."""
START_TIMEOUT_S = 15.0
OPTIONS = ("policy", "workspace", "audit-dir", "audit-keys", "principal", "state-dir", "python", "deadline")
FLAGS = ("no-start", "no-sandbox")
EXIT_REFUSED = 126
"""An exec refused, or that could not run: the status of a command that could not be executed."""


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
        if arg[2:] in FLAGS and arg.startswith("--"):
            options[arg[2:]] = "1"
            i += 1
            continue
        name, eq, value = arg.partition("=")
        if not name.startswith("--") or name[2:] not in OPTIONS:
            raise Refused(f"hook: unknown option {arg!r} (known: --{', --'.join(OPTIONS + FLAGS)})")
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
    if options.get("deadline"):
        try:
            deadline = float(options["deadline"])
        except ValueError:
            raise Refused(f"hook: --deadline {options['deadline']!r} is not a number of seconds") from None
        if not 0 < deadline <= TOTAL_S - START_TIMEOUT_S:
            raise Refused(f"hook: --deadline must be above 0 and at most {TOTAL_S - START_TIMEOUT_S:.0f} s")
        args += ["--deadline", repr(deadline)]
    if options.get("no-sandbox"):
        args.append("--no-sandbox")
    return args


def socket_path(options: dict[str, str], config: list[str]) -> str:
    """The socket of the gateway serving `config` (made here when missing, and checked private)."""
    digest = _sha256("\0".join([PROTOCOL, *config]).encode("utf-8", "surrogateescape"))[:20]
    where = os.path.join(state_dir(options), "hooks")
    private_dir(where)
    return os.path.join(where, digest + ".sock")


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


def _home_field() -> bytes:
    """The agent's HOME for the header: `h` and its bytes in hex, or `-` when it is unset (the
    gateway then takes the account's home, as the shell does)."""
    home = os.environb.get(b"HOME")
    return b"-" if home is None else b"h" + home.hex().encode()


def ask(
    sock_path: str, kind: str, payload: bytes, timeout: float | None, home: bytes = b"-", limit: int = MAX_ANSWER
) -> tuple[int, bytes, bytes]:
    """One round trip. Raises FileNotFoundError / ConnectionRefusedError when nobody listens.
    An exec (timeout None) keeps its side open while its command runs."""
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        s.settimeout(timeout)
        s.connect(sock_path)
        head = b"%s %s %s %d\n" % (PROTOCOL.encode(), kind.encode(), home, len(payload))
        s.sendall(head + payload)
        if kind != "exec":
            s.shutdown(_socket.SHUT_WR)
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise Refused("the gateway's answer is too large")
            chunks.append(chunk)
    except (FileNotFoundError, ConnectionRefusedError):
        raise
    except TimeoutError:
        raise Refused(f"the gateway did not answer within {timeout:.0f} s") from None
    except PermissionError as exc:  # a sandbox of the agent's own forbids reaching the socket
        raise Refused(
            f"the gateway at {sock_path} could not be asked: {exc.strerror or exc} (the agent's own sandbox "
            "forbids the connection? Codex: sandbox_workspace_write.network_access = true, docs/hooks.md)"
        ) from None
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


def start(sock_path: str, options: dict[str, str], config: list[str], deadline: float) -> None:
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
        while True:  # bounded: another hook may hold it while its gateway starts
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise Refused("another hook is still starting the gateway") from None
                time.sleep(0.02)
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
        raise Refused(f"the gateway did not start in time (log: {base}.log)")
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
    import time

    agent = argv[0] if argv else ""
    if agent == "exec":
        return run_exec(argv[1:])
    if agent not in AGENTS:
        return deny("", f"hook: the first argument names the agent: one of {', '.join(AGENTS)} (got {agent!r})")
    until = time.monotonic() + TOTAL_S  # the whole answer, a gateway's start included

    def left() -> float:
        return max(0.1, until - time.monotonic())

    try:
        options = parse_options(argv[1:])
        if len(stdin) > MAX_INPUT:
            raise Refused(f"the hook input is {len(stdin)} bytes, over the {MAX_INPUT >> 20} MiB this gate reads")
        config = configuration(options)
        sock_path = socket_path(options, config)
        home = _home_field()
        try:
            return ask(sock_path, agent, stdin, left(), home)
        except (FileNotFoundError, ConnectionRefusedError):
            if options.get("no-start"):
                raise Refused(f"no gateway is running at {sock_path} (--no-start)") from None
        start(sock_path, options, config, time.monotonic() + min(START_TIMEOUT_S, left()))
        try:
            return ask(sock_path, agent, stdin, left(), home)
        except (FileNotFoundError, ConnectionRefusedError):
            raise Refused(f"the gateway at {sock_path} went away") from None
    except Refused as exc:
        return deny(agent, f"denied, the gate could not decide: {exc}")
    except Exception as exc:  # whatever it is, the answer is a denial, never a crash (a crash allows)
        return deny(agent, f"denied, the gate could not decide: {type(exc).__name__}: {exc}")


def run_exec(argv: list[str]) -> tuple[int, bytes, bytes]:
    """`exec --socket PATH --call ID --sha256 HEX [-- COMMAND]`: run a decided call in the
    gateway's sandbox. Any failure is status 126 with the reason on stderr: nothing ran."""
    try:
        fields: dict[str, str] = {}
        i = 0
        while i < len(argv):
            if argv[i] == "--":
                fields["command"] = " ".join(argv[i + 1 :])
                break
            name = argv[i][2:] if argv[i].startswith("--") else ""
            if name not in ("socket", "call", "sha256") or i + 1 >= len(argv):
                raise Refused(f"exec: unexpected argument {argv[i]!r} (exec --socket PATH --call ID --sha256 HEX)")
            fields[name] = argv[i + 1]
            i += 2
        if not all(fields.get(k) for k in ("socket", "call", "sha256")):
            raise Refused("exec: --socket, --call and --sha256 are all needed")
        private_dir(os.path.dirname(fields["socket"]))
        request = (
            "{"
            + ", ".join(f"{_quote(k)}: {_quote(v)}" for k, v in fields.items() if k in ("call", "sha256", "command"))
            + "}"
        )
        try:
            return ask(
                fields["socket"], "exec", request.encode("utf-8", "surrogateescape"), None, limit=MAX_EXEC_ANSWER
            )
        except (FileNotFoundError, ConnectionRefusedError):
            raise Refused("the gateway that decided this call is not running any more: nothing ran") from None
    except Refused as exc:
        return EXIT_REFUSED, b"", f"agent-gateway: not run: {exc}\n".encode("utf-8", "replace")
    except Exception as exc:
        return EXIT_REFUSED, b"", f"agent-gateway: not run: {type(exc).__name__}: {exc}\n".encode("utf-8", "replace")


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
        stdin = b"" if args[:1] == ["exec"] else _read_stdin()
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
