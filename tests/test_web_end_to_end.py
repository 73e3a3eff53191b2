"""Issue 37's Done-when in one run: a real daemon (`edge-agent run`) with the web page on and a user,
the real YOLOv8n face detector (nudenet's 320n.onnx) tracking a rendered walker, a real mosquitto,
and Debian's headless Chromium driving the pages as a person would:

log in; the live view's picture changes by itself (its age and the pipeline's fps beside it); the
models page says where the detector serves and why; a zone is drawn with the mouse on the pipeline's
frame (a corner dragged into place) and saved; the config file holds it with its comments; the daemon
applied it (its status shows the zone) and the walker tracked before the save keeps its id after it
(the reload swaps the zones in between two frames, tracks kept), entering the new zone under that id;
the `enter` event is on the events page with its snapshot; the event's clip plays in the browser.

The walker (the astronaut's face, scripts/make_tracking_video.py) goes from the left to the right of
the picture and back every 8 s, on a loop: one track for the whole test."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver

from agent.config_loader import load_config
from agent.web.passwords import hash_password
from scripts import make_tracking_video
from tests import browser as browser_fixtures
from tests.agent_process import StartAgent, read_status
from tests.browser import (
    console_errors,
    draw_polygon,
    screenshot,
    video_plays,
    wait_element,
    wait_js,
    wait_rendered_change,
)
from tests.mosquitto import Mosquitto, Subscriber
from tests.waits import free_port, wait_until

browser = browser_fixtures.browser

DEVICE, PIPELINE = "door-cam", "door"
USER, PASSWORD = "admin", "correct horse battery staple"
WIDTH, HEIGHT, FPS, PERIOD_S = 640, 480, 10, 8.0
# Left to right and back along the middle, on a loop: one track for the whole test.
WALK = {"walker": [(0.0, 110.0, 240.0), (PERIOD_S / 2, 530.0, 240.0), (PERIOD_S, 110.0, 240.0)]}
# The zone drawn: the right part of the frame, which the walker's box bottom passes.
ZONE = [(0.62, 0.2), (0.95, 0.2), (0.95, 0.95), (0.62, 0.95)]
IMAGES = Path(__file__).resolve().parents[1] / "docs" / "img"


def keep(shot: Path) -> None:
    """EDGE_AGENT_UPDATE_SCREENSHOTS=1: the test's screenshot replaces the one docs/web.md shows."""
    if os.environ.get("EDGE_AGENT_UPDATE_SCREENSHOTS") == "1":
        (IMAGES / shot.name).write_bytes(shot.read_bytes())


CONFIG = """\
# The door camera of the web pages' end-to-end test.
# Comments like these must survive the editor's save.
device:
  id: {device}   # the box's name
state_dir: {state}
mqtt:
  host: 127.0.0.1
  port: {mqtt_port}
backends: {{benchmark: false, min_time_s: 0.0}}
telemetry: {{interval_s: 0}}
web:
  enabled: true
  port: {web_port}
  users:
    - name: {user}
      password_hash: "{hash}"
pipelines:
  - name: {pipeline}
    model: {{path: {model}}}
    source: {{type: video, uri: {video}, loop: true}}   # plays at its own 10 fps, again and again
    preprocess: {{resize: {{width: 320, height: 320, mode: letterbox}}, color: rgb}}
    postprocess: {{type: detection, score_threshold: 0.1, labels: {labels}}}
    report: {{results: false}}   # events only
    track:
      max_lost_s: 2.0
      snapshots: {{enabled: true, interval_s: 0.5}}
    clips: {{enabled: true, pre_s: 1.0, post_s: 1.0, max_s: 5.0}}
    lines:
      - name: middle   # a line, so that tracking is on before any zone exists
        points: [[0.5, 0.0], [0.5, 1.0]]
"""


@pytest.fixture(scope="module")
def walker_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("e2e") / "walker.avi"
    make_tracking_video.render(path, make_tracking_video.Clip(WALK, PERIOD_S, WIDTH, HEIGHT, FPS))
    return path


@pytest.fixture
def events(mosquitto: Mosquitto) -> Iterator[Subscriber]:
    subscriber = Subscriber(mosquitto.host, mosquitto.port, f"edge/{DEVICE}/events/{PIPELINE}")
    yield subscriber
    subscriber.close()


def received(subscriber: Subscriber) -> list[dict[str, Any]]:
    by_id = {e["id"]: e for e in (json.loads(m.payload) for m in subscriber.messages)}
    return sorted(by_id.values(), key=lambda e: int(e["seq"]))


@pytest.mark.slow  # a real daemon with a model, and Chromium
def test_a_person_logs_in_draws_a_zone_and_sees_its_event_with_snapshot_and_clip(
    tmp_path: Path,
    mosquitto: Mosquitto,
    walker_clip: Path,
    yolo_path: Path,
    yolo_labels: list[str],
    start_agent: StartAgent,
    events: Subscriber,
    browser: WebDriver,
) -> None:
    web_port = free_port()
    base = f"http://127.0.0.1:{web_port}"
    config = tmp_path / "agent.yaml"
    text = CONFIG.format(
        device=DEVICE, state=tmp_path / "state", mqtt_port=mosquitto.port, web_port=web_port,
        user=USER, hash=hash_password(PASSWORD), pipeline=PIPELINE, model=yolo_path, video=walker_clip,
        labels=json.dumps(yolo_labels),
    )  # fmt: skip
    config.write_text(text)
    agent = start_agent(config)

    def log() -> str:
        return "; agent log:\n" + agent.log()[-4000:]

    wait_until(lambda: any(e["type"] == "new" for e in received(events)) or agent.poll() is not None,
               "the walker's track", timeout=180, state=log)  # fmt: skip
    assert agent.poll() is None, log()
    (walker,) = {e["object"]["id"] for e in received(events) if e["type"] == "new"}

    # Log in: every page asks for it first.
    browser.get(f"{base}/zones/{PIPELINE}")
    wait_element(browser, "form.login input[name=user]").send_keys(USER)
    browser.find_element(By.CSS_SELECTOR, "form.login input[name=password]").send_keys(PASSWORD)
    browser.find_element(By.CSS_SELECTOR, "form.login button[type=submit]").click()
    wait_element(browser, f'tr[data-pipeline="{PIPELINE}"]', timeout=15)  # the box page

    # The live view's picture changes by itself (the walker moves, the page polls), with its age and
    # the pipeline's frame rate beside it, at the frame's own size, without a reload.
    browser.get(f"{base}/live/{PIPELINE}")
    figure = f'figure.live[data-pipeline="{PIPELINE}"]'
    live = wait_element(browser, f"{figure} canvas", timeout=20)
    browser.execute_script("window.notReloaded = true;")
    wait_js(browser, f"return Number(document.querySelector('{figure}').getAttribute('data-seq')) > 0",
            "a first live picture", timeout=30)  # fmt: skip
    wait_rendered_change(live, "the live picture to change on screen", timeout=30)
    caption = f"document.querySelector('{figure} figcaption').textContent"
    wait_js(browser, f"return /frame [0-9.]+ s old/.test({caption})", "the picture's age beside it")
    wait_js(browser, f"return /pipeline [0-9.]+ fps/.test({caption})", "the pipeline's frame rate beside it")
    assert browser.execute_script("return [arguments[0].width, arguments[0].height];", live) == [
        WIDTH,
        HEIGHT,
    ]
    assert browser.execute_script("return window.notReloaded === true;")
    assert console_errors(browser) == []
    keep(screenshot(browser, tmp_path / "web-live.png"))

    # The models page: where the detector serves and why, and the store.
    browser.get(f"{base}/models")
    section = wait_element(browser, f'section.explained[data-pipeline="{PIPELINE}"]')
    assert "serving now on" in section.text and "320n.onnx" in section.text
    assert "320n.onnx" in wait_element(browser, "table.store").text
    assert console_errors(browser) == []
    keep(screenshot(browser, tmp_path / "web-models.png"))

    # Draw the zone with the mouse on the pipeline's frame, name it, save.
    browser.get(f"{base}/zones/{PIPELINE}")
    frame = wait_element(browser, "#zone-frame", timeout=20)
    wait_js(browser, "return arguments[0].naturalWidth > 0", "the pipeline's frame", frame, timeout=20)
    browser.find_element(By.CSS_SELECTOR, 'button.zone-draw[data-kind="zones"]').click()
    svg = browser.find_element(By.ID, "zone-svg")
    browser.execute_script("arguments[0].scrollIntoView({block: 'end'})", svg)
    width, height = svg.rect["width"], svg.rect["height"]
    corners = [(x * width, y * height) for x, y in ZONE]
    # The last corner drawn short, then dragged to its place.
    short = (corners[3][0], corners[3][1] - 0.2 * height)
    draw_polygon(browser, svg, [*corners[:3], short, corners[0]], close=None)  # closed on its first point
    cx, cy = width / 2, height / 2
    ActionChains(browser, duration=0).move_to_element_with_offset(
        svg, round(short[0] - cx), round(short[1] - cy)
    ).click_and_hold().move_by_offset(0, round(corners[3][1] - short[1])).release().perform()
    name = wait_element(browser, '#zone-table tr[data-shape="zones/0"] input[aria-label="name"]')
    name.send_keys(Keys.CONTROL, "a")
    name.send_keys("counter", Keys.TAB)
    browser.find_element(By.ID, "zone-save").click()
    wait_js(browser, "return document.getElementById('zone-status').textContent.includes('applied')",
            "the page to say the zone was saved and applied", timeout=60)  # fmt: skip
    points = browser.find_element(By.CSS_SELECTOR, '#zone-table tr[data-shape="zones/0"] td.points').text
    assert points.count("[") == 4, points  # four corners, in fractions
    assert console_errors(browser) == []
    browser.execute_script("window.scrollTo(0, 0)")
    keep(screenshot(browser, tmp_path / "web-zones.png"))

    # The file holds it, in fractions within a pixel of where the mouse went, its comments kept.
    saved = config.read_text()
    assert saved.startswith(text.split("  - name: door")[0])  # everything above the pipeline as it was
    assert "loop: true}   # plays at its own 10 fps, again and again\n" in saved
    assert "      - name: middle   # a line, so that tracking is on before any zone exists\n" in saved
    (zone,) = load_config(config).pipelines[0].zones
    assert zone.name == "counter" and zone.units == "fraction"
    assert all(abs(a - b) <= 2 / min(width, height) for p, q in zip(zone.points, ZONE, strict=True)
               for a, b in zip(p, q, strict=True)), zone.points  # fmt: skip

    # The daemon applied it: its status shows the zone, and the walker enters it under its old id.
    def zones() -> dict[str, Any]:
        shown: dict[str, Any] = read_status(tmp_path / "state")["pipelines"][PIPELINE]["tracking"]["zones"]
        return shown

    wait_until(lambda: "counter" in zones(), "the status to show the zone", timeout=30, state=log)
    wait_until(lambda: any(e["type"] == "enter" and e.get("zone") == "counter" for e in received(events)),
               "the walker to enter the new zone", timeout=30, state=log)  # fmt: skip
    enter = next(e for e in received(events) if e["type"] == "enter")
    assert enter["object"]["id"] == walker
    assert not [e for e in received(events) if e["type"] == "end"], "a track ended: tracks were not kept"
    assert f"web: {USER} saved zones/lines of pipeline door in {config}" in agent.log()

    # The events page shows the enter with its snapshot; its clip plays once it is finished.
    browser.get(f"{base}/events?pipeline={PIPELINE}&zone=counter&type=enter")
    row = wait_element(browser, "table.events tbody tr[data-event]", timeout=20)
    assert "counter" in row.text and f"#{walker}" in row.text, row.text
    thumb = row.find_element(By.CSS_SELECTOR, "img.thumb")
    wait_js(browser, "return arguments[0].complete && arguments[0].naturalWidth > 0",
            "the event's snapshot to load", thumb, timeout=20)  # fmt: skip
    assert enter["clip"], enter

    def clip_link() -> bool:  # 'recording' until the clip's file is complete (max_s 5 s at most)
        browser.refresh()
        first = wait_element(browser, "table.events tbody tr[data-event]", timeout=20)
        return bool(first.find_elements(By.CSS_SELECTOR, "a.clip"))

    wait_until(clip_link, "the clip to be finished and linked", timeout=40, interval=1.0, state=log)
    browser.find_element(By.CSS_SELECTOR, "table.events tbody tr[data-event] a.clip").click()
    played = video_plays(browser, wait_element(browser, "video#clip", timeout=20))
    assert played["duration"] > 0, played
    assert console_errors(browser) == []
    agent.stop()
