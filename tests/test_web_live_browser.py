"""The live view and models pages in headless Chromium against a real daemon (`edge-agent run` with the
page on, a real mosquitto, the real YOLOv8n face detector on the rendered clip of the astronaut's face
crossing the frame, looped): the live picture changes on screen without a reload, with its age and
the pipeline's frame rate beside it; the models page says where the detector serves and why. Each
page's screenshot goes into docs/web.md (EDGE_AGENT_UPDATE_SCREENSHOTS=1 rewrites them)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from selenium.webdriver.remote.webdriver import WebDriver

from tests import browser as browser_fixtures
from tests import media_fixtures
from tests.agent_process import StartAgent
from tests.browser import console_errors, screenshot, wait_element, wait_js, wait_rendered_change
from tests.face_clip import faces_pipeline, write_clip
from tests.mosquitto import Mosquitto
from tests.waits import free_port, wait_until

browser = browser_fixtures.browser
yolo_path = media_fixtures.yolo_path
yolo_labels = media_fixtures.yolo_labels
IMAGES = Path(__file__).resolve().parents[1] / "docs" / "img"


def keep(shot: Path, name: str) -> None:
    """EDGE_AGENT_UPDATE_SCREENSHOTS=1: the test's screenshot replaces the one docs/web.md shows."""
    if os.environ.get("EDGE_AGENT_UPDATE_SCREENSHOTS") == "1":
        IMAGES.mkdir(exist_ok=True)
        (IMAGES / name).write_bytes(shot.read_bytes())


def api_status(base: str) -> dict[str, Any]:
    try:
        answer = httpx.get(f"{base}/api/status", timeout=5)
    except httpx.TransportError:
        return {}
    data: dict[str, Any] = answer.json() if answer.status_code == 200 else {}
    return data


@pytest.mark.slow
def test_the_live_picture_changes_on_screen_and_the_models_page_says_why(
    tmp_path: Path,
    mosquitto: Mosquitto,
    yolo_path: Path,
    yolo_labels: list[str],
    start_agent: StartAgent,
    browser: WebDriver,
) -> None:
    clip = write_clip(tmp_path / "clip.mp4")  # 3 s of the face crossing, 1.5 s without it
    port = free_port()
    settings = {
        "device": {"id": "live-box"},
        "state_dir": str(tmp_path / "state"),
        "mqtt": {"host": mosquitto.host, "port": mosquitto.port, "reconnect_min_s": 0.2},
        "backends": {"benchmark": False, "min_time_s": 0.0},
        "web": {"enabled": True, "port": port},
        "pipelines": [
            faces_pipeline(yolo_path, yolo_labels, {"type": "video", "uri": str(clip), "loop": True})
        ],
    }
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    base = f"http://127.0.0.1:{port}"
    agent = start_agent(config)

    def running() -> bool:
        return api_status(base).get("pipelines", {}).get("faces", {}).get("state") == "running"

    wait_until(lambda: running() or agent.poll() is not None, "the pipeline to run", timeout=120,
               state=lambda: "; agent log:\n" + agent.log()[-3000:])  # fmt: skip
    assert agent.poll() is None, agent.log()[-3000:]

    # The live page: the picture is painted, then changes on screen, with its age and the fps beside it.
    browser.get(f"{base}/live")
    figure = 'figure.live[data-pipeline="faces"]'
    canvas = wait_element(browser, f"{figure} canvas")
    browser.execute_script("window.notReloaded = true;")
    wait_js(browser, f"return Number(document.querySelector('{figure}').getAttribute('data-seq')) > 0",
            "a first live picture", timeout=30)  # fmt: skip
    wait_rendered_change(canvas, "the live picture to change on screen", timeout=30)
    caption = f"document.querySelector('{figure} figcaption').textContent"
    wait_js(browser, f"return /frame [0-9.]+ s old/.test({caption})", "the picture's age beside it")
    wait_js(browser, f"return /pipeline [0-9.]+ fps/.test({caption})", "the pipeline's frame rate beside it")
    size = browser.execute_script(
        f"var c = document.querySelector('{figure} canvas'); return [c.width, c.height];"
    )
    assert size == [480, 320]  # the frame's own size
    assert browser.execute_script("return window.notReloaded === true;")
    assert console_errors(browser) == []
    # A picture with the face's box on it for the docs (the face crosses in 3 s of each 4.5).
    wait_js(browser, f"return Number(document.querySelector('{figure}').getAttribute('data-seq')) > 2",
            "a few pictures", timeout=30)  # fmt: skip
    keep(screenshot(browser, tmp_path / "web-live.png"), "web-live.png")

    # The models page: where the detector serves and why, and the store.
    browser.get(f"{base}/models")
    section = wait_element(browser, 'section.explained[data-pipeline="faces"]')
    assert "serving now on" in section.text and "320n.onnx" in section.text
    assert "320n.onnx" in wait_element(browser, "table.store").text
    assert console_errors(browser) == []
    keep(screenshot(browser, tmp_path / "web-models.png"), "web-models.png")
    agent.stop()
