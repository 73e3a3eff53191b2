"""The browser harness (tests/browser.py) on a tiny page of its own, served from loopback.

Real headless Chromium and a real HTTP server: an <img> whose source changes (what the live view
does), a <canvas> drawn on by mouse (what the zone editor does), an H.264 <video> that plays (the
clips), and a screenshot.
"""

from __future__ import annotations

import functools
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import cv2
import numpy as np
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests import browser as browser_fixtures
from tests.browser import (
    START_SECONDS,
    WINDOW,
    console_errors,
    draw_polygon,
    screenshot,
    video_plays,
    wait_element,
    wait_js,
    wait_rendered_change,
)
from tests.waits import free_port

browser = browser_fixtures.browser

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>harness</title>
<style>body { margin: 0; } canvas { display: block; border: 0; }</style></head>
<body>
<img id="frame" src="frame0.png" width="64" height="48">
<canvas id="pad" width="400" height="300"></canvas>
<button id="close">close</button>
<video id="clip" src="clip.mp4" muted playsinline width="160" height="120"></video>
<video id="broken" src="broken.mp4" muted width="160" height="120"></video>
<script>
  // The <img> cycles through three frames, as a live view refreshes its snapshot.
  let frame = 0;
  const image = document.getElementById("frame");
  setInterval(() => { frame = (frame + 1) % 3; image.src = `frame${frame}.png`; }, 300);
  // The canvas records where it was clicked, in its own pixels, and draws the points.
  window.clicks = []; window.dblclicks = []; window.finished = false;
  const pad = document.getElementById("pad"), ctx = pad.getContext("2d");
  pad.addEventListener("click", (e) => {
    window.clicks.push([e.offsetX, e.offsetY]);
    ctx.fillRect(e.offsetX - 2, e.offsetY - 2, 4, 4);
  });
  pad.addEventListener("dblclick", (e) => window.dblclicks.push([e.offsetX, e.offsetY]));
  document.getElementById("close").addEventListener("click", () => { window.finished = true; });
</script>
</body></html>
"""

SQUARE = [(40.0, 30.0), (360.0, 50.0), (330.0, 260.0), (60.0, 240.0)]


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # the test output stays readable
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The page, three coloured frames and a 1 s H.264 clip, served by http.server on loopback."""
    root = tmp_path_factory.mktemp("site")
    (root / "index.html").write_text(PAGE)
    for i, colour in enumerate([(0, 0, 255), (0, 255, 0), (255, 0, 0)]):
        cv2.imwrite(str(root / f"frame{i}.png"), np.full((48, 64, 3), colour, np.uint8))
    # What a browser plays: H.264 in yuv420p, the index (moov) first so playback starts at once.
    subprocess.run(
        [
            *("ffmpeg", "-loglevel", "error", "-f", "lavfi"),
            *("-i", "testsrc2=size=160x120:rate=10:duration=1", "-c:v", "libx264", "-pix_fmt", "yuv420p"),
            *("-movflags", "+faststart", str(root / "clip.mp4")),
        ],
        check=True,
        timeout=60,
    )
    (root / "broken.mp4").write_bytes(b"not a video at all" * 64)
    server = ThreadingHTTPServer(
        ("127.0.0.1", free_port()), functools.partial(_QuietHandler, directory=str(root))
    )
    thread = threading.Thread(target=server.serve_forever, name="test-site", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def page(browser: WebDriver, site: str) -> WebDriver:
    browser.get(site)
    wait_element(browser, "#pad")
    console_errors(browser)  # from a clean console
    return browser


def test_the_browser_starts_headless_at_the_fixed_window_size(page: WebDriver) -> None:
    # One start for the session; its time is printed for the report (pytest -s).
    assert START_SECONDS, "the browser fixture did not record its start"
    print(f"headless Chromium started in {START_SECONDS[0]:.2f} s")
    size = page.execute_script("return [window.innerWidth, window.innerHeight, window.devicePixelRatio]")
    assert size == [WINDOW[0], WINDOW[1], 1]
    assert "HeadlessChrome" in page.execute_script("return navigator.userAgent")


def test_an_img_whose_source_changes_is_redrawn(page: WebDriver) -> None:
    image = page.find_element(By.ID, "frame")
    seen = set()
    for _ in range(2):  # two changes: the page keeps refreshing, not a single swap
        png = wait_rendered_change(image, "the <img> to show another frame")
        pixels = cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_COLOR)
        assert pixels is not None, "the element screenshot is no image"
        seen.add(tuple(int(c) for c in pixels[pixels.shape[0] // 2, pixels.shape[1] // 2]))
    # Each redraw shows one of the served frames, whole (pure blue, green or red).
    assert seen <= {(0, 0, 255), (0, 255, 0), (255, 0, 0)} and len(seen) == 2, seen
    loaded = "return arguments[0].complete && arguments[0].naturalWidth"
    assert wait_js(page, loaded, "the frame to load", image) == 64
    assert console_errors(page) == []


def test_a_polygon_drawn_by_mouse_lands_within_a_pixel(page: WebDriver) -> None:
    pad = page.find_element(By.ID, "pad")
    draw_polygon(page, pad, SQUARE, close=page.find_element(By.ID, "close"))
    clicks = wait_js(page, "return window.finished && window.clicks", "the polygon's clicks and its closing")
    assert len(clicks) == len(SQUARE)
    for (x, y), (cx, cy) in zip(SQUARE, clicks, strict=True):
        assert abs(cx - x) <= 1 and abs(cy - y) <= 1, (SQUARE, clicks)

    # Closed by a double-click on the last point instead: the browser sends click, click, dblclick there.
    page.execute_script("window.clicks = []; window.dblclicks = []")
    draw_polygon(page, pad, SQUARE, close="double-click")
    dblclicks = wait_js(page, "return window.dblclicks.length && window.dblclicks", "the double-click")
    clicks = page.execute_script("return window.clicks")
    assert len(clicks) == len(SQUARE) + 1 and clicks[-1] == clicks[-2] == dblclicks[0]
    last_x, last_y = SQUARE[-1]
    assert abs(dblclicks[0][0] - last_x) <= 1 and abs(dblclicks[0][1] - last_y) <= 1


def test_an_h264_video_loads_and_plays(page: WebDriver) -> None:
    state = video_plays(page, page.find_element(By.ID, "clip"))
    assert state["duration"] == pytest.approx(1.0, abs=0.15)
    assert state["currentTime"] > 0 and state["error"] is None


def test_a_video_the_browser_cannot_play_fails_at_once_with_its_message(page: WebDriver) -> None:
    started = time.monotonic()
    with pytest.raises(AssertionError, match="the <video> failed: 4 "):  # MEDIA_ERR_SRC_NOT_SUPPORTED
        video_plays(page, page.find_element(By.ID, "broken"), timeout=15)
    assert time.monotonic() - started < 10, "it waited out the timeout instead of failing on the error"


def test_a_screenshot_is_a_png_of_the_window(page: WebDriver, tmp_path: Path) -> None:
    path = screenshot(page, tmp_path / "shots" / "page.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    assert struct.unpack(">II", data[16:24]) == WINDOW
    # It decodes, and shows the page: the <img> at the top-left corner holds one of the frames.
    pixels = cv2.imread(str(path))
    assert pixels is not None and pixels.shape == (WINDOW[1], WINDOW[0], 3)
    assert tuple(int(c) for c in pixels[24, 32]) in {(0, 0, 255), (0, 255, 0), (255, 0, 0)}
