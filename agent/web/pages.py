"""The page's HTML, rendered on the server from the daemon's typed status (agent/status.py): the
same fields `edge-agent status` shows. Every value goes through `html.escape`."""

from __future__ import annotations

import html
from collections.abc import Sequence
from functools import cache
from importlib import resources
from string import Template
from typing import Any

from agent.status import PipelineStatus, statuses_of
from agent.text import clip


@cache
def _template(name: str) -> Template:
    return Template(
        resources.files("agent.web").joinpath("templates").joinpath(name).read_text(encoding="utf-8")
    )


def esc(value: object) -> str:
    """`value` as HTML text (None: empty): every value a page shows goes through it."""
    return html.escape("" if value is None else str(value))


def page(
    title: str,
    body: str,
    device: str = "",
    account: str = "",
    script: str = "",
    csrf: str = "",
    links: Sequence[tuple[str, str]] = (),
) -> str:
    """The frame around every page; `body` and `account` are HTML already escaped. `csrf`: the
    session's token, in a meta tag for scripts that POST (header X-CSRF-Token). `links`: the
    header's (title, path) links to the pages."""
    tag = f'<script src="/static/{esc(script)}"></script>' if script else ""
    nav = " ".join(f'<a href="{esc(path)}">{esc(name)}</a>' for name, path in links)
    return _template("page.html").substitute(
        title=esc(title), device=esc(device), account=account, body=body, script=tag, csrf=esc(csrf),
        nav=f"<nav>{nav}</nav>" if nav else "",
    )  # fmt: skip


def logout_form(user: str, csrf: str) -> str:
    return (
        f'<form method="post" action="/logout"><span>{esc(user)}</span> '
        f'<input type="hidden" name="csrf" value="{esc(csrf)}"><button type="submit">Log out</button></form>'
    )


def login_body(csrf: str, message: str = "") -> str:
    return _template("login.html").substitute(csrf=esc(csrf), message=esc(message))


def box_body(status: dict[str, Any]) -> str:
    refreshed = '<div id="status" data-refresh="/box/status" data-every="2000">'  # static/refresh.js
    return f"<h1>This box</h1>\n{refreshed}{status_part(status)}</div>"


def status_part(status: dict[str, Any]) -> str:
    """What the box page refreshes: the daemon, the broker, the outbox and a row per pipeline."""
    mqtt, outbox, config = status.get("mqtt") or {}, status.get("outbox") or {}, status.get("config") or {}
    broker = "connected" if mqtt.get("connected") else "not connected"
    broker_error = f", last error: {mqtt['last_error']}" if mqtt.get("last_error") else ""
    lines = [
        f"<p>edge-agent {esc(status.get('agent_version', '?'))} on {esc(status.get('device', '?'))} "
        f"(pid {esc(status.get('pid', '?'))}), started {esc(status.get('started_at', '?'))}, "
        f"config {esc(config.get('file') or '-')}</p>",
        f'<p>broker: <span class="{"running" if mqtt.get("connected") else "error"}">{broker}</span> '
        f"({esc(mqtt.get('connects', 0))} connects){esc(broker_error)}</p>",
        f"<p>outbox: {esc(outbox.get('pending', 0))} queued, {esc(outbox.get('dropped', 0))} dropped "
        f"(when_full: {esc(outbox.get('when_full', '?'))})</p>",
    ]
    heads = ("pipeline", "state", "model", "backend", "fps", "ms p50/p95", "results", "drops", "errors")
    rows = [_row(name, p) for name, p in statuses_of(status.get("pipelines")).items()]
    table = (
        '<table id="pipelines"><thead><tr>'
        + "".join(f"<th>{h}</th>" for h in heads)
        + "</tr></thead><tbody>"
        + ("".join(rows) or f'<tr><td colspan="{len(heads)}">no pipelines</td></tr>')
        + "</tbody></table>"
    )
    return "\n".join([*lines, table])


def _row(name: str, p: PipelineStatus) -> str:
    run, serving = p.run, p.serving
    latency = None if run is None else run.counts.latency.capture_to_result
    dropped = (0 if run is None else run.source.frames_dropped) + (p.results_dropped or 0)
    state = p.state if p.phase in ("running", p.state) else f"{p.state} ({p.phase})"
    cells = [
        f'<td class="{esc(p.state)}">{esc(state)}</td>',
        f"<td>{esc(p.running_model or p.change.desired_model or '-')}</td>",
        f"<td>{esc('-' if serving is None else serving.backend or '-')}</td>",
        f'<td class="n">{"-" if run is None or run.counts.fps is None else f"{run.counts.fps:.1f}"}</td>',
        f'<td class="n">{"-" if not latency else f"{latency.p50:.0f} / {latency.p95:.0f}"}</td>',
        f'<td class="n">{0 if run is None else run.counts.results}</td>',
        f'<td class="n">{dropped}</td>',
        f'<td class="n">{0 if run is None else run.counts.errors}</td>',
    ]
    notes = [f'<div class="problem">{esc(problem)}</div>' for problem in p.problems()]
    error = p.last_error
    if error is not None:
        notes.append(f'<div class="problem">last error ({esc(error.at)}): {esc(clip(error.text, 300))}</div>')
    if serving is not None and serving.backend_why:
        notes.append(f'<div class="why">backend: {esc(clip(serving.backend_why, 300))}</div>')
    row = f'<tr data-pipeline="{esc(name)}"><td>{esc(name)}</td>{"".join(cells)}</tr>'
    if notes:
        row += f'<tr><td></td><td class="notes" colspan="8">{"".join(notes)}</td></tr>'
    return row
