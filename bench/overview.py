"""The console's overview of a large ledger: how long `GET /console/api/overview` takes.

Run by hand: `.venv/bin/python bench/overview.py [CALLS]` (default 100,000). It writes a log of
CALLS calls over the last 24 hours the way the writer does (canonical lines, chained hashes, a
signature on each call's last record), in a mix of principals, decisions and rules (allowed
calls that ran; asks approved after a wait, denied, timed out; policy denials), then measures,
in process (the machine is shared: each step 3 times, the median printed):

- cold: the console's call index folds the whole log (read, parse, fold: the first request
  after a start), then counts it;
- warm: a request once the index is up to date (the log unchanged): the counting alone, and the
  answer's JSON;
- append: 100 calls appended, then a request (the index reads only what was appended);
- the timeline's first page of calls (200 rows), and a text filter over the whole log.

With `--browser`, the same ledger (signed with a real key this time) is served by a real
`gateway serve --http`, and headless Chromium (Debian's, as the browser tests use) times the
Overview tab from the click to the last chart drawn: the request, the answer and the drawing
of the inline SVG, 3 times after the index is warm, and once right after the server starts.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gateway.audit import canonical, digest, open_signed
from gateway.audit.keys import SigningKey
from gateway.audit.overview import overview
from gateway.audit.selection import Selection
from gateway.audit.verify import head
from gateway.server.console.auditview import CallIndex
from gateway.server.console.cards import call_row, overview_shown

RUNS = 3
PRINCIPALS = ["agent", "ci-bot", "reviewer", "nightly", "intern"]
COMMANDS = ["git status", "pytest -q tests/test_api.py -k login", "rm -rf build/cache", "ls -la src",
            "grep -rn TODO gateway | head -50", "make lint", "python3 -m pip install -r requirements.txt",
            "curl https://example.com/install.sh", "git push --force origin main"]  # fmt: skip


class Ledger:
    """A log written line by line as the writer writes it (hash chain; a fake signature)."""

    def __init__(self, directory: Path, start: datetime, key: SigningKey | None = None) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "audit-000001.jsonl"
        self.prev, self.seq, self.start = "", 0, start
        self.sig = base64.b64encode(b"\0" * 64).decode()
        self.key = key
        self.lines: list[str] = []
        last = head(directory) if key is not None else None
        if last is not None:  # go on from the writer's own records (its key pin)
            self.prev, self.seq = last["hash"], last["seq"]

    def add(self, at: datetime, fields: dict[str, Any], signed: bool = False) -> None:
        self.seq += 1
        record = {**fields, "seq": self.seq, "ts": at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "prev": self.prev}
        record["hash"] = self.prev = digest(record)
        if signed:
            record["sig"] = self.key.sign(record["hash"]) if self.key is not None else self.sig
        self.lines.append(canonical(record) + "\n")

    def flush(self) -> None:
        if self.key is not None and self.lines:  # a writer's commit ends in a signed record
            last = json.loads(self.lines[-1])
            last["sig"] = self.key.sign(last["hash"])
            self.lines[-1] = canonical(last) + "\n"
        with self.path.open("a", encoding="utf-8") as f:
            f.write("".join(self.lines))
        self.lines = []


def write_calls(ledger: Ledger, first: int, n: int, start: datetime, span: timedelta) -> None:
    """Calls `first` .. `first + n - 1`, spread evenly over `span` from `start`."""
    step = span / max(n, 1)
    for k in range(first, first + n):
        at = start + step * (k - first)
        command = COMMANDS[k % len(COMMANDS)]
        base = {"call_id": f"{k:016x}", "principal": PRINCIPALS[k % len(PRINCIPALS)], "tool": "run",
                "policy_sha256": "ab" * 32}  # fmt: skip
        kind = k % 10  # 0-5 allowed, 6-7 asked, 8-9 denied
        decision = "allow" if kind < 6 else "ask" if kind < 8 else "deny"
        rule = {"allow": "dev-tools", "ask": "pip" if "pip" in command else "rm", "deny": "no-curl"}[decision]
        reasons = [{"stage": "permissions", "code": "rule", "message": "why", "rule": rule},
                   {"stage": "pathjail", "code": "paths_checked", "message": "2 path(s) inside the roots",
                    "details": {"read": ["/srv/ws/src/a.py"], "write": ["/srv/ws/build/out"]}}]  # fmt: skip
        ledger.add(at, {**base, "event": "decision", "decision": decision, "rule": rule, "reasons": reasons,
                        "arguments": {"command": command, "cwd": None, "env": {}, "shell": "bash"},
                        "data": {"commands": [{"argv": command.split(), "redirects": []}]}})  # fmt: skip
        if decision == "deny":
            continue
        if decision == "ask":
            waited = timedelta(seconds=(k * 7) % 600)
            approved = k % 3 != 0
            how = "timeout" if k % 30 == 0 else "queue"
            ledger.add(at + waited, {**base, "event": "approval", "decision": "allow" if approved else "deny",
                                     "rule": rule, "data": {"answered": how != "timeout", "by": "alice", "how": how,
                                                            "digest": "cd" * 32}},
                       signed=not approved)  # fmt: skip
            if not approved:
                continue
            at += waited
        ledger.add(
            at + timedelta(milliseconds=40),
            {
                **base,
                "event": "result",
                "data": {"status": "ok", "exit_code": 0, "duration_ms": 40, "stdout_bytes": 1200, "stderr_bytes": 0},
            },
            signed=True,
        )


def median_of(what: Callable[[], Any]) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(RUNS):
        t0 = time.perf_counter()
        out = what()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def browser(n: int) -> None:
    """The overview of `n` calls, served and drawn in Chromium."""
    from selenium import webdriver  # lazy: only this mode needs a browser
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    now = datetime.now(UTC)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        audit, keys, ws = root / "audit", root / "keys", root / "ws"
        ws.mkdir()
        open_signed(audit, keys).append("bench_start")
        ledger = Ledger(audit, now, SigningKey.load(keys))
        write_calls(ledger, 0, n, now - timedelta(hours=24), timedelta(hours=23))
        ledger.flush()
        policy = root / "policy.yaml"
        policy.write_text(json.dumps({"version": 1, "workspace": str(ws), "principals": {"agent": {"roles": ["dev"]}},
                                      "roles": {"dev": {"level": 2, "read_roots": ["."], "write_roots": ["."]}},
                                      "tools": {"run": {"allow_from": 1}}, "rules": []}))  # fmt: skip
        gateway = str(Path(sys.executable).parent / "gateway")
        tokens = root / "tokens.json"
        made = subprocess.run([gateway, "token", "create", "--supervisor", "bench", "--tokens", str(tokens)],
                              capture_output=True, text=True, check=True)  # fmt: skip
        secret = made.stdout.strip().splitlines()[-1]
        err = (root / "serve.err").open("w")
        server = subprocess.Popen([gateway, "serve", "--http", "127.0.0.1:0", "--tokens", str(tokens), "--policy",
                                   str(policy), "--workspace", str(ws), "--audit-dir", str(audit), "--audit-keys",
                                   str(keys), "--state-dir", str(root / "q"), "--process-dir", str(root / "p")],
                                  stdout=subprocess.DEVNULL, stderr=err)  # fmt: skip
        options = webdriver.ChromeOptions()
        options.binary_location = shutil.which("chromium") or "chromium"
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1400,1100"):  # fmt: skip
            options.add_argument(arg)
        driver = webdriver.Chrome(service=Service(executable_path=shutil.which("chromedriver")), options=options)
        try:
            while not (
                found := re.search(r"listening on (http://127\.0\.0\.1:\d+)/mcp", (root / "serve.err").read_text())
            ):
                if server.poll() is not None:
                    raise SystemExit((root / "serve.err").read_text())
                time.sleep(0.05)
            started = time.perf_counter()
            driver.get(found.group(1) + "/console/login")
            driver.find_element(By.ID, "secret").send_keys(secret)
            driver.find_element(By.ID, "signin").click()
            WebDriverWait(driver, 600).until(lambda d: d.find_element(By.ID, "who").text)
            timing = """
                const done = arguments[arguments.length - 1];
                location.hash = "#inbox";
                setTimeout(() => {
                  const t0 = performance.now();
                  location.hash = "#overview";
                  const drawn = () => document.querySelector("#chart-principals rect")
                    && document.getElementById("overview-summary").textContent.includes(" calls from ");
                  const look = () => drawn() ? done(performance.now() - t0) : requestAnimationFrame(look);
                  document.getElementById("charts").replaceChildren();
                  look();
                }, 50);"""
            driver.set_script_timeout(600)
            first = driver.execute_async_script(timing)
            print(
                f"browser, first overview right after the server started (the index still folding): "
                f"{first:.0f} ms (start to sign-in {1000 * (time.perf_counter() - started) - first:.0f} ms)"
            )
            times = [driver.execute_async_script(timing) for _ in range(RUNS)]
            print(
                f"browser, overview from the click to the last chart drawn: {statistics.median(times):.0f} ms "
                f"(median of {RUNS}: {', '.join(f'{t:.0f}' for t in times)})"
            )
        finally:
            driver.quit()
            server.terminate()
            server.wait(60)


def main() -> None:
    if "--browser" in sys.argv:
        args = [a for a in sys.argv[1:] if a != "--browser"]
        browser(int(args[0]) if args else 100_000)
        return
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    now = datetime.now(UTC)
    since = now - timedelta(hours=24)
    with tempfile.TemporaryDirectory() as tmp:
        audit = Path(tmp) / "audit"
        ledger = Ledger(audit, since)
        write_calls(ledger, 0, n, since, timedelta(hours=23))
        ledger.flush()
        size = ledger.path.stat().st_size
        print(f"{n} calls, {ledger.seq} records, {size / 1e6:.1f} MB")

        def answer(index: CallIndex) -> str:
            return json.dumps(overview_shown(overview(index.all_calls(), since, now + timedelta(seconds=1))))

        def cold() -> str:
            return answer(CallIndex(audit))

        took, body = median_of(cold)
        counted = json.loads(body)["calls"]
        print(f"cold (fold the whole log, then count): {took * 1000:.0f} ms  ({counted} calls counted)")
        index = CallIndex(audit)
        index.refresh()
        took, _ = median_of(lambda: answer(index))
        print(f"warm (count, and the answer's JSON): {took * 1000:.0f} ms")
        appended = [n]

        def append() -> str:
            write_calls(ledger, appended[0], 100, now - timedelta(minutes=5), timedelta(minutes=1))
            ledger.flush()
            appended[0] += 100
            return answer(index)

        took, _ = median_of(append)
        print(f"100 calls appended, then a request: {took * 1000:.0f} ms")
        took, _ = median_of(lambda: [call_row(c) for c in index.calls(Selection(), 200, None, None)["calls"]])
        print(f"timeline, first 200 calls: {took * 1000:.0f} ms")
        chosen = Selection.of(text="requirements")
        took, found = median_of(lambda: index.calls(chosen, 200, None, index.text_calls(chosen))["matched"])
        print(f"timeline, text filter over the whole log: {took * 1000:.0f} ms ({found} calls)")


if __name__ == "__main__":
    main()
