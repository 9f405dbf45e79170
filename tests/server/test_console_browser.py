"""The console in a real browser (issue 15): headless Chromium (Debian's `chromium` and its
`chromium-driver`, which `make test` installs), driven by Selenium, against a real
`gateway serve --http`, with the agent on the official MCP SDK client.

The supervisor signs in, sees two calls appear without a reload, approves one and denies the
other with a reason; the agent receives both results. The test takes the screenshot that
docs/serve.md shows: into the test's own directory each run, and over docs/console.png when
AGW_SCREENSHOT=1 (`AGW_SCREENSHOT=1 .venv/bin/pytest tests/server/test_console_browser.py`), so a
test run leaves the work tree clean. It never skips: without a browser it fails, saying what to
install."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import ElementNotInteractableException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.server.conftest import HttpGateway, audit_records, envelope_of, gateway_cmd
from tests.server.test_supervisor_side import ask_in_background, wait_for

SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "console.png"
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
        shot = SCREENSHOT if os.environ.get("AGW_SCREENSHOT") == "1" else tmp_path / "console.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 0

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

        # the timeline shows the answers, and a call's page opens from it
        links = (By.CSS_SELECTOR, "button.call-link")
        until(browser, "the timeline", lambda d: any(call_id == b.text for b in d.find_elements(*links)))
        until(browser, "the call link clicked",
              lambda d: next(b for b in d.find_elements(*links) if b.text == call_id).click() or True)  # fmt: skip
        until(browser, "the call's page", lambda d: why in d.find_element(By.ID, "call-body").text)
    finally:
        server.stop()
