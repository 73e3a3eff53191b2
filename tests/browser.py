"""A real headless Chromium for the web pages' tests: Debian's chromium driven by its chromedriver.

Test modules re-export the fixture (`browser = browser_fixtures.browser`, as with media_fixtures) and
use the helpers below: waits built on WebDriverWait (no sleeps), screenshots, drawing a polygon with
the mouse, and checking that a <video> plays. scripts/setup.sh installs chromium and chromium-driver.

Nothing is downloaded: the Service names /usr/bin/chromedriver, so Selenium Manager (which would
fetch a driver and a browser, and send usage statistics) is never run; SE_OFFLINE and SE_AVOID_STATS
keep it offline should anything reach it anyway. Chromium's own background traffic (component
updates, field trials, sync) is turned off by flags, so a test only ever talks to loopback.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

import pytest
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
# The viewport's size in CSS pixels (device scale 1, so screenshots have exactly this size).
WINDOW = (1024, 768)
PAGE_LOAD_TIMEOUT_S = 30.0
# How long browser starts took, in seconds, for the tests that report it.
START_SECONDS: list[float] = []

T = TypeVar("T")


def start_browser(window: tuple[int, int] = WINDOW) -> WebDriver:
    """A new headless Chromium of `window` size; the caller quits it."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.is_file()]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} missing: the browser tests need Debian's chromium and chromium-driver "
            "(apt-get install chromium chromium-driver; scripts/setup.sh does it as root)",
            pytrace=False,
        )
    os.environ.setdefault("SE_OFFLINE", "true")
    os.environ.setdefault("SE_AVOID_STATS", "true")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    width, height = window
    for arg in (
        "--headless=new",
        f"--window-size={width},{height}",
        "--force-device-scale-factor=1",
        # /dev/shm is small in containers; Chromium crashes when it runs out there.
        "--disable-dev-shm-usage",
        # Pages start their <video> without a click, as a user's browser does for muted video.
        "--autoplay-policy=no-user-gesture-required",
        "--mute-audio",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--disable-default-apps",
        "--metrics-recording-only",
    ):
        options.add_argument(arg)
    if os.geteuid() == 0:
        # Chromium's sandbox refuses to run as root (CI containers and this box run tests as root).
        options.add_argument("--no-sandbox")
    # The page's console (errors from its JavaScript) for console_errors().
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    started = time.monotonic()
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    START_SECONDS.append(time.monotonic() - started)
    # --window-size is the outer size: headless Chromium still leaves room for a toolbar, so grow the
    # window by that much for the viewport (and the screenshots) to be exactly `window`.
    inner_w, inner_h, outer_w, outer_h = driver.execute_script(
        "return [innerWidth, innerHeight, outerWidth, outerHeight]"
    )
    driver.set_window_size(width + outer_w - inner_w, height + outer_h - inner_h)
    driver.set_page_load_timeout(PAGE_LOAD_TIMEOUT_S)
    driver.set_script_timeout(PAGE_LOAD_TIMEOUT_S)
    return driver


@pytest.fixture(scope="session")
def browser() -> Iterator[WebDriver]:
    """One headless Chromium for the whole session (starting one takes about a second); each test
    loads its own page with `browser.get(url)`."""
    driver = start_browser()
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(
    driver: WebDriver,
    condition: Callable[[WebDriver], T | Literal[False] | None],
    what: str,
    timeout: float = 10.0,
) -> T:
    """`condition(driver)` once it is truthy (its value); AssertionError naming `what` after `timeout` s."""
    try:
        return cast(T, WebDriverWait(driver, timeout, poll_frequency=0.05).until(condition))
    except TimeoutException:
        raise AssertionError(f"timed out after {timeout} s waiting for {what}") from None


def wait_js(driver: WebDriver, script: str, what: str, *args: object, timeout: float = 10.0) -> Any:
    """The value of `script` (a function body: `return ...`) once it is truthy."""
    return wait_for(driver, lambda d: d.execute_script(script, *args), what, timeout)


def wait_element(driver: WebDriver, css: str, timeout: float = 10.0) -> WebElement:
    """The first element matching the CSS selector `css` once it is displayed."""

    def shown(d: WebDriver) -> WebElement | None:
        found = d.find_elements(By.CSS_SELECTOR, css)
        return found[0] if found and found[0].is_displayed() else None

    return wait_for(driver, shown, f"a displayed {css!r}", timeout)


def wait_rendered_change(element: WebElement, what: str, timeout: float = 10.0) -> bytes:
    """Wait until what the browser draws for `element` differs from now (compared as element
    screenshots, so the change really reached the screen, e.g. a refreshed <img>); the new PNG."""
    before = element.screenshot_as_png
    return wait_for(
        element.parent,
        lambda _d: (after := element.screenshot_as_png) != before and after,
        what,
        timeout,
    )


def screenshot(driver: WebDriver, path: Path) -> Path:
    """The viewport as a PNG at `path` (WINDOW's size); for checks and for failure reports."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(driver.get_screenshot_as_png())
    return path


def console_errors(driver: WebDriver) -> list[str]:
    """The page's console errors (uncaught exceptions, failed loads) since the last call."""
    # What Chrome's get_log("browser") sends, for any WebDriver talking to chromedriver.
    entries: list[dict[str, Any]] = driver.execute("getLog", {"type": "browser"})["value"]
    return [e["message"] for e in entries if e.get("level") == "SEVERE"]


def draw_polygon(
    driver: WebDriver,
    element: WebElement,
    points: Sequence[tuple[float, float]],
    close: Literal["double-click"] | WebElement | None = "double-click",
) -> None:
    """Click each of `points` (CSS pixels from `element`'s top-left corner) with the mouse.

    close: "double-click" double-clicks the last point instead of clicking it (the browser then sends
    click, click, dblclick there); a WebElement (a "close" button) is clicked after the last point;
    None leaves the polygon open.
    """
    if len(points) < 1:
        raise ValueError("draw_polygon needs at least one point")
    # Offsets of move_to_element_with_offset count from the element's centre (W3C actions).
    rect = element.rect
    cx, cy = rect["width"] / 2, rect["height"] / 2
    # Moves take no time (the default is 250 ms each): the points are what matters, not the path.
    actions = ActionChains(driver, duration=0)
    for i, (x, y) in enumerate(points):
        actions.move_to_element_with_offset(element, round(x - cx), round(y - cy))
        if i == len(points) - 1 and close == "double-click":
            actions.double_click()
        else:
            actions.click()
    actions.perform()
    if isinstance(close, WebElement):
        close.click()


_VIDEO_STATE = """
const v = arguments[0];
// NaN (no metadata yet) and Infinity (a live stream) do not survive JSON: the comparison is made here.
return {loaded: v.duration > 0, duration: Number.isFinite(v.duration) ? v.duration : null,
        currentTime: v.currentTime, paused: v.paused, ended: v.ended,
        readyState: v.readyState, error: v.error ? `${v.error.code} ${v.error.message}` : null};
"""


def video_plays(driver: WebDriver, video: WebElement, timeout: float = 15.0) -> dict[str, Any]:
    """Check that a <video> loads (duration > 0) and plays (currentTime advances); its state after.

    Starts playback if the page has not; a media error (e.g. a codec the browser lacks) fails at
    once with the browser's message rather than after the timeout.
    """

    def state() -> dict[str, Any]:
        current: dict[str, Any] = driver.execute_script(_VIDEO_STATE, video)
        if current["error"]:
            raise AssertionError(f"the <video> failed: {current['error']}")
        return current

    loaded = wait_for(
        driver,
        lambda _d: (s := state())["loaded"] and s,
        "the <video>'s duration > 0",
        timeout,
    )
    driver.execute_script("arguments[0].play().catch(() => {});", video)
    start = loaded["currentTime"]
    return wait_for(
        driver,
        lambda _d: (s := state())["currentTime"] > start and s,
        f"the <video>'s currentTime to advance past {start}",
        timeout,
    )
