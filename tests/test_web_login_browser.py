"""Logging in to the page in a real headless Chromium (the form, its CSRF field and the cookie work
in a browser, within the page's Content-Security-Policy), against the real server on loopback."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from agent.config.web import WebConfig, WebUser
from agent.web.passwords import hash_password
from agent.web.server import WebServer
from tests import browser as browser_fixtures
from tests.browser import console_errors, screenshot, wait_element, wait_for

browser = browser_fixtures.browser
PASSWORD = "a long pass phrase"
STATUS = {"device": "door-box", "agent_version": "test", "mqtt": {"connected": True}, "pipelines": {}}
# EDGE_AGENT_UPDATE_SCREENSHOTS=1: the test's screenshot replaces the one docs/web.md shows.
SCREENSHOT = Path(__file__).resolve().parents[1] / "docs" / "img" / "web-login.png"


@pytest.fixture
def page_with_a_user() -> Iterator[str]:
    users = [WebUser(name="admin", password_hash=hash_password(PASSWORD))]
    server = WebServer(WebConfig(enabled=True, port=0, users=users), lambda: STATUS, "door-box")
    server.start()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()


def log_in(driver: WebDriver, password: str) -> None:
    wait_element(driver, "input[name=user]").send_keys("admin")
    driver.find_element(By.CSS_SELECTOR, "input[name=password]").send_keys(password)
    driver.find_element(By.CSS_SELECTOR, "form.login button").click()


def test_a_user_logs_in_and_out_in_a_browser(
    page_with_a_user: str, browser: WebDriver, tmp_path: Path
) -> None:
    browser.delete_all_cookies()
    browser.get(f"{page_with_a_user}/")
    wait_for(browser, lambda d: d.current_url.endswith("/login"), "the login page")
    log_in(browser, "not it")
    wait_for(browser, lambda d: "Wrong user or password" in d.page_source, "the refusal")
    shot = screenshot(browser, tmp_path / "web-login.png")
    if os.environ.get("EDGE_AGENT_UPDATE_SCREENSHOTS") == "1":
        SCREENSHOT.write_bytes(shot.read_bytes())
    log_in(browser, PASSWORD)
    wait_element(browser, "#pipelines")
    cookie = browser.get_cookie("edge_agent_session")
    assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert browser.execute_script("return document.cookie") == ""  # out of scripts' reach
    wait_element(browser, "header form button").click()  # log out (a POST with the CSRF field)
    wait_for(browser, lambda d: d.current_url.endswith("/login"), "the login page again")
    browser.get(f"{page_with_a_user}/")
    wait_for(browser, lambda d: d.current_url.endswith("/login"), "no page after logging out")
    # The 401 of the wrong password is the only console error.
    assert [e for e in console_errors(browser) if "401" not in e] == []
