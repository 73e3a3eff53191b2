"""The zone editor: `/zones` (the pipelines, link "Zones") and `/zones/<pipeline>`: the pipeline's
latest frame as the camera gave it (the live view's `/live/<pipeline>/frame.jpg?plain=1`, agent/web/
live.py) under its zones, lines and masks, drawn and dragged with the mouse (static/editor.js), their
points in fractions of the frame; `POST /zones/<pipeline>` saves them (docs/web.md, The zone editor).

A save goes the way an edit by hand does: agent/config_edit.py writes the shapes into the config file
(comments and layout kept) once the validator `config validate` uses accepts them (else its problems
are shown beside each shape), then the daemon reloads the file as a SIGHUP would (`Site.reload`:
what changed is swapped in between two frames, tracks kept) and the page shows the reload's outcome.
A pipeline the fleet's desired state runs is not the file's: the page offers the pipeline for the
desired-state document instead (docs/fleet.md). Each save is logged with its user."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import ValidationError

from agent.config import PipelineConfig
from agent.config.analytics import MAX_POINTS  # a shape's points at most; shapes of a kind too
from agent.config.processing import DetectionPostprocess, gives_boxes
from agent.config_edit import (
    KINDS,
    NAMED,
    Drawn,
    Refused,
    check_order,
    file_hash,
    replace_in,
    save_shapes,
    shapes_of,
)
from agent.config_loader import parse_config, validation_problems
from agent.errors import ConfigError
from agent.web.pages import esc

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from agent.web.app import WebApp
    from agent.web.auth import Session

log = logging.getLogger(__name__)

MAX_BYTES = 512 * 1024  # a save's form: 4 kinds x 100 shapes x 100 points, url-encoded JSON
_STYLE = '<link rel="stylesheet" href="/static/editor.css">\n'
_TITLES = {"zones": "zone", "lines": "line", "motion_masks": "motion mask", "object_masks": "object mask"}


class _Slot(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def desired(self) -> Any: ...  # its `.config`: the PipelineConfig it is to run


class _Slots(Protocol):
    def slots(self) -> Sequence[_Slot]: ...


class EditedSite(Protocol):
    """What the editor reads of the daemon (agent/web/site.py `Site`)."""

    @property
    def supervisor(self) -> _Slots: ...

    @property
    def config_file(self) -> Path | None: ...

    @property
    def reload(self) -> Callable[[], dict[str, Any]]: ...

    @property
    def layer_of(self) -> Callable[[str], str | None]: ...


class EditorPages:
    """The editor's routes on a WebApp (`add`)."""

    def __init__(self, site: EditedSite) -> None:
        self.site = site

    def add(self, web_app: WebApp) -> None:
        self.web_app = web_app
        web_app.add_page("/zones", self.list_page, link="Zones")
        web_app.add_page("/zones/{pipeline}", self.page)
        web_app.add_page("/zones/{pipeline}", self.save, method="POST", api=True, max_bytes=MAX_BYTES)

    # --- reading ----------------------------------------------------------------------------------

    def _file_pipelines(self) -> tuple[dict[str, PipelineConfig], list[str]]:
        """The config file's pipelines by name, and its problems (nothing can be edited while the
        file is invalid: the daemon runs its last good config)."""
        path = self.site.config_file
        if path is None:
            return {}, []
        try:
            config = parse_config(path.read_text(encoding="utf-8"), source=str(path))
        except (OSError, UnicodeDecodeError) as exc:
            return {}, [f"{path}: cannot read it: {exc}"]
        except ConfigError as exc:
            return {}, list(exc.problems)
        return {p.name: p for p in config.pipelines}, []

    def _fleet_pipeline(self, name: str) -> PipelineConfig | None:
        for slot in self.site.supervisor.slots():
            if slot.name == name:
                return slot.desired.config
        return None

    def _overview(self) -> tuple[list[tuple[str, PipelineConfig, str | None]], list[str]]:
        """(name, config, fleet layer or None) of every pipeline the editor can show, and the file's
        problems."""
        in_file, problems = self._file_pipelines()
        rows: list[tuple[str, PipelineConfig, str | None]] = []
        for name, config in in_file.items():
            layer = self.site.layer_of(name)
            rows.append((name, (self._fleet_pipeline(name) or config) if layer else config, layer))
        for slot in self.site.supervisor.slots():
            layer = self.site.layer_of(slot.name)
            if slot.name not in in_file and layer is not None:
                rows.append((slot.name, slot.desired.config, layer))
        return rows, problems

    # --- the pages --------------------------------------------------------------------------------

    async def list_page(self, request: Request, session: Session) -> Response:
        import anyio.to_thread
        from starlette.responses import HTMLResponse

        rows, problems = await anyio.to_thread.run_sync(self._overview)
        body = _STYLE + "<h1>Zones, lines and masks</h1>\n" + self._file_note(problems)
        items = []
        for name, config, layer in rows:
            counts = shapes_of(config)
            said = ", ".join(f"{len(counts[k])} {_TITLES[k]}{'s' * (len(counts[k]) != 1)}" for k in KINDS)
            fleet = f' <span class="why">(from the fleet: {esc(layer)})</span>' if layer else ""
            items.append(f'<li><a href="/zones/{esc(name)}">{esc(name)}</a>: {esc(said)}{fleet}</li>')
        if rows:
            body += f'<ul class="zone-list">{"".join(items)}</ul>'
        elif self.site.config_file is not None and not problems:
            body += "<p>The config has no pipelines.</p>"
        return HTMLResponse(self.web_app.frame("zones", body, session))

    def _file_note(self, problems: list[str]) -> str:
        if self.site.config_file is None:
            return (
                '<p class="problem">This daemon was not started from a config file: there is no file to '
                "write zones into (pipelines the fleet runs are still shown).</p>"
            )
        note = f'<p class="why">Config file: {esc(self.site.config_file)}</p>'
        if problems:
            listed = "".join(f"<li>{esc(p)}</li>" for p in problems)
            note += (
                '<div class="problem"><p>The config file has problems (the daemon runs its last good '
                f"config): fix them by hand before editing here.</p><ul>{listed}</ul></div>"
            )
        return note

    async def page(self, request: Request, session: Session) -> Response:
        import anyio.to_thread
        from starlette.responses import HTMLResponse

        name = request.path_params["pipeline"]
        found = await anyio.to_thread.run_sync(self._editing, name)
        if isinstance(found, str):
            body = _STYLE + f'<h1>Zones: {esc(name)}</h1>\n<p class="problem">{esc(found)}</p>'
            return HTMLResponse(self.web_app.frame(f"zones: {name}", body, session), 404)
        config, layer, sha256 = found
        return HTMLResponse(
            self.web_app.frame(f"zones: {name}", _editor(name, config, layer, sha256), session, "editor.js")
        )

    def _editing(self, name: str) -> tuple[PipelineConfig, str | None, str] | str:
        """(the pipeline's config, its fleet layer, the file's hash when read) or why there is none."""
        layer = self.site.layer_of(name)
        if layer is not None:
            config = self._fleet_pipeline(name)
            return (config, layer, "") if config is not None else f"no pipeline {name!r} runs here"
        path = self.site.config_file
        if path is None:
            return "This daemon was not started from a config file: there is no file to write zones into."
        try:
            data = path.read_bytes()
            in_file = parse_config(data.decode("utf-8"), source=str(path))
        except (OSError, UnicodeDecodeError) as exc:
            return f"{path}: cannot read it: {exc}"
        except ConfigError as exc:
            return f"{path} has problems (fix them by hand first): " + "; ".join(exc.problems)
        for pipeline in in_file.pipelines:
            if pipeline.name == name:
                return pipeline, None, file_hash(data)
        return f"the config file {path} has no pipeline {name!r}"

    # --- the save ---------------------------------------------------------------------------------

    async def save(self, request: Request, session: Session) -> Response:
        import anyio.to_thread
        from starlette.responses import JSONResponse

        from agent.web.app import form_of

        form = form_of(request)
        name = request.path_params["pipeline"]
        try:
            shapes = drawn_from_json(json.loads(form.get("shapes", "")))
        except ValueError as exc:  # (json's errors are ValueErrors)
            return JSONResponse({"result": "bad request", "problems": [f"shapes: {exc}"]}, 400)
        user = session.user or "local"
        code, answer = await anyio.to_thread.run_sync(self._save, name, shapes, form.get("sha256", ""), user)
        return JSONResponse(answer, code)

    def _save(self, name: str, shapes: dict[str, list[Drawn]], sha256: str, user: str) -> tuple[int, Any]:
        """On a worker thread (a save waits for the reload): (HTTP code, the answer's JSON)."""
        layer = self.site.layer_of(name)
        if layer is not None:
            return self._snippet(name, layer, shapes)
        path = self.site.config_file
        if path is None:
            return 409, {"result": "refused", "problems": ["this daemon was not started from a config file"]}
        try:
            saved = save_shapes(path, name, shapes, sha256)
        except Refused as refused:
            return 422, _refused(refused)
        if not saved.changed:
            return 200, {"result": "unchanged", "sha256": saved.sha256, "problems": []}
        log.info("web: %s saved zones/lines of pipeline %s in %s", user, name, path)
        outcome = self.site.reload()
        return 200, {
            "result": "applied"
            if outcome.get("result") in ("applied", "unchanged")
            else outcome.get("result"),
            "sha256": saved.sha256,
            "problems": list(outcome.get("problems") or []),
            "reload": outcome,
        }

    def _snippet(self, name: str, layer: str, shapes: dict[str, list[Drawn]]) -> tuple[int, Any]:
        """A pipeline of the fleet's desired state: the file is not written; the pipeline as the
        document should say it (its `pipelines` entry replaces the whole pipeline), checked with the
        models the document is checked with."""
        config = self._fleet_pipeline(name)
        if config is None:
            return 404, {"result": "refused", "problems": [f"no pipeline {name!r} runs here"]}
        try:
            check_order(shapes)
            data = config.model_dump(mode="json", by_alias=True, exclude_unset=True, exclude={"name"})
            new = replace_in(data, shapes)
        except Refused as refused:
            return 422, _refused(refused)
        try:
            PipelineConfig.model_validate({**new, "name": name})
        except ValidationError as exc:
            problems = [
                (".".join(str(k) for k in path), message)
                for path, message in validation_problems(exc, {**new, "name": name}, PipelineConfig, "json")
            ]
            return 422, _refused(_by_shape(problems))
        snippet = json.dumps({"pipelines": {name: new}}, indent=2)
        return 200, {"result": "fleet", "layer": layer, "snippet": snippet, "problems": []}


def _by_shape(problems: list[tuple[str, str]]) -> Refused:
    """Problems at key paths below a pipeline ("zones.2.points") by shape."""
    places = {
        "zones": "zones",
        "lines": "lines",
        "motion.masks": "motion_masks",
        "filters.masks": "object_masks",
    }
    general: list[str] = []
    by_shape: dict[tuple[str, int], list[str]] = {}
    for path, message in problems:
        for prefix, kind in places.items():
            rest = path.removeprefix(prefix + ".")
            head, _, tail = rest.partition(".")
            if rest != path and head.isdigit():
                by_shape.setdefault((kind, int(head)), []).append(f"{tail}: {message}" if tail else message)
                break
        else:
            general.append(f"{path}: {message}")
    return Refused(general, by_shape)


def _refused(refused: Refused) -> dict[str, Any]:
    return {
        "result": "refused",
        "problems": refused.problems,
        "shapes": {f"{kind}/{index}": messages for (kind, index), messages in refused.by_shape.items()},
    }


def _editor(name: str, config: PipelineConfig, layer: str | None, sha256: str) -> str:
    """The editor's page: the frame under an SVG of the shapes, the tools, the table of points."""
    post = config.postprocess
    labels = post.labels if isinstance(post, DetectionPostprocess) else None
    data = {
        "pipeline": name,
        "sha256": sha256,
        "fleet": layer,
        "shapes": shapes_of(config),
        "kinds": _kinds(config),
        "labels": labels,
    }
    if layer:
        note = (
            f'<p class="fleet">The fleet\'s desired state runs this pipeline (layer {esc(layer)}): the '
            "config file is not written. Save shows the pipeline as the desired-state document should "
            "say it (docs/fleet.md): publish it with <code>edge-agent fleet deploy</code>.</p>"
        )
    else:
        note = ""
    tools = " ".join(
        f'<button type="button" class="zone-draw" data-kind="{k}"{"" if ok else " disabled"}'
        f"{'' if ok else f' title={_quote(why)}'}>+ {esc(_TITLES[k])}</button>"
        for k, (ok, why) in _kinds(config).items()
    )
    return (
        _STYLE
        + f"<h1>Zones: {esc(name)}</h1>\n{note}"
        + f'<div id="zone-editor" data-editor="{esc(json.dumps(data))}">\n'
        + f'<div class="zone-tools">{tools} '
        + '<button type="button" id="zone-finish" disabled>Finish shape</button> '
        + '<button type="button" id="zone-save">Save</button> '
        + '<span id="zone-status" role="status"></span></div>\n'
        + '<p class="why" id="zone-help">Click on the frame to add points; close a polygon on its first '
        + "point (or double-click); drag a corner to move it; click a shape to select it (Delete "
        + "removes it). A line's arrow points to its `in` side. Save writes "
        + "the config file (its comments kept) and applies it as a reload does.</p>\n"
        + '<div class="zone-stage waiting"><img id="zone-frame" alt="the latest frame of the pipeline">'
        + '<svg id="zone-svg" xmlns="http://www.w3.org/2000/svg"></svg>'
        + '<p id="zone-waiting">waiting for a frame of the pipeline...</p></div>\n'
        + '<ul id="zone-problems" class="problem"></ul>\n'
        + '<table id="zone-table"><thead><tr><th>shape</th><th>name</th><th>labels</th>'
        + "<th>points [x, y] (fractions of the frame)</th><th>problems</th><th></th></tr></thead>"
        + "<tbody></tbody></table>\n"
        + '<pre id="zone-snippet" hidden></pre>\n</div>'
    )


def _quote(text: str) -> str:
    return f'"{esc(text)}"'


def _kinds(config: PipelineConfig) -> dict[str, tuple[bool, str]]:
    """Which kinds of shape the pipeline can have, and why not."""
    boxes = gives_boxes(config.postprocess)
    no_boxes = f"zones, lines and object masks need boxes: a {config.postprocess.type} postprocess has none"
    gate = config.motion_gate is not None
    return {
        "zones": (boxes, no_boxes),
        "lines": (boxes, no_boxes),
        "motion_masks": (gate, "the pipeline runs no motion gate (motion: true turns it on)"),
        "object_masks": (boxes, no_boxes),
    }


def drawn_from_json(data: Any) -> dict[str, list[Drawn]]:
    """The editor's JSON ({kind: [{name, points, origin, moved, labels}]}) as shapes; ValueError
    saying what is wrong."""
    if not isinstance(data, dict):
        raise ValueError("expected an object of kind -> shapes")
    shapes: dict[str, list[Drawn]] = {}
    for kind, items in data.items():
        if kind not in KINDS:
            raise ValueError(f"{kind!r} is no kind of shape ({', '.join(KINDS)})")
        if not isinstance(items, list) or len(items) > MAX_POINTS:
            raise ValueError(f"{kind}: expected a list of at most {MAX_POINTS} shapes")
        shapes[kind] = [_drawn(kind, i, item) for i, item in enumerate(items)]
    return shapes


def _drawn(kind: str, i: int, item: Any) -> Drawn:
    where = f"{kind}[{i}]"
    if not isinstance(item, dict):
        raise ValueError(f"{where}: expected an object")
    points = item.get("points")
    if not isinstance(points, list) or not 1 <= len(points) <= MAX_POINTS:
        raise ValueError(f"{where}.points: expected a list of 1 to {MAX_POINTS} [x, y] points")
    pairs: list[tuple[float, float]] = []
    for j, p in enumerate(points):
        if not (isinstance(p, list) and len(p) == 2 and all(_number(v) for v in p)):
            raise ValueError(f"{where}.points[{j}]: expected [x, y], two numbers")
        pairs.append((float(p[0]), float(p[1])))
    name = item.get("name")
    if kind in NAMED and not (isinstance(name, str) and name):
        raise ValueError(f"{where}.name: a {_TITLES[kind]} needs a name")
    labels = item.get("labels")
    if labels is not None and not (
        isinstance(labels, list)
        and len(labels) <= MAX_POINTS
        and all(isinstance(v, str) and v for v in labels)
    ):
        raise ValueError(f"{where}.labels: expected a list of label names, or null")
    if "labels" in item and kind == "motion_masks":
        raise ValueError(f"{where}.labels: a motion mask has no labels")
    origin = item.get("origin")
    if origin is not None and not (isinstance(origin, int) and not isinstance(origin, bool) and origin >= 0):
        raise ValueError(f"{where}.origin: expected the index of a shape of the file, or null")
    return Drawn(
        tuple(pairs),
        name if kind in NAMED else None,
        origin,
        bool(item.get("moved", True)),
        None if labels is None else tuple(labels),
        "labels" in item,
    )


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def editor_pages(site: EditedSite) -> Callable[[WebApp], None]:
    """agent/web/site.py `pages_of`'s entry."""
    return EditorPages(site).add
