"""The console in a real browser (issue 15): headless Chromium (Debian's `chromium` and its
`chromium-driver`, which `make test` installs), driven by Selenium, against a real
`gateway serve --http`, with the agent on the official MCP SDK client.

The supervisor signs in, sees two calls appear without a reload, approves one and denies the
other with a reason; the agent receives both results. Then (issue 27) the cards at 360 and 1,400
px answered from the keyboard, the calls' timeline and a call's story, what-if's flips, and the
overview's charts against a ledger of known counts. The tests take the screenshots that
docs/serve.md shows: into the test's own directory each run, and over docs/console-*.png when
AGW_SCREENSHOT=1 (`AGW_SCREENSHOT=1 .venv/bin/pytest tests/server/test_console_browser.py`), so a
test run leaves the work tree clean. It never skips: without a browser it fails, saying what to
install."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from selenium import webdriver
from selenium.common.exceptions import ElementNotInteractableException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from gateway.audit import open_signed
from tests.server.conftest import HttpGateway, audit_records, envelope_of, gateway_cmd
from tests.server.test_supervisor_side import ask_in_background, wait_for
from tests.server.test_transports import call_http

DOCS = Path(__file__).resolve().parents[2] / "docs"
XSS = "<b id=pwn>x</b><img src=x onerror=document.title='pwned'>"
BOUND_S = 60  # a bound for a broken build only: every wait ends as soon as the page shows it


def _binary(*names: str) -> str:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    raise AssertionError(f"no {names[0]} on this machine: `make test` installs it (apt-get install -y chromium "
                         "chromium-driver); the console's browser test does not skip")  # fmt: skip


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = _binary("chromium", "chromium-browser")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1100", "--no-first-run", "--disable-extensions"):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=_binary("chromedriver")), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def until(driver: WebDriver, what: str, check: Any) -> Any:
    """`check(driver)` once it is true; an element redrawn under it (stale) is looked for again."""
    wait = WebDriverWait(driver, BOUND_S, ignored_exceptions=(StaleElementReferenceException,
                                                              ElementNotInteractableException))  # fmt: skip
    return wait.until(lambda d: check(d), message=f"never happened: {what}")


def click(driver: WebDriver, css: str) -> bool:
    """Click what `css` finds now (for `until`, which looks again when it was redrawn meanwhile)."""
    driver.find_element(By.CSS_SELECTOR, css).click()
    return True


def test_a_supervisor_answers_two_calls_in_a_real_browser(
    tmp_path: Path, policy_file: Path, ws: Path, browser: WebDriver
) -> None:
    server = HttpGateway(tmp_path, policy_file, ws, extra=("--pending-after", "600"))
    try:
        base = server.url.removesuffix("/mcp")
        agent = server.token("agent")
        secret = gateway_cmd("token", "create", "--supervisor", "alice", "--tokens", str(server.tokens))
        secret_text = secret.stdout.strip().splitlines()[-1]

        # signing in: the page sends a visitor without a session to the form
        browser.get(base + "/console/")
        until(browser, "the login form", lambda d: d.current_url.endswith("/console/login"))
        browser.find_element(By.ID, "secret").send_keys(secret_text)
        browser.find_element(By.ID, "signin").click()
        until(browser, "the signed-in page", lambda d: d.find_element(By.ID, "who").text == "signed in as alice")
        until(browser, "the live stream", lambda d: d.find_element(By.ID, "live").text == "live")
        cookie = browser.get_cookie("agw_console")
        assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict", cookie
        browser.execute_script("window.notReloaded = true")

        # the agent asks twice; the calls appear on the page by themselves
        (ws / "keep.txt").write_text("x")
        approved = ask_in_background(server, agent, ("run", {"command": "rm -f keep.txt"}))
        denied = ask_in_background(server, agent, ("run", {"command": f'rm -f "{XSS}"'}))
        cards = until(browser, "two pending calls", lambda d: len(d.find_elements(By.CSS_SELECTOR, "li.approval")) == 2
                      and d.find_elements(By.CSS_SELECTOR, "li.approval"))  # fmt: skip
        assert browser.execute_script("return window.notReloaded") is True  # no reload happened
        by_command = {c.find_element(By.CSS_SELECTOR, "pre.command").text: c for c in cards}
        assert set(by_command) == {"rm -f keep.txt", f'rm -f "{XSS}"'}, by_command
        # the agent's text is text: no element, no script from it
        assert browser.find_elements(By.ID, "pwn") == [] and browser.title != "pwned"
        assert "deleting needs a supervisor" in cards[0].text and "rm-by-supervisor" in cards[0].text
        until(browser, "the verify status", lambda d: "verified" in d.find_element(By.ID, "verify").text)
        assert browser.save_screenshot(str(tmp_path / "console.png"))

        # approve one, deny the other with a reason (the list is drawn again at each event: each
        # step finds its card by the call's id, and starts again if the card was redrawn under it)
        ids = {text: c.get_attribute("data-call-id") for text, c in by_command.items()}

        def card(d: WebDriver, text: str) -> Any:
            return d.find_element(By.CSS_SELECTOR, f'li.approval[data-call-id="{ids[text]}"]')

        card(browser, "rm -f keep.txt").find_element(By.CSS_SELECTOR, "button.approve").click()
        until(browser, "the first answer taken", lambda d: len(d.find_elements(By.CSS_SELECTOR, "li.approval")) == 1)
        why = "not that one: explain the <b> file first"
        call_id = ids[f'rm -f "{XSS}"']

        def typed(d: WebDriver) -> bool:
            box = card(d, f'rm -f "{XSS}"').find_element(By.CSS_SELECTOR, "input.reason")
            if box.get_attribute("value") != why:
                box.clear()
                box.send_keys(why)
            return bool(card(d, f'rm -f "{XSS}"').find_element(By.CSS_SELECTOR, "input.reason").get_attribute("value")
                        == why)  # fmt: skip

        until(browser, "the reason typed", typed)
        deny = (By.CSS_SELECTOR, "button.deny")
        until(browser, "the deny clicked", lambda d: card(d, f'rm -f "{XSS}"').find_element(*deny).click() or True)
        until(browser, "an empty inbox", lambda d: d.find_element(By.ID, "count").text == "0")

        # the agent (the official SDK client) receives both results
        ok = envelope_of(wait_for("the approved call's result", lambda: approved)[0][0])
        assert ok["status"] == "ok", ok
        assert not (ws / "keep.txt").exists()
        refused = envelope_of(wait_for("the denied call's result", lambda: denied)[0][0])
        assert refused["error"]["code"] == "APPROVAL_DENIED" and why in refused["error"]["message"], refused
        answers = [r for r in audit_records(server.audit) if r["event"] == "supervisor_answer"]
        assert [(a["data"]["via"], a["data"]["approved"]) for a in answers] == [("session", True), ("session", False)]

        # the calls' timeline shows the answered call in one row, and its page opens from it
        browser.find_element(By.ID, "tab-calls").click()
        row = (By.CSS_SELECTOR, f'tr.call[data-call-id="{call_id}"]')
        until(browser, "the timeline", lambda d: d.find_elements(*row))
        until(browser, "the call link clicked",
              lambda d: d.find_element(*row).find_element(By.CSS_SELECTOR, "a.call-link").click() or True)  # fmt: skip
        until(browser, "the call's page", lambda d: why in d.find_element(By.ID, "call-body").text)
    finally:
        server.stop()


# --- issue 27: calls, cards, pictures ---------------------------------------------------------------


def shot(browser: WebDriver, tmp_path: Path, name: str) -> Path:
    """A screenshot into the test's directory, and over docs/NAME with AGW_SCREENSHOT=1."""
    path = DOCS / name if os.environ.get("AGW_SCREENSHOT") == "1" else tmp_path / name
    assert browser.save_screenshot(str(path)) and path.stat().st_size > 0
    return path


def sign_in(browser: WebDriver, server: HttpGateway, name: str = "alice") -> None:
    base = server.url.removesuffix("/mcp")
    secret = gateway_cmd("token", "create", "--supervisor", name, "--tokens", str(server.tokens))
    browser.get(base + "/console/login")
    browser.find_element(By.ID, "secret").send_keys(secret.stdout.strip().splitlines()[-1])
    browser.find_element(By.ID, "signin").click()
    who = (By.ID, "who")  # its text, shown or not (a phone's header leaves it out)
    until(
        browser,
        "the signed-in page",
        lambda d: d.find_element(*who).get_attribute("textContent") == f"signed in as {name}",
    )
    until(browser, "the live stream", lambda d: d.find_element(By.ID, "live").text == "live")


def no_page_overflow(browser: WebDriver) -> None:
    """Nothing wider than the window (a phone would scroll the whole page sideways), and no text
    set to break inside a word."""
    width = browser.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], width
    broken = browser.execute_script(
        "return Array.from(document.querySelectorAll('body *')).filter(e => {"
        " const s = getComputedStyle(e); return s.wordBreak === 'break-all' || s.overflowWrap === 'anywhere'"
        " || s.overflowWrap === 'break-word' || s.wordBreak === 'break-word'; })"
        ".map(e => e.tagName + '.' + e.className)"
    )
    assert broken == [], broken


SCRIPT_RULES = [
    {
        "id": "python-script",
        "decision": "ask",
        "justification": "running a workspace script needs a supervisor",
        "risk": "the script runs with the agent's rights on the whole workspace",
        "programs": ["python3"],
        "path_args": {"read": "first"},
        "accept_unknown": True,
        "examples": {"match": ["python3 x.py"]},
    },
]


def test_cards_at_360_and_1400_px_and_answered_from_the_keyboard(
    tmp_path: Path, policy_file: Path, ws: Path, browser: WebDriver
) -> None:
    """Issue 27, point 2: a card says what the call runs, reads and writes, grouped ("binds 7
    module paths as absent", not seven lines), the rule, why and its risk; the tab title counts
    what waits; j/k move, a approves the selected card, r and d deny it with a reason."""
    spec = yaml.safe_load(policy_file.read_text())
    spec["rules"] += SCRIPT_RULES
    spec["rules"][[r["id"] for r in spec["rules"]].index("rm-by-supervisor")]["risk"] = "the files are gone for good"
    policy_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    modules = [f"helper_{k}" for k in range(7)]
    (ws / "tool.py").write_text("".join(f"import {m}\n" for m in modules) + "print('done')\n")
    for name in "abcde":
        (ws / name).write_text("x")
    server = HttpGateway(tmp_path, policy_file, ws, extra=("--pending-after", "600"))
    try:
        agent = server.token("agent")
        browser.set_window_size(360, 900)
        base = server.url.removesuffix("/mcp")
        browser.execute_cdp_cmd("Browser.grantPermissions", {"origin": base, "permissions": ["notifications"]})
        long_word = "x" * 300  # a word longer than any screen: it scrolls in its box, the page does not
        asyncio.run(call_http(server.url, agent, "auto", ("run", {"command": f"echo {long_word}"})))
        sign_in(browser, server)
        assert not browser.find_element(By.ID, "notify").is_displayed()  # granted: nothing to ask
        browser.execute_script(  # the desktop notifications shown, recorded as they are made
            "window.shown = []; const Real = window.Notification;"
            "window.Notification = class extends Real { constructor(t, o) { super(t, o); window.shown.push(t); } };"
        )
        script = ask_in_background(server, agent, ("run", {"command": "python3 tool.py"}))
        cards = (By.CSS_SELECTOR, "li.approval")
        until(browser, "the first card", lambda d: len(d.find_elements(*cards)) == 1)
        rm = ask_in_background(server, agent, ("run", {"command": "rm -f a b c d e"}))
        until(browser, "two cards", lambda d: len(d.find_elements(*cards)) == 2)
        until(browser, "the tab's title", lambda d: d.title.startswith("(2) waiting"))
        shown = until(browser, "two notifications", lambda d: len(d.execute_script("return window.shown")) == 2
                      and d.execute_script("return window.shown"))  # fmt: skip
        assert shown == ["1 call waits for a supervisor", "2 calls wait for a supervisor"], shown
        first, second = browser.find_elements(*cards)
        assert first.find_element(By.CSS_SELECTOR, "pre.command").text == "python3 tool.py"
        runs = first.find_element(By.CSS_SELECTOR, "dd.runs").text
        assert "binds 7 module paths as absent" in runs, runs
        assert not any(m in runs for m in modules), runs  # grouped: the names are one click away
        rules = first.find_element(By.CSS_SELECTOR, "dl.rules").text
        assert "python-script" in rules and "needs a supervisor" in rules and "with the agent's rights" in rules
        writes = second.find_element(By.CSS_SELECTOR, "dd.writes").text
        assert "writes 5 paths: 5 in ./" in writes, writes
        assert "the files are gone for good" in second.find_element(By.CSS_SELECTOR, "dl.rules").text
        no_page_overflow(browser)
        narrow = shot(browser, tmp_path, "console-cards-360.png")
        browser.set_window_size(1400, 1000)
        no_page_overflow(browser)
        wide = shot(browser, tmp_path, "console-cards-1400.png")
        assert narrow.stat().st_size > 0 and wide.stat().st_size > 0

        # the keyboard: j selects the second card (rm), a approves it; r, a reason, d denies the script
        body = browser.find_element(By.TAG_NAME, "body")
        body.send_keys("j")
        until(browser, "the second card selected",
              lambda d: "selected" in d.find_elements(*cards)[1].get_attribute("class"))  # fmt: skip
        body.send_keys("a")
        until(browser, "one card left", lambda d: len(d.find_elements(*cards)) == 1)
        until(browser, "the title follows", lambda d: d.title.startswith("(1) waiting"))
        body.send_keys("r")
        until(browser, "the reason box focused",
              lambda d: d.switch_to.active_element.get_attribute("class") == "reason")  # fmt: skip
        browser.switch_to.active_element.send_keys("import what exactly?")
        browser.switch_to.active_element.send_keys(Keys.ESCAPE)
        body.send_keys("d")
        until(browser, "an empty inbox", lambda d: d.find_element(By.ID, "count").text == "0")
        assert browser.title == "agent-gateway console"
        ok = envelope_of(wait_for("the approved call's result", lambda: rm)[0][0])
        assert ok["status"] == "ok" and not (ws / "a").exists(), ok
        refused = envelope_of(wait_for("the denied call's result", lambda: script)[0][0])
        assert refused["error"]["code"] == "APPROVAL_DENIED", refused
        assert "import what exactly?" in refused["error"]["message"], refused
        browser.set_window_size(360, 900)  # the calls on a phone, a very long word among them
        browser.find_element(By.ID, "tab-calls").click()
        until(browser, "the calls", lambda d: len(d.find_elements(By.CSS_SELECTOR, "#timeline tr.call")) == 3)
        no_page_overflow(browser)
    finally:
        server.stop()


def test_the_call_timeline_and_a_call_page_that_reads_like_a_story(
    tmp_path: Path, policy_file: Path, ws: Path, browser: WebDriver
) -> None:
    """Issue 27, point 1: one row per call (not three or four records), expanding to its
    records; a call's page tells what happened in order, the raw JSON one click away."""
    server = HttpGateway(tmp_path, policy_file, ws, extra=("--pending-after", "600"))
    try:
        agent = server.token("agent")
        (ws / "gone.txt").write_text("x")
        asyncio.run(call_http(server.url, agent, "auto", ("run", {"command": "echo hello"}),
                              ("run", {"command": "curl x"})))  # fmt: skip
        sign_in(browser, server)
        asked = ask_in_background(server, agent, ("run", {"command": "rm -f gone.txt"}))
        approve = (By.CSS_SELECTOR, "li.approval button.approve")
        until(browser, "the ask answered", lambda d: d.find_element(*approve).click() or True)
        assert envelope_of(wait_for("the result", lambda: asked)[0][0])["status"] == "ok"
        browser.find_element(By.ID, "tab-calls").click()
        rows = (By.CSS_SELECTOR, "#timeline tr.call")

        def calls(d: WebDriver) -> dict[str, tuple[str, list[str], str]]:
            """command -> (call id, cells, row text), read in one look (the live timeline may
            redraw a row meanwhile: `until` then looks again)."""
            found = {}
            for r in d.find_elements(*rows):
                cells = [td.text for td in r.find_elements(By.TAG_NAME, "td")]
                what = r.find_element(By.CSS_SELECTOR, "td.what").text
                found[what] = (r.get_attribute("data-call-id") or "", cells, r.text)
            return found

        def ended(d: WebDriver) -> dict[str, tuple[str, list[str], str]] | None:
            t = calls(d)
            return t if len(t) == 3 and "ok · exit 0" in t.get("rm -f gone.txt", ("", [], ""))[1] else None

        by_command = until(browser, "three calls, the last one ended", ended)
        assert set(by_command) == {"echo hello", "curl x", "rm -f gone.txt"}, by_command
        call_id, cells, _ = by_command["rm -f gone.txt"]
        assert "ask · rm-by-supervisor → allow" in cells and "alice" in cells and "ok · exit 0" in cells, cells
        assert "deny · no-curl" in by_command["curl x"][2] and "POLICY_DENIED" in by_command["curl x"][2]
        assert "3 calls match" in browser.find_element(By.ID, "matched").text
        # every record, those about no call too (the sign-in), one click away
        browser.find_element(By.ID, "as-records").click()
        events = (By.CSS_SELECTOR, "#records tbody td[data-label=event]")
        until(browser, "the records", lambda d: "console_login" in [e.text for e in d.find_elements(*events)])
        assert len([e for e in browser.find_elements(*events) if e.text == "decision"]) == 3
        browser.find_element(By.ID, "as-records").click()
        until(browser, "the calls again", lambda d: d.find_element(By.ID, "timeline").is_displayed())
        row = f'tr.call[data-call-id="{call_id}"]'
        # a row opens to its records (looked up afresh: the live timeline may redraw it meanwhile)
        until(browser, "the row opened", lambda d: click(d, f"{row} button.expand"))
        records = until(browser, "the records", lambda d: d.find_elements(By.CSS_SELECTOR, "tr.records li .event"))
        assert [e.text for e in records] == ["decision", "supervisor_answer", "approval", "result"]
        no_page_overflow(browser)
        shot(browser, tmp_path, "console-calls.png")
        until(browser, "the call's page", lambda d: click(d, f"{row} a.call-link"))
        steps = until(browser, "the story", lambda d: d.find_elements(By.CSS_SELECTOR, "#call-body ol.story li"))
        names = [s.find_element(By.CSS_SELECTOR, ".step-name").text for s in steps]
        assert names == ["decided", "asked", "answered", "answered", "ran", "ended"], names
        told = browser.find_element(By.CSS_SELECTOR, "#call-body ol.story").text
        assert "ask by rule rm-by-supervisor: rm -f gone.txt" in told and "approved by alice" in told, told
        assert "ok, exit 0" in told, told
        raw = browser.find_element(By.CSS_SELECTOR, "#call-body details.raw")
        assert not raw.find_element(By.CSS_SELECTOR, "pre.record").is_displayed()
        raw.find_element(By.TAG_NAME, "summary").click()
        first = raw.find_element(By.CSS_SELECTOR, "pre.record")
        assert first.is_displayed() and f'"call_id": "{call_id}"' in first.text
        assert browser.current_url.endswith(f"#call/{call_id}")
        shot(browser, tmp_path, "console-call.png")

        # what-if: a draft that denies deleting shows its flips as a table and a chart, by rule
        draft = yaml.safe_load(policy_file.read_text())
        for rule in draft["rules"]:
            if rule["id"] == "rm-by-supervisor":
                rule["decision"] = "deny"
            if rule["id"] == "basics":
                rule["decision"] = "ask"
        (policy_file.parent / "draft.yaml").write_text(yaml.safe_dump(draft, sort_keys=False))
        browser.find_element(By.ID, "tab-replay").click()
        browser.find_element(By.CSS_SELECTOR, "#replay-form input[name=policy_file]").send_keys("draft.yaml")
        browser.find_element(By.CSS_SELECTOR, "#replay-form button[type=submit]").click()
        flips = until(browser, "the flips chart", lambda d: d.find_elements(By.CSS_SELECTOR, "svg.flips rect"))
        drawn = {
            (r.get_attribute("data-rule"), r.get_attribute("data-to")): r.get_attribute("data-count") for r in flips
        }
        assert drawn == {("rm-by-supervisor", "deny"): "1", ("basics", "ask"): "1"}, drawn
        table = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")]
                 for tr in browser.find_elements(By.CSS_SELECTOR, "table.changes tr.change")]  # fmt: skip
        assert sorted(table) == [["basics", "allow", "ask", "basics", "1"],
                                 ["rm-by-supervisor", "ask", "deny", "rm-by-supervisor", "1"]], table  # fmt: skip
        assert "2 would change" in browser.find_element(By.ID, "replay-summary").text
        shot(browser, tmp_path, "console-replay.png")
    finally:
        server.stop()


KNOWN = {  # principal: [(command, decision, rule, answer)] of the ledger the overview counts
    "agent": [("echo a", "allow", "basics", None)] * 5
    + [("rm x", "ask", "rm-by-supervisor", True)] * 2
    + [("rm y", "ask", "rm-by-supervisor", False)]
    + [("curl x", "deny", "no-curl", None)] * 2
    + [("curl y", "deny", "no-curl", None)],
    "other": [("echo b", "allow", "basics", None)] * 4 + [("wget z", "deny", "no-wget", None)],
}


def write_known_ledger(audit: Path, keys: Path) -> None:
    log = open_signed(audit, keys)
    n = 0
    for principal, calls in KNOWN.items():
        for command, decision, rule, answer in calls:
            n += 1
            base = {"call_id": f"known{n:04d}", "principal": principal, "tool": "run", "policy_sha256": "ab" * 32}
            log.append("decision", **base, arguments={"command": command}, decision=decision, rule=rule,
                       reasons=[{"stage": "permissions", "code": "rule", "message": rule, "rule": rule}])  # fmt: skip
            if decision == "ask":
                log.append("approval", **base, decision="allow" if answer else "deny", rule=rule,
                           data={"answered": True, "by": "alice", "how": "queue"})  # fmt: skip
            if decision == "allow" or answer:
                log.append("result", **base, data={"status": "ok", "exit_code": 0, "duration_ms": 5})


def test_overview_charts_count_a_ledger_with_known_counts(
    tmp_path: Path, policy_file: Path, ws: Path, browser: WebDriver
) -> None:
    """Issue 27, point 3: the overview's charts (inline SVG from the server's counts) against a
    ledger whose counts are known: calls per hour by decision, the top denied rules and commands,
    approvals' waits, per principal."""
    write_known_ledger(tmp_path / "audit", tmp_path / "keys")
    server = HttpGateway(tmp_path, policy_file, ws, extra=("--audit-keys", str(tmp_path / "keys")))
    try:
        browser.set_window_size(1400, 1300)
        sign_in(browser, server)
        browser.find_element(By.ID, "tab-overview").click()
        until(browser, "the charts", lambda d: d.find_elements(By.CSS_SELECTOR, "#chart-principals rect"))

        def counts(selector: str, *keys: str) -> dict[tuple[str, ...], int]:
            out: dict[tuple[str, ...], int] = {}
            for rect in browser.find_elements(By.CSS_SELECTOR, selector):
                key = tuple(rect.get_attribute(f"data-{k}") or "" for k in keys)
                out[key] = out.get(key, 0) + int(rect.get_attribute("data-count") or 0)
            return out

        assert counts("#chart-per-bucket rect.bar", "decision") == {("allow",): 9, ("ask",): 3, ("deny",): 4}
        assert counts("#chart-denied-rules rect.bar", "name") == {("no-curl",): 3, ("rm-by-supervisor",): 1,
                                                                 ("no-wget",): 1}  # fmt: skip
        assert counts("#chart-denied-commands rect.bar", "name") == {("curl x",): 2, ("curl y",): 1, ("rm y",): 1,
                                                                    ("wget z",): 1}  # fmt: skip
        assert counts("#chart-principals rect.bar", "principal", "decision") == {
            ("agent", "allow"): 5, ("agent", "ask"): 3, ("agent", "deny"): 3, ("other", "allow"): 4,
            ("other", "deny"): 1}  # fmt: skip
        assert sum(counts("#chart-waits rect.bar", "label").values()) == 3
        stats = browser.find_element(By.CSS_SELECTOR, "#chart-waits .waits-stats").text
        assert stats.startswith("answered 3, timed out 0, withdrawn 0, waiting now 0"), stats
        assert browser.find_element(By.ID, "overview-summary").text.startswith("16 calls from")
        no_page_overflow(browser)
        shot(browser, tmp_path, "console-overview.png")
        browser.set_window_size(360, 900)  # a phone: the charts shrink with the page
        no_page_overflow(browser)
        assert browser.save_screenshot(str(tmp_path / "console-overview-360.png"))  # looked at, not kept in docs/
    finally:
        server.stop()
