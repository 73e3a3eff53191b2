"""The live view pages: `/live` (every running pipeline's live view), `/live/<pipeline>` (one), and
the frames they show, `/live/<pipeline>/frame.jpg?after=<seq>[&plain=1]`.

A frame request is a long poll: it answers 200 (image/jpeg; headers X-Frame-Seq, X-Captured-At: the
frame's capture time in epoch seconds, X-Frame-Age: seconds since then as the answer leaves,
X-Pipeline-Fps when known) as soon as the pipeline's live view (agent/live_view.py) has a picture
newer than `after`, 204 when none came within POLL_S, 404 for a pipeline that does not run (or has
stopped: look again later; a rebuilt pipeline is looked up again on every request, so its new
LiveView is found), 503 when too many viewers or polls are about already. `plain=1`: the frame
without the drawings (the zone editor's background to draw on); the LiveView makes that picture only
while someone asks for it.

"Only while watched" holds between polls too: each session (its cookie), pipeline and kind of picture
holds a viewer (`Watches`) from its first poll until LEASE_S after its last one ended, so a page
polling again at once keeps the encoder running, and a page closed stops it LEASE_S later. At most
MAX_VIEWERS such viewers in all.

Waits never block the server's event loop: a poll waits on a worker thread (anyio.to_thread), at
most MAX_WAITING at once, each for at most POLL_S (below the server's 5 s grace for requests in
flight at a stop, agent/web/server.py, so a stop never waits on a poll longer than that).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from agent.errors import EdgeAgentError
from agent.live_view import LiveView, Viewer
from agent.status import statuses_of
from agent.threads import named_thread
from agent.web.pages import esc

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from agent.web.app import WebApp
    from agent.web.auth import Session

POLL_S = 4.0  # a poll waits at most this long for a newer picture, then 204
LEASE_S = 3.0  # a session's viewer stays registered this long after its last poll ended
MAX_VIEWERS = 16  # sessions x pipelines x kinds watching at once
MAX_WAITING = 16  # polls waiting at once (each on a worker thread)
_RETRY_S = 2  # Retry-After of a 503


class Watched(Protocol):
    """What the pages need of a pipeline (agent/pipeline.py `Pipeline`)."""

    name: str
    live_view: LiveView


class Pipelines(Protocol):
    """What the pages need of the supervisor (agent/supervisor `Supervisor`)."""

    def pipeline(self, name: str) -> Watched: ...

    def pipelines(self) -> Sequence[Watched]: ...


Key = tuple[str, str, bool]  # (session id, pipeline, plain)


@dataclass
class _Lease:
    view: LiveView
    viewer: Viewer
    until: float  # monotonic: it ends then, unless a poll is in flight or comes
    polls: int = 0  # in flight


class Watches:
    """The viewers kept registered between one session's polls (the module's docstring). A thread
    ends leases as they run out; it runs only while there are any."""

    def __init__(
        self,
        lease_s: float = LEASE_S,
        max_viewers: int = MAX_VIEWERS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lease_s = lease_s
        self.max_viewers = max_viewers
        self._clock = clock
        self._changed = threading.Condition()
        self._leases: dict[Key, _Lease] = {}
        self._reaper: threading.Thread | None = None

    def __len__(self) -> int:
        with self._changed:
            return len(self._leases)

    def begin(self, key: Key, view: LiveView) -> Viewer | None:
        """A poll of `key` on `view` begins: its viewer (registered now, or kept from the session's last
        poll); None when MAX_VIEWERS are watching already. Each begin needs its `end`."""
        with self._changed:
            lease = self._leases.get(key)
            if lease is not None and (lease.view is not view or view.closed):  # a rebuilt pipeline
                self._drop(key)
                lease = None
            if lease is None:
                self._reap(self._clock())
                if len(self._leases) >= self.max_viewers:
                    return None
                lease = _Lease(view, view.watch(plain=key[2]), 0.0)
                self._leases[key] = lease
                if self._reaper is None:
                    self._reaper = named_thread(self._reap_loop, "web-live-leases")
                    self._reaper.start()
            lease.polls += 1
            return lease.viewer

    def end(self, key: Key, viewer: Viewer) -> None:
        """The poll of `key` that `begin` gave `viewer` answered: the viewer stays for `lease_s` more
        (unless a newer LiveView's replaced it meanwhile: that lease's polls are its own)."""
        with self._changed:
            lease = self._leases.get(key)
            if lease is not None and lease.viewer is viewer:
                lease.polls = max(0, lease.polls - 1)
                lease.until = self._clock() + self.lease_s
                self._changed.notify_all()

    def close(self) -> None:
        """End every lease now (the reaper thread ends with them)."""
        with self._changed:
            for key in list(self._leases):
                self._drop(key)
            self._changed.notify_all()
            reaper = self._reaper
        if reaper is not None:
            reaper.join(5.0)

    def _drop(self, key: Key) -> None:
        self._leases.pop(key).viewer.close()

    def _reap(self, now: float) -> float | None:
        """End the leases run out by `now`; the time until the next one does (None: none idle)."""
        next_s: float | None = None
        for key, lease in list(self._leases.items()):
            if lease.polls > 0:
                continue
            if lease.until <= now:
                self._drop(key)
            else:
                left = lease.until - now
                next_s = left if next_s is None else min(next_s, left)
        return next_s

    def _reap_loop(self) -> None:
        with self._changed:
            try:
                while self._leases:
                    next_s = self._reap(self._clock())
                    if self._leases:  # (only polls in flight: their end notifies)
                        self._changed.wait(self.lease_s if next_s is None else next_s)
            finally:
                self._reaper = None


@dataclass(frozen=True)
class _Shown:
    code: int  # 200, 204, 404, 503
    picture: tuple[int, bytes, float] | None = None
    text: str = ""
    fps: float | None = None


class LivePages:
    """The live view's routes on a WebApp (`add`)."""

    def __init__(self, pipelines: Pipelines, watches: Watches | None = None, poll_s: float = POLL_S) -> None:
        self.pipelines = pipelines
        self.watches = watches if watches is not None else Watches()
        self.poll_s = poll_s
        self._waiting: Any = None  # the polls' CapacityLimiter, made on the server's event loop

    def add(self, web_app: WebApp) -> None:
        self.web_app = web_app
        web_app.add_page("/live", self.all_page, link="Live")
        web_app.add_page("/live/{pipeline}", self.one_page)
        web_app.add_page("/live/{pipeline}/frame.jpg", self.frame, api=True)

    # --- the pages ---------------------------------------------------------------------------------

    async def all_page(self, request: Request, session: Session) -> Response:
        import anyio.to_thread
        from starlette.responses import HTMLResponse

        names = await anyio.to_thread.run_sync(self._names)
        chooser = " ".join(f'<a href="/live/{esc(name)}">{esc(name)}</a>' for name in names)
        figures = "\n".join(_figure(name) for name in names)
        body = (
            _STYLE
            + "<h1>Live view</h1>\n"
            + (f'<p class="chooser">One at a time: {chooser}</p>\n' if names else "")
            + (f'<div class="live-grid">{figures}</div>' if names else "<p>No pipeline is running.</p>")
        )
        return HTMLResponse(self.web_app.frame("live view", body, session, "live.js"))

    async def one_page(self, request: Request, session: Session) -> Response:
        import anyio.to_thread
        from starlette.responses import HTMLResponse

        name = request.path_params["pipeline"]
        names = await anyio.to_thread.run_sync(self._names)
        if name not in names:
            running = ", ".join(names) or "none"
            body = f"<h1>Live view</h1><p>No running pipeline {esc(name)} (running: {esc(running)}).</p>"
            return HTMLResponse(self.web_app.frame("live view", body, session), 404)
        others = " ".join(f'<a href="/live/{esc(n)}">{esc(n)}</a>' for n in names if n != name)
        body = (
            _STYLE
            + f"<h1>Live view: {esc(name)}</h1>\n"
            + f'<p class="chooser"><a href="/live">All</a> {others}</p>\n'
            + f'<div class="live-one">{_figure(name)}</div>'
        )
        return HTMLResponse(self.web_app.frame(f"live view: {name}", body, session, "live.js"))

    def _names(self) -> list[str]:
        return sorted(p.name for p in self.pipelines.pipelines())

    # --- the frames --------------------------------------------------------------------------------

    async def frame(self, request: Request, session: Session) -> Response:
        import anyio
        import anyio.to_thread
        from starlette.responses import Response

        name = request.path_params["pipeline"]
        after_text = request.query_params.get("after", "0")
        if not after_text.isdigit() or len(after_text) > 18:
            return Response(f"after={after_text!r}: a frame number (0 or more) is wanted", 400)
        plain = request.query_params.get("plain", "0") == "1"
        if self._waiting is None:
            self._waiting = anyio.CapacityLimiter(MAX_WAITING)
        # Taken now or answered now: a poll never queues behind others. (Looking at available_tokens
        # first and waiting on the limiter after let a burst of polls past the look and queue.)
        try:
            self._waiting.acquire_nowait()
        except anyio.WouldBlock:
            return _busy(f"{MAX_WAITING} polls are waiting already")
        key = (session.id, name, plain)
        try:  # its own thread (a limiter of one): polls take none of the server's shared threads
            shown = await anyio.to_thread.run_sync(
                self._wait, key, int(after_text), limiter=anyio.CapacityLimiter(1)
            )
        finally:
            self._waiting.release()
        if shown.code == 503:
            return _busy(shown.text)
        if shown.picture is None:
            return Response(shown.text or None, shown.code, media_type="text/plain" if shown.text else None)
        seq, jpeg, captured_at = shown.picture
        headers = {
            "X-Frame-Seq": str(seq),
            "X-Captured-At": f"{captured_at:.3f}",
            "X-Frame-Age": f"{max(0.0, time.time() - captured_at):.3f}",
        }
        if shown.fps is not None:
            headers["X-Pipeline-Fps"] = f"{shown.fps:g}"
        return Response(jpeg, 200, headers=headers, media_type="image/jpeg")

    def _wait(self, key: Key, after: int) -> _Shown:
        """On a worker thread: the pipeline's newest picture after `after`, waiting up to POLL_S."""
        name = key[1]
        try:
            view = self.pipelines.pipeline(name).live_view
        except EdgeAgentError as exc:
            return _Shown(404, text=str(exc))
        if view.closed:
            return _Shown(404, text=f"pipeline {name!r} stopped")
        viewer = self.watches.begin(key, view)
        if viewer is None:
            return _Shown(503, text=f"{self.watches.max_viewers} viewers are watching already")
        try:
            # A number above the view's own came from the LiveView of a pipeline since rebuilt.
            shown = viewer.latest(after if after <= view.seq else 0, self.poll_s)
        finally:
            self.watches.end(key, viewer)
        if shown is None:
            return _Shown(404, text=f"pipeline {name!r} stopped") if view.closed else _Shown(204)
        return _Shown(200, shown, fps=self._fps(name))

    def _fps(self, name: str) -> float | None:
        """The pipeline's frame rate as the box page shows it (the status, cached for a second)."""
        status = statuses_of(self.web_app.status.get().get("pipelines")).get(name)
        return None if status is None or status.run is None else status.run.counts.fps


def _busy(why: str) -> Response:
    from starlette.responses import Response

    return Response(f"busy: {why}; try again", 503, {"Retry-After": str(_RETRY_S)}, "text/plain")


def _figure(name: str) -> str:
    """A pipeline's live picture: live.js long-polls its frames and paints them on the canvas."""
    return (
        f'<figure class="live" data-pipeline="{esc(name)}"><canvas width="640" height="360"></canvas>'
        f'<figcaption><a href="/live/{esc(name)}">{esc(name)}</a> '
        '<span class="live-age">waiting for a frame</span> <span class="live-fps"></span>'
        "</figcaption></figure>"
    )


# The pages' own style sheet (the CSP allows only the site's files).
_STYLE = '<link rel="stylesheet" href="/static/live.css">\n'


def live_pages(supervisor: Pipelines) -> Callable[[WebApp], None]:
    """agent/web/site.py `pages_of`'s entry (with the Site's supervisor)."""
    return LivePages(supervisor).add
