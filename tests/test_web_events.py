"""The events page (agent/web/events.py) through Starlette's TestClient on the real app
(agent/web/app.py WebApp): a real events index fed by real events (a Scene's walk through a zone and
over a line, tests/test_event_index.py), the real snapshots they name, and a real H.264 clip made by
agent/clips.py's recorder from the walk's frames. Filters, escaping, HTTP Range, traversal, logins."""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.remote.webdriver import WebDriver
from starlette.testclient import TestClient

from agent.clips import ClipRecorder
from agent.config.clips import ClipsConfig
from agent.config.web import WebConfig, WebUser
from agent.config_loader import load_config
from agent.daemon import Agent
from agent.event_index import EventIndex
from agent.web.app import WebApp
from agent.web.events import REFRESH_S, EventsPages, events_pages
from agent.web.passwords import hash_password
from agent.web.server import WebServer
from agent.web.site import pages_of
from tests import browser as browser_fixtures
from tests.browser import console_errors, screenshot, video_plays, wait_element, wait_js
from tests.test_event_index import Box, open_box, walk

# tests/test_web_security.py's spellings of a name that leads out of its directory.
UNSAFE = [
    "..",
    ".",
    "..%2f..%2fagent.yaml",
    "%2e%2e%2fagent.yaml",
    "%2e%2e",
    "..%5cagent.yaml",
    "snap.jpg%00.txt",
    "%2fetc%2fpasswd",
    ".hidden",
    "..%c0%af",
    "%E2%80%A4%E2%80%A4",  # one-dot leaders that look like ..
]
HOSTILE = '<img src=x onerror="alert(1)">'


@dataclass
class Site:
    box: Box
    state_dir: Path
    clip: str  # the walk's clip, complete on disk
    status: dict[str, Any]  # what the daemon's status says (a test sets a clip as recording)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    state_dir = tmp_path_factory.mktemp("state")
    box_ = open_box(state_dir)
    recorder = ClipRecorder(
        "door", state_dir / "clips" / "door", ClipsConfig(enabled=True, pre_s=0, post_s=0)
    )
    assert recorder.problem is None, recorder.problem
    walk(box_, recorder=recorder)
    recorder.stop()  # the clip finished: its file complete
    (clip,) = {r.clip for r in box_.index.query(limit=500)}
    assert clip is not None and (state_dir / "clips" / "door" / f"{clip}.mp4").is_file(), recorder.status()
    yield Site(box_, state_dir, clip, {"pipelines": {}})
    box_.index.close()
    box_.outbox.close()


def app_of(site: Site, index: EventIndex | None = None, **web: Any) -> WebApp:
    web_app = WebApp(WebConfig(enabled=True, **web), lambda: site.status, "box-1")
    EventsPages(site.box.index if index is None else index, site.state_dir).add(web_app)
    return web_app


@pytest.fixture
def client(site: Site) -> Iterator[TestClient]:
    with TestClient(app_of(site).app, base_url="http://127.0.0.1") as test_client:
        yield test_client


def shown(html: str) -> list[int]:
    """The events a page lists, by their index ids, in order."""
    return [int(i) for i in re.findall(r'<tr data-event="(\d+)"', html)]


def test_the_page_lists_events_newest_first_with_their_snapshot_and_clip(
    site: Site, client: TestClient
) -> None:
    page = client.get("/events")
    assert page.status_code == 200
    rows = site.box.index.query(limit=50)
    assert shown(page.text) == [r.id for r in rows]
    assert '<a href="/events">Events</a>' in page.text  # the header's link
    assert '<script src="/static/events.js"></script>' in page.text
    cross = next(r for r in rows if r.type == "cross")
    html = page.text.split(f'<tr data-event="{cross.id}">', 1)[1].split("</tr>", 1)[0]
    assert (
        "gate east" in html and f"person #{cross.track}" in html and cross.at.replace("T", " ")[:19] in html
    )
    assert f'src="/snapshots/door/{cross.snapshot}"' in html
    assert f'href="/clips/door/{site.clip}/view">play</a>' in html
    car_end = next(r for r in rows if r.type == "end" and r.label == "car")
    html = page.text.split(f'<tr data-event="{car_end.id}">', 1)[1].split("</tr>", 1)[0]
    assert "plate: <b>KX42 &lt;BRT&gt;</b> (0.97)" in html and "(stopped)" in html
    # The snapshot itself, and the clip's page.
    picture = client.get(f"/snapshots/door/{cross.snapshot}")
    assert picture.status_code == 200 and picture.headers["content-type"] == "image/jpeg"
    assert picture.content[:2] == b"\xff\xd8"
    view = client.get(f"/clips/door/{site.clip}/view")
    assert view.status_code == 200
    assert (
        f'<video id="clip" controls muted autoplay playsinline preload="auto" src="/clips/door/{site.clip}">'
        in view.text
    )


def test_filters_narrow_the_list_and_offer_what_the_index_holds(site: Site, client: TestClient) -> None:
    index = site.box.index
    for query, expected in [
        ("zone=counter", index.query(zone="counter")),
        ("line=gate", index.query(line="gate")),
        ("label=car", index.query(label="car")),
        ("type=cross&pipeline=door", index.query(type="cross", pipeline="door")),
    ]:
        page = client.get(f"/events?{query}")
        assert shown(page.text) == [r.id for r in expected] and expected, query
    # The choices come from the index; the chosen one stays selected (the filter is kept).
    page = client.get("/events?zone=counter")
    assert '<option value="counter" selected>counter</option>' in page.text
    assert (
        '<option value="gate">gate</option>' in page.text and '<option value="car">car</option>' in page.text
    )
    assert 'data-query="zone=counter"' in page.text
    # Time: from/to in UTC as a datetime-local input gives them.
    newest = index.query(limit=1)[0]
    after = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(newest.t + 60))
    assert "No events match these filters." in client.get(f"/events?from={after}").text
    assert shown(client.get(f"/events?to={after}").text) == [r.id for r in index.query(limit=50)]
    bad = client.get("/events?from=yesterday&before=x1")
    assert bad.status_code == 200
    assert "from: &#x27;yesterday&#x27; is not a time" in bad.text and "is not an event number" in bad.text


@contextlib.contextmanager
def own_index(site: Site, name: str) -> Iterator[tuple[EventIndex, TestClient]]:
    """A page on an index of its own (the walk's stays as it is for the other tests)."""
    index = EventIndex(site.state_dir / f"{name}.db")
    try:
        with TestClient(app_of(site, index).app, base_url="http://127.0.0.1") as test_client:
            yield index, test_client
    finally:
        index.close()


def test_older_events_are_a_page_further(site: Site) -> None:
    start = time.time() - 3600
    with own_index(site, "paging") as (index, client):
        for i in range(60):  # more than a page of them
            index.add([{"pipeline": "lot", "seq": i, "type": "cross", "at": _iso(start + i), "line": "bar"}])
        first = client.get("/events?pipeline=lot")
        ids = shown(first.text)
        assert ids == [r.id for r in index.query(limit=50)] and 'data-live="1"' in first.text
        older = re.search(r'href="(/events\?pipeline=lot&amp;before=\d+)">Older events', first.text)
        assert older is not None
        second = client.get(older.group(1).replace("&amp;", "&"))
        assert shown(second.text) == [r.id for r in index.query(before=ids[-1])]
        assert len(shown(second.text)) == 10
        assert 'data-live="0"' in second.text  # an older page is not refreshed


def test_a_hostile_label_zone_and_attribute_are_escaped(site: Site) -> None:
    index = EventIndex(site.state_dir / "hostile.db")
    index.add([{
        "pipeline": "door", "seq": 1, "type": "enter", "at": _iso(time.time()), "zone": HOSTILE,
        "object": {"id": 1, "label": HOSTILE, "attributes": {HOSTILE: {"value": HOSTILE, "score": 0.5}}},
    }])  # fmt: skip
    with TestClient(app_of(site, index).app, base_url="http://127.0.0.1") as test_client:
        for url in ("/events", f"/events?label={HOSTILE}", "/events/list"):
            page = test_client.get(url)
            assert page.status_code == 200 and "<img src=x" not in page.text, url
            assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page.text, url
    index.close()


def test_clips_answer_range_requests_with_206(site: Site, client: TestClient) -> None:
    whole = client.get(f"/clips/door/{site.clip}")
    assert whole.status_code == 200 and whole.headers["content-type"] == "video/mp4"
    assert whole.content[4:8] == b"ftyp" and whole.headers["accept-ranges"] == "bytes"
    size = len(whole.content)
    part = client.get(f"/clips/door/{site.clip}", headers={"Range": "bytes=100-199"})
    assert part.status_code == 206
    assert part.headers["content-range"] == f"bytes 100-199/{size}"
    assert part.content == whole.content[100:200]
    tail = client.get(f"/clips/door/{site.clip}", headers={"Range": f"bytes={size - 10}-"})
    assert tail.status_code == 206 and tail.content == whole.content[-10:]


@pytest.mark.parametrize("name", UNSAFE)
def test_traversal_is_refused(site: Site, client: TestClient, name: str) -> None:
    (site.state_dir / "agent.yaml").write_text("secret: yes\n")
    for url in (
        f"/snapshots/door/{name}",
        f"/snapshots/{name}/x",
        f"/clips/door/{name}",
        f"/clips/{name}/{site.clip}",
        f"/clips/door/{name}/view",
    ):
        answer = client.get(url)
        assert answer.status_code == 404, url
        assert b"secret" not in answer.content


def test_a_link_out_of_the_clips_is_refused(site: Site, client: TestClient) -> None:
    outside = site.state_dir / "outside.mp4"
    outside.write_bytes(b"not yours")
    fake = "20261129T000000Z-00000000"
    os.symlink(outside, site.state_dir / "clips" / "door" / f"{fake}.mp4")
    try:
        assert client.get(f"/clips/door/{fake}").status_code == 404
    finally:
        (site.state_dir / "clips" / "door" / f"{fake}.mp4").unlink()


def test_a_snapshot_the_retention_removed_is_said_not_kept(site: Site) -> None:
    with own_index(site, "snapshots") as (index, client):
        kept = site.box.index.query(type="cross", limit=1)[0].snapshot
        for seq, snapshot in enumerate((kept, "5-0123456789")):  # the second: no such file (any more)
            obj = {"id": 5 + seq, "label": "person", "snapshot": snapshot}
            index.add(
                [{"pipeline": "door", "seq": seq, "type": "new", "at": _iso(time.time()), "object": obj}]
            )
        page = client.get("/events").text
        assert page.count('class="thumb"') == 1 and f'src="/snapshots/door/{kept}"' in page
        assert page.count('<td class="pic"><span class="none">not kept</span></td>') == 1


def test_a_clip_being_recorded_says_so(site: Site, client: TestClient) -> None:
    clips = site.state_dir / "clips" / "door"
    finishing, open_, gone = (f"20261129T0{i}0000Z-0000000{i}" for i in (1, 2, 3))
    (clips / f"{finishing}.mp4.tmp-1a2b3c4d").write_bytes(b"")  # ffmpeg finishing it (agent/clips.py)
    running = {"state": "running", "model": "faces@1", "steps": {"clips": {"recording": open_}}}
    site.status = {"pipelines": {"door": running}}  # as the daemon's status has it
    index = EventIndex(site.state_dir / "recording.db")
    now = time.time()
    for seq, clip in enumerate((finishing, open_, gone, site.clip)):
        index.add(
            [
                {
                    "pipeline": "door",
                    "seq": seq,
                    "type": "new",
                    "at": _iso(now),
                    "clip": clip,
                    "object": {"id": seq},
                }
            ]
        )
    try:
        with TestClient(app_of(site, index).app, base_url="http://127.0.0.1") as test_client:
            page = test_client.get("/events").text
            assert page.count('<span class="recording">recording</span>') == 2
            assert page.count('<span class="none">not kept</span>') == 1
            assert page.count(">play</a>") == 1
            view = test_client.get(f"/clips/door/{open_}/view")
            assert (
                view.status_code == 200 and "still being recorded" in view.text and "<video" not in view.text
            )
            assert test_client.get(f"/clips/door/{open_}").status_code == 404  # no half file served
    finally:
        site.status = {"pipelines": {}}
        (clips / f"{finishing}.mp4.tmp-1a2b3c4d").unlink()
        index.close()


def test_the_list_refreshes_only_when_it_changed(site: Site) -> None:
    with own_index(site, "refresh") as (index, client):
        index.add([{"pipeline": "door", "seq": 1, "type": "cross", "at": _iso(time.time()), "line": "gate"}])
        page = client.get("/events?pipeline=door")
        version = re.search(r'data-version="([0-9a-f]+)"', page.text)
        assert version is not None
        assert client.get(f"/events/list?pipeline=door&known={version.group(1)}").status_code == 204
        index.add([{"pipeline": "door", "seq": 2, "type": "cross", "at": _iso(time.time()), "line": "gate"}])
        fresh = client.get(f"/events/list?pipeline=door&known={version.group(1)}")
        assert fresh.status_code == 200 and fresh.headers["x-events-version"] != version.group(1)
        assert shown(fresh.text) == [r.id for r in index.query()] and len(shown(fresh.text)) == 2


def test_with_users_nothing_is_served_without_a_login(site: Site) -> None:
    users = [WebUser(name="admin", password_hash=hash_password("pw"))]
    with TestClient(app_of(site, users=users).app, base_url="http://127.0.0.1") as test_client:
        snapshot = site.box.index.query(limit=1, type="cross")[0].snapshot
        for url in (
            "/events",
            f"/snapshots/door/{snapshot}",
            f"/clips/door/{site.clip}",
            f"/clips/door/{site.clip}/view",
        ):
            answer = test_client.get(url, follow_redirects=False)
            assert (answer.status_code, answer.headers.get("location")) == (303, "/login"), url
        assert test_client.get("/events/list").status_code == 401


def test_no_index_or_an_unreadable_one_is_said_on_the_page(site: Site, tmp_path: Path) -> None:
    web_app = WebApp(WebConfig(enabled=True), lambda: site.status, "box-1")
    EventsPages(None, tmp_path).add(web_app)
    with TestClient(web_app.app, base_url="http://127.0.0.1") as test_client:
        assert "keeps no events index" in test_client.get("/events").text
    (tmp_path / "events.db").mkdir()
    broken = EventIndex(tmp_path / "events.db")
    with TestClient(app_of(site, broken).app, base_url="http://127.0.0.1") as test_client:
        page = test_client.get("/events")
        assert page.status_code == 200 and "The events index cannot be read: cannot open" in page.text


def _iso(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(at))


# --- in Chromium ----------------------------------------------------------------------------------

browser = browser_fixtures.browser
# EDGE_AGENT_UPDATE_SCREENSHOTS=1: the test's screenshot replaces the one docs/web.md shows.
SCREENSHOT = Path(__file__).resolve().parents[1] / "docs" / "img" / "web-events.png"


def test_in_chromium_an_event_shows_its_snapshot_and_its_clip_plays(
    site: Site, browser: WebDriver, tmp_path: Path
) -> None:
    server = WebServer(WebConfig(enabled=True, port=0), lambda: site.status, "box-1",
                       pages=[events_pages(site.box.index, site.state_dir)])  # fmt: skip
    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        browser.get(f"{base}/events?pipeline=door")
        cross = site.box.index.query(type="cross", pipeline="door", limit=1)[0]
        thumb = f'tr[data-event="{cross.id}"] img.thumb'
        wait_element(browser, thumb)
        loaded = f"const i = document.querySelector('{thumb}'); return i.complete && i.naturalWidth > 0"
        wait_js(browser, loaded, "the cross event's snapshot to load")
        assert console_errors(browser) == []
        shot = screenshot(browser, tmp_path / "web-events.png")
        if os.environ.get("EDGE_AGENT_UPDATE_SCREENSHOTS") == "1":
            SCREENSHOT.write_bytes(shot.read_bytes())
        # The list refreshes itself, without a reload, when an event comes.
        browser.execute_script("window.notReloaded = true;")
        came = {"pipeline": "door", "seq": 1000, "type": "cross", "at": _iso(time.time()), "line": "gate"}
        site.box.index.add([{**came, "direction": "west", "object": {"id": 99, "label": "person"}}])
        newest = site.box.index.newest()
        wait_element(browser, f'tr[data-event="{newest}"]', timeout=3 * REFRESH_S)
        assert browser.execute_script("return window.notReloaded === true;")
        wait_element(browser, f'tr[data-event="{cross.id}"] a.clip').click()
        state = video_plays(browser, wait_element(browser, "video#clip"))
        assert state["duration"] > 0 and state["currentTime"] > 0
        assert console_errors(browser) == []
    finally:
        server.stop()


def test_the_daemon_feeds_its_index_and_hands_it_to_the_events_page(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(
        f"device: {{id: box-1}}\nstate_dir: {tmp_path / 'state'}\nweb: {{enabled: true, port: 0}}\n"
    )
    agent = Agent(load_config(config))
    try:
        cross = {"type": "cross", "at": _iso(time.time()), "line": "door", "direction": "in", "count": 1}
        agent.writer.write_events("shop", [{**cross, "object": {"id": 7, "label": "person"}}])
        assert agent.outbox.pending() == 1 and (tmp_path / "state" / "events.db").is_file()
        web_app = WebApp(agent.config.web, lambda: {"pipelines": {}}, "box-1")
        for add in pages_of(agent._site()):
            add(web_app)
        with TestClient(web_app.app, base_url="http://127.0.0.1") as test_client:
            page = test_client.get("/events")
            assert page.status_code == 200 and "door in" in page.text and "person #7" in page.text
    finally:
        agent.event_index.close()
        agent.outbox.close()
        agent.instance_lock.release()
