"""Attacks on the pages issue 37 added (docs/reliability.md, "The web page: attacks tried"): the live
view, the events with their snapshots and clips, the models page and the zone editor, over real HTTP on
loopback against a real daemon (agent/daemon.py `Agent`, in this process): the real YOLOv8n face
detector (nudenet's 320n.onnx) tracking the rendered face across its clip on a loop, with snapshots
and clips, a real mosquitto, and the page with a user. Beside it, the same daemon's pages served
without users (the open loopback page, `pages_of` its Site) for the attacks that page invites.

Each attack asserts its refusal: no session, no data; no CSRF token, no edit (the file byte for byte
as it was); a hostile name written back safely or refused; traversal and odd names 404 with nothing
outside the roots read; DNS rebinding 403; a crowd of long polls bounded; HTML in what the pages show
escaped."""

from __future__ import annotations

import contextlib
import html
import http.client
import json
import re
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.config.web import WebConfig
from agent.config_loader import load_config
from agent.daemon import Agent
from agent.reload import LoadedConfig
from agent.web.passwords import hash_password
from agent.web.server import WebServer
from agent.web.site import pages_of
from tests.mosquitto import Mosquitto
from tests.test_pipeline_tracking import crossing_clip  # noqa: F401  (fixture)
from tests.test_web_editor import as_sent
from tests.waits import free_port, wait_until

PIPELINE = "door-cam-7"  # a name no login page or refusal would say by chance
USER, PASSWORD = "admin", "correct horse battery staple"
HOSTILE = '<img src=x onerror="alert(1)">'
# Labels the pages show and the editor writes back: the model's, some renamed (the face's, index 1,
# is HOSTILE: the tracked face's events carry it to the events page).
RENAMED = {
    0: "&anchor",
    1: HOSTILE,
    2: "!!python/object/apply:os.system ['touch PWNED']",
    3: "{",
    4: "a\nb: c",
    5: "x # not a comment",
    6: "*alias",
    7: "l" * 10_000,
}
SECRET = "top-secret-4711"  # in files beside the roots: no answer may hold it

CONFIG = """\
# The attacks' daemon: its comments must survive every refused edit.
device: {{id: attack-box}}   # the box
state_dir: {state}
mqtt: {{host: 127.0.0.1, port: {mqtt_port}}}
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
    model: {{path: "{model}"}}
    source: {{type: video, uri: {video}, loop: true}}
    preprocess: {{resize: {{width: 320, height: 320, mode: letterbox}}, color: rgb}}
    postprocess: {{type: detection, score_threshold: 0.1, labels: {labels}}}
    report: {{results: false}}
    track:
      max_lost_s: 1.0
      snapshots: {{enabled: true, interval_s: 0.5}}
    clips: {{enabled: true, pre_s: 0.0, post_s: 0.0, max_s: 5.0}}
    zones:
      - name: left   # by the door
        points: [[0.0, 0.0], [0.5, 0.0], [0.5, 1.0], [0.0, 1.0]]
  - name: broken   # its source is missing: its last error (naming the file) is on the box page
    model: {{path: "{model}"}}
    source: {{type: video, uri: "{missing}"}}
    preprocess: {{resize: {{width: 320, height: 320, mode: letterbox}}, color: rgb}}
    postprocess: {{type: detection, score_threshold: 0.1, labels: {labels}}}
"""


@dataclass
class Box:
    agent: Agent
    config: Path
    state_dir: Path
    base: str  # the daemon's page, with its user
    open_base: str  # the same daemon's pages without users (loopback only)


@pytest.fixture(scope="module")
def box(
    tmp_path_factory: pytest.TempPathFactory,
    crossing_clip: Path,  # noqa: F811
    yolo_path: Path,
    yolo_labels: list[str],
) -> Iterator[Box]:
    tmp = tmp_path_factory.mktemp("attacks")
    # The model's file name is shown on the models and box pages: HTML in it must stay text.
    model = tmp / f"{HOSTILE.replace('/', '')}.onnx"
    shutil.copyfile(yolo_path, model)
    state = tmp / "state"
    (tmp / "secret.txt").write_text(SECRET)  # beside the state dir
    state.mkdir()
    (state / "secret.jpg").write_text(SECRET)  # beside the snapshots' and clips' roots
    broker = Mosquitto(tmp / "mosquitto")
    broker.start()
    config = tmp / "agent.yaml"
    config.write_text(
        CONFIG.format(
            state=state,
            mqtt_port=broker.port,
            web_port=free_port(),
            user=USER,
            hash=hash_password(PASSWORD),
            pipeline=PIPELINE,
            model=str(model).replace('"', '\\"'),
            video=crossing_clip,
            missing=tmp / "<svg onload=alert(2)>.avi",
            labels=json.dumps([RENAMED.get(i, v) for i, v in enumerate(yolo_labels)]),
        )
    )
    agent = Agent(load_config(config), LoadedConfig(load_config(config), config, config.read_text()))
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,), name="attacked-daemon", daemon=True)
    runner.start()
    open_page = None
    try:
        assert agent.web is not None
        wait_until(lambda: agent.web is not None and agent.web.port is not None, "the daemon's page")
        wait_until(
            lambda: PIPELINE in {p.name for p in agent.supervisor.pipelines()},
            "the pipeline to run",
            timeout=60,
        )
        open_page = WebServer(
            WebConfig(enabled=True, port=0), agent.status, "attack-box", pages_of(agent._site())
        )
        open_page.start()
        yield Box(
            agent, config, state, f"http://127.0.0.1:{agent.web.port}", f"http://127.0.0.1:{open_page.port}"
        )
    finally:
        if open_page is not None:
            open_page.stop()
        stop.set()
        runner.join(60)
        broker.close()


@dataclass(frozen=True)
class Files:
    """A real snapshot and a real clip of the walk, named as the events page links them."""

    snapshot: str
    clip: str


@pytest.fixture(scope="module")
def files(box: Box) -> Files:
    index = box.agent.event_index
    clips = box.state_dir / "clips" / PIPELINE

    def found() -> Files | None:
        rows = index.query(limit=200)
        snaps = [
            r.snapshot
            for r in rows
            if r.snapshot and (box.state_dir / "snapshots" / PIPELINE / f"{r.snapshot}.jpg").is_file()
        ]
        done = [r.clip for r in rows if r.clip and (clips / f"{r.clip}.mp4").is_file()]
        return Files(snaps[0], done[0]) if snaps and done else None

    wait_until(found, "a snapshot and a finished clip of the walk", timeout=60)
    made = found()
    assert made is not None
    return made


def routes(files: Files) -> list[str]:
    """Every GET route the issue's pages added, with real names."""
    p = PIPELINE
    return [
        "/live",
        f"/live/{p}",
        f"/live/{p}/frame.jpg",
        "/events",
        "/events/list",
        f"/snapshots/{p}/{files.snapshot}",
        f"/clips/{p}/{files.clip}",
        f"/clips/{p}/{files.clip}/view",
        "/models",
        "/models/part",
        "/zones",
        f"/zones/{p}",
    ]


def client(base: str, **extra: Any) -> httpx.Client:
    return httpx.Client(base_url=base, follow_redirects=False, timeout=15, **extra)


def csrf_in(html: str) -> str:
    found = re.search(r'<meta name="csrf-token" content="([^"]+)">', html) or re.search(
        r'name="csrf" value="([^"]+)"', html
    )
    assert found is not None, html[:500]
    return found[1]


@contextlib.contextmanager
def logged_in(base: str) -> Iterator[httpx.Client]:
    with client(base) as browser:
        token = csrf_in(browser.get("/login").text)
        answer = browser.post("/login", data={"csrf": token, "user": USER, "password": PASSWORD})
        assert answer.status_code == 303, answer.text
        yield browser


def raw(
    base: str, method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b""
) -> tuple[int, bytes, dict[str, str]]:
    """A request whose path goes out as written (httpx would resolve `..` segments first)."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=15)
    try:
        conn.putrequest(method, path, skip_host="Host" in (headers or {}), skip_accept_encoding=True)
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        if body and "Transfer-Encoding" not in (headers or {}):
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body or None)
        answer = conn.getresponse()
        return answer.status, answer.read(), {k.lower(): v for k, v in answer.getheaders()}
    finally:
        conn.close()


def leaks(body: bytes) -> list[str]:
    """What a refusal must not carry: the pipeline's name, a frame, a clip, an event row, a secret."""
    found = []
    for what, needle in (
        ("pipeline name", PIPELINE.encode()),
        ("JPEG", b"\xff\xd8\xff"),
        ("MP4", b"ftyp"),
        ("event row", b"data-event="),
        ("secret", SECRET.encode()),
    ):
        if needle in body:
            found.append(what)
    return found


# --- the editor's POST ------------------------------------------------------------------------------


def editor_of(browser: httpx.Client) -> tuple[str, dict[str, Any]]:
    """The editor page's CSRF token and its data (the shapes, the file's hash)."""
    import html

    page = browser.get(f"/zones/{PIPELINE}")
    assert page.status_code == 200, page.text
    found = re.search(r'data-editor="([^"]*)"', page.text)
    assert found is not None
    return csrf_in(page.text), json.loads(html.unescape(found[1]))


def a_zone(name: str, **more: Any) -> dict[str, Any]:
    return {"name": name, "points": [[0.6, 0.1], [0.9, 0.1], [0.9, 0.9]], "origin": None, **more}


def test_a_save_without_its_sessions_csrf_token_is_403_and_the_file_stays_byte_for_byte(box: Box) -> None:
    before, reloads = box.config.read_bytes(), box.agent._reload_count
    with logged_in(box.base) as browser, logged_in(box.base) as other, client(box.base) as stranger:
        token, data = editor_of(browser)
        others, _ = editor_of(other)
        login_forms = csrf_in(stranger.get("/login").text)  # a session with no user yet
        form = {"sha256": data["sha256"], "shapes": json.dumps({"zones": [a_zone("stolen")]})}
        attempts = {
            "no token": browser.post(f"/zones/{PIPELINE}", data=form),
            "another user session's": browser.post(f"/zones/{PIPELINE}", data={**form, "csrf": others}),
            "another's in the header": browser.post(
                f"/zones/{PIPELINE}", data=form, headers={"X-CSRF-Token": others}
            ),
            "a forged header": browser.post(
                f"/zones/{PIPELINE}", data=form, headers={"X-CSRF-Token": "forged"}
            ),
            "an empty header": browser.post(f"/zones/{PIPELINE}", data=form, headers={"X-CSRF-Token": ""}),
            "the login form's": browser.post(f"/zones/{PIPELINE}", data={**form, "csrf": login_forms}),
            "in the query string": browser.post(f"/zones/{PIPELINE}?csrf={token}", data=form),
            # A cross-site form may post text/plain: its body is not read as a form, so no token.
            "a text/plain body": browser.post(
                f"/zones/{PIPELINE}",
                content=f"csrf={token}&shapes=x".encode(),
                headers={"Content-Type": "text/plain"},
            ),
        }
        # The stolen session's token with the attacker's own cookie: the token is not a session.
        attempts["a token with the login form's cookie"] = stranger.post(
            f"/zones/{PIPELINE}", data={**form, "csrf": token}
        )
        codes = {what: answer.status_code for what, answer in attempts.items()}
        assert codes == {**dict.fromkeys(attempts, 403), "a token with the login form's cookie": 401}, codes
        # A session's token after its logout is worth nothing.
        with logged_in(box.base) as gone:
            old, _ = editor_of(gone)
            assert gone.post("/logout", data={"csrf": old}).status_code == 303
            assert gone.post(f"/zones/{PIPELINE}", data={**form, "csrf": old}).status_code in (303, 401)
    # The open loopback page (no users): a cross-site form reaches it with the loopback Host but
    # without the page's cookie (SameSite=Strict) or token.
    # Nor with an empty token: the cookieless request's session has none, and "" is not one (it was
    # taken: a web site's form could rewrite the zones of a box whose config's hash it knows, e.g.
    # the shipped example's).
    with client(box.open_base) as cross_site:
        for token_sent in (None, ""):
            sent = form if token_sent is None else {**form, "csrf": token_sent}
            posted = cross_site.post(
                f"/zones/{PIPELINE}", data=sent, headers={"Origin": "http://attacker.example"}
            )
            assert posted.status_code == 403, (token_sent, posted.text[:300])
    assert box.config.read_bytes() == before and box.agent._reload_count == reloads


def test_a_body_over_the_editors_limit_is_refused_unread_even_with_the_token(box: Box) -> None:
    from agent.web.editor import MAX_BYTES

    before = box.config.read_bytes()
    with logged_in(box.base) as browser:
        token, _ = editor_of(browser)
        cookie = f"edge_agent_session={browser.cookies['edge_agent_session']}"
        headers = {
            "Cookie": cookie,
            "X-CSRF-Token": token,
            "Content-Type": "application/x-www-form-urlencoded",
        }
        # A length above the limit: refused on its header (the body is never read).
        code, _, _ = raw(box.base, "POST", f"/zones/{PIPELINE}", {**headers, "Content-Length": str(10**9)})
        assert code == 403
        big = b"shapes=" + b"%5B" * (MAX_BYTES // 3 + 1)
        assert raw(box.base, "POST", f"/zones/{PIPELINE}", headers, big)[0] == 403
        # Chunked, of no stated length: refused too.
        chunked = {**headers, "Transfer-Encoding": "chunked"}
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(b"shapes=%7B%7D"), b"shapes=%7B%7D")
        assert raw(box.base, "POST", f"/zones/{PIPELINE}", chunked, body)[0] == 403
        # The page still answers this session.
        assert browser.get(f"/zones/{PIPELINE}").status_code == 200
    assert box.config.read_bytes() == before


HOSTILE_NAMES = [
    HOSTILE,
    "\"quoted\" 'name'",
    "&anchor",
    "*alias",
    "!!python/object/apply:os.system ['touch PWNED']",
    "{",
    "a\nb: c",
    "x" * 10_000,
    "door # comment",
]


def test_a_hostile_shape_name_is_refused_beside_its_shape_and_the_file_is_untouched(box: Box) -> None:
    before = box.config.read_bytes()
    with logged_in(box.base) as browser:
        token, data = editor_of(browser)
        for name in HOSTILE_NAMES:
            shapes = {
                "zones": [a_zone(name)],
                "lines": [{"name": name, "points": [[0.1, 0.1], [0.2, 0.9]], "origin": None}],
            }
            answer = browser.post(
                f"/zones/{PIPELINE}",
                data={"sha256": data["sha256"], "shapes": json.dumps(shapes)},
                headers={"X-CSRF-Token": token},
            )
            assert answer.status_code == 422, (name[:40], answer.text[:300])
            said = answer.json()
            assert said["result"] == "refused" and sorted(said["shapes"]) == ["lines/0", "zones/0"], said
            assert "is not a valid name" in said["shapes"]["zones/0"][0]
            assert answer.headers["content-type"] == "application/json"  # data, never HTML
            # The validator's message quotes at most 80 characters of a name (check_name): a long
            # name is not echoed back whole, once per shape.
            assert len(answer.content) < 4000, len(answer.content)
    assert box.config.read_bytes() == before
    assert not (box.config.parent / "PWNED").exists() and not Path("PWNED").exists()


def test_hostile_labels_are_written_back_as_plain_strings_and_load_back(box: Box) -> None:
    labels = list(RENAMED.values())
    with logged_in(box.base) as browser:
        token, data = editor_of(browser)
        shapes = as_sent(data)
        shapes["zones"].append(a_zone("hostile", labels=labels))
        answer = browser.post(
            f"/zones/{PIPELINE}",
            data={"sha256": data["sha256"], "shapes": json.dumps(shapes)},
            headers={"X-CSRF-Token": token},
        )
        assert answer.status_code == 200 and answer.json()["result"] == "applied", answer.text[:500]
        # The file loads back with the labels as the strings sent, its comments kept, nothing run.
        (left, saved) = load_config(box.config).pipelines[0].zones
        assert saved.name == "hostile" and saved.labels == labels and left.name == "left"
        assert "# by the door" in box.config.read_text()
        assert not (box.config.parent / "PWNED").exists() and not Path("PWNED").exists()
        # The daemon runs it (the reload applied it), and the editor shows the labels as text.
        running = box.agent.supervisor.pipeline
        wait_until(
            lambda: [z.name for z in running(PIPELINE).config.zones] == ["left", "hostile"],
            "the daemon to run the saved zone",
        )
        page = browser.get(f"/zones/{PIPELINE}").text
        assert "<img src=x" not in page and editor_of(browser)[1]["shapes"]["zones"][1]["labels"] == labels


# --- a crowd of live views ----------------------------------------------------------------------------


def test_a_crowd_of_long_polls_is_bounded_the_page_answers_and_the_viewers_go_with_them(box: Box) -> None:
    """More sessions than MAX_VIEWERS, then more polls at once than MAX_WAITING (and than the server's
    connections), on the open loopback page: each answered 200, 204 or 503 at once; /api/status
    answers quickly meanwhile; once the crowd goes, no viewer is left and no picture is made."""
    from agent.web.live import MAX_VIEWERS, MAX_WAITING

    view = box.agent.supervisor.pipeline(PIPELINE).live_view
    wait_until(lambda: not view.watched, "no viewer from the tests before", timeout=15)
    crowd = [
        client(box.open_base, headers={"Connection": "close"}) for _ in range(MAX_VIEWERS + MAX_WAITING + 8)
    ]
    frame = f"/live/{PIPELINE}/frame.jpg"
    answers: list[int] = []
    refused_s: list[float] = []  # how long each 503 took
    threads: list[threading.Thread] = []
    try:
        for member in crowd:
            assert member.get("/live").status_code == 200  # a session (cookie) each
        # One after another: each a viewer for its lease, until MAX_VIEWERS are watching.
        codes = [member.get(frame).status_code for member in crowd[: MAX_VIEWERS + 8]]
        assert codes == [200] * MAX_VIEWERS + [503] * 8, codes
        assert view.status()["viewers"] == MAX_VIEWERS
        # All at once, each waiting for a picture newer than the latest: none comes for 100 s (the
        # view is watched by the leases above, so no new viewer is given one at once either).
        view.max_fps = 0.01
        seq = view.seq

        def poll(member: httpx.Client) -> None:
            began = time.monotonic()
            code = member.get(frame, params={"after": seq}).status_code
            answers.append(code)
            if code == 503:
                refused_s.append(time.monotonic() - began)

        threads += [threading.Thread(target=poll, args=(member,)) for member in crowd]
        for thread in threads:
            thread.start()
        over = len(threads) - MAX_WAITING
        wait_until(lambda: len(answers) >= over, "the polls over the bound to be refused", timeout=15,
                   state=lambda: answers)  # fmt: skip
        assert set(answers) == {503}, answers  # refused at once, while the others wait
        began = time.monotonic()
        status = httpx.get(f"{box.open_base}/api/status", timeout=5)
        took = time.monotonic() - began
        assert status.status_code == 200 and took < 1.0, took
        assert view.status()["viewers"] <= MAX_VIEWERS
    finally:
        view.max_fps = 2.0  # the waiting polls get their picture
        for thread in threads:
            thread.join(15)
        for member in crowd:
            member.close()
    assert not any(thread.is_alive() for thread in threads)
    assert len(answers) == len(threads) and set(answers) <= {200, 204, 503}, answers
    assert 1 <= answers.count(200) + answers.count(204) <= MAX_WAITING, answers
    # Refused at once: none queued behind the waiting polls for their POLL_S.
    assert max(refused_s) < 1.0, sorted(refused_s)
    wait_until(lambda: not view.watched, "the crowd's viewers to leave", timeout=15)
    wait_until(lambda: view._thread is None or not view._thread.is_alive(), "the encoder to stop", timeout=10)


# --- no session, no data ----------------------------------------------------------------------------

API = ("frame.jpg", "/events/list", "/models/part")  # scripts' routes: 401, not the login page


@pytest.mark.parametrize("who", ["no cookie", "made-up session", "the login form's session"])
def test_every_new_route_without_a_logged_in_session_gives_the_login_page_or_401_and_no_data(
    box: Box, files: Files, who: str
) -> None:
    with client(box.base) as browser:
        if who == "made-up session":
            browser.cookies.set("edge_agent_session", "x" * 43)
        elif who == "the login form's session":
            assert browser.get("/login").status_code == 200  # a session without a user: opens nothing
        for path in routes(files):
            answer = browser.get(path)
            if path.endswith(API):
                assert answer.status_code == 401, (path, answer.status_code)
                assert answer.json() == {"error": "log in first: POST /login"}
            else:
                assert answer.status_code == 303 and answer.headers["location"] == "/login", path
            assert leaks(answer.content) == [], path
        answer = browser.post(f"/zones/{PIPELINE}", data={"shapes": "{}", "csrf": "x"})
        assert answer.status_code == 401 and leaks(answer.content) == []
    # The same routes with the user's session: each answers (the refusals above were for the session),
    # with the headers that keep it out of frames and its files from being sniffed as HTML.
    with logged_in(box.base) as browser:
        for path in routes(files):
            answer = browser.get(path)
            assert answer.status_code in (200, 204), path
            assert answer.headers["x-frame-options"] == "DENY", path
            assert answer.headers["x-content-type-options"] == "nosniff", path
            # No other site may show its frames, snapshots or clips in its own page (<img>, <video>).
            assert answer.headers["cross-origin-resource-policy"] == "same-origin", path
            assert "frame-ancestors 'none'" in answer.headers["content-security-policy"], path
        # No CORS: another site's script may not send the header token (its preflight gets no yes).
        preflight = browser.request("OPTIONS", f"/zones/{PIPELINE}", headers={
            "Origin": "http://attacker.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "x-csrf-token"})  # fmt: skip
        assert not [h for h in preflight.headers if h.lower().startswith("access-control-")]


def test_a_flood_of_login_forms_ends_no_logged_in_session(box: Box) -> None:
    """Each visit to the login page without a cookie makes a session for its form's token; past
    MAX_SESSIONS the oldest end. A client that is not logged in must not end the users' sessions so."""
    from agent.web.auth import MAX_SESSIONS

    with logged_in(box.base) as browser, client(box.base) as flood:
        for _ in range(MAX_SESSIONS + 8):
            flood.cookies.clear()
            assert flood.get("/login").status_code == 200
        assert browser.get("/api/status").status_code == 200  # still logged in
        assert browser.get(f"/zones/{PIPELINE}").status_code == 200


# --- traversal and odd names ------------------------------------------------------------------------

# tests/test_web_security.py's spellings, as they go on the wire (`raw`: nothing resolves them first).
ODD = [
    "..",
    ".",
    "../secret.txt",
    "../../secret.txt",
    "..%2f..%2fsecret.txt",
    "%2e%2e%2fsecret.txt",
    "%2e%2e",
    "..%5csecret.txt",
    "secret.jpg%00.txt",
    "%2fetc%2fpasswd",
    ".hidden",
    "..%c0%af",
    "%E2%80%A4%E2%80%A4",
    "%ff",
    "%c0%ae%c0%ae",
    "%u002e%u002e",
    "%0a",
    "secret",
    "x" * 300,
]


def test_traversal_and_odd_names_in_every_parameter_are_404_and_read_nothing_outside(
    box: Box, files: Files
) -> None:
    def places(odd: str) -> list[str]:
        p = PIPELINE
        return [
            f"/live/{odd}",
            f"/live/{odd}/frame.jpg",
            f"/zones/{odd}",
            f"/snapshots/{odd}/{files.snapshot}",
            f"/snapshots/{p}/{odd}",
            f"/snapshots/{odd}/{odd}",
            f"/clips/{odd}/{files.clip}",
            f"/clips/{p}/{odd}",
            f"/clips/{odd}/{odd}",
            f"/clips/{odd}/{files.clip}/view",
            f"/clips/{p}/{odd}/view",
        ]

    with logged_in(box.base) as browser:
        cookie = {"Cookie": f"edge_agent_session={browser.cookies['edge_agent_session']}"}
        token, _ = editor_of(browser)
        before = box.config.read_bytes()
        tried = 0
        for odd in ODD:
            for path in places(odd):
                code, body, _ = raw(box.base, "GET", path, cookie)
                tried += 1
                assert code == 404, (path, code)
                assert SECRET.encode() not in body and b"\xff\xd8\xff" not in body and b"ftyp" not in body, (
                    path
                )
            code, body, _ = raw(
                box.base,
                "POST",
                f"/zones/{odd}",
                {**cookie, "X-CSRF-Token": token, "Content-Type": "application/x-www-form-urlencoded"},
                b"shapes=%7B%7D",
            )
            assert code in (404, 422), (odd, code, body[:200])  # no such pipeline: nothing written
        assert box.config.read_bytes() == before and tried == len(ODD) * 11
        # The real names still answer: the refusals were for the names.
        assert raw(box.base, "GET", f"/snapshots/{PIPELINE}/{files.snapshot}", cookie)[0] == 200
        assert raw(box.base, "GET", f"/clips/{PIPELINE}/{files.clip}", cookie)[0] == 200


# --- DNS rebinding ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    [
        "attacker.example",
        "attacker.example:80",
        "127.0.0.1.nip.io",
        "localhost.attacker.example",
        "[::1].attacker.example",
        "attacker.example@127.0.0.1",
        "127.0.0.1 attacker.example",
        "",
    ],
)
def test_the_open_loopback_page_answers_no_other_host_on_any_new_route(
    box: Box, files: Files, host: str
) -> None:
    for path in routes(files):
        code, body, _ = raw(box.open_base, "GET", path, {"Host": host})
        assert code == 403 and leaks(body) == [], (path, code)
    code, _, _ = raw(
        box.open_base,
        "POST",
        f"/zones/{PIPELINE}",
        {"Host": host, "Content-Type": "application/x-www-form-urlencoded"},
        b"shapes=%7B%7D",
    )
    assert code == 403
    for path in routes(files):  # the same on the loopback name: served
        assert raw(box.open_base, "GET", path, {"Host": "localhost"})[0] in (200, 204), path


# --- HTML in what the pages show --------------------------------------------------------------------


def test_html_in_what_the_pages_show_stays_text(box: Box, files: Files) -> None:
    """A label of the model (the tracked face's is HOSTILE), an event's zone, reason and attribute
    from a writer, a model's file name, a pipeline's last error naming its file, names in the URL:
    each shown as text, never as markup; an event's snapshot and clip names leading out are no links."""
    at = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
    box.agent.writer.write_events(PIPELINE, [{
        "type": "end", "at": at, "zone": HOSTILE, "reason": HOSTILE, "clip": "../../secret",
        "object": {"id": 9999, "label": "FACE_MALE", "snapshot": "../secret",
                   "attributes": {"plate": {"value": HOSTILE, "score": 0.5}}},
    }])  # fmt: skip
    index = box.agent.event_index
    wait_until(lambda: index.query(zone=HOSTILE, limit=5), "the hostile event in the index")
    wait_until(lambda: index.query(label=HOSTILE, limit=5), "an event of the face (label HOSTILE)")
    wait_until(lambda: "svg onload" in json.dumps(box.agent.status()), "the broken pipeline's error")
    escaped = html.escape(HOSTILE)
    with logged_in(box.base) as browser:
        pages = {
            path: browser.get(path)
            for path in ("/", "/box/status", "/events", "/events/list", f"/events?zone={HOSTILE}",
                         f"/events?label={HOSTILE}&from={HOSTILE}", "/models", "/models/part",
                         f"/live/{HOSTILE}", f"/zones/{HOSTILE}", f"/clips/{PIPELINE}/{HOSTILE}/view",
                         f"/zones/{PIPELINE}")
        }  # fmt: skip
    for path, answer in pages.items():
        assert answer.status_code in (200, 404), (path, answer.status_code)
        text = answer.text
        assert "<img src=x" not in text and "<svg onload" not in text, (path, text[:2000])
    for path in ("/events", "/events/list", f"/events?zone={HOSTILE}"):
        text = pages[path].text
        assert escaped in text, path  # the label, zone, reason and attribute, as text
        assert "/secret" not in text and "secret.jpg" not in text, path  # no link out of the roots
    assert escaped in pages["/models"].text  # the model's file name
    assert "&lt;svg onload=alert(2)&gt;" in pages["/"].text  # the last error, naming the file


def test_sql_in_the_events_filters_is_a_value_not_a_query(box: Box, files: Files) -> None:
    with logged_in(box.base) as browser:
        every = browser.get("/events").text.count("<tr data-event=")
        assert every > 0
        for sql in ("' OR '1'='1", "x' OR 1=1 --", "%", "*", "'; DROP TABLE events; --", "1) OR (1=1"):
            for column in ("pipeline", "zone", "line", "label", "type"):
                answer = browser.get("/events", params={column: sql})
                assert answer.status_code == 200 and "<tr data-event=" not in answer.text, (column, sql)
                assert "No events match these filters" in answer.text
        assert browser.get("/events", params={"before": "1 OR 1=1"}).status_code == 200
        assert browser.get("/events").text.count("<tr data-event=") >= every  # the table is still there


def test_links_out_of_the_roots_and_hostile_ranges_are_refused(box: Box, files: Files) -> None:
    """A pipeline's folder of snapshots or clips that is a link out of the state dir; a clip asked
    for in a hundred overlapping ranges (an answer a hundred times the file) or in ranges that make
    no sense."""
    outside = box.config.parent / "outside"
    outside.mkdir(exist_ok=True)
    (outside / f"{files.snapshot}.jpg").write_text(SECRET)
    (outside / f"{files.clip}.mp4").write_text(SECRET)
    for root in ("snapshots", "clips"):
        link = box.state_dir / root / "linked"
        if not link.exists():
            link.symlink_to(outside, target_is_directory=True)
    size = (box.state_dir / "clips" / PIPELINE / f"{files.clip}.mp4").stat().st_size
    with logged_in(box.base) as browser:
        for path in (f"/snapshots/linked/{files.snapshot}", f"/clips/linked/{files.clip}",
                     f"/clips/linked/{files.clip}/view"):  # fmt: skip
            answer = browser.get(path)
            assert answer.status_code == 404 and SECRET not in answer.text, path
        clip = f"/clips/{PIPELINE}/{files.clip}"
        many = browser.get(clip, headers={"Range": "bytes=" + ",".join(["0-"] * 100)})
        assert many.status_code in (200, 206, 416) and len(many.content) <= size + 1024, len(many.content)
        for bad in (
            "bytes=5-1",
            "bytes=-0",
            f"bytes={size}-",
            "bytes=x-y",
            "pages=0-1",
            "bytes=" + "0-1," * 5000,
        ):
            answer = browser.get(clip, headers={"Range": bad})
            assert answer.status_code in (200, 206, 400, 416), (bad[:40], answer.status_code)
            assert len(answer.content) <= size + 1024
        assert (
            browser.get(clip, headers={"Range": "bytes=0-9"}).content
            == (box.state_dir / "clips" / PIPELINE / f"{files.clip}.mp4").read_bytes()[:10]
        )
