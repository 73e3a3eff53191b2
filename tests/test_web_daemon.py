"""The web page in a real daemon (`edge-agent run`, a real mosquitto, a real model on a rendered
video): the box page and /api/status show what `edge-agent status` shows, over real HTTP."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from selenium.webdriver.remote.webdriver import WebDriver

from tests import browser as browser_fixtures
from tests.agent_process import StartAgent, read_status
from tests.browser import console_errors, screenshot, wait_element, wait_js
from tests.daemon_fixtures import DEVICE, pipeline, write_config
from tests.mosquitto import Mosquitto
from tests.waits import free_port, wait_until

browser = browser_fixtures.browser
# EDGE_AGENT_UPDATE_SCREENSHOTS=1: the test's screenshot replaces the one docs/web.md shows.
SCREENSHOT = Path(__file__).resolve().parents[1] / "docs" / "img" / "web-box.png"


def api_status(base: str) -> dict[str, Any]:
    try:
        answer = httpx.get(f"{base}/api/status", timeout=5)
    except httpx.TransportError:
        return {}
    data: dict[str, Any] = answer.json() if answer.status_code == 200 else {}
    return data


def test_the_box_page_shows_a_running_daemons_status(
    tmp_path: Path,
    mosquitto: Mosquitto,
    registry_dir: Path,
    video: tuple[Path, list[dict[str, Any]]],
    start_agent: StartAgent,
    browser: WebDriver,
) -> None:
    config = write_config(
        tmp_path, mosquitto.port, registry_dir, [pipeline("signs", str(video[0]), loop=True)]
    )
    port = free_port()
    data = yaml.safe_load(config.read_text())
    data["web"] = {"enabled": True, "port": port}
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    base = f"http://127.0.0.1:{port}"

    agent = start_agent(config)

    def running() -> bool:
        return api_status(base).get("pipelines", {}).get("signs", {}).get("state") == "running"

    wait_until(lambda: running() or agent.poll() is not None, "the page says the pipeline runs", timeout=120,
               state=lambda: "; agent log:\n" + agent.log()[-3000:])  # fmt: skip
    assert agent.poll() is None, agent.log()[-3000:]
    status = api_status(base)
    assert status["device"] == DEVICE
    assert status["pipelines"].keys() == read_status(tmp_path / "state")["pipelines"].keys()
    page = httpx.get(f"{base}/", timeout=5)
    assert page.status_code == 200
    assert 'data-pipeline="signs"' in page.text and ">running<" in page.text
    assert "broker: <span" in page.text and "connected" in page.text
    part = httpx.get(f"{base}/box/status", timeout=5, cookies=page.cookies)
    assert part.status_code == 200 and 'data-pipeline="signs"' in part.text
    assert httpx.get(f"{base}/static/refresh.js", timeout=5).status_code == 200

    # In Chromium: the page refreshes its counts by itself, without a reload, within the CSP.
    browser.get(f"{base}/")
    cell = 'tr[data-pipeline="signs"] td:nth-child(7)'  # results
    first = int(wait_element(browser, cell).text)
    browser.execute_script("window.notReloaded = true;")
    wait_js(browser, f"return Number(document.querySelector('{cell}').textContent) > {first}",
            "the results count to go up on the page", timeout=30)  # fmt: skip
    assert browser.execute_script("return window.notReloaded === true;")
    assert console_errors(browser) == []
    shot = screenshot(browser, tmp_path / "web-box.png")
    if os.environ.get("EDGE_AGENT_UPDATE_SCREENSHOTS") == "1":
        SCREENSHOT.parent.mkdir(exist_ok=True)
        SCREENSHOT.write_bytes(shot.read_bytes())

    log = agent.stop()
    assert f"web page on http://127.0.0.1:{port}/" in log
    with pytest.raises(httpx.TransportError):  # stopped with the daemon
        httpx.get(f"{base}/", timeout=2)


def test_a_daemon_told_to_serve_on_0000_without_tls_or_users_does_not_start(
    tmp_path: Path, start_agent: StartAgent
) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(
        f"device: {{id: box}}\nstate_dir: {tmp_path / 'state'}\nweb:\n  enabled: true\n  listen: 0.0.0.0\n"
    )
    log = start_agent(config).finish(timeout=60, exit_codes=(1,))
    assert f"{config}:3: web: listen '0.0.0.0' is off the loopback" in log
    assert "without tls and users" in log


def test_a_page_that_cannot_start_leaves_the_pipelines_running(
    tmp_path: Path,
    mosquitto: Mosquitto,
    registry_dir: Path,
    video: tuple[Path, list[dict[str, Any]]],
    start_agent: StartAgent,
) -> None:
    config = write_config(
        tmp_path, mosquitto.port, registry_dir, [pipeline("signs", str(video[0]), loop=True)]
    )
    with socket.socket() as taken:  # another program holds the page's port
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        data = yaml.safe_load(config.read_text())
        data["web"] = {"enabled": True, "port": taken.getsockname()[1]}
        config.write_text(yaml.safe_dump(data, sort_keys=False))
        agent = start_agent(config)
        log = agent.run_until(
            lambda: (
                read_status(tmp_path / "state").get("pipelines", {}).get("signs", {}).get("state")
                == "running"
            ),
            "the pipeline to run without its page",
        )
    assert "ERROR" in log and "the web page is off: web: 127.0.0.1:" in log and "cannot listen" in log
