"""The live view pages (agent/web/live.py) over a real pipeline: the real YOLOv8n face detector on the
rendered clip of a face crossing a line (tests/test_pipeline_tracking.py's), looped at its 10 fps,
served by the page's app (Starlette's TestClient; the real server, uvicorn, for the stop).

The frame endpoint long-polls JPEGs of the frame's size; answers 204 when nothing newer came, 404
for a pipeline that does not run; a page's viewer stays registered between its polls and ends a
lease after its last one (the pipeline stops making pictures); plain frames carry no drawing where
the drawn one has the face's box; a stop does not wait on a poll longer than the poll's bound."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import cv2
import httpx
import numpy as np
import pytest
from starlette.testclient import TestClient

from agent.config.web import WebConfig
from agent.errors import EdgeAgentError
from agent.live_view import LiveView
from agent.pipeline import Pipeline
from agent.processing.drawing import track_colour
from agent.stage import LoadedModel
from agent.web.app import WebApp
from agent.web.live import POLL_S, LivePages, Watches
from agent.web.server import STOP_TIMEOUT_S, WebServer
from tests.media_fixtures import ListSink
from tests.test_pipeline_tracking import H, W, config, crossing_clip  # noqa: F401  (fixtures)
from tests.waits import wait_until

LEASE_S = 0.5  # the tests' lease: short, so that its end is seen soon


class Running:
    """The supervisor's two questions the pages ask, answered from the test's real pipelines."""

    def __init__(self, *pipelines: Pipeline) -> None:
        self.by_name = {p.name: p for p in pipelines}

    def pipeline(self, name: str) -> Pipeline:
        if name not in self.by_name:
            raise EdgeAgentError(f"no running pipeline {name!r}")
        return self.by_name[name]

    def pipelines(self) -> Sequence[Pipeline]:
        return list(self.by_name.values())


def status_of(running: Running) -> dict[str, Any]:
    """The daemon's status as far as the pages read it: each pipeline's typed status."""
    pipelines = running.by_name.items()
    return {"pipelines": {n: {**p.status().to_json(), "state": "running"} for n, p in pipelines}}


def app_for(running: Running, watches: Watches | None = None, poll_s: float = POLL_S) -> WebApp:
    web_app = WebApp(WebConfig(enabled=True, port=0), lambda: status_of(running), "live-box")
    LivePages(running, watches if watches is not None else Watches(lease_s=LEASE_S), poll_s).add(web_app)
    return web_app


def client(web_app: WebApp) -> TestClient:
    return TestClient(web_app.app, base_url="http://127.0.0.1")  # (a page without users: loopback only)


@pytest.fixture(scope="module")
def faces(
    crossing_clip: Path,  # noqa: F811
    yolo_loaded: LoadedModel,
    yolo_labels: list[str],
) -> Iterator[tuple[Pipeline, ListSink]]:
    """The face pipeline on the looped clip, running for the module's tests."""
    sink = ListSink()
    pipeline = Pipeline(config(crossing_clip, yolo_labels, loop=True), yolo_loaded, sink)
    pipeline.start()
    yield pipeline, sink
    pipeline.stop(timeout=30)


def live_step_runs(pipeline: Pipeline) -> int:
    """Frames the pipeline's live-view step saw (it runs on each, watched or not)."""
    steps = pipeline.stages.plan.steps["report"]
    return sum(step.stats.runs for step in steps if step.name == "live_view")


def box_edge_distance(image: np.ndarray, detection: dict[str, Any]) -> float:
    """How far the picture is from the track's box there: along the box's left edge (away from its
    caption and anchor), each row's pixel nearest the track's colour (within JPEG's blur of a 2-pixel
    line), the median over the rows (0: the colour itself; the drawn box: below 90)."""
    x1, y1, _, y2 = (round(v) for v in detection["box"])
    colour = np.array(track_colour(detection["track_id"]), np.int32)
    strip = image[y1 + 10 : y2 - 10, max(x1 - 2, 0) : x1 + 3].astype(np.int32)
    return float(np.median(np.abs(strip - colour).sum(axis=2).min(axis=1)))


def decoded(answer: httpx.Response) -> np.ndarray:
    image = cv2.imdecode(np.frombuffer(answer.content, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None, "not a JPEG"
    return image


def test_the_frame_endpoint_long_polls_newer_jpegs_of_the_frames_size(
    faces: tuple[Pipeline, ListSink],
) -> None:
    pipeline, _ = faces
    running = Running(pipeline)
    with client(app_for(running)) as page:
        seqs = []
        for _ in range(3):
            answer = page.get("/live/faces/frame.jpg", params={"after": seqs[-1] if seqs else 0})
            assert answer.status_code == 200, answer.text
            assert answer.headers["content-type"] == "image/jpeg"
            assert decoded(answer).shape == (H, W, 3)
            seqs.append(int(answer.headers["x-frame-seq"]))
            captured_at = float(answer.headers["x-captured-at"])
            assert abs(time.time() - captured_at) < 30
            assert 0 <= float(answer.headers["x-frame-age"]) < 30
        assert seqs == sorted(set(seqs))  # each newer than the last asked for
        assert float(answer.headers["x-pipeline-fps"]) > 0  # the status's frame rate, beside it
        # The page: the pipeline's picture and the script that fills it; the header links it.
        html = page.get("/live").text
        assert 'data-pipeline="faces"' in html and "/static/live.js" in html
        assert '<a href="/live">Live</a>' in html
        assert 'data-pipeline="faces"' in page.get("/live/faces").text
        assert page.get("/static/live.js").status_code == 200


def test_nothing_newer_is_204_in_time_and_an_unknown_pipeline_404(faces: tuple[Pipeline, ListSink]) -> None:
    pipeline, _ = faces
    with client(app_for(Running(pipeline), poll_s=0.3)) as page:
        latest = page.get("/live/faces/frame.jpg")
        assert latest.status_code == 200
        # Far ahead of the view's pictures is a number from a rebuilt pipeline's view: the newest.
        assert page.get("/live/faces/frame.jpg", params={"after": 10**9}).status_code == 200
        pipeline.live_view.max_fps = 0.05  # a picture each 20 s: none within the poll
        try:
            codes = []
            for _ in range(3):  # (a picture taken just before may still be on its way)
                seq = int(page.get("/live/faces/frame.jpg").headers["x-frame-seq"])
                began = time.monotonic()
                answer = page.get("/live/faces/frame.jpg", params={"after": seq})
                codes.append(answer.status_code)
                if answer.status_code == 204:
                    assert answer.content == b"" and time.monotonic() - began < 5
                    break
            assert codes[-1] == 204, codes
        finally:
            pipeline.live_view.max_fps = 2.0
        missing = page.get("/live/nowhere/frame.jpg")
        assert missing.status_code == 404 and "no running pipeline 'nowhere'" in missing.text
        assert page.get("/live/nowhere").status_code == 404
        assert page.get("/live/faces/frame.jpg", params={"after": "-1"}).status_code == 400
        assert page.get("/live/faces/frame.jpg", params={"after": "x"}).status_code == 400


def test_a_viewer_stays_between_polls_and_the_pipeline_stops_making_pictures_after_the_page_goes(
    faces: tuple[Pipeline, ListSink],
) -> None:
    pipeline, _ = faces
    view = pipeline.live_view
    wait_until(lambda: not view.watched, "no viewer from the tests before")
    watches = Watches(lease_s=LEASE_S)
    with client(app_for(Running(pipeline), watches)) as page:
        seq = 0
        for _ in range(3):
            answer = page.get("/live/faces/frame.jpg", params={"after": seq})
            assert answer.status_code == 200
            seq = int(answer.headers["x-frame-seq"])
            # Between two polls the viewer is still there: the encoder is not stopped and started.
            assert view.watched and len(watches) == 1
        encodes = view.encodes
    # The page is gone: its lease ends LEASE_S after its last poll, and no more pictures are made.
    wait_until(lambda: not view.watched, "the page's viewer to leave", timeout=10)
    assert len(watches) == 0
    wait_until(lambda: watches._reaper is None, "the lease thread to end")
    wait_until(lambda: view._thread is None or not view._thread.is_alive(), "the encoder thread to end")
    taken, frames = view.taken, live_step_runs(pipeline)
    wait_until(lambda: live_step_runs(pipeline) >= frames + 10, "ten more frames", timeout=30)
    assert view.taken == taken and view.encodes >= encodes


def test_too_many_viewers_are_answered_503(faces: tuple[Pipeline, ListSink]) -> None:
    pipeline, _ = faces
    web_app = app_for(Running(pipeline), Watches(lease_s=LEASE_S, max_viewers=1))
    with client(web_app) as first, client(web_app) as second:
        first.get("/live"), second.get("/live")  # each its own session (cookie)
        assert first.get("/live/faces/frame.jpg").status_code == 200
        busy = second.get("/live/faces/frame.jpg")
        assert busy.status_code == 503 and busy.headers["retry-after"] == "2"
        assert "1 viewers are watching already" in busy.text


def test_plain_frames_have_no_drawing_where_the_drawn_one_has_the_faces_box(
    faces: tuple[Pipeline, ListSink],
) -> None:
    pipeline, sink = faces
    with client(app_for(Running(pipeline))) as page:
        compared = 0
        seq = 0
        deadline = time.monotonic() + 90  # bounded: 2 pictures a second, the face in about half the clip
        for _ in range(200):
            if time.monotonic() > deadline:
                break
            drawn = page.get("/live/faces/frame.jpg", params={"after": seq})
            plain = page.get("/live/faces/frame.jpg", params={"after": seq, "plain": 1})
            assert drawn.status_code == plain.status_code == 200
            seq = int(drawn.headers["x-frame-seq"])
            if plain.headers["x-frame-seq"] != drawn.headers["x-frame-seq"]:
                continue  # (a newer frame came between the two)
            at = float(drawn.headers["x-captured-at"])
            results = [r for _, r in list(sink.results) if abs(r["captured_at"] - at) < 0.002]
            detections = (results[0].get("output") or {}).get("detections", []) if results else []
            tracked = [d for d in detections if d.get("track_id")]
            if not tracked:
                continue  # (not confirmed as a track yet, or the face is out of the frame)
            drawn_image, plain_image = decoded(drawn), decoded(plain)
            assert plain_image.shape == drawn_image.shape == (H, W, 3)
            on_drawn, on_plain = (box_edge_distance(i, tracked[0]) for i in (drawn_image, plain_image))
            assert on_drawn < 90 < on_plain, (on_drawn, on_plain, at)
            compared += 1
            if compared == 2:
                break
        assert compared == 2, "no frame with a tracked face was seen both ways"
        assert pipeline.live_view.plain_viewers == 1  # (only while someone asks for it)
    wait_until(lambda: pipeline.live_view.plain_viewers == 0, "the plain viewer to leave", timeout=10)


def test_a_stop_does_not_wait_on_a_poll_longer_than_its_bound(faces: tuple[Pipeline, ListSink]) -> None:
    pipeline, _ = faces
    assert POLL_S < STOP_TIMEOUT_S  # a poll ends within the server's grace for requests in flight
    running = Running(pipeline)
    live = LivePages(running, Watches(lease_s=LEASE_S))
    server = WebServer(WebConfig(enabled=True, port=0), lambda: status_of(running), "live-box", [live.add])
    server.start()
    base = f"http://127.0.0.1:{server.port}"
    answers: list[int] = []
    try:
        # A first picture at the normal rate (one taken by an earlier test may be recent), then none
        # within the poll: it waits its whole POLL_S.
        seq = int(httpx.get(f"{base}/live/faces/frame.jpg", timeout=10).headers["x-frame-seq"])
        pipeline.live_view.max_fps = 0.05
        poll = threading.Thread(
            target=lambda: answers.append(
                httpx.get(f"{base}/live/faces/frame.jpg", params={"after": seq}, timeout=10).status_code
            )
        )
        poll.start()
        wait_until(lambda: len(live.watches) == 1 and live.watches._leases[("", "faces", False)].polls == 1,
                   "the poll to be waiting")  # fmt: skip
        began = time.monotonic()
        server.stop()
        stopped_s = time.monotonic() - began
        poll.join(10)
    finally:
        pipeline.live_view.max_fps = 2.0
        server.stop()
    assert stopped_s < POLL_S + 1, stopped_s
    assert answers == [204]  # the poll in flight was answered, not cut off
    wait_until(lambda: not pipeline.live_view.watched, "the poll's viewer to leave", timeout=10)


def test_a_rebuilt_pipelines_new_view_takes_over_the_sessions_lease() -> None:
    old, new = LiveView("faces"), LiveView("faces")  # the pipeline's view before and after a rebuild
    watches = Watches(lease_s=LEASE_S)
    key = ("session", "faces", False)
    first = watches.begin(key, old)
    assert first is not None and old.watched
    second = watches.begin(key, new)  # (the first poll still waiting on the old view)
    assert second is not None and new.watched and not old.watched and len(watches) == 1
    watches.end(key, first)  # the old poll's end is not the new one's
    assert watches._leases[key].polls == 1
    watches.end(key, second)
    wait_until(lambda: not new.watched and len(watches) == 0, "the lease to run out", timeout=10)
    old.close(), new.close()
