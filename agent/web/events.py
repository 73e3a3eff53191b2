"""The events page: `/events`, the recent events the index holds (agent/event_index.py), newest first,
filtered by pipeline, zone, line, label, type and time, each with its snapshot and its clip; and the
files it shows:

    /events?pipeline=&zone=&line=&label=&type=&from=&to=&before=   the page (`before`: older ones)
    /events/list?<the same>&known=<version>   its list alone (static/events.js polls it every few
                                              seconds): 204 while it is unchanged
    /snapshots/<pipeline>/<id>                a snapshot (image/jpeg), from <state_dir>/snapshots
    /clips/<pipeline>/<id>                    a clip (video/mp4, HTTP Range), from <state_dir>/clips
    /clips/<pipeline>/<id>/view               a page that plays it

Names from a request reach the file system only through `safe_child` (the pipeline's directory, then
the file) and `clip_path` (a clip id or nothing): anything else is 404. A clip is a link once its file
is complete (agent/clips.py renames it into place when ffmpeg has finished); before that the page
says "recording"; a clip the retention removed (or that failed) is "not kept".
"""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from agent.clips import SUFFIX as CLIP_SUFFIX
from agent.clips import clip_path
from agent.event_index import FILTERS, EventIndex, IndexedEvent
from agent.processing.scene import attribute_text
from agent.status import statuses_of
from agent.web.files import UnsafeName, safe_child
from agent.web.pages import esc

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from agent.web.app import WebApp
    from agent.web.auth import Session

PAGE_ROWS = 50
REFRESH_S = 3  # static/events.js's poll (said here for the docs and the page)
# Where the daemon keeps them (agent/daemon.py: the SnapshotStore's root; ResultWriter.clips_root).
SNAPSHOTS_DIR = "snapshots"
CLIPS_DIR = "clips"
_STYLE = '<link rel="stylesheet" href="/static/events.css">\n'
_FILE_CACHE = "private, max-age=86400"  # a snapshot's or clip's id names one file that never changes


class EventsPages:
    def __init__(self, index: EventIndex | None, state_dir: Path) -> None:
        self.index = index
        self.snapshots_root = state_dir / SNAPSHOTS_DIR
        self.clips_root = state_dir / CLIPS_DIR
        self._recording: Callable[[], set[tuple[str, str]]] = set

    def add(self, web_app: WebApp) -> None:
        self._recording = lambda: recording_clips(web_app.status.get())
        self._web_app = web_app
        web_app.add_page("/events", self.page, link="Events")
        web_app.add_page("/events/list", self.list_part, api=True)
        web_app.add_page("/snapshots/{pipeline}/{name}", self.snapshot)
        web_app.add_page("/clips/{pipeline}/{name}", self.clip)
        web_app.add_page("/clips/{pipeline}/{name}/view", self.clip_page)

    # --- the page -----------------------------------------------------------------------------------

    async def page(self, request: Request, session: Session) -> Response:
        import anyio.to_thread
        from starlette.responses import HTMLResponse

        asked = Asked.of(request.query_params)
        body = await anyio.to_thread.run_sync(self._page_body, asked)
        return HTMLResponse(self._web_app.frame("Events", body, session, "events.js"))

    async def list_part(self, request: Request, session: Session) -> Response:
        import anyio.to_thread
        from starlette.responses import HTMLResponse, Response

        asked = Asked.of(request.query_params)
        part = await anyio.to_thread.run_sync(self._list, asked)
        version = _version(part)
        if request.query_params.get("known") == version:
            return Response(status_code=204, headers={"X-Events-Version": version})
        return HTMLResponse(part, headers={"X-Events-Version": version})

    def _page_body(self, asked: Asked) -> str:
        choices: dict[str, list[str]] = {column: [] for column in FILTERS}
        if self.index is not None:
            with contextlib.suppress(sqlite3.Error):  # (the list says why)
                choices = self.index.choices()
        part = self._list(asked)
        live = "1" if asked.before is None else "0"  # an older page stays as it is
        return (
            f"{_STYLE}<h1>Events</h1>\n"
            + filter_form(asked, choices)
            + f'\n<div id="events" data-query="{esc(asked.query())}" data-version="{_version(part)}" '
            f'data-live="{live}" data-refresh-s="{REFRESH_S}">{part}</div>'
        )

    def _list(self, asked: Asked) -> str:
        """The list of events (what the page refreshes): a table, the link to older ones, what is wrong."""
        notes = "".join(f'<p class="problem">{esc(problem)}</p>' for problem in asked.problems)
        if self.index is None:
            return notes + '<p class="problem">This agent keeps no events index.</p>'
        try:
            rows = self.index.query(
                before=asked.before, since=asked.since, until=asked.until, limit=PAGE_ROWS, **asked.equal
            )
        except sqlite3.Error as exc:
            why = self.index.problem or str(exc)
            return notes + f'<p class="problem">The events index cannot be read: {esc(why)}</p>'
        if self.index.problem is None and self.index.errors:
            notes += (
                f'<p class="problem">{self.index.errors} event(s) could not be indexed (see the log).</p>'
            )
        if not rows:
            return notes + "<p>No events" + (" match these filters" if asked.any() else " yet") + ".</p>"
        recording = self._recording()
        body = "".join(self._row(row, recording) for row in rows)
        older = ""
        if len(rows) == PAGE_ROWS:
            older = f'<p><a href="/events?{esc(asked.query(before=rows[-1].id))}">Older events</a></p>'
        newest = '<p><a href="/events?' + esc(asked.query()) + '">Newest events</a></p>'
        newer = newest if asked.before else ""
        heads = ("snapshot", "time (UTC)", "pipeline", "event", "where", "object", "attributes", "clip")
        return (
            notes
            + newer
            + '<table class="events"><thead><tr>'
            + "".join(f"<th>{h}</th>" for h in heads)
            + f"</tr></thead><tbody>{body}</tbody></table>"
            + older
        )

    def _row(self, row: IndexedEvent, recording: set[tuple[str, str]]) -> str:
        p = quote(row.pipeline, safe="")
        snapshot = None if not row.snapshot else self.snapshot_file(row.pipeline, row.snapshot)
        if row.snapshot and snapshot is not None and snapshot.is_file():
            url = f"/snapshots/{p}/{quote(row.snapshot, safe='')}"
            alt = f"snapshot of {row.label or 'object'} #{row.track}"
            picture = f'<a href="{esc(url)}"><img class="thumb" src="{esc(url)}" alt="{esc(alt)}"></a>'
        elif row.snapshot:  # removed by the snapshots' retention: no broken picture
            picture = '<span class="none">not kept</span>'
        else:
            picture = '<span class="none">-</span>'
        where = row.zone or ""
        if row.line:
            where = f"{row.line} {row.direction or ''}".strip()
        what = row.label or ""
        if row.track is not None:
            what = f"{what} #{row.track}".strip()
        cells = [
            f'<td class="pic">{picture}</td>',
            f'<td class="n">{esc(row.at.replace("T", " ").rstrip("Z"))}</td>',
            f"<td>{esc(row.pipeline)}</td>",
            f'<td class="kind">{esc(row.type)}{esc(_details(row.event))}</td>',
            f"<td>{esc(where)}</td>",
            f"<td>{esc(what)}</td>",
            f'<td class="attrs">{_attributes(row.attributes)}</td>',
            f"<td>{self._clip_cell(row, recording)}</td>",
        ]
        return f'<tr data-event="{row.id}">{"".join(cells)}</tr>'

    def _clip_cell(self, row: IndexedEvent, recording: set[tuple[str, str]]) -> str:
        if not row.clip:
            return '<span class="none">-</span>'
        state = self.clip_state(row.pipeline, row.clip, recording)
        if state == "ready":
            url = f"/clips/{quote(row.pipeline, safe='')}/{quote(row.clip, safe='')}/view"
            return f'<a class="clip" href="{esc(url)}">play</a>'
        if state == "recording":
            return '<span class="recording">recording</span>'
        return '<span class="none">not kept</span>'

    # --- files ----------------------------------------------------------------------------------------

    def clip_state(self, pipeline: str, clip_id: str, recording: set[tuple[str, str]]) -> str:
        """ "ready" (its file is complete), "recording" (its recorder has it open, or ffmpeg is still
        finishing it under a temp name), else "gone" (removed by the retention, failed, or no clip)."""
        path = self.clip_file(pipeline, clip_id)
        if path is not None and path.is_file():
            return "ready"
        if (pipeline, clip_id) in recording:
            return "recording"
        if path is not None and any(path.parent.glob(f"{clip_id}{CLIP_SUFFIX}.tmp-*")):
            return "recording"  # closed, being finished (agent/clips.py writes under <id>.mp4.tmp-...)
        return "gone"

    def clip_file(self, pipeline: str, clip_id: str) -> Path | None:
        """The file clip `clip_id` of `pipeline` is (or will be) at; None for names that are not one."""
        try:
            directory = safe_child(self.clips_root, pipeline)
            path = clip_path(directory, clip_id)
            return None if path is None else safe_child(directory, path.name)
        except UnsafeName:
            return None

    def snapshot_file(self, pipeline: str, snapshot_id: str) -> Path | None:
        try:
            return safe_child(safe_child(self.snapshots_root, pipeline), f"{snapshot_id}.jpg")
        except UnsafeName:
            return None

    async def snapshot(self, request: Request, session: Session) -> Response:
        path = self.snapshot_file(request.path_params["pipeline"], request.path_params["name"])
        return _file(path, "image/jpeg")

    async def clip(self, request: Request, session: Session) -> Response:
        path = self.clip_file(request.path_params["pipeline"], request.path_params["name"])
        return _file(path, "video/mp4")  # FileResponse answers Range requests (206): a browser seeks

    async def clip_page(self, request: Request, session: Session) -> Response:
        import anyio.to_thread
        from starlette.responses import HTMLResponse

        pipeline, clip_id = request.path_params["pipeline"], request.path_params["name"]
        path = self.clip_file(pipeline, clip_id)
        if path is None or not path.parent.is_dir():  # no such pipeline's clips: not a page of any name
            return _not_found()
        state = await anyio.to_thread.run_sync(lambda: self.clip_state(pipeline, clip_id, self._recording()))
        back = (
            f'<p><a href="/events?{esc(urlencode({"pipeline": pipeline}))}">Events of {esc(pipeline)}</a></p>'
        )
        if state == "ready":
            src = f"/clips/{quote(pipeline, safe='')}/{quote(clip_id, safe='')}"
            body = (
                '<video id="clip" controls muted autoplay playsinline preload="auto" '
                f'src="{esc(src)}"></video>'
                f'<p><a href="{esc(src)}" download>Download {esc(clip_id)}{CLIP_SUFFIX}</a></p>'
            )
        elif state == "recording":
            body = '<p class="recording">This clip is still being recorded: it plays once it is finished.</p>'
        else:
            body = (
                '<p class="none">This clip is not kept (removed by the clips\' retention, or it failed).</p>'
            )
        title = f"<h1>Clip {esc(clip_id)} of {esc(pipeline)}</h1>"
        html = f"{_STYLE}{title}\n{body}\n{back}"
        return HTMLResponse(self._web_app.frame(f"clip {clip_id}", html, session))


def events_pages(index: EventIndex | None, state_dir: Path) -> Callable[[WebApp], None]:
    """The events page's entry in agent/web/site.py `pages_of` (the Site's events and state_dir)."""
    return EventsPages(index, state_dir).add


def recording_clips(status: Mapping[str, Any]) -> set[tuple[str, str]]:
    """(pipeline, clip id) of the clips being recorded now, from the daemon's status (steps.clips)."""
    found = set()
    for name, pipeline in statuses_of(status.get("pipelines")).items():
        clips = {} if pipeline.run is None else pipeline.run.steps.get("clips") or {}
        if isinstance(clips.get("recording"), str):
            found.add((name, clips["recording"]))
    return found


class Asked:
    """What a request asks the list for: its filters, time range and page (bad values said, not fatal)."""

    def __init__(self) -> None:
        self.equal: dict[str, str] = {}
        self.since: float | None = None
        self.until: float | None = None
        self.before: int | None = None
        self.texts: dict[str, str] = {}  # from/to as given (the form shows them again)
        self.problems: list[str] = []

    @classmethod
    def of(cls, params: Mapping[str, str]) -> Asked:
        asked = cls()
        for column in FILTERS:
            value = params.get(column, "")
            if value:
                asked.equal[column] = value[:200]
        for key in ("from", "to"):
            text = params.get(key, "").strip()[:40]
            if not text:
                continue
            asked.texts[key] = text
            at = utc_epoch(text)
            if at is None:
                asked.problems.append(f"{key}: {text!r} is not a time (YYYY-MM-DD HH:MM, UTC): not used")
            elif key == "from":
                asked.since = at
            else:
                asked.until = at + (59.999 if len(text) <= 16 else 0.999)  # to the end of that minute
        before = params.get("before", "")
        if before.isdigit() and len(before) < 19:
            asked.before = int(before)
        elif before:
            asked.problems.append(f"before: {before[:40]!r} is not an event number: showing the newest")
        return asked

    def any(self) -> bool:
        return bool(self.equal or self.since is not None or self.until is not None)

    def query(self, before: int | None = None) -> str:
        """The filters as a query string (the links' and the refresh's), with `before` when given."""
        pairs = [*self.equal.items(), *self.texts.items()]
        if before is not None:
            pairs.append(("before", str(before)))
        return urlencode(pairs)


def utc_epoch(text: str) -> float | None:
    """`2026-11-29T08:40` or `2026-11-29 08:40:05` (a datetime-local input's value), read as UTC."""
    try:
        moment = datetime.fromisoformat(text.replace(" ", "T"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def filter_form(asked: Asked, choices: Mapping[str, list[str]]) -> str:
    selects = []
    for column in FILTERS:
        chosen = asked.equal.get(column, "")
        values = choices.get(column, [])
        if chosen and chosen not in values:
            values = [chosen, *values]  # asked for, none held (yet): still shown as chosen
        options = '<option value="">any</option>' + "".join(
            f'<option value="{esc(v)}"{" selected" if v == chosen else ""}>{esc(v)}</option>' for v in values
        )
        selects.append(f'<label>{column} <select name="{column}">{options}</select></label>')
    times = [
        f'<label>{key} (UTC) <input type="datetime-local" step="1" name="{key}" '
        f'value="{esc(asked.texts.get(key, ""))}"></label>'
        for key in ("from", "to")
    ]
    return (
        '<form method="get" action="/events" class="filters">'
        + "".join(selects + times)
        + '<button type="submit">Filter</button> <a href="/events">Clear</a></form>'
    )


def _details(event: Mapping[str, Any]) -> str:
    """What else a type of event says: an end's reason, a stay's length, a crowd's count."""
    parts = []
    if event.get("reason"):
        parts.append(str(event["reason"]))
    if isinstance(event.get("stayed_s"), (int, float)):
        parts.append(f"stayed {event['stayed_s']:.1f} s")
    if event.get("state"):
        parts.append(f"{event['state']}: {event.get('count')} of max {event.get('max_objects')}")
    elif isinstance(event.get("count"), int):
        parts.append(f"count {event['count']}")
    return f" ({', '.join(parts)})" if parts else ""


def _attributes(attributes: Mapping[str, Any]) -> str:
    items = []
    for name, read in attributes.items():
        if not isinstance(read, Mapping):
            continue
        value = read.get("value")
        text = f"vector of {len(value)}" if isinstance(value, list) else attribute_text(value)
        score = read.get("score")
        shown = f"{esc(name)}: <b>{esc(text[:80])}</b>"
        if isinstance(score, (int, float)):
            shown += f" ({score:.2f})"
        items.append(f"<div>{shown}</div>")
    return "".join(items)


def _version(part: str) -> str:
    return hashlib.sha256(part.encode()).hexdigest()[:16]


def _not_found() -> Response:
    from starlette.responses import Response

    return Response("not found", 404, media_type="text/plain")


def _file(path: Path | None, media_type: str) -> Response:
    from starlette.responses import FileResponse

    if path is None or not path.is_file():
        return _not_found()
    return FileResponse(path, media_type=media_type, headers={"Cache-Control": _FILE_CACHE})
