"""The models page, `/models`: the model versions installed in the store (what `edge-agent models
list` shows, agent/store/listing.py) and, per running pipeline, what serves it and why (what
`edge-agent explain` shows, worded once by agent/explained.py), every value HTML-escaped. The part
under the heading refreshes itself (static/refresh.js fetches `/models/part` every 5 s): a background proof
that switches a backend, a fallback or a new version shows without a reload."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agent.explained import Line, candidate_rows, explained
from agent.store.listing import installed_rows, variant_note
from agent.web.pages import esc

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from agent.store import ModelStore
    from agent.web.app import WebApp
    from agent.web.auth import Session

Explain = Callable[[], dict[str, Any]]  # Site.explain: {"pipelines": [records]}


class ModelsPage:
    """The page's routes on a WebApp (`add`)."""

    def __init__(self, store: ModelStore, explain: Explain) -> None:
        self.store = store
        self.explain = explain

    def add(self, web_app: WebApp) -> None:
        self.web_app = web_app
        web_app.add_page("/models", self.page, link="Models")
        web_app.add_page("/models/part", self.part, api=True)

    async def page(self, request: Request, session: Session) -> Response:
        import anyio.to_thread
        from starlette.responses import HTMLResponse

        part = await anyio.to_thread.run_sync(self.render)
        refreshed = '<div id="models" data-refresh="/models/part" data-every="5000">'  # static/refresh.js
        body = f"{_STYLE}<h1>Models</h1>\n{refreshed}{part}</div>"
        return HTMLResponse(self.web_app.frame("models", body, session, "refresh.js"))

    async def part(self, request: Request, session: Session) -> Response:
        import anyio.to_thread
        from starlette.responses import HTMLResponse

        return HTMLResponse(await anyio.to_thread.run_sync(self.render))

    def render(self) -> str:
        """The store, then what serves where and why (on a worker thread: it reads files)."""
        try:
            records = self.explain().get("pipelines") or []
        except Exception as exc:  # a page must say what it could not read, never fail whole
            serving = f'<p class="problem">What serves cannot be read: {esc(exc)}</p>'
        else:
            serving = "\n".join(explained_html(r) for r in records) or "<p>No pipeline is serving.</p>"
        try:
            store = store_html(installed_rows(self.store))
        except Exception as exc:
            store = f'<p class="problem">The store cannot be read: {esc(exc)}</p>'
        return f"<h2>Installed in the store</h2>\n{store}\n<h2>What serves, and why</h2>\n{serving}"


def _spans(line: Line) -> str:
    return "".join(f"<strong>{esc(text)}</strong>" if bold else esc(text) for text, bold in line)


def _table(columns: list[str], rows: list[list[str]], css: str = "") -> str:
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{esc(v)}</td>" for v in row) + "</tr>" for row in rows)
    klass = f' class="{esc(css)}"' if css else ""
    return f"<table{klass}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _filled(columns: list[str], rows: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """The columns some row has a value in (a choice made without timing leaves the timings empty:
    a page's width is better spent on the reasons)."""
    keep = [i for i in range(len(columns)) if not rows or any(row[i] for row in rows)]
    return [columns[i] for i in keep], [[row[i] for i in keep] for row in rows]


def explained_html(record: dict[str, Any]) -> str:
    """One `explain` record as HTML: the words `edge-agent explain` prints (agent/explained.py)."""
    said = explained(record)
    name = record.get("pipeline") or record.get("model") or ""
    lines = "".join(f"<p>{_spans(line)}</p>" for line in said.lines)
    candidates = said.candidates
    table = "" if candidates is None else _table(*_filled(*candidate_rows(candidates)), "candidates")
    heading = f"<h3>{_spans(said.title)}</h3>"
    return f'<section class="explained" data-pipeline="{esc(name)}">{heading}{lines}{table}</section>'


def store_html(rows: list[dict[str, Any]]) -> str:
    """The store's versions as `edge-agent models list` shows them (a row per file)."""
    if not rows:
        return "<p>No models installed.</p>"
    columns = ["model", "version", "file", "format", "size", "sha256", "signed by"]
    cells, notes = [], []
    for row in rows:
        for a in row["artifacts"]:
            cells.append([row["name"], row["version"], a["file"], a["format"], f"{a['size']:,}",
                          a["sha256"][:16], row["signed_by"] or ""])  # fmt: skip
            if note := variant_note(a):
                what = f"{row['name']}@{row['version']} {a['file']}"
                notes.append(f"<p>{esc(what)} ({esc(note)})</p>")
    return _table(columns, cells, css="store") + "".join(notes)


# The pages' own style sheet (the CSP allows only the site's files; live.css holds the models page's too).
_STYLE = '<link rel="stylesheet" href="/static/live.css">\n'


def models_page(store: ModelStore, explain: Explain) -> Callable[[WebApp], None]:
    """agent/web/site.py `pages_of`'s entry (with the supervisor's store and the Site's explain)."""
    return ModelsPage(store, explain).add
